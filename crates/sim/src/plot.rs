//! Line charts of a study's results, written as PNG and SVG with `plotters`.
//!
//! Text needs a TrueType font, read at run time (plotters' `ab_glyph` backend, so no
//! fontconfig or freetype): `$CHEETAH_SIM_FONT`, else DejaVu Sans or Liberation Sans from
//! the usual system paths (Debian: `fonts-dejavu-core`, installed by scripts/setup.sh).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::engine::{pct, RunResult};
use crate::scenario::{Metric, PlotSpec, Study};

const FONT_PATHS: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
];

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Registers the font once per process.
pub fn ensure_font() -> anyhow::Result<()> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates: Vec<PathBuf> = std::env::var_os("CHEETAH_SIM_FONT")
            .map(PathBuf::from)
            .into_iter()
            .chain(FONT_PATHS.iter().map(PathBuf::from))
            .collect();
        let path = candidates
            .iter()
            .find(|path| path.is_file())
            .ok_or_else(|| {
                "no TrueType font found for the plots: install fonts-dejavu-core or set \
             CHEETAH_SIM_FONT to a .ttf file"
                    .to_string()
            })?;
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        // plotters keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{}: not a usable font", path.display()))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// One line of a chart.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// The chart `spec` asks for, from the results of `study`.
pub fn chart(study: &Study, spec: &PlotSpec, results: &[&RunResult]) -> Chart {
    let mut series: Vec<Series> = Vec::new();
    let mut push =
        |label: String, point: (f64, f64)| match series.iter_mut().find(|s| s.label == label) {
            Some(existing) => existing.points.push(point),
            None => series.push(Series {
                label,
                points: vec![point],
            }),
        };
    for result in results {
        if spec.metric.is_timeseries() {
            let label = match result.param {
                Some(value) => format!("{} ({value})", result.lb),
                None => result.lb.clone(),
            };
            let mut so_far = 0;
            for (second, stats) in result.series.iter().enumerate() {
                so_far += stats.broken;
                let y = match spec.metric {
                    Metric::BrokenPerSecond => stats.broken as f64,
                    Metric::BrokenCumulative => so_far as f64,
                    _ => pct(stats.broken, stats.broken + stats.completed),
                };
                push(label.clone(), (second as f64 + 0.5, y));
            }
        } else {
            let x = result.param.unwrap_or(0.0);
            let y = match spec.metric {
                Metric::ImbalanceExcessPct => result.imbalance_excess_pct(),
                _ => result.broken_pct(),
            };
            push(result.lb.clone(), (x, y));
        }
    }
    let (x_label, log_x) = if spec.metric.is_timeseries() {
        ("time (s)".to_string(), false)
    } else {
        let param = study.sweep.as_ref().map(|sweep| sweep.param);
        (
            param.map_or("run", |p| p.label()).to_string(),
            param == Some(crate::scenario::SweepParam::UpdateRatePerMin),
        )
    };
    Chart {
        title: spec.title.clone().unwrap_or_else(|| study.title.clone()),
        x_label,
        y_label: spec.metric.label().to_string(),
        log_x,
        log_y: spec.log_y,
        series,
    }
}

/// Writes `chart` to `<stem>.png` and `<stem>.svg`.
pub fn write(chart: &Chart, stem: &Path) -> anyhow::Result<()> {
    ensure_font()?;
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    {
        let root = BitMapBackend::new(&png, (960, 600)).into_drawing_area();
        draw(&root, chart)?;
        root.present()?;
    }
    {
        let root = SVGBackend::new(&svg, (960, 600)).into_drawing_area();
        draw(&root, chart)?;
        root.present()?;
    }
    Ok(())
}

/// Bounds of the data; on a log axis, zeros are drawn at a floor a decade under the
/// smallest positive value (their legend says so).
fn bounds(values: impl Iterator<Item = f64> + Clone, log: bool) -> (f64, f64, f64) {
    let positive = values.clone().filter(|v| *v > 0.0);
    let min_positive = positive.clone().fold(f64::INFINITY, f64::min);
    let max = values.clone().fold(f64::NEG_INFINITY, f64::max);
    if log {
        let floor = if min_positive.is_finite() {
            min_positive / 10.0
        } else {
            1e-3
        };
        let top = if max > floor {
            max * 2.0
        } else {
            floor * 100.0
        };
        (floor, floor * 0.8, top)
    } else {
        let min = values.fold(f64::INFINITY, f64::min).min(0.0);
        let top = if max > min { max * 1.08 } else { min + 1.0 };
        (min, min, top)
    }
}

