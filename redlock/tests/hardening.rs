//! Regression tests for faults an adversarial audit found: each scenario broke a promise of the
//! docs (two holders at once, a stale holder admitted, a minority fault costing a lease) on real
//! redis-server processes.

mod common;

use std::time::{Duration, Instant};

use common::no_lock_keys_within;
use fencing::MemoryFence;
use redlock::{Error, NodeOutcome, Redlock, RetryPolicy};
use redlock_testkit::{Cluster, DataOnRestart, Persistence};

fn builder(urls: Vec<String>, ttl: Duration) -> redlock::RedlockBuilder {
    Redlock::builder()
        .nodes(urls)
        .ttl(ttl)
        .node_timeout(Duration::from_millis(200))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(10))
                .with_delay(Duration::from_millis(20), Duration::from_millis(20)),
        )
}

/// A lock taken by one client (TTL 30 s) and guarded by another client of the same nodes whose
/// own TTL is 1.5 s: every renewal must re-arm the lock's own TTL, and the validity it reports
/// must be the one the nodes were given. A runtime stalled for 2.5 s must not let a rival in
/// while the lease still says "held".
#[tokio::test(flavor = "current_thread")]
async fn guard_renews_with_the_locks_own_ttl() {
    let cluster = Cluster::start(3).await.unwrap();
    let taker = builder(cluster.urls(), Duration::from_secs(30))
        .build()
        .unwrap();
    let guarding = builder(cluster.urls(), Duration::from_millis(1500))
        .renew_every(Duration::from_millis(400))
        .build()
        .unwrap();
    let rival = builder(cluster.urls(), Duration::from_secs(5))
        .build()
        .unwrap();
    let lock = taker.acquire("foreign-ttl").await.unwrap();
    let guard = guarding.guard(lock).unwrap();
    // Let a few renewals happen, then stall the whole runtime (no renewal can run).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    std::thread::sleep(Duration::from_millis(2500));
    let held = !guard.is_lost() && guard.remaining() > Duration::ZERO;
    let rival_got_it = rival.try_acquire("foreign-ttl").await;
    assert!(
        !(held && rival_got_it.is_ok()),
        "two holders: the lease says held with {:?} left while a rival acquired",
        guard.remaining()
    );
    assert!(held, "a 30 s lock must survive a 2.5 s stall");
    drop(rival_got_it);
    guard.release().await.unwrap();
}

/// One server listed under two spellings must not cast two votes: the client refuses to use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_server_twice_is_a_config_error() {
    let cluster = Cluster::start(2).await.unwrap();
    let p0 = cluster.node(0).port();
    let p1 = cluster.node(1).port();
    let rl = builder(
        vec![
            format!("redis://127.0.0.1:{p0}"),
            format!("redis://localhost:{p0}"),
            format!("redis://127.0.0.1:{p1}"),
        ],
        Duration::from_secs(5),
    )
    .build()
    .unwrap();
    // Connecting reads each server's identity: the second address of one server is refused.
    let reports = rl.connect().await;
    let refused = reports
        .iter()
        .filter(|r| matches!(&r.outcome, redlock::NodeOutcome::Failed(e) if e.kind() == redlock::NodeErrorKind::Identity))
        .count();
    assert_eq!(refused, 1, "{reports:?}");
    let got = rl.try_acquire("two-names").await;
    assert!(
        matches!(got, Err(Error::Config(_))),
        "expected a configuration error, got {got:?}"
    );
}

