//! Uncontended acquire + release: this crate (`redlock/N`) against a raw-protocol floor
//! (`floor/N`) for N ∈ {1, 3, 5, 7}, all against the same spawned redis-server processes.
//!
//! After the criterion group, a custom section measures what criterion cannot express:
//! latency percentiles at N = 5 with all nodes healthy and with one node
//! paused (`SIGSTOP`), and the throughput of 64 concurrent tasks. It prints a Markdown table
//! and writes it to `<target>/criterion/acquire_release_summary.md`.
//!
//! The floor is the least work the protocol allows: `SET key token NX PX ttl` to all N nodes
//! in parallel, a quorum of `OK`, then an owner-checked `EVALSHA` delete on all N, awaiting
//! every node. It has no per-node timeout (so a hung node stalls it) except in the paused
//! scenario, where a 1 s per-call bound stands in for the response timeout peers use.
//!
//! `REDLOCK_BENCH_QUICK=1` shrinks every phase so a run takes about a minute.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use futures_util::future::join_all;
use hdrhistogram::Histogram;
use redlock::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;
use redlock_testkit::redis::{
    self, AsyncConnectionConfig, Client, IntoConnectionInfo, aio::MultiplexedConnection,
};
use tokio::runtime::Runtime;

/// Node counts of the criterion benchmarks; the cluster has as many nodes as the largest.
const SIZES: [usize; 4] = [1, 3, 5, 7];
/// Node count of the custom section.
const N_SUMMARY: usize = 5;
/// Lock TTL for both implementations; long enough that nothing expires mid-measurement.
const TTL: Duration = Duration::from_secs(10);
/// Keys rotate over this many names per implementation and N ("fresh-ish" keys).
const KEY_ROTATION: usize = 1024;
/// The floor's per-call bound in the paused scenario: peers' typical response timeout.
const FLOOR_PAUSED_TIMEOUT: Duration = Duration::from_secs(1);
/// Concurrent tasks of the throughput phase.
const TASKS: usize = 64;
/// The floor's owner-checked delete.
const FLOOR_RELEASE: &str =
    "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) else return 0 end";

/// Sizes of every phase; `REDLOCK_BENCH_QUICK=1` picks the small set.
#[derive(Debug, Clone, Copy)]
struct Plan {
    quick: bool,
    warm_up: Duration,
    measurement: Duration,
    sample_size: usize,
    /// Sequential samples per implementation, healthy N = 5.
    healthy_samples: usize,
    /// Samples per block; blocks alternate between the implementations.
    block: usize,
    /// Sequential samples of this crate with a node paused.
    paused_samples: usize,
    /// Sequential samples of the floor with a node paused (each costs ~2 s).
    floor_paused_samples: usize,
    /// Wall time of one throughput round per implementation.
    round: Duration,
    /// Throughput rounds; each runs both implementations, in alternating order.
    rounds: usize,
}

impl Plan {
    fn from_env() -> Self {
        let quick = std::env::var("REDLOCK_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        if quick {
            Plan {
                quick,
                warm_up: Duration::from_millis(300),
                measurement: Duration::from_secs(1),
                sample_size: 20,
                healthy_samples: 2_000,
                block: 200,
                paused_samples: 500,
                floor_paused_samples: 4,
                round: Duration::from_secs(1),
                rounds: 1,
            }
        } else {
            Plan {
                quick,
                warm_up: Duration::from_secs(2),
                measurement: Duration::from_secs(5),
                sample_size: 100,
                healthy_samples: 10_000,
                block: 250,
                paused_samples: 3_000,
                floor_paused_samples: 20,
                round: Duration::from_secs(3),
                rounds: 2,
            }
        }
    }
}

