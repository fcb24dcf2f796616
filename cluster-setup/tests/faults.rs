//! Fault primitives for chaos tests, on real redis-server processes: per-node clock jumps,
//! `SCRIPT FLUSH`, `CLIENT KILL`, `DEBUG SLEEP`, and listing keys with their TTLs.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redlock_testkit::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use redlock_testkit::{Cluster, DataOnRestart, Persistence, RedisNode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

async fn fake_clock_cluster(nodes: usize, persistence: Persistence) -> Cluster {
    Cluster::builder()
        .nodes(nodes)
        .persistence(persistence)
        .fake_clock(true)
        .start()
        .await
        .unwrap()
}

/// The node's `TIME`, in Unix milliseconds.
async fn server_time_ms(node: &RedisNode) -> i64 {
    let mut conn = node.connection().await.unwrap();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    secs * 1000 + micros / 1000
}

fn local_time_ms() -> i64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since_epoch.as_millis()).unwrap()
}

/// How far the node's clock is ahead of this process's, in ms.
async fn skew_ms(node: &RedisNode) -> i64 {
    let before = local_time_ms();
    let server = server_time_ms(node).await;
    let after = local_time_ms();
    server - (before + after) / 2
}

fn assert_near(actual: i64, expected: i64, tolerance: i64, what: &str) {
    assert!(
        (actual - expected).abs() <= tolerance,
        "{what}: {actual} is not within {tolerance} of {expected}"
    );
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    conn.pttl(key).await.unwrap()
}

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

#[tokio::test]
async fn jump_clock_moves_the_servers_time_by_the_jump() {
    let cluster = fake_clock_cluster(2, Persistence::None).await;
    let (node, other) = (cluster.node(0), cluster.node(1));
    assert_eq!(node.clock_offset(), 0);
    assert_near(skew_ms(node).await, 0, 300, "skew before any jump");

    node.jump_clock(10_000).unwrap();
    assert_eq!(node.clock_offset(), 10_000);
    assert_near(skew_ms(node).await, 10_000, 300, "skew after +10 s");

    // Cumulative: -25 s on top of +10 s.
    node.jump_clock(-25_000).unwrap();
    assert_eq!(node.clock_offset(), -15_000);
    assert_near(skew_ms(node).await, -15_000, 300, "skew after -25 s");

    // Sub-second jumps and the other node's clock, which never jumped.
    node.jump_clock(15_250).unwrap();
    assert_eq!(node.clock_offset(), 250);
    assert_near(skew_ms(node).await, 250, 200, "skew after +15.25 s");
    assert_eq!(other.clock_offset(), 0);
    assert_near(skew_ms(other).await, 0, 300, "skew of the other node");
}

#[tokio::test]
async fn forward_jump_expires_keys_at_once() {
    let cluster = fake_clock_cluster(1, Persistence::None).await;
    let node = cluster.node(0);
    let mut conn = node.connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg("short")
        .arg("v")
        .arg("PX")
        .arg(5_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let () = redis::cmd("SET")
        .arg("long")
        .arg("v")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl(&mut conn, "short").await > 4_000);

    node.jump_clock(10_000).unwrap();
    let short: Option<String> = conn.get("short").await.unwrap();
    assert_eq!(short, None, "a 5 s key survived a +10 s jump");
    assert_eq!(pttl(&mut conn, "short").await, -2);
    // A longer key lost 10 s of its TTL and is still there.
    let long = pttl(&mut conn, "long").await;
    assert!(
        (18_000..=20_000).contains(&long),
        "PTTL of the 30 s key: {long}"
    );
}

#[tokio::test]
async fn backward_jump_keeps_keys_past_their_ttl() {
    let cluster = fake_clock_cluster(2, Persistence::None).await;
    let (node, control) = (cluster.node(0), cluster.node(1));
    let mut conn = node.connection().await.unwrap();
    let mut control_conn = control.connection().await.unwrap();
    for conn in [&mut conn, &mut control_conn] {
        let () = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .arg("PX")
            .arg(2_000)
            .query_async(conn)
            .await
            .unwrap();
    }

    node.jump_clock(-10_000).unwrap();
    sleep(Duration::from_secs(3)).await;

    let v: Option<String> = conn.get("k").await.unwrap();
    assert_eq!(
        v.as_deref(),
        Some("v"),
        "a 2 s key expired after -10 s and 3 s"
    );
    let left = pttl(&mut conn, "k").await;
    assert!(
        (8_000..=9_100).contains(&left),
        "PTTL after -10 s and 3 s: {left}"
    );
    // Without the jump the same key is gone.
    let v: Option<String> = control_conn.get("k").await.unwrap();
    assert_eq!(v, None);
}

#[tokio::test]
async fn clock_offset_survives_restarts_and_snapshot_restores() {
    let cluster = fake_clock_cluster(1, Persistence::AofAlways).await;
    let node = cluster.node(0);
    node.jump_clock(60_000).unwrap();
    let snapshot = node.snapshot().await.unwrap();
    for data in [
        DataOnRestart::Keep,
        DataOnRestart::Wipe,
        DataOnRestart::AsOnDisk,
    ] {
        node.restart(data).await.unwrap();
        assert_near(skew_ms(node).await, 60_000, 300, &format!("after {data:?}"));
    }
    node.kill();
    node.jump_clock(-120_000).unwrap();
    node.restart(DataOnRestart::AsOnDisk).await.unwrap();
    assert_near(skew_ms(node).await, -60_000, 300, "jumped while killed");
    node.restore_snapshot(&snapshot).await.unwrap();
    assert_near(
        skew_ms(node).await,
        -60_000,
        300,
        "after a snapshot restore",
    );
    assert_eq!(node.clock_offset(), -60_000);
}

