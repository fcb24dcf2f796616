//! Per-lock options (`Redlock::lock` / `lock_many` → `LockRequest`) on real nodes: the TTL the
//! nodes get and renewals re-arm, waiting for a holder, several resources, and bad options.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, lock_keys, no_lock_keys_within};
use redlock::{ConfigError, Error, Redlock, ResourceError, RetryPolicy};
use redlock_testkit::Cluster;

/// Roomier than the protocol tests' node timeout: renewals must get through on a busy machine.
const NODE_TIMEOUT: Duration = Duration::from_millis(100);

fn client(cluster: &Cluster, ttl: Duration) -> redlock::RedlockBuilder {
    Redlock::builder()
        .nodes(cluster.urls())
        .ttl(ttl)
        .node_timeout(NODE_TIMEOUT)
        .retry(
            RetryPolicy::deadline(Duration::from_secs(10))
                .with_delay(Duration::from_millis(20), Duration::from_millis(20)),
        )
}

/// The PTTL of `key` on the nodes that hold it, after checking that a quorum of the three
/// holds it. A request decides at its quorum, so the third node's write may land a moment after
/// the call returns: its reading may still be -2 (no key).
async fn pttls(cluster: &Cluster, key: &str) -> Vec<i64> {
    let out = common::pttls(cluster, key).await;
    let held: Vec<i64> = out.iter().copied().filter(|p| *p != -2).collect();
    assert!(
        held.len() >= 2,
        "{key} held on fewer than a quorum: {out:?}"
    );
    held
}

/// A per-lock TTL is what the nodes get (`PX`), what `extend` re-arms, and what the renewal
/// driver re-arms — not the client's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_lock_ttl_reaches_the_keys_and_renewals() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_secs(10)).build().unwrap();

    let mut lock = rl
        .lock("ttl-a")
        .ttl(Duration::from_millis(2000))
        .acquire()
        .await
        .unwrap();
    assert_eq!(lock.ttl(), Duration::from_millis(2000));
    assert!(lock.remaining() <= Duration::from_millis(2000));
    for pttl in pttls(&cluster, "redlock:lock:ttl-a").await {
        assert!(
            (1000..=2000).contains(&pttl),
            "PTTL {pttl} after a 2 s acquire"
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    rl.extend(&mut lock).await.unwrap();
    for pttl in pttls(&cluster, "redlock:lock:ttl-a").await {
        assert!(
            (1500..=2000).contains(&pttl),
            "PTTL {pttl} after a 2 s extend"
        );
    }
    rl.release(lock).await.unwrap();

    // A guarded 600 ms lock, held for 1.8 s: every reading stays within its own TTL, and the
    // key is still there at the end (renewed, not re-armed with the client's 10 s).
    let guard = rl
        .lock("ttl-b")
        .ttl(Duration::from_millis(600))
        .guard()
        .await
        .unwrap();
    assert_eq!(guard.ttl(), Duration::from_millis(600));
    let until = Instant::now() + Duration::from_millis(1800);
    let mut readings = 0;
    while Instant::now() < until {
        for pttl in pttls(&cluster, "redlock:lock:ttl-b").await {
            assert!(
                (1..=600).contains(&pttl),
                "PTTL {pttl} of a guarded 600 ms lock"
            );
        }
        readings += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(readings >= 5);
    assert!(!guard.is_lost(), "lost: {:?}", guard.reason());
    guard.release().await.unwrap();
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
}

/// A lock's own minimum validity holds for its renewals too: a short lock taken with
/// `min_validity(ZERO)` on a client whose minimum validity is longer than that lock's TTL keeps
/// being renewed (held to the client's 4 s, every renewal of a 1 s lock would be
/// `ValidityExhausted` and the lock would expire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_the_locks_own_min_validity() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_secs(10))
        .min_validity(Duration::from_secs(4))
        .build()
        .unwrap();
    // Without its own minimum validity, the client's 4 s does not fit in a 1 s TTL.
    let e = rl
        .lock("minv")
        .ttl(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Config(ConfigError::InvalidTtl { .. })),
        "{e}"
    );
    let guard = rl
        .lock("minv")
        .ttl(Duration::from_secs(1))
        .min_validity(Duration::ZERO)
        .guard()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!guard.is_lost(), "lost: {:?}", guard.reason());
    for pttl in pttls(&cluster, "redlock:lock:minv").await {
        assert!((1..=1000).contains(&pttl), "PTTL {pttl}");
    }
    guard.release().await.unwrap();
}