type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// The crate's *first* acquire script (GET/SET loop plus a GET/SET stamp), kept as a fixed
/// reference for the `REDLOCK_BENCH_DIAG` floor variant that isolates what a stamped script
/// costs compared with `SET NX PX`. The crate now runs a slimmer version (`src/scripts.rs`:
/// `SET NX PX` for one resource, `SET … GET` for the stamp, plus the quarantine check), so this
/// variant overstates today's script cost somewhat.
const CRATE_ACQUIRE: &str = r"
local token = ARGV[1]
for i = 2, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v and v ~= token then return 0 end
end
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], token, 'PX', ARGV[2])
end
local t = redis.call('TIME')
local stamp = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if stamp <= last then stamp = last + 1 end
redis.call('SET', KEYS[1], string.format('%.0f', stamp))
return stamp
";

/// The raw-protocol floor over pre-opened multiplexed connections.
///
/// The knobs other than `call_timeout` exist only for the `REDLOCK_BENCH_DIAG` breakdown;
/// the floor proper uses `SET NX PX`, awaits in place and has no timeout.
#[derive(Debug, Clone)]
struct Floor {
    conns: Vec<MultiplexedConnection>,
    release_sha: String,
    ttl_ms: u64,
    quorum: usize,
    /// Per-call bound; `None` awaits every node however long it takes.
    call_timeout: Option<Duration>,
    /// Acquire with the crate's script (SHA) instead of `SET NX PX`.
    acquire_script: Option<String>,
    /// Run each phase's fan-out in a spawned task, as the crate's engine does.
    spawn: bool,
}

impl Floor {
    async fn connect(urls: &[String]) -> Result<Self, BenchError> {
        let config = AsyncConnectionConfig::new().set_response_timeout(None);
        let mut conns = Vec::with_capacity(urls.len());
        for url in urls {
            let info = url
                .as_str()
                .into_connection_info()?
                .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
            let mut conn = Client::open(info)?
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            let _: Vec<String> = redis::pipe()
                .cmd("SCRIPT")
                .arg("LOAD")
                .arg(FLOOR_RELEASE)
                .cmd("SCRIPT")
                .arg("LOAD")
                .arg(CRATE_ACQUIRE)
                .query_async(&mut conn)
                .await?;
            conns.push(conn);
        }
        Ok(Floor {
            conns,
            release_sha: redis::Script::new(FLOOR_RELEASE).get_hash().to_owned(),
            ttl_ms: u64::try_from(TTL.as_millis())?,
            quorum: urls.len() / 2 + 1,
            call_timeout: None,
            acquire_script: None,
            spawn: false,
        })
    }

    /// A copy with some knobs changed.
    fn with(&self, change: impl FnOnce(&mut Floor)) -> Arc<Floor> {
        let mut f = self.clone();
        change(&mut f);
        Arc::new(f)
    }

    async fn call<T: redis::FromRedisValue>(
        &self,
        conn: &MultiplexedConnection,
        cmd: redis::Cmd,
    ) -> Option<T> {
        let mut conn = conn.clone();
        let query = async move { cmd.query_async::<T>(&mut conn).await.ok() };
        match self.call_timeout {
            None => query.await,
            Some(t) => tokio::time::timeout(t, query).await.ok().flatten(),
        }
    }

    /// Sends the acquire to every node in parallel; returns how many granted.
    async fn acquire_phase(&self, key: &str, token: &str) -> usize {
        let granted = join_all(self.conns.iter().map(|c| async move {
            match &self.acquire_script {
                None => {
                    let mut cmd = redis::cmd("SET");
                    cmd.arg(key)
                        .arg(token)
                        .arg("NX")
                        .arg("PX")
                        .arg(self.ttl_ms);
                    matches!(self.call::<Option<String>>(c, cmd).await, Some(Some(ok)) if ok == "OK")
                }
                Some(sha) => {
                    let mut cmd = redis::cmd("EVALSHA");
                    cmd.arg(sha)
                        .arg(2)
                        .arg("redlock:stamp")
                        .arg(key)
                        .arg(token)
                        .arg(self.ttl_ms);
                    matches!(self.call::<i64>(c, cmd).await, Some(stamp) if stamp > 0)
                }
            }
        }))
        .await;
        granted.into_iter().filter(|g| *g).count()
    }