fn draw<DB>(root: &DrawingArea<DB, Shift>, chart: &Chart) -> anyhow::Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let xs = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1));
    let (_, x_lo, x_hi) = bounds(xs.clone(), chart.log_x);
    let (x_lo, x_hi) = if chart.log_x {
        let min = xs.clone().fold(f64::INFINITY, f64::min);
        let max = xs.fold(f64::NEG_INFINITY, f64::max);
        (min * 0.8, max * 1.25)
    } else {
        (x_lo.min(0.0), x_hi)
    };
    let (y_floor, y_lo, y_hi) = bounds(ys, chart.log_y);
    match (chart.log_x, chart.log_y) {
        (false, false) => draw_on(root, chart, x_lo..x_hi, y_lo..y_hi, y_floor),
        (true, false) => draw_on(root, chart, (x_lo..x_hi).log_scale(), y_lo..y_hi, y_floor),
        (false, true) => draw_on(root, chart, x_lo..x_hi, (y_lo..y_hi).log_scale(), y_floor),
        (true, true) => draw_on(
            root,
            chart,
            (x_lo..x_hi).log_scale(),
            (y_lo..y_hi).log_scale(),
            y_floor,
        ),
    }
}

/// Axis tick text: no trailing ".0", few digits.
fn tick(value: &f64) -> String {
    let v = *value;
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 10_000.0 && (v / 1000.0 - (v / 1000.0).round()).abs() < 1e-9 {
        format!("{:.0}k", v / 1000.0)
    } else if v.abs() >= 1.0 && (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.0e}")
    }
}

fn draw_on<DB, X, Y>(
    root: &DrawingArea<DB, Shift>,
    chart: &Chart,
    x: X,
    y: Y,
    y_floor: f64,
) -> anyhow::Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    root.fill(&WHITE)?;
    let (width, _) = root.dim_in_pixel();
    // The legend gets its own panel on the right, so it never hides a line.
    let (plot_area, legend_area) = root.split_horizontally(width.saturating_sub(250));
    let mut context = ChartBuilder::on(&plot_area)
        .caption(&chart.title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)?;
    context
        .configure_mesh()
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .x_labels(if chart.log_x { 4 } else { 10 })
        .y_labels(if chart.log_y { 6 } else { 10 })
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()?;
    let mut legend = Vec::new();
    for (index, series) in chart.series.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let all_zero = chart.log_y && series.points.iter().all(|p| p.1 <= 0.0);
        let some_zero = chart.log_y && series.points.iter().any(|p| p.1 <= 0.0);
        let points: Vec<(f64, f64)> = series
            .points
            .iter()
            .map(|&(x, y)| (x, if chart.log_y && y <= 0.0 { y_floor } else { y }))
            .collect();
        legend.push((series.label.clone(), all_zero, some_zero, color));
        let style = ShapeStyle::from(&color).stroke_width(2);
        context.draw_series(LineSeries::new(points.iter().copied(), style))?;
        if points.len() <= 40 {
            context.draw_series(
                points
                    .iter()
                    .map(|&point| Circle::new(point, 3, ShapeStyle::from(&color).filled())),
            )?;
        }
    }
    let text = ("sans-serif", 14).into_font();
    let note = ("sans-serif", 12)
        .into_font()
        .color(&RGBColor(110, 110, 110));
    let mut y = 60;
    for (label, all_zero, some_zero, color) in legend {
        let style = ShapeStyle::from(&color).stroke_width(3);
        legend_area.draw(&PathElement::new(vec![(8, y), (34, y)], style))?;
        legend_area.draw(&Text::new(label, (42, y - 8), text.clone()))?;
        y += 22;
        if some_zero {
            let why = if all_zero {
                "0 everywhere, drawn at the floor"
            } else {
                "its zeros are drawn at the floor"
            };
            legend_area.draw(&Text::new(why, (42, y - 10), note.clone()))?;
            y += 18;
        }
    }
    Ok(())
}
