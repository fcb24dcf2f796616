//! Retry policies bounded by attempts on a lock that is held and never released: no release
//! is heard, so every attempt counts, and the policy makes all of its attempts however long
//! each one takes (a hung node's connect allowance) or however long the call queued for its
//! turn behind this client's other acquirers. (Attempts made on a release heard are not
//! counted until the time the policy's attempts would take has passed; that limit must not
//! cut short a call that never heard one.)

mod common;

use std::time::{Duration, Instant};

use redlock::{GaveUp, Redlock, RetryPolicy};
use redlock_testkit::Cluster;

const NODE_TIMEOUT: Duration = Duration::from_millis(50);

fn waiter(cluster: &Cluster, policy: RetryPolicy) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(10))
        .node_timeout(NODE_TIMEOUT)
        .retry(policy)
        .build()
        .expect("valid config")
}

/// Acquires a quiet lock (held, never released, so no release is ever heard) with `policy` on
/// a cluster with one hung node the client has not connected to yet: every attempt waits out
/// that node's budget, a node timeout plus the connect allowance (5 × 50 ms), not one node
/// timeout. Returns the attempts made and why the call gave up.
async fn attempts_on_a_quiet_lock_with_a_hung_node(policy: RetryPolicy) -> (u32, GaveUp) {
    let cluster = Cluster::start(3).await.expect("cluster");
    let resource = "held-quietly";
    let key = format!("{}lock:{resource}", redlock::DEFAULT_KEY_PREFIX);
    // Another client's key on node 0; node 1 free; node 2 hangs before the waiter connects.
    common::set(&cluster, 0, &key, "rival").await;
    cluster.node(2).pause();
    let rl = waiter(&cluster, policy);
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(20), rl.acquire(resource))
        .await
        .expect("bounded")
        .expect_err("held on node 0, node 2 hung");
    let waited = started.elapsed();
    cluster.node(2).resume();
    let retries = *err.retries().expect("retry history");
    println!("{err}\nwaited {waited:?}, {retries:?}");
    (retries.attempts, retries.gave_up)
}

/// `attempts(3)` makes its 3 attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_does_not_cut_a_quiet_attempt_bounded_policy_short() {
    let policy = RetryPolicy::attempts(3).with_delay(Duration::from_millis(100), Duration::ZERO);
    assert_eq!(
        attempts_on_a_quiet_lock_with_a_hung_node(policy).await,
        (3, GaveUp::Attempts)
    );
}

/// The default policy (10 attempts, 100 ms ± 50 ms) makes its 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_does_not_cut_the_default_policy_short() {
    assert_eq!(
        attempts_on_a_quiet_lock_with_a_hung_node(RetryPolicy::default()).await,
        (10, GaveUp::Attempts)
    );
}

/// Three tasks of one client wait for a lock another client holds and never releases (no
/// release is heard). Each queues for its turn behind the one before, and each makes its
/// 3 attempts (the third's queue wait, ~0.9 s, is under its wait limit of 1.05 s):
/// the time spent in the queue is not an attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tasks_of_one_client_each_make_their_attempts_on_a_quiet_lock() {
    let cluster = Cluster::start(3).await.expect("cluster");
    let resource = "held-for-the-queue";
    let key = format!("{}lock:{resource}", redlock::DEFAULT_KEY_PREFIX);
    for i in 0..3 {
        common::set(&cluster, i, &key, "rival").await;
    }
    let rl = waiter(
        &cluster,
        RetryPolicy::attempts(3).with_delay(Duration::from_millis(300), Duration::ZERO),
    );
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let rl = rl.clone();
        tasks.push(tokio::spawn(async move {
            let err = rl.acquire(resource).await.expect_err("held");
            (*err.retries().expect("retry history"), started.elapsed())
        }));
        // Queue in this order.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .expect("bounded")
                .expect("task"),
        );
    }
    for (i, (r, at)) in results.iter().enumerate() {
        println!("task {i}: gave up at {at:?}: {r:?}");
    }
    for (i, (r, at)) in results.iter().enumerate() {
        assert!(
            r.gave_up == GaveUp::Queue || r.attempts == 3,
            "task {i} gave up at {at:?} with {r:?}: no release was heard, its queue wait was \
             under its wait limit, and it made fewer than its 3 attempts"
        );
    }
}
