//! The plot of `churn-report`: broken connections over time in each mode, per second and
//! added up, with the schedule's events marked, as a PNG drawn like `cheetah sim`'s plots
//! (plotters, DejaVu Sans read at run time; see `cheetah_sim::plot`).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::results::{ChurnResults, Event};

const SIZE: (u32, u32) = (1200, 820);
/// One colour per run, in the order given (cheetah first): green, red, then others.
const RUN_COLORS: [RGBColor; 4] = [
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
];
const EVENT_COLOR: RGBColor = RGBColor(150, 150, 150);
const MSB_COLOR: RGBColor = RGBColor(148, 103, 189);

/// Writes the plot of `runs` to `path` (PNG).
pub fn broken_over_time(runs: &[&ChurnResults], path: &Path) -> anyhow::Result<()> {
    cheetah_sim::plot::ensure_font()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(SIZE.1 * 55 / 100);
    let x_max = runs
        .iter()
        .map(|r| r.broken_per_second.len() as f64)
        .fold(1.0, f64::max);
    let per_second: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| {
            r.broken_per_second
                .iter()
                .map(|(s, kinds)| (*s as f64 + 0.5, kinds.values().sum::<u64>() as f64))
                .collect()
        })
        .collect();
    let cumulative: Vec<Vec<(f64, f64)>> = per_second
        .iter()
        .map(|series| {
            let mut sum = 0.0;
            series
                .iter()
                .map(|&(x, y)| {
                    sum += y;
                    (x, sum)
                })
                .collect()
        })
        .collect();
    let events = runs.first().map(|r| r.events.as_slice()).unwrap_or(&[]);
    let setting = runs.first().map_or(String::new(), |r| {
        format!(" ({} servers, {} forwarding)", r.servers, r.forwarding)
    });
    panel(
        &top,
        &format!("Broken connections per second under churn{setting}"),
        "broken / s",
        runs,
        &per_second,
        x_max,
        events,
        true,
    )?;
    panel(
        &bottom,
        "Broken connections so far",
        "broken (cumulative)",
        runs,
        &cumulative,
        x_max,
        events,
        false,
    )?;
    root.present()?;
    Ok(())
}

#[allow(
    clippy::too_many_arguments,
    reason = "one panel's every part, drawn once"
)]
fn panel<DB>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    y_label: &str,
    runs: &[&ChurnResults],
    series: &[Vec<(f64, f64)>],
    x_max: f64,
    events: &[Event],
    label_events: bool,
) -> anyhow::Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let y_max = series
        .iter()
        .flatten()
        .map(|p| p.1)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.25;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the load started")
        .y_desc(y_label)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(RGBColor(240, 240, 240))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;

    let marked: Vec<&Event> = events
        .iter()
        .filter(|e| !matches!(e.kind.as_str(), "start" | "load_stop" | "remove"))
        .collect();
    for (index, event) in marked.iter().enumerate() {
        let color = if event.kind == "ts_msb_change" {
            MSB_COLOR
        } else {
            EVENT_COLOR
        };
        chart.draw_series(DashedLineSeries::new(
            [(event.t, 0.0), (event.t, y_max)],
            6,
            4,
            ShapeStyle::from(&color).stroke_width(1),
        ))?;
        if label_events {
            // Three rows of labels, so neighbouring events do not write over each other.
            let row = (index % 3) as f64;
            let y = y_max * (0.97 - 0.07 * row);
            // A little right of its line, so the dashes do not cross the text.
            let x = event.t + x_max * 0.004;
            chart.draw_series(std::iter::once(Text::new(
                event.label.clone(),
                (x, y),
                ("sans-serif", 12).into_font().color(&color),
            )))?;
        }
    }

    for (index, (run, points)) in runs.iter().zip(series).enumerate() {
        let color = RUN_COLORS[index % RUN_COLORS.len()];
        let total = run.connections_broken;
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                ShapeStyle::from(&color).stroke_width(2),
            ))?
            .label(format!("{} ({total} broken)", run.mode))
            .legend(move |(x, y)| {
                PathElement::new(
                    vec![(x, y), (x + 24, y)],
                    ShapeStyle::from(&color).stroke_width(3),
                )
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(200, 200, 200))
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}
