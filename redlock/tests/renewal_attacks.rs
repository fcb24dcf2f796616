//! Renewal and leases under attack, from a review (real redis-server processes): a lease lost to
//! a takeover hands back no validity through `stop_renewal`, one lock whose key became a hash
//! does not fail the renewals batched with it (both failed before their fixes), a runtime
//! stalled past the validity finds its lease lost on resume and leaves the rival's keys alone,
//! a repair waits out a restarted node's quarantine, a renewal landing after a hand-off does not
//! shorten the new holder's keys, no repair follows a lease's end, and a released guard is
//! reported released while its lease is read.

mod common;

use std::time::Duration;

use redlock::{LockGuard, LostReason, Redlock, RetryPolicy};
use redlock_testkit::Cluster;

const NODE_TIMEOUT: Duration = Duration::from_millis(200);

fn builder(urls: Vec<String>, ttl: Duration) -> redlock::RedlockBuilder {
    Redlock::builder()
        .nodes(urls)
        .ttl(ttl)
        .node_timeout(NODE_TIMEOUT)
        .retry(
            RetryPolicy::deadline(Duration::from_secs(5))
                .with_delay(Duration::from_millis(20), Duration::from_millis(20)),
        )
}

/// A renewal finds the lock taken over on a majority (`RenewalFailed`): the lease is lost.
/// `stop_renewal` then hands back the lock "with the validity of the last renewal" — but that
/// validity is known to be gone: a rival holds the lock on a quorum. The returned `Lock` must
/// not say it is still valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_renewal_after_a_lost_renewal_does_not_report_validity() {
    let cluster = Cluster::start(3).await.unwrap();
    let a = builder(cluster.urls(), Duration::from_secs(3))
        .build()
        .unwrap();
    let rival = builder(cluster.urls(), Duration::from_secs(3))
        .build()
        .unwrap();
    let guard = a.guard(a.try_acquire("taken").await.unwrap()).unwrap();
    // The keys on nodes 0 and 1 disappear (expired early, or restarted without data) and a
    // rival takes the lock there: a quorum holds the rival's token.
    // A renewal between the deletes and the rival's attempt puts our keys back (the repair);
    // the scenario needs the rival on nodes 0 and 1, so it is set up again until it is.
    let mut rival_lock = None;
    for _ in 0..5 {
        for i in [0, 1] {
            common::del(&cluster, i, "redlock:lock:taken").await;
        }
        if let Ok(lock) = rival.try_acquire("taken").await {
            rival_lock = Some(lock);
            break;
        }
    }
    let rival_lock = rival_lock.expect("rival takes nodes 0 and 1");
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the next renewal finds the lock taken over");
    assert!(matches!(reason, LostReason::RenewalFailed(_)), "{reason}");
    assert_eq!(
        guard.remaining(),
        Duration::ZERO,
        "the lease itself says lost"
    );
    let lock = guard.stop_renewal();
    let remaining = lock.remaining();
    let valid = lock.is_valid();
    rival.release(rival_lock).await.unwrap();
    assert!(
        !valid && remaining.is_zero(),
        "stop_renewal after RenewalFailed returned a lock that says it is valid for {remaining:?} \
         more, while a rival holds it on a quorum"
    );
}

/// Three nodes; ten guarded locks `good-0..9` (TTL 1.5 s) and one more, `odd` (TTL 30 s),
/// all renewed every 200 ms (tick 25 ms; a failed renewal is retried after 50 ms), so that
/// they share renewal rounds.
async fn ten_good_guards_and_one(odd: &str) -> (Cluster, Redlock, Vec<LockGuard>, LockGuard) {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = builder(cluster.urls(), Duration::from_millis(1500))
        .renew_every(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut good = Vec::new();
    for i in 0..10 {
        good.push(
            rl.guard(rl.try_acquire(&format!("good-{i}")).await.unwrap())
                .unwrap(),
        );
    }
    let odd = rl
        .lock(odd)
        .ttl(Duration::from_secs(30))
        .guard()
        .await
        .unwrap();
    (cluster, rl, good, odd)
}

/// Node 1's key for `resource` holds another holder's token: that node refuses the lock.
async fn held_by_another_on_node_1(cluster: &Cluster, resource: &str) {
    let mut c = cluster.node(1).connection().await.unwrap();
    let () = redlock_testkit::redis::cmd("SET")
        .arg(format!("redlock:lock:{resource}"))
        .arg("another holder")
        .query_async(&mut c)
        .await
        .unwrap();
}

/// The guards of `guards` that are lost, with why.
fn lost<'a>(guards: impl IntoIterator<Item = &'a LockGuard>) -> Vec<(String, Option<LostReason>)> {
    guards
        .into_iter()
        .filter(|g| g.is_lost())
        .map(|g| (g.resources()[0].clone(), g.reason()))
        .collect()
}