    /// Owner-checked delete on every node in parallel, awaiting all of them.
    async fn release_phase(&self, key: &str, token: &str) {
        join_all(self.conns.iter().map(|c| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&self.release_sha).arg(1).arg(key).arg(token);
            self.call::<i64>(c, cmd)
        }))
        .await;
    }

    /// One acquire + release. `Err` when no quorum granted (the release is sent anyway).
    async fn cycle(self: &Arc<Self>, key: &str) -> Result<(), String> {
        let token = random_token();
        let granted = if self.spawn {
            let (me, k, t) = (Arc::clone(self), key.to_owned(), token.clone());
            tokio::spawn(async move { me.acquire_phase(&k, &t).await })
                .await
                .unwrap_or(0)
        } else {
            self.acquire_phase(key, &token).await
        };
        if self.spawn {
            let (me, k, t) = (Arc::clone(self), key.to_owned(), token);
            let _ = tokio::spawn(async move { me.release_phase(&k, &t).await }).await;
        } else {
            self.release_phase(key, &token).await;
        }
        if granted >= self.quorum {
            Ok(())
        } else {
            Err(format!("floor: {granted}/{} granted", self.quorum))
        }
    }
}

/// 16 bytes from the OS CSPRNG, hex-encoded, like the crate's own tokens.
fn random_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("OS random source");
    bytes.iter().fold(String::with_capacity(32), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

async fn redlock_client(urls: &[String], claim_stamps: bool) -> Result<Redlock, BenchError> {
    let rl = Redlock::builder()
        .nodes(urls)
        .ttl(TTL)
        .retry(RetryPolicy::once())
        .claim_stamps(claim_stamps)
        .build()?;
    let failed: Vec<String> = rl
        .connect()
        .await
        .into_iter()
        .filter(|r| !matches!(r.outcome, redlock::NodeOutcome::Granted))
        .map(|r| format!("{}: {:?}", r.node, r.outcome))
        .collect();
    if failed.is_empty() {
        Ok(rl)
    } else {
        Err(format!("redlock connect failed: {failed:?}").into())
    }
}

async fn redlock_cycle(rl: &Redlock, resource: &str) -> Result<(), String> {
    let lock = rl
        .try_acquire(resource)
        .await
        .map_err(|e| format!("redlock acquire: {e}"))?;
    rl.release(lock)
        .await
        .map(drop)
        .map_err(|e| format!("redlock release: {e}"))
}

/// Both implementations over the first `n` nodes of the cluster.
#[derive(Debug)]
struct Pair {
    redlock: Redlock,
    /// The crate with `claim_stamps(false)`: what a lock that is never fenced costs.
    unstamped: Redlock,
    floor: Arc<Floor>,
}

impl Pair {
    async fn new(urls: &[String]) -> Result<Self, BenchError> {
        Ok(Pair {
            redlock: redlock_client(urls, true).await?,
            unstamped: redlock_client(urls, false).await?,
            floor: Arc::new(Floor::connect(urls).await?),
        })
    }
}

/// Which implementation a measurement ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Impl {
    Redlock,
    Unstamped,
    Floor,
}

impl Impl {
    fn name(self) -> &'static str {
        match self {
            Impl::Redlock => "redlock",
            Impl::Unstamped => "redlock-nostamp",
            Impl::Floor => "floor",
        }
    }
}

/// The lock resource of sample `i`; the floor uses the same key layout as the crate.
fn resource(which: Impl, tag: &str, i: usize) -> String {
    format!("bench:{}:{tag}:{}", which.name(), i % KEY_ROTATION)
}

