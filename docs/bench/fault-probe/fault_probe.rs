//! Scratch: hot key between separate clients with one node hung (SIGSTOP) or dead.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlock::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let contenders: usize = args[1].parse().unwrap();
    let fault: &str = &args[2]; // none | hang:K | kill:K
    let secs: u64 = args.get(3).map_or(3, |s| s.parse().unwrap());
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("recorder");
    let proxied = std::env::var_os("PROXIED").is_some();
    let cluster = Cluster::builder().nodes(5).proxied(proxied).start().await.expect("cluster");
    let mut clients: Vec<Redlock> = Vec::new();
    let mut far_proxies = Vec::new();
    let shared = std::env::var_os("SHARED").is_some();
    for i in 0..contenders {
        if shared && i > 0 {
            let c: Redlock = clients[0].clone();
            clients.push(c);
            continue;
        }
        let far_ms: u64 = std::env::var("FAR_CLIENT_MS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
        let urls = if i == 0 && far_ms > 0 {
            let mut urls = Vec::new();
            for node in cluster.nodes() {
                let p = redlock_testkit::FaultProxy::start(node.addr()).await.unwrap();
                p.set_delay(Duration::from_millis(far_ms), Duration::ZERO);
                urls.push(p.url());
                far_proxies.push(p);
            }
            urls
        } else {
            cluster.urls()
        };
        let rl = Redlock::builder()
            .nodes(urls)
            .ttl(Duration::from_secs(10))
            .retry(RetryPolicy::deadline(Duration::from_secs(30)))
            .build()
            .expect("client");
        rl.connect().await;
        let l = rl.acquire("probe:warm").await.expect("warm");
        rl.release(l).await.expect("warm release");
        clients.push(rl);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let wins = Arc::new(AtomicU64::new(0));
    let worst = Arc::new(AtomicU64::new(0));
    let before: u64 = std::env::var("BEFORE_MS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    if before > 0 {
        inject(&cluster, fault).await;
        tokio::time::sleep(Duration::from_millis(before)).await;
    }
    let per_client: Vec<Arc<AtomicU64>> = (0..contenders).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(id, rl)| {
            let (stop, wins, worst) = (Arc::clone(&stop), Arc::clone(&wins), Arc::clone(&worst));
            let mine = Arc::clone(&per_client[id]);
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let lock = rl.acquire("probe:hot").await.expect("acquire");
                    let w = t.elapsed();
                    worst.fetch_max(w.as_micros() as u64, Ordering::Relaxed);
                    if w > Duration::from_millis(150) {
                        println!("  long wait {:?} started at {:?}", w, t.duration_since(started));
                    }
                    wins.fetch_add(1, Ordering::Relaxed);
                    mine.fetch_add(1, Ordering::Relaxed);
                    tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(1)))
                        .await
                        .unwrap();
                    rl.release(lock).await.expect("release");
                }
            })
        })
        .collect();
    let before: u64 = std::env::var("BEFORE_MS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    if before == 0 { tokio::time::sleep(Duration::from_secs(1)).await; }
    println!("  fault at {:?}", started.elapsed());
    if before == 0 { inject(&cluster, fault).await; }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let el = started.elapsed().as_secs_f64();
    println!(
        "{contenders} clients, fault {fault}: {:.0} hand-offs/s, worst wait {} µs",
        wins.load(Ordering::Relaxed) as f64 / el,
        worst.load(Ordering::Relaxed)
    );
    println!("  wins per client: {:?}", per_client.iter().map(|w| w.load(Ordering::Relaxed)).collect::<Vec<_>>());
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = format!("{} {:?}", key.key().name(), key.key().labels().map(|l| format!("{}={}", l.key(), l.value())).collect::<Vec<_>>());
        match value {
            metrics_util::debugging::DebugValue::Histogram(h) => {
                let v: Vec<f64> = h.into_iter().map(|x| x.into_inner()).collect();
                let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
                let max = v.iter().cloned().fold(0.0, f64::max);
                let over = v.iter().filter(|x| **x > 0.1).count();
                println!("  {name}: {} values, mean {mean:.4}, max {max:.4}, {over} over 0.1", v.len());
            }
            metrics_util::debugging::DebugValue::Counter(n) => println!("  {name}: {n}"),
            metrics_util::debugging::DebugValue::Gauge(_) => {}
        }
    }
    for f in fault.split('+') {
        if let Some(k) = f.strip_prefix("hang:") {
            cluster.node(k.parse().unwrap()).resume();
        }
    }
}

async fn inject(cluster: &Cluster, fault: &str) {
    for f in fault.split('+') {
        if let Some(k) = f.strip_prefix("hang:") {
            cluster.node(k.parse().unwrap()).pause();
        } else if let Some(k) = f.strip_prefix("kill:") {
            cluster.node(k.parse().unwrap()).kill();
        } else if let Some(ms) = f.strip_prefix("slowfirst:") {
            let k = first_node(cluster, "probe:hot");
            println!("  first node of probe:hot: {k}");
            cluster.node(k).proxy().unwrap().set_delay(Duration::from_millis(ms.parse().unwrap()), Duration::ZERO);
        } else if let Some(k) = f.strip_prefix("slow:") {
            let (k, ms) = k.split_once(':').unwrap();
            cluster.node(k.parse().unwrap()).proxy().unwrap().set_delay(Duration::from_millis(ms.parse().unwrap()), Duration::ZERO);
        } else if let Some(k) = f.strip_prefix("black:") {
            cluster.node(k.parse().unwrap()).proxy().unwrap().blackhole();
        } else if let Some(k) = f.strip_prefix("restart:") {
            cluster.node(k.parse().unwrap()).restart(redlock_testkit::DataOnRestart::Wipe).await.unwrap();
        }
    }
}

/// The node racing attempts on `resource` ask first: the highest FNV-1a hash of the node's
/// normalised address and the resource (as `common::racing_first_node` in the tests).
fn first_node(cluster: &Cluster, resource: &str) -> usize {
    let fnv = |s: &str| {
        s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    };
    let urls = cluster.urls();
    (0..urls.len())
        .max_by_key(|&i| fnv(&format!("{}/0\n{resource}", urls[i].trim_start_matches("redis://"))))
        .unwrap()
}