/// A renewal round is decided lock by lock, and a lock decided must not wait for the others:
/// with node 2 dead, a lock refused by node 1 (its key there holds another value) is
/// undecided for as long as node 2 is asked again, which is as long as that lock is valid.
/// The good locks batched with it reach their quorum on nodes 0 and 1 at once; their renewed
/// validity must count from then, not from the end of the round. Found in review of the
/// per-node renewal retries, where they kept their old deadlines and expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_decided_in_a_round_does_not_wait_for_an_undecided_one() {
    // A long TTL for the odd one: the round that holds it is undecided for as long as it is
    // valid.
    let (cluster, _rl, good, undecided) = ten_good_guards_and_one("undecided").await;
    held_by_another_on_node_1(&cluster, "undecided").await;
    cluster.node(2).kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lost = lost(&good);
    assert!(
        lost.is_empty(),
        "good locks lost while nodes 0 and 1 renewed them: {lost:?}"
    );
    drop(undecided);
}

/// A round whose locks are decided on different answers: one lock is refused by node 1 (its
/// key there holds another value), so after nodes 1 and 0 (or 2) answered the other locks are
/// renewed and that one is still undecided until the third node answers. The third answer must
/// still be counted for it, and must not touch the locks settled before it: the first version
/// of settling locks as they are decided indexed their emptied tallies there and panicked in
/// the renewal task, which dropped every round in flight (found in review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_decided_on_different_answers_of_a_round_are_all_renewed() {
    let (cluster, _rl, good, refused) = ten_good_guards_and_one("refused-on-one").await;
    held_by_another_on_node_1(&cluster, "refused-on-one").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lost = lost(good.iter().chain([&refused]));
    assert!(
        lost.is_empty(),
        "locks lost while two of three nodes renewed them: {lost:?}"
    );
    // Renewed every 200 ms, its 30 s TTL never runs down by much; a round that stops short
    // of settling it leaves it unrenewed.
    let left = refused.remaining();
    assert!(
        left > Duration::from_secs(28),
        "the lock refused by one node was not renewed for {:?}",
        Duration::from_secs(30).saturating_sub(left)
    );
}

