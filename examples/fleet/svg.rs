//! The picture: one row per scenario; on the left the calls that succeeded per second,
//! on the right the attempts per second that reached the bad replica, one line per
//! policy, the fault shaded.

use std::error::Error;

use plotters::prelude::*;

use crate::report::{Bucket, FleetReport};
use crate::run::{BUCKET, Policy};

/// One colour per policy, in [`Policy::ALL`]'s order.
const COLOURS: [RGBColor; 3] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
];
const ROW: u32 = 280;

/// What a panel plots, per bucket, as a rate per second.
type Metric = fn(&Bucket) -> u64;

pub(crate) fn draw(report: &FleetReport, path: &str) -> Result<(), Box<dyn Error>> {
    let rows = report.scenarios.len().max(1) as u32;
    let root = SVGBackend::new(path, (1200, ROW * rows)).into_drawing_area();
    root.fill(&WHITE)?;
    let per_s = 1.0 / BUCKET.as_secs_f64();
    let areas = root.split_evenly((rows as usize, 1));
    for (row_index, (scenario, row)) in report.scenarios.iter().zip(areas).enumerate() {
        let seconds = scenario
            .policies
            .iter()
            .map(|p| p.timeline.len())
            .max()
            .unwrap_or(1) as f64
            * BUCKET.as_secs_f64();
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
            let y_max = peak * 1.1;
            let mut chart = ChartBuilder::on(&area)
                .caption(title, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(28)
                .y_label_area_size(52)
                .build_cartesian_2d(0f64..seconds, 0f64..y_max)?;
            chart
                .configure_mesh()
                .x_desc("seconds")
                .y_label_formatter(&|v| format!("{v:.0}"))
                .disable_x_mesh()
                .light_line_style(WHITE)
                .draw()?;
            let fault = RGBColor(255, 170, 170).mix(0.3).filled();
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(scenario.fault_s, 0.0), (seconds, y_max)],
                    fault,
                )))?
                .label("fault")
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], fault));
            let mid = |b: &Bucket| b.t + BUCKET.as_secs_f64() / 2.0;
            if panel == 0
                && let Some(first) = scenario.policies.first()
            {
                chart
                    .draw_series(LineSeries::new(
                        first
                            .timeline
                            .iter()
                            .map(|b| (mid(b), b.offered as f64 * per_s)),
                        BLACK.mix(0.5).stroke_width(1),
                    ))?
                    .label("offered")
                    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
            }
            for policy in &scenario.policies {
                let colour = Policy::ALL
                    .iter()
                    .position(|p| p.as_str() == policy.name)
                    .map_or(BLACK, |i| COLOURS[i]);
                chart
                    .draw_series(LineSeries::new(
                        policy
                            .timeline
                            .iter()
                            .map(|b| (mid(b), value(b) as f64 * per_s)),
                        colour.stroke_width(2),
                    ))?
                    .label(policy.name)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                    });
            }
            // One legend, in the first panel, below its lines.
            if row_index == 0 && panel == 0 {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::LowerLeft)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK.mix(0.3))
                    .draw()?;
            }
        }
    }
    root.present()?;
    Ok(())
}
