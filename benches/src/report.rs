//! Results: histograms reduced to numbers, the Markdown tables, the JSON file and the check
//! that every scenario produced numbers for every implementation that supports it.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::impls::Impl;

/// Contenders of the hot-key scenario (separate clients; the shared-client variant runs as
/// many tasks of one client). The report looks its rows up by this count.
pub(crate) const CONTENDERS: usize = 8;
/// Contenders of the hot-key scenario's second variant with a client each: two processes
/// taking turns on a lock (two replicas of a scheduler, say).
pub(crate) const PAIR: usize = 2;

/// A latency histogram in nanoseconds, 1 ns .. 120 s, 3 significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("valid histogram bounds")
}

pub(crate) fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1));
}

/// Percentiles of one series, in microseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Latency {
    pub(crate) samples: u64,
    pub(crate) errors: u64,
    /// Operations the harness gave up on (its own bound, not the implementation's).
    pub(crate) timeouts: u64,
    pub(crate) p50_us: f64,
    pub(crate) p90_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) max_us: f64,
}

impl Latency {
    pub(crate) fn from_hist(h: &Histogram<u64>, errors: u64, timeouts: u64) -> Self {
        let us = |q: f64| h.value_at_quantile(q) as f64 / 1_000.0;
        Latency {
            samples: h.len(),
            errors,
            timeouts,
            p50_us: us(0.5),
            p90_us: us(0.9),
            p99_us: us(0.99),
            p999_us: us(0.999),
            max_us: h.max() as f64 / 1_000.0,
        }
    }
}

/// `None` = the implementation lacks the feature ("n/a").
pub(crate) type Cell<T> = Option<T>;