/// Renewals are batched per node: one `EXTEND_MANY` script call renews every lock due in a
/// tick. When one lock's key has been overwritten with a value of another type (a hash), the
/// script raises WRONGTYPE for the whole call, so every other lock in the batch fails its
/// renewal on every node too — and since the failed ones are all retried on the same gap,
/// they keep sharing batches with the bad one until their validity ends. One broken lock must
/// not cost the other guarded locks their leases (the group-commit script isolates failing
/// requests for exactly this reason: `one_failing_request_does_not_fail_its_batch`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_broken_lock_does_not_fail_the_renewals_batched_with_it() {
    // The broken lock has a long TTL, so it keeps being retried for the whole test.
    let (cluster, _rl, good, bad) = ten_good_guards_and_one("bad").await;
    // The bad lock's key becomes a hash on every node.
    for i in 0..3 {
        let mut c = cluster.node(i).connection().await.unwrap();
        // Atomically: a renewal between the two would find the key missing and put it back.
        let () = redlock_testkit::redis::pipe()
            .atomic()
            .del("redlock:lock:bad")
            .ignore()
            .hset("redlock:lock:bad", "f", "v")
            .ignore()
            .query_async(&mut c)
            .await
            .unwrap();
    }
    // Two TTLs: every good lock must be renewed every 200 ms throughout, so its validity never
    // falls much below TTL − 200 ms (~1.25 s). Sample it every 10 ms.
    let mut lowest = Duration::MAX;
    let mut lowest_of = String::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        for g in &good {
            let left = g.remaining();
            if left < lowest {
                lowest = left;
                lowest_of = g.resources()[0].clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lost = lost(&good);
    let bad_reason = bad.reason();
    drop(bad);
    for g in good {
        drop(g);
    }
    assert!(
        lost.is_empty() && lowest > Duration::from_millis(700),
        "healthy guarded locks failed their renewals because another lock of the same batches \
         has a key that became a hash (the bad lock: {bad_reason:?}): {} of 10 lost ({:?}); \
         lowest validity seen {lowest:?} ({lowest_of}), where renewals every 200 ms keep ~1.25 s",
        lost.len(),
        lost.first()
    );
}

/// A runtime whose only thread is blocked past the lease's validity (a GC-like pause) while a
/// rival takes the lock: once the thread runs again the lease must say lost at once, fire its
/// signal, never come back, and the renewer must not touch the rival's keys.
#[test]
fn a_lease_stalled_past_its_validity_is_lost_on_resume() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cluster = Cluster::start(3).await.unwrap();
        let urls = cluster.urls();
        let a = builder(urls.clone(), Duration::from_secs(1))
            .build()
            .unwrap();
        let guard = a.guard(a.try_acquire("stall").await.unwrap()).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (tx, rx) = std::sync::mpsc::channel();
        let rival = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let b = builder(urls, Duration::from_secs(10)).build().unwrap();
                let lock = b
                    .acquire("stall")
                    .await
                    .expect("rival gets the expired lock");
                tx.send(lock.token().expose().to_owned()).unwrap();
                // Keep it a while, then release.
                tokio::time::sleep(Duration::from_secs(2)).await;
                b.release(lock).await.unwrap();
            });
        });
        // Block the runtime's only thread for longer than the TTL.
        std::thread::sleep(Duration::from_millis(1800));
        let lost_at_once = guard.is_lost();
        let remaining_at_once = guard.remaining();
        let rival_token = rx
            .recv_timeout(Duration::from_secs(1))
            .expect("rival acquired");
        let reason = tokio::time::timeout(Duration::from_millis(500), guard.lost()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let still_lost = guard.is_lost() && guard.remaining().is_zero();
        let mut owners = Vec::new();
        for i in 0..3 {
            owners.push(common::get(&cluster, i, "redlock:lock:stall").await);
        }
        let lock = guard.stop_renewal();
        assert!(lost_at_once, "lease said held right after the stall");
        assert_eq!(remaining_at_once, Duration::ZERO);
        let reason = reason.expect("lost signal fired after the stall");
        assert!(
            matches!(reason, LostReason::Expired | LostReason::RenewalFailed(_)),
            "{reason}"
        );
        assert!(still_lost, "lease came back after the stall");
        assert!(
            !lock.is_valid(),
            "stop_renewal lock valid for {:?}",
            lock.remaining()
        );
        // The rival needs only a quorum: a node whose key of ours expired a moment after the
        // others may have refused the rival's winning attempt and be empty now. No node may
        // hold anything but the rival's key (ours put back by a repair, say).
        assert!(
            owners
                .iter()
                .all(|o| o.is_none() || o.as_deref() == Some(rival_token.as_str())),
            "rival's keys changed: {owners:?}"
        );
        assert!(
            owners
                .iter()
                .filter(|o| o.as_deref() == Some(rival_token.as_str()))
                .count()
                >= 2,
            "the rival holds no quorum: {owners:?}"
        );
        tokio::task::spawn_blocking(move || rival.join().unwrap())
            .await
            .unwrap();
    });
}

