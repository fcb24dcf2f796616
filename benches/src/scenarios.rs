//! The scenarios. Each returns rows for the report; none of them panics on a failing
//! implementation: failures are counted as errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use hdrhistogram::Histogram;
use redlock_testkit::Cluster;
use redlock_testkit::redis;
use tokio::sync::{Semaphore, watch};

use crate::counters;
use crate::impls::{Client, Impl, OnWin, Setup};
use crate::report::{
    FaultRow, HeldResult, HotKeyResult, Latency, LatencyRow, ThroughputRow, histogram, record,
};
use crate::{BenchError, Plan};

/// Lock TTL of every scenario except "many held locks".
pub(crate) const TTL: Duration = Duration::from_secs(10);
/// The harness's own bound on one operation (implementations without a per-node timeout
/// would otherwise stall a fault scenario for good).
const OP_BOUND: Duration = Duration::from_millis(2_500);
/// The floor's per-call bound in fault scenarios: the response timeout peers typically use.
const FLOOR_FAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long each contender of the hot-key scenario holds the lock.
const HOLD: Duration = Duration::from_millis(1);

/// Healthy-cluster setup: the floor awaits every node, peers keep their defaults.
pub(crate) const PLAIN: Setup = Setup {
    ttl: TTL,
    single_attempt: false,
    floor_timeout: None,
    wait_deadline: None,
};

/// Sequential cycles, interleaved in blocks across implementations so drift in machine load
/// hits all of them alike. `caps[i]` bounds the samples of `clients[i]`. Each block's p50 is
/// kept too, to show how far one block's ratio between two implementations moves.
pub(crate) async fn uncontended(
    n: usize,
    clients: &[Client],
    caps: &[usize],
    block: usize,
) -> Vec<LatencyRow> {
    let mut hists: Vec<Histogram<u64>> = clients.iter().map(|_| histogram()).collect();
    let mut block_p50s: Vec<Vec<f64>> = clients.iter().map(|_| Vec::new()).collect();
    let mut this_block = histogram();
    let mut errors = vec![0u64; clients.len()];
    let max = caps.iter().copied().max().unwrap_or(0);
    let mut done = 0;
    let mut round = 0;
    while done < max {
        for k in 0..clients.len() {
            let k = (k + round) % clients.len();
            let client = &clients[k];
            let len = block.min(caps[k].saturating_sub(done));
            this_block.reset();
            for i in done..done + len {
                let resource = format!("bench:{}:lat{n}:{}", client.which().name(), i % 1024);
                let t = Instant::now();
                match client.cycle(&resource, TTL).await {
                    Ok(()) => {
                        let took = t.elapsed();
                        record(&mut hists[k], took);
                        record(&mut this_block, took);
                    }
                    Err(e) => {
                        errors[k] += 1;
                        if errors[k] <= 2 {
                            eprintln!("uncontended N={n} {}: {e}", client.which().name());
                        }
                    }
                }
            }
            if !this_block.is_empty() {
                block_p50s[k].push(this_block.value_at_quantile(0.5) as f64 / 1_000.0);
            }
        }
        done += block;
        round += 1;
    }
    clients
        .iter()
        .zip(hists.iter().zip(errors).zip(block_p50s))
        .map(|(c, ((h, e), block_p50_us))| LatencyRow {
            n,
            implementation: c.which(),
            cycle: Latency::from_hist(h, e, 0),
            block_p50_us,
        })
        .collect()
}

/// What one window of the throughput scenario measured for one implementation.
struct TputWindow {
    ops: u64,
    errors: u64,
    secs: f64,
    client_cpu: Duration,
    servers: ServerWork,
}