#[derive(Debug, Clone, Serialize)]
pub(crate) struct LatencyRow {
    pub(crate) n: usize,
    pub(crate) implementation: Impl,
    pub(crate) cycle: Latency,
    /// The p50 of each block of samples, in the order measured (the blocks take turns
    /// between the implementations).
    pub(crate) block_p50_us: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ThroughputRow {
    pub(crate) n: usize,
    pub(crate) concurrency: usize,
    pub(crate) implementation: Impl,
    pub(crate) ops_per_sec: f64,
    /// The rate in each window, in the order measured (the scenario's windows take turns
    /// between the implementations).
    pub(crate) window_ops_per_sec: Vec<f64>,
    pub(crate) errors: u64,
    /// Server CPU (every node) per acquire + release.
    pub(crate) server_cpu_us_per_op: f64,
    /// This process's CPU per acquire + release.
    pub(crate) client_cpu_us_per_op: f64,
    /// Commands the nodes ran per acquire + release (`INFO commandstats` calls, including the
    /// commands run inside scripts).
    pub(crate) commands_per_op: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct HotKeyResult {
    pub(crate) handoffs_per_sec: f64,
    pub(crate) wait: Latency,
    /// Acquisitions of the contender that got the fewest (starvation shows as 0).
    pub(crate) min_per_contender: u64,
    /// Waits still unfinished 1 s after the window closed: cut off and counted in `wait` at
    /// the time waited so far (a lower bound).
    pub(crate) censored_waits: u64,
    /// Jain's fairness index over the contenders' wins: 1 = even, 1/8 = one took all.
    pub(crate) jain: f64,
    /// Longest run of consecutive wins by one contender (barging shows as long runs).
    pub(crate) longest_streak: u64,
    pub(crate) wins_per_contender: Vec<u64>,
    /// This crate only (`metrics` facade): `redlock_split_votes_total` over the run.
    pub(crate) split_votes: Option<u64>,
    /// This crate only: `redlock_staggers_total` over the run.
    pub(crate) staggers: Option<u64>,
    /// This crate only: `acquire` calls finished over the run (`redlock_acquire_attempts` count).
    pub(crate) acquire_calls: Option<u64>,
    /// This crate only: attempts those calls made (`redlock_acquire_attempts` sum).
    pub(crate) acquire_attempts: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct HotKeyRow {
    pub(crate) n: usize,
    pub(crate) implementation: Impl,
    /// Contenders on the key: [`CONTENDERS`], or [`PAIR`] (two processes taking turns).
    pub(crate) contenders: usize,
    /// Clients the contenders used: one each, or 1 (shared).
    pub(crate) clients: usize,
    pub(crate) result: Cell<HotKeyResult>,
}

/// The hot key under one fault (a fresh proxied cluster per row; see
/// `scenarios::hot_key_under`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HotFaultRow {
    pub(crate) n: usize,
    /// One of `scenarios::HOT_FAULTS`.
    pub(crate) fault: String,
    pub(crate) implementation: Impl,
    /// Contenders, a client each; contender 0 is the far client in the "far client" row.
    pub(crate) contenders: usize,
    pub(crate) result: Cell<HotKeyResult>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct HeldResult {
    pub(crate) held: usize,
    pub(crate) acquire_secs: f64,
    /// Client CPU (user + system, getrusage) during the hold window, in cores.
    pub(crate) cpu_cores: f64,
    /// Script calls (`EVALSHA`/`EVAL`) each node received per second during the hold window:
    /// the renewal round trips (both renew with a script).
    pub(crate) node_round_trips_per_sec: f64,
    /// Commands each node executed per second, including those run inside scripts.
    pub(crate) node_cmds_per_sec: f64,
    /// Resident memory growth (`VmRSS`, /proc/self/status) from before the first acquire to
    /// the end of the hold window, per held lock, in bytes.
    pub(crate) rss_bytes_per_lock: f64,
    /// The whole row: connect, acquire all, hold window, release all.
    pub(crate) total_secs: f64,
    /// Locks whose holder saw them lost (or that could not be re-checked) at the end.
    pub(crate) lost: u64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct HeldRow {
    pub(crate) n: usize,
    pub(crate) locks: usize,
    pub(crate) ttl_secs: f64,
    pub(crate) hold_secs: f64,
    pub(crate) implementation: Impl,
    pub(crate) result: Cell<HeldResult>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct FaultRow {
    pub(crate) n: usize,
    /// `healthy`, `slow`, `hung`, `dead`, `majority hung`, `majority dead`.
    pub(crate) fault: String,
    pub(crate) implementation: Impl,
    /// Every finished operation (success or error) counts; `errors` says how many failed.
    pub(crate) cycle: Latency,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Meta {
    pub(crate) mode: String,
    pub(crate) started_unix: u64,
    pub(crate) wall_secs: f64,
    pub(crate) cores: usize,
    pub(crate) nodes: Vec<usize>,
    pub(crate) user_nodes: bool,
    pub(crate) hold_secs: f64,
    pub(crate) command: String,
    /// Wall time of each scenario group that ran, in seconds.
    pub(crate) phase_secs: Vec<(String, f64)>,
    /// Panics inside spawned tasks during the run (tokio catches them; peers' background
    /// tasks are the only ones expected), with the first message.
    pub(crate) task_panics: u64,
    pub(crate) first_panic: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) meta: Meta,
    pub(crate) latency: Vec<LatencyRow>,
    pub(crate) throughput: Vec<ThroughputRow>,
    pub(crate) hot_key: Vec<HotKeyRow>,
    pub(crate) held: Vec<HeldRow>,
    pub(crate) faults: Vec<FaultRow>,
    pub(crate) hot_faults: Vec<HotFaultRow>,
    /// Scenarios that did not run at all, with why (e.g. faults against `--nodes`).
    pub(crate) skipped: Vec<String>,
}

fn us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1_000.0)
    } else {
        format!("{v:.0} µs")
    }
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.2}×", a / b)
    } else {
        "–".to_owned()
    }
}

/// `a[i] / b[i]` for every pair with `b[i] > 0`.
fn pair_ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(_, y)| **y > 0.0)
        .map(|(x, y)| x / y)
        .collect()
}

/// "; 6 windows 0.93–1.05×, median 0.99×" (`what` = "windows") for a target line, or
/// nothing for fewer than two ratios.
fn spread(mut ratios: Vec<f64>, what: &str) -> String {
    if ratios.len() < 2 {
        return String::new();
    }
    ratios.sort_by(f64::total_cmp);
    let mid = ratios.len() / 2;
    let median = if ratios.len().is_multiple_of(2) {
        (ratios[mid - 1] + ratios[mid]) / 2.0
    } else {
        ratios[mid]
    };
    format!(
        "; {} {what} {:.2}–{:.2}×, median {median:.2}×",
        ratios.len(),
        ratios[0],
        ratios[ratios.len() - 1]
    )
}

