//! Shared helpers for the integration tests (real redis-server processes from the testkit).
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::time::Duration;

use redlock::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;
use redlock_testkit::redis::AsyncCommands;

/// The servers' own addresses, bypassing any proxy in front of them.
pub fn direct_urls(cluster: &Cluster) -> Vec<String> {
    cluster.nodes().iter().map(|n| n.url()).collect()
}

/// A result shown without its value (a `Lock` prints its internals): `Ok(())` or the error's
/// message.
pub fn shown<T>(r: &Result<T, redlock::Error>) -> Result<(), String> {
    r.as_ref().map(|_| ()).map_err(ToString::to_string)
}

/// Per-node timeout used by the test clients.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// A client on `urls` with short, bounded retries suited to tests.
pub fn client(urls: Vec<String>, ttl: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .ttl(ttl)
        .node_timeout(NODE_TIMEOUT)
        .retry(
            RetryPolicy::deadline(Duration::from_secs(20))
                .with_delay(Duration::from_millis(5), Duration::from_millis(10)),
        )
        .build()
        .expect("valid config")
}

/// `(node index, key)` of every lock key on every reachable node.
pub async fn lock_keys(cluster: &Cluster) -> Vec<(usize, String)> {
    cluster.keys("redlock:lock:*").await
}

/// Whether every node is free of lock keys within `limit` (slow nodes finish releases in the
/// background, so an immediate check would race them).
pub async fn no_lock_keys_within(cluster: &Cluster, limit: Duration) -> bool {
    eventually(limit, || async { lock_keys(cluster).await.is_empty() }).await
}

/// `INFO section` of node `i`, read directly (not through a proxy).
pub async fn info(cluster: &Cluster, i: usize, section: &str) -> String {
    let mut c = cluster
        .node(i)
        .connection()
        .await
        .expect("direct connection");
    redlock_testkit::redis::cmd("INFO")
        .arg(section)
        .query_async(&mut c)
        .await
        .expect("INFO")
}

/// A cluster of `n` nodes, each behind a fault proxy (`cluster.urls()` go through them).
pub async fn proxied(n: usize) -> Cluster {
    Cluster::builder()
        .nodes(n)
        .proxied(true)
        .start()
        .await
        .expect("a proxied cluster")
}

/// The value of `key` on node `i`, read directly (not through a proxy).
pub async fn get(cluster: &Cluster, i: usize, key: &str) -> Option<String> {
    let mut c = cluster
        .node(i)
        .connection()
        .await
        .expect("direct connection");
    c.get(key).await.expect("GET")
}

/// Writes `key` on node `i` directly.
pub async fn set(cluster: &Cluster, i: usize, key: &str, value: &str) {
    let mut c = cluster
        .node(i)
        .connection()
        .await
        .expect("direct connection");
    let () = c.set(key, value).await.expect("SET");
}

/// Writes `key` on node `i` directly, expiring after `ms` milliseconds.
pub async fn set_px(cluster: &Cluster, i: usize, key: &str, value: &str, ms: u64) {
    let mut c = cluster
        .node(i)
        .connection()
        .await
        .expect("direct connection");
    let () = c.pset_ex(key, value, ms).await.expect("SET PX");
}

/// `PTTL` of `key` on every node, in node order (−2 = no such key, −1 = no expiry).
pub async fn pttls(cluster: &Cluster, key: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for node in cluster.nodes() {
        let mut c = node.connection().await.expect("direct connection");
        let pttl: i64 = redlock_testkit::redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut c)
            .await
            .expect("PTTL");
        out.push(pttl);
    }
    out
}

/// Deletes `key` on node `i` directly.
pub async fn del(cluster: &Cluster, i: usize, key: &str) {
    let mut c = cluster
        .node(i)
        .connection()
        .await
        .expect("direct connection");
    let _: i64 = c.del(key).await.expect("DEL");
}

