//! `redlock-bench`: this workspace's `redlock` crate side by side with rslock, redlock-rs
//! (crates.io `redlock` 2.x, on the blocking pool) and a raw-protocol floor, in one run,
//! against the same redis-server nodes, for N ∈ {1, 3, 5, 7}.
//!
//! Scenarios: uncontended latency, throughput at 1/16/64 tasks on distinct keys, a hot key
//! with 8 contenders, many held (auto-renewed) locks, and — on a separate proxied cluster —
//! a slow, hung and dead minority node and a hung or dead majority. See `docs/benchmarks.md`.
//!
//! ```text
//! redlock-bench [--quick] [--json FILE] [--plots DIR] [--nodes URL,URL,...]
//!               [--hold-secs S] [--only latency,throughput,hot,held,faults,hot-faults] [--check]
//!               [--n 1,3,5,7] [--impls redlock,floor,...]
//! ```
//!
//! `--n` narrows the latency, throughput, hot-key and fault phases and `--impls` the throughput,
//! hot-key and fault phases, for comparing one change; the targets table of such a run is
//! partial.

#![forbid(unsafe_code)]

mod counters;
mod floor;
mod impls;
mod plots;
mod report;
mod scenarios;

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use redlock_testkit::Cluster;

use crate::impls::{Client, Impl};
use crate::report::{HeldRow, HotFaultRow, HotKeyRow, Meta, Report};
use crate::scenarios::PLAIN;

pub(crate) type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// Sizes of every phase: `--quick` for the one-minute smoke run, else the full run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    quick: bool,
    nodes: Vec<usize>,
    latency_samples: usize,
    block: usize,
    /// redlock-rs opens a TCP connection per command: fewer samples keep it in budget.
    redlock_rs_samples: usize,
    concurrencies: Vec<usize>,
    /// Each implementation's `tput_wall` is measured in this many windows, taking turns.
    tput_windows: usize,
    tput_wall: Duration,
    hot_nodes: Vec<usize>,
    hot_wall: Duration,
    /// Node counts of the hot key under faults (its rows take `hot_wall` each).
    hot_fault_nodes: Vec<usize>,
    held_nodes: usize,
    held_sizes: Vec<usize>,
    held_ttl: Duration,
    hold: Duration,
    fault_nodes: Vec<usize>,
    pub(crate) fault_samples: usize,
    pub(crate) fault_slow_samples: usize,
    pub(crate) fault_hung_samples: usize,
    /// Wall-time cap of one fault series (one implementation under one fault).
    pub(crate) fault_series_budget: Duration,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                nodes: vec![1, 3, 5, 7],
                latency_samples: 200,
                block: 100,
                redlock_rs_samples: 60,
                concurrencies: vec![1, 16, 64],
                tput_wall: Duration::from_millis(200),
                tput_windows: 2,
                hot_nodes: vec![5],
                hot_wall: Duration::from_millis(500),
                hot_fault_nodes: vec![5],
                held_nodes: 5,
                held_sizes: vec![1_000],
                held_ttl: Duration::from_secs(2),
                hold: Duration::from_secs(2),
                fault_nodes: vec![5],
                fault_samples: 50,
                fault_slow_samples: 10,
                // Peers without a per-node timeout take 1–2.5 s per op here.
                fault_hung_samples: 1,
                fault_series_budget: Duration::from_secs(3),
            }
        } else {
            Plan {
                quick,
                nodes: vec![1, 3, 5, 7],
                latency_samples: 5_000,
                block: 250,
                redlock_rs_samples: 1_000,
                concurrencies: vec![1, 16, 64],
                tput_wall: Duration::from_secs(3),
                tput_windows: 6,
                hot_nodes: vec![1, 3, 5, 7],
                hot_wall: Duration::from_secs(10),
                hot_fault_nodes: vec![5],
                held_nodes: 5,
                held_sizes: vec![1_000, 10_000, 100_000],
                held_ttl: Duration::from_secs(10),
                hold: Duration::from_secs(60),
                fault_nodes: vec![3, 5, 7],
                fault_samples: 1_000,
                fault_slow_samples: 200,
                fault_hung_samples: 6,
                fault_series_budget: Duration::from_secs(30),
            }
        }
    }
}