impl Report {
    fn latency_of(&self, n: usize, which: Impl) -> Option<&Latency> {
        self.latency
            .iter()
            .find(|r| r.n == n && r.implementation == which)
            .map(|r| &r.cycle)
    }

    fn fault_of(&self, n: usize, fault: &str, which: Impl) -> Option<&Latency> {
        self.faults
            .iter()
            .find(|r| r.n == n && r.fault == fault && r.implementation == which)
            .map(|r| &r.cycle)
    }

    fn tput_of(&self, n: usize, c: usize, which: Impl) -> Option<f64> {
        self.throughput
            .iter()
            .find(|r| r.n == n && r.concurrency == c && r.implementation == which)
            .map(|r| r.ops_per_sec)
    }

    /// Window by window, `a`'s rate over `b`'s (windows of one turn are measured next to
    /// each other).
    fn window_ratios(&self, n: usize, c: usize, a: Impl, b: Impl) -> Vec<f64> {
        let windows = |which: Impl| {
            self.throughput
                .iter()
                .find(|r| r.n == n && r.concurrency == c && r.implementation == which)
                .map_or(&[][..], |r| &r.window_ops_per_sec)
        };
        pair_ratios(windows(a), windows(b))
    }

    /// Block by block, `a`'s uncontended p50 over `b`'s (blocks of one turn are measured
    /// next to each other).
    fn block_p50_ratios(&self, n: usize, a: Impl, b: Impl) -> Vec<f64> {
        let blocks = |which: Impl| {
            self.latency
                .iter()
                .find(|r| r.n == n && r.implementation == which)
                .map_or(&[][..], |r| &r.block_p50_us)
        };
        pair_ratios(blocks(a), blocks(b))
    }

    fn hot_of(&self, n: usize, which: Impl, clients: usize) -> Option<&HotKeyResult> {
        self.hot_key
            .iter()
            .find(|r| r.n == n && r.implementation == which && r.clients == clients)
            .and_then(|r| r.result.as_ref())
    }

    fn hot_fault_of(&self, n: usize, fault: &str, which: Impl) -> Option<&HotKeyResult> {
        self.hot_faults
            .iter()
            .find(|r| r.n == n && r.fault == fault && r.implementation == which)
            .and_then(|r| r.result.as_ref())
    }

    /// This implementation's row at the largest held-locks size measured.
    fn held_largest(&self, which: Impl) -> Option<(usize, &HeldResult)> {
        self.held
            .iter()
            .filter(|r| r.implementation == which)
            .max_by_key(|r| r.locks)
            .and_then(|r| Some((r.locks, r.result.as_ref()?)))
    }

