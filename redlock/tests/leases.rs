//! Leases on real nodes: the lost signal, completion order, long jobs, batched renewals,
//! fast hand-off without starvation, and the restart quarantine (with its negative control).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{lock_keys, no_lock_keys_within};
use redlock::{Error, LostReason, Redlock, RetryPolicy};
use redlock_testkit::{Cluster, DataOnRestart};

/// Lease tests run many clusters in parallel; a roomier node timeout than the protocol tests'
/// keeps CPU contention from failing renewals that the tests expect to succeed.
const LEASE_NODE_TIMEOUT: Duration = Duration::from_millis(200);

fn client(cluster: &Cluster, ttl: Duration) -> redlock::RedlockBuilder {
    Redlock::builder()
        .nodes(cluster.urls())
        .ttl(ttl)
        .node_timeout(LEASE_NODE_TIMEOUT)
        .retry(
            RetryPolicy::deadline(Duration::from_secs(15))
                .with_delay(Duration::from_millis(20), Duration::from_millis(20)),
        )
}

/// With a majority paused no renewal can get through; failed renewal batches are retried while
/// validity remains, and the lost signal fires by the validity deadline (not after it), so the
/// work is cancelled before the keys can expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_by_the_deadline_when_a_majority_pauses() {
    let cluster = Cluster::start(5).await.unwrap();
    let rl = client(&cluster, Duration::from_millis(900))
        .build()
        .unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&started);
    let seen = Arc::new(std::sync::Mutex::new(None));
    let record = Arc::clone(&seen);
    let timer = Arc::new(std::sync::Mutex::new(None));
    let control = Arc::clone(&timer);
    let run = rl.with_lock("lost", |lease| async move {
        flag.store(true, Ordering::SeqCst);
        let valid_until = lease.valid_until();
        let watcher = lease.clone();
        let timer = Arc::clone(&timer);
        let deadline = lease.clone();
        tokio::spawn(async move {
            let at = timer_at_deadline(|| deadline.valid_until()).await;
            *timer.lock().unwrap() = Some(at);
        });
        // Observe the signal itself (the call returns only after its release, which waits for
        // the paused nodes' timeouts).
        tokio::spawn(async move {
            let reason = watcher.lost().await;
            *record.lock().unwrap() = Some((
                std::time::Instant::now(),
                watcher.valid_until(),
                reason,
                valid_until,
            ));
        });
        std::future::pending::<()>().await
    });
    let pauser = async {
        while !started.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for i in 0..3 {
            cluster.node(i).pause();
        }
    };
    let (result, ()) = tokio::join!(run, pauser);
    for i in 0..3 {
        cluster.node(i).resume();
    }
    match result {
        Err(Error::LeaseLost { reason, .. }) => {
            assert!(
                matches!(reason, LostReason::RenewalFailed(_) | LostReason::Expired),
                "{reason}"
            );
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    let (fired, valid_until, reason, _) = seen.lock().unwrap().clone().expect("signal observed");
    let timer = control.lock().unwrap().expect("the plain timer fired");
    assert_by_the_deadline(fired, valid_until, timer, &reason);
}

/// A plain timer for the lease's deadline (`valid_until`, read again after it fired until it
/// no longer moved), on the runtime the lease's signal comes from: when it fired says how late
/// the machine ran timers just then.
async fn timer_at_deadline(valid_until: impl Fn() -> Instant) -> Instant {
    loop {
        let deadline = valid_until();
        tokio::time::sleep_until(deadline.into()).await;
        if valid_until() == deadline {
            return Instant::now();
        }
    }
}

/// The lost signal came by the deadline: within 30 ms of it, or of a plain timer set for it
/// (a busy machine runs every timer late; a signal that waits for a renewal's node timeout
/// comes 200 ms after both).
fn assert_by_the_deadline(
    fired: Instant,
    valid_until: Instant,
    timer: Instant,
    reason: &LostReason,
) {
    assert!(
        fired <= valid_until.max(timer) + Duration::from_millis(30),
        "fired {:?} after the deadline, a plain timer for it {:?} after it ({reason})",
        fired.saturating_duration_since(valid_until),
        timer.saturating_duration_since(valid_until)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_at_the_deadline_when_renewal_cannot_happen_in_time() {
    let cluster = Cluster::start(3).await.unwrap();
    // Renewal is due only just before the deadline and the nodes are paused: nothing can extend.
    let rl = client(&cluster, Duration::from_millis(600))
        .renew_every(Duration::from_millis(595))
        .build()
        .unwrap();
    let guard = rl.guard(rl.try_acquire("deadline").await.unwrap()).unwrap();
    let valid_until = guard.valid_until();
    for i in 0..3 {
        cluster.node(i).pause();
    }
    let (reason, timer) = tokio::join!(
        async {
            let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
                .await
                .expect("lost fires");
            (reason, std::time::Instant::now())
        },
        timer_at_deadline(|| guard.valid_until())
    );
    let (reason, fired) = reason;
    for i in 0..3 {
        cluster.node(i).resume();
    }
    assert!(
        matches!(reason, LostReason::Expired | LostReason::RenewalFailed(_)),
        "{reason}"
    );
    assert_by_the_deadline(fired, valid_until, timer, &reason);
    assert!(
        fired + Duration::from_millis(200) >= valid_until,
        "fired long before the deadline"
    );
    assert_eq!(guard.remaining(), Duration::ZERO);
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_fires_and_renewal_traffic_stops() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_millis(300))
        .max_hold(Duration::from_millis(700))
        .build()
        .unwrap();
    let t = Instant::now();
    let result = rl
        .with_lock("bounded", |_| async {
            tokio::time::sleep(Duration::from_secs(5)).await
        })
        .await;
    let took = t.elapsed();
    assert!(
        matches!(
            result,
            Err(Error::LeaseLost {
                reason: LostReason::MaxHold,
                ..
            })
        ),
        "{result:?}"
    );
    assert!(
        took >= Duration::from_millis(650) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    // Let the release's slower nodes and any renewal already in flight finish first.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let before = cluster.node(0).command_calls("evalsha").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = cluster.node(0).command_calls("evalsha").await;
    assert_eq!(before, after, "renewals continued after max hold");
    assert!(lock_keys(&cluster).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_racing_renewal_never_resurrects_the_lock() {
    let cluster = Cluster::start(3).await.unwrap();
    // A long TTL, so a resurrected key would still be there; renewal every few ms to race.
    let rl = client(&cluster, Duration::from_secs(10))
        .renew_every(Duration::from_millis(3))
        .build()
        .unwrap();
    rl.connect().await;
    for round in 0..1000u64 {
        let guard = rl.guard(rl.try_acquire("race").await.unwrap()).unwrap();
        tokio::time::sleep(Duration::from_micros(round % 4 * 900)).await;
        // What a release leaves is checked below. Under load (CI on Valkey, test binaries side
        // by side) one release timed out on two healthy nodes at the 200 ms node timeout and
        // failed this test here, though that is not a resurrection.
        if let Err(e) = guard.release().await {
            assert!(
                matches!(e, Error::QuorumUnreachable { .. }),
                "round {round}: {e}"
            );
        }
        let gone = no_lock_keys_within(&cluster, Duration::from_millis(500)).await;
        assert!(gone, "round {round}: key left after release");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        lock_keys(&cluster).await.is_empty(),
        "a renewal brought a released lock back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_five_times_longer_than_the_ttl_keeps_the_lock_throughout() {
    let cluster = Cluster::start(5).await.unwrap();
    let ttl = Duration::from_millis(300);
    let owner = client(&cluster, ttl).build().unwrap();
    let rival = client(&cluster, ttl)
        .retry(RetryPolicy::once())
        .build()
        .unwrap();
    // `holding` is set by the job itself: only a rival grant while the job runs counts.
    let holding = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let stolen = Arc::new(AtomicU64::new(0));
    let polls = Arc::new(AtomicU64::new(0));
    let poller = {
        let (holding, done, stolen, polls) = (
            Arc::clone(&holding),
            Arc::clone(&done),
            Arc::clone(&stolen),
            Arc::clone(&polls),
        );
        tokio::spawn(async move {
            while !holding.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            while !done.load(Ordering::SeqCst) {
                if let Ok(lock) = rival.try_acquire("long-job").await {
                    if !done.load(Ordering::SeqCst) {
                        stolen.fetch_add(1, Ordering::SeqCst);
                    }
                    rival.release(lock).await.unwrap();
                }
                polls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let finished = owner
        .with_lock("long-job", |lease| {
            let holding = Arc::clone(&holding);
            let done = Arc::clone(&done);
            async move {
                holding.store(true, Ordering::SeqCst);
                tokio::time::sleep(ttl * 5 + Duration::from_millis(100)).await;
                // Stop counting before the lock is released.
                done.store(true, Ordering::SeqCst);
                !lease.is_lost()
            }
        })
        .await
        .expect("job completes under its lock");
    done.store(true, Ordering::SeqCst);
    poller.await.unwrap();
    assert!(finished);
    assert_eq!(
        stolen.load(Ordering::SeqCst),
        0,
        "a rival got the lock during the job"
    );
    assert!(polls.load(Ordering::SeqCst) > 20, "the rival barely polled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_held_locks_renew_in_batches() {
    let cluster = Cluster::start(3).await.unwrap();
    let ttl = Duration::from_millis(1500); // renew ≈ every 500 ms, driver tick ≈ 62 ms
    let rl = client(&cluster, ttl).build().unwrap();
    rl.connect().await;
    let mut guards = Vec::new();
    // With retries: under the load of the other test binaries a single attempt could time out
    // (one did in CI, two of three nodes silent for the 200 ms node timeout), and taking the
    // locks is not what this test checks.
    for chunk in (0..5000).collect::<Vec<_>>().chunks(100) {
        let locks = futures_util::future::join_all(
            chunk
                .iter()
                .map(|i| rl.acquire_many([format!("batch:{i}")])),
        )
        .await;
        for l in locks {
            guards.push(rl.guard(l.unwrap()).unwrap());
        }
    }
    let window = Duration::from_millis(2000);
    let before = cluster.node(0).command_calls("evalsha").await;
    tokio::time::sleep(window).await;
    let calls = cluster.node(0).command_calls("evalsha").await - before;
    // One call per tick at most (plus slack for ticks split around chunk boundaries), against
    // 5000 × (2 s / 0.5 s) = 20 000 calls for per-lock renewal.
    let ticks = window.as_millis() / 62 + 2;
    assert!(calls > 0, "no renewals at all");
    println!("{calls} renewal calls on one node in {window:?} for 5000 held locks");
    assert!(
        calls <= u64::try_from(ticks * 2).unwrap(),
        "{calls} renewal calls in {window:?} on one node"
    );
    assert!(guards.iter().all(|g| !g.is_lost()), "a lock was lost");
    assert!(
        guards
            .iter()
            .all(|g| g.remaining() > Duration::from_millis(500))
    );
    // Releasing is not what this test checks: under the load of the other test binaries a
    // release with this client's 200 ms node timeout can time out (one did in a CI run's Valkey
    // pass, two of three nodes silent for 200 ms). What a failed release leaves expires with
    // the 1.5 s TTL; that nothing is left is checked below.
    let mut failed = Vec::new();
    for g in guards {
        if let Err(e) = g.release().await {
            failed.push(e);
        }
    }
    println!(
        "{} of 5000 releases failed: {:?}",
        failed.len(),
        failed.first()
    );
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(3)).await);
}

/// Many held locks over a slow network: the renewal of one tick is split into calls of at most
/// 1,000 locks, and those calls must not wait for one another. Here 6,000 locks are due together
/// and a round trip takes 400 ms: one call after the other is 2.4 s, more than the 1.33 s of
/// validity a lock has left when it is due (TTL 2 s, renewed every 667 ms), so the last calls'
/// locks would expire between renewals; sent together, a tick takes about one round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_calls_of_one_tick_do_not_wait_for_one_another() {
    let lost =
        guarded_locks_lost_over_a_slow_link(3, 6000, Duration::from_millis(600), 200, 4).await;
    assert_eq!(
        lost, 0,
        "{lost} of 6000 held locks were lost over a 400 ms round trip"
    );
}

/// A node's answers come back in the order the requests went out on its connection, so a
/// renewal sent again on the same connection can never be answered before the first one. A
/// renewal whose answer takes longer than its budget — a slow link, or a moment of load on top
/// of one — used to be given up at the budget and tried again behind itself, and with the
/// validity that was left the second try rarely came back in time: over a 600 ms round trip
/// every guarded lock was lost (CI lost 900–1,002 of the 6,000 locks of
/// `renewal_calls_of_one_tick_do_not_wait_for_one_another` over a 400 ms round trip under load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_after_its_budget_but_within_the_validity_keeps_the_lock() {
    // A 600 ms round trip: longer than any renewal call's budget with a 300 ms node timeout
    // (a quarter of the TTL, 500 ms), well inside the validity a renewal starts with.
    let lost =
        guarded_locks_lost_over_a_slow_link(3, 200, Duration::from_millis(300), 300, 5).await;
    assert_eq!(
        lost, 0,
        "{lost} of 200 held locks were lost over a 600 ms round trip"
    );
}

/// The same slow link with one node of five dead: its calls fail at once in every round. A
/// first version of the wait past the budget ended every node's wait when any node's call
/// failed, and one dead node brought back the losses of the slow link. Found in review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_does_not_cut_the_wait_for_the_slow_ones() {
    let lost =
        guarded_locks_lost_over_a_slow_link(5, 200, Duration::from_millis(300), 300, 5).await;
    assert_eq!(
        lost, 0,
        "{lost} of 200 held locks were lost over a 600 ms round trip with one node of five dead"
    );
}

/// A renewal waits past its budget only while no retry could do better. With node 2 hung (its
/// connection kept, so the wait for it goes on) and node 1's connection reset during a round,
/// only node 1 answering again can make a quorum: node 1 must be asked again while node 2 is
/// still waited for. Found in review of that wait, which lasted until the validity ran out and
/// lost the lock. With a 3 s TTL and node 1 back 1.5 s after the grant, the lock had about
/// 1.46 s left when node 1 came back: here the renewal came 10–180 ms later (also beside six
/// busy loops, and beside the `batch_attacks` binary), but the lock expired in 2 of 5 CI runs
/// on Valkey (2026-12-06), and once more on Redis with a 5 s TTL (2026-12-07): node 1's grant,
/// under load still on its way through the proxy when the partition dropped it (next test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_is_retried_when_a_node_fails_while_another_hangs() {
    hang_node_2_and_partition_node_1("hang-and-fail", Duration::ZERO).await;
}

/// With node 2 hung, node 1 is partitioned for 2.2 s right after the grant (its grant delayed
/// by `grant_delay` each way on its link until then); the guard must keep the lock, nodes 0 and
/// 1 answering for 3 s after the heal. The first renewal is due 1.1–1.7 s after the grant.
async fn hang_node_2_and_partition_node_1(resource: &str, grant_delay: Duration) {
    let (cluster, rl) = proxied(3, Duration::from_secs(5), LEASE_NODE_TIMEOUT).await;
    let proxy = cluster.node(1).proxy().expect("proxied");
    proxy.set_delay(grant_delay, Duration::ZERO);
    let guard = rl
        .guard(rl.try_acquire(resource).await.expect("granted"))
        .unwrap();
    cluster.node(2).pause();
    proxy.partition();
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let left_at_heal = guard.remaining();
    proxy.heal();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lost = guard.reason();
    cluster.node(2).resume();
    assert!(
        lost.is_none(),
        "the guarded lock was lost although nodes 0 and 1 answered for 3 s ({left_at_heal:?} \
         left when node 1 came back): {lost:?}"
    );
    guard.release().await.ok();
}

/// The test above as CI saw it, made certain: node 1's grant is still on its way through the
/// proxy (300 ms each way) when the partition drops it, so node 1 never had the key. After
/// the heal it answers the renewal that it lost the keys, and the round, with node 2 hung,
/// waited until the validity ran out (see the test below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_dropped_by_a_partition_is_put_back_while_another_node_hangs() {
    hang_node_2_and_partition_node_1("dropped-grant", Duration::from_millis(300)).await;
}

/// A key deleted on a node that granted the lock, with another node hung: not put back before
/// the quorum renewed the lock, and the lease is lost when its validity runs out. The client
/// cannot tell a key lost (a restart without its data) from one deleted (a release by a client
/// the lock was handed to, whose delete to the hung node is hidden): put back at once and
/// counted as a renewal, as a first version did, it brought a released lock back (found in
/// review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_on_a_node_that_granted_is_not_put_back_while_another_hangs() {
    let (cluster, rl) = proxied(3, Duration::from_secs(3), LEASE_NODE_TIMEOUT).await;
    let guard = rl
        .guard(rl.try_acquire("deleted-and-hung").await.expect("granted"))
        .unwrap();
    let key = format!("{}lock:deleted-and-hung", redlock::DEFAULT_KEY_PREFIX);
    deleted_on_node_1_while_node_2_hangs(&cluster, &guard, &key).await;
}

/// Deletes `key` on node 1 and hangs node 2: the guard's lease must expire, and the key must
/// not be put back on node 1.
async fn deleted_on_node_1_while_node_2_hangs(
    cluster: &Cluster,
    guard: &redlock::LockGuard,
    key: &str,
) {
    // Node 2 hangs first: a round in flight between the two steps would otherwise be decided
    // by node 2's answer, and put the key back on node 1 as a repair.
    cluster.node(2).pause();
    common::del(cluster, 1, key).await;
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
    let on_node_1 = common::get(cluster, 1, key).await;
    cluster.node(2).resume();
    assert!(
        matches!(reason, Ok(LostReason::Expired)),
        "the lease with its key deleted on node 1 and node 2 hung: {reason:?}"
    );
    assert_eq!(on_node_1, None, "the key was put back on node 1");
}

/// A lock taken while node 1 held its key for another owner, that owner's key then gone: node 1
/// refused the acquire, and its "lost the keys" answers make it a node whose key may be put back
/// early (see the tests above). Answers the guard and the key's name.
async fn refused_on_node_1(
    cluster: &Cluster,
    rl: &Redlock,
    resource: &str,
) -> (redlock::LockGuard, String) {
    let key = format!("{}lock:{resource}", redlock::DEFAULT_KEY_PREFIX);
    common::set(cluster, 1, &key, "another owner").await;
    let lock = rl
        .try_acquire(resource)
        .await
        .expect("granted by nodes 0 and 2");
    common::del(cluster, 1, &key).await;
    (rl.guard(lock).unwrap(), key)
}

/// A node the acquire did not reach but a renewal put the keys back on has held the lock since:
/// its key deleted there later, with another node hung, is not put back early either (the
/// rule of the test above). A first version asked only the acquire's answers, and put the
/// key back and counted the lock as renewed (found in review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_on_a_node_a_renewal_repaired_is_not_put_back_while_another_hangs() {
    let (cluster, rl) = proxied(3, Duration::from_secs(3), LEASE_NODE_TIMEOUT).await;
    let (guard, key) = refused_on_node_1(&cluster, &rl, "repaired-then-deleted").await;
    repaired_on_node_1(&cluster, &key).await;
    deleted_on_node_1_while_node_2_hangs(&cluster, &guard, &key).await;
}

/// The test above with the guard stopped once node 1 was repaired, and the lock guarded again:
/// what the first guard's renewals learnt stays with the lock. A first version kept it in the
/// guard, and the second one put the key back early (found in review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_a_stopped_guard_repaired_is_not_put_back_by_the_next_guard() {
    let (cluster, rl) = proxied(3, Duration::from_secs(3), LEASE_NODE_TIMEOUT).await;
    let (guard, key) = refused_on_node_1(&cluster, &rl, "repaired-guarded-again").await;
    repaired_on_node_1(&cluster, &key).await;
    let guard = rl.guard(guard.stop_renewal()).unwrap();
    deleted_on_node_1_while_node_2_hangs(&cluster, &guard, &key).await;
}

/// Waits until a renewal put `key` back on node 1.
async fn repaired_on_node_1(cluster: &Cluster, key: &str) {
    assert!(
        on_node_1_within(cluster, key, Duration::from_secs(3)).await,
        "the first renewal did not put the key back on node 1"
    );
}

/// Whether `key` is on node 1 within `limit`.
async fn on_node_1_within(cluster: &Cluster, key: &str, limit: Duration) -> bool {
    common::eventually(limit, || async {
        common::get(cluster, 1, key).await.is_some()
    })
    .await
}

/// Another owner's answer that comes after an early put-back was sent: the put-back no longer
/// counts, and the round is decided then. Node 1 lost the keys (answers at 400 ms, put back at
/// the 560 ms budget, answering at about 960 ms); node 2 answers at about 700 ms that another
/// owner holds the key. A first version counted the put-back, and the lock was renewed on
/// nodes 0 and 1 although between node 2's key being taken and the put-back only node 0 held
/// it (found in review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_owner_answering_after_a_put_back_was_sent_loses_the_lease() {
    let (cluster, rl) = proxied(3, Duration::from_secs(3), LEASE_NODE_TIMEOUT).await;
    let (guard, key) = refused_on_node_1(&cluster, &rl, "taken-after-put-back").await;
    delay(&cluster, 1, 200);
    delay(&cluster, 2, 350);
    common::set(&cluster, 2, &key, "another owner").await;
    let reason = tokio::time::timeout(Duration::from_secs(4), guard.lost()).await;
    assert!(
        matches!(reason, Ok(LostReason::RenewalFailed(_))),
        "the lease with another owner on node 2 and its keys put back on node 1: {reason:?}"
    );
    // The put-back was sent (and took, a known limit: its key stays until the TTL or the
    // release): the round above went through it, not around it.
    let put_back = on_node_1_within(&cluster, &key, Duration::from_secs(1)).await;
    assert!(
        put_back,
        "no put-back reached node 1: the test missed its point"
    );
}