#[derive(Debug, Default)]
struct Args {
    quick: bool,
    check: bool,
    json: Option<PathBuf>,
    plots: Option<PathBuf>,
    nodes: Option<Vec<String>>,
    hold_secs: Option<f64>,
    only: Option<Vec<String>>,
    /// `--n`: node counts of the latency, throughput, hot-key and fault phases (a subset of the
    /// plan's).
    node_counts: Option<Vec<usize>>,
    /// `--impls`: implementations timed in the throughput, hot-key and fault phases (names as in
    /// the tables).
    impls: Option<Vec<String>>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--quick" => args.quick = true,
            "--check" => args.check = true,
            "--json" => args.json = Some(value()?.into()),
            "--plots" => args.plots = Some(value()?.into()),
            "--nodes" => {
                args.nodes = Some(value()?.split(',').map(str::to_owned).collect());
            }
            "--hold-secs" => {
                let v: f64 = value()?.parse().map_err(|e| format!("--hold-secs: {e}"))?;
                if !(v > 0.0 && v.is_finite()) {
                    return Err("--hold-secs must be positive".into());
                }
                args.hold_secs = Some(v);
            }
            "--only" => args.only = Some(value()?.split(',').map(str::to_owned).collect()),
            "--n" => {
                let counts = value()?
                    .split(',')
                    .map(|v| v.parse::<usize>().map_err(|e| format!("--n: {v:?}: {e}")))
                    .collect::<Result<Vec<_>, _>>()?;
                args.node_counts = Some(counts);
            }
            "--impls" => {
                let names: Vec<String> = value()?.split(',').map(str::to_owned).collect();
                if let Some(bad) = names
                    .iter()
                    .find(|n| !Impl::ALL.iter().any(|w| w.name() == *n))
                {
                    let known: Vec<_> = Impl::ALL.iter().map(|w| w.name()).collect();
                    return Err(format!(
                        "--impls: unknown {bad:?} (known: {})",
                        known.join(", ")
                    ));
                }
                args.impls = Some(names);
            }
            "-h" | "--help" => {
                println!(
                    "redlock-bench [--quick] [--json FILE] [--plots DIR] [--nodes URL,URL,...] \
                     [--hold-secs S] [--only latency,throughput,hot,held,faults,hot-faults] [--check]\n\
                     \x20              [--n 1,3,5,7] [--impls redlock,floor,...] \
                     (partial runs, for comparing one change; their targets verdicts are partial)"
                );
                std::process::exit(0);
            }
            // `cargo bench` passes `--bench`; ignore it.
            "--bench" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// Panics seen by the hook, and the first one's location and message.
static PANICS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static FIRST_PANIC: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Counts panics (tokio catches those of spawned tasks: a peer's background task can die
/// without anyone noticing) and prints only the first of each location.
fn count_panics() {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let location = info
            .location()
            .map_or_else(String::new, |l| format!("{}:{}", l.file(), l.line()));
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let _ = FIRST_PANIC.set(format!("{message} at {location}"));
        let mut seen = SEEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !seen.contains(&location) {
            seen.push(location);
            default(info);
        }
    }));
}

fn main() {
    counters::install();
    count_panics();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("redlock-bench: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // A signal drops the run, and with it every server it started, instead of leaving them
    // running after the process is gone.
    let outcome = rt.block_on(async {
        tokio::select! {
            // Polled first, so the handlers are in place before any server starts.
            biased;
            signal = stop_signal() => Err(signal),
            result = run(&args) => Ok(result),
        }
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let report = match outcome {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            eprintln!("redlock-bench: {e}");
            std::process::exit(1);
        }
        Err(signal) => {
            eprintln!("redlock-bench: stopped by {signal}; the servers it started are stopped");
            std::process::exit(130);
        }
    };
    println!("{}", report.markdown());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).expect("serializable report");
        if let Err(e) = std::fs::write(path, json) {
            eprintln!("redlock-bench: writing {}: {e}", path.display());
            std::process::exit(1);
        }
        eprintln!("JSON written to {}", path.display());
    }
    if let Some(dir) = &args.plots {
        match plots::write_all(&report, dir) {
            Ok(files) => eprintln!("plots written to {}: {}", dir.display(), files.join(", ")),
            Err(e) => {
                eprintln!("redlock-bench: plots: {e}");
                std::process::exit(1);
            }
        }
    }
    if args.check {
        let missing = report.check();
        if missing.is_empty() {
            eprintln!(
                "check: every scenario has numbers for every implementation that supports it"
            );
        } else {
            eprintln!("check FAILED, no numbers for: {}", missing.join(", "));
            std::process::exit(1);
        }
    }
}

/// The first of SIGINT, SIGTERM and SIGHUP to arrive, by name. Without handlers (they could
/// not be installed) it never completes and the signal's default action applies.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut streams = Vec::new();
    for (kind, name) in [
        (SignalKind::interrupt(), "SIGINT"),
        (SignalKind::terminate(), "SIGTERM"),
        (SignalKind::hangup(), "SIGHUP"),
    ] {
        match signal(kind) {
            Ok(s) => streams.push((s, name)),
            Err(e) => eprintln!("redlock-bench: cannot handle {name}: {e}"),
        }
    }
    if streams.is_empty() {
        return std::future::pending().await;
    }
    let waits = streams.iter_mut().map(|(s, name)| {
        Box::pin(async move {
            s.recv().await;
            *name
        })
    });
    futures_util::future::select_all(waits).await.0
}

