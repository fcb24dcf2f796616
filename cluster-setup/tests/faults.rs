//! Fault primitives for chaos tests, on real redis-server processes: `SCRIPT FLUSH`,
//! `CLIENT KILL`, `DEBUG SLEEP`, and listing keys with their TTLs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redlock_testkit::Cluster;
use redlock_testkit::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
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
