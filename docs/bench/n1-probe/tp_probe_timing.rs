// Scratch probe (not committed): 64 tasks cycling on distinct keys against one node, this
// crate then a raw floor, MODE=redlock|floor, SECS seconds.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlock::Redlock;
use redlock_testkit::Cluster;
use redlock_testkit::redis;

fn main() {
    let ei: u32 = std::env::var("EI").ok().and_then(|s| s.parse().ok()).unwrap_or(61);
    tokio::runtime::Builder::new_multi_thread().worker_threads(std::env::var("WT").ok().and_then(|s| s.parse().ok()).unwrap_or(2)).event_interval(ei).enable_all().build().unwrap().block_on(amain());
}
async fn amain() {
    let mode = std::env::var("MODE").unwrap_or_else(|_| "redlock".into());
    let secs: u64 = std::env::var("SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let n: usize = std::env::var("N").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let cluster = Cluster::start(n).await.unwrap();
    let ops = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    if mode == "redlock" {
        let mut b = Redlock::builder().nodes(cluster.urls()).ttl(Duration::from_secs(10));
        if std::env::var("STAMPS").is_ok() { b = b.claim_stamps(false); }
        if std::env::var("ONCE").is_ok() { b = b.retry(redlock::RetryPolicy::once()); }
        let rl = b.build().unwrap();
        rl.connect().await;
        for t in 0..std::env::var("TASKS").ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(64) {
            let (rl, ops) = (rl.clone(), ops.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < stop {
                    let r = format!("p:{t}:{}", i % 64);
                    i += 1;
                    if let Ok(l) = rl.acquire(&r).await { let _ = rl.release(l).await; ops.fetch_add(1, Ordering::Relaxed); }
                }
            }));
        }
    } else {
        let mut conns = Vec::new();
        for u in cluster.urls() {
            let c = redis::Client::open(u).unwrap();
            conns.push(c.get_multiplexed_async_connection().await.unwrap());
        }
        let script = redis::Script::new("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end");
        for t in 0..std::env::var("TASKS").ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(64) {
            let (conns, ops, script) = (conns.clone(), ops.clone(), script.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < stop {
                    let k = format!("p:{t}:{}", i % 64);
                    let tok = format!("{:032x}", i ^ (t as u64) << 40);
                    i += 1;
                    let hop = std::env::var("HOP").is_ok();
                    let fs = conns.iter().map(|c| { let mut c = c.clone(); let (k, tok) = (k.clone(), tok.clone()); async move {
                        let f = async move { let r: Option<String> = redis::cmd("SET").arg(&k).arg(&tok).arg("NX").arg("PX").arg(10000).query_async(&mut c).await.unwrap(); r };
                        if hop { tokio::spawn(f).await.unwrap() } else { f.await } } });
                    let _ = futures_util::future::join_all(fs).await;
                    let fs = conns.iter().map(|c| { let mut c = c.clone(); let (k, tok, s) = (k.clone(), tok.clone(), script.clone()); async move {
                        let f = async move { let _: i64 = s.key(&k).arg(&tok).invoke_async(&mut c).await.unwrap(); };
                        if hop { tokio::spawn(f).await.unwrap() } else { f.await } } });
                    let _ = futures_util::future::join_all(fs).await;
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    let t0 = Instant::now();
    for t in tasks { t.await.unwrap(); }
    let g = |i: usize| redlock::SCRATCH[i].load(Ordering::Relaxed);
    eprintln!("direct {} batches {} batched reqs {} (avg {:.1}) takeovers {}", g(0), g(1), g(2), g(2) as f64 / g(1).max(1) as f64, g(3));
    for u in cluster.urls() {
        let c = redis::Client::open(u).unwrap();
        let mut c = c.get_multiplexed_async_connection().await.unwrap();
        let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
        for l in info.lines().filter(|l| l.contains("evalsha") || l.contains("cmdstat_set:")) { eprintln!("{l}"); }
        let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut c).await.unwrap();
        for l in info.lines().filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:")) { eprintln!("{l}"); }
    }
    eprintln!("per batch: rtt {:.1} us, dispatch {:.1} us, yield {:.1} us", g(20) as f64 / g(23).max(1) as f64 / 1e3, g(21) as f64 / g(23).max(1) as f64 / 1e3, g(22) as f64 / g(23).max(1) as f64 / 1e3);
    eprintln!("hist by 8s: {:?}", (4..24).map(g).collect::<Vec<_>>());
    println!("{mode} N={n}: {:.0} ops/s", ops.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64());
}