    /// One table for N = 5: the figure of each scenario per implementation, blank where an
    /// implementation lacks the feature or the scenario did not run.
    fn headline(&self) -> String {
        const N: usize = 5;
        let cols = [
            Impl::Redlock,
            Impl::Floor,
            Impl::Rslock,
            Impl::RedlockRs,
            Impl::RedisLock,
            Impl::DistLock,
        ];
        let fault_cell = |l: &Latency, v: f64| {
            let mut c = us(v);
            if l.errors > 0 {
                let _ = write!(c, " ({}/{} err)", l.errors, l.samples);
            }
            if l.timeouts > 0 {
                let _ = write!(c, " ({} harness t/o)", l.timeouts);
            }
            c
        };
        let largest = cols
            .iter()
            .filter_map(|w| self.held_largest(*w).map(|(n, _)| n))
            .max();
        type CellFn<'a> = Box<dyn Fn(Impl) -> Option<String> + 'a>;
        let rows: Vec<(String, CellFn<'_>)> = vec![
            (
                "uncontended acquire + release, p50".to_owned(),
                Box::new(|w| Some(us(self.latency_of(N, w)?.p50_us))),
            ),
            (
                "uncontended acquire + release, p99".to_owned(),
                Box::new(|w| Some(us(self.latency_of(N, w)?.p99_us))),
            ),
            (
                "throughput, 64 tasks, distinct keys (ops/s)".to_owned(),
                Box::new(|w| Some(format!("{:.0}", self.tput_of(N, 64, w)?))),
            ),
            (
                "hot key, 8 clients: hand-offs/s".to_owned(),
                Box::new(|w| {
                    Some(format!(
                        "{:.0}",
                        self.hot_of(N, w, CONTENDERS)?.handoffs_per_sec
                    ))
                }),
            ),
            (
                "hot key, 8 clients: wait p99".to_owned(),
                Box::new(|w| Some(us(self.hot_of(N, w, CONTENDERS)?.wait.p99_us))),
            ),
            (
                "hot key, 2 clients: hand-offs/s".to_owned(),
                Box::new(|w| Some(format!("{:.0}", self.hot_of(N, w, PAIR)?.handoffs_per_sec))),
            ),
            (
                format!(
                    "held locks: client CPU (cores), {} locks",
                    largest.map_or("–".to_owned(), |n| n.to_string())
                ),
                Box::new(|w| {
                    let (locks, h) = self.held_largest(w)?;
                    (Some(locks) == largest).then(|| format!("{:.3}", h.cpu_cores))
                }),
            ),
            (
                "one hung node: p99 of one attempt + release".to_owned(),
                Box::new(|w| {
                    let l = self.fault_of(N, "hung", w)?;
                    Some(fault_cell(l, l.p99_us))
                }),
            ),
            (
                "majority hung: time to error (max)".to_owned(),
                Box::new(|w| {
                    let l = self.fault_of(N, "majority hung", w)?;
                    Some(fault_cell(l, l.max_us))
                }),
            ),
            (
                "majority dead: time to error (max)".to_owned(),
                Box::new(|w| {
                    let l = self.fault_of(N, "majority dead", w)?;
                    Some(fault_cell(l, l.max_us))
                }),
            ),
        ];
        let mut md = format!("### Headline, N = {N}\n\n| measure |");
        for w in cols {
            let _ = write!(md, " {} |", w.name());
        }
        md.push_str("\n|---|");
        md.push_str(&"---:|".repeat(cols.len()));
        md.push('\n');
        for (label, cell) in &rows {
            let _ = write!(md, "| {label} |");
            for w in cols {
                let _ = write!(md, " {} |", cell(w).unwrap_or_default());
            }
            md.push('\n');
        }
        md
    }

    /// All tables, as Markdown.
    pub(crate) fn markdown(&self) -> String {
        let mut md = String::new();
        let m = &self.meta;
        let _ = writeln!(
            md,
            "## redlock-bench ({} mode, {} cores, N ∈ {:?}, {:.0} s)\n",
            m.mode, m.cores, m.nodes, m.wall_secs
        );
        md.push_str(&self.headline());
        if !m.phase_secs.is_empty() {
            let phases: Vec<String> = m
                .phase_secs
                .iter()
                .map(|(p, s)| format!("{p} {s:.0} s"))
                .collect();
            let _ = writeln!(md, "\nScenario wall times: {}.\n", phases.join(", "));
        }
        if m.task_panics > 0 {
            let _ = writeln!(
                md,
                "\n**{} panics in spawned tasks during the run** (first: {}).\n",
                m.task_panics,
                m.first_panic.as_deref().unwrap_or("?")
            );
        }
        md.push_str(&self.targets());
        md.push('\n');

        let _ = writeln!(
            md,
            "### Uncontended acquire + release (sequential, one client)\n\n\
             | N | impl | samples | errors | p50 | p90 | p99 | p99.9 | max | p50 / floor |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in &self.latency {
            let floor = self.latency_of(r.n, Impl::Floor).map_or(0.0, |l| l.p50_us);
            let l = &r.cycle;
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.n,
                r.implementation.name(),
                l.samples,
                l.errors,
                us(l.p50_us),
                us(l.p90_us),
                us(l.p99_us),
                us(l.p999_us),
                us(l.max_us),
                ratio(l.p50_us, floor)
            );
        }

