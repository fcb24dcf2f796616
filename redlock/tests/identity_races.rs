//! Node identity changes (a server losing its data) under load: requests queued on the old
//! connection must not overtake or be overtaken by requests on the new one so that a key is
//! left behind (real redis-server processes).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redlock::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

async fn flushall(cluster: &Cluster, i: usize) {
    let mut c = cluster.node(i).connection().await.unwrap();
    let () = redlock_testkit::redis::cmd("FLUSHALL")
        .query_async(&mut c)
        .await
        .unwrap();
}

async fn churn(stamps: bool, multi: bool) -> (Vec<(usize, String)>, u64, u64) {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_millis(200))
        .claim_stamps(stamps)
        .renew_every(Duration::from_millis(20))
        .retry(RetryPolicy::once())
        .build()
        .unwrap();
    rl.connect().await;
    let stop = Arc::new(AtomicBool::new(false));
    let (locks, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for t in 0..64u64 {
        let (rl, stop, locks, failed) = (
            rl.clone(),
            Arc::clone(&stop),
            Arc::clone(&locks),
            Arc::clone(&failed),
        );
        tasks.push(tokio::spawn(async move {
            let mut k = 0u64;
            while !stop.load(Ordering::SeqCst) {
                k += 1;
                let resources: Vec<String> = if multi && k.is_multiple_of(2) {
                    vec![format!("m-{t}-{k}-a"), format!("m-{t}-{k}-b")]
                } else {
                    vec![format!("s-{t}-{k}")]
                };
                if let Ok(lock) = rl.try_acquire_many(resources).await {
                    locks.fetch_add(1, Ordering::Relaxed);
                    let released = if k.is_multiple_of(3) {
                        // Guarded a while: renewals (and repairs after a data loss) race
                        // the release.
                        let guard = rl.guard(lock).unwrap();
                        tokio::time::sleep(Duration::from_millis(k % 50)).await;
                        guard.release().await
                    } else {
                        rl.release(lock).await
                    };
                    if released.is_err() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        flushall(&cluster, 0).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    // Longer than any cleanup or late release takes (budgets, grace, release_again_later).
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let left = common::lock_keys(&cluster).await;
    let info = common::info(&cluster, 0, "stats").await;
    let conns = info
        .lines()
        .find(|l| l.starts_with("total_connections_received"))
        .unwrap_or("")
        .to_owned();
    eprintln!("node 0 {conns}");
    eprintln!(
        "stamps {stamps} multi {multi}: {} locks, {} failed releases, {} keys left",
        locks.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        left.len()
    );
    (
        left,
        locks.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    )
}

/// `churn`'s outcome: no lock key is left on any node.
fn no_key_left((left, locks, failed): (Vec<(usize, String)>, u64, u64)) {
    assert!(
        left.is_empty(),
        "{} keys left after {locks} locks released ({failed} releases failed): {:?}",
        left.len(),
        &left[..left.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_loss_under_load_leaves_no_key_stamped() {
    no_key_left(churn(true, false).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_loss_under_load_leaves_no_key_unstamped_mixed() {
    no_key_left(churn(false, true).await);
}

/// One server listed twice under two databases (`/0` and `/1`) is one server: a restart of it
/// takes both votes at once. It must be refused like one server under two spellings, or a
/// single restart without data hands a held lock to a second client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_databases_is_the_same_server() {
    let cluster = Cluster::start(2).await.unwrap();
    let (p0, p1) = (cluster.node(0).port(), cluster.node(1).port());
    let urls = vec![
        format!("redis://127.0.0.1:{p0}/0"),
        // Another spelling of the same address, as a DNS alias or a proxy would be.
        format!("redis://127.1:{p0}/1"),
        format!("redis://127.0.0.1:{p1}/0"),
    ];
    let build = || {
        Redlock::builder()
            .nodes(urls.clone())
            .ttl(Duration::from_secs(30))
            .node_timeout(Duration::from_millis(200))
            .retry(RetryPolicy::once())
            .build()
    };
    let (a, b) = match (build(), build()) {
        (Ok(a), Ok(b)) => (a, b),
        // Refused when built: nothing can be double granted.
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("refused at build: {e}");
            return;
        }
    };
    a.connect().await;
    b.connect().await;
    let held = match a.try_acquire("twice").await {
        Ok(lock) => lock,
        Err(redlock::Error::Config(e)) => {
            eprintln!("refused: {e}");
            return;
        }
        Err(e) => panic!("neither a grant nor a configuration error: {e}"),
    };
    cluster
        .node(0)
        .restart(redlock_testkit::DataOnRestart::Wipe)
        .await
        .unwrap();
    let mut rival = b.try_acquire("twice").await;
    for _ in 0..5 {
        if rival.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        rival = b.try_acquire("twice").await;
    }
    assert!(
        !(held.is_valid() && rival.is_ok()),
        "two holders at once: A's lock is valid for {:?} more and B was granted the same \
         resource after one server (two of the three nodes) restarted without its data",
        held.remaining()
    );
}