/// Fence tokens name nodes by the server's identity, not by the URL's spelling: two clients of
/// the same servers, one using `127.0.0.1` and one `localhost`, produce comparable tokens, so a
/// stale holder's token is rejected after a newer grant was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_tokens_name_servers_not_urls() {
    let cluster = Cluster::start(3).await.unwrap();
    let by_ip: Vec<String> = cluster.urls();
    let by_name: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://localhost:{}", n.port()))
        .collect();
    let a = builder(by_ip, Duration::from_millis(300)).build().unwrap();
    let b = builder(by_name, Duration::from_secs(5)).build().unwrap();
    let fence = MemoryFence::new();

    // A's earlier grant was admitted: the high water now names A's spelling of the nodes.
    let g0 = a.acquire("fenced").await.unwrap();
    fence.admit("fenced", &g0.fence().unwrap()).unwrap();
    a.release(g0).await.unwrap();
    // A takes the lock again, then stalls past its TTL without writing.
    let g1 = a.acquire("fenced").await.unwrap();
    let stale = g1.fence().unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // B takes the lock (a newer grant on the same servers) and writes.
    let g2 = b.acquire("fenced").await.unwrap();
    fence.admit("fenced", &g2.fence().unwrap()).unwrap();
    // Claims list the quorum that granted; across both clients they name at most 3 servers.
    let mut names: Vec<String> = g1
        .claims()
        .iter()
        .chain(g2.claims())
        .map(|c| c.node.to_string())
        .collect();
    names.sort();
    names.dedup();
    assert!(
        names.len() <= 3,
        "claims of the same 3 servers carry {} node names: {names:?}",
        names.len()
    );
    // A wakes up and writes with its stale token: it must be refused.
    let late = fence.admit("fenced", &stale);
    assert!(
        late.is_err(),
        "a stale token was admitted after a newer grant"
    );
    drop(g1);
    b.release(g2).await.unwrap();
}

/// A guarded lock must survive a minority node that accepts connections but never answers
/// (paused before the client ever connected to it): renewal decides at quorum and does not
/// wait on a connection being opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_does_not_wait_for_a_hung_minority_node() {
    let cluster = Cluster::start(3).await.unwrap();
    cluster.node(2).pause();
    let rl = builder(cluster.urls(), Duration::from_secs(2))
        .node_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let guard = rl
        .guard(rl.acquire("hung-minority").await.unwrap())
        .unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let lost = guard.is_lost();
    let reason = guard.reason();
    cluster.node(2).resume();
    assert!(!lost, "lease lost with one hung minority node: {reason:?}");
    guard.release().await.unwrap();
}

/// Guarding a lock late in its validity renews it at once instead of a third of a TTL later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_renews_at_once_when_validity_is_short() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = builder(cluster.urls(), Duration::from_secs(3))
        .build()
        .unwrap();
    let lock = rl.acquire("late-guard").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let guard = rl.guard(lock).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !guard.is_lost(),
        "lease lost without a renewal: {:?}",
        guard.reason()
    );
    assert!(guard.remaining() > Duration::from_millis(500));
    guard.release().await.unwrap();
}

