//! A client renewing many locks must not hold its own acquires back behind that work.
//!
//! A round of renewals is sent as calls of up to 1,000 locks each, several at once (over a slow
//! link they must not wait for one another). Sent all at once on the node's connection, they
//! queue there ahead of every acquire made meanwhile: with 100,000 locks held on five nodes
//! sharing two cores, every acquire in flight timed out at the 50 ms node timeout when a round
//! began. The test reads the order the node ran things in from the node itself: each acquire's
//! claim stamp is the server's clock when it was granted, each renewed key's expiry time
//! (`PEXPIRETIME`) less its TTL the server's clock when it was renewed, and the client and the
//! server share one clock (loopback), so the keys renewed between an acquire's sending and its
//! grant are the renewal work it waited behind. Without pacing, 6.9–8.0 calls' worth (of 8
//! in flight) in 6 runs; paced, 1.0–2.0 in 13 runs, up to 4.3 with two busy loops beside it.

mod common;

use std::time::{Duration, Instant};

use redlock::Redlock;
use redlock_testkit::Cluster;
use redlock_testkit::redis;

const LOCKS: usize = 16_000;
const KEYS_PER_LOCK: usize = 4;
/// Locks per renewal call (the client's batch size).
const CALL: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_do_not_queue_behind_a_round_of_renewals() {
    let cluster = Cluster::start(1).await.unwrap();
    let ttl = Duration::from_secs(24);
    // Renewed every 8 s on a 1 s tick: locks taken within a second or two are renewed in one
    // or two rounds of several calls each.
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(ttl)
        .renew_every(Duration::from_secs(8))
        .node_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    rl.connect().await;
    let taken = Instant::now();
    let mut guards = Vec::with_capacity(LOCKS);
    for chunk in (0..LOCKS).collect::<Vec<_>>().chunks(500) {
        let locks = futures_util::future::join_all(chunk.iter().map(|i| {
            rl.try_acquire_many((0..KEYS_PER_LOCK).map(move |k| format!("held:{i}:{k}")))
        }))
        .await;
        for l in locks {
            guards.push(rl.guard(l.unwrap()).unwrap());
        }
    }
    println!("{LOCKS} locks taken in {:?}", taken.elapsed());

    // Acquire other keys one after another (kept until the end), from before the first
    // renewal (due 6.4–8 s after each lock was taken) until after the last.
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(taken.elapsed())).await;
    let mut stamps_us = Vec::new();
    let mut sent_us = Vec::new();
    let mut probes = Vec::new();
    let probe_until = taken + Duration::from_secs(11);
    let mut i = 0u64;
    while Instant::now() < probe_until {
        let sent = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let lock = rl.try_acquire(&format!("probe:{i}")).await.unwrap();
        sent_us.push(u64::try_from(sent.as_micros()).unwrap());
        stamps_us.push(lock.claims()[0].stamp_us);
        probes.push(lock);
        i += 1;
    }
    assert!(guards.iter().all(|g| !g.is_lost()), "a held lock was lost");

    // When the node renewed each held key, by its own clock (ms).
    let mut conn = cluster.node(0).connection().await.unwrap();
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap();
    let mut renewed_ms = Vec::with_capacity(LOCKS * KEYS_PER_LOCK);
    for chunk in guards.chunks(1_000) {
        let mut pipe = redis::pipe();
        for g in chunk {
            for key in g.resources() {
                pipe.cmd("PEXPIRETIME").arg(format!("redlock:lock:{key}"));
            }
        }
        let at: Vec<i64> = pipe.query_async(&mut conn).await.unwrap();
        renewed_ms.extend(at.into_iter().map(|at| at - ttl_ms));
    }
    renewed_ms.sort_unstable();
    let first_probe_ms = i64::try_from(stamps_us[0] / 1_000).unwrap();
    let renewed = renewed_ms.iter().filter(|&&r| r > first_probe_ms).count();
    assert!(
        renewed >= LOCKS * KEYS_PER_LOCK * 9 / 10,
        "only {renewed} keys were renewed while the acquires ran"
    );

    // How many keys did the node renew between an acquire's sending and its grant?
    let mut most = 0;
    for (sent, ran) in sent_us.iter().zip(&stamps_us) {
        let (from, to) = (
            i64::try_from(sent / 1_000).unwrap(),
            i64::try_from(ran / 1_000).unwrap(),
        );
        // Keys renewed after the millisecond it was sent and before the one it was granted in
        // (none when both fell in the same millisecond).
        let between = renewed_ms
            .partition_point(|&r| r < to)
            .saturating_sub(renewed_ms.partition_point(|&r| r <= from));
        most = most.max(between);
    }
    let per_call = CALL * KEYS_PER_LOCK;
    println!(
        "{} acquires; at most {most} keys ({:.1} calls) renewed while one waited",
        stamps_us.len(),
        most as f64 / per_call as f64
    );
    assert!(
        most <= 5 * per_call,
        "{most} keys ({:.1} renewal calls of {CALL} locks) ran between an acquire's sending and its grant",
        most as f64 / per_call as f64
    );
    futures_util::future::join_all(guards.into_iter().map(|g| g.release())).await;
    futures_util::future::join_all(probes.into_iter().map(|l| rl.release(l))).await;
}