/// A put-back that counted, then a quorum of nodes answering that they lost the keys: the
/// put-back no longer counts, and a node renewing the lock after that does not make a quorum
/// with it. Five nodes: node 1 lost the keys and answers at once (put back at the 560 ms
/// budget, taking them at once); nodes 2 and 3 lost them too and answer at about 700 ms; node
/// 4 renews at about 1 s. A first version counted the put-back for good, renewed the lock with
/// node 4, and put the keys back on nodes 2 and 3 (found in review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_back_that_counted_stops_counting_once_a_quorum_lost_the_keys() {
    let (cluster, rl) = proxied(5, Duration::from_secs(3), LEASE_NODE_TIMEOUT).await;
    let (guard, key) = refused_on_node_1(&cluster, &rl, "put-back-then-gone").await;
    delay(&cluster, 2, 350);
    delay(&cluster, 3, 350);
    delay(&cluster, 4, 500);
    common::del(&cluster, 2, &key).await;
    common::del(&cluster, 3, &key).await;
    let reason = tokio::time::timeout(Duration::from_secs(4), guard.lost()).await;
    assert!(
        matches!(reason, Ok(LostReason::RenewalFailed(_))),
        "the lease with its keys gone from nodes 1, 2 and 3 of five: {reason:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in [2, 3] {
        assert_eq!(
            common::get(&cluster, i, &key).await,
            None,
            "put back on node {i}"
        );
    }
}

