//! The main demo: starts a local 5-node cluster of real redis-server processes (in temp dirs, on
//! free loopback ports), then shows locks being taken, contended, surviving a minority of
//! faulty nodes, failing fast without a quorum, and released.
//!
//! Run it with `bash demo.sh` (installs redis-server when missing) or
//! `cargo run -p redlock-quorum --example demo`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock::{Error, NodeOutcome, Redlock, RetryPolicy};
use redlock_testkit::Cluster;

fn outcomes(err: &Error) -> String {
    err.nodes()
        .iter()
        .map(|n| format!("{}={}", n.node, short(&n.outcome)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn short(o: &NodeOutcome) -> &'static str {
    match o {
        NodeOutcome::Confirmed => "granted",
        NodeOutcome::Refused => "refused",
        NodeOutcome::Failed(_) => "error",
        NodeOutcome::TimedOut { .. } => "timeout",
        _ => "pending",
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("== starting 5 independent redis-server masters (each behind a fault proxy)");
    let cluster = Cluster::builder().nodes(5).proxied(true).start().await?;
    for url in cluster.urls() {
        println!("   {url}");
    }
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(10))
        .retry(
            RetryPolicy::attempts(50)
                .with_delay(Duration::from_millis(20), Duration::from_millis(20)),
        )
        .build()?;
    rl.connect().await;
    println!("   quorum = {} of {}", rl.quorum(), cluster.len());

    println!("\n== 1. take a lock");
    let t = Instant::now();
    let lock = rl.acquire("orders:42").await?;
    println!(
        "   acquired orders:42 in {:?}; token {} (redacted), valid for {:?}",
        t.elapsed(),
        lock.token(),
        lock.remaining()
    );
    for c in lock.claims() {
        println!("   claim stamp from {}: {}", c.node, c.stamp_us);
    }

    println!("\n== 2. a second owner is refused (Busy, with per-node detail)");
    match rl.try_acquire("orders:42").await {
        Err(e) if e.is_busy() => println!("   busy: {}", outcomes(&e)),
        other => println!("   unexpected: {other:?}"),
    }
    let report = rl.release(lock).await?;
    println!(
        "   released: deleted on {} nodes, {} still in flight",
        report.released(),
        report.unknown()
    );

    println!("\n== 3. contention: 4 workers x 5 jobs on one key, a plain counter under the lock");
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..4 {
        let rl = rl.clone();
        let done = Arc::clone(&done);
        workers.push(tokio::spawn(async move {
            for _ in 0..5 {
                let lock = rl.acquire("report:daily").await?;
                let before = done.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                done.store(before + 1, Ordering::SeqCst);
                println!("   worker {w} ran job #{}", before + 1);
                rl.release(lock).await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    println!(
        "   counter = {} (exactly 20: no lost update)",
        done.load(Ordering::SeqCst)
    );

    println!("\n== 4. a faulty minority does not stop the lock");
    cluster.node(0).pause();
    cluster
        .node(1)
        .proxy()
        .expect("proxied")
        .set_delay(Duration::from_millis(300), Duration::ZERO);
    let t = Instant::now();
    let lock = rl.try_acquire("cache:rebuild").await?;
    println!(
        "   node 0 paused, node 1 +300 ms: acquired in {:?} (no waiting for the slow pair)",
        t.elapsed()
    );
    rl.release(lock).await?;

    println!("\n== 5. without a quorum the answer is fast and definite");
    cluster.node(2).kill();
    let t = Instant::now();
    match rl.try_acquire("cache:rebuild").await {
        Err(e) if e.is_quorum_unreachable() => {
            println!(
                "   quorum unreachable after {:?}: {}",
                t.elapsed(),
                outcomes(&e)
            );
        }
        other => println!("   unexpected: {other:?}"),
    }
    cluster.node(0).resume();
    cluster.node(1).proxy().expect("proxied").heal();
    let lock = rl.acquire("cache:rebuild").await?;
    println!("   node 0 resumed, node 1 healed: acquired again with node 2 still dead");
    rl.release(lock).await?;

    println!("\n== 6. a job longer than the TTL under with_lock: renewed, then released");
    let short = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_millis(500))
        .retry(
            RetryPolicy::attempts(50)
                .with_delay(Duration::from_millis(20), Duration::from_millis(20)),
        )
        .build()?;
    let t = Instant::now();
    let kept = short
        .with_lock("nightly:report", |lease| async move {
            tokio::time::sleep(Duration::from_millis(1600)).await;
            !lease.is_lost()
        })
        .await?;
    println!(
        "   a 1.6 s job under a 500 ms TTL finished after {:?}; lock held throughout: {kept}",
        t.elapsed()
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = cluster.keys("redlock:lock:*").await;
    println!("\n== done: lock keys left on the nodes: {}", left.len());
    Ok(())
}
