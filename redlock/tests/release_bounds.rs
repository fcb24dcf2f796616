//! Releases of locks taken with the caller's token (`try_acquire_with_token`), whose deletes are
//! bounded on the nodes' clocks and waited for by the next re-claim with the token, under
//! attack (from a review of the first version, 2026-12-05; real redis-server processes,
//! loopback only, every wait bounded). On that version: the background-release re-claims gave
//! two holders (PTTL `[-2, -2, ~9894]`, a rival took the lock), a release cut short sent
//! nothing (`[~9546, ~9546, -2]`), a release right after its acquire took 1.20 s, releases
//! after a renewal put keys back said done or failed with the keys left on a majority, and a
//! release after a clock step said done with the keys left — 5 runs of 5 each; all but the
//! last passed on the build before it.

mod common;

use std::time::{Duration, Instant};

use redlock::{Redlock, Token};

fn client(urls: Vec<String>, node_timeout: Duration, ttl: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .ttl(ttl)
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

/// A resource whose first node is `want`, for client `c`.
fn resource_with_first(c: &Redlock, prefix: &str, want: usize) -> String {
    (0..10_000)
        .map(|k| format!("{prefix}-{k}"))
        .find(|r| c.first_node(r) == Some(want))
        .expect("a resource with that first node")
}

/// Node 2's link takes 1.5 s each way while X (through proxies, 200 ms node timeout) takes a
/// lock with its own token: nodes 0 and 1 grant, node 2's answer is out. X releases at once.
/// Returns (the release's result or None if cut short, how long it ran, PTTLs 300 ms after).
async fn release_with_an_acquire_answer_out(
    name: &str,
    cut_after: Option<Duration>,
) -> (
    Option<Result<(), String>>,
    Duration,
    Vec<i64>,
    Result<(), String>,
) {
    let cluster = common::proxied(3).await;
    let direct = common::direct_urls(&cluster);
    let x = client(
        cluster.urls(),
        Duration::from_millis(200),
        Duration::from_secs(10),
    );
    let rival = client(direct, Duration::from_millis(50), Duration::from_secs(10));
    let _ = x.connect().await;
    let _ = rival.connect().await;
    let resource = resource_with_first(&x, name, 0);
    cluster
        .node(2)
        .proxy()
        .unwrap()
        .set_delay(Duration::from_millis(1500), Duration::ZERO);
    let token = Token::random().unwrap();
    let lock = x
        .try_acquire_with_token([resource.as_str()], &token)
        .await
        .expect("nodes 0 and 1 grant");
    let started = Instant::now();
    let result = match cut_after {
        None => Some(common::shown(&x.release(lock).await)),
        Some(limit) => tokio::time::timeout(limit, x.release(lock))
            .await
            .ok()
            .map(|r| common::shown(&r)),
    };
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pttls = common::pttls(&cluster, &format!("redlock:lock:{resource}")).await;
    let rival_got = rival.try_acquire(&resource).await;
    let rival_shown = common::shown(&rival_got);
    println!("release: {result:?} after {took:?}; PTTL {pttls:?}; rival: {rival_shown:?}");
    (result, took, pttls, rival_shown)
}

/// `Redlock::release` docs: "Returns once enough nodes confirmed that no quorum can still hold
/// the lock; slower nodes finish in the background."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_after_its_acquire_returns_at_quorum() {
    let (result, took, _, _) = release_with_an_acquire_answer_out("rb-fast", None).await;
    assert_eq!(result, Some(Ok(())));
    assert!(
        took < Duration::from_millis(300),
        "the release took {took:?}"
    );
}

/// `Redlock::release` docs, cancel safety: "The deletes are sent by a background task;
/// dropping the future does not stop them." The caller bounds the release at 150 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_short_while_an_acquire_answer_is_out_still_deletes() {
    let (_, _, pttls, rival) =
        release_with_an_acquire_answer_out("rb-cut", Some(Duration::from_millis(150))).await;
    assert!(
        pttls[0] < 0 && pttls[1] < 0,
        "the keys stayed on nodes 0 and 1: PTTL {pttls:?}"
    );
    assert_eq!(rival, Ok(()), "the lock is held by nobody");
}

