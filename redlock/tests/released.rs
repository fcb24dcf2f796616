//! `Redlock::wait_released` on real nodes: woken by the release, by expiry without any
//! notification, bounded by its timeout, and never touching a key.

mod common;

use std::time::{Duration, Instant};

use redlock::{Error, Redlock, RetryPolicy};
use redlock_testkit::Cluster;

fn client(cluster: &Cluster, ttl: Duration) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .ttl(ttl)
        .node_timeout(Duration::from_millis(100))
        .retry(RetryPolicy::deadline(Duration::from_secs(5)))
        .build()
        .unwrap()
}

/// Every key on every node with its value, read directly.
async fn all_keys(cluster: &Cluster) -> Vec<(usize, String, Option<String>)> {
    let mut out = Vec::new();
    for (i, node) in cluster.nodes().iter().enumerate() {
        let mut c = node.connection().await.unwrap();
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut c)
            .await
            .unwrap();
        keys.sort();
        for key in keys {
            let value: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut c).await.ok();
            out.push((i, key, value));
        }
    }
    out
}

/// The release reaches the nodes at different times (the holder's links to two of three nodes
/// are 30 ms slower each way): the first node's message comes while the key is still on the
/// other two, a quorum. The waiter must probe again on their messages, not wait for its 1 s
/// re-check (which it did: the other nodes' messages of a release woke nobody; 3 of 3 runs
/// took about 1 s before the fix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_on_the_release_reaching_a_quorum_not_on_its_first_message() {
    let cluster = Cluster::start(3).await.unwrap();
    let mut proxies = Vec::new();
    let mut urls = vec![cluster.node(0).url()];
    for i in 1..3 {
        let p = redlock_testkit::FaultProxy::start(
            format!("127.0.0.1:{}", cluster.node(i).port())
                .parse()
                .unwrap(),
        )
        .await
        .unwrap();
        urls.push(p.url());
        proxies.push(p);
    }
    let holder = Redlock::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_millis(200))
        .retry(RetryPolicy::deadline(Duration::from_secs(5)))
        .build()
        .unwrap();
    let waiters = client(&cluster, Duration::from_secs(10));
    let lock = holder.acquire("spread").await.unwrap();
    for p in &proxies {
        p.set_delay(Duration::from_millis(30), Duration::ZERO);
    }
    let task = {
        let rl = waiters.clone();
        tokio::spawn(async move {
            rl.wait_released("spread", Duration::from_secs(8)).await?;
            Ok::<Instant, Error>(Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!task.is_finished(), "returned while held");
    let released = Instant::now();
    holder.release(lock).await.unwrap();
    let after = task
        .await
        .unwrap()
        .unwrap()
        .saturating_duration_since(released);
    assert!(
        after < Duration::from_millis(500),
        "returned {after:?} after the release"
    );
}

/// Several waiters return soon after the holder releases — on the release notification, well
/// before the one-second re-check or the holder's 10 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_promptly_after_release() {
    let cluster = Cluster::start(3).await.unwrap();
    let holder = client(&cluster, Duration::from_secs(10));
    let waiters = client(&cluster, Duration::from_secs(10));
    let lock = holder.acquire("rebuild").await.unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let rl = waiters.clone();
            tokio::spawn(async move {
                rl.wait_released("rebuild", Duration::from_secs(8)).await?;
                Ok::<Instant, Error>(Instant::now())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        tasks.iter().all(|t| !t.is_finished()),
        "returned while held"
    );
    let released = Instant::now();
    holder.release(lock).await.unwrap();
    for t in tasks {
        let at = t.await.unwrap().unwrap();
        let after = at.saturating_duration_since(released);
        assert!(
            after < Duration::from_millis(800),
            "returned {after:?} after the release"
        );
    }
    // Free now: at once.
    waiters
        .wait_released("rebuild", Duration::ZERO)
        .await
        .unwrap();
}

/// Keys that expire (no release, so no notification) or vanish without a notification (deleted
/// behind the client's back) are noticed by the re-check, long before the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_after_expiry_or_a_lost_notification() {
    let cluster = Cluster::start(3).await.unwrap();
    let waiter = client(&cluster, Duration::from_secs(10));

    // Expiry: a 1.5 s lock never released.
    let holder = client(&cluster, Duration::from_millis(1500));
    let lock = holder.acquire("expires").await.unwrap();
    let started = Instant::now();
    waiter
        .wait_released("expires", Duration::from_secs(8))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1000), "free after {took:?}?");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    drop(lock);

    // A lost notification: a 10 s lock's keys deleted directly, publishing nothing.
    let holder = client(&cluster, Duration::from_secs(10));
    let lock = holder.acquire("vanishes").await.unwrap();
    let deleter = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        for i in 0..3 {
            let mut c = cluster.node(i).connection().await.unwrap();
            let _: i64 = redis::cmd("DEL")
                .arg("redlock:lock:vanishes")
                .query_async(&mut c)
                .await
                .unwrap();
        }
        Instant::now()
    };
    let (waited, deleted) = tokio::join!(
        waiter.wait_released("vanishes", Duration::from_secs(8)),
        deleter
    );
    waited.unwrap();
    let after = deleted.elapsed();
    assert!(after < Duration::from_secs(3), "noticed {after:?} late");
    drop(lock);
}

