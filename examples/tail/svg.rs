//! The picture: on the left the latency percentiles of each policy at the normal load
//! (p50, p99, p99.9, successful calls, log scale); on the right the extra attempts per call
//! each policy sent at the normal load and under twice the capacity.

use std::error::Error;

use plotters::prelude::*;

use crate::report::{PolicyReport, TailReport};

/// The colour of each bar in a group.
const LATENCY_COLOURS: [RGBColor; 3] = [
    RGBColor(158, 202, 225),
    RGBColor(49, 130, 189),
    RGBColor(8, 48, 107),
];
const LOAD_COLOURS: [RGBColor; 2] = [RGBColor(161, 217, 155), RGBColor(214, 39, 40)];

/// A value of a policy a bar shows.
type Metric = fn(&PolicyReport) -> f64;

pub(crate) fn draw(report: &TailReport, path: &str) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, (1200, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(640);
    let n = report.policies.len().max(1);
    let names: Vec<&str> = report.policies.iter().map(|p| p.name).collect();
    let x_label = move |x: &f64| -> String {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            names.get(i as usize).copied().unwrap_or("").to_owned()
        } else {
            String::new()
        }
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
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "latency of successful calls at the normal load (ms, log scale)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(52)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, (low / 2.0..peak * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&x_label)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .disable_x_mesh()
        .light_line_style(WHITE)
        .draw()?;
    for (k, (label, value)) in latency.into_iter().enumerate() {
        let colour = LATENCY_COLOURS[k];
        let offset = (k as f64 - 1.0) * 0.26;
        chart
            .draw_series(report.policies.iter().enumerate().map(|(i, p)| {
                let x = i as f64 + offset;
                Rectangle::new(
                    [(x - 0.12, low / 2.0), (x + 0.12, value(p).max(low / 2.0))],
                    colour.filled(),
                )
            }))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled()));
        chart.draw_series(report.policies.iter().enumerate().map(|(i, p)| {
            let x = i as f64 + offset;
            Text::new(
                format!("{:.0}", value(p)),
                (x - 0.1, value(p).max(low / 2.0) * 1.12),
                ("sans-serif", 11),
            )
        }))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;

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
    let mut chart = ChartBuilder::on(&right)
        .caption(
            "extra attempts per call the server received (%)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(52)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..top)?;
    chart
        .configure_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&x_label)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .disable_x_mesh()
        .light_line_style(WHITE)
        .draw()?;
    for (k, (label, value)) in load.into_iter().enumerate() {
        let colour = LOAD_COLOURS[k];
        let offset = (k as f64 - 0.5) * 0.3;
        chart
            .draw_series(report.policies.iter().enumerate().map(|(i, p)| {
                let x = i as f64 + offset;
                Rectangle::new([(x - 0.14, 0.0), (x + 0.14, value(p))], colour.filled())
            }))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled()));
        chart.draw_series(report.policies.iter().enumerate().map(|(i, p)| {
            let x = i as f64 + offset;
            Text::new(
                format!("{:.1}", value(p)),
                (x - 0.12, value(p) + top * 0.04),
                ("sans-serif", 11),
            )
        }))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    root.present()?;
    Ok(())
}