async fn run_cycle(pair: &Pair, which: Impl, resource: &str) -> Result<(), String> {
    match which {
        Impl::Redlock => redlock_cycle(&pair.redlock, resource).await,
        Impl::Unstamped => redlock_cycle(&pair.unstamped, resource).await,
        Impl::Floor => {
            let key = format!("redlock:lock:{resource}");
            pair.floor.cycle(&key).await
        }
    }
}

fn histogram() -> Histogram<u64> {
    // Nanoseconds, 1 ns .. 120 s, 3 significant digits.
    Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("valid histogram bounds")
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1));
}

/// Latency percentiles of one measured series.
#[derive(Debug, Clone)]
struct Series {
    hist: Histogram<u64>,
    errors: usize,
}

impl Series {
    fn new() -> Self {
        Series {
            hist: histogram(),
            errors: 0,
        }
    }

    fn us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1_000.0
    }

    fn p50(&self) -> f64 {
        self.us(0.50)
    }

    fn p99(&self) -> f64 {
        self.us(0.99)
    }
}

/// `samples` sequential cycles of each implementation, alternating in blocks of `block`.
async fn interleaved(
    pair: &Pair,
    tag: &str,
    samples: usize,
    block: usize,
    order: &[Impl],
) -> Vec<Series> {
    let mut out: Vec<Series> = order.iter().map(|_| Series::new()).collect();
    let mut done = 0;
    while done < samples {
        let len = block.min(samples - done);
        for (k, &which) in order.iter().enumerate() {
            for i in done..done + len {
                let r = resource(which, tag, i);
                let t = Instant::now();
                let res = run_cycle(pair, which, &r).await;
                let elapsed = t.elapsed();
                match res {
                    Ok(()) => record(&mut out[k].hist, elapsed),
                    Err(e) => {
                        out[k].errors += 1;
                        if out[k].errors <= 3 {
                            eprintln!("{tag}: {e}");
                        }
                    }
                }
            }
        }
        done += len;
    }
    out
}

/// Completed cycles per second of `TASKS` tasks on distinct keys for `wall`.
async fn throughput(pair: &Pair, which: Impl, round: usize, wall: Duration) -> (f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (stop, ops, errors) = (Arc::clone(&stop), Arc::clone(&ops), Arc::clone(&errors));
            let rl = match which {
                Impl::Unstamped => pair.unstamped.clone(),
                _ => pair.redlock.clone(),
            };
            let floor = Arc::clone(&pair.floor);
            let resource = format!("bench:{}:tput:{round}:{task}", which.name());
            let key = format!("redlock:lock:{resource}");
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let res = match which {
                        Impl::Redlock | Impl::Unstamped => redlock_cycle(&rl, &resource).await,
                        Impl::Floor => floor.cycle(&key).await,
                    };
                    match res {
                        Ok(()) => ops.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    tokio::time::sleep(wall).await;
    stop.store(true, Ordering::Relaxed);
    join_all(tasks).await;
    // Cycles finishing after the stop flag count, and so does their time.
    let secs = started.elapsed().as_secs_f64();
    (
        ops.load(Ordering::Relaxed) as f64 / secs,
        errors.load(Ordering::Relaxed),
    )
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn criterion_config(plan: Plan) -> Criterion {
    Criterion::default()
        .warm_up_time(plan.warm_up)
        .measurement_time(plan.measurement)
        .sample_size(plan.sample_size)
        .configure_from_args()
}

fn bench_uncontended(c: &mut Criterion, rt: &Runtime, pairs: &[(usize, Pair)]) {
    let mut group = c.benchmark_group("acquire_release");
    for (n, pair) in pairs {
        for which in [Impl::Redlock, Impl::Unstamped, Impl::Floor] {
            let counter = AtomicUsize::new(0);
            group.bench_function(format!("{}/{n}", which.name()), |b| {
                b.to_async(rt).iter(|| {
                    let r = resource(
                        which,
                        &format!("crit{n}"),
                        counter.fetch_add(1, Ordering::Relaxed),
                    );
                    async move {
                        if let Err(e) = run_cycle(pair, which, &r).await {
                            panic!("{e}");
                        }
                    }
                });
            });
        }
    }
    group.finish();
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// Where criterion writes its reports: `$CRITERION_HOME`, else `<target>/criterion`.
fn summary_path() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home).join("acquire_release_summary.md");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            // The bench binary lives in <target>/<profile>/deps/.
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.parent()?.to_path_buf())
        })
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("criterion").join("acquire_release_summary.md")
}

