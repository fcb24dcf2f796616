//! The renewal's repair (putting back keys a node lost) raced against releases, with one node
//! answering late (real redis-server processes behind fault proxies).

mod common;

use std::time::Duration;

use redlock::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

fn builder(urls: Vec<String>, ttl: Duration) -> redlock::RedlockBuilder {
    Redlock::builder()
        .nodes(urls)
        .ttl(ttl)
        .node_timeout(Duration::from_millis(200))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(5))
                .with_delay(Duration::from_millis(20), Duration::from_millis(20)),
        )
}

/// Every lock key on every node, with its value.
async fn leftovers(cluster: &Cluster, key: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        if let Some(v) = common::get(cluster, i, key).await {
            out.push((i, v));
        }
    }
    out
}

/// A guard's own release racing renewals that keep repairing a node (its key is deleted behind
/// the client's back before every round, and the node answers after the quorum): once the
/// release returned, no repair may put the key back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_release_racing_repairs_leaves_no_key() {
    let cluster = Cluster::builder()
        .nodes(3)
        .proxied(true)
        .start()
        .await
        .unwrap();
    let rl = builder(cluster.urls(), Duration::from_secs(5))
        .renew_every(Duration::from_millis(10))
        .build()
        .unwrap();
    rl.connect().await;
    cluster
        .node(2)
        .proxy()
        .unwrap()
        .set_delay(Duration::from_millis(15), Duration::from_millis(5));
    let key = "redlock:lock:own";
    let mut bad = Vec::new();
    let mut repaired = 0;
    // 15 rounds cover every release delay below (0–12 ms) and every count of extra deletes.
    const ROUNDS: u64 = 15;
    for round in 0..ROUNDS {
        let guard = rl.guard(rl.acquire("own").await.unwrap()).unwrap();
        // The scenario is live: a key deleted on node 2 comes back by a repair.
        common::del(&cluster, 2, key).await;
        if common::eventually(Duration::from_millis(300), || async {
            common::get(&cluster, 2, key).await.is_some()
        })
        .await
        {
            repaired += 1;
        }
        for _ in 0..(round % 5) {
            common::del(&cluster, 2, key).await;
            tokio::time::sleep(Duration::from_millis(7)).await;
        }
        common::del(&cluster, 2, key).await;
        tokio::time::sleep(Duration::from_millis(round % 13)).await;
        guard.release().await.unwrap();
        // Longer than any repair in flight can take (budget + node timeout + grace).
        tokio::time::sleep(Duration::from_millis(400)).await;
        let left = leftovers(&cluster, key).await;
        if !left.is_empty() {
            bad.push((round, left.len()));
            for i in 0..3 {
                common::del(&cluster, i, key).await;
            }
        }
    }
    assert!(
        repaired > ROUNDS / 2,
        "repairs seen in only {repaired} of {ROUNDS} rounds"
    );
    assert!(
        bad.is_empty(),
        "keys left after release (round, nodes): {bad:?}"
    );
}

/// A guarded lock released by another client holding the same token (a hand-off), while one
/// node is slow for the guard's client: renewals that reached their quorum before the release's
/// deletes find the key missing on the slow node after them, and put it back.
///
/// The known problem of docs/leases.md ("Repair"): it fails, a key left on the slow node in
/// every round (5 of 5, in each of 4 runs). Run it with `--ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known problem (docs/leases.md, Repair): the repair cannot tell a release from data loss"]
async fn foreign_release_racing_a_renewal_leaves_a_key() {
    let cluster = Cluster::builder()
        .nodes(3)
        .proxied(true)
        .start()
        .await
        .unwrap();
    let a = builder(cluster.urls(), Duration::from_secs(5))
        .renew_every(Duration::from_millis(30))
        .build()
        .unwrap();
    a.connect().await;
    // B reaches the servers directly.
    let direct: Vec<String> = cluster.nodes().iter().map(|n| n.url()).collect();
    let b = builder(direct, Duration::from_secs(5)).build().unwrap();
    b.connect().await;
    cluster
        .node(2)
        .proxy()
        .unwrap()
        .set_delay(Duration::from_millis(60), Duration::ZERO);
    let key = "redlock:lock:handoff";
    let mut leaked = Vec::new();
    for round in 0..5u64 {
        let guard = a.guard(a.acquire("handoff").await.unwrap()).unwrap();
        let token = guard.token().clone();
        tokio::time::sleep(Duration::from_millis(100 + round * 7)).await;
        let lock = b.try_acquire_with_token(["handoff"], &token).await.unwrap();
        b.release(lock).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let left = leftovers(&cluster, key).await;
        drop(guard.stop_renewal());
        if !left.is_empty() {
            leaked.push((round, left.len()));
        }
        for i in 0..3 {
            common::del(&cluster, i, key).await;
        }
    }
    assert!(
        leaked.is_empty(),
        "keys left 500 ms after the release returned (round, nodes): {leaked:?}"
    );
}
