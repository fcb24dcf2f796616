//! Errors an operator can act on, on real nodes: each names its lock's resources, a `Busy`
//! keeps the attempts made and says which budget ran out, a timeout names its budget, and the
//! error types are plain `std::error::Error`s of this crate.

mod common;

use std::time::Duration;

use redlock::{EntropyError, Error, GaveUp, NodeError, Redlock, RetryPolicy};
use redlock_testkit::Cluster;

fn client(urls: Vec<String>) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_millis(100))
        .retry(RetryPolicy::attempts(3).with_delay(Duration::from_millis(20), Duration::ZERO))
        .build()
        .unwrap()
}

fn std_error<E: std::error::Error + Send + Sync + 'static>() {}

#[test]
fn the_error_types_are_std_errors() {
    std_error::<Error>();
    std_error::<NodeError>();
    std_error::<EntropyError>();
    std_error::<redlock::ConfigError>();
    std_error::<redlock::ResourceError>();
}

/// `Busy` names the resource and says how many attempts were made, for how long, and which
/// budget ran out — for each kind of budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_names_the_resource_and_keeps_its_retries() {
    let cluster = Cluster::start(3).await.unwrap();
    let holder = client(cluster.urls());
    let waiter = client(cluster.urls());
    let lock = holder.acquire("orders:7").await.unwrap();

    let e = waiter.try_acquire("orders:7").await.unwrap_err();
    let retries = *e.retries().expect("a Busy keeps its retries");
    assert_eq!(e.resources(), ["orders:7"]);
    assert_eq!(
        (retries.attempts, retries.gave_up),
        (1, GaveUp::SingleAttempt)
    );
    let text = e.to_string();
    assert!(
        text.contains("\"orders:7\"") && text.contains("gave up after 1 attempt"),
        "{text}"
    );

    let e = waiter.acquire("orders:7").await.unwrap_err();
    let retries = *e.retries().unwrap();
    assert_eq!(
        (retries.attempts, retries.gave_up),
        (3, GaveUp::Attempts),
        "{e}"
    );
    // The second attempt follows the first at once (after subscribing), the third a 20 ms pause later.
    assert!(retries.waited >= Duration::from_millis(20), "{e}");

    let e = waiter
        .lock_many(["orders:7", "orders:8"])
        .wait(Duration::from_millis(400))
        .acquire()
        .await
        .unwrap_err();
    let retries = *e.retries().unwrap();
    assert_eq!(e.resources(), ["orders:7", "orders:8"]);
    assert_eq!(retries.gave_up, GaveUp::Deadline, "{e}");
    assert!(retries.attempts >= 2, "{e}");
    assert!(retries.waited >= Duration::from_millis(300), "{e}");
    assert!(e.to_string().contains("deadline"), "{e}");
    holder.release(lock).await.unwrap();
}

/// An acquire that gives up on unreachable nodes keeps its history too, and each node that did
/// not answer names the budget that ran out; extend and release make one attempt and keep none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_unreachable_keeps_the_acquires_retries_and_names_the_node_budget() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = client(cluster.urls());
    let mut lock = rl.acquire("jobs:1").await.unwrap();
    cluster.node(1).pause();
    cluster.node(2).pause();

    let e = rl.acquire("jobs:2").await.unwrap_err();
    assert!(e.is_quorum_unreachable(), "{e}");
    let retries = *e
        .retries()
        .expect("an acquire's QuorumUnreachable keeps its retries");
    assert_eq!(
        (retries.attempts, retries.gave_up),
        (3, GaveUp::Attempts),
        "{e}"
    );
    assert!(retries.waited >= Duration::from_millis(3 * 100), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("\"jobs:2\"")
            && text.contains("timed out: no answer within 100ms")
            && text.contains("gave up after 3 attempts"),
        "{text}"
    );

    let e = rl.extend(&mut lock).await.unwrap_err();
    assert!(e.is_quorum_unreachable(), "{e}");
    assert!(e.retries().is_none(), "{e}");
    assert!(!e.to_string().contains("gave up"), "{e}");
    cluster.node(1).resume();
    cluster.node(2).resume();
    rl.release(lock).await.unwrap();
}

/// `Lost`, `QuorumUnreachable` (release), `ForeignLock`, `LeaseLost` and `WaitTimedOut` name
/// the lock's resources; the wait's error names the timeout that ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_error_names_its_resources() {
    let cluster = Cluster::start(3).await.unwrap();
    let other = Cluster::start(3).await.unwrap();
    let rl = client(cluster.urls());

    // Lost: another owner's value on every node.
    let mut lock = rl.acquire("inv:1").await.unwrap();
    for i in 0..3 {
        common::set(&cluster, i, "redlock:lock:inv:1", "someone-else").await;
    }
    let e = rl.extend(&mut lock).await.unwrap_err();
    assert!(e.is_not_held(), "{e}");
    assert_eq!(e.resources(), ["inv:1"]);
    assert!(e.to_string().contains("\"inv:1\""), "{e}");
    drop(lock);

    // ForeignLock: a lock of a client of other nodes.
    let foreign = client(other.urls()).acquire("inv:2").await.unwrap();
    let e = rl.release(foreign).await.unwrap_err();
    assert!(matches!(e, Error::ForeignLock { .. }), "{e}");
    assert_eq!(e.resources(), ["inv:2"]);

    // WaitTimedOut: the resource and the timeout given.
    let held = rl.acquire("inv:3").await.unwrap();
    let e = rl
        .wait_released("inv:3", Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::WaitTimedOut { timeout, .. } if *timeout == Duration::from_millis(200)),
        "{e}"
    );
    assert_eq!(e.resources(), ["inv:3"]);
    assert!(e.to_string().contains("200ms"), "{e}");

    // LeaseLost: work whose lock was taken over.
    let nodes = &cluster;
    let e = rl
        .lock("inv:4")
        .ttl(Duration::from_millis(600))
        .with_lock(|lease| async move {
            for i in 0..3 {
                common::set(nodes, i, "redlock:lock:inv:4", "someone-else").await;
            }
            lease.lost().await;
            std::future::pending::<()>().await
        })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::LeaseLost { .. }), "{e}");
    assert_eq!(e.resources(), ["inv:4"]);

    // QuorumUnreachable on release: two of three nodes gone.
    cluster.node(0).kill();
    cluster.node(1).kill();
    let e = rl.release(held).await.unwrap_err();
    assert!(e.is_quorum_unreachable(), "{e}");
    assert_eq!(e.resources(), ["inv:3"]);
    assert!(e.to_string().starts_with("release \"inv:3\""), "{e}");
}