/// `concurrency` tasks of `client` cycling on distinct keys for `wall`.
async fn throughput_window(
    n: usize,
    client: &Client,
    urls: &[String],
    concurrency: usize,
    wall: Duration,
) -> TputWindow {
    let servers_before = server_work(urls).await;
    let cpu_before = cpu_time();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let (stop, ops, errors) = (Arc::clone(&stop), Arc::clone(&ops), Arc::clone(&errors));
            let client = client.clone();
            let resource = format!(
                "bench:{}:tput{n}:{concurrency}:{task}",
                client.which().name()
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match client.cycle(&resource, TTL).await {
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
    TputWindow {
        ops: ops.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        secs: started.elapsed().as_secs_f64(),
        client_cpu: cpu_time().saturating_sub(cpu_before),
        servers: server_work(urls).await.since(&servers_before),
    }
}

/// `concurrency` tasks cycling on distinct keys, `wall` per implementation, measured in
/// `windows` windows that take turns between the implementations (window `w` starts with
/// `clients[w % len]`): a machine that slows down or speeds up during the scenario then
/// slows or speeds every implementation alike, and each window's ratio between two
/// implementations compares them a fraction of a second apart.
pub(crate) async fn throughput(
    n: usize,
    clients: &[&Client],
    urls: &[String],
    concurrency: usize,
    wall: Duration,
    windows: usize,
) -> Vec<ThroughputRow> {
    let windows = windows.max(1);
    let slice = wall / u32::try_from(windows).unwrap_or(u32::MAX);
    let mut measured: Vec<Vec<TputWindow>> = clients.iter().map(|_| Vec::new()).collect();
    for w in 0..windows {
        for k in 0..clients.len() {
            let k = (k + w) % clients.len();
            measured[k].push(throughput_window(n, clients[k], urls, concurrency, slice).await);
        }
    }
    clients
        .iter()
        .zip(measured)
        .map(|(client, its)| {
            let ops: u64 = its.iter().map(|w| w.ops).sum();
            let secs: f64 = its.iter().map(|w| w.secs).sum();
            let client_cpu: Duration = its.iter().map(|w| w.client_cpu).sum();
            let server_cpu_us: f64 = its.iter().map(|w| w.servers.cpu_us).sum();
            let commands: u64 = its.iter().map(|w| w.servers.commands).sum();
            let done = ops.max(1) as f64;
            ThroughputRow {
                n,
                concurrency,
                implementation: client.which(),
                ops_per_sec: ops as f64 / secs,
                window_ops_per_sec: its.iter().map(|w| w.ops as f64 / w.secs).collect(),
                errors: its.iter().map(|w| w.errors).sum(),
                server_cpu_us_per_op: server_cpu_us / done,
                client_cpu_us_per_op: client_cpu.as_secs_f64() * 1e6 / done,
                commands_per_op: commands as f64 / done,
            }
        })
        .collect()
}

/// What the servers did, every node summed: CPU (`used_cpu_user` + `used_cpu_sys` of
/// `INFO cpu`) and commands (`INFO commandstats` calls: script calls and the commands run
/// inside them, but not the harness's own `INFO`, `HELLO` and `PING`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ServerWork {
    cpu_us: f64,
    commands: u64,
}

impl ServerWork {
    fn since(&self, before: &ServerWork) -> ServerWork {
        ServerWork {
            cpu_us: (self.cpu_us - before.cpu_us).max(0.0),
            commands: self.commands.saturating_sub(before.commands),
        }
    }
}

/// `INFO all` of the node at `url`, or `None` when it does not answer.
async fn info_all(url: &str) -> Option<String> {
    let info: redis::RedisResult<String> = async {
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        redis::cmd("INFO").arg("all").query_async(&mut conn).await
    }
    .await;
    info.ok()
}

/// Reads [`ServerWork`] from every node (nodes that do not answer count nothing).
pub(crate) async fn server_work(urls: &[String]) -> ServerWork {
    let mut work = ServerWork::default();
    for url in urls {
        let Some(info) = info_all(url).await else {
            continue;
        };
        for line in info.lines() {
            for field in ["used_cpu_user:", "used_cpu_sys:"] {
                if let Some(v) = line.strip_prefix(field) {
                    work.cpu_us += v.trim().parse::<f64>().unwrap_or(0.0) * 1e6;
                }
            }
            if let Some(rest) = line.strip_prefix("cmdstat_") {
                let (name, fields) = rest.split_once(':').unwrap_or((rest, ""));
                if matches!(name, "info" | "client|setname" | "hello" | "ping") {
                    continue;
                }
                let calls = fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                work.commands += calls;
            }
        }
    }
    work
}

/// Who won the hot key last and the longest run of consecutive wins by one contender.
#[derive(Debug, Default)]
struct Streak {
    last: Option<usize>,
    run: u64,
    longest: u64,
}

impl Streak {
    fn win(&mut self, who: usize) {
        if self.last == Some(who) {
            self.run += 1;
        } else {
            self.last = Some(who);
            self.run = 1;
        }
        self.longest = self.longest.max(self.run);
    }
}

/// How long contenders still waiting when the hot-key window closes may go on.
const HOT_GRACE: Duration = Duration::from_secs(1);

/// One hot-key contender's tally.
#[derive(Debug)]
struct Contender {
    hist: Histogram<u64>,
    wins: u64,
    errors: u64,
    /// Set while an acquire is waiting.
    waiting_since: Option<Instant>,
}

impl Contender {
    fn new() -> Self {
        Contender {
            hist: histogram(),
            wins: 0,
            errors: 0,
            waiting_since: None,
        }
    }
}

/// Jain's fairness index of `x`: (Σx)² / (n·Σx²); 1 = perfectly even, 1/n = one took all.
pub(crate) fn jain(x: &[u64]) -> f64 {
    let sum: f64 = x.iter().map(|v| *v as f64).sum();
    let squares: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
    if squares > 0.0 {
        sum * sum / (x.len() as f64 * squares)
    } else {
        0.0
    }
}

/// Who contends for the hot key, and how.
pub(crate) struct Contention<'a> {
    pub(crate) which: Impl,
    /// The nodes, as the contenders' clients reach them.
    pub(crate) urls: &'a [String],
    /// How contender 0's client reaches the nodes instead, when it differs (a far client).
    pub(crate) first_urls: Option<&'a [String]>,
    pub(crate) resource: String,
    pub(crate) contenders: usize,
    /// One client shared by every contender, instead of a client each.
    pub(crate) shared: bool,
    pub(crate) wall: Duration,
}