/// `SCRIPT FLUSH` on a node while many private locks cycle: the NOSCRIPT fallback must not let
/// a release run before its own acquire, or keys outlive their released owners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_keeps_release_behind_acquire() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = builder(cluster.urls(), Duration::from_secs(30))
        .node_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let flusher = {
        let node = cluster.node(0).connection().await.unwrap();
        tokio::spawn(async move {
            let mut node = node;
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(8) {
                let _: Result<(), _> = redlock_testkit::redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query_async(&mut node)
                    .await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let rl = rl.clone();
            tokio::spawn(async move {
                for i in 0..150 {
                    let resource = format!("flush-{t}-{i}");
                    if let Ok(lock) = rl.try_acquire(&resource).await {
                        let _ = rl.release(lock).await;
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    flusher.abort();
    let left = common::lock_keys(&cluster).await;
    assert!(
        no_lock_keys_within(&cluster, Duration::from_secs(3)).await,
        "{} lock keys outlived their released owners, e.g. {:?}",
        left.len(),
        left.first()
    );
}

/// After one node restarts empty the lock lives on a bare quorum; renewal puts the key back
/// where nobody else holds it, so a second restart of another node does not lose the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_repairs_a_node_that_lost_the_key() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = builder(cluster.urls(), Duration::from_secs(2))
        .build()
        .unwrap();
    let rival = builder(cluster.urls(), Duration::from_secs(2))
        .build()
        .unwrap();
    let guard = rl.guard(rl.acquire("repair").await.unwrap()).unwrap();
    cluster.node(0).restart(DataOnRestart::Wipe).await.unwrap();
    // Renewals (every ~667 ms) put the key back on node 0.
    let repaired = common::eventually(Duration::from_secs(3), || async {
        common::get(&cluster, 0, "redlock:lock:repair")
            .await
            .is_some()
    })
    .await;
    assert!(repaired, "renewal did not put the lost key back on node 0");
    cluster.node(1).restart(DataOnRestart::Wipe).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let rival_got_it = rival.try_acquire("repair").await.is_ok();
    assert!(!rival_got_it, "a rival acquired while the lease was held");
    assert!(
        !guard.is_lost(),
        "lease lost after two single-node restarts: {:?}",
        guard.reason()
    );
    guard.release().await.unwrap();
}

/// The node that lost the key may well be the slowest to answer a renewal (its connection
/// and script cache are new): a renewal is decided at its quorum, but the late answer that the
/// key is missing must still lead to the repair, or the lease stays on a bare quorum for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_repairs_a_node_that_answers_after_the_quorum() {
    let cluster = Cluster::builder()
        .nodes(3)
        .proxied(true)
        .start()
        .await
        .expect("cluster");
    let rl = builder(cluster.urls(), Duration::from_secs(2))
        .build()
        .unwrap();
    let guard = rl.guard(rl.acquire("late-repair").await.unwrap()).unwrap();
    // Node 0 answers 40 ms late (well inside the 200 ms node timeout), so the renewals are
    // always decided by nodes 1 and 2 before its answer comes.
    let proxy = cluster.node(0).proxy().expect("proxied");
    proxy.set_delay(Duration::from_millis(40), Duration::ZERO);
    cluster.node(0).restart(DataOnRestart::Wipe).await.unwrap();
    // Renewals every ~667 ms: four of them in this time.
    let repaired = common::eventually(Duration::from_secs(3), || async {
        common::get(&cluster, 0, "redlock:lock:late-repair")
            .await
            .is_some()
    })
    .await;
    assert!(
        repaired,
        "renewals did not put the lost key back on node 0, whose answers come after the quorum"
    );
    assert!(!guard.is_lost(), "{:?}", guard.reason());
    guard.release().await.unwrap();
}

/// Two clients of three nodes with the restart quarantine on, once the new servers' own
/// quarantine has passed.
async fn quarantined_pair(cluster: &Cluster, ttl: Duration) -> (Redlock, Redlock) {
    let build = || {
        builder(cluster.urls(), ttl)
            .restart_quarantine(ttl)
            .retry(RetryPolicy::once())
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    a.connect().await;
    b.connect().await;
    // New servers are in quarantine too (just started, identity just recorded): wait it out.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    (a, b)
}

/// B's attempt a few times (the first request on a connection to a restarted node may still
/// hit the old socket), stopping at a grant.
async fn rival_attempts(b: &Redlock, resource: &str) -> Result<redlock::Lock, Error> {
    let mut last = b.try_acquire(resource).await;
    for _ in 0..3 {
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        last = b.try_acquire(resource).await;
    }
    last
}

fn quarantined_nodes(err: &Error) -> usize {
    err.nodes()
        .iter()
        .filter(|n| matches!(&n.outcome, redlock::NodeOutcome::Failed(e) if e.kind() == redlock::NodeErrorKind::Quarantined))
        .count()
}

/// Restart quarantine against partial data loss: two nodes are restored from a backup taken
/// before the lock existed. Their identity (and any birth record) survives, the live lock key
/// does not — and they must not grant it again to a rival while the holder still counts on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_holds_after_a_restore_from_an_older_snapshot() {
    let cluster = Cluster::start(3).await.unwrap();
    let ttl = Duration::from_secs(3);
    let (a, b) = quarantined_pair(&cluster, ttl).await;
    let snapshots = [
        cluster.node(0).snapshot().await.unwrap(),
        cluster.node(1).snapshot().await.unwrap(),
    ];
    let held = a.try_acquire("restored").await.expect("A acquires");
    cluster
        .node(0)
        .restore_snapshot(&snapshots[0])
        .await
        .unwrap();
    cluster
        .node(1)
        .restore_snapshot(&snapshots[1])
        .await
        .unwrap();
    let rival = rival_attempts(&b, "restored").await;
    assert!(held.is_valid(), "A's lock should still be valid");
    let err = rival.expect_err("two holders: the restored nodes granted the live lock again");
    assert!(quarantined_nodes(&err) >= 1, "{err}");
}

/// The limit of the restart quarantine: a backup restored into a *running* server (`FLUSHALL`,
/// then the backup's keys written back with `RESTORE`, as restore tools do) brings back the
/// identity record unchanged, and the server did not restart — no client can notice, and the
/// node grants a live lock again. Negative control for docs/operations.md §9 ("Restoring a
/// backup"): restart the server on the restored files, or leave the identity record out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_control_a_backup_restored_in_place_is_not_noticed() {
    let cluster = Cluster::start(3).await.unwrap();
    let ttl = Duration::from_secs(2);
    let (a, b) = quarantined_pair(&cluster, ttl).await;
    let mut backups = Vec::new();
    for i in 0..2 {
        let mut c = cluster.node(i).connection().await.unwrap();
        let keys: Vec<String> = redlock_testkit::redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut c)
            .await
            .unwrap();
        let mut dumped = Vec::new();
        for key in keys {
            let value: Vec<u8> = redlock_testkit::redis::cmd("DUMP")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap();
            dumped.push((key, value));
        }
        backups.push(dumped);
    }
    let held = a.try_acquire("in-place").await.expect("A acquires");
    for (i, dumped) in backups.iter().enumerate() {
        let mut c = cluster.node(i).connection().await.unwrap();
        let () = redlock_testkit::redis::cmd("FLUSHALL")
            .query_async(&mut c)
            .await
            .unwrap();
        for (key, value) in dumped {
            let () = redlock_testkit::redis::cmd("RESTORE")
                .arg(key)
                .arg(0)
                .arg(value)
                .query_async(&mut c)
                .await
                .unwrap();
        }
    }
    let rival = b.try_acquire("in-place").await;
    assert!(held.is_valid(), "A's lock should still be valid");
    assert!(
        rival.is_ok(),
        "the restored nodes were expected to grant again (the documented limit): {rival:?}"
    );
}

/// Restart quarantine keys on the restart, not on which data survived: nodes with AOF
/// `everysec` killed with `kill -9` and restarted with whatever their files hold are kept out
/// of every quorum for the quarantine, whether or not the lock key made it to disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_holds_after_kill_9_with_aof_everysec() {
    let cluster = Cluster::builder()
        .nodes(3)
        .persistence(Persistence::AofEverysec)
        .start()
        .await
        .unwrap();
    let ttl = Duration::from_secs(3);
    let (a, b) = quarantined_pair(&cluster, ttl).await;
    let held = a.try_acquire("aof").await.expect("A acquires");
    cluster
        .node(0)
        .restart(DataOnRestart::AsOnDisk)
        .await
        .unwrap();
    cluster
        .node(1)
        .restart(DataOnRestart::AsOnDisk)
        .await
        .unwrap();
    let rival = rival_attempts(&b, "aof").await;
    assert!(held.is_valid(), "A's lock should still be valid");
    let err = rival.expect_err("two holders after kill -9");
    assert_eq!(
        quarantined_nodes(&err),
        2,
        "both restarted nodes must be out of the quorum, whatever survived: {err}"
    );
}

/// A lock belongs to the node list it was taken on: a client of other nodes must not guard,
/// extend or release it (its renewals and deletes would go to the wrong servers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_other_nodes_cannot_guard_extend_or_release_a_lock() {
    let cluster = Cluster::start(4).await.unwrap();
    let urls = cluster.urls();
    let a = builder(urls[..3].to_vec(), Duration::from_secs(5))
        .build()
        .unwrap();
    let other = builder(urls[1..].to_vec(), Duration::from_secs(5))
        .build()
        .unwrap();
    let same = builder(urls[..3].to_vec(), Duration::from_millis(700))
        .build()
        .unwrap();
    let mut lock = a.acquire("foreign").await.unwrap();
    assert!(!other.owns(&lock));
    assert!(matches!(
        other.extend(&mut lock).await,
        Err(Error::ForeignLock { .. })
    ));
    // A client of the same nodes (whatever its own TTL) may take it over.
    assert!(same.owns(&lock));
    match other.guard(lock) {
        Err(Error::ForeignLock { .. }) => {}
        other => panic!("expected ForeignLock, got {other:?}"),
    }
    let lock = a.acquire("foreign-2").await.unwrap();
    assert!(matches!(
        other.release(lock).await,
        Err(Error::ForeignLock { .. })
    ));
}

/// A fresh process (no connection open yet) facing a majority of hung nodes — they accept
/// connections but never answer — gets its answer within a short, documented bound: the node
/// timeout plus at most four more while a connection is being opened (250 ms by default), not
/// the connect timeout (5 s here, so that waiting for it cannot pass for room a busy machine
/// needs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_client_facing_a_hung_majority_answers_within_the_documented_bound() {
    let cluster = Cluster::start(3).await.unwrap();
    for i in 0..2 {
        cluster.node(i).pause();
    }
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .retry(RetryPolicy::once())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let started = Instant::now();
    let got = rl.try_acquire("fresh").await;
    let took = started.elapsed();
    for i in 0..2 {
        cluster.node(i).resume();
    }
    assert!(
        got.as_ref().is_err_and(Error::is_quorum_unreachable),
        "{got:?}"
    );
    let bound = redlock::DEFAULT_NODE_TIMEOUT * 5;
    // Each hung node names the budget it was given: exactly the documented bound (the room
    // below is for a busy machine's scheduling only).
    let err = got.unwrap_err();
    let hung = err
        .nodes()
        .iter()
        .filter(|n| n.outcome == NodeOutcome::TimedOut { after: bound })
        .count();
    assert_eq!(hung, 2, "{err}");
    assert!(
        took < bound + Duration::from_secs(1),
        "took {took:?}; documented bound {bound:?}"
    );
}

