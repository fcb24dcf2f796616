//! scratch: alternating batch modes in one process
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use redlock::{Redlock, RetryPolicy, BATCH_MODE};
use redlock_testkit::Cluster;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args[1].parse().unwrap();
    let tasks: usize = args[2].parse().unwrap();
    let modes: Vec<usize> = args[3].split(',').map(|m| m.parse().unwrap()).collect();
    let windows: usize = args.get(4).map(|w| w.parse().unwrap()).unwrap_or(20);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let c = Cluster::start(n).await.unwrap();
        let rl = Redlock::builder().nodes(c.urls()).ttl(Duration::from_secs(10)).retry(RetryPolicy::once()).build().unwrap();
        rl.connect().await;
        let count = Arc::new(AtomicU64::new(0));
        for t in 0..tasks {
            let (rl, count) = (rl.clone(), Arc::clone(&count));
            tokio::spawn(async move {
                let key = format!("k{t}");
                loop {
                    let lock = rl.try_acquire(&key).await.unwrap();
                    rl.release(lock).await.unwrap();
                    count.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut res: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        for w in 0..windows {
            for (i, &m) in modes.iter().enumerate() {
                let i = if w % 2 == 0 { i } else { modes.len() - 1 - i };
                let m = if w % 2 == 0 { m } else { modes[i] };
                BATCH_MODE.store(m, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
                let (c0, t0) = (count.load(Ordering::Relaxed), Instant::now());
                tokio::time::sleep(Duration::from_millis(400)).await;
                let ops = (count.load(Ordering::Relaxed) - c0) as f64 / t0.elapsed().as_secs_f64();
                res[i].push(ops);
            }
        }
        for (i, m) in modes.iter().enumerate() {
            let mut v = res[i].clone();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let ratios: Vec<f64> = res[i].iter().zip(&res[0]).map(|(a, b)| a / b).collect();
            let mut r = ratios.clone();
            r.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!("N={n} tasks={tasks} mode {m}: median {:.0} ops/s (min {:.0}, max {:.0}); per-window ratio to mode {} median {:.3} (p25 {:.3}, p75 {:.3})",
                v[v.len() / 2], v[0], v[v.len() - 1], modes[0], r[r.len() / 2], r[r.len() / 4], r[3 * r.len() / 4]);
        }
        // Stop the nodes before exiting: exit skips the cluster's drop.
        drop(c);
        std::process::exit(0);
    });
}