/// X takes a lock with its own token while node R cannot grant it (`how`: "refused", R holds
/// the key for someone else, expiring in 800 ms; "failed", R's link resets every connection
/// until 500 ms after the grant): the first node F and node B grant. X guards it (TTL 3 s);
/// later a renewal finds the key missing on R and puts X's key back there. Then B's link is
/// blackholed and X releases. Reports (release ok, nodes holding after).
async fn release_after_a_put_back(name: &str, how: &str) -> (bool, usize) {
    let cluster = common::proxied(3).await;
    let direct = common::direct_urls(&cluster);
    let x = client(
        cluster.urls(),
        Duration::from_millis(200),
        Duration::from_secs(3),
    );
    let rival = client(direct, Duration::from_millis(50), Duration::from_secs(3));
    let _ = x.connect().await;
    let _ = rival.connect().await;
    let (f, r, b) = (0, 1, 2);
    let resource = resource_with_first(&x, name, f);
    let key = format!("redlock:lock:{resource}");
    if how == "refused" {
        common::set_px(&cluster, r, &key, "someone-else", 800).await;
    } else {
        cluster.node(r).proxy().unwrap().partition();
    }
    let token = Token::random().unwrap();
    let lock = x
        .try_acquire_with_token([resource.as_str()], &token)
        .await
        .expect("F and B grant");
    println!("acquired; PTTL {:?}", common::pttls(&cluster, &key).await);
    let guard = x.guard(lock).unwrap();
    if how != "refused" {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.node(r).proxy().unwrap().heal();
    }
    // X's own key on R (not the foreign one, which expires at 800 ms).
    let put_back = common::eventually(Duration::from_secs(4), || async {
        common::get(&cluster, r, &key)
            .await
            .is_some_and(|v| v != "someone-else")
    })
    .await;
    // The put-back is on R before the client has read its answer, which carries R's clock and
    // lets the release delete there: under load in a fresh-clone CI run (6e0745a) the release
    // came first, withheld R's delete (no clock read there) and the key stayed on R and B.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = common::pttls(&cluster, &key).await;
    println!(
        "renewed; PTTL {before:?}; lease valid {:?}",
        guard.remaining()
    );
    assert!(put_back, "the renewal put the key back on R: {before:?}");
    cluster.node(b).proxy().unwrap().blackhole();
    let released = guard.release().await;
    let report = match &released {
        Ok(rep) => rep
            .nodes
            .iter()
            .map(|n| n.outcome.to_string())
            .collect::<Vec<_>>(),
        Err(e) => vec![e.to_string()],
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = common::pttls(&cluster, &key).await;
    let rival_got = rival.try_acquire(&resource).await;
    println!(
        "release: {:?} {report:?}; PTTL {after:?}; rival: {:?}",
        common::shown(&released),
        common::shown(&rival_got)
    );
    cluster.node(b).proxy().unwrap().heal();
    (released.is_ok(), after.iter().filter(|&&ms| ms > 0).count())
}

/// The release must reach R: the first version sent it nothing (R "refused the acquire:
/// nothing of the lock is there") and counted it as confirming — done, with the keys on R and B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_reaches_a_refused_node_a_renewal_put_the_keys_back_on() {
    let (ok, holding) = release_after_a_put_back("rb-repaired", "refused").await;
    assert!(
        !(ok && holding >= 2),
        "the release said done while {holding} of 3 nodes still hold the key"
    );
}

/// The release must reach R: the first version withheld R's delete (no grant of the acquire
/// was read there) and failed, with the keys on R and B for their TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_reaches_a_failed_node_a_renewal_put_the_keys_back_on() {
    let (_, holding) = release_after_a_put_back("rb-repaired-failed", "failed").await;
    assert!(
        holding < 2,
        "{holding} of 3 nodes still hold the key after the release"
    );
}