/// A node restarts empty while a guarded lock is renewed, with the restart quarantine on: the
/// renewal's repair must not put the key back on the node during its quarantine, and must put
/// it back once the quarantine is over (the lease keeps its redundancy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_waits_out_the_restart_quarantine() {
    let cluster = Cluster::start(3).await.unwrap();
    let ttl = Duration::from_secs(2);
    let a = builder(cluster.urls(), ttl)
        .restart_quarantine(ttl)
        .build()
        .unwrap();
    a.connect().await;
    // New servers are in quarantine too: the acquire retries until they are out of it.
    let guard = a.guard(a.acquire("q").await.expect("acquire")).unwrap();
    // The acquire can be granted by two nodes while the third is still in its quarantine; the
    // renewal puts the key back there once it is out. Only then does the scenario start: with
    // the key on two nodes, wiping one of them leaves a single copy, and the lease is rightly
    // lost (seen when the tests of this file ran side by side on a loaded machine).
    let everywhere = common::eventually(Duration::from_secs(5), || async {
        let mut on = 0;
        for i in 0..3 {
            on += usize::from(common::get(&cluster, i, "redlock:lock:q").await.is_some());
        }
        on == 3
    })
    .await;
    assert!(everywhere, "the lock never reached all three nodes");
    cluster
        .node(0)
        .restart(redlock_testkit::DataOnRestart::Wipe)
        .await
        .unwrap();
    let restarted = tokio::time::Instant::now();
    let mut early = None;
    while restarted.elapsed() < Duration::from_millis(1800) {
        if common::get(&cluster, 0, "redlock:lock:q").await.is_some() {
            early = Some(restarted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The repair waits for the node's next renewal after its quarantine: the connection the
    // restart broke is opened again by a renewal round (the first one after the restart may
    // only find it broken), the quarantine runs 2 s from that connection, and rounds come every
    // TTL / 3: about 4.3 s after the restart at the slowest on an idle machine, close to the
    // 1.8 + 3 s this waited before. 8 s leaves room for a loaded machine and still fails a
    // repair that never comes.
    let repaired = common::eventually(Duration::from_secs(8), || async {
        common::get(&cluster, 0, "redlock:lock:q").await.is_some()
    })
    .await;
    let took = restarted.elapsed();
    let lost = guard.reason();
    guard.release().await.unwrap();
    assert!(
        early.is_none(),
        "the key was put back on node 0 {early:?} after its restart, inside its 2 s quarantine"
    );
    assert!(
        repaired,
        "not repaired {took:?} after the restart (2 s quarantine); lease: {lost:?}"
    );
    assert!(lost.is_none(), "{lost:?}");
}

/// `with_lock` whose work blocks the runtime's only thread past the lease's validity (a
/// GC-like pause, a blocking call) while a rival takes the lock, and then finishes without
/// another await: the lock was lost while the work ran, so the call must say so
/// (`LeaseLost`), not hand back the work's result as done under the lock.
#[test]
fn with_lock_reports_a_loss_during_work_that_never_awaits_again() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cluster = Cluster::start(3).await.unwrap();
        let urls = cluster.urls();
        let a = builder(urls.clone(), Duration::from_secs(1))
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let rival = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let b = builder(urls, Duration::from_secs(5)).build().unwrap();
                // Starts once A holds the lock; gets it once A's keys expire.
                rx.recv().unwrap();
                let lock = b
                    .acquire("blocked-work")
                    .await
                    .expect("rival gets the expired lock");
                b.release(lock).await.unwrap();
            });
        });
        let outcome = a
            .with_lock("blocked-work", |lease| async move {
                tx.send(()).unwrap();
                // Blocks the only thread for longer than the TTL: no renewal can run.
                std::thread::sleep(Duration::from_millis(1800));
                lease.is_lost()
            })
            .await;
        tokio::task::spawn_blocking(move || rival.join().unwrap())
            .await
            .unwrap();
        match outcome {
            Err(redlock::Error::LeaseLost { .. }) => {}
            other => panic!(
                "the lock expired (and a rival took it) while the work ran, yet with_lock \
                 returned {other:?} (the work's own lease said lost: true means so)"
            ),
        }
    });
}

/// A hand-off as docs/leases.md describes it: client A stops its guard (`stop_renewal`) and
/// client B takes the lock over with A's token on a longer TTL. A renewal of A's still in flight
/// (its links to two nodes stalled; the proxies deliver the held bytes once healed) lands after
/// B's re-arm. Found in review: it cut B's keys back to A's 2 s TTL on a quorum while B's `Lock`
/// went on reporting ~27 s of validity, and a third client took the lock 2.5 s later — two
/// holders. An owner-checked extension, renewal or re-arm never shortens a key's expiry now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_landing_after_a_handoff_does_not_shorten_the_new_holders_keys() {
    let cluster = Cluster::builder()
        .nodes(3)
        .proxied(true)
        .start()
        .await
        .unwrap();
    let key = "redlock:lock:job";
    let a = builder(cluster.urls(), Duration::from_secs(2))
        .renew_every(Duration::from_millis(100))
        .build()
        .unwrap();
    a.connect().await;
    let direct: Vec<String> = cluster.nodes().iter().map(|n| n.url()).collect();
    let b = builder(direct.clone(), Duration::from_secs(30))
        .build()
        .unwrap();
    b.connect().await;
    let c = builder(direct, Duration::from_secs(30)).build().unwrap();
    c.connect().await;

    let guard = a.guard(a.acquire("job").await.unwrap()).unwrap();
    let token = guard.token().clone();
    tokio::time::sleep(Duration::from_millis(250)).await;
    for i in [0, 1] {
        cluster.node(i).proxy().unwrap().blackhole();
    }
    // At least two renewal rounds are sent into the stalled links.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let a_lock = guard.stop_renewal();
    let b_lock = b
        .try_acquire_with_token(["job"], &token)
        .await
        .expect("B takes the lock over with the token");
    let before = common::pttls(&cluster, key).await;
    for i in [0, 1] {
        cluster.node(i).proxy().unwrap().heal();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = common::pttls(&cluster, key).await;
    drop(a_lock);
    // Past A's 2 s TTL, B's lock still says it holds the lock ...
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let b_left = b_lock.remaining();
    assert!(b_lock.is_valid(), "B's lock is valid by its own account");
    // ... so nobody else may take it.
    let rival = c.try_acquire("job").await;
    let rival_got_it = rival.is_ok();
    if let Ok(l) = rival {
        let _ = c.release(l).await;
    }
    let _ = b.release(b_lock).await;
    assert!(
        !rival_got_it,
        "a third client took the lock while B's lock reported {b_left:?} left (PTTL per node \
         after B's re-arm {before:?}, after A's stalled renewal landed {after:?})"
    );
    assert!(
        after.iter().filter(|&&t| t > 20_000).count() >= 2,
        "A's stalled renewal shortened B's keys on a quorum: {before:?} -> {after:?}"
    );
}