        let _ = writeln!(
            md,
            "\n### Throughput on distinct keys (acquire + release per op)\n\n\
             Server CPU = `used_cpu_user` + `used_cpu_sys` of every node; client CPU = this \
             process; commands = `INFO commandstats` calls on every node (script calls and the \
             commands inside them) — all per acquire + release.\n\n\
             | N | tasks | impl | ops/s | errors | / floor | server CPU µs/op | client CPU µs/op | commands/op |\n\
             |---:|---:|---|---:|---:|---:|---:|---:|---:|"
        );
        for r in &self.throughput {
            let floor = self.tput_of(r.n, r.concurrency, Impl::Floor).unwrap_or(0.0);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {} | {} | {:.1} | {:.1} | {:.1} |",
                r.n,
                r.concurrency,
                r.implementation.name(),
                r.ops_per_sec,
                r.errors,
                ratio(r.ops_per_sec, floor),
                r.server_cpu_us_per_op,
                r.client_cpu_us_per_op,
                r.commands_per_op
            );
        }

        let _ = writeln!(
            md,
            "\n### Hot key: 8 contenders (a client each, or one shared client), and 2 contenders with a client each; 1 ms hold\n\n\
             Split votes, staggers and attempts: this crate only (`redlock_split_votes_total`, \
             `redlock_staggers_total`, `redlock_acquire_attempts` through the `metrics` facade).\n\n\
             Cut-off waits: still waiting 1 s after the window closed; counted in the wait \
             percentiles at the time waited so far (a lower bound).\n\n\
             | N | impl | contenders | clients | hand-offs/s | wait p50 | wait p99 | wait max | cut-off waits | fewest wins of one contender | Jain | longest streak | split votes | staggers / acquire | attempts / acquire | errors |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in &self.hot_key {
            match &r.result {
                Some(h) => {
                    let opt = |v: Option<u64>| v.map_or("–".to_owned(), |v| v.to_string());
                    let per_acquire = |n: Option<u64>| match (n, h.acquire_calls) {
                        (Some(a), Some(c)) if c > 0 => format!("{:.2}", a as f64 / c as f64),
                        _ => "–".to_owned(),
                    };
                    let _ = writeln!(
                        md,
                        "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {:.3} | {} | {} | {} | {} | {} |",
                        r.n,
                        r.implementation.name(),
                        r.contenders,
                        r.clients,
                        h.handoffs_per_sec,
                        us(h.wait.p50_us),
                        us(h.wait.p99_us),
                        us(h.wait.max_us),
                        h.censored_waits,
                        h.min_per_contender,
                        h.jain,
                        h.longest_streak,
                        opt(h.split_votes),
                        per_acquire(h.staggers),
                        per_acquire(h.acquire_attempts),
                        h.wait.errors
                    );
                }
                None => {
                    let _ = writeln!(
                        md,
                        "| {} | {} | {} | {} | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |",
                        r.n,
                        r.implementation.name(),
                        r.contenders,
                        r.clients
                    );
                }
            }
        }

        let _ = writeln!(
            md,
            "\n### Many held locks, auto-renewed by one client\n\n\
             Memory: growth of `VmRSS` (/proc/self/status) from before the first acquire to the \
             end of the hold window, per held lock. CPU: user + system (getrusage) over the \
             hold window, in cores.\n\n\
             | N | locks | TTL | hold | impl | held | acquire all | client CPU (cores) | RSS per lock | renewal round trips/s per node | commands/s per node (incl. in scripts) | lost | row time |\n\
             |---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in &self.held {
            match &r.result {
                Some(h) => {
                    let _ = writeln!(
                        md,
                        "| {} | {} | {:.0} s | {:.0} s | {} | {} | {:.2} s | {:.3} | {:.0} B | {:.1} | {:.0} | {} | {:.0} s |",
                        r.n,
                        r.locks,
                        r.ttl_secs,
                        r.hold_secs,
                        r.implementation.name(),
                        h.held,
                        h.acquire_secs,
                        h.cpu_cores,
                        h.rss_bytes_per_lock,
                        h.node_round_trips_per_sec,
                        h.node_cmds_per_sec,
                        h.lost,
                        h.total_secs
                    );
                }
                None => {
                    let _ = writeln!(
                        md,
                        "| {} | {} | {:.0} s | {:.0} s | {} | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |",
                        r.n,
                        r.locks,
                        r.ttl_secs,
                        r.hold_secs,
                        r.implementation.name()
                    );
                }
            }
        }

        let _ = writeln!(
            md,
            "\n### Faults (proxied nodes; one acquire attempt + release per op, sequential)\n\n\
             | N | fault | impl | ops | errors | harness timeouts | p50 | p99 | max | p99 / healthy p99 |\n\
             |---:|---|---|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in &self.faults {
            let healthy = self
                .fault_of(r.n, "healthy", r.implementation)
                .map_or(0.0, |l| l.p99_us);
            let l = &r.cycle;
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.n,
                r.fault,
                r.implementation.name(),
                l.samples,
                l.errors,
                l.timeouts,
                us(l.p50_us),
                us(l.p99_us),
                us(l.max_us),
                ratio(l.p99_us, healthy)
            );
        }
        if !self.hot_faults.is_empty() {
            self.hot_faults_table(&mut md);
        }
        if !self.skipped.is_empty() {
            let _ = writeln!(md, "\nSkipped: {}", self.skipped.join("; "));
        }
        md
    }

    /// The hot key under faults: one row per fault and implementation.
    fn hot_faults_table(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "\n### Hot key under faults ({CONTENDERS} contenders, a client each; 1 ms hold; proxied nodes)\n\n\
             A fresh proxied cluster per row; the fault comes after the clients connected, 0.2 s \
             before they contend. dead node: killed; slow node: 2 ms more each way; both on the \
             node this crate's racing attempts ask first for the key (for the others, one node \
             like any other). far client: contender 0 reaches every node through proxies of its \
             own, 1 ms more each way. Wins as a multiple of a fair share (1/{CONTENDERS} of all).\n\n\
             | N | fault | impl | hand-offs/s | / healthy | wait p50 | wait p99 | wait max | cut-off waits | fewest wins | contender 0's wins | Jain | split votes | errors |\n\
             |---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in &self.hot_faults {
            let Some(h) = &r.result else {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |",
                    r.n,
                    r.fault,
                    r.implementation.name()
                );
                continue;
            };
            let healthy = self
                .hot_fault_of(r.n, "healthy", r.implementation)
                .map_or(0.0, |h| h.handoffs_per_sec);
            let wins: u64 = h.wins_per_contender.iter().sum();
            let fair = wins as f64 / r.contenders.max(1) as f64;
            let share = |w: u64| {
                if fair > 0.0 {
                    format!("{w} ({:.2}×)", w as f64 / fair)
                } else {
                    w.to_string()
                }
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {} | {} |",
                r.n,
                r.fault,
                r.implementation.name(),
                h.handoffs_per_sec,
                ratio(h.handoffs_per_sec, healthy),
                us(h.wait.p50_us),
                us(h.wait.p99_us),
                us(h.wait.max_us),
                h.censored_waits,
                share(h.min_per_contender),
                share(h.wins_per_contender.first().copied().unwrap_or(0)),
                h.jain,
                h.split_votes.map_or("–".to_owned(), |v| v.to_string()),
                h.wait.errors
            );
        }
    }

    /// The targets, met or missed, with numbers (ratios within this run).
    pub(crate) fn targets(&self) -> String {
        let mut md = String::from(
            "### Targets (ratios within this run)\n\n| target | measured | goal | verdict |\n|---|---:|---:|---|\n",
        );
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        for &n in &self.meta.nodes {
            if let (Some(a), Some(f)) = (
                self.tput_of(n, 64, Impl::Redlock),
                self.tput_of(n, 64, Impl::Floor),
            ) {
                let r = a / f;
                let spread = spread(
                    self.window_ratios(n, 64, Impl::Redlock, Impl::Floor),
                    "windows",
                );
                let _ = writeln!(
                    md,
                    "| throughput, 64 tasks, / floor, N = {n} ({a:.0} vs {f:.0} ops/s{spread}) | {r:.2}× | ≥ 1.0× | {} |",
                    verdict(r >= 1.0)
                );
            }
            if let (Some(a), Some(b)) = (
                self.tput_of(n, 64, Impl::Redlock),
                self.tput_of(n, 64, Impl::Rslock),
            ) {
                let r = a / b;
                let spread = spread(
                    self.window_ratios(n, 64, Impl::Redlock, Impl::Rslock),
                    "windows",
                );
                let _ = writeln!(
                    md,
                    "| throughput, 64 tasks, / rslock, N = {n} ({a:.0} vs {b:.0} ops/s{spread}) | {r:.2}× | ≥ 1.3× | {} |",
                    verdict(r >= 1.3)
                );
            }
        }
        for &n in &self.meta.nodes {
            if let (Some(a), Some(f)) = (
                self.latency_of(n, Impl::Redlock),
                self.latency_of(n, Impl::Floor),
            ) {
                let r = a.p50_us / f.p50_us;
                let _ = writeln!(
                    md,
                    "| uncontended p50 / floor, N = {n} ({} vs {}{}) | {r:.2}× | ≤ 1.05× | {} |",
                    us(a.p50_us),
                    us(f.p50_us),
                    spread(
                        self.block_p50_ratios(n, Impl::Redlock, Impl::Floor),
                        "blocks' p50s"
                    ),
                    verdict(r <= 1.05)
                );
                let r = a.p99_us / f.p99_us;
                let _ = writeln!(
                    md,
                    "| uncontended p99 / floor, N = {n} ({} vs {}) | {r:.2}× | ≤ 1.2× | {} |",
                    us(a.p99_us),
                    us(f.p99_us),
                    verdict(r <= 1.2)
                );
            }
        }
        let hot_ns: std::collections::BTreeSet<usize> = self.hot_key.iter().map(|r| r.n).collect();
        for n in hot_ns.into_iter().filter(|n| *n == 5) {
            let ours = self.hot_of(n, Impl::Redlock, CONTENDERS);
            if let (Some(a), Some(b)) = (ours, self.hot_of(n, Impl::Rslock, CONTENDERS)) {
                let r = a.handoffs_per_sec / b.handoffs_per_sec;
                let _ = writeln!(
                    md,
                    "| hot key N = {n}, 8 clients: hand-offs/s / rslock ({:.0} vs {:.0}) | {r:.2}× | ≥ 1.3× | {} |",
                    a.handoffs_per_sec,
                    b.handoffs_per_sec,
                    verdict(r >= 1.3)
                );
                let r = a.wait.p99_us / b.wait.p99_us;
                let _ = writeln!(
                    md,
                    "| hot key N = {n}, 8 clients: wait p99 / rslock ({} vs {}) | {r:.2}× | ≤ 0.25× | {} |",
                    us(a.wait.p99_us),
                    us(b.wait.p99_us),
                    verdict(r <= 0.25)
                );
            }
            for (clients, label) in [(CONTENDERS, "8 clients"), (1, "1 shared client")] {
                if let Some(a) = self.hot_of(n, Impl::Redlock, clients) {
                    let _ = writeln!(
                        md,
                        "| hot key N = {n}, {label}: Jain's fairness index | {:.3} | ≥ 0.95 | {} |",
                        a.jain,
                        verdict(a.jain >= 0.95)
                    );
                }
            }
        }
        if let Some((locks, h)) = self.held_largest(Impl::Redlock) {
            let _ = writeln!(
                md,
                "| {locks} held locks: client CPU | {:.3} cores | < 1 core (at 100000) | {} |",
                h.cpu_cores,
                verdict(h.cpu_cores < 1.0)
            );
        }
        let fault_ns: std::collections::BTreeSet<usize> = self.faults.iter().map(|r| r.n).collect();
        for &n in &fault_ns {
            if let (Some(h), Some(ok)) = (
                self.fault_of(n, "hung", Impl::Redlock),
                self.fault_of(n, "healthy", Impl::Redlock),
            ) {
                let r = h.p99_us / ok.p99_us;
                let _ = writeln!(
                    md,
                    "| one hung node: p99 / healthy p99, N = {n} ({} vs {}) | {r:.2}× | ≤ 3× | {} |",
                    us(h.p99_us),
                    us(ok.p99_us),
                    verdict(r <= 3.0)
                );
            }
        }
        let budget_us =
            (redlock::DEFAULT_NODE_TIMEOUT + Duration::from_millis(10)).as_micros() as f64;
        for r in self
            .faults
            .iter()
            .filter(|r| r.implementation == Impl::Redlock && r.fault.starts_with("majority"))
        {
            let ok = r.cycle.max_us <= budget_us && r.cycle.errors == r.cycle.samples;
            let _ = writeln!(
                md,
                "| {}, N = {}: time to a definite error (max; {}/{} errors) | {} | ≤ {} | {} |",
                r.fault,
                r.n,
                r.cycle.errors,
                r.cycle.samples,
                us(r.cycle.max_us),
                us(budget_us),
                verdict(ok)
            );
        }
        md
    }

    /// Every scenario has numbers for every implementation that supports it.
    pub(crate) fn check(&self) -> Vec<String> {
        let mut missing = Vec::new();
        let mut want = |ok: bool, what: String| {
            if !ok {
                missing.push(what);
            }
        };
        for n in &self.meta.nodes {
            for w in Impl::ALL {
                want(
                    self.latency_of(*n, w).is_some_and(|l| l.samples > 0),
                    format!("uncontended N={n} {}", w.name()),
                );
            }
        }
        let concurrencies: std::collections::BTreeSet<usize> =
            self.throughput.iter().map(|r| r.concurrency).collect();
        for n in &self.meta.nodes {
            for c in &concurrencies {
                for w in Impl::ALL {
                    want(
                        self.tput_of(*n, *c, w).is_some_and(|v| v > 0.0),
                        format!("throughput N={n} c={c} {}", w.name()),
                    );
                }
            }
        }
        want(!self.hot_key.is_empty(), "hot key: no rows".to_owned());
        for r in &self.hot_key {
            want(
                r.implementation.waits()
                    == r.result.as_ref().is_some_and(|h| h.handoffs_per_sec > 0.0),
                format!("hot key N={} {}", r.n, r.implementation.name()),
            );
        }
        want(!self.held.is_empty(), "many held locks: no rows".to_owned());
        for r in &self.held {
            want(
                r.implementation.renews()
                    == r.result.as_ref().is_some_and(|h| h.acquire_secs > 0.0),
                format!("held {} N={} {}", r.locks, r.n, r.implementation.name()),
            );
        }
        if !self.meta.user_nodes {
            want(!self.faults.is_empty(), "faults: no rows".to_owned());
            let faults: std::collections::BTreeSet<(usize, &str)> = self
                .faults
                .iter()
                .map(|r| (r.n, r.fault.as_str()))
                .collect();
            for (n, fault) in faults {
                for w in Impl::in_every_scenario() {
                    want(
                        self.fault_of(n, fault, w)
                            .is_some_and(|l| l.samples + l.timeouts > 0),
                        format!("fault {fault} N={n} {}", w.name()),
                    );
                }
            }
        }
        for r in &self.hot_faults {
            want(
                r.implementation.waits() == r.result.is_some(),
                format!(
                    "hot key under faults N={} {} {}",
                    r.n,
                    r.fault,
                    r.implementation.name()
                ),
            );
        }
        missing
    }
}

#[cfg(test)]
mod tests {
    use super::{pair_ratios, spread};

    #[test]
    fn ratios_pair_up_in_order_and_skip_a_zero_denominator() {
        assert_eq!(
            pair_ratios(&[10.0, 30.0, 5.0], &[20.0, 0.0, 5.0, 7.0]),
            [0.5, 1.0]
        );
    }

    #[test]
    fn spread_names_the_range_and_the_median() {
        assert_eq!(
            spread(vec![1.2, 0.8, 1.0, 0.9], "windows"),
            "; 4 windows 0.80–1.20×, median 0.95×"
        );
        assert_eq!(
            spread(vec![1.5, 0.5, 1.0], "blocks"),
            "; 3 blocks 0.50–1.50×, median 1.00×"
        );
        assert_eq!(spread(vec![1.0], "windows"), "");
    }
}