async fn summary(plan: Plan, cluster: &Cluster, pair: &Pair) -> String {
    let order = [Impl::Redlock, Impl::Unstamped, Impl::Floor];

    // a. Healthy N = 5.
    let healthy = interleaved(pair, "healthy", plan.healthy_samples, plan.block, &order).await;
    let (rl_h, un_h, fl_h) = (&healthy[0], &healthy[1], &healthy[2]);

    // b. One of five nodes paused. Fresh keys; the floor gets a 1 s per-call bound.
    let paused_node = cluster.node(N_SUMMARY - 1);
    paused_node.pause();
    let rl_p = interleaved(
        pair,
        "paused",
        plan.paused_samples,
        plan.paused_samples,
        &[Impl::Redlock],
    )
    .await
    .remove(0);
    let floor_paused = Pair {
        redlock: pair.redlock.clone(),
        unstamped: pair.unstamped.clone(),
        floor: pair
            .floor
            .with(|f| f.call_timeout = Some(FLOOR_PAUSED_TIMEOUT)),
    };
    let fl_p = interleaved(
        &floor_paused,
        "paused",
        plan.floor_paused_samples,
        plan.floor_paused_samples,
        &[Impl::Floor],
    )
    .await
    .remove(0);
    paused_node.resume();
    // Let the resumed node work off the requests queued while it was stopped.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // c. Throughput of 64 tasks, rounds alternating which implementation goes first.
    let (mut rl_ops, mut un_ops, mut fl_ops) = (0.0, 0.0, 0.0);
    let (mut rl_err, mut un_err, mut fl_err) = (0, 0, 0);
    for round in 0..plan.rounds {
        let mut turn = order;
        turn.rotate_left(round % order.len());
        for which in turn {
            let (ops, errors) = throughput(pair, which, round, plan.round).await;
            match which {
                Impl::Redlock => (rl_ops, rl_err) = (rl_ops + ops, rl_err + errors),
                Impl::Unstamped => (un_ops, un_err) = (un_ops + ops, un_err + errors),
                Impl::Floor => (fl_ops, fl_err) = (fl_ops + ops, fl_err + errors),
            }
        }
    }
    let rounds = plan.rounds as f64;
    let (rl_ops, un_ops, fl_ops) = (rl_ops / rounds, un_ops / rounds, fl_ops / rounds);

    let p50_ratio = ratio(rl_h.p50(), fl_h.p50());
    let un_p50_ratio = ratio(un_h.p50(), fl_h.p50());
    let paused_ratio = ratio(rl_p.p99(), rl_h.p99());
    let tput_ratio = ratio(rl_ops, fl_ops);
    let un_tput_ratio = ratio(un_ops, fl_ops);

    let mut md = String::new();
    let _ = writeln!(
        md,
        "## acquire_release summary (N = {N_SUMMARY}, {} mode, {} cores)\n",
        if plan.quick { "quick" } else { "full" },
        std::thread::available_parallelism().map_or(0, usize::from),
    );
    let _ = writeln!(
        md,
        "| scenario | impl | samples | errors | p50 µs | p99 µs |\n|---|---|---:|---:|---:|---:|"
    );
    for (scenario, name, s) in [
        ("healthy", "redlock", rl_h),
        ("healthy", "redlock-nostamp", un_h),
        ("healthy", "floor", fl_h),
        ("1 of 5 paused", "redlock", &rl_p),
        ("1 of 5 paused (1 s call timeout)", "floor", &fl_p),
    ] {
        let _ = writeln!(
            md,
            "| {scenario} | {name} | {} | {} | {:.1} | {:.1} |",
            s.hist.len(),
            s.errors,
            s.p50(),
            s.p99()
        );
    }
    let _ = writeln!(
        md,
        "\n| throughput ({TASKS} tasks, {} × {:.0} s) | ops/s | errors |\n|---|---:|---:|\n| redlock | {rl_ops:.0} | {rl_err} |\n| redlock-nostamp | {un_ops:.0} | {un_err} |\n| floor | {fl_ops:.0} | {fl_err} |",
        plan.rounds,
        plan.round.as_secs_f64(),
    );
    let _ = writeln!(
        md,
        "\n| target | measured | goal | verdict |\n|---|---:|---:|---|\n\
         | healthy p50 redlock / floor | {p50_ratio:.2}× | ≤ 1.10× | {} |\n\
         | healthy p50 redlock-nostamp / floor | {un_p50_ratio:.2}× | ≤ 1.10× | {} |\n\
         | p99 paused / p99 healthy (redlock) | {paused_ratio:.2}× | ≤ 3× | {} |\n\
         | throughput redlock / floor | {tput_ratio:.2}× | ≥ 1.0× | {} |\n\
         | throughput redlock-nostamp / floor | {un_tput_ratio:.2}× | ≥ 1.0× | {} |",
        verdict(p50_ratio <= 1.10),
        verdict(un_p50_ratio <= 1.10),
        verdict(paused_ratio <= 3.0),
        verdict(tput_ratio >= 1.0),
        verdict(un_tput_ratio >= 1.0),
    );
    let _ = writeln!(
        md,
        "\nFor reference: floor p50 with one node paused is {:.2}× its healthy p50 (it waits for every node).",
        ratio(fl_p.p50(), fl_h.p50()),
    );
    md
}