/// `contenders` contenders on one key for `wall`: each with its own client (as separate
/// processes would be), or all sharing one client (`shared`).
pub(crate) async fn hot_key(
    n: usize,
    which: Impl,
    urls: &[String],
    wall: Duration,
    contenders: usize,
    shared: bool,
) -> Result<HotKeyResult, BenchError> {
    let contention = Contention {
        which,
        urls,
        first_urls: None,
        resource: format!("bench:{}:hot{n}:{contenders}:{shared}", which.name()),
        contenders,
        shared,
        wall,
    };
    contend(&contention, std::future::ready(())).await
}

/// One node's traffic delay in the "slow node" row of the hot key under faults, each way.
const SLOW_NODE_DELAY: Duration = Duration::from_millis(2);
/// The far client's extra delay to every node in the "far client" row, each way.
const FAR_CLIENT_DELAY: Duration = Duration::from_millis(1);
/// Between a fault and the first contender's acquire: the fault is already there when the
/// contention starts, as with a node that died a while ago.
const FAULT_SETTLE: Duration = Duration::from_millis(200);

/// The faults of the hot key under faults, in the order run; "healthy" is the same proxied
/// cluster without one.
pub(crate) const HOT_FAULTS: [&str; 4] = ["healthy", "dead node", "slow node", "far client"];