/// A lease that reached `max_hold` (renewal stops: there are no endless leases) is over, and
/// nothing may put its keys back. The renewal's repair of a node that answers after the quorum
/// (read on by a task of its own) looked only at `done`, which `max_hold` does not set: found in
/// review, node 2's key came back with a fresh full TTL after the lease's signal fired (5 of 5
/// runs). Node 2 is reached through the fault proxy, whose `blackhole` holds bytes until `heal`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_is_put_back_after_max_hold() {
    let cluster = Cluster::builder()
        .nodes(3)
        .proxied(true)
        .start()
        .await
        .unwrap();
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(5))
        .node_timeout(Duration::from_millis(200))
        .renew_every(Duration::from_millis(30))
        .max_hold(Duration::from_secs(1))
        .retry(RetryPolicy::deadline(Duration::from_secs(5)))
        .build()
        .unwrap();
    rl.connect().await;
    let key = "redlock:lock:capped";
    let guard = rl.guard(rl.acquire("capped").await.unwrap()).unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The link to node 2 stalls (nothing is lost, only held), then node 2 loses the key. From
    // here on no answer of node 2 reaches the client before `heal`, so no repair is sent before.
    cluster.node(2).proxy().unwrap().blackhole();
    tokio::time::sleep(Duration::from_millis(20)).await;
    common::del(&cluster, 2, key).await;
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("max_hold fires");
    assert!(matches!(reason, LostReason::MaxHold), "{reason}");
    // Nothing renews this lease any more. The link comes back.
    cluster.node(2).proxy().unwrap().heal();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left = common::pttls(&cluster, key).await;
    let (on_0, on_2) = (left[0], left[2]);
    drop(guard);
    assert_eq!(
        on_2, -2,
        "node 2's key was put back after the lease hit max_hold (PTTL {on_2} ms on node 2, \
         against {on_0} ms left on node 0 from the last renewal before max_hold)"
    );
}

/// The hand-off docs/leases.md describes, with repairs in flight: client A guards a lock whose
/// key node 2 lost (deleted behind the client's back; node 2 is 60 ms away from A each way), so
/// A's renewals keep putting it back; A stops renewing (`stop_renewal`), and client B takes the
/// lock over with its token and releases it. Found in review: repairs A had handed to node 2's
/// connection before stopping landed after B's delete and re-created the key for a whole TTL
/// (3 of 3 rounds). Known problem, not fixed (docs/leases.md): repeating the new holder's delete
/// later, tried on 2026-12-05, deleted the keys of a later lock taken with the same token
/// (a review found it before it shipped), and nothing else orders the new holder's release
/// behind the old holder's requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known problem: a repair handed over before stop_renewal outlives the new holder's release (docs/leases.md)"]
async fn a_repair_in_flight_at_a_handoff_does_not_outlive_the_release() {
    let cluster = Cluster::builder()
        .nodes(3)
        .proxied(true)
        .start()
        .await
        .unwrap();
    let ttl = Duration::from_secs(5);
    let a = builder(cluster.urls(), ttl)
        .renew_every(Duration::from_millis(30))
        .build()
        .unwrap();
    a.connect().await;
    let direct: Vec<String> = cluster.nodes().iter().map(|n| n.url()).collect();
    let b = builder(direct, ttl).build().unwrap();
    b.connect().await;
    cluster
        .node(2)
        .proxy()
        .unwrap()
        .set_delay(Duration::from_millis(60), Duration::ZERO);
    let key = "redlock:lock:handoff";
    let mut leaked = Vec::new();
    for round in 0..2 {
        let guard = a.guard(a.acquire("handoff").await.unwrap()).unwrap();
        let token = guard.token().clone();
        tokio::time::sleep(Duration::from_millis(300)).await;
        common::del(&cluster, 2, key).await;
        // The first repair put the key back: later ones are on their way to node 2.
        let repaired = common::eventually(Duration::from_secs(2), || async {
            common::get(&cluster, 2, key).await.is_some()
        })
        .await;
        assert!(repaired, "round {round}: no repair put node 2's key back");
        let stopped = guard.stop_renewal();
        let handed = b
            .try_acquire_with_token(["handoff"], &token)
            .await
            .expect("B takes the lock over with its token");
        b.release(handed).await.expect("B releases it");
        // Past five of B's node timeouts (200 ms) and a margin: A's requests have landed and
        // B's repeated delete has run.
        tokio::time::sleep(Duration::from_millis(1400)).await;
        let left = common::pttls(&cluster, key).await;
        drop(stopped);
        if left.iter().any(|&t| t != -2) {
            leaked.push((round, left));
        }
        for i in 0..3 {
            common::del(&cluster, i, key).await;
        }
    }
    assert!(
        leaked.is_empty(),
        "keys left after B's release, per round (PTTL per node, -2 = none): {leaked:?}"
    );
}

