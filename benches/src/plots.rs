//! SVG plots, drawn with plotters' SVG backend only: text is emitted as SVG `<text>` and laid
//! out with plotters' built-in metrics, so no system fonts or fontconfig are needed.

use std::path::Path;

use plotters::prelude::*;

use crate::BenchError;
use crate::impls::Impl;
use crate::report::Report;

fn color(which: Impl) -> RGBColor {
    match which {
        Impl::Redlock => RGBColor(0x1f, 0x77, 0xb4),
        Impl::Rslock => RGBColor(0xd6, 0x27, 0x28),
        Impl::RedlockRs => RGBColor(0x94, 0x67, 0xbd),
        Impl::Floor => RGBColor(0x2c, 0xa0, 0x2c),
    }
}

/// One line per implementation over categorical x positions, log-scaled y.
fn lines(
    path: &Path,
    title: &str,
    x_labels: &[String],
    y_desc: &str,
    series: &[(Impl, Vec<(usize, f64)>)],
) -> Result<(), BenchError> {
    let values = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
        .filter(|v| *v > 0.0);
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return Ok(());
    }
    let root = SVGBackend::new(path, (820, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let labels = x_labels.to_vec();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            -0.3f64..(x_labels.len() as f64 - 0.7),
            (lo / 1.5..hi * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_labels(x_labels.len())
        .x_label_formatter(&move |x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .y_label_formatter(&|y| {
            if *y >= 1000.0 {
                format!("{:.0} ms", y / 1000.0)
            } else {
                format!("{y:.0} µs")
            }
        })
        .draw()?;
    for (which, pts) in series {
        let c = color(*which);
        let pts: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| p.1 > 0.0)
            .map(|(x, y)| (*x as f64, *y))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(which.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Writes every plot into `dir`; returns the file names.
pub(crate) fn write_all(report: &Report, dir: &Path) -> Result<Vec<String>, BenchError> {
    std::fs::create_dir_all(dir)?;
    let mut files = Vec::new();
    let nodes = &report.meta.nodes;
    let x: Vec<String> = nodes.iter().map(|n| format!("N = {n}")).collect();
    for (name, title, pick) in [
        (
            "latency_p50_vs_n.svg",
            "Uncontended acquire + release, p50 (log scale)",
            (|l: &crate::report::Latency| l.p50_us) as fn(&crate::report::Latency) -> f64,
        ),
        (
            "latency_p99_vs_n.svg",
            "Uncontended acquire + release, p99 (log scale)",
            |l: &crate::report::Latency| l.p99_us,
        ),
    ] {
        let series: Vec<(Impl, Vec<(usize, f64)>)> = Impl::ALL
            .iter()
            .map(|w| {
                let pts = nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, n)| {
                        report
                            .latency
                            .iter()
                            .find(|r| r.n == *n && r.implementation == *w)
                            .map(|r| (i, pick(&r.cycle)))
                    })
                    .collect();
                (*w, pts)
            })
            .collect();
        lines(&dir.join(name), title, &x, "latency", &series)?;
        files.push(name.to_owned());
    }
    let fault_ns: std::collections::BTreeSet<usize> = report.faults.iter().map(|r| r.n).collect();
    for n in fault_ns {
        let faults: Vec<String> = {
            let mut v: Vec<String> = Vec::new();
            for r in report.faults.iter().filter(|r| r.n == n) {
                if !v.contains(&r.fault) {
                    v.push(r.fault.clone());
                }
            }
            v
        };
        let series: Vec<(Impl, Vec<(usize, f64)>)> = Impl::ALL
            .iter()
            .map(|w| {
                let pts = faults
                    .iter()
                    .enumerate()
                    .filter_map(|(i, f)| {
                        report
                            .faults
                            .iter()
                            .find(|r| r.n == n && &r.fault == f && r.implementation == *w)
                            .map(|r| (i, r.cycle.p99_us))
                    })
                    .collect();
                (*w, pts)
            })
            .collect();
        let name = format!("fault_tail_p99_n{n}.svg");
        lines(
            &dir.join(&name),
            &format!("p99 of one acquire attempt + release under faults, N = {n} (log scale)"),
            &faults,
            "p99",
            &series,
        )?;
        files.push(name);
    }
    Ok(files)
}