/// Data loss without a restart (`FLUSHALL`) on a majority while a lock is held: the nodes'
/// identity records are gone, the acquire script notices, and the nodes rejoin only as new
/// servers after the quarantine — no second holder meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_on_a_majority_does_not_hand_out_a_held_lock() {
    let cluster = Cluster::start(3).await.unwrap();
    let ttl = Duration::from_secs(3);
    let (a, b) = quarantined_pair(&cluster, ttl).await;
    let held = a.try_acquire("flushed").await.expect("A acquires");
    for i in 0..2 {
        let mut c = cluster.node(i).connection().await.unwrap();
        let () = redlock_testkit::redis::cmd("FLUSHALL")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let rival = rival_attempts(&b, "flushed").await;
    assert!(held.is_valid(), "A's lock should still be valid");
    let err = rival.expect_err("two holders after FLUSHALL");
    let kinds: Vec<String> = err.nodes().iter().map(|n| n.outcome.to_string()).collect();
    assert!(quarantined_nodes(&err) >= 1, "{kinds:?}");
}

/// One renewal batch that cannot reach a quorum is not a loss while validity remains: a
/// majority paused for a moment (shorter than the validity left) costs the lease nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_renewal_batch_is_retried_within_the_validity() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = builder(cluster.urls(), Duration::from_secs(3))
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let guard = rl.guard(rl.acquire("blip").await.unwrap()).unwrap();
    // A renewal is due about 1 s after the acquire; the majority is away from 0.8 s to 2.0 s.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for i in 0..2 {
        cluster.node(i).pause();
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for i in 0..2 {
        cluster.node(i).resume();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !guard.is_lost(),
        "lease lost to one failed renewal batch: {:?}",
        guard.reason()
    );
    assert!(guard.remaining() > Duration::from_millis(1000));
    guard.release().await.unwrap();
}