/// `.wait(d)` while another client holds the lock: `Busy` after about `d` (not at once, not
/// after the client's 10 s policy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_returns_busy_after_about_the_wait() {
    let cluster = Cluster::start(3).await.unwrap();
    let holder = client(&cluster, Duration::from_secs(10)).build().unwrap();
    let waiter = client(&cluster, Duration::from_secs(10)).build().unwrap();
    let held = holder.acquire("wait-busy").await.unwrap();

    let started = Instant::now();
    let e = waiter
        .lock("wait-busy")
        .wait(Duration::from_millis(700))
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(e.is_busy(), "{e}");
    // The last attempt starts no later than the wait (one retry delay of 10–30 ms before it).
    assert!(took >= Duration::from_millis(600), "gave up after {took:?}");
    assert!(took < Duration::from_secs(5), "waited {took:?}");

    // `Duration::ZERO` is one attempt.
    let e = waiter
        .lock("wait-busy")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(e.is_busy(), "{e}");
    holder.release(held).await.unwrap();
}

/// `.wait(d)` succeeds when the holder releases within `d`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_succeeds_when_the_holder_releases_within_it() {
    let cluster = Cluster::start(3).await.unwrap();
    let holder = client(&cluster, Duration::from_secs(10)).build().unwrap();
    let waiter = client(&cluster, Duration::from_secs(10)).build().unwrap();
    let held = holder.acquire("wait-free").await.unwrap();
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        holder.release(held).await.unwrap();
    });
    let started = Instant::now();
    let lock = waiter
        .lock("wait-free")
        .ttl(Duration::from_secs(3))
        .wait(Duration::from_secs(8))
        .acquire()
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(350),
        "acquired while held? {took:?}"
    );
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert_eq!(lock.ttl(), Duration::from_secs(3));
    releaser.await.unwrap();
    waiter.release(lock).await.unwrap();
}

/// `with_lock` on several resources with options: every key gets the lock's TTL, the lock is
/// renewed past it while the work runs, and every key is gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_on_many_resources_with_options() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_secs(10)).build().unwrap();
    let rival = client(&cluster, Duration::from_secs(10)).build().unwrap();
    let probe = cluster.node(0);
    let out = rl
        .lock_many(["many-a", "many-b", "many-c"])
        .ttl(Duration::from_millis(700))
        .wait(Duration::from_secs(2))
        .retry(RetryPolicy::attempts(3))
        .with_lock(|lease| async move {
            // The lock is held once a quorum (2 of 3) granted: node 0's grant may still be on
            // its way (seen in CI against Valkey: no key yet). It must land soon after.
            let granted = || async {
                let keys = probe.keys_with_pttl("redlock:lock:many-*").await.unwrap();
                keys.len() == 3
            };
            eventually(Duration::from_millis(500), granted).await;
            let keys = probe.keys_with_pttl("redlock:lock:many-*").await.unwrap();
            assert_eq!(keys.len(), 3, "{keys:?}");
            assert!(
                keys.iter().all(|(_, pttl)| (1..=700).contains(pttl)),
                "{keys:?}"
            );
            // Outlive the TTL twice: renewals keep it.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let busy = rival.try_acquire("many-b").await;
            assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
            let keys = probe.keys_with_pttl("redlock:lock:many-*").await.unwrap();
            assert_eq!(keys.len(), 3, "{keys:?}");
            assert!(
                keys.iter().all(|(_, pttl)| (1..=700).contains(pttl)),
                "{keys:?}"
            );
            lease.resources().to_vec()
        })
        .await
        .unwrap();
    assert_eq!(out, ["many-a", "many-b", "many-c"]);
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
}

/// Unusable options are typed errors and nothing reaches the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_options_are_typed_errors_and_send_nothing() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_secs(10)).build().unwrap();
    let invalid_ttl = |e: &Error| matches!(e, Error::Config(ConfigError::InvalidTtl { .. }));

    let e = rl
        .lock("bad")
        .ttl(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(invalid_ttl(&e), "{e}");
    // Not above the node timeout (100 ms).
    let e = rl
        .lock("bad")
        .ttl(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap_err();
    assert!(invalid_ttl(&e), "{e}");
    assert!(e.to_string().contains("node timeout"), "{e}");
    let e = rl
        .lock("bad")
        .ttl(Duration::from_secs(400 * 24 * 3600))
        .guard()
        .await
        .unwrap_err();
    assert!(invalid_ttl(&e), "{e}");
    let e = rl
        .lock("bad")
        .min_validity(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap_err();
    assert!(invalid_ttl(&e), "{e}");
    let mut unbounded = RetryPolicy::default();
    unbounded.max_attempts = None;
    let e = rl.lock("bad").retry(unbounded).acquire().await.unwrap_err();
    assert!(
        matches!(e, Error::Config(ConfigError::InvalidRetry(_))),
        "{e}"
    );
    let many: Vec<String> = (0..=redlock::MAX_RESOURCES_PER_LOCK)
        .map(|i| format!("r{i}"))
        .collect();
    let e = rl
        .lock_many(&many)
        .ttl(Duration::from_secs(1))
        .with_lock(|_| async {})
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidResource(ResourceError::TooMany { .. })),
        "{e}"
    );
    assert!(lock_keys(&cluster).await.is_empty());
}