async fn run(args: &Args) -> Result<Report, BenchError> {
    let mut plan = Plan::new(args.quick);
    if let Some(h) = args.hold_secs {
        plan.hold = Duration::from_secs_f64(h);
    }
    let wants = |s: &str| args.only.as_ref().is_none_or(|o| o.iter().any(|x| x == s));
    let started = Instant::now();
    let mut skipped = Vec::new();

    // Healthy scenarios run on plain (unproxied) nodes: spawned, or the user's.
    let (cluster, urls) = match &args.nodes {
        Some(urls) => (None, urls.clone()),
        None => {
            let max = plan.nodes.iter().copied().max().unwrap_or(5);
            let c = Cluster::start(max).await?;
            let urls = c.urls();
            (Some(c), urls)
        }
    };
    plan.nodes.retain(|n| *n <= urls.len());
    if let Some(counts) = &args.node_counts {
        plan.nodes.retain(|n| counts.contains(n));
        plan.hot_nodes.retain(|n| counts.contains(n));
        plan.fault_nodes.retain(|n| counts.contains(n));
        plan.hot_fault_nodes.retain(|n| counts.contains(n));
    }
    let timed = |w: Impl| {
        args.impls
            .as_ref()
            .is_none_or(|o| o.iter().any(|x| x == w.name()))
    };
    plan.hot_nodes.retain(|n| *n <= urls.len());
    if plan.held_nodes > urls.len() {
        plan.held_nodes = plan.nodes.last().copied().unwrap_or(1);
    }

    let steps = plan.nodes.len() * (1 + plan.concurrencies.len() * Impl::ALL.len())
        + plan.hot_nodes.len()
            * (Impl::in_every_scenario().count()
                + 2 * Impl::in_every_scenario().filter(|w| w.waits()).count())
        + plan.held_sizes.len() * Impl::in_every_scenario().count()
        + plan.fault_nodes.len() * 6
        + plan.hot_fault_nodes.len()
            * scenarios::HOT_FAULTS.len()
            * Impl::in_every_scenario().count();
    let pb = ProgressBar::new(steps as u64);
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );

    let mut report = Report {
        meta: Meta {
            mode: if plan.quick { "quick" } else { "full" }.to_owned(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            wall_secs: 0.0,
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            nodes: plan.nodes.clone(),
            user_nodes: args.nodes.is_some(),
            hold_secs: plan.hold.as_secs_f64(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            phase_secs: Vec::new(),
            task_panics: 0,
            first_panic: None,
        },
        latency: Vec::new(),
        throughput: Vec::new(),
        hot_key: Vec::new(),
        held: Vec::new(),
        faults: Vec::new(),
        hot_faults: Vec::new(),
        skipped: Vec::new(),
    };

    let mut phase = Instant::now();
    let mut phase_done = |name: &str, report: &mut Report| {
        report
            .meta
            .phase_secs
            .push((name.to_owned(), phase.elapsed().as_secs_f64()));
        phase = Instant::now();
    };
    if wants("latency") || wants("throughput") {
        for &n in &plan.nodes {
            let mut clients = Vec::new();
            for which in Impl::ALL {
                let c = Client::connect(which, &urls[..n], PLAIN).await?;
                // Warm-up: open connections, load scripts.
                for i in 0..20 {
                    let _ = c.cycle(&format!("bench:warm:{i}"), scenarios::TTL).await;
                }
                clients.push(c);
            }
            if wants("latency") {
                pb.set_message(format!("uncontended N={n}"));
                let caps: Vec<usize> = clients
                    .iter()
                    .map(|c| match c.which() {
                        Impl::RedlockRs => plan.redlock_rs_samples,
                        _ => plan.latency_samples,
                    })
                    .collect();
                let block = plan.block;
                report
                    .latency
                    .extend(scenarios::uncontended(n, &clients, &caps, block).await);
            }
            pb.inc(1);
            for &c in &plan.concurrencies {
                // Rotate who goes first so warm-up effects do not favour one.
                let order: Vec<&Client> = (0..clients.len())
                    .map(|k| &clients[(k + c) % clients.len()])
                    .filter(|client| timed(client.which()))
                    .collect();
                if wants("throughput") && !order.is_empty() {
                    pb.set_message(format!("throughput N={n} c={c}"));
                    report.throughput.extend(
                        scenarios::throughput(
                            n,
                            &order,
                            &urls[..n],
                            c,
                            plan.tput_wall,
                            plan.tput_windows,
                        )
                        .await,
                    );
                }
                pb.inc(clients.len() as u64);
            }
        }
        report
            .latency
            .sort_by_key(|r| (r.n, r.implementation as u8));
        report
            .throughput
            .sort_by_key(|r| (r.n, r.concurrency, r.implementation as u8));
        phase_done("latency + throughput", &mut report);
    }

    if wants("hot") {
        for &n in &plan.hot_nodes {
            // Eight clients, then (for those that can wait) one client shared by the eight
            // contenders (this crate's waiters take FIFO turns in-process), then two clients
            // taking turns.
            let variants = Impl::in_every_scenario()
                .map(|w| (w, report::CONTENDERS, false))
                .chain(
                    Impl::in_every_scenario()
                        .filter(|w| w.waits())
                        .map(|w| (w, report::CONTENDERS, true)),
                )
                .chain(
                    Impl::in_every_scenario()
                        .filter(|w| w.waits())
                        .map(|w| (w, report::PAIR, false)),
                );
            for (which, contenders, shared) in variants {
                pb.set_message(format!(
                    "hot key N={n} {} {contenders}{}",
                    which.name(),
                    if shared { " shared" } else { "" }
                ));
                if !timed(which) {
                    continue;
                }
                let result = if which.waits() {
                    Some(
                        scenarios::hot_key(n, which, &urls[..n], plan.hot_wall, contenders, shared)
                            .await?,
                    )
                } else {
                    None
                };
                report.hot_key.push(HotKeyRow {
                    n,
                    implementation: which,
                    contenders,
                    clients: if shared { 1 } else { contenders },
                    result,
                });
                pb.inc(1);
            }
        }
        phase_done("hot key", &mut report);
    }

    if wants("held") {
        let n = plan.held_nodes;
        for &locks in &plan.held_sizes {
            for which in Impl::in_every_scenario() {
                pb.set_message(format!("{locks} held locks N={n} {}", which.name()));
                let result = if which.renews() {
                    let r =
                        scenarios::held(which, &urls[..n], locks, plan.held_ttl, plan.hold).await?;
                    // Each row as it completes, so a long run shows its progress.
                    pb.suspend(|| {
                        eprintln!(
                            "held {locks} {}: {} held in {:.1} s, {:.3} cores, {:.0} B/lock, \
                         {:.1} renewal calls/s/node, {} lost, row {:.0} s",
                            which.name(),
                            r.held,
                            r.acquire_secs,
                            r.cpu_cores,
                            r.rss_bytes_per_lock,
                            r.node_round_trips_per_sec,
                            r.lost,
                            r.total_secs
                        )
                    });
                    Some(r)
                } else {
                    None
                };
                report.held.push(HeldRow {
                    n,
                    locks,
                    ttl_secs: plan.held_ttl.as_secs_f64(),
                    hold_secs: plan.hold.as_secs_f64(),
                    implementation: which,
                    result,
                });
                pb.inc(1);
            }
        }
        phase_done("held locks", &mut report);
    }
    drop(cluster);

    if wants("faults") {
        if args.nodes.is_some() {
            skipped.push(
                "fault scenarios (they need nodes this process spawned: proxy, SIGSTOP, kill)"
                    .to_owned(),
            );
        } else {
            for &n in &plan.fault_nodes {
                let rows = scenarios::faults(n, &plan, &timed, |m| {
                    pb.set_message(m.to_owned());
                    pb.inc(1);
                })
                .await?;
                report.faults.extend(rows);
            }
            phase_done("faults", &mut report);
        }
    }

    if wants("hot-faults") {
        if args.nodes.is_some() {
            skipped.push(
                "hot key under faults (it needs nodes this process spawned: proxy, kill)"
                    .to_owned(),
            );
        } else {
            for &n in &plan.hot_fault_nodes {
                for fault in scenarios::HOT_FAULTS {
                    for which in Impl::in_every_scenario() {
                        pb.set_message(format!("hot key N={n} {fault} {}", which.name()));
                        if !timed(which) {
                            continue;
                        }
                        let result = if which.waits() {
                            Some(
                                scenarios::hot_key_under(
                                    n,
                                    which,
                                    fault,
                                    plan.hot_wall,
                                    report::CONTENDERS,
                                )
                                .await?,
                            )
                        } else {
                            None
                        };
                        report.hot_faults.push(HotFaultRow {
                            n,
                            fault: fault.to_owned(),
                            implementation: which,
                            contenders: report::CONTENDERS,
                            result,
                        });
                        pb.inc(1);
                    }
                }
            }
            phase_done("hot key under faults", &mut report);
        }
    }
    pb.finish_and_clear();
    report.skipped = skipped;
    report.meta.wall_secs = started.elapsed().as_secs_f64();
    report.meta.task_panics = PANICS.load(std::sync::atomic::Ordering::Relaxed);
    report.meta.first_panic = FIRST_PANIC.get().cloned();
    Ok(report)
}
