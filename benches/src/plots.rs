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
        Impl::RedlockUnstamped => RGBColor(0x17, 0xbe, 0xcf),
        Impl::Rslock => RGBColor(0xd6, 0x27, 0x28),
        Impl::RedlockRs => RGBColor(0x94, 0x67, 0xbd),
        Impl::Floor => RGBColor(0x2c, 0xa0, 0x2c),
        Impl::RedisLock => RGBColor(0xff, 0x7f, 0x0e),
        Impl::DistLock => RGBColor(0x8c, 0x56, 0x4b),
    }
}

/// One bar of a grouped bar chart: its value and an optional note drawn above it.
type Bar = Option<(f64, Option<String>)>;

/// Grouped bars: one group per `groups` entry, one bar per implementation in each; a missing
/// bar (`None`) leaves its slot empty. `log` puts y on a log scale.
fn bars(
    path: &Path,
    title: &str,
    groups: &[String],
    y_desc: &str,
    log: bool,
    fmt_y: &dyn Fn(f64) -> String,
    series: &[(Impl, Vec<Bar>)],
) -> Result<(), BenchError> {
    let values = series
        .iter()
        .flat_map(|(_, b)| b.iter().flatten().map(|b| b.0))
        .filter(|v| *v > 0.0);
    let Some((lo, hi)) = positive_range(values) else {
        return Ok(());
    };
    let root = SVGBackend::new(path, (960, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let labels = groups.to_vec();
    let x_range = 0f64..groups.len() as f64;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80);
    let width = 0.8 / series.len().max(1) as f64;
    let x_fmt = move |x: &f64| {
        let i = (x - 0.5).round();
        if (x - 0.5 - i).abs() < 0.01 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    macro_rules! draw {
        ($chart:expr, $base:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(groups.len() * 2 + 1)
                .x_label_formatter(&x_fmt)
                .y_desc(y_desc)
                .y_label_formatter(&|y| fmt_y(*y))
                .draw()?;
            for (k, (which, bars)) in series.iter().enumerate() {
                let c = color(*which);
                let mut first = true;
                for (g, bar) in bars.iter().enumerate() {
                    let Some((v, note)) = bar else { continue };
                    let x0 = g as f64 + 0.1 + k as f64 * width;
                    let top = if *v > 0.0 { *v } else { $base };
                    let rect = Rectangle::new([(x0, $base), (x0 + width * 0.92, top)], c.filled());
                    let drawn = chart.draw_series(std::iter::once(rect))?;
                    if first {
                        drawn.label(which.name()).legend(move |(x, y)| {
                            Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled())
                        });
                        first = false;
                    }
                    if let Some(note) = note {
                        chart.draw_series(std::iter::once(Text::new(
                            note.clone(),
                            (x0, top),
                            ("sans-serif", 11).into_font().color(&BLACK),
                        )))?;
                    }
                }
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()?;
        }};
    }
    if log {
        let base = lo / 2.0;
        draw!(
            builder.build_cartesian_2d(x_range, (base..hi * 3.0).log_scale())?,
            base
        );
    } else {
        draw!(builder.build_cartesian_2d(x_range, 0f64..hi * 1.15)?, 0.0);
    }
    root.present()?;
    Ok(())
}

fn fmt_us(y: f64) -> String {
    if y >= 1_000_000.0 {
        format!("{:.1} s", y / 1_000_000.0)
    } else if y >= 1000.0 {
        format!("{:.0} ms", y / 1000.0)
    } else {
        format!("{y:.0} µs")
    }
}

fn fmt_plain(y: f64) -> String {
    if y >= 10.0 {
        format!("{y:.0}")
    } else {
        format!("{y:.2}")
    }
}

/// One line per implementation over categorical x positions, log-scaled y.
fn lines(
    path: &Path,
    title: &str,
    x_labels: &[String],
    y_desc: &str,
    series: &[(Impl, Vec<(usize, f64)>)],
    fmt_y: &dyn Fn(f64) -> String,
) -> Result<(), BenchError> {
    let values = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
        .filter(|v| *v > 0.0);
    let Some((lo, hi)) = positive_range(values) else {
        return Ok(());
    };
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
        .y_label_formatter(&|y| fmt_y(*y))
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
        lines(&dir.join(name), title, &x, "latency", &series, &fmt_us)?;
        files.push(name.to_owned());
    }
    // Throughput vs N at 64 tasks (and 1 task), one line per implementation.
    for c in [64usize, 1] {
        let series: Vec<(Impl, Vec<(usize, f64)>)> = Impl::ALL
            .iter()
            .map(|w| {
                let pts = nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, n)| {
                        report
                            .throughput
                            .iter()
                            .find(|r| r.n == *n && r.concurrency == c && r.implementation == *w)
                            .map(|r| (i, r.ops_per_sec))
                    })
                    .collect();
                (*w, pts)
            })
            .collect();
        let name = format!("throughput_c{c}_vs_n.svg");
        lines(
            &dir.join(&name),
            &format!("Throughput, {c} tasks on distinct keys (ops/s, log scale)"),
            &x,
            "ops/s",
            &series,
            &fmt_plain,
        )?;
        files.push(name);
    }

    // Hot key: hand-offs/s per implementation, 8 clients, 1 shared client and 2 clients, per N.
    let hot_ns: std::collections::BTreeSet<usize> = report.hot_key.iter().map(|r| r.n).collect();
    for n in hot_ns {
        let groups = vec![
            "8 clients".to_owned(),
            "1 shared client".to_owned(),
            "2 clients".to_owned(),
        ];
        let series: Vec<(Impl, Vec<Bar>)> = Impl::in_every_scenario()
            .map(|w| {
                let bars = [crate::report::CONTENDERS, 1, crate::report::PAIR]
                    .iter()
                    .map(|clients| {
                        let h = report
                            .hot_key
                            .iter()
                            .find(|r| r.n == n && r.implementation == w && r.clients == *clients)?
                            .result
                            .as_ref()?;
                        let note = format!("J {:.2}", h.jain);
                        Some((h.handoffs_per_sec, Some(note)))
                    })
                    .collect();
                (w, bars)
            })
            .filter(|(_, b): &(Impl, Vec<Bar>)| b.iter().any(Option::is_some))
            .collect();
        let name = format!("hot_key_n{n}.svg");
        bars(
            &dir.join(&name),
            &format!("Hot key, 1 ms hold, N = {n}: hand-offs/s (J = Jain's index)"),
            &groups,
            "hand-offs/s",
            false,
            &fmt_plain,
            &series,
        )?;
        files.push(name);
    }

    // Held locks: CPU and memory per lock vs number of locks.
    let sizes: Vec<usize> = {
        let set: std::collections::BTreeSet<usize> = report.held.iter().map(|r| r.locks).collect();
        set.into_iter().collect()
    };
    if !sizes.is_empty() {
        let size_labels: Vec<String> = sizes.iter().map(|s| format!("{s} locks")).collect();
        type Pick = fn(&crate::report::HeldResult) -> f64;
        let picks: [(&str, &str, &str, Pick); 2] = [
            (
                "held_cpu.svg",
                "Held locks: client CPU over the hold window (cores)",
                "cores",
                |h| h.cpu_cores,
            ),
            (
                "held_memory.svg",
                "Held locks: resident memory per held lock (bytes)",
                "bytes per lock",
                |h| h.rss_bytes_per_lock,
            ),
        ];
        for (name, title, y_desc, pick) in picks {
            let series: Vec<(Impl, Vec<Bar>)> = Impl::ALL
                .iter()
                .filter(|w| w.renews())
                .map(|w| {
                    let bars = sizes
                        .iter()
                        .map(|s| {
                            let h = report
                                .held
                                .iter()
                                .find(|r| r.locks == *s && r.implementation == *w)?
                                .result
                                .as_ref()?;
                            let note = (h.lost > 0).then(|| format!("{} lost", h.lost));
                            Some((pick(h), note))
                        })
                        .collect();
                    (*w, bars)
                })
                .collect();
            bars(
                &dir.join(name),
                title,
                &size_labels,
                y_desc,
                false,
                &fmt_plain,
                &series,
            )?;
            files.push(name.to_owned());
        }
    }

    // Faults: p99 of one attempt + release per fault, bars, with error / timeout counts.
    let fault_ns: std::collections::BTreeSet<usize> = report.faults.iter().map(|r| r.n).collect();
    for n in fault_ns {
        let mut faults: Vec<String> = Vec::new();
        for r in report.faults.iter().filter(|r| r.n == n) {
            if !faults.contains(&r.fault) {
                faults.push(r.fault.clone());
            }
        }
        let series: Vec<(Impl, Vec<Bar>)> = Impl::in_every_scenario()
            .map(|w| {
                let bars = faults
                    .iter()
                    .map(|f| {
                        let l = &report
                            .faults
                            .iter()
                            .find(|r| r.n == n && &r.fault == f && r.implementation == w)?
                            .cycle;
                        let mut note = Vec::new();
                        if l.errors > 0 {
                            note.push(format!("{}/{} err", l.errors, l.samples));
                        }
                        if l.timeouts > 0 {
                            note.push(format!("{} t/o", l.timeouts));
                        }
                        Some((l.p99_us, (!note.is_empty()).then(|| note.join(", "))))
                    })
                    .collect();
                (w, bars)
            })
            .collect();
        let name = format!("fault_tail_p99_n{n}.svg");
        bars(
            &dir.join(&name),
            &format!("p99 of one acquire attempt + release under faults, N = {n} (log scale)"),
            &faults,
            "p99",
            true,
            &fmt_us,
            &series,
        )?;
        files.push(name);
    }
    Ok(files)
}

/// The smallest and largest of `values` (already filtered to positive ones); `None` when there
/// are none, so there is nothing to plot.
fn positive_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (lo <= hi).then_some((lo, hi))
}
