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

use crate::impls::{Client, Impl, Setup};
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
/// Contenders of the hot-key scenario and how long each holds the lock.
pub(crate) const CONTENDERS: usize = 8;
const HOLD: Duration = Duration::from_millis(1);

/// Healthy-cluster setup: the floor awaits every node, peers keep their defaults.
pub(crate) const PLAIN: Setup = Setup {
    ttl: TTL,
    single_attempt: false,
    floor_timeout: None,
    wait_deadline: None,
};

/// Sequential cycles, interleaved in blocks across implementations so drift in machine load
/// hits all of them alike. `caps[i]` bounds the samples of `clients[i]`.
pub(crate) async fn uncontended(
    n: usize,
    clients: &[Client],
    caps: &[usize],
    block: usize,
) -> Vec<LatencyRow> {
    let mut hists: Vec<Histogram<u64>> = clients.iter().map(|_| histogram()).collect();
    let mut errors = vec![0u64; clients.len()];
    let max = caps.iter().copied().max().unwrap_or(0);
    let mut done = 0;
    let mut round = 0;
    while done < max {
        for k in 0..clients.len() {
            let k = (k + round) % clients.len();
            let client = &clients[k];
            let len = block.min(caps[k].saturating_sub(done));
            for i in done..done + len {
                let resource = format!("bench:{}:lat{n}:{}", client.which().name(), i % 1024);
                let t = Instant::now();
                match client.cycle(&resource, TTL).await {
                    Ok(()) => record(&mut hists[k], t.elapsed()),
                    Err(e) => {
                        errors[k] += 1;
                        if errors[k] <= 2 {
                            eprintln!("uncontended N={n} {}: {e}", client.which().name());
                        }
                    }
                }
            }
        }
        done += block;
        round += 1;
    }
    clients
        .iter()
        .zip(hists.iter().zip(errors))
        .map(|(c, (h, e))| LatencyRow {
            n,
            implementation: c.which(),
            cycle: Latency::from_hist(h, e, 0),
        })
        .collect()
}

/// `concurrency` tasks cycling on distinct keys for `wall`.
pub(crate) async fn throughput(
    n: usize,
    client: &Client,
    concurrency: usize,
    wall: Duration,
) -> ThroughputRow {
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
    let secs = started.elapsed().as_secs_f64();
    ThroughputRow {
        n,
        concurrency,
        implementation: client.which(),
        ops_per_sec: ops.load(Ordering::Relaxed) as f64 / secs,
        errors: errors.load(Ordering::Relaxed),
    }
}