/// Publishes `message` on `channel` on node `i` directly.
pub async fn publish(cluster: &Cluster, i: usize, channel: &str, message: &str) {
    let mut c = cluster
        .node(i)
        .connection()
        .await
        .expect("direct connection");
    let _: i64 = c.publish(channel, message).await.expect("PUBLISH");
}

/// How many nodes have a subscriber on `channel`.
pub async fn subscribed_nodes(cluster: &Cluster, channel: &str) -> usize {
    let mut n = 0;
    for i in 0..cluster.len() {
        if numsub(cluster, i, channel).await > 0 {
            n += 1;
        }
    }
    n
}

/// Subscribers of `channel` on node `i` (`PUBSUB NUMSUB`, read directly; 0 for a reply without
/// a count).
pub async fn numsub(cluster: &Cluster, i: usize, channel: &str) -> i64 {
    let mut c = cluster.node(i).connection().await.unwrap();
    // A flat reply: channel, count.
    let reply: Vec<redlock_testkit::redis::Value> = redlock_testkit::redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut c)
        .await
        .unwrap();
    match reply.get(1) {
        Some(redlock_testkit::redis::Value::Int(k)) => *k,
        _ => 0,
    }
}

/// Waits until `cond` holds, polling every 20 ms, for at most `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The attempts of every acquire made while `body` runs (`redlock_acquire_attempts`), sorted;
/// only tasks on this thread are seen (a current-thread runtime).
pub async fn attempts_during<F: std::future::Future<Output = ()>>(body: F) -> Vec<f64> {
    let mut attempts = metric_during("redlock_acquire_attempts", body).await;
    attempts.sort_by(f64::total_cmp);
    attempts
}

/// What the metric `name` recorded while `body` ran: a histogram's values, or a counter's sum
/// as one value (none when nothing counted it). Only tasks polled on this thread are seen.
pub async fn metric_during<F: std::future::Future<Output = ()>>(name: &str, body: F) -> Vec<f64> {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    body.await;
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| key.key().name() == name)
        .flat_map(|(_, _, _, value)| match value {
            metrics_util::debugging::DebugValue::Histogram(h) => {
                h.into_iter().map(|x| x.into_inner()).collect()
            }
            #[allow(clippy::cast_precision_loss)]
            metrics_util::debugging::DebugValue::Counter(n) => vec![n as f64],
            metrics_util::debugging::DebugValue::Gauge(g) => vec![g.into_inner()],
        })
        .collect()
}

/// The node racing attempts for `resource` ask first, ranked by the servers' identity records
/// (`redlock:node`, `<id>@<created ms>`): the highest hash of the id and the resource.
#[allow(dead_code)]
pub async fn racing_first_node_of(cluster: &Cluster, resource: &str) -> usize {
    racing_ranking_of(cluster, resource).await[0]
}

/// Every node, in the order racing attempts for `resource` prefer them, ranked by the
/// servers' identity records.
#[allow(dead_code)]
pub async fn racing_ranking_of(cluster: &Cluster, resource: &str) -> Vec<usize> {
    racing_ranking(&server_ids(cluster).await, resource)
}

/// The id of every node's identity record (`redlock:node`, `<id>@<created ms>`), what racing
/// attempts rank the nodes by. The first client that connects creates the records; a client of
/// the nodes' direct URLs connects here first when a node has none yet.
#[allow(dead_code)]
pub async fn server_ids(cluster: &Cluster) -> Vec<String> {
    const RECORD: &str = "redlock:node";
    let read = || async {
        let mut records = Vec::with_capacity(cluster.len());
        for i in 0..cluster.len() {
            records.push(get(cluster, i, RECORD).await);
        }
        records
    };
    let mut records = read().await;
    if records.iter().any(Option::is_none) {
        let direct: Vec<String> = cluster.nodes().iter().map(|n| n.url()).collect();
        redlock::Redlock::builder()
            .nodes(direct)
            .build()
            .expect("valid config")
            .connect()
            .await;
        records = read().await;
    }
    records
        .into_iter()
        .map(|record| {
            let record = record.expect("the node's identity record (a client connected)");
            record
                .split_once('@')
                .map_or(&*record, |(id, _)| id)
                .to_owned()
        })
        .collect()
}