/// A lock won by a racing attempt while the connection to a third node is being opened (that
/// node hangs: it accepts the connection and answers nothing), then released at once. The
/// lock's acquire and then its release wait for that connection, in order. The release phase
/// gives up on the node before the acquire phase does (a racing phase allows its other nodes a
/// quarter of their budget more). When the node answers in between, its grant must not stay
/// behind: a release is sent even when nobody waits for its answer any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waiting_for_a_connection_is_sent_after_the_grant_ahead_of_it() {
    let cluster = Cluster::start(3).await.unwrap();
    let resource = "late-grant";
    let key = format!("redlock:lock:{resource}");
    let channel = format!("redlock:release:{resource}");
    // j: the node whose connection will be re-opened; it must not be the one racing attempts
    // ask first (they would wait for it).
    let j = (common::racing_first_node_of(&cluster, resource).await + 1) % 3;
    let open: Vec<usize> = (0..3).filter(|&i| i != j).collect();
    for &o in &open {
        common::set(&cluster, o, &key, "foreign").await;
    }
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(20))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(60))
                .with_delay(Duration::from_secs(10), Duration::ZERO),
        )
        .build()
        .unwrap();
    let holder = {
        let rl = rl.clone();
        tokio::spawn(async move {
            let lock = rl.acquire(resource).await?;
            let released_at = Instant::now();
            rl.release(lock).await.map(|_| released_at)
        })
    };
    let subscribed = || async { common::subscribed_nodes(&cluster, &channel).await >= 2 };
    assert!(common::eventually(Duration::from_secs(5), subscribed).await);
    // The waiter's second attempt follows its subscription; its third comes 10 s later.
    let second = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Its third attempt finds the connection to j closed and drops it; the cleanup re-opens it
    // against a node that hangs.
    cluster.node(j).kill_clients().await.unwrap();
    cluster.node(j).pause();
    tokio::time::sleep_until((second + Duration::from_millis(10_500)).into()).await;
    // The other owner leaves and the waiter is woken: it races, the two open nodes grant, and
    // j's request waits for its connection; the lock is released at once.
    for &o in &open {
        let mut c = cluster.node(o).connection().await.unwrap();
        let _: i64 = redlock_testkit::redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let woken = Instant::now();
    let mut c = cluster.node(open[0]).connection().await.unwrap();
    let _: i64 = redlock_testkit::redis::cmd("PUBLISH")
        .arg(&channel)
        .arg("")
        .query_async(&mut c)
        .await
        .unwrap();
    let released_at = tokio::time::timeout(Duration::from_secs(5), holder)
        .await
        .expect("the waiter took and released the lock")
        .unwrap()
        .unwrap();
    assert!(
        released_at - woken < Duration::from_secs(1),
        "the race waited for the hung node: {:?}",
        released_at - woken
    );
    // Not open, j's budget is 5 s: the release gives up on it 6 s after it was made, the
    // acquire 6.25 s after the race began. Let j answer in between.
    tokio::time::sleep_until((woken + Duration::from_millis(6120)).into()).await;
    cluster.node(j).resume();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let left = common::get(&cluster, j, &key).await;
    assert_eq!(left, None, "node {j} kept the released lock's key");
}

