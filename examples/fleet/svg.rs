//! The picture: one row per scenario; on the left the calls that succeeded per second,
//! on the right the attempts per second that reached the bad replica, one line per
//! policy, the fault shaded.

use std::error::Error;

use plotters::prelude::*;

use crate::chart;
use crate::report::{Bucket, FleetReport, ScenarioReport};
use crate::run::{BUCKET, Policy};

/// One colour per policy, in [`Policy::ALL`]'s order.
const COLOURS: [RGBColor; 5] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];
const ROW: u32 = 280;
/// The panels' caption and margins.
const FRAME: chart::Frame = chart::Frame {
    caption: 16,
    margin: 10,
    x_labels: 28,
    y_labels: 52,
};

/// What a panel plots, per bucket, as a rate per second.
type Metric = fn(&Bucket) -> u64;

pub(crate) fn draw(report: &FleetReport, path: &str) -> Result<(), Box<dyn Error>> {
    let rows = report.scenarios.len().max(1) as u32;
    let root = SVGBackend::new(path, (1200, ROW * rows)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((rows as usize, 1));
    for (row_index, (scenario, row)) in report.scenarios.iter().zip(areas).enumerate() {
        let (left, right) = row.split_horizontally(600);
        let panels: [(_, String, Metric); 2] = [
            (
                left,
                format!("{}: calls succeeded per second", scenario.name),
                |b| b.ok,
            ),
            (
                right,
                format!(
                    "{}: attempts per second reaching the bad replica",
                    scenario.name
                ),
                |b| b.bad_replica_attempts,
            ),
        ];
        for (panel, (area, title, value)) in panels.into_iter().enumerate() {
            draw_panel(&area, scenario, (panel, row_index == 0), &title, value)?;
        }
    }
    root.present()?;
    Ok(())
}

/// One panel of `scenario`'s row: `value` per second, one line per policy; the first
/// panel (`panel` 0) with the offered rate too, and the legend if its row is the `first`.
fn draw_panel(
    area: &chart::Area<'_>,
    scenario: &ScenarioReport,
    (panel, first): (usize, bool),
    title: &str,
    value: Metric,
) -> Result<(), Box<dyn Error>> {
    let per_s = 1.0 / BUCKET.as_secs_f64();
    let seconds = scenario
        .policies
        .iter()
        .map(|p| p.timeline.len())
        .max()
        .unwrap_or(1) as f64
        * BUCKET.as_secs_f64();
    let peak = scenario
        .policies
        .iter()
        .flat_map(|p| {
            p.timeline.iter().map(|b| {
                if panel == 0 {
                    value(b).max(b.offered)
                } else {
                    value(b)
                }
            })
        })
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * per_s;
    let mid = |b: &Bucket| b.t + BUCKET.as_secs_f64() / 2.0;
    let mut lines = Vec::new();
    if panel == 0
        && let Some(first) = scenario.policies.first()
    {
        lines.push(chart::offered(
            first
                .timeline
                .iter()
                .map(|b| (mid(b), b.offered as f64 * per_s))
                .collect(),
        ));
    }
    for policy in &scenario.policies {
        let points = policy.timeline.iter();
        lines.push(chart::policy_line(
            policy.name,
            &Policy::ALL.map(Policy::as_str),
            &COLOURS,
            points.map(|b| (mid(b), value(b) as f64 * per_s)).collect(),
        ));
    }
    let panel_lines = chart::LinePanel {
        title,
        x_max: seconds,
        y_max: peak * 1.1,
        window: (scenario.fault_s, seconds),
        window_label: "fault",
        window_alpha: 0.3,
        lines,
        // One legend, in the first panel, below its lines.
        legend: (first && panel == 0).then_some(SeriesLabelPosition::LowerLeft),
    };
    chart::draw_lines(area, FRAME, panel_lines)
}
