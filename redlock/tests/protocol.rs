//! The lock protocol against real redis-server processes: exclusion, faults, extend, release.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{NODE_TIMEOUT, client, eventually, get, lock_keys, no_lock_keys_within, set};
use redlock::{Error, GaveUp, NodeOutcome, RetryPolicy};
use redlock_testkit::Cluster;
use redlock_testkit::redis::AsyncCommands;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_keeps_a_plain_counter_exact() {
    let cluster = Cluster::start(5).await.unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    let counter_node = Arc::new(cluster.node(0).connection().await.unwrap());
    const TASKS: usize = 32;
    const ROUNDS: usize = 5;
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let rl = rl.clone();
        let mut conn = (*counter_node).clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lock = rl
                    .acquire("counter")
                    .await
                    .expect("acquire within the deadline");
                // Deliberately non-atomic read-modify-write with a yield in between.
                let v: Option<u64> = conn.get("plain-counter").await.unwrap();
                tokio::task::yield_now().await;
                let () = conn.set("plain-counter", v.unwrap_or(0) + 1).await.unwrap();
                assert!(lock.is_valid());
                rl.release(lock).await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let mut conn = (*counter_node).clone();
    let v: u64 = conn.get("plain-counter").await.unwrap();
    assert_eq!(v, (TASKS * ROUNDS) as u64);
    // A release returns at a quorum of deletes; the last node's may still be on its way.
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
}

async fn warm(rl: &redlock::Redlock) {
    warm_but(rl, &[]).await;
}