/// Every node called `names` (the ids of [`server_ids`]), in the order racing attempts for
/// `resource` prefer them: the first node, then the one asked first while it is passed over,
/// and so on.
#[allow(dead_code)]
pub fn racing_ranking<S: AsRef<str>>(names: &[S], resource: &str) -> Vec<usize> {
    assert!(!names.is_empty(), "at least one node");
    let fnv = |s: &str| {
        s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    };
    // MurmurHash3's finaliser, as the library applies it after FNV-1a.
    let mix = |mut x: u64| {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    };
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by_key(|&i| {
        std::cmp::Reverse(mix(fnv(&format!("{}\n{resource}", names[i].as_ref()))))
    });
    order
}

/// The least-privilege ACL rules every server needs, in the order docs/operations.md prints
/// them (tests/acl.rs runs the recipe).
pub const ACL_RECIPE: &[&str] = &[
    "resetkeys",
    "~redlock:*",
    "resetchannels",
    "&redlock:release:*",
    "-@all",
    "+evalsha",
    "+eval",
    "+script|load",
    "+get",
    "+set",
    "+pexpire",
    "+del",
    "+time",
    "+pttl",
    "+publish",
    "+subscribe",
    "+unsubscribe",
    "+ping",
];

/// `CLIENT SETINFO` (Redis ≥ 7.2, every Valkey), which redis-rs sends on connect and whose
/// refusal it ignores: without the rule nothing breaks, but every connection adds to `ACL LOG`.
fn has_setinfo(name: &str, version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    name == "valkey" || v >= (7, 2)
}

/// The owner-checked delete the server has natively (docs/protocol.md): it needs its own rule.
pub fn native_delete(name: &str, version: &str) -> Option<&'static str> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    match name {
        "valkey" if v >= (9, 0) => Some("+delifeq"),
        "redis" if v >= (8, 4) => Some("+delex"),
        _ => None,
    }
}

/// [`ACL_RECIPE`] with the rules docs/operations.md adds for server `name` at `version`.
pub fn acl_recipe(name: &str, version: &str) -> Vec<&'static str> {
    let mut rules = ACL_RECIPE.to_vec();
    if let Some(delete) = native_delete(name, version) {
        rules.push(delete);
    }
    if has_setinfo(name, version) {
        rules.push("+client|setinfo");
    }
    rules
}

/// A waiter's acquire running in a task: when it returned, and what.
pub type Acquiring =
    tokio::task::JoinHandle<(std::time::Instant, Result<redlock::Lock, redlock::Error>)>;

/// The waiter's lock from its acquire `task`, and how long after `released` it was taken.
pub async fn handed_off(
    task: Acquiring,
    released: std::time::Instant,
) -> (redlock::Lock, Duration) {
    let (acquired, got) = tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("the waiter returned within 15 s")
        .expect("task");
    let lock = got.expect("the waiter acquires");
    (lock, acquired.saturating_duration_since(released))
}

/// Asserts that the re-claimed `lock` on `resource` still says valid and that `rival` cannot
/// take it: its keys are where it counts them.
pub async fn assert_one_holder(
    cluster: &Cluster,
    rival: &Redlock,
    resource: &str,
    lock: &redlock::Lock,
) {
    let pttls = pttls(cluster, &format!("redlock:lock:{resource}")).await;
    let rival_got = rival.try_acquire(resource).await;
    println!(
        "PTTL {pttls:?}; the re-claimed lock valid for {:?}; rival: {:?}",
        lock.remaining(),
        shown(&rival_got)
    );
    assert!(lock.is_valid());
    assert!(
        rival_got.is_err(),
        "two holders: a rival took the lock while the re-claimed lock was valid (PTTL {pttls:?})"
    );
}
