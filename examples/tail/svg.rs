//! The picture: on the left the latency percentiles of each policy at the normal load
//! (p50, p99, p99.9, successful calls, log scale); on the right the extra attempts per call
//! each policy sent at the normal load and under twice the capacity.

use std::error::Error;

use plotters::prelude::*;

use crate::chart::{self, BarPanel, Bars};
use crate::report::{PolicyReport, TailReport};

/// The colour of each bar in a group.
const LATENCY_COLOURS: [RGBColor; 3] = [
    RGBColor(158, 202, 225),
    RGBColor(49, 130, 189),
    RGBColor(8, 48, 107),
];
const LOAD_COLOURS: [RGBColor; 2] = [RGBColor(161, 217, 155), RGBColor(214, 39, 40)];

/// The panels' caption and margins.
const FRAME: chart::Frame = chart::Frame {
    caption: 16,
    margin: 12,
    x_labels: 32,
    y_labels: 52,
};

/// A value of a policy a bar shows.
type Metric = fn(&PolicyReport) -> f64;

pub(crate) fn draw(report: &TailReport, path: &str) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, (1200, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(640);
    let names: Vec<&str> = report.policies.iter().map(|p| p.name).collect();
    let bars = |metrics: &[(&'static str, Metric)], colours: &[RGBColor]| -> Vec<Bars<'static>> {
        metrics
            .iter()
            .zip(colours)
            .map(|((label, value), colour)| Bars {
                label,
                colour: *colour,
                values: report.policies.iter().map(value).collect(),
            })
            .collect()
    };

    // Latency, log scale.
    let latency: [(&str, Metric); 3] = [
        ("p50", |p| p.p50_ms),
        ("p99", |p| p.p99_ms),
        ("p99.9", |p| p.p999_ms),
    ];
    let peak = report
        .policies
        .iter()
        .map(|p| p.p999_ms)
        .fold(1.0, f64::max);
    let low = report
        .policies
        .iter()
        .map(|p| p.p50_ms)
        .filter(|v| *v > 0.0)
        .fold(peak, f64::min);
    let panel = BarPanel {
        title: "latency of successful calls at the normal load (ms, log scale)",
        names: &names,
        y: (low / 2.0, peak * 2.0),
        log: true,
        groups: bars(&latency, &LATENCY_COLOURS),
        spacing: 0.26,
        half_width: 0.12,
        decimals: 0,
        text_dx: -0.1,
        text_dy: 1.12,
    };
    chart::draw_bars(&left, FRAME, panel)?;

    // Extra load.
    let load: [(&str, Metric); 2] = [
        ("normal load", |p| 100.0 * p.extra_attempts_per_call),
        ("2x capacity", |p| {
            100.0 * p.overload.extra_attempts_per_call
        }),
    ];
    let top = report
        .policies
        .iter()
        .flat_map(|p| load.iter().map(move |(_, v)| v(p)))
        .fold(5.0, f64::max)
        * 1.15;
    let panel = BarPanel {
        title: "extra attempts per call the server received (%)",
        names: &names,
        y: (0.0, top),
        log: false,
        groups: bars(&load, &LOAD_COLOURS),
        spacing: 0.3,
        half_width: 0.14,
        decimals: 1,
        text_dx: -0.12,
        text_dy: 0.04,
    };
    chart::draw_bars(&right, FRAME, panel)?;
    root.present()?;
    Ok(())
}