/// Delays every packet to and from node `i` by `ms` milliseconds.
fn delay(cluster: &Cluster, i: usize, ms: u64) {
    let proxy = cluster.node(i).proxy().expect("proxied");
    proxy.set_delay(Duration::from_millis(ms), Duration::ZERO);
}

/// The keys gone from a quorum of nodes (the lock was released by another client it was handed
/// to, with its token, or the keys were taken away; here nodes 0 and 1 of three): nothing is
/// put back before the renewal is decided — the lock is not brought back to life, and the lease
/// is lost. Nodes that lost the keys get them back in an undecided round only when they are
/// fewer than a quorum and another node renewed the lock in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_finds_the_keys_gone_from_a_quorum_puts_nothing_back() {
    let (cluster, rl) = proxied(3, Duration::from_secs(3), LEASE_NODE_TIMEOUT).await;
    let lock = rl.try_acquire("gone-from-a-quorum").await.expect("granted");
    let key = format!("{}lock:gone-from-a-quorum", redlock::DEFAULT_KEY_PREFIX);
    for i in 0..2 {
        common::del(&cluster, i, &key).await;
    }
    let guard = rl.guard(lock).unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the next renewal finds the lock gone");
    assert!(matches!(reason, LostReason::RenewalFailed(_)), "{reason}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..2 {
        assert_eq!(
            common::get(&cluster, i, &key).await,
            None,
            "put back on node {i}"
        );
    }
}