/// xorshift64: the test's random choices, reproducible per task.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Hot keys, several clients (racing through a first node, batches, local hand-offs), and
/// callers that give up at random moments: acquires dropped mid-attempt, extensions and releases
/// dropped mid-way. No two validity windows the clients were told of overlap, and no lock key is
/// left once every cleanup and release had its budget and grace (they reach every node even
/// when nobody waits for them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_callers_on_hot_keys_leave_nothing_behind() {
    let cluster = Cluster::start(3).await.expect("cluster");
    let clients: Vec<Redlock> = (0..3)
        .map(|_| {
            Redlock::builder()
                .nodes(cluster.urls())
                .ttl(Duration::from_secs(20))
                .node_timeout(Duration::from_millis(200))
                .retry(
                    RetryPolicy::deadline(Duration::from_millis(400))
                        .with_delay(Duration::from_millis(20), Duration::from_millis(10)),
                )
                .build()
                .unwrap()
        })
        .collect();
    let windows = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Instant::now() + Duration::from_secs(8);
    let mut tasks = Vec::new();
    for (c, rl) in clients.iter().enumerate() {
        for t in 0..10u64 {
            let rl = rl.clone();
            let windows = std::sync::Arc::clone(&windows);
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((c as u64) << 32 | t) | 1);
                let (mut won, mut cancelled) = (0u32, 0u32);
                while Instant::now() < stop {
                    let r = format!("hot{}", rng.below(2));
                    let cancel_after = Duration::from_micros(rng.below(30_000));
                    let got = if rng.below(4) == 0 {
                        tokio::time::timeout(cancel_after, rl.try_acquire(&r)).await
                    } else {
                        tokio::time::timeout(cancel_after, rl.acquire(&r)).await
                    };
                    let mut lock = match got {
                        Ok(Ok(lock)) => lock,
                        Ok(Err(_)) => continue,
                        Err(_) => {
                            cancelled += 1;
                            continue;
                        }
                    };
                    let start = std::time::Instant::now();
                    won += 1;
                    tokio::time::sleep(Duration::from_micros(rng.below(3_000))).await;
                    if rng.below(3) == 0 {
                        // An extension, maybe cut short.
                        let cut = Duration::from_micros(rng.below(4_000));
                        let _ = tokio::time::timeout(cut, rl.extend(&mut lock)).await;
                    }
                    let valid_until = lock.valid_until();
                    let end = std::time::Instant::now().min(valid_until);
                    windows.lock().unwrap().push((r.clone(), start, end));
                    if rng.below(3) == 0 {
                        let cut = Duration::from_micros(rng.below(2_000));
                        let _ = tokio::time::timeout(cut, rl.release(lock)).await;
                    } else {
                        let _ = rl.release(lock).await;
                    }
                }
                (won, cancelled)
            }));
        }
    }
    let (mut won, mut cancelled) = (0, 0);
    for t in tasks {
        let (w, c) = t.await.unwrap();
        won += w;
        cancelled += c;
    }
    eprintln!("won {won}, cancelled {cancelled}");
    let mut w = windows.lock().unwrap().clone();
    w.sort_by_key(|(r, s, _)| (r.clone(), *s));
    let mut overlaps = Vec::new();
    let mut reach: Option<(String, std::time::Instant)> = None;
    for (r, s, e) in &w {
        match &mut reach {
            Some((rr, end)) if rr == r => {
                if s < end {
                    overlaps.push((r.clone(), *end - *s));
                }
                *end = (*end).max(*e);
            }
            _ => reach = Some((r.clone(), *e)),
        }
    }
    assert!(
        overlaps.is_empty(),
        "{} overlapping holders: {:?}",
        overlaps.len(),
        &overlaps[..overlaps.len().min(5)]
    );
    // Every cleanup and release has had its node budget and the delivery grace by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut left = Vec::new();
    for i in 0..3 {
        for (k, pttl) in cluster
            .node(i)
            .keys_with_pttl("redlock:lock:*")
            .await
            .unwrap()
        {
            left.push((i, k, pttl));
        }
    }
    assert!(
        left.is_empty(),
        "lock keys left behind (node, key, PTTL ms): {left:?}"
    );
}

