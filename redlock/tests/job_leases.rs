//! Leases for job runners on real nodes: the fence token of a lease, `stop_renewal` (keep the
//! lock until its TTL, nothing deleted) and turning `max_hold` off.

mod common;

use std::time::{Duration, Instant};

use common::no_lock_keys_within;
use redlock::{FenceToken, LostReason, Redlock, RetryPolicy};
use redlock_testkit::Cluster;

fn client(cluster: &Cluster, ttl: Duration) -> redlock::RedlockBuilder {
    Redlock::builder()
        .nodes(cluster.urls())
        .ttl(ttl)
        .node_timeout(Duration::from_millis(100))
        .retry(RetryPolicy::deadline(Duration::from_secs(5)))
}

/// After `stop_renewal` the keys stay (dropping the returned lock deletes nothing), their PTTL
/// only counts down — no renewal re-arms them — and they are gone once the TTL has run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_renewal_leaves_the_key_counting_down() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_millis(900))
        .build()
        .unwrap();
    let guard = rl.lock("cron:slot").guard().await.unwrap();
    let lease = guard.lease();
    // A few renewals (every ~300 ms) happen first.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!lease.is_lost());
    let fence: FenceToken = lease.fence().expect("claims form a token");

    let lock = guard.stop_renewal();
    assert_eq!(lock.fence(), Some(fence));
    assert!(lock.remaining() > Duration::ZERO);
    let reason = tokio::time::timeout(Duration::from_secs(1), lease.lost())
        .await
        .expect("the lease's signal fires");
    assert!(matches!(reason, LostReason::RenewalStopped), "{reason}");
    drop(lock);

    // A renewal already in flight may still land: start reading a little later.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut last = common::pttls(&cluster, "redlock:lock:cron:slot").await;
    assert!(last.iter().all(|p| *p > 0), "keys gone at once: {last:?}");
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(500) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = common::pttls(&cluster, "redlock:lock:cron:slot").await;
        for (before, after) in last.iter().zip(&now) {
            assert!(
                *after == -2 || after <= before,
                "re-armed after stop_renewal: {last:?} -> {now:?}"
            );
        }
        last = now;
    }
    // Nobody renews: the keys expire with their TTL.
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
}

/// The lock `stop_renewal` returns can still be released early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_after_stop_renewal_can_be_released() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_secs(10)).build().unwrap();
    let lock = rl.lock("keep").guard().await.unwrap().stop_renewal();
    assert_eq!(lock.resources(), ["keep"]);
    let report = rl.release(lock).await.unwrap();
    // A quorum no longer holds the key: deleted there, or never asked (a node whose
    // connection was still opening when the others granted the lock is spared, and reported
    // as holding nothing; seen in CI even after `connect()`, whose connect timeout a loaded
    // machine can outlast). The rest of the deletes go on after the release returns.
    assert!(report.released() >= 1, "{report:?}");
    assert!(
        report.released() + report.not_held() >= rl.quorum(),
        "{report:?}"
    );
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
}

/// With `no_max_hold()` a guard keeps renewing past the limit `max_hold` set before it; the
/// same client without it loses the lock at `MaxHold`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_max_hold_keeps_renewing_past_the_limit() {
    let cluster = Cluster::start(3).await.unwrap();
    let ttl = Duration::from_millis(600);
    let limited = client(&cluster, ttl)
        .max_hold(Duration::from_millis(500))
        .build()
        .unwrap();
    let unlimited = client(&cluster, ttl)
        .max_hold(Duration::from_millis(500))
        .no_max_hold()
        .build()
        .unwrap();

    let capped = limited.lock("capped").guard().await.unwrap();
    let free = unlimited.lock("free").guard().await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), capped.lost())
        .await
        .expect("max hold fires");
    assert!(matches!(reason, LostReason::MaxHold), "{reason}");

    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!free.is_lost(), "{:?}", free.reason());
    for pttl in common::pttls(&cluster, "redlock:lock:free").await {
        assert!((1..=600).contains(&pttl), "PTTL {pttl}");
    }
    free.release().await.unwrap();
    drop(capped);
    assert_eq!(unlimited.config().max_hold, Duration::MAX);
}

/// A renewal round that two nodes fail (reset) stays open, and its calls to them are sent again
/// after each retry gap while the round is undecided. Those calls went on after
/// `stop_renewal` (and after a release or the max hold, for whatever locks the call carried):
/// once the nodes came back, the next one re-armed the keys there, although the lock had been
/// handed back as plain data long before (found in review). A call is sent only for the locks
/// of its round that have not ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_renewal_is_sent_after_stop_renewal_returns() {
    let cluster = common::proxied(3).await;
    let ttl = Duration::from_secs(3);
    let rl = client(&cluster, ttl).build().unwrap();
    let key = "redlock:lock:stopped-mid-round";
    let taken = Instant::now();
    let guard = rl.lock("stopped-mid-round").guard().await.unwrap();
    let slack = taken.elapsed() + Duration::from_millis(200);
    for i in [1, 2] {
        cluster.node(i).proxy().unwrap().partition();
    }
    // The first renewal is due about 800–1,000 ms in; node 0 runs it, nodes 1 and 2 reset it.
    let before = cluster.node(0).command_calls("evalsha").await;
    let renewing = common::eventually(Duration::from_secs(2), || async {
        cluster.node(0).command_calls("evalsha").await > before
    })
    .await;
    assert!(renewing, "no renewal reached node 0");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lock = guard.stop_renewal();
    // Anything already on its way to nodes 1 and 2 fails while they stay cut off (the retry
    // gap is about 250 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in [1, 2] {
        cluster.node(i).proxy().unwrap().heal();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Counting down from the acquire: at most the TTL less the time since (read before the
    // keys are).
    let most = i64::try_from((ttl + slack).saturating_sub(taken.elapsed()).as_millis()).unwrap();
    let pttls = common::pttls(&cluster, key).await;
    println!("PTTL {pttls:?}, at most {most} ms unless re-armed");
    // The acquire's quorum granted on node 0 and on node 1 or 2 (the other's grant may have
    // been cut off by the partition): one of them still counts down.
    assert!(
        pttls[1] > 0 || pttls[2] > 0,
        "no key left on nodes 1 and 2 to check: {pttls:?}"
    );
    for i in [1, 2] {
        assert!(
            pttls[i] <= most,
            "node {i}'s key was re-armed after stop_renewal returned: PTTL {pttls:?}, at most \
             {most} ms"
        );
    }
    // Cleanup only (the keys expire with their TTL anyway): the client's connections to nodes
    // 1 and 2 were reset and may not have been replaced yet (a CI run failed here, "broken
    // pipe" from both, with node 0 slow).
    let _ = rl.release(lock).await;
}