/// `nodes` nodes behind fault proxies, and a client of them with every connection open.
async fn proxied(nodes: usize, ttl: Duration, node_timeout: Duration) -> (Cluster, Redlock) {
    let cluster = Cluster::builder()
        .nodes(nodes)
        .proxied(true)
        .start()
        .await
        .unwrap();
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(ttl)
        .node_timeout(node_timeout)
        .build()
        .unwrap();
    rl.connect().await;
    (cluster, rl)
}

/// Takes `count` guarded locks (TTL 2 s) on `nodes` proxied nodes, delays every packet by
/// `delay_ms` each way for `secs` seconds, and answers how many of the locks were lost then.
/// With five nodes, the last one is killed before the delay.
async fn guarded_locks_lost_over_a_slow_link(
    nodes: usize,
    count: usize,
    node_timeout: Duration,
    delay_ms: u64,
    secs: u64,
) -> usize {
    let (cluster, rl) = proxied(nodes, Duration::from_secs(2), node_timeout).await;
    let mut guards = Vec::new();
    for chunk in (0..count).collect::<Vec<_>>().chunks(500) {
        // Three attempts each: 500 acquires at once, beside other test binaries, once had two
        // nodes time out at 600 ms, and the setup failed before the renewals it is about.
        // Each lock is guarded as soon as it is granted: guarded only once the whole chunk was
        // (500 acquires of up to three attempts, under the load of other test binaries), the
        // first ones had little validity left, and could expire in their first renewal over
        // the slow link without any fault of the renewal (found in review of a CI failure).
        let locks = futures_util::future::join_all(chunk.iter().map(|i| {
            let rl = &rl;
            async move {
                let lock = rl
                    .lock(&format!("slow:{i}"))
                    .retry(RetryPolicy::attempts(3))
                    .acquire()
                    .await
                    .unwrap();
                rl.guard(lock).unwrap()
            }
        }))
        .await;
        guards.extend(locks);
    }
    // The slow link starts with every lock renewed at least once on the fast one: what the
    // test measures is the renewal over the slow link, not a setup that left a lock short.
    let settled = Instant::now();
    loop {
        let least = guards
            .iter()
            .map(|g| g.remaining())
            .min()
            .unwrap_or_default();
        if least > Duration::from_secs(1) {
            break;
        }
        assert!(
            settled.elapsed() < Duration::from_secs(5),
            "setup: a guarded lock still had only {least:?} left 5 s after the acquires"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let delay_all = |delay: Duration| {
        for node in cluster.nodes() {
            node.proxy()
                .expect("proxied")
                .set_delay(delay, Duration::ZERO);
        }
    };
    if nodes == 5 {
        cluster.node(4).kill();
    }
    delay_all(Duration::from_millis(delay_ms));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    if lost > 0 {
        // Why, counted by reason: a CI failure must say whether the locks expired between
        // renewals or a renewal was refused or failed.
        let mut reasons = std::collections::BTreeMap::<String, usize>::new();
        for g in guards.iter().filter(|g| g.is_lost()) {
            *reasons.entry(format!("{:?}", g.reason())).or_default() += 1;
        }
        println!("{lost} locks lost, by reason: {reasons:#?}");
    }
    delay_all(Duration::ZERO);
    futures_util::future::join_all(guards.into_iter().map(|g| g.release())).await;
    lost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_contenders_on_one_key_all_make_progress() {
    let cluster = Cluster::start(5).await.unwrap();
    let shared = client(&cluster, Duration::from_secs(5)).build().unwrap();
    let stop = Instant::now() + Duration::from_secs(10);
    let mut tasks = Vec::new();
    for c in 0..8 {
        // Half share one client (local FIFO turns), half have their own (like other processes).
        let rl = if c % 2 == 0 {
            shared.clone()
        } else {
            client(&cluster, Duration::from_secs(5)).build().unwrap()
        };
        tasks.push(tokio::spawn(async move {
            let mut wins = 0u32;
            while Instant::now() < stop {
                let lock = rl
                    .acquire("hot")
                    .await
                    .expect("acquire within its deadline");
                tokio::time::sleep(Duration::from_millis(1)).await;
                // Under heavy CPU load a release can miss its quorum of confirmations; the key
                // then expires with its TTL, which this test must survive, not hide.
                if let Err(e) = rl.release(lock).await {
                    println!("release failed under load: {e}");
                }
                wins += 1;
            }
            wins
        }));
    }
    let mut wins = Vec::new();
    for t in tasks {
        wins.push(t.await.unwrap());
    }
    let total: u32 = wins.iter().sum();
    println!("hand-offs in 10 s: {total}, per contender: {wins:?}");
    assert!(
        wins.iter().all(|w| *w >= 5),
        "a contender starved: {wins:?}"
    );
}

async fn quarantine_scenario(quarantine: bool) -> (bool, Result<redlock::Lock, Error>) {
    let cluster = Cluster::start(3).await.unwrap();
    let ttl = Duration::from_secs(3);
    let build = |c: &Cluster| {
        let b = client(c, ttl).retry(RetryPolicy::once());
        if quarantine {
            b.restart_quarantine(ttl)
        } else {
            b
        }
    };
    let a = build(&cluster).build().unwrap();
    let b = build(&cluster).build().unwrap();
    a.connect().await;
    b.connect().await;
    if quarantine {
        // New servers (just started, identity record just created) are in quarantine too:
        // wait it out, as a deployment would before the first lock.
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    }
    // A gets the lock on the bare quorum {0, 1} while node 2 is down; node 2 comes back empty.
    cluster.node(2).kill();
    let held = a.try_acquire("q").await.expect("A acquires on {0, 1}");
    cluster.node(2).restart(DataOnRestart::Wipe).await.unwrap();
    // Node 1 restarts without its data while A still holds the lock.
    cluster.node(1).restart(DataOnRestart::Wipe).await.unwrap();
    // A few attempts: the first request on a connection to a restarted node may hit the old
    // socket and fail.
    let policy = RetryPolicy::attempts(4).with_delay(Duration::from_millis(20), Duration::ZERO);
    let second = b.lock("q").retry(policy).acquire().await;
    (held.is_valid(), second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_quarantine_prevents_a_double_grant() {
    let (a_valid, b) = quarantine_scenario(true).await;
    assert!(a_valid);
    let err = b.expect_err("B must not get a quorum through the restarted node");
    let quarantined = err.nodes().iter().any(|n| matches!(&n.outcome, redlock::NodeOutcome::Failed(e) if e.kind() == redlock::NodeErrorKind::Quarantined));
    assert!(quarantined, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_control_without_quarantine_the_restart_double_grants() {
    let (a_valid, b) = quarantine_scenario(false).await;
    assert!(a_valid, "A's lock should still be valid");
    assert!(
        b.is_ok(),
        "expected the documented double grant without quarantine, got {b:?}"
    );
}

/// A guarded lock is renewed about once per renewal interval, whatever the drift allowance. A
/// renewal can leave at most `TTL − drift` of validity (drift = TTL · drift factor + 2 ms), and
/// renewals used to be due once the validity dropped to `TTL − interval`: with a drift allowance
/// longer than the interval, a renewed lock was due again at once, and the driver renewed it
/// as fast as the nodes answered. Here TTL 1 s and drift factor 0.4 (allowance 402 ms): a
/// renewal leaves at most 598 ms, so the interval is at most half of that, 299 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_their_interval_with_a_large_drift_factor() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_secs(1))
        .drift_factor(0.4)
        .build()
        .unwrap();
    renewals_come_every(&cluster, &rl, Duration::from_millis(299)).await;
}

/// The same with the default drift factor and a short `renew_every` under a long TTL, a
/// configuration for quick recovery: TTL 60 s (allowance 602 ms), renewed every 500 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_a_short_renew_every_under_a_long_ttl() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_secs(60))
        .renew_every(Duration::from_millis(500))
        .build()
        .unwrap();
    renewals_come_every(&cluster, &rl, Duration::from_millis(500)).await;
}

/// An interval shorter than the driver's shortest tick (5 ms): each lock is renewed at most
/// once per tick. A lock renewed less than a tick after its round started used to be taken
/// again by the same tick as soon as its round ended, so renewals ran back to back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_shorter_than_a_tick_come_once_per_tick() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_secs(1))
        .renew_every(Duration::from_millis(2))
        .build()
        .unwrap();
    renewals_come_every(&cluster, &rl, Duration::from_millis(2)).await;
}

/// Renewals that fail because a majority refuses connections (killed) are retried every
/// quarter interval, or a quarter of the validity left, and at most once per tick of the
/// driver — not back to back as the validity runs out. TTL 3 s: interval 1 s, tick 125 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_renewals_are_not_retried_back_to_back() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(&cluster, Duration::from_secs(3)).build().unwrap();
    let guard = rl.lock("majority-killed").guard().await.expect("free");
    let node = cluster.node(0);
    let before = node.command_calls("evalsha").await;
    cluster.node(1).kill();
    cluster.node(2).kill();
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the lease ends within its validity");
    assert!(matches!(lost, LostReason::Expired), "{lost:?}");
    let calls = node.command_calls("evalsha").await - before;
    println!("{calls} renewal calls on the surviving node until the lease expired");
    // At most one round per 125 ms tick over the validity (under 3 s), with room to spare.
    assert!(
        calls <= 40,
        "{calls} renewal calls on the surviving node while the lease ran out"
    );
}

/// Holds a guarded lock and counts the renewal calls one node gets over two seconds: at most
/// one per 0.8 × `every` (renewals are due up to 20 % early) and at most one per tick of the
/// driver (at least 5 ms), and the lease kept.
async fn renewals_come_every(cluster: &Cluster, rl: &Redlock, every: Duration) {
    let guard = rl.lock("renewed").guard().await.expect("free");
    tokio::time::sleep(every).await;
    let node = cluster.node(0);
    let before = node.command_calls("evalsha").await;
    let window = Duration::from_secs(2);
    tokio::time::sleep(window).await;
    let renewals = node.command_calls("evalsha").await - before;
    println!("{renewals} renewal calls in {window:?}, every {every:?}");
    assert!(!guard.is_lost(), "the lease was lost");
    #[allow(clippy::cast_precision_loss)]
    let counted = renewals as f64;
    let gap = (every.as_secs_f64() * 0.8).max(0.005);
    let most = window.as_secs_f64() / gap + 2.0;
    assert!(
        counted <= most,
        "{renewals} renewal calls in {window:?} (at most {most:.1}, one per {gap} s, for {every:?})"
    );
    guard.release().await.expect("release");
}