/// A server whose clock was stepped back past its start reports a negative uptime (Redis 7.0:
/// `uptime_in_seconds:-3597` an hour back, 3 s after it started). The quarantine must take it
/// for a server that just started — sit out the quarantine, then count — not fail every
/// connection until its clock has caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_clock_went_back_past_its_start_sits_out_the_quarantine() {
    let cluster = Cluster::builder()
        .nodes(1)
        .fake_clock(true)
        .start()
        .await
        .unwrap();
    cluster.node(0).jump_clock(-3_600_000).unwrap();
    let ttl = Duration::from_secs(1);
    let rl = builder(cluster.urls(), ttl)
        .restart_quarantine(ttl)
        .retry(RetryPolicy::once())
        .build()
        .unwrap();
    let started = Instant::now();
    let mut refusals: Vec<String> = Vec::new();
    loop {
        match rl.try_acquire("stepped-back").await {
            Ok(lock) => {
                rl.release(lock).await.unwrap();
                break;
            }
            Err(e) if started.elapsed() < Duration::from_secs(10) => {
                if quarantined_nodes(&e) == 0 && refusals.len() < 3 {
                    refusals.push(e.to_string());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!(
                "no grant within 10 s of the clock step; first refusals other than the \
                 quarantine: {refusals:?}; last: {e}"
            ),
        }
    }
    assert!(
        refusals.is_empty(),
        "refused for other reasons than the quarantine: {refusals:?}"
    );
}