/// The hot key (`contenders` clients, 1 ms hold) on a fresh proxied cluster of `n` nodes
/// under `fault` (one of [`HOT_FAULTS`]), injected after the clients connected and warmed up
/// and [`FAULT_SETTLE`] before they contend. "dead node" kills, and "slow node" delays by
/// [`SLOW_NODE_DELAY`] each way, the node this crate's racing attempts ask first for the key
/// (for the others, one node like any other); "far client" sends contender 0's traffic to every
/// node through proxies of its own adding [`FAR_CLIENT_DELAY`] each way.
pub(crate) async fn hot_key_under(
    n: usize,
    which: Impl,
    fault: &str,
    wall: Duration,
    contenders: usize,
) -> Result<HotKeyResult, BenchError> {
    let cluster = Cluster::builder().nodes(n).proxied(true).start().await?;
    let urls = cluster.urls();
    let resource = format!(
        "bench:{}:hotfault{n}:{}",
        which.name(),
        fault.replace(' ', "-")
    );
    let first = racing_first_node(&urls, &resource).await?;
    let mut far = Vec::new();
    if fault == "far client" {
        for node in cluster.nodes() {
            let proxy = redlock_testkit::FaultProxy::start(node.addr()).await?;
            proxy.set_delay(FAR_CLIENT_DELAY, Duration::ZERO);
            far.push(proxy);
        }
    }
    let far_urls: Vec<String> = far.iter().map(redlock_testkit::FaultProxy::url).collect();
    let contention = Contention {
        which,
        urls: &urls,
        first_urls: (!far_urls.is_empty()).then_some(&far_urls[..]),
        resource,
        contenders,
        shared: false,
        wall,
    };
    let inject = async {
        match fault {
            "dead node" => cluster.node(first).kill(),
            "slow node" => {
                if let Some(p) = cluster.node(first).proxy() {
                    p.set_delay(SLOW_NODE_DELAY, Duration::ZERO);
                }
            }
            _ => {}
        }
        tokio::time::sleep(FAULT_SETTLE).await;
    };
    let result = contend(&contention, inject).await;
    drop(far);
    drop(cluster);
    result
}

/// The node this crate's racing attempts on `resource` ask first, as a client of `urls` ranks
/// the nodes once connected (`Redlock::first_node`; the same for every client of the same
/// servers).
async fn racing_first_node(urls: &[String], resource: &str) -> Result<usize, BenchError> {
    let client = redlock::Redlock::builder().nodes(urls).build()?;
    client.connect().await;
    Ok(client.first_node(resource).unwrap_or(0))
}