/// While a renewed holder keeps it, the wait ends with `WaitTimedOut` naming the resource,
/// and the holder still holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_out_while_held() {
    let cluster = Cluster::start(3).await.unwrap();
    let holder = client(&cluster, Duration::from_millis(800));
    let waiter = client(&cluster, Duration::from_secs(10));
    let guard = holder.lock("held").guard().await.unwrap();
    let started = Instant::now();
    let e = waiter
        .wait_released("held", Duration::from_millis(1500))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(e.is_timeout(), "{e}");
    match &e {
        Error::WaitTimedOut {
            resource,
            held,
            waited,
            ..
        } => {
            assert_eq!(resource, "held");
            assert!(*held >= 2, "{e}");
            assert!(*waited >= Duration::from_millis(1500), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(4), "{took:?}");
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}

/// A wait ends by its timeout (plus the node timeout its last check gets) when a majority hangs (accepts connections, answers nothing),
/// also for a client whose connections are still being opened: each check then waits out the
/// connect allowance, and a check started just before the deadline used to run its whole
/// budget past it (a 300 ms wait took about 700 ms). The bound leaves 200 ms to spare for a
/// busy machine (60 ms was not enough to be sure of), still 150 ms short of that bug.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_a_hung_majority_ends_by_its_timeout() {
    let cluster = Cluster::start(3).await.unwrap();
    let holder = client(&cluster, Duration::from_secs(10));
    let lock = holder.acquire("hung").await.unwrap();
    cluster.node(0).pause();
    cluster.node(1).pause();
    let waiter = Redlock::builder()
        .nodes(cluster.urls())
        .retry(RetryPolicy::once())
        .build()
        .unwrap();
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let got = waiter.wait_released("hung", timeout).await;
    let took = started.elapsed();
    cluster.node(0).resume();
    cluster.node(1).resume();
    assert!(got.as_ref().is_err_and(Error::is_timeout), "{got:?}");
    assert!(
        took < timeout + redlock::DEFAULT_NODE_TIMEOUT + Duration::from_millis(200),
        "a {timeout:?} wait took {took:?}"
    );
    holder.release(lock).await.unwrap();
}

/// Waiting reads only: the nodes' keys and values are the same before and after, whether the
/// resource was free or held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_creates_or_deletes_keys() {
    let cluster = Cluster::start(3).await.unwrap();
    let holder = client(&cluster, Duration::from_secs(10));
    let waiter = client(&cluster, Duration::from_secs(10));
    // Open every connection (identity records are written on connect) before the snapshot.
    holder.connect().await;
    waiter.connect().await;
    let lock = holder.acquire("kept").await.unwrap();
    // The acquire returns at a quorum: its third grant may still be on its way (a lanes run
    // took the snapshot without it, and found it after the waits).
    assert!(
        common::eventually(Duration::from_secs(2), || async {
            let keys = all_keys(&cluster).await;
            (0..3).all(|i| {
                keys.iter()
                    .any(|(n, k, _)| *n == i && k == "redlock:lock:kept")
            })
        })
        .await,
        "the holder's key did not reach every node"
    );
    let before = all_keys(&cluster).await;
    waiter
        .wait_released("free", Duration::from_secs(1))
        .await
        .unwrap();
    let e = waiter
        .wait_released("kept", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert_eq!(all_keys(&cluster).await, before);
    holder.release(lock).await.unwrap();
}