#[tokio::test]
async fn jump_clock_needs_a_fake_clock_cluster() {
    let cluster = Cluster::start(1).await.unwrap();
    let node = cluster.node(0);
    let err = node.jump_clock(1_000).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::Unsupported, "{err}");
    assert_eq!(node.clock_offset(), 0);
    assert_near(skew_ms(node).await, 0, 300, "skew of a plain node");

    let fake = fake_clock_cluster(1, Persistence::None).await;
    let err = fake.node(0).jump_clock(i64::MAX).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    assert_eq!(fake.node(0).clock_offset(), 0);
}

#[tokio::test]
async fn script_flush_forgets_cached_scripts() {
    let cluster = Cluster::start(1).await.unwrap();
    let node = cluster.node(0);
    let mut conn = node.connection().await.unwrap();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 42")
        .query_async(&mut conn)
        .await
        .unwrap();
    let answer: i64 = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(answer, 42);

    node.script_flush().await.unwrap();

    let err = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(0)
        .query_async::<i64>(&mut conn)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("NOSCRIPT"), "{err}");
    let exists: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&sha)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, [0]);
}

#[tokio::test]
async fn kill_clients_closes_every_other_connection() {
    let cluster = Cluster::builder()
        .nodes(1)
        .proxied(true)
        .start()
        .await
        .unwrap();
    let node = cluster.node(0);
    let mut direct = node.connection().await.unwrap();
    let mut proxied = redis::Client::open(node.client_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    assert_eq!(ping(&mut direct).await.unwrap(), "PONG");
    assert_eq!(ping(&mut proxied).await.unwrap(), "PONG");

    let killed = node.kill_clients().await.unwrap();
    assert!(killed >= 2, "killed {killed} connections");

    let direct_after = timeout(Duration::from_secs(2), ping(&mut direct)).await;
    assert!(
        matches!(direct_after, Ok(Err(_))),
        "direct connection after CLIENT KILL: {direct_after:?}"
    );
    let proxied_after = timeout(Duration::from_secs(2), ping(&mut proxied)).await;
    assert!(
        matches!(proxied_after, Ok(Err(_))),
        "proxied connection after CLIENT KILL: {proxied_after:?}"
    );
    // The server itself is fine: new connections work.
    let mut fresh = node.connection().await.unwrap();
    assert_eq!(ping(&mut fresh).await.unwrap(), "PONG");
}

/// Sends `PING` on a raw socket and waits up to `within` for the reply.
async fn raw_ping(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut buf = [0u8; 64];
    match timeout(within, stream.read(&mut buf)).await {
        Ok(Ok(n)) => Some(buf[..n].to_vec()),
        Ok(Err(e)) => panic!("read failed: {e}"),
        Err(_) => None,
    }
}

#[tokio::test]
async fn debug_sleep_hangs_the_server_but_it_still_accepts_connections() {
    let cluster = Cluster::start(1).await.unwrap();
    let node = cluster.node(0);
    let started = Instant::now();
    let sleeping = node.debug_sleep(Duration::from_millis(1500)).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(1000));

    // The caller's runtime keeps running while the server sleeps.
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = tokio::spawn({
        let ticks = Arc::clone(&ticks);
        async move {
            loop {
                sleep(Duration::from_millis(10)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });

    // Accepted by the kernel, not answered by the server.
    let mut stream = timeout(Duration::from_millis(500), TcpStream::connect(node.addr()))
        .await
        .expect("connect timed out while the server sleeps")
        .unwrap();
    stream.write_all(b"PING\r\n").await.unwrap();
    assert_eq!(
        raw_ping(&mut stream, Duration::from_millis(300)).await,
        None,
        "the sleeping server answered"
    );

    timeout(Duration::from_secs(4), sleeping)
        .await
        .expect("DEBUG SLEEP did not end")
        .unwrap();
    let slept = started.elapsed();
    assert!(slept >= Duration::from_millis(1400), "slept {slept:?}");
    assert_eq!(
        raw_ping(&mut stream, Duration::from_secs(2))
            .await
            .as_deref(),
        Some(&b"+PONG\r\n"[..])
    );
    ticker.abort();
    let ticks = ticks.load(Ordering::Relaxed);
    assert!(ticks >= 50, "the runtime ticked {ticks} times in {slept:?}");

    // A sleep shorter than the probe is over by the time the call returns.
    let short = node.debug_sleep(Duration::from_millis(20)).await.unwrap();
    timeout(Duration::from_secs(2), short)
        .await
        .unwrap()
        .unwrap();

    node.kill();
    assert!(node.debug_sleep(Duration::from_millis(100)).await.is_err());
}

#[tokio::test]
async fn debug_sleep_is_refused_when_debug_commands_are_disabled() {
    let cluster = Cluster::builder()
        .nodes(1)
        .arg("enable-debug-command", "no")
        .start()
        .await
        .unwrap();
    let err = cluster
        .node(0)
        .debug_sleep(Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("DEBUG"), "{err}");
}

#[tokio::test]
async fn keys_with_pttl_lists_matching_keys_and_their_ttls() {
    let cluster = Cluster::start(1).await.unwrap();
    let node = cluster.node(0);
    assert_eq!(node.keys_with_pttl("lock:*").await.unwrap(), []);
    let mut conn = node.connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg("lock:b")
        .arg("token")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let () = conn.set("lock:a", "forever").await.unwrap();
    let () = conn.set("other", "x").await.unwrap();

    let keys = node.keys_with_pttl("lock:*").await.unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[0], ("lock:a".to_owned(), -1));
    assert_eq!(keys[1].0, "lock:b");
    assert!((9_000..=10_000).contains(&keys[1].1), "{keys:?}");

    node.kill();
    assert!(node.keys_with_pttl("lock:*").await.is_err());
}