/// Opens `rl`'s connections; every node but those in `down` must confirm.
async fn warm_but(rl: &redlock::Redlock, down: &[usize]) {
    for (i, r) in rl.connect().await.into_iter().enumerate() {
        if !down.contains(&i) {
            assert_eq!(r.outcome, NodeOutcome::Confirmed, "{}", r.node);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_killed_paused_or_slow_node_of_five_does_not_stop_acquire() {
    let cluster = Cluster::builder()
        .nodes(5)
        .proxied(true)
        .start()
        .await
        .unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    warm(&rl).await;

    cluster.node(0).kill();
    let lock = rl.try_acquire("killed").await.expect("4 of 5 up");
    assert!(lock.claims().len() >= 3, "{lock:?}");
    rl.release(lock).await.unwrap();

    cluster.node(1).pause();
    let t = Instant::now();
    let lock = rl.try_acquire("paused").await.expect("paused minority");
    assert!(t.elapsed() < Duration::from_secs(1));
    rl.release(lock).await.unwrap();
    cluster.node(1).resume();

    // node 0 is dead; delay node 2 by 300 ms each way: the three others still make a quorum.
    // A client with a 500 ms node timeout, so that a busy machine does not time out one of
    // the three the quorum needs (a single attempt; 50 ms is thin for that); waiting for the
    // slow node would take that node timeout at least.
    let roomy = redlock::Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(5))
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("valid config");
    warm_but(&roomy, &[0]).await;
    cluster
        .node(2)
        .proxy()
        .unwrap()
        .set_delay(Duration::from_millis(300), Duration::ZERO);
    let t = Instant::now();
    let lock = roomy.try_acquire("slow").await.expect("slow minority");
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(400),
        "waited for the slow node: {took:?}"
    );
    let report = roomy.release(lock).await.unwrap();
    // A quorum no longer holds the key: deleted, or never reached (the dead node 0, whose
    // acquire waited for a connection that could not open, is spared and reported as holding
    // nothing). The release returns then; the rest of its deletes go on.
    assert!(report.released() >= 2, "{report:?}");
    assert!(report.released() + report.not_held() >= 3, "{report:?}");
    cluster.node(2).proxy().unwrap().heal();
    // The slow node's late grant is cleaned up by its queued release.
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(3)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_paused_fails_fast_and_leaves_no_key_after_resume() {
    let cluster = Cluster::start(5).await.unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    warm(&rl).await;
    for i in 0..3 {
        cluster.node(i).pause();
    }
    let t = Instant::now();
    let err = rl.try_acquire("majority").await.unwrap_err();
    let took = t.elapsed();
    for i in 0..3 {
        cluster.node(i).resume();
    }
    assert!(err.is_quorum_unreachable(), "{err}");
    // The nodes that hang cost their node timeout, not the client's 5 s TTL or a connect
    // timeout (1 s); the rest is room for a busy machine.
    assert!(
        took < NODE_TIMEOUT + Duration::from_millis(600),
        "took {took:?}, per-node timeout {NODE_TIMEOUT:?}"
    );
    // Each timed-out node names the budget that ran out (warm connections: the node
    // timeout), and the error keeps the acquire's history.
    let timed_out = err
        .nodes()
        .iter()
        .filter(|n| {
            n.outcome
                == NodeOutcome::TimedOut {
                    after: NODE_TIMEOUT,
                }
        })
        .count();
    // The three paused nodes (a healthy one that a busy machine slowed past the node timeout
    // would be a fourth).
    assert!(timed_out >= 3, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("timed out: no answer within {NODE_TIMEOUT:?}")),
        "{err}"
    );
    let retries = err.retries().expect("an acquire's history");
    assert_eq!(
        (retries.attempts, retries.gave_up),
        (1, GaveUp::SingleAttempt),
        "{err}"
    );
    // The paused nodes run the queued acquire and then the queued release, in order.
    assert!(
        no_lock_keys_within(&cluster, Duration::from_secs(3)).await,
        "keys left: {:?}",
        lock_keys(&cluster).await
    );
    // And the lock is free again.
    let lock = rl.try_acquire("majority").await.unwrap();
    rl.release(lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_an_expired_lock_is_not_an_error() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(cluster.urls(), Duration::from_millis(100));
    // Connections first: opening three inside a 100 ms TTL on a busy machine can use it up.
    warm(&rl).await;
    let lock = rl.try_acquire("short").await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(!lock.is_valid());
    let report = rl.release(lock).await.expect("expired release is fine");
    assert!(report.was_expired(), "{report:?}");
    assert!(report.not_held() >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_extend_leaves_the_lock_in_place() {
    let cluster = Cluster::start(5).await.unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    warm(&rl).await;
    let mut lock = rl.try_acquire("ext").await.unwrap();
    let token = lock.token().expose().to_owned();
    let before = lock.valid_until();

    for i in 0..3 {
        cluster.node(i).pause();
    }
    let err = rl.extend(&mut lock).await.unwrap_err();
    for i in 0..3 {
        cluster.node(i).resume();
    }
    assert!(err.is_quorum_unreachable(), "{err}");
    assert_eq!(lock.valid_until(), before);
    for i in 0..5 {
        assert_eq!(
            get(&cluster, i, "redlock:lock:ext").await.as_deref(),
            Some(&*token),
            "node {i}"
        );
    }

    // Someone else owns it on three nodes now: extend reports Lost and deletes nothing.
    for i in 0..3 {
        set(&cluster, i, "redlock:lock:ext", "someone-else").await;
    }
    let err = rl.extend(&mut lock).await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    for i in 3..5 {
        assert_eq!(
            get(&cluster, i, "redlock:lock:ext").await.as_deref(),
            Some(&*token)
        );
    }
    // A successful extend re-arms the TTL and moves the deadline forward.
    let mut ok = rl.try_acquire("ext2").await.unwrap();
    let first = ok.valid_until();
    tokio::time::sleep(Duration::from_millis(20)).await;
    rl.extend(&mut ok).await.unwrap();
    assert!(ok.valid_until() > first);
    rl.release(ok).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reacquiring_with_the_same_token_succeeds_and_others_stay_busy() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    let lock = rl.try_acquire("idem").await.unwrap();
    // As if the first outcome had been unknown: retry with the same token.
    let again = rl
        .try_acquire_with_token(["idem"], lock.token())
        .await
        .expect("re-arm our own token");
    assert_eq!(again.token(), lock.token());
    let other = rl.try_acquire("idem").await.unwrap_err();
    assert!(other.is_busy(), "{other}");
    rl.release(again).await.unwrap();
    // A release returns at a quorum of deletes; the last node's may still be on its way.
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_resource_locks_are_all_or_nothing_per_node() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    let ab = rl.try_acquire_many(["a", "b"]).await.unwrap();
    let err = rl.try_acquire_many(["b", "c"]).await.unwrap_err();
    assert!(err.is_busy(), "{err}");
    for i in 0..3 {
        assert_eq!(
            get(&cluster, i, "redlock:lock:c").await,
            None,
            "partial grant on node {i}"
        );
    }
    rl.release(ab).await.unwrap();
    let bc = rl.try_acquire_many(["b", "c"]).await.unwrap();
    rl.release(bc).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// A node that lost its script cache (`SCRIPT FLUSH`) does not run an acquire it gets as
/// `EVALSHA` (`NOSCRIPT`), and the client does not send it again later as `EVAL` — a late
/// re-send could run after this lock's own release and leave a key nobody owns. The vote is
/// lost for that attempt only: the scripts are reloaded, the next attempt is granted, and the
/// stamps keep increasing.
async fn script_cache_loss_costs_one_attempt_and_stamps_increase() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    let first = rl.try_acquire("s").await.unwrap();
    let stamps1: Vec<u64> = first.claims().iter().map(|c| c.stamp_us).collect();
    rl.release(first).await.unwrap();
    for i in 0..3 {
        let mut c = cluster.node(i).connection().await.unwrap();
        let () = redlock_testkit::redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    match rl.try_acquire("s").await {
        Err(Error::QuorumUnreachable { nodes, .. }) => {
            assert!(
                nodes
                    .iter()
                    .any(|n| n.outcome.to_string().contains("NOSCRIPT"))
            );
        }
        other => panic!("expected NOSCRIPT votes, got {other:?}"),
    }
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
    let second = rl
        .try_acquire("s")
        .await
        .expect("granted once the scripts are reloaded");
    let stamps2: Vec<u64> = second.claims().iter().map(|c| c.stamp_us).collect();
    assert_eq!(stamps1.len(), stamps2.len());
    for (a, b) in stamps1.iter().zip(&stamps2) {
        assert!(b > a, "stamps must increase per node: {a} then {b}");
    }
    rl.release(second).await.unwrap();
}

/// The scripts count stamps in Lua's doubles, exact below 2^53 only: from there `last + 1`
/// rounds back to `last`, and every grant on the node got the stamp of the one before (found
/// in review; a fence then takes two holders for one). A node whose stamp key reached the
/// limit must grant nothing, on its own (`ACQUIRE`) and in a batch (`BATCH`), leave no key
/// behind, and never lower its stamp key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_stamps_reached_2_53_grants_nothing() {
    const LAST: u64 = (1 << 53) - 1;
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    rl.connect().await;
    for i in 0..3 {
        set(&cluster, i, "redlock:stamp", &LAST.to_string()).await;
    }
    let mut granted: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    let mut refused = 0;
    let mut record = |what: &str, outcome: Result<redlock::Lock, Error>| match outcome {
        Ok(lock) => {
            for claim in lock.claims() {
                granted
                    .entry(claim.node.to_string())
                    .or_default()
                    .push(claim.stamp_us);
            }
            Some(lock)
        }
        Err(e) => {
            assert!(
                e.to_string().contains("claim stamps exhausted"),
                "{what}: refused for another reason: {e}"
            );
            refused += 1;
            None
        }
    };
    // One at a time: each acquire is its own script call.
    for r in ["one", "two", "three"] {
        if let Some(lock) = record(r, rl.try_acquire(r).await) {
            rl.release(lock).await.unwrap();
        }
    }
    // Sixteen at once: most go to the nodes in batches.
    let many = futures_util::future::join_all((0..16).map(|k| {
        let rl = rl.clone();
        async move { rl.try_acquire(&format!("many-{k}")).await }
    }))
    .await;
    for (k, outcome) in many.into_iter().enumerate() {
        if let Some(lock) = record(&format!("many-{k}"), outcome) {
            rl.release(lock).await.unwrap();
        }
    }
    for (node, stamps) in &granted {
        let mut sorted = stamps.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            stamps.len(),
            "node {node} issued one stamp to several grants: {stamps:?}"
        );
    }
    assert_eq!(refused, 19, "every acquire refused: {granted:?}");
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
    for i in 0..3 {
        let stamp: u64 = get(&cluster, i, "redlock:stamp")
            .await
            .and_then(|s| s.parse().ok())
            .expect("a stamp key");
        assert!(stamp >= LAST, "node {i}'s stamp key went down to {stamp}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_acquire_midway_cleans_up_late_grants() {
    let cluster = Cluster::builder()
        .nodes(3)
        .proxied(true)
        .start()
        .await
        .unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    warm(&rl).await;
    for i in 0..3 {
        cluster
            .node(i)
            .proxy()
            .unwrap()
            .set_delay(Duration::from_millis(30), Duration::ZERO);
    }
    // Cancel after the requests are out but before any reply.
    let r = tokio::time::timeout(Duration::from_millis(10), rl.try_acquire("dropped")).await;
    assert!(r.is_err(), "should have been cancelled");
    assert!(
        eventually(Duration::from_secs(3), || async {
            cluster.node(0).command_calls("evalsha").await >= 2
                && lock_keys(&cluster).await.is_empty()
        })
        .await,
        "keys left: {:?}",
        lock_keys(&cluster).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_and_unreachable_are_distinct() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    let held = rl.try_acquire("x").await.unwrap();
    let busy = rl
        .lock("x")
        .retry(RetryPolicy::attempts(2).with_delay(Duration::from_millis(5), Duration::ZERO))
        .acquire()
        .await
        .unwrap_err();
    assert!(busy.is_busy() && !busy.is_quorum_unreachable(), "{busy}");
    rl.release(held).await.unwrap();
    cluster.node(0).kill();
    cluster.node(1).kill();
    let err = rl.try_acquire("x").await.unwrap_err();
    assert!(matches!(err, Error::QuorumUnreachable { .. }), "{err}");
    assert!(err.to_string().contains("quorum unreachable"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_claim_stamps_locks_still_exclude_and_write_no_stamp() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = redlock::Redlock::builder()
        .nodes(cluster.urls())
        .claim_stamps(false)
        .retry(RetryPolicy::once())
        .build()
        .unwrap();
    let one = rl.try_acquire("plain").await.unwrap();
    assert!(one.claims().is_empty());
    assert!(rl.try_acquire("plain").await.unwrap_err().is_busy());
    let again = rl
        .try_acquire_with_token(["plain"], one.token())
        .await
        .unwrap();
    let many = rl.try_acquire_many(["m1", "m2"]).await.unwrap();
    assert!(
        rl.try_acquire_many(["m2", "m3"])
            .await
            .unwrap_err()
            .is_busy()
    );
    for i in 0..3 {
        assert_eq!(get(&cluster, i, "redlock:stamp").await, None, "node {i}");
    }
    rl.release(again).await.unwrap();
    rl.release(many).await.unwrap();
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
}

/// Regression: under load a release must never overtake its own acquire on a node (which would
/// leave the key behind and make the owner's next acquire of its *private* key fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_private_keys_never_see_their_own_leftovers() {
    let cluster = Cluster::start(5).await.unwrap();
    // A roomy node timeout: this test is about order, and a request that merely timed out under
    // a debug build's load would look like a leftover key.
    let rl = redlock::Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .retry(RetryPolicy::once())
        .build()
        .unwrap();
    warm(&rl).await;
    let stop = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for t in 0..256 {
        let rl = rl.clone();
        tasks.push(tokio::spawn(async move {
            let resource = format!("private:{t}");
            let (mut ok, mut failed) = (0u32, Vec::new());
            while Instant::now() < stop {
                match rl.try_acquire(&resource).await {
                    Ok(lock) => {
                        rl.release(lock).await.unwrap();
                        ok += 1;
                    }
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (ok, failed)
        }));
    }
    let mut total = 0;
    for t in tasks {
        let (ok, failed) = t.await.unwrap();
        assert!(
            failed.is_empty(),
            "{} failures, first: {}",
            failed.len(),
            failed[0]
        );
        total += ok;
    }
    assert!(
        total > 1_000,
        "only {total} cycles: not enough load to mean anything"
    );
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
}

/// A grant that kept a key holding its token already answers `−(10 + stamp)`. Lua's doubles
/// are exact only up to 2^53, so for a stamp within 10 of it the answer was rounded, and the
/// client read a stamp the node never issued — the next grant's, for an odd one (found in
/// review). Every grant's stamp must be the one the node stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_grants_stamp_near_2_53_is_the_one_the_node_stored() {
    const START: u64 = (1 << 53) - 24;
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(cluster.urls(), Duration::from_secs(5));
    rl.connect().await;
    for i in 0..3 {
        set(&cluster, i, "redlock:stamp", &START.to_string()).await;
    }
    let token = redlock::Token::random().unwrap();
    let (mut last, mut granted) = (None, 0);
    for round in 0..24 {
        let outcome = rl.try_acquire_with_token(["kept"], &token).await;
        let lock = match outcome {
            Ok(lock) => lock,
            Err(e) => {
                assert!(
                    e.to_string().contains("claim stamps exhausted"),
                    "round {round}: refused for another reason: {e}"
                );
                break;
            }
        };
        let mut stored = Vec::new();
        for i in 0..3 {
            let stamp: u64 = get(&cluster, i, "redlock:stamp")
                .await
                .unwrap()
                .parse()
                .unwrap();
            stored.push(stamp);
        }
        for claim in lock.claims() {
            assert!(
                stored.contains(&claim.stamp_us),
                "round {round}: claim stamp {} was never stored (nodes hold {stored:?})",
                claim.stamp_us
            );
        }
        last = Some(lock);
        granted += 1;
    }
    // 2^53 − 23 to 2^53 − 17 are issued; the limit refuses the rest.
    assert_eq!(granted, 7, "grants before the limit");
    if let Some(lock) = last {
        rl.release(lock).await.ok();
    }
}
