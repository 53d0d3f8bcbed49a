//! `--plot FILE.svg`: throughput over time and the latency distribution of a run, drawn
//! with plotters' SVG backend (no fonts or native libraries needed).

use std::path::Path;

use plotters::prelude::*;

use crate::report::{Quantile, Report};

/// Where a percentile sits on the "nines" axis: `-log10(1 - p/100)`, so 90% is 1,
/// 99% is 2, 99.9% is 3; 100% is drawn at 5.
pub fn nines(percentile: f64) -> f64 {
    let rest = 1.0 - percentile / 100.0;
    if rest <= 1e-5 {
        5.0
    } else {
        -rest.log10()
    }
}

fn nines_label(x: &f64) -> String {
    match x.round() as i64 {
        0 => "0%".into(),
        1 => "90%".into(),
        2 => "99%".into(),
        3 => "99.9%".into(),
        4 => "99.99%".into(),
        _ => "max".into(),
    }
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e}")
}

/// Draws the report's timeline and latency/first-byte distributions into an SVG file.
pub fn write_svg(path: &Path, report: &Report) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically(360);

    let t_max = report
        .timeline
        .last()
        .map_or(1.0, |s| s.t_s)
        .max(report.elapsed_s)
        .max(1e-3);
    let y_max = report
        .timeline
        .iter()
        .map(|s| s.mb_s)
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.1;
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!(
                "{} — {:.1} MB/s, {:.0} req/s over {:.1} s",
                report.config.endpoint,
                report.throughput_mb_s,
                report.requests_per_s,
                report.elapsed_s
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("MB/s")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            std::iter::once((0.0, 0.0)).chain(report.timeline.iter().map(|s| (s.t_s, s.mb_s))),
            BLUE.stroke_width(2),
        ))
        .map_err(err)?
        .label("throughput")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE));
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;

    let ms = |q: &Quantile| q.micros as f64 / 1e3;
    let l_max = report
        .latency_distribution
        .iter()
        .chain(&report.ttfb_distribution)
        .map(ms)
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.1;
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            format!(
                "latency p50 {:.2} ms, p99 {:.2} ms; first byte p50 {:.2} ms",
                report.latency_us.p50 as f64 / 1e3,
                report.latency_us.p99 as f64 / 1e3,
                report.ttfb_us.p50 as f64 / 1e3
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..5.0, 0.0..l_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("ms")
        .x_labels(6)
        .x_label_formatter(&nines_label)
        .draw()
        .map_err(err)?;
    for (series, color, name) in [
        (&report.latency_distribution, RED, "whole request"),
        (&report.ttfb_distribution, GREEN, "first byte"),
    ] {
        chart
            .draw_series(LineSeries::new(
                series.iter().map(|q| (nines(q.percentile), ms(q))),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_axis() {
        assert_eq!(nines(0.0), 0.0);
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-9);
        assert_eq!(nines(100.0), 5.0);
        assert_eq!(nines_label(&2.0), "99%");
    }
}
