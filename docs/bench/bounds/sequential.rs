//! Sequential acquire + release on one node set, this crate or the raw floor, for profiling
//! (`strace -c -f`, `perf`). Run as an example of the redlock-quorum crate (copied to
//! redlock/examples/ for the run, then moved here):
//! `cargo build --release -p redlock-quorum --example sequential`, then
//! `NODES=redis://127.0.0.1:7301 SECS=4 target/release/examples/sequential redlock|floor`.
use std::time::{Duration, Instant};

use redlock::{Redlock, RetryPolicy};

fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    let nodes: Vec<String> = std::env::var("NODES").unwrap().split(',').map(String::from).collect();
    let secs: u64 = std::env::var("SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut lat = Vec::new();
        let t = Instant::now();
        if which == "floor" {
            let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
            let mut conns = Vec::new();
            for u in &nodes {
                let info = redis::IntoConnectionInfo::into_connection_info(u.as_str())
                    .unwrap()
                    .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
                conns.push(
                    redis::Client::open(info)
                        .unwrap()
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .unwrap(),
                );
            }
            let release = redis::Script::new(
                "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) else return 0 end",
            );
            while t.elapsed() < Duration::from_secs(secs) {
                let key = format!("f:{}", lat.len() % 1024);
                let mut bytes = [0u8; 16];
                getrandom::fill(&mut bytes).unwrap();
                let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                let s = Instant::now();
                let granted = futures_util::future::join_all(conns.iter().map(|c| {
                    let (mut c, key, token) = (c.clone(), &key, &token);
                    async move {
                        let r: Option<String> = redis::cmd("SET").arg(key).arg(token).arg("NX").arg("PX").arg(10_000).query_async(&mut c).await.unwrap();
                        r.is_some()
                    }
                }))
                .await;
                assert!(granted.iter().filter(|g| **g).count() > nodes.len() / 2);
                futures_util::future::join_all(conns.iter().map(|c| {
                    let (mut c, key, token, release) = (c.clone(), &key, &token, &release);
                    async move {
                        let _: i64 = release.key(key).arg(token).invoke_async(&mut c).await.unwrap();
                    }
                }))
                .await;
                lat.push(s.elapsed().as_micros());
            }
        } else {
            let rl = Redlock::builder()
                .nodes(nodes.clone())
                .ttl(Duration::from_secs(10))
                .retry(RetryPolicy::once())
                .build()
                .unwrap();
            rl.connect().await;
            while t.elapsed() < Duration::from_secs(secs) {
                let key = format!("p:{}", lat.len() % 1024);
                let s = Instant::now();
                let lock = rl.try_acquire(&key).await.unwrap();
                rl.release(lock).await.unwrap();
                lat.push(s.elapsed().as_micros());
            }
        }
        let n = lat.len();
        lat.sort_unstable();
        println!(
            "{which}: {n} cycles in {:.1} s, p50 {} µs, p99 {} µs",
            t.elapsed().as_secs_f64(),
            lat[n / 2],
            lat[n * 99 / 100]
        );
    });
}
