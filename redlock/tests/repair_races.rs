//! The renewal's repair (putting back keys a node lost) raced against releases, with one node
//! answering late (real redis-server processes behind fault proxies).

mod common;

use std::time::{Duration, Instant};

use redlock::{Error, LockGuard, NodeErrorKind, NodeOutcome, Redlock, RetryPolicy};
use redlock_testkit::{Cluster, DataOnRestart};

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

/// A client with a restart quarantine (TTL 3 s), connected, once its servers are out of the
/// quarantine they start in (new servers are quarantined too). Resource "blocker" is held by
/// someone else on nodes 1 and 2, so that every attempt on it reports node 0's outcome.
async fn quarantining(cluster: &Cluster, quarantine: Duration) -> Redlock {
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(3))
        .node_timeout(Duration::from_millis(200))
        .restart_quarantine(quarantine)
        .retry(RetryPolicy::once())
        .build()
        .unwrap();
    rl.connect().await;
    for i in 1..3 {
        common::set(cluster, i, "redlock:lock:blocker", "someone").await;
    }
    tokio::time::sleep(quarantine + Duration::from_millis(1100)).await;
    rl
}

/// Node 0's outcome for an attempt on "blocker".
async fn node_0(rl: &Redlock) -> NodeOutcome {
    let err: Error = rl
        .try_acquire("blocker")
        .await
        .expect_err("nodes 1 and 2 hold it");
    err.nodes()[0].outcome.clone()
}

fn failed_with(outcome: &NodeOutcome, kind: NodeErrorKind) -> bool {
    matches!(outcome, NodeOutcome::Failed(e) if e.kind() == kind)
}

/// Waits (up to the quarantine + 3 s after node 0's restart) for node 0 to hold the keys of
/// both guards again, put back by their renewals; then pauses node 1 for longer than the TTL,
/// which a guard on all three nodes survives and one on a bare quorum does not. Asserts that
/// node 0 got both keys back.
async fn both_put_back(
    cluster: &Cluster,
    quarantine: Duration,
    restarted: Instant,
    guards: [&LockGuard; 2],
) {
    let on_node_0 = || async {
        [
            common::get(cluster, 0, "redlock:lock:before")
                .await
                .is_some(),
            common::get(cluster, 0, "redlock:lock:during")
                .await
                .is_some(),
        ]
    };
    let both = common::eventually(quarantine + Duration::from_secs(3), || async {
        on_node_0().await == [true, true]
    })
    .await;
    let keys = on_node_0().await;
    println!(
        "{:?} after the restart: keys of 'before' and 'during' on node 0: {keys:?}",
        restarted.elapsed()
    );
    cluster.node(1).pause();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    cluster.node(1).resume();
    let lost = guards.map(|g| g.reason());
    println!("after node 1 paused for 3.5 s, 'before' and 'during' lost: {lost:?}");
    assert!(
        both,
        "node 0 did not get the guards' keys back after its quarantine ('before', 'during': \
         {keys:?}); lost to one more node's pause: {lost:?}"
    );
}

/// A guard whose acquire node 0 refused in its restart quarantine must be put back on node 0
/// once the quarantine ends, like a guard taken before the restart. The client records, per
/// lock and node, whether the lock's requests left it (so that a release can spare a node they
/// never reached); a refusal was recorded as final, and every later put-back to node 0 was
/// refused as withdrawn: the guard stayed on a bare quorum and was lost to one more node's
/// pause that the other guard survived (10 of 10 runs in review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_refused_by_the_quarantine_does_not_block_later_repairs() {
    let cluster = Cluster::start(3).await.unwrap();
    let quarantine = Duration::from_millis(1500);
    let rl = quarantining(&cluster, quarantine).await;
    let before = rl.guard(rl.try_acquire("before").await.unwrap()).unwrap();
    cluster.node(0).restart(DataOnRestart::Wipe).await.unwrap();
    let restarted = Instant::now();
    let mut seen = false;
    for _ in 0..20 {
        if failed_with(&node_0(&rl).await, NodeErrorKind::Quarantined) {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen, "node 0 never reported its quarantine");
    let during = rl.guard(rl.try_acquire("during").await.unwrap()).unwrap();
    both_put_back(&cluster, quarantine, restarted, [&before, &during]).await;
}

/// The same through a put-back: node 0 is down when the guard is taken (its acquire never
/// reaches a connection), then comes back empty and in its restart quarantine, which refuses
/// the first put-back. That refusal must not keep the later ones from node 0 (5 of 5 runs
/// failed in review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_refused_by_the_quarantine_does_not_block_the_later_ones() {
    let cluster = Cluster::start(3).await.unwrap();
    let quarantine = Duration::from_millis(3000);
    let rl = quarantining(&cluster, quarantine).await;
    let before = rl.guard(rl.try_acquire("before").await.unwrap()).unwrap();
    cluster.node(0).kill();
    for _ in 0..50 {
        if failed_with(&node_0(&rl).await, NodeErrorKind::Connect) {
            break;
        }
    }
    let during = rl.guard(rl.try_acquire("during").await.unwrap()).unwrap();
    cluster.node(0).restart(DataOnRestart::Wipe).await.unwrap();
    let restarted = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!(
        "node 0 {:?} after the restart: {:?}",
        restarted.elapsed(),
        node_0(&rl).await
    );
    both_put_back(&cluster, quarantine, restarted, [&before, &during]).await;
}
