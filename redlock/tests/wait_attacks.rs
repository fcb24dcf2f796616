//! Attacks on waiting and cancellation: acquires dropped at many points with a slow node, a
//! queued waiter dropped while others of its client wait, many waiters of several clients on
//! one key, and the subscription connections broken while tasks wait. Real redis-server
//! processes through `redlock_testkit`, loopback only, each wait bounded.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

/// A small deterministic PRNG (xorshift), seeded per task.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn client(urls: Vec<String>, retry: RetryPolicy) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_millis(50))
        .retry(retry)
        .build()
        .expect("client")
}

/// Acquires are dropped at random points (timeouts from 0 to 150 ms) while one node answers
/// slowly (sometimes past its timeout) and another client keeps taking the lock for a moment.
/// Once every caller returned and the background cleanups had their time, no key may be left
/// on any node (the TTL is a minute, so nothing expires meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_dropped_at_any_point_leave_no_keys() {
    let cluster = Cluster::builder()
        .nodes(3)
        .proxied(true)
        .start()
        .await
        .expect("cluster");
    let direct: Vec<String> = cluster.nodes().iter().map(|n| n.url()).collect();
    let retry = RetryPolicy::deadline(Duration::from_secs(2))
        .with_delay(Duration::from_millis(200), Duration::from_millis(100));
    let x = client(cluster.urls(), retry.clone());
    let h = client(direct, retry);
    x.connect().await;
    h.connect().await;
    cluster
        .node(2)
        .proxy()
        .expect("proxied")
        .set_delay(Duration::from_millis(25), Duration::from_millis(20));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let holder = {
        let (h, stop) = (h.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            while !stop.load(Ordering::Relaxed) {
                if let Ok(lock) = h.acquire("cancel").await {
                    tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
                    let _ = h.release(lock).await;
                }
                tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
            }
        })
    };
    let got = Arc::new(AtomicU64::new(0));
    let cancelled = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let (x, got, cancelled) = (x.clone(), Arc::clone(&got), Arc::clone(&cancelled));
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x1234_5678 + t * 7919);
            for i in 0..100 {
                let limit = Duration::from_micros(rng.below(100_000));
                if i % 3 == 0 {
                    // A guard whose `with_lock` is dropped at a random point.
                    let work = x.with_lock("cancel", |_| async {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    });
                    if tokio::time::timeout(limit, work).await.is_err() {
                        cancelled.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                match tokio::time::timeout(limit, x.acquire("cancel")).await {
                    Ok(Ok(lock)) => {
                        got.fetch_add(1, Ordering::Relaxed);
                        // The release is dropped at a random point too.
                        let limit = Duration::from_micros(rng.below(3_000));
                        let _ = tokio::time::timeout(limit, x.release(lock)).await;
                    }
                    Ok(Err(_)) => {}
                    Err(_) => {
                        cancelled.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    stop.store(true, Ordering::Relaxed);
    holder.await.expect("holder");
    println!(
        "acquired {}, cancelled {}",
        got.load(Ordering::Relaxed),
        cancelled.load(Ordering::Relaxed)
    );
    // Five node timeouts, the delivery grace, and some more.
    let clean = common::no_lock_keys_within(&cluster, Duration::from_secs(5)).await;
    let left = common::lock_keys(&cluster).await;
    assert!(clean, "keys left on the nodes: {left:?}");
}

/// Three tasks of one client: A holds, B waits, C queues behind B. B is dropped; once A
/// releases, C gets the lock at once (B's turn passed on), not at the end of a retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_queued_waiter_passes_its_turn_on() {
    let cluster = Cluster::start(3).await.expect("cluster");
    let retry = RetryPolicy::deadline(Duration::from_secs(20))
        .with_delay(Duration::from_secs(8), Duration::ZERO);
    let x = client(cluster.urls(), retry);
    x.connect().await;
    for round in 0..5 {
        let resource = format!("turn-{round}");
        let a = x.acquire(&resource).await.expect("A");
        let b = {
            let (x, r) = (x.clone(), resource.clone());
            tokio::spawn(async move { x.acquire(&r).await })
        };
        tokio::time::sleep(Duration::from_millis(50 + 20 * round)).await;
        let c = {
            let (x, r) = (x.clone(), resource.clone());
            tokio::spawn(async move {
                let lock = x.acquire(&r).await;
                (Instant::now(), lock)
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        b.abort();
        let _ = b.await;
        tokio::time::sleep(Duration::from_millis(10 * round)).await;
        let released = Instant::now();
        x.release(a).await.expect("A releases");
        let (at, lock) = tokio::time::timeout(Duration::from_secs(15), c)
            .await
            .expect("C done")
            .expect("C task");
        let lock = lock.expect("C acquires");
        let waited = at.saturating_duration_since(released);
        println!("round {round}: C got the lock {waited:?} after A's release");
        assert!(waited < Duration::from_secs(1), "C waited {waited:?}");
        x.release(lock).await.expect("C releases");
    }
}

/// Three clients of four tasks each take turns on one key, each holding it for a moment. The
/// retry delay is 4 s: a waiter that slept it out missed a release (the lock is never held
/// for more than a few ms). Every acquire must succeed, and none may wait anywhere near the
/// retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_several_clients_never_sleep_out_a_retry_delay() {
    let cluster = Cluster::start(3).await.expect("cluster");
    let retry = RetryPolicy::deadline(Duration::from_secs(30))
        .with_delay(Duration::from_secs(4), Duration::ZERO);
    let clients: Vec<Redlock> = (0..3)
        .map(|_| client(cluster.urls(), retry.clone()))
        .collect();
    for c in &clients {
        c.connect().await;
    }
    let waits = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (ci, c) in clients.iter().enumerate() {
        for t in 0..4u64 {
            let (c, waits) = (c.clone(), Arc::clone(&waits));
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(0xabcdef + (ci as u64) * 131 + t * 17);
                for _ in 0..15 {
                    let began = Instant::now();
                    let lock = c.acquire("hot").await.expect("acquire");
                    let waited = began.elapsed();
                    waits.lock().unwrap().push((waited, ci, t));
                    tokio::time::sleep(Duration::from_millis(rng.below(3))).await;
                    c.release(lock).await.expect("release");
                }
            }));
        }
    }
    let all = tokio::time::timeout(Duration::from_secs(120), async {
        for task in tasks {
            task.await.expect("task");
        }
    })
    .await;
    let mut waits = waits.lock().unwrap().clone();
    waits.sort();
    let n = waits.len();
    println!(
        "{n} acquires; median {:?}, p99 {:?}, longest {:?}",
        waits.get(n / 2),
        waits.get(n * 99 / 100),
        waits.last()
    );
    assert!(all.is_ok(), "not done in 120 s ({n} acquires)");
    let long: Vec<_> = waits
        .iter()
        .filter(|(w, _, _)| *w >= Duration::from_secs(2))
        .collect();
    assert!(long.is_empty(), "waits of 2 s or more: {long:?}");
}

/// Closes every subscription connection of node `node` (`CLIENT KILL TYPE pubsub`).
async fn kill_subscriptions(node: &redlock_testkit::RedisNode) {
    let mut c = node.connection().await.expect("direct connection");
    let _: i64 = redlock_testkit::redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut c)
        .await
        .expect("CLIENT KILL");
}

/// Tasks of two clients wait on a held key; every node's subscription connections are killed and the lock released at the same moment. Each waiter
/// must still get the lock well before its 6 s retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_a_lock_released_while_their_subscriptions_break() {
    let cluster = Cluster::start(3).await.expect("cluster");
    let retry = RetryPolicy::deadline(Duration::from_secs(30))
        .with_delay(Duration::from_secs(6), Duration::ZERO);
    let holder = client(cluster.urls(), retry.clone());
    let waiters: Vec<Redlock> = (0..2)
        .map(|_| client(cluster.urls(), retry.clone()))
        .collect();
    holder.connect().await;
    for round in 0..6u64 {
        let lock = holder.acquire("broken").await.expect("holder");
        let done = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (wi, w) in waiters.iter().enumerate() {
            for _ in 0..3 {
                let (w, done) = (w.clone(), Arc::clone(&done));
                tasks.push(tokio::spawn(async move {
                    let lock = w.acquire("broken").await.expect("waiter");
                    done.lock().unwrap().push((Instant::now(), wi));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    w.release(lock).await.expect("waiter releases");
                }));
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        let kill = async {
            tokio::time::sleep(Duration::from_micros(round * 300)).await;
            for node in cluster.nodes() {
                kill_subscriptions(node).await;
            }
        };
        let release = async {
            holder.release(lock).await.expect("release");
        };
        tokio::join!(kill, release);
        let all = tokio::time::timeout(Duration::from_secs(20), async {
            for task in tasks {
                task.await.expect("task");
            }
        })
        .await;
        let done = done.lock().unwrap().clone();
        let last = done
            .iter()
            .map(|(at, _)| at.saturating_duration_since(released))
            .max();
        println!(
            "round {round}: {} waiters done, last after {last:?}",
            done.len()
        );
        assert!(
            all.is_ok(),
            "round {round}: waiters still waiting after 20 s"
        );
        assert!(
            last.is_some_and(|l| l < Duration::from_secs(3)),
            "round {round}: the last waiter got the lock {last:?} after the release"
        );
    }
}
