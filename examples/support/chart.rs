//! The examples' one chart module: panels of lines over time with a shaded window (the
//! storm's trigger, the fleet's fault) and panels of grouped bars (the tail's figures),
//! drawn to SVG with one look: caption, mesh, legend.
#![allow(dead_code, reason = "each example draws the panels it needs")]

use std::error::Error;

use plotters::coord::Shift;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;

/// A drawing area of an SVG picture.
pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Sizes of a panel's caption and margins, in pixels.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame {
    pub(crate) caption: u32,
    pub(crate) margin: u32,
    pub(crate) x_labels: u32,
    pub(crate) y_labels: u32,
}

/// One line of a panel: its label, colour and width, and its points.
pub(crate) struct Line<'a> {
    pub(crate) label: &'a str,
    pub(crate) colour: RGBAColor,
    pub(crate) width: u32,
    pub(crate) points: Vec<(f64, f64)>,
}

/// A panel of lines over `0..x_max` seconds, a window shaded from `window.0` to `window.1`.
pub(crate) struct LinePanel<'a> {
    pub(crate) title: &'a str,
    pub(crate) x_max: f64,
    pub(crate) y_max: f64,
    pub(crate) window: (f64, f64),
    pub(crate) window_label: &'a str,
    /// The shade's opacity.
    pub(crate) window_alpha: f64,
    pub(crate) lines: Vec<Line<'a>>,
    /// Where the legend goes; `None`: this panel has none.
    pub(crate) legend: Option<SeriesLabelPosition>,
}

/// The window's shade: a light red.
const SHADE: RGBColor = RGBColor(255, 170, 170);

/// Draws `panel` in `area`.
pub(crate) fn draw_lines(
    area: &Area<'_>,
    frame: Frame,
    panel: LinePanel<'_>,
) -> Result<(), Box<dyn Error>> {
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", frame.caption))
        .margin(frame.margin)
        .x_label_area_size(frame.x_labels)
        .y_label_area_size(frame.y_labels)
        .build_cartesian_2d(0f64..panel.x_max, 0f64..panel.y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .disable_x_mesh()
        .light_line_style(WHITE)
        .draw()?;
    let shade = SHADE.mix(panel.window_alpha).filled();
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(panel.window.0, 0.0), (panel.window.1, panel.y_max)],
            shade,
        )))?
        .label(panel.window_label)
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], shade));
    for line in panel.lines {
        let style = line.colour.stroke_width(line.width);
        chart
            .draw_series(LineSeries::new(line.points, style))?
            .label(line.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    if let Some(position) = panel.legend {
        legend(&mut chart, position)?;
    }
    Ok(())
}

/// The line of the offered calls: thin, grey.
pub(crate) fn offered(points: Vec<(f64, f64)>) -> Line<'static> {
    Line {
        label: "offered",
        colour: BLACK.mix(0.5),
        width: 1,
        points,
    }
}

/// The line of policy `name`, 2 px wide, in the colour of its place in `names` (black
/// if it has none).
pub(crate) fn policy_line<'a>(
    name: &'a str,
    names: &[&str],
    colours: &[RGBColor],
    points: Vec<(f64, f64)>,
) -> Line<'a> {
    let colour = names
        .iter()
        .position(|n| *n == name)
        .and_then(|i| colours.get(i))
        .copied()
        .unwrap_or(BLACK);
    Line {
        label: name,
        colour: colour.mix(1.0),
        width: 2,
        points,
    }
}

/// One group of bars: a bar per x position, all in one colour, each labelled with its
/// value.
pub(crate) struct Bars<'a> {
    pub(crate) label: &'a str,
    pub(crate) colour: RGBColor,
    pub(crate) values: Vec<f64>,
}

