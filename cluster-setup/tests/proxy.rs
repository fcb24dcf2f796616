//! The fault-injecting proxy in front of real redis-server nodes.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redlock_testkit::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use redlock_testkit::{Cluster, FaultProxy};
use tokio::time::timeout;

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

async fn connect(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(3)));
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

async fn proxied_node() -> Cluster {
    Cluster::builder()
        .nodes(1)
        .proxied(true)
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn client_url_points_at_the_proxy() {
    let cluster = proxied_node().await;
    let node = cluster.node(0);
    let proxy = node.proxy().unwrap();
    assert_eq!(node.client_url(), proxy.url());
    assert_eq!(cluster.urls(), vec![proxy.url()]);
    assert_ne!(proxy.addr().port(), node.port());
    assert_eq!(proxy.target().port(), node.port());
    let mut conn = connect(&node.client_url()).await.unwrap();
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
}

#[tokio::test]
async fn delay_adds_to_each_direction() {
    let cluster = proxied_node().await;
    let proxy = cluster.node(0).proxy().unwrap();
    let mut conn = connect(&proxy.url()).await.unwrap();
    ping(&mut conn).await.unwrap();

    proxy.set_delay(Duration::from_millis(100), Duration::ZERO);
    let started = Instant::now();
    ping(&mut conn).await.unwrap();
    let rtt = started.elapsed();
    // 100 ms on the way in and 100 ms on the way out.
    assert!(rtt >= Duration::from_millis(200), "rtt {rtt:?}");
    assert!(rtt < Duration::from_millis(1000), "rtt {rtt:?}");

    proxy.heal();
    let started = Instant::now();
    ping(&mut conn).await.unwrap();
    let rtt = started.elapsed();
    assert!(rtt < Duration::from_millis(190), "rtt after heal {rtt:?}");
}

#[tokio::test]
async fn a_new_connection_delay_slows_only_the_connections_opened_under_it() {
    let cluster = proxied_node().await;
    let proxy = cluster.node(0).proxy().unwrap();
    let rtt = |conn: &mut MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let started = Instant::now();
            ping(&mut conn).await.unwrap();
            started.elapsed()
        }
    };
    let mut before = connect(&proxy.url()).await.unwrap();
    ping(&mut before).await.unwrap();

    proxy.set_new_connection_delay(Duration::from_millis(100));
    let mut slow = connect(&proxy.url()).await.unwrap();
    let old = rtt(&mut before).await;
    assert!(
        old < Duration::from_millis(190),
        "the connection opened before: {old:?}"
    );
    let new = rtt(&mut slow).await;
    assert!(
        new >= Duration::from_millis(200),
        "the connection opened under it: {new:?}"
    );

    // Neither a later change nor a heal takes it off the connections opened under it.
    proxy.set_new_connection_delay(Duration::ZERO);
    proxy.heal();
    let mut after = connect(&proxy.url()).await.unwrap();
    let new = rtt(&mut slow).await;
    assert!(new >= Duration::from_millis(200), "after a heal: {new:?}");
    let fresh = rtt(&mut after).await;
    assert!(
        fresh < Duration::from_millis(190),
        "a connection opened after: {fresh:?}"
    );
}

#[tokio::test]
async fn jitter_preserves_order() {
    let cluster = proxied_node().await;
    let proxy = cluster.node(0).proxy().unwrap();
    let conn = connect(&proxy.url()).await.unwrap();
    proxy.set_delay(Duration::from_millis(20), Duration::from_millis(20));
    // Concurrent requests on one multiplexed connection: any reordering of chunks within a
    // direction would corrupt the RESP stream or mismatch replies to requests.
    let replies = join_all((1..=200).map(|i| {
        let mut conn = conn.clone();
        async move {
            let value: i64 = conn.incr("counter", 1).await.unwrap();
            let echoed: i64 = redis::cmd("ECHO")
                .arg(i)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(echoed, i);
            value
        }
    }))
    .await;
    let mut sorted = replies.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=200).collect::<Vec<i64>>());
}

#[tokio::test]
async fn blackhole_swallows_traffic_until_heal() {
    let cluster = proxied_node().await;
    let proxy = cluster.node(0).proxy().unwrap();
    let mut conn = connect(&proxy.url()).await.unwrap();
    ping(&mut conn).await.unwrap();

    proxy.blackhole();
    let stalled = timeout(Duration::from_millis(300), ping(&mut conn)).await;
    assert!(
        stalled.is_err(),
        "PING through a blackhole answered: {stalled:?}"
    );
    // A new connection is accepted but gets no answers either.
    let fresh = timeout(Duration::from_millis(300), async {
        let mut conn = connect(&proxy.url()).await?;
        ping(&mut conn).await
    })
    .await;
    assert!(!matches!(fresh, Ok(Ok(_))), "{fresh:?}");
    // The direct path is unaffected.
    let mut direct = cluster.node(0).connection().await.unwrap();
    ping(&mut direct).await.unwrap();

    proxy.heal();
    let pong = timeout(Duration::from_secs(2), ping(&mut conn)).await;
    assert_eq!(pong.unwrap().unwrap(), "PONG");
}

#[tokio::test]
async fn partition_fails_fast_and_heal_restores() {
    let cluster = proxied_node().await;
    let proxy = cluster.node(0).proxy().unwrap();
    let mut conn = connect(&proxy.url()).await.unwrap();
    ping(&mut conn).await.unwrap();

    proxy.partition();
    let started = Instant::now();
    let existing = timeout(Duration::from_secs(1), ping(&mut conn)).await;
    assert!(matches!(existing, Ok(Err(_))), "{existing:?}");
    let fresh = timeout(Duration::from_secs(1), async {
        let mut conn = connect(&proxy.url()).await?;
        ping(&mut conn).await
    })
    .await;
    assert!(matches!(fresh, Ok(Err(_))), "{fresh:?}");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );

    proxy.heal();
    let mut conn = connect(&proxy.url()).await.unwrap();
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
}

#[tokio::test]
async fn proxy_survives_node_restart() {
    let cluster = proxied_node().await;
    let node = cluster.node(0);
    node.restart(redlock_testkit::DataOnRestart::Wipe)
        .await
        .unwrap();
    let mut conn = connect(&node.client_url()).await.unwrap();
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
}

#[tokio::test]
async fn dropping_the_proxy_stops_it() {
    let cluster = Cluster::start(1).await.unwrap();
    let proxy = FaultProxy::start(cluster.node(0).addr()).await.unwrap();
    let url = proxy.url();
    let mut conn = connect(&url).await.unwrap();
    ping(&mut conn).await.unwrap();
    drop(proxy);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(ping(&mut conn).await.is_err());
    assert!(connect(&url).await.is_err());
}

#[tokio::test]
async fn reset_open_breaks_only_the_connections_open_now() {
    let cluster = proxied_node().await;
    let proxy = cluster.node(0).proxy().unwrap();
    let mut old = connect(&proxy.url()).await.unwrap();
    assert_eq!(ping(&mut old).await.unwrap(), "PONG");
    proxy.reset_open();
    let broken = timeout(Duration::from_secs(2), async {
        loop {
            if ping(&mut old).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(broken.is_ok(), "the open connection still answers");
    let mut new = connect(&proxy.url()).await.unwrap();
    assert_eq!(ping(&mut new).await.unwrap(), "PONG");
    // A heal does not reset again what was opened since.
    proxy.heal();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(ping(&mut new).await.unwrap(), "PONG");
}