/// X (through proxies, 200 ms node timeout) takes a lock with its own token while node 2's
/// link takes 1.5 s each way (nodes 0 and 1 grant). The lock is released in the background
/// (`how`: its guard dropped, or `release` spawned); 400 ms later X takes the lock again with
/// the token, on the same connections. The re-claim must keep its lock.
async fn reclaim_after_a_background_release(name: &str, how: &str) {
    let cluster = common::proxied(3).await;
    let direct = common::direct_urls(&cluster);
    let x = client(
        cluster.urls(),
        Duration::from_millis(200),
        Duration::from_secs(10),
    );
    let rival = client(direct, Duration::from_millis(50), Duration::from_secs(10));
    let _ = x.connect().await;
    let _ = rival.connect().await;
    let resource = resource_with_first(&x, name, 0);
    let key = format!("redlock:lock:{resource}");
    cluster
        .node(2)
        .proxy()
        .unwrap()
        .set_delay(Duration::from_millis(1500), Duration::ZERO);
    let token = Token::random().unwrap();
    let lock = x
        .try_acquire_with_token([resource.as_str()], &token)
        .await
        .expect("nodes 0 and 1 grant");
    let released_at = Instant::now();
    let bg = match how {
        "guard" => {
            drop(x.guard(lock).unwrap());
            None
        }
        _ => {
            let x2 = x.clone();
            Some(tokio::spawn(async move {
                let r = x2.release(lock).await;
                (common::shown(&r), Instant::now())
            }))
        }
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    println!(
        "PTTL before the re-claim {:?}",
        common::pttls(&cluster, &key).await
    );
    let started = Instant::now();
    let lock = x
        .try_acquire_with_token([resource.as_str()], &token)
        .await
        .expect("X re-claims");
    println!(
        "re-claimed {:?} after the release started, in {:?}",
        started - released_at,
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    if let Some(bg) = bg {
        let (r, done) = bg.await.unwrap();
        println!(
            "background release: {r:?}, done {:?} after it started",
            done - released_at
        );
    }
    common::assert_one_holder(&cluster, &rival, &resource, &lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_after_a_dropped_guard_keeps_its_lock() {
    reclaim_after_a_background_release("rb-guard", "guard").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_after_a_spawned_release_keeps_its_lock() {
    reclaim_after_a_background_release("rb-spawned", "spawn").await;
}

/// A lock taken with a fresh token whose token was read (`Lock::token`), released while nodes 1
/// and 2 are 1.3 s away (the release fails), then re-claimed with that token at once at the
/// servers' own addresses: two holders on cb2425b and 2f3163f (review: PTTL `[~8297, -2, -2]`,
/// a rival took the lock). No node clock bounds such deletes, but the re-claim waits for them
/// as long as the release waits for their answers (1.4 s here), and they land within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_with_a_read_token_after_a_failed_release_keeps_its_lock() {
    reclaim_after_release_variant(
        "rb-read-token",
        0.01,
        Duration::from_millis(1300),
        Taken::ReadToken,
    )
    .await;
}

/// The same with deletes 2.5 s late: they land after the release's own wait, and take the
/// re-claimed keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known problem (docs/protocol.md): the release of a lock with a fresh token has no node clock to bound its deletes by"]
async fn a_reclaim_with_a_read_token_after_a_release_held_past_its_wait_keeps_its_lock() {
    reclaim_after_release_variant(
        "rb-read-token-late",
        0.01,
        Duration::from_millis(2500),
        Taken::ReadToken,
    )
    .await;
}

/// Nodes 0 and 1's clocks are stepped 3 s forward between X's acquire with its own token and
/// its release (TTL 30 s, so the keys keep about 27 s). The release's deletes there run past
/// their deadline on the nodes' clocks and delete nothing (documented: the keys stay until
/// their TTL) — but how is the release reported?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_clock_step_does_not_say_done() {
    let cluster = redlock_testkit::Cluster::builder()
        .nodes(3)
        .fake_clock(true)
        .start()
        .await
        .expect("a cluster with fake clocks");
    let x = client(
        cluster.urls(),
        Duration::from_millis(200),
        Duration::from_secs(30),
    );
    let rival = client(
        cluster.urls(),
        Duration::from_millis(50),
        Duration::from_secs(30),
    );
    let _ = x.connect().await;
    let _ = rival.connect().await;
    let resource = resource_with_first(&x, "rb-step", 2);
    let key = format!("redlock:lock:{resource}");
    let token = Token::random().unwrap();
    let lock = x
        .try_acquire_with_token([resource.as_str()], &token)
        .await
        .expect("X takes the lock");
    for i in 0..2 {
        cluster.node(i).jump_clock(3_000).unwrap();
    }
    let released = x.release(lock).await;
    let report: Vec<String> = match &released {
        Ok(rep) => rep.nodes.iter().map(|n| n.outcome.to_string()).collect(),
        Err(e) => vec![e.to_string()],
    };
    let was_expired = released.as_ref().map(|r| r.was_expired()).ok();
    let pttls = common::pttls(&cluster, &key).await;
    let rival_got = rival.try_acquire(&resource).await;
    println!(
        "release: {:?} {report:?} was_expired={was_expired:?}; PTTL {pttls:?}; rival: {:?}",
        common::shown(&released),
        common::shown(&rival_got)
    );
    let holding = pttls.iter().filter(|&&ms| ms > 0).count();
    assert!(
        !(released.is_ok() && holding >= 2),
        "the release said done while {holding} of 3 nodes still hold the key: PTTL {pttls:?}"
    );
}

/// How X takes and releases the lock in [`reclaim_after_release_variant`].
#[derive(PartialEq)]
enum Taken {
    /// With its own token; the release is awaited.
    OwnToken,
    /// With its own token; the release future is dropped after 100 ms, its phase started.
    OwnTokenCut,
    /// With a fresh token, which X reads (`Lock::token`) and Y re-claims with.
    ReadToken,
}

/// X (through proxies, 200 ms node timeout, `drift`) takes a lock (`taken`); nodes 1 and 2 then
/// take `delay` each way; X's release fails (or is cut short); Y re-claims with the token at
/// once at the servers' own addresses; the late deletes land; the re-claim must keep its lock.
async fn reclaim_after_release_variant(name: &str, drift: f64, delay: Duration, taken: Taken) {
    let cluster = common::proxied(3).await;
    let direct = common::direct_urls(&cluster);
    let mk = |urls, nt| {
        Redlock::builder()
            .nodes(urls)
            .ttl(Duration::from_secs(10))
            .node_timeout(nt)
            .drift_factor(drift)
            .build()
            .unwrap()
    };
    let x = mk(cluster.urls(), Duration::from_millis(200));
    let y = mk(direct.clone(), Duration::from_secs(1));
    let rival = client(direct, Duration::from_millis(50), Duration::from_secs(10));
    let _ = x.connect().await;
    let _ = y.connect().await;
    let _ = rival.connect().await;
    let resource = resource_with_first(&x, name, 0);
    let (lock, token) = if taken == Taken::ReadToken {
        let lock = x.try_acquire(&resource).await.expect("X takes the lock");
        let token = lock.token().clone();
        (lock, token)
    } else {
        let token = Token::random().unwrap();
        let lock = x
            .try_acquire_with_token([resource.as_str()], &token)
            .await
            .expect("X takes the lock");
        (lock, token)
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 1..3 {
        cluster
            .node(i)
            .proxy()
            .unwrap()
            .set_delay(delay, Duration::ZERO);
    }
    let started = Instant::now();
    let released = if taken == Taken::OwnTokenCut {
        tokio::time::timeout(Duration::from_millis(100), x.release(lock))
            .await
            .ok()
            .map(|r| common::shown(&r))
    } else {
        Some(common::shown(&x.release(lock).await))
    };
    let at = Instant::now();
    let lock = y
        .try_acquire_with_token([resource.as_str()], &token)
        .await
        .expect("Y re-claims");
    let took = at.elapsed();
    let landed = (delay + Duration::from_millis(300)).saturating_sub(started.elapsed());
    tokio::time::sleep(landed).await;
    println!("drift {drift} delay {delay:?}: release {released:?}; re-claim waited {took:?}");
    common::assert_one_holder(&cluster, &rival, &resource, &lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_with_drift_factor_zero_waits_for_deletes_1300_ms_late() {
    reclaim_after_release_variant("rb-d0a", 0.0, Duration::from_millis(1300), Taken::OwnToken)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_with_drift_factor_zero_outlasts_deletes_2500_ms_late() {
    reclaim_after_release_variant("rb-d0b", 0.0, Duration::from_millis(2500), Taken::OwnToken)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_after_a_release_cut_short_keeps_its_lock() {
    reclaim_after_release_variant(
        "rb-cutp",
        0.01,
        Duration::from_millis(1300),
        Taken::OwnTokenCut,
    )
    .await;
}

/// As `a_release_cut_short_while_an_acquire_answer_is_out_still_deletes`, the release future
/// polled once and dropped
/// (`timeout(ZERO, ..)` polls it first, and drops it at the timer's next tick, within about a
/// millisecond; on 2f3163f the release often finishes within that tick).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_polled_once_still_deletes() {
    let (result, _, pttls, rival) =
        release_with_an_acquire_answer_out("rb-once", Some(Duration::ZERO)).await;
    println!("cut: {}", result.is_none());
    assert!(
        pttls[0] < 0 && pttls[1] < 0,
        "the keys stayed on nodes 0 and 1: PTTL {pttls:?}"
    );
    assert_eq!(rival, Ok(()), "the lock is held by nobody");
}

// From a second review (of d9c05dd): waits longer than documented, and a late grant left
// without a delete.

/// R refuses X's acquire (a foreign key on it for `foreign_ms`); X guards the lock (TTL 3 s),
/// and once the foreign key expired a renewal puts X's key back on R (its clock is read then).
/// R's link is then blackholed and X releases (F and B confirm at once). X re-claims with the
/// token: documented wait "about twice the node timeout plus one second, plus 2 · drift_factor
/// of the time the lock was held".
async fn reclaim_after_put_back_then_blackhole(
    name: &str,
    foreign_ms: u64,
) -> (Duration, Duration) {
    let cluster = common::proxied(3).await;
    let direct = common::direct_urls(&cluster);
    let nt = Duration::from_millis(200);
    let x = client(cluster.urls(), nt, Duration::from_secs(3));
    let rival = client(direct, Duration::from_millis(50), Duration::from_secs(3));
    let _ = x.connect().await;
    let _ = rival.connect().await;
    let (f, r) = (0, 1);
    let resource = resource_with_first(&x, name, f);
    let key = format!("redlock:lock:{resource}");
    common::set_px(&cluster, r, &key, "someone-else", foreign_ms).await;
    let token = Token::random().unwrap();
    let acquired = Instant::now();
    let lock = x
        .try_acquire_with_token([resource.as_str()], &token)
        .await
        .expect("F and B grant");
    let guard = x.guard(lock).unwrap();
    let put_back = common::eventually(Duration::from_millis(foreign_ms + 4000), || async {
        common::get(&cluster, r, &key)
            .await
            .is_some_and(|v| v != "someone-else")
    })
    .await;
    assert!(put_back, "the renewal put the key back on R");
    println!(
        "put back on R {:?} after the acquire; PTTL {:?}",
        acquired.elapsed(),
        common::pttls(&cluster, &key).await
    );
    cluster.node(r).proxy().unwrap().blackhole();
    let rel = Instant::now();
    let released = guard.release().await;
    let held = rel - acquired;
    println!(
        "release {:?} in {:?} (held {held:?})",
        common::shown(&released),
        rel.elapsed()
    );
    let at = Instant::now();
    let reclaimed = tokio::time::timeout(
        Duration::from_secs(60),
        x.try_acquire_with_token([resource.as_str()], &token),
    )
    .await;
    let waited = at.elapsed();
    let documented = 2 * nt + Duration::from_secs(1) + held.mul_f64(2.0 * 0.01);
    println!(
        "re-claim {:?} after {waited:?} (documented: about {documented:?}); PTTL {:?}",
        reclaimed.as_ref().map(common::shown),
        common::pttls(&cluster, &key).await
    );
    cluster.node(r).proxy().unwrap().heal();
    (waited, documented)
}

/// The put-back happens ~6 s after the acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_after_a_release_with_a_put_back_clock_waits_as_documented() {
    let (waited, documented) = reclaim_after_put_back_then_blackhole("rb2-pb6", 6000).await;
    assert!(
        waited < documented + Duration::from_millis(500),
        "the re-claim waited {waited:?}; documented about {documented:?}"
    );
}

/// Node 1's connection is not open when X (200 ms node timeout) takes a lock with its own
/// token (its budget is then the node timeout plus the connect allowance: 1 s), node 2 is
/// 800 ms away each way (its answer comes ~1.6 s after the acquire, within the acquire's
/// following of late answers, 2 s). X releases at once (all connections open: budgets 200 ms,
/// the release's driver gives up after 1.2 s). Documented: "a node whose answer to the acquire
/// is still out when the release starts gets its delete once that answer is in".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_delete_is_sent_when_the_late_grant_comes_after_the_release_driver_stopped() {
    let cluster = common::proxied(3).await;
    let direct = common::direct_urls(&cluster);
    let nt = Duration::from_millis(200);
    let x = client(cluster.urls(), nt, Duration::from_secs(10));
    let rival = client(direct, Duration::from_millis(50), Duration::from_secs(10));
    cluster.node(1).proxy().unwrap().partition();
    let connected = x.connect().await;
    println!(
        "connect: {:?}",
        connected
            .iter()
            .map(|n| n.outcome.to_string())
            .collect::<Vec<_>>()
    );
    cluster.node(1).proxy().unwrap().heal();
    let _ = rival.connect().await;
    let resource = resource_with_first(&x, "rb2-late", 0);
    let key = format!("redlock:lock:{resource}");
    cluster
        .node(2)
        .proxy()
        .unwrap()
        .set_delay(Duration::from_millis(800), Duration::ZERO);
    let token = Token::random().unwrap();
    let acquired = Instant::now();
    let lock = x
        .try_acquire_with_token([resource.as_str()], &token)
        .await
        .expect("nodes 0 and 1 grant");
    println!("acquired in {:?}", acquired.elapsed());
    let released = x.release(lock).await;
    let report: Vec<String> = match &released {
        Ok(rep) => rep.nodes.iter().map(|n| n.outcome.to_string()).collect(),
        Err(e) => vec![e.to_string()],
    };
    println!(
        "release {:?} {report:?} {:?} after the acquire",
        common::shown(&released),
        acquired.elapsed()
    );
    tokio::time::sleep_until((acquired + Duration::from_millis(3600)).into()).await;
    let pttls = common::pttls(&cluster, &key).await;
    println!("PTTL 3.6 s after the acquire: {pttls:?}");
    cluster.node(2).proxy().unwrap().heal();
    assert!(
        pttls.iter().all(|&p| p < 0),
        "a key stayed after the release: PTTL {pttls:?}"
    );
}

/// Node 2 is 500 ms away each way; X (200 ms node timeout, all connections open) takes a lock
/// with its own token (node 2's grant comes 1 s later, within the acquire's following) and
/// releases at once; its delete to node 2 is sent then and answers ~2 s after the acquire,
/// after the release's driver gave up. X re-claims right after the release returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_after_a_deferred_delete_waits_as_documented() {
    let cluster = common::proxied(3).await;
    let direct = common::direct_urls(&cluster);
    let nt = Duration::from_millis(200);
    let x = client(cluster.urls(), nt, Duration::from_secs(10));
    let rival = client(direct, Duration::from_millis(50), Duration::from_secs(10));
    let _ = x.connect().await;
    let _ = rival.connect().await;
    let resource = resource_with_first(&x, "rb2-defer", 0);
    let key = format!("redlock:lock:{resource}");
    cluster
        .node(2)
        .proxy()
        .unwrap()
        .set_delay(Duration::from_millis(500), Duration::ZERO);
    let token = Token::random().unwrap();
    let acquired = Instant::now();
    let lock = x
        .try_acquire_with_token([resource.as_str()], &token)
        .await
        .expect("nodes 0 and 1 grant");
    let released = x.release(lock).await;
    let rel_done = Instant::now();
    println!(
        "release {:?} {:?} after the acquire",
        common::shown(&released),
        acquired.elapsed()
    );
    let lock = tokio::time::timeout(
        Duration::from_secs(20),
        x.try_acquire_with_token([resource.as_str()], &token),
    )
    .await
    .expect("bounded")
    .expect("X re-claims");
    let waited = rel_done.elapsed();
    let documented = 2 * nt + Duration::from_secs(1);
    println!(
        "re-claim after {waited:?} (documented about {documented:?}); PTTL {:?}",
        common::pttls(&cluster, &key).await
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    common::assert_one_holder(&cluster, &rival, &resource, &lock).await;
    cluster.node(2).proxy().unwrap().heal();
    // A delete that first waited for its node's grant adds up to that wait (node timeout and
    // grace) and one bound's span more (docs/protocol.md): about twice the documented wait.
    assert!(
        waited < 2 * documented + Duration::from_millis(400),
        "the re-claim waited {waited:?}; documented about {documented:?}, twice that here"
    );
}

/// All three nodes grant X's lock (own token, 200 ms node timeout, TTL 3 s, guarded). After
/// `hold`, node 2 loses the key (deleted directly) with its link 90 ms away each way; a renewal
/// puts it back. As soon as the key is back on node 2 (seen directly), node 2's link is
/// blackholed (the put-back's answer is held) and X releases: node 2's delete is deferred
/// behind the put-back, which times out; the delete, sent then, does not answer. X re-claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_after_a_release_during_a_put_back_waits_as_documented() {
    let cluster = common::proxied(3).await;
    let direct = common::direct_urls(&cluster);
    let nt = Duration::from_millis(200);
    let x = client(cluster.urls(), nt, Duration::from_secs(3));
    let rival = client(direct, Duration::from_millis(50), Duration::from_secs(3));
    let _ = x.connect().await;
    let _ = rival.connect().await;
    let resource = resource_with_first(&x, "rb2-pbfly", 0);
    let key = format!("redlock:lock:{resource}");
    let token = Token::random().unwrap();
    let acquired = Instant::now();
    let lock = x
        .try_acquire_with_token([resource.as_str()], &token)
        .await
        .expect("all grant");
    let guard = x.guard(lock).unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster
        .node(2)
        .proxy()
        .unwrap()
        .set_delay(Duration::from_millis(90), Duration::ZERO);
    common::del(&cluster, 2, &key).await;
    let mut c = cluster.node(2).connection().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut back = false;
    while Instant::now() < deadline {
        let v: Option<String> = redlock_testkit::redis::AsyncCommands::get(&mut c, &key)
            .await
            .unwrap();
        if v.is_some() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    cluster.node(2).proxy().unwrap().blackhole();
    assert!(back, "the renewal put the key back on node 2");
    let rel = Instant::now();
    let held = rel - acquired;
    let released = guard.release().await;
    println!(
        "release {:?} in {:?} (held {held:?}); PTTL {:?}",
        common::shown(&released),
        rel.elapsed(),
        common::pttls(&cluster, &key).await
    );
    let at = Instant::now();
    let reclaimed = tokio::time::timeout(
        Duration::from_secs(60),
        x.try_acquire_with_token([resource.as_str()], &token),
    )
    .await;
    let waited = at.elapsed();
    let documented = 2 * nt + Duration::from_secs(1) + held.mul_f64(2.0 * 0.01);
    println!(
        "re-claim {:?} after {waited:?} (documented: about {documented:?}); PTTL {:?}",
        reclaimed.as_ref().map(common::shown),
        common::pttls(&cluster, &key).await
    );
    cluster.node(2).proxy().unwrap().heal();
    // Node 2's delete first waited for the put-back's answer (node timeout and grace): up to
    // about twice the documented wait (docs/protocol.md). 11.4 s in review, before the bound
    // counted from the put-back.
    assert!(
        waited < 2 * documented + Duration::from_millis(500),
        "the re-claim waited {waited:?}; documented about {documented:?}, twice that here"
    );
}