/// Runs `c`: connects and warms up every contender's client, awaits `before` (a fault), then
/// lets the contenders take turns for `c.wall`.
async fn contend(
    c: &Contention<'_>,
    before: impl std::future::Future<Output = ()>,
) -> Result<HotKeyResult, BenchError> {
    let (which, contenders, shared) = (c.which, c.contenders, c.shared);
    let setup = Setup {
        wait_deadline: Some(Duration::from_secs(30)),
        ..PLAIN
    };
    let mut clients = Vec::with_capacity(contenders);
    for i in 0..contenders {
        let urls = match c.first_urls {
            Some(urls) if i == 0 => urls,
            _ => c.urls,
        };
        match clients.first() {
            Some(first) if shared => clients.push(Client::clone(first)),
            _ => clients.push(Client::connect(which, urls, setup).await?),
        }
    }
    let resource = c.resource.clone();
    // Warm every client's connections before the clock starts.
    for client in &clients {
        client
            .cycle(&format!("{resource}:warm"), TTL)
            .await
            .map_err(|e| format!("hot key warm-up: {e}"))?;
    }
    before.await;
    let stop = Arc::new(AtomicBool::new(false));
    let streak = Arc::new(std::sync::Mutex::new(Streak::default()));
    let stats: Vec<Arc<std::sync::Mutex<Contender>>> = (0..contenders)
        .map(|_| Arc::new(std::sync::Mutex::new(Contender::new())))
        .collect();
    let counters0 = counters::Snapshot::now();
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(id, client)| {
            let stop = Arc::clone(&stop);
            let resource = resource.clone();
            let (streak, stats) = (Arc::clone(&streak), Arc::clone(&stats[id]));
            let won = Arc::clone(&stats);
            let on_win: OnWin = Arc::new(move || {
                streak.lock().expect("streak lock").win(id);
                won.lock().expect("contender lock").waiting_since = None;
            });
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    stats.lock().expect("contender lock").waiting_since = Some(Instant::now());
                    let result = client
                        .wait_hold_release(&resource, TTL, HOLD, Arc::clone(&on_win))
                        .await;
                    let mut st = stats.lock().expect("contender lock");
                    st.waiting_since = None;
                    match result {
                        Ok(waited) => {
                            record(&mut st.hist, waited);
                            st.wins += 1;
                        }
                        Err(e) => {
                            st.errors += 1;
                            if st.errors <= 2 {
                                eprintln!("hot key {}: {e}", client.which().name());
                            }
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(c.wall).await;
    stop.store(true, Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    // Contenders still waiting get a grace period; then their waits are cut off and counted
    // as censored samples at the time waited so far (a lower bound on that wait).
    let aborts: Vec<_> = tasks.iter().map(|t| t.abort_handle()).collect();
    let _ = tokio::time::timeout(HOT_GRACE, join_all(tasks)).await;
    aborts.iter().for_each(|a| a.abort());
    let mut all = histogram();
    let (mut errors, mut censored) = (0u64, 0u64);
    let mut per_contender = Vec::with_capacity(contenders);
    for st in &stats {
        let st = st.lock().expect("contender lock");
        all.add(&st.hist)?;
        if let Some(since) = st.waiting_since {
            record(&mut all, since.elapsed());
            censored += 1;
        }
        per_contender.push(st.wins);
        errors += st.errors;
    }
    let counted = counters::Snapshot::now().since(counters0);
    let wins: u64 = per_contender.iter().sum();
    let longest_streak = streak.lock().expect("streak lock").longest;
    Ok(HotKeyResult {
        handoffs_per_sec: wins as f64 / secs,
        wait: Latency::from_hist(&all, errors, 0),
        min_per_contender: per_contender.iter().copied().min().unwrap_or(0),
        censored_waits: censored,
        jain: jain(&per_contender),
        longest_streak,
        wins_per_contender: per_contender,
        // Only this crate reports them (through the `metrics` facade).
        split_votes: (which == Impl::Redlock).then_some(counted.split_votes),
        staggers: (which == Impl::Redlock).then_some(counted.staggers),
        acquire_calls: (which == Impl::Redlock).then_some(counted.acquire_calls),
        acquire_attempts: (which == Impl::Redlock).then_some(counted.acquire_attempts),
    })
}

/// Client CPU time (user + system) of this process so far.
fn cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
        let tv = |t: nix::sys::time::TimeVal| {
            Duration::from_secs(t.tv_sec().max(0) as u64)
                + Duration::from_micros(t.tv_usec().max(0) as u64)
        };
        tv(u.user_time()) + tv(u.system_time())
    })
}

/// Sums over `urls`: (script calls from clients — `EVALSHA`/`EVAL`/`FCALL` — i.e. round trips of a
/// script-based renewal, and every command executed, including those run inside scripts).
pub(crate) async fn node_commands(urls: &[String]) -> (u64, u64) {
    let (mut scripts, mut total) = (0, 0);
    for url in urls {
        let Some(info) = info_all(url).await else {
            continue;
        };
        for line in info.lines() {
            if let Some(v) = line.strip_prefix("total_commands_processed:") {
                total += v.trim().parse::<u64>().unwrap_or(0);
            }
            for cmd in [
                "cmdstat_evalsha:",
                "cmdstat_eval:",
                "cmdstat_fcall:",
                "cmdstat_evalsha_ro:",
            ] {
                if let Some(calls) = line
                    .strip_prefix(cmd)
                    .and_then(|f| f.split(',').find_map(|kv| kv.strip_prefix("calls=")))
                {
                    scripts += calls.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    (scripts, total)
}

/// Acquisitions (and releases) in flight while taking or dropping the held locks.
const HELD_CONCURRENCY: usize = 64;

/// Resident set size of this process (`VmRSS` in `/proc/self/status`), in bytes.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// What the hold window measured.
struct Window {
    cpu_cores: f64,
    round_trips: f64,
    cmds: f64,
    rss_end: u64,
}

/// Sleeps `hold` with every lock held; measures client CPU and node commands over it.
async fn hold_window(urls: &[String], hold: Duration) -> Window {
    let cmds0 = node_commands(urls).await;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    tokio::time::sleep(hold).await;
    let cpu = cpu_time().saturating_sub(cpu0);
    let wall = t0.elapsed().as_secs_f64();
    let rss_end = rss_bytes();
    let cmds1 = node_commands(urls).await;
    let per_node = |a: u64, b: u64| a.saturating_sub(b) as f64 / wall / urls.len() as f64;
    Window {
        cpu_cores: cpu.as_secs_f64() / wall,
        round_trips: per_node(cmds1.0, cmds0.0),
        cmds: per_node(cmds1.1, cmds0.1),
        rss_end,
    }
}

/// `locks` locks acquired by one client (64 acquisitions in flight), held and auto-renewed
/// for `hold`, then released. Measures CPU, node commands and resident memory over the hold
/// window only. This crate's guards and distributed-lock-redis's handles are kept in a `Vec`;
/// rslock renews only inside `using`, so each of its locks is one task.
pub(crate) async fn held(
    which: Impl,
    urls: &[String],
    locks: usize,
    ttl: Duration,
    hold: Duration,
) -> Result<HeldResult, BenchError> {
    use futures_util::stream::{self, StreamExt};

    let t_total = Instant::now();
    let setup = Setup { ttl, ..PLAIN };
    let client = Client::connect(which, urls, setup).await?;
    let tag = format!("bench:{}:held{}:{locks}", which.name(), urls.len());
    let rss0 = rss_bytes();
    let t_acquire = Instant::now();
    let (held, acquire_secs, window, lost) = match &client {
        Client::Redlock(rl, _) => {
            let guards: Vec<_> = stream::iter(0..locks)
                .map(|i| {
                    let (rl, resource) = (rl.clone(), format!("{tag}:{i}"));
                    async move {
                        // Bounded by the harness: a call that never returns counts as failed.
                        let lock = tokio::time::timeout(OP_BOUND, rl.try_acquire(&resource))
                            .await
                            .ok()?
                            .ok()?;
                        rl.guard(lock).ok()
                    }
                })
                .buffer_unordered(HELD_CONCURRENCY)
                .filter_map(|g| async move { g })
                .collect()
                .await;
            let acquire_secs = t_acquire.elapsed().as_secs_f64();
            let window = hold_window(urls, hold).await;
            let lost = guards.iter().filter(|g| g.lease().is_lost()).count() as u64;
            let held = guards.len();
            stream::iter(guards)
                .map(|g| async move {
                    let _ = tokio::time::timeout(OP_BOUND, g.release()).await;
                })
                .buffer_unordered(HELD_CONCURRENCY)
                .collect::<()>()
                .await;
            (held, acquire_secs, window, lost)
        }
        Client::DistLock(p) => {
            use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
            let handles: Vec<_> = stream::iter(0..locks)
                .map(|i| {
                    let lock = p.create_lock(&format!("{tag}:{i}"));
                    async move {
                        tokio::time::timeout(OP_BOUND, lock.try_acquire())
                            .await
                            .ok()?
                            .ok()
                            .flatten()
                    }
                })
                .buffer_unordered(HELD_CONCURRENCY)
                .filter_map(|h| async move { h })
                .collect()
                .await;
            let acquire_secs = t_acquire.elapsed().as_secs_f64();
            let window = hold_window(urls, hold).await;
            // A renewal task that ended without signalling (it panicked: see the report)
            // dropped its sender; such a lock is no longer renewed, so it counts as lost.
            let lost = handles
                .iter()
                .filter(|h| *h.lost_token().borrow() || h.lost_token().has_changed().is_err())
                .count() as u64;
            let held = handles.len();
            stream::iter(handles)
                .map(|h| async move {
                    let _ = tokio::time::timeout(OP_BOUND, h.release()).await;
                })
                .buffer_unordered(HELD_CONCURRENCY)
                .collect::<()>()
                .await;
            (held, acquire_secs, window, lost)
        }
        Client::Rslock(lm) => held_rslock(lm, &tag, locks, ttl, urls, hold, t_acquire).await,
        _ => return Err(format!("{} does not renew held locks", which.name()).into()),
    };
    if held < locks {
        eprintln!(
            "held {} {locks}: {} acquisitions failed",
            which.name(),
            locks - held
        );
    }
    Ok(HeldResult {
        held,
        acquire_secs,
        cpu_cores: window.cpu_cores,
        node_round_trips_per_sec: window.round_trips,
        node_cmds_per_sec: window.cmds,
        rss_bytes_per_lock: window.rss_end.saturating_sub(rss0) as f64 / held.max(1) as f64,
        total_secs: t_total.elapsed().as_secs_f64(),
        lost,
    })
}

/// rslock's locks, each renewed inside its own `using` task; at most 64 acquiring at once.
async fn held_rslock(
    lm: &rslock::LockManager,
    tag: &str,
    locks: usize,
    ttl: Duration,
    urls: &[String],
    hold: Duration,
    t_acquire: Instant,
) -> (usize, f64, Window, u64) {
    let permits = Arc::new(Semaphore::new(HELD_CONCURRENCY));
    let acquired = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every holder reports whether it lost its lock *before* any holder releases: all
    // releases at once would otherwise delay the renewals of the holders still checking.
    let (release_tx, release_rx) = watch::channel(false);
    let checked = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..locks)
        .map(|i| {
            let (lm, permits, done, failed) = (
                lm.clone(),
                Arc::clone(&permits),
                Arc::clone(&acquired),
                Arc::clone(&failed),
            );
            let mut stop = stop_rx.clone();
            let mut release = release_rx.clone();
            let checked = Arc::clone(&checked);
            let resource = format!("{tag}:{i}");
            tokio::spawn(async move {
                let permit = permits.acquire_owned().await.expect("semaphore open");
                let ran = Arc::new(AtomicBool::new(false));
                let reported = Arc::new(AtomicBool::new(false));
                let (ran_inside, reported_inside, checked_inside) = (
                    Arc::clone(&ran),
                    Arc::clone(&reported),
                    Arc::clone(&checked),
                );
                let out = lm
                    .using(resource.as_bytes(), ttl, async move || {
                        ran_inside.store(true, Ordering::Relaxed);
                        drop(permit);
                        done.fetch_add(1, Ordering::Relaxed);
                        let _ = stop.wait_for(|s| *s).await;
                        reported_inside.store(true, Ordering::Relaxed);
                        checked_inside.fetch_add(1, Ordering::Relaxed);
                        let _ = release.wait_for(|r| *r).await;
                    })
                    .await;
                if ran.load(Ordering::Relaxed) && !reported.load(Ordering::Relaxed) {
                    // A failed extension dropped the work before it reported: report for it,
                    // or the harness would wait for it forever.
                    checked.fetch_add(1, Ordering::Relaxed);
                }
                if !ran.load(Ordering::Relaxed) {
                    // `using` could not acquire: the work never ran. A failed acquisition.
                    failed.fetch_add(1, Ordering::Relaxed);
                    return 0u64;
                }
                // `using` returns an error when a renewal failed (lock lost).
                u64::from(out.is_err())
            })
        })
        .collect();
    while acquired.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < locks {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let acquire_secs = t_acquire.elapsed().as_secs_f64();
    let window = hold_window(urls, hold).await;
    let _ = stop_tx.send(true);
    let holders = locks - failed.load(Ordering::Relaxed);
    while checked.load(Ordering::Relaxed) < holders {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = release_tx.send(true);
    let mut lost = 0;
    for t in join_all(tasks).await {
        lost += t.unwrap_or(1);
    }
    (holders, acquire_secs, window, lost)
}

/// Sequential cycles, each bounded by the harness; a bounded-out cycle counts at the bound.
/// Stops early (after at least two cycles) once `budget` is spent, so an implementation that
/// turns out slower under a fault than its sample count assumed cannot stall the run.
async fn bounded_cycles(client: &Client, tag: &str, samples: usize, budget: Duration) -> Latency {
    let mut h = histogram();
    let (mut errors, mut timeouts) = (0, 0);
    let started = Instant::now();
    for i in 0..samples {
        if i >= 2 && started.elapsed() > budget {
            break;
        }
        let resource = format!("bench:{}:{tag}:{i}", client.which().name());
        let t = Instant::now();
        match tokio::time::timeout(OP_BOUND, client.cycle(&resource, TTL)).await {
            Ok(Ok(())) => record(&mut h, t.elapsed()),
            Ok(Err(_)) => {
                errors += 1;
                record(&mut h, t.elapsed());
            }
            Err(_) => {
                timeouts += 1;
                record(&mut h, t.elapsed());
            }
        }
    }
    Latency::from_hist(&h, errors, timeouts)
}

/// The fault scenarios on a fresh proxied cluster of `n` nodes, in this order: healthy,
/// slow (+20 ms on one node), hung (SIGSTOP one), majority hung, dead (kill one), majority
/// dead. Every implementation makes one attempt per acquire here (peers' retries off), so
/// the numbers compare what one attempt costs.
pub(crate) async fn faults(
    n: usize,
    plan: &Plan,
    timed: &impl Fn(Impl) -> bool,
    mut step: impl FnMut(&str),
) -> Result<Vec<FaultRow>, BenchError> {
    let cluster = Cluster::builder().nodes(n).proxied(true).start().await?;
    let urls = cluster.urls();
    let setup = Setup {
        ttl: TTL,
        single_attempt: true,
        floor_timeout: Some(FLOOR_FAULT_TIMEOUT),
        wait_deadline: None,
    };
    let mut clients = Vec::new();
    for which in Impl::in_every_scenario().filter(|w| timed(*w)) {
        let c = Client::connect(which, &urls, setup).await?;
        let _ = c.cycle("bench:warm", TTL).await;
        clients.push(c);
    }
    let quorum = n / 2 + 1;
    let minority_last = n - 1;
    // Nodes to stop for a majority to be gone: enough that fewer than a quorum remain.
    let majority: Vec<usize> = (quorum - 1..n).collect();
    let mut rows = Vec::new();
    for fault in [
        "healthy",
        "slow",
        "hung",
        "majority hung",
        "dead",
        "majority dead",
    ] {
        step(&format!("faults N={n}: {fault}"));
        match fault {
            "slow" => {
                if let Some(p) = cluster.node(minority_last).proxy() {
                    p.set_delay(Duration::from_millis(20), Duration::ZERO);
                }
            }
            "hung" => cluster.node(minority_last).pause(),
            "majority hung" => majority.iter().for_each(|&i| cluster.node(i).pause()),
            "dead" => cluster.node(minority_last).kill(),
            "majority dead" => majority.iter().for_each(|&i| cluster.node(i).kill()),
            _ => {}
        }
        for client in &clients {
            let which = client.which();
            let slow_op = match (fault, which) {
                // A dead majority costs distributed-lock-redis its acquire timeout (TTL/10).
                ("majority dead", Impl::DistLock) => true,
                ("healthy" | "dead" | "majority dead", _) => false,
                // Ours decides without the slow node; so does distributed-lock-redis, which
                // also releases only the nodes that granted (a hung majority costs it its
                // acquire timeout, TTL/10 here). The others wait for the slow node.
                (_, Impl::Redlock) => false,
                ("slow" | "hung", Impl::DistLock) => false,
                _ => true,
            };
            let mut samples = if slow_op {
                if fault == "slow" {
                    plan.fault_slow_samples
                } else {
                    plan.fault_hung_samples
                }
            } else {
                plan.fault_samples
            };
            if which == Impl::RedlockRs {
                samples = samples.min(plan.redlock_rs_samples / 2).max(1);
            }
            let tag = format!("fault{n}:{}", fault.replace(' ', "-"));
            rows.push(FaultRow {
                n,
                fault: fault.to_owned(),
                implementation: which,
                cycle: bounded_cycles(client, &tag, samples, plan.fault_series_budget).await,
            });
        }
        match fault {
            "slow" => {
                if let Some(p) = cluster.node(minority_last).proxy() {
                    p.set_delay(Duration::ZERO, Duration::ZERO);
                }
            }
            "hung" => cluster.node(minority_last).resume(),
            "majority hung" => majority.iter().for_each(|&i| cluster.node(i).resume()),
            _ => continue,
        }
        // Let resumed nodes and blocked peer threads work off what queued up meanwhile.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    drop(clients);
    drop(cluster);
    Ok(rows)
}
