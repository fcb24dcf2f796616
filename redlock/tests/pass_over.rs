//! When a client passes over a hot lock's first node (the node racing attempts ask first).
//!
//! A first node that refused a lock a quorum of the other nodes granted may hold a stale key (a
//! release missed it), which refuses every racer until it expires: the client that saw it races
//! through the next node for a while. The same refusal also comes from another client's racer
//! holding that node for a moment; passing the node over then makes this client race through
//! another node than every other client, and their racers split the nodes' votes.

mod common;

use std::time::{Duration, Instant};

use redlock::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

const RESOURCE: &str = "pass-over";
const KEY: &str = "redlock:lock:pass-over";
const CHANNEL: &str = "redlock:release:pass-over";
/// The waiter's pause after a refusal without a release heard: what a racing attempt refused
/// by a passed-over (or stale) first node costs.
const RETRY_DELAY: Duration = Duration::from_secs(5);

/// The nodes in the order racing attempts for [`RESOURCE`] prefer them.
async fn ranking(cluster: &Cluster) -> Vec<usize> {
    common::racing_ranking_of(cluster, RESOURCE).await
}

fn client(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_millis(200))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(20)).with_delay(RETRY_DELAY, Duration::ZERO),
        )
        .build()
        .expect("valid config")
}

/// Another client holds the lock on `holders` (a quorum); `rl` waits for it. The holder then
/// releases on every node of `holders` but `missed` and publishes its wake-up there; returns
/// how long `rl`'s acquire took from that release. `rl`'s attempt after the wake-up races
/// through the first node it ranks first at that moment.
async fn race_after_a_release(
    cluster: &Cluster,
    rl: &Redlock,
    holders: &[usize],
    missed: Option<usize>,
) -> Duration {
    for &i in holders {
        common::set(cluster, i, KEY, "the holder's token").await;
    }
    let waiter = {
        let rl = rl.clone();
        tokio::spawn(async move {
            let lock = rl.acquire(RESOURCE).await?;
            let acquired = Instant::now();
            rl.release(lock).await.map(|_| acquired)
        })
    };
    let subscribed = || async { common::subscribed_nodes(cluster, CHANNEL).await == cluster.len() };
    assert!(
        common::eventually(Duration::from_secs(5), subscribed).await,
        "the waiter subscribed"
    );
    // Its attempt after subscribing is refused; it then waits for a release.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    for &i in holders.iter().filter(|&&i| Some(i) != missed) {
        common::del(cluster, i, KEY).await;
        common::publish(cluster, i, CHANNEL, "").await;
    }
    let acquired = tokio::time::timeout(RETRY_DELAY * 3, waiter)
        .await
        .expect("the waiter took the lock")
        .expect("task")
        .expect("acquired and released");
    acquired - released
}

/// A first node refuses because another client's racer holds it for a moment (its key is gone
/// a moment later), while a quorum of the other nodes grants. That is not a stale key: the
/// client must keep racing through that node, like every other client. It used to pass the
/// node over for 1 s and race through the next one, where a stale key of a release that missed
/// that node then refused it until its retry delay ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_node_held_by_a_racer_for_a_moment_is_not_passed_over() {
    // The scene must be set within a refusal's pass-over (1 s) to say anything; a busy machine
    // may take longer, and then it is set again on fresh nodes (at most three times).
    let mut setups = Vec::new();
    for _ in 0..3 {
        let cluster = Cluster::start(5).await.expect("cluster");
        let (first, setup, took) = racer_then_a_stale_second_node(&cluster).await;
        if setup >= Duration::from_millis(900) {
            setups.push(setup);
            continue;
        }
        assert!(
            took < RETRY_DELAY / 2,
            "the racing attempt went through another node than the first ({first}) and waited \
             out the retry delay: {took:?}"
        );
        return;
    }
    panic!(
        "the setup took longer than a refusal's pass-over lasts each time ({setups:?}): inconclusive"
    );
}

/// The scene of [`a_first_node_held_by_a_racer_for_a_moment_is_not_passed_over`]: returns the
/// first node, how long the setup took and how long the racing acquire took after the release.
async fn racer_then_a_stale_second_node(cluster: &Cluster) -> (usize, Duration, Duration) {
    let rank = ranking(cluster).await;
    let (first, second) = (rank[0], rank[1]);
    let rl = client(cluster);
    let warm = rl.acquire("warm-up").await.expect("warm-up");
    rl.release(warm).await.expect("warm-up");

    let started = Instant::now();
    common::set(cluster, first, KEY, "a racer's token").await;
    let lock = rl
        .acquire(RESOURCE)
        .await
        .expect("four of five nodes grant");
    // The racer, refused by the other nodes, deletes its grant. The lock is held for a moment
    // (the first node's refusal is looked at again when it is released).
    common::del(cluster, first, KEY).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    rl.release(lock).await.expect("released");

    // The next holder's release misses the second node, which keeps a stale key.
    let holders: Vec<usize> = rank[1..4].to_vec();
    let took = race_after_a_release(cluster, &rl, &holders, Some(second)).await;
    (first, started.elapsed() - took, took)
}

