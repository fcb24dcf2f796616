//! Scratch probe: where one hand-off of a hot key between separate clients spends its time.
//! 8 clients (N = 5), each looping acquire → hold 1 ms (on a blocking thread, as the bench
//! does) → release, for a few seconds, with `MONITOR` on every node. Prints the clients'
//! events (wall-clock µs) to `events.txt`; the nodes' command streams go to `monitor-K.txt`.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redlock::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros()
}

#[tokio::main]
async fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let dir = std::env::args().nth(2).unwrap_or_else(|| ".".to_owned());
    let contenders: usize = std::env::args()
        .nth(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("recorder");
    let cluster = Cluster::start(5).await.expect("cluster");
    let mut clients = Vec::new();
    for _ in 0..contenders {
        let rl = Redlock::builder()
            .nodes(cluster.urls())
            .ttl(Duration::from_secs(10))
            .retry(RetryPolicy::deadline(Duration::from_secs(30)))
            .build()
            .expect("client");
        rl.connect().await;
        // Warm up: connections, scripts, subscriptions.
        let l = rl.acquire("probe:warm").await.expect("warm");
        rl.release(l).await.expect("warm release");
        clients.push(rl);
    }
    let mut monitors = Vec::new();
    let monitor = std::env::var_os("NO_MONITOR").is_none();
    for (k, url) in cluster.urls().iter().enumerate().filter(|_| monitor) {
        let port = url.rsplit(':').next().unwrap().trim_end_matches('/');
        let out = std::fs::File::create(format!("{dir}/monitor-{k}.txt")).unwrap();
        monitors.push(
            Command::new("redis-cli")
                .args(["-p", port, "monitor"])
                .stdout(Stdio::from(out))
                .spawn()
                .expect("redis-cli monitor"),
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events: Arc<Mutex<Vec<(u128, usize, &'static str)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(id, rl)| {
            let (events, stop) = (Arc::clone(&events), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    events.lock().unwrap().push((now_us(), id, "call"));
                    let lock = rl.acquire("probe:hot").await.expect("acquire");
                    events.lock().unwrap().push((now_us(), id, "won"));
                    tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(1)))
                        .await
                        .unwrap();
                    events.lock().unwrap().push((now_us(), id, "release"));
                    rl.release(lock).await.expect("release");
                    events.lock().unwrap().push((now_us(), id, "released"));
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for mut m in monitors {
        let _ = m.kill();
        let _ = m.wait();
    }
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        match value {
            metrics_util::debugging::DebugValue::Histogram(h) => {
                let v: Vec<f64> = h.into_iter().map(|x| x.into_inner()).collect();
                let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
                let nonzero = v.iter().filter(|x| **x > 0.0).count();
                println!(
                    "{name}: {} values, mean {mean:.3}, {nonzero} above 0",
                    v.len()
                );
            }
            metrics_util::debugging::DebugValue::Counter(n) => println!("{name}: {n}"),
            metrics_util::debugging::DebugValue::Gauge(_) => {}
        }
    }
    let mut f = std::fs::File::create(format!("{dir}/events.txt")).unwrap();
    for (t, id, what) in events.lock().unwrap().iter() {
        writeln!(f, "{t} {id} {what}").unwrap();
    }
    for (k, url) in cluster.urls().iter().enumerate() {
        writeln!(f, "# node {k} {url}").unwrap();
    }
}