/// A token may be used again (docs/fencing.md: a token kept across restarts): a lock taken with
/// a given token, released, and taken again at once with the same token keeps its keys. A
/// repeated background delete of the first release (tried on 2026-12-05 for the hand-off problem
/// above) would have deleted them about five node timeouts later, with the second lock still
/// valid by its own account, and a rival would have taken it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_taken_again_after_its_release_keeps_its_keys() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = builder(cluster.urls(), Duration::from_secs(10))
        .build()
        .unwrap();
    let rival = builder(cluster.urls(), Duration::from_secs(10))
        .build()
        .unwrap();
    let token = rl.try_acquire("again").await.unwrap().token().clone();
    let mut lock = None;
    for _ in 0..2 {
        if let Some(l) = lock.take() {
            rl.release(l).await.unwrap();
        }
        lock = Some(rl.try_acquire_with_token(["again"], &token).await.unwrap());
    }
    // Past five node timeouts (200 ms) and the delivery grace (1 s).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let left = common::pttls(&cluster, "redlock:lock:again").await;
    let lock = lock.unwrap();
    assert!(lock.is_valid());
    let stolen = rival.try_acquire("again").await;
    let _ = rl.release(lock).await;
    assert!(
        stolen.is_err(),
        "a rival took a lock whose holder counts it valid (PTTL per node {left:?})"
    );
    assert!(left.iter().all(|&t| t > 5_000), "{left:?}");
}

/// A guard released by its holder ends its lease as `Released`, whatever else reads the lease
/// meanwhile. Found in review (2026-12-05): the release zeroed the validity before it recorded
/// its reason, and a task checking the lease in between (as the docs advise work to do before
/// each step) found the validity passed and recorded `Expired` first — the release was then
/// reported, counted and logged as a loss. A race, so many rounds: 1,000 acquire + release
/// cycles against one node, each with a thread that spins on `is_lost()` during the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_guard_is_reported_released_while_its_lease_is_read() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    const ROUNDS: usize = 1000;
    let cluster = Cluster::start(1).await.unwrap();
    let rl = builder(cluster.urls(), Duration::from_secs(10))
        .build()
        .unwrap();
    rl.connect().await;
    let mut wrong = Vec::new();
    for round in 0..ROUNDS {
        let guard = rl.guard(rl.try_acquire("job").await.unwrap()).unwrap();
        let lease = guard.lease();
        let started = Arc::new(AtomicBool::new(false));
        let checker = {
            let (lease, started) = (lease.clone(), Arc::clone(&started));
            std::thread::spawn(move || {
                started.store(true, Ordering::Release);
                while !lease.is_lost() {
                    std::hint::spin_loop();
                }
            })
        };
        while !started.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        guard.release().await.unwrap();
        checker.join().unwrap();
        let reason = lease.reason();
        if !matches!(reason, Some(LostReason::Released)) {
            wrong.push((round, reason.map(|r| r.label())));
        }
    }
    println!(
        "{} of {ROUNDS} released guards reported otherwise",
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "{} of {ROUNDS} guards released by their holder were reported with another reason \
         (first: {:?})",
        wrong.len(),
        wrong.first()
    );
}