/// Eight contenders on one key for `wall`: each with its own client (as separate processes
/// would be), or all sharing one client (`shared`).
pub(crate) async fn hot_key(
    n: usize,
    which: Impl,
    urls: &[String],
    wall: Duration,
    shared: bool,
) -> Result<HotKeyResult, BenchError> {
    let setup = Setup {
        wait_deadline: Some(Duration::from_secs(30)),
        ..PLAIN
    };
    let mut clients = Vec::with_capacity(CONTENDERS);
    for _ in 0..CONTENDERS {
        match clients.first() {
            Some(c) if shared => clients.push(Client::clone(c)),
            _ => clients.push(Client::connect(which, urls, setup).await?),
        }
    }
    let resource = format!("bench:{}:hot{n}:{shared}", which.name());
    // Warm every client's connections before the clock starts.
    for c in &clients {
        c.cycle(&format!("{resource}:warm"), TTL)
            .await
            .map_err(|e| format!("hot key warm-up: {e}"))?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let stop = Arc::clone(&stop);
            let resource = resource.clone();
            tokio::spawn(async move {
                let mut h = histogram();
                let (mut wins, mut errors) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    match client.wait_hold_release(&resource, TTL, HOLD).await {
                        Ok(waited) => {
                            record(&mut h, waited);
                            wins += 1;
                        }
                        Err(e) => {
                            errors += 1;
                            if errors <= 2 {
                                eprintln!("hot key {}: {e}", client.which().name());
                            }
                        }
                    }
                }
                (h, wins, errors)
            })
        })
        .collect();
    tokio::time::sleep(wall).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = histogram();
    let (mut wins, mut errors, mut fewest) = (0u64, 0u64, u64::MAX);
    for r in join_all(tasks).await {
        let (h, w, e) = r?;
        all.add(&h)?;
        wins += w;
        errors += e;
        fewest = fewest.min(w);
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(HotKeyResult {
        handoffs_per_sec: wins as f64 / secs,
        wait: Latency::from_hist(&all, errors, 0),
        min_per_contender: fewest,
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

/// Sums over `urls`: (script calls from clients — `EVALSHA`/`EVAL` — i.e. round trips of a
/// script-based renewal, and every command executed, including those run inside scripts).
pub(crate) async fn node_commands(urls: &[String]) -> (u64, u64) {
    let (mut scripts, mut total) = (0, 0);
    for url in urls {
        let info: redis::RedisResult<String> = async {
            let mut conn = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            redis::cmd("INFO").arg("all").query_async(&mut conn).await
        }
        .await;
        let Ok(info) = info else { continue };
        for line in info.lines() {
            if let Some(v) = line.strip_prefix("total_commands_processed:") {
                total += v.trim().parse::<u64>().unwrap_or(0);
            }
            for cmd in ["cmdstat_evalsha:", "cmdstat_eval:"] {
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

/// `locks` locks acquired by one client (64 acquisitions in flight), held and auto-renewed
/// for `hold`, then released. Measures CPU and node commands over the hold window only.
pub(crate) async fn held(
    which: Impl,
    urls: &[String],
    locks: usize,
    ttl: Duration,
    hold: Duration,
) -> Result<HeldResult, BenchError> {
    let setup = Setup { ttl, ..PLAIN };
    let client = Client::connect(which, urls, setup).await?;
    let permits = Arc::new(Semaphore::new(64));
    let acquired = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every holder reports whether it lost its lock *before* any holder releases: 20,000
    // releases at once would otherwise delay the renewals of the holders still checking.
    let (release_tx, release_rx) = watch::channel(false);
    let checked = Arc::new(AtomicUsize::new(0));
    let t_acquire = Instant::now();
    let tag = format!("bench:{}:held{}:{locks}", which.name(), urls.len());
    let tasks: Vec<_> = (0..locks)
        .map(|i| {
            let (client, permits, acquired, failed) = (
                client.clone(),
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
                match client {
                    Client::Redlock(rl) => {
                        let lock = match rl.try_acquire(&resource).await {
                            Ok(l) => l,
                            Err(_) => {
                                // Reported separately (and excluded from "held"), not as lost.
                                failed.fetch_add(1, Ordering::Relaxed);
                                return 0u64;
                            }
                        };
                        let guard = rl.guard(lock).expect("a lock of this client");
                        drop(permit);
                        acquired.fetch_add(1, Ordering::Relaxed);
                        let _ = stop.wait_for(|s| *s).await;
                        let lost = u64::from(guard.lease().is_lost());
                        checked.fetch_add(1, Ordering::Relaxed);
                        let _ = release.wait_for(|r| *r).await;
                        let _ = guard.release().await;
                        lost
                    }
                    Client::Rslock(lm) => {
                        let done = Arc::clone(&acquired);
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
                            // A failed extension dropped the work before it reported: report
                            // for it, or the harness would wait for it forever.
                            checked.fetch_add(1, Ordering::Relaxed);
                        }
                        if !ran.load(Ordering::Relaxed) {
                            // `using` could not acquire: the work never ran. Counted as a failed
                            // acquisition, as for this crate (without this the harness waited
                            // for it forever).
                            failed.fetch_add(1, Ordering::Relaxed);
                            return 0;
                        }
                        // `using` returns an error when a renewal failed (lock lost).
                        u64::from(out.is_err())
                    }
                    _ => 1,
                }
            })
        })
        .collect();
    while acquired.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < locks {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let acquire_secs = t_acquire.elapsed().as_secs_f64();
    let failed_acquires = failed.load(Ordering::Relaxed);
    if failed_acquires > 0 {
        eprintln!(
            "held {} {locks}: {failed_acquires} acquisitions failed",
            which.name()
        );
    }
    let cmds0 = node_commands(urls).await;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    tokio::time::sleep(hold).await;
    let cpu = cpu_time().saturating_sub(cpu0);
    let wall = t0.elapsed().as_secs_f64();
    let cmds1 = node_commands(urls).await;
    let per_node = |a: u64, b: u64| a.saturating_sub(b) as f64 / wall / urls.len() as f64;
    let _ = stop_tx.send(true);
    let holders = locks - failed_acquires;
    while checked.load(Ordering::Relaxed) < holders {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = release_tx.send(true);
    let mut lost = 0;
    for t in join_all(tasks).await {
        lost += t.unwrap_or(1);
    }
    Ok(HeldResult {
        held: locks - failed_acquires,
        acquire_secs,
        cpu_cores: cpu.as_secs_f64() / wall,
        node_round_trips_per_sec: per_node(cmds1.0, cmds0.0),
        node_cmds_per_sec: per_node(cmds1.1, cmds0.1),
        lost,
    })
}

/// Sequential cycles, each bounded by the harness; a bounded-out cycle counts at the bound.
async fn bounded_cycles(client: &Client, tag: &str, samples: usize) -> Latency {
    let mut h = histogram();
    let (mut errors, mut timeouts) = (0, 0);
    for i in 0..samples {
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
    for which in Impl::ALL {
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
            let slow_op = match fault {
                "healthy" | "dead" | "majority dead" => false,
                // Ours decides without the slow node; the others wait for it.
                _ => which != Impl::Redlock,
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
                samples = samples.min(plan.redlock_rs_samples / 2).max(2);
            }
            let tag = format!("fault{n}:{}", fault.replace(' ', "-"));
            rows.push(FaultRow {
                n,
                fault: fault.to_owned(),
                implementation: which,
                cycle: bounded_cycles(client, &tag, samples).await,
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