/// `usec_per_call` of `command` in `INFO commandstats`, averaged over `nodes`.
async fn usec_per_call(cluster: &Cluster, nodes: usize, command: &str) -> f64 {
    let mut total = 0.0;
    for i in 0..nodes {
        let Ok(mut conn) = cluster.node(i).connection().await else {
            continue;
        };
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        let prefix = format!("cmdstat_{command}:");
        total += info
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|fields| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix("usec_per_call="))
            })
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN);
    }
    total / nodes as f64
}

async fn reset_stats(cluster: &Cluster, nodes: usize) {
    for i in 0..nodes {
        if let Ok(mut conn) = cluster.node(i).connection().await {
            let _: redis::RedisResult<()> = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut conn)
                .await;
        }
    }
}

/// `REDLOCK_BENCH_DIAG=1`: where the crate's time goes compared with the floor. Floor variants
/// add one ingredient of the crate's design at a time (its acquire script, a spawned task per
/// phase, a per-call timeout), measured for sequential p50 and 64-task throughput, plus the
/// servers' own CPU time per command.
async fn diagnostics(plan: Plan, cluster: &Cluster, pair: &Pair) -> String {
    let base = &pair.floor;
    let variants: Vec<(&str, Arc<Floor>)> = vec![
        ("floor", Arc::clone(base)),
        (
            "floor + crate acquire script",
            base.with(|f| {
                f.acquire_script = Some(redis::Script::new(CRATE_ACQUIRE).get_hash().to_owned())
            }),
        ),
        ("floor + spawned phases", base.with(|f| f.spawn = true)),
        (
            "floor + 50 ms call timeout",
            base.with(|f| f.call_timeout = Some(redlock::DEFAULT_NODE_TIMEOUT)),
        ),
        (
            "floor + all three",
            base.with(|f| {
                f.acquire_script = Some(redis::Script::new(CRATE_ACQUIRE).get_hash().to_owned());
                f.spawn = true;
                f.call_timeout = Some(redlock::DEFAULT_NODE_TIMEOUT);
            }),
        ),
    ];
    let samples = plan.healthy_samples / 2;
    let mut md = String::from(
        "\n### diagnostics (REDLOCK_BENCH_DIAG, N = 5)\n\n| variant | seq p50 µs | seq p99 µs | 64-task ops/s |\n|---|---:|---:|---:|\n",
    );
    let seq = interleaved(pair, "diag", samples, plan.block, &[Impl::Redlock]).await;
    let (ops, _) = throughput(pair, Impl::Redlock, 90, plan.round).await;
    let _ = writeln!(
        md,
        "| redlock | {:.1} | {:.1} | {ops:.0} |",
        seq[0].p50(),
        seq[0].p99()
    );
    for (k, (name, floor)) in variants.iter().enumerate() {
        let p = Pair {
            redlock: pair.redlock.clone(),
            unstamped: pair.unstamped.clone(),
            floor: Arc::clone(floor),
        };
        let seq = interleaved(&p, &format!("diag{k}"), samples, plan.block, &[Impl::Floor]).await;
        let (ops, _) = throughput(&p, Impl::Floor, 91 + k, plan.round).await;
        let _ = writeln!(
            md,
            "| {name} | {:.1} | {:.1} | {ops:.0} |",
            seq[0].p50(),
            seq[0].p99()
        );
    }

    // Server CPU per command: the floor (SET + release script), then the crate.
    let n = N_SUMMARY;
    reset_stats(cluster, n).await;
    interleaved(pair, "diagcpu", samples, samples, &[Impl::Floor]).await;
    let set = usec_per_call(cluster, n, "set").await;
    let release = usec_per_call(cluster, n, "evalsha").await;
    reset_stats(cluster, n).await;
    interleaved(pair, "diagcpu", samples, samples, &[Impl::Redlock]).await;
    // The crate's EVALSHAs are half acquire, half release.
    let crate_mix = usec_per_call(cluster, n, "evalsha").await;
    let _ = writeln!(
        md,
        "\nServer CPU per call (INFO commandstats, mean of {n} nodes): floor `SET NX PX` {set:.2} µs, \
         floor release script {release:.2} µs, crate EVALSHA (acquire/release mix) {crate_mix:.2} µs \
         → crate acquire script ≈ {:.2} µs.",
        2.0 * crate_mix - release,
    );
    md
}