/// A panel of bars grouped at positions `0..names.len()`, named on the x axis; with `log`
/// the y axis is logarithmic from `y.0` (bars start there) to `y.1`.
pub(crate) struct BarPanel<'a> {
    pub(crate) title: &'a str,
    pub(crate) names: &'a [&'a str],
    pub(crate) y: (f64, f64),
    pub(crate) log: bool,
    pub(crate) groups: Vec<Bars<'a>>,
    /// Distance between the centres of two bars of a position, and half a bar's width.
    pub(crate) spacing: f64,
    pub(crate) half_width: f64,
    /// Decimals of the value written over each bar.
    pub(crate) decimals: usize,
    /// Where a value's label sits: x offset from the bar's centre, and its y from the
    /// bar's top (`top * factor` on a log axis, `top + share × y.1` on a linear one).
    pub(crate) text_dx: f64,
    pub(crate) text_dy: f64,
}

/// Draws `panel` in `area`, the legend at the upper right.
pub(crate) fn draw_bars(
    area: &Area<'_>,
    frame: Frame,
    panel: BarPanel<'_>,
) -> Result<(), Box<dyn Error>> {
    let n = panel.names.len().max(1);
    let names = panel.names;
    let x_label = move |x: &f64| -> String {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            names.get(i as usize).copied().unwrap_or("").to_owned()
        } else {
            String::new()
        }
    };
    let x_range = -0.5f64..n as f64 - 0.5;
    let builder = |area| {
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(panel.title, ("sans-serif", frame.caption))
            .margin(frame.margin)
            .x_label_area_size(frame.x_labels)
            .y_label_area_size(frame.y_labels);
        builder
    };
    let (low, high) = panel.y;
    let groups = panel.groups.len() as f64;
    if panel.log {
        let mut chart = builder(area).build_cartesian_2d(x_range, (low..high).log_scale())?;
        bar_mesh(&mut chart, n, &x_label)?;
        for (k, group) in panel.groups.iter().enumerate() {
            let offset = (k as f64 - (groups - 1.0) / 2.0) * panel.spacing;
            let top = |v: f64| v.max(low);
            draw_group(&mut chart, group, offset, &panel, low, top, |v| {
                top(v) * panel.text_dy
            })?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    } else {
        let mut chart = builder(area).build_cartesian_2d(x_range, low..high)?;
        bar_mesh(&mut chart, n, &x_label)?;
        for (k, group) in panel.groups.iter().enumerate() {
            let offset = (k as f64 - (groups - 1.0) / 2.0) * panel.spacing;
            draw_group(
                &mut chart,
                group,
                offset,
                &panel,
                low,
                |v| v,
                |v| v + high * panel.text_dy,
            )?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    }
    Ok(())
}

fn bar_mesh<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    n: usize,
    x_label: &dyn Fn(&f64) -> String,
) -> Result<(), Box<dyn Error>>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(x_label)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .disable_x_mesh()
        .light_line_style(WHITE)
        .draw()?;
    Ok(())
}

fn draw_group<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    group: &Bars<'_>,
    offset: f64,
    panel: &BarPanel<'_>,
    bottom: f64,
    top: impl Fn(f64) -> f64,
    text_y: impl Fn(f64) -> f64,
) -> Result<(), Box<dyn Error>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let colour = group.colour;
    let half = panel.half_width;
    chart
        .draw_series(group.values.iter().enumerate().map(|(i, v)| {
            let x = i as f64 + offset;
            Rectangle::new([(x - half, bottom), (x + half, top(*v))], colour.filled())
        }))?
        .label(group.label)
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled()));
    let decimals = panel.decimals;
    chart.draw_series(group.values.iter().enumerate().map(|(i, v)| {
        let x = i as f64 + offset;
        Text::new(
            format!("{v:.decimals$}"),
            (x + panel.text_dx, text_y(*v)),
            ("sans-serif", 11),
        )
    }))?;
    Ok(())
}

/// The legend's look, in every chart.
fn legend<'a, CT>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> Result<(), Box<dyn Error>>
where
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}
