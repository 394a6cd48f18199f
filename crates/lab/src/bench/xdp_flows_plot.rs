//! The plot of `cheetah bench --xdp-flows`: ns per packet (median, with the p10-p90 band
//! as a vertical bar) against the number of flows, log scale, one line per path (PNG, drawn
//! like the lab's other plots: plotters, DejaVu Sans read at run time).

use std::path::Path;

use plotters::prelude::*;

use super::xdp_flows::{curve_labels, Point};

const SIZE: (u32, u32) = (1000, 620);
/// Cheetah's two cookie paths in green and blue, its fallback table in orange, the
/// Katran-style connection table in red (CURVES' order).
const COLORS: [RGBColor; 4] = [
    RGBColor(44, 160, 44),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
];

pub(super) fn draw(points: &[Point], path: &Path) -> anyhow::Result<()> {
    cheetah_sim::plot::ensure_font()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = points
        .iter()
        .map(|p| f64::from(p.flows))
        .fold(10.0, f64::max)
        * 2.0;
    let y_max = points
        .iter()
        .flat_map(|p| p.nets.iter().flatten().map(|s| s.p90))
        .fold(10.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "XDP path: ns per packet (net of the trivial program) against distinct flows",
            ("sans-serif", 20),
        )
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d((0.5..x_max).log_scale(), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("distinct flows the packets cycle over")
        .y_desc("ns per packet, median (bars: p10-p90)")
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(RGBColor(240, 240, 240))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    for (index, label) in curve_labels().into_iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let series: Vec<(f64, f64, f64, f64)> = points
            .iter()
            .filter_map(|p| {
                p.nets[index]
                    .as_ref()
                    .ok()
                    .map(|s| (f64::from(p.flows), s.median, s.p10, s.p90))
            })
            .collect();
        chart.draw_series(series.iter().map(|&(x, _, low, high)| {
            PathElement::new(vec![(x, low), (x, high)], color.stroke_width(1))
        }))?;
        chart
            .draw_series(LineSeries::new(
                series.iter().map(|&(x, y, _, _)| (x, y)),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        chart.draw_series(
            series
                .iter()
                .map(|&(x, y, _, _)| Circle::new((x, y), 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(200, 200, 200))
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}
