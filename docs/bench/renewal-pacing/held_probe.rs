//! Scratch probe: 100,000 locks taken by one client with 64 acquisitions in flight (N = 5,
//! TTL 10 s) and guarded, as the bench's held-locks scenario does; prints why acquisitions
//! fail and how acquire latency moves once renewals start.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use redlock::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

#[tokio::main]
async fn main() {
    let locks: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let cluster = Cluster::start(5).await.expect("cluster");
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(10))
        .retry(RetryPolicy::once())
        .build()
        .expect("client");
    rl.connect().await;
    let t0 = Instant::now();
    // Per 0.5 s bucket: (acquires, failures, max latency µs, latencies).
    let buckets: Arc<Mutex<BTreeMap<u64, (u64, u64, Vec<u64>)>>> = Arc::default();
    let errors: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let guards: Vec<_> = stream::iter(0..locks)
        .map(|i| {
            let (rl, buckets, errors) = (rl.clone(), Arc::clone(&buckets), Arc::clone(&errors));
            async move {
                let start = Instant::now();
                let r = rl.try_acquire(&format!("probe:{i}")).await;
                let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
                let bucket = (start - t0).as_millis() as u64 / 500;
                {
                    let mut b = buckets.lock().unwrap();
                    let e = b.entry(bucket).or_default();
                    e.0 += 1;
                    e.2.push(us);
                    if r.is_err() {
                        e.1 += 1;
                    }
                }
                match r {
                    Ok(lock) => rl.guard(lock).ok(),
                    Err(e) => {
                        let text = e.to_string();
                        let msg = format!("{} nodes timed out", text.matches("timed out").count());
                        *errors.lock().unwrap().entry(msg).or_default() += 1;
                        None
                    }
                }
            }
        })
        .buffer_unordered(64)
        .filter_map(|g| async move { g })
        .collect()
        .await;
    println!(
        "{} of {locks} held in {:.2} s",
        guards.len(),
        t0.elapsed().as_secs_f64()
    );
    for (b, (n, failed, mut lat)) in std::mem::take(&mut *buckets.lock().unwrap()) {
        lat.sort_unstable();
        let p = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
        println!(
            "t={:>4.1}s acquires {n:>6} failed {failed:>5} p50 {:>6} µs p99 {:>6} µs max {:>6} µs",
            b as f64 / 2.0,
            p(0.5),
            p(0.99),
            lat.last().copied().unwrap_or(0)
        );
    }
    for (msg, n) in errors.lock().unwrap().iter() {
        println!("{n:>6} × {msg}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    println!("lost after 2 s more: {lost}");
    stream::iter(guards)
        .map(|g| async move {
            let _ = g.release().await;
        })
        .buffer_unordered(64)
        .collect::<()>()
        .await;
}