/// A first node holding a stale key (a release missed it) refuses while a quorum of the other
/// nodes grants, and keeps refusing: the client passes it over, and its next racing attempt
/// goes through the next node instead of waiting out the retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_node_holding_a_stale_key_is_passed_over() {
    let cluster = Cluster::start(5).await.expect("cluster");
    let rank = ranking(&cluster).await;
    let first = rank[0];
    let rl = client(&cluster);
    let warm = rl.acquire("warm-up").await.expect("warm-up");
    rl.release(warm).await.expect("warm-up");

    common::set(&cluster, first, KEY, "a stale token").await;
    let t0 = Instant::now();
    let lock = rl
        .acquire(RESOURCE)
        .await
        .expect("four of five nodes grant");
    // Held for a moment: the lock is decided once a quorum granted, and the first node's
    // refusal may come in later; it is looked at again when the lock is released.
    tokio::time::sleep(Duration::from_millis(50)).await;
    rl.release(lock).await.expect("released");
    // The client makes sure the key stays (two reads two node timeouts apart), then passes the
    // node over. A fixed 500 ms for this was too short beside eight busy loops (seen once).
    assert!(
        common::eventually(Duration::from_secs(5), || async {
            rl.first_node(RESOURCE) != Some(first)
        })
        .await,
        "the first node ({first}) holding a stale key was not passed over"
    );

    let holders: Vec<usize> = rank[2..5].to_vec();
    let took = race_after_a_release(&cluster, &rl, &holders, None).await;
    assert!(
        took < RETRY_DELAY / 2,
        "the racing attempt went through the stale first node ({first}) and waited out the \
         retry delay: {took:?} (released {:?} after the acquire)",
        t0.elapsed() - took
    );
    assert_eq!(
        common::get(&cluster, first, KEY).await.as_deref(),
        Some("a stale token")
    );
}

/// A lock the first node refused (a racer held it for a moment), released only after it
/// expired, while another client holds the resource on every node: the key the release-time
/// check finds on the first node is the new holder's, and stays, but says nothing of a stale
/// key. Passing the node over for it made this client race through another node than every
/// other client for a second (found in review). The check is made only for a lock released
/// while still valid: no other holder's key can be there then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_does_not_pass_over_a_first_node_held_by_the_next_holder() {
    // A node that answers slowly on a busy machine counts as far, which moves the first node
    // too (seen once beside eight busy loops); the scene is set again on fresh nodes, at most
    // three times. A pass-over for the next holder's key moves it every time.
    let mut moved = Vec::new();
    for _ in 0..3 {
        let (first, after) = late_release_after_a_racer().await;
        if after == Some(first) {
            return;
        }
        moved.push((first, after));
    }
    panic!("the first node was passed over for the next holder's key: (before, after) {moved:?}");
}

/// The scene of [`a_late_release_does_not_pass_over_a_first_node_held_by_the_next_holder`]:
/// returns the first node before and after.
async fn late_release_after_a_racer() -> (usize, Option<usize>) {
    let cluster = Cluster::start(3).await.expect("cluster");
    let a = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_millis(500))
        .node_timeout(Duration::from_millis(200))
        .retry(RetryPolicy::once())
        .build()
        .expect("valid config");
    let b = client(&cluster);
    a.connect().await;
    let first = a.first_node(RESOURCE).expect("racing through a first node");
    common::set(&cluster, first, KEY, "a racer's token").await;
    let lock = a
        .try_acquire(RESOURCE)
        .await
        .expect("the two other nodes grant");
    let mut c = cluster.node(first).connection().await.unwrap();
    let _: i64 = redlock_testkit::redis::cmd("DEL")
        .arg(KEY)
        .query_async(&mut c)
        .await
        .unwrap();
    // The acquire-time check's second read (two node timeouts later) finds the key gone.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!lock.is_valid(), "expired");
    let next = b.acquire(RESOURCE).await.expect("the next holder");
    a.release(lock).await.ok();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let after = a.first_node(RESOURCE);
    b.release(next).await.ok();
    (first, after)
}