fn main() {
    let plan = Plan::from_env();
    let rt = runtime();
    let max = SIZES.iter().copied().max().unwrap_or(N_SUMMARY);
    let (cluster, pairs) = rt.block_on(async {
        let cluster = Cluster::start(max).await.expect("start redis-server nodes");
        let urls = cluster.urls();
        let mut pairs = Vec::new();
        for n in SIZES {
            let pair = Pair::new(&urls[..n]).await.expect("connect");
            pairs.push((n, pair));
        }
        (cluster, pairs)
    });

    let mut c = criterion_config(plan);
    bench_uncontended(&mut c, &rt, &pairs);
    c.final_summary();

    // Criterion's `--list` / filtered runs (e.g. `cargo test --benches`) skip the summary.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let pair = &pairs
        .iter()
        .find(|(n, _)| *n == N_SUMMARY)
        .expect("N_SUMMARY is one of SIZES")
        .1;
    let mut md = rt.block_on(summary(plan, &cluster, pair));
    if std::env::var("REDLOCK_BENCH_DIAG").is_ok_and(|v| !v.is_empty() && v != "0") {
        md.push_str(&rt.block_on(diagnostics(plan, &cluster, pair)));
    }
    println!("\n{md}");
    let path = summary_path();
    match path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, &md))
    {
        Ok(()) => println!("summary written to {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
    drop(pairs);
    drop(cluster);
}
