//! Process control of real redis-server nodes.

use std::path::Path;
use std::time::Duration;

use redlock_testkit::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use redlock_testkit::{Cluster, DataOnRestart, Persistence, SERVER_ENV};
use tokio::time::timeout;

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

#[tokio::test]
async fn starts_nodes_that_answer_ping() {
    let cluster = Cluster::start(3).await.unwrap();
    assert_eq!(cluster.len(), 3);
    assert!(!cluster.is_empty());
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    for (node, url) in cluster.nodes().iter().zip(&urls) {
        assert_eq!(url, &format!("redis://127.0.0.1:{}", node.port()));
        assert!(node.proxy().is_none());
        assert!(node.tls_port().is_none());
        let mut conn = node.connection().await.unwrap();
        assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
        // A client of the workspace `redis` crate reaches the node by URL, too.
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    }
    let mut ports: Vec<u16> = cluster.nodes().iter().map(|n| n.port()).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
}

#[tokio::test]
async fn nodes_are_configured_as_documented() {
    let cluster = Cluster::builder()
        .nodes(1)
        .persistence(Persistence::AofAlways)
        .start()
        .await
        .unwrap();
    let mut conn = cluster.node(0).connection().await.unwrap();
    let get = |name: &'static str| {
        let mut conn = conn.clone();
        async move {
            let pair: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(&mut conn)
                .await
                .unwrap();
            pair[1].clone()
        }
    };
    assert_eq!(get("maxmemory-policy").await, "noeviction");
    assert_eq!(get("appendonly").await, "yes");
    assert_eq!(get("appendfsync").await, "always");
    assert_eq!(get("save").await, "");
    assert_eq!(get("bind").await, "127.0.0.1");
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
    assert_eq!(role[0], redis::Value::BulkString(b"master".to_vec()));
}

#[tokio::test]
async fn kill_makes_connections_fail() {
    let cluster = Cluster::start(1).await.unwrap();
    let node = cluster.node(0);
    let pid = node.pid().unwrap();
    node.kill();
    node.kill(); // idempotent
    assert_eq!(node.pid(), None);
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    assert!(node.connection().await.is_err());
}

#[tokio::test]
async fn pause_stalls_and_resume_recovers() {
    let cluster = Cluster::start(1).await.unwrap();
    let node = cluster.node(0);
    let mut conn = node.connection().await.unwrap();
    node.pause();
    let stalled = timeout(Duration::from_millis(200), ping(&mut conn)).await;
    assert!(
        stalled.is_err(),
        "PING to a paused node answered: {stalled:?}"
    );
    node.resume();
    let pong = timeout(Duration::from_secs(2), ping(&mut conn)).await;
    assert_eq!(pong.unwrap().unwrap(), "PONG");
}

#[tokio::test]
async fn restart_keep_keeps_data_and_wipe_loses_it() {
    let cluster = Cluster::start(1).await.unwrap();
    let node = cluster.node(0);
    let port = node.port();
    let mut conn = node.connection().await.unwrap();
    let _: () = conn.set("k", "v").await.unwrap();

    let old_pid = node.pid().unwrap();
    node.restart(DataOnRestart::Keep).await.unwrap();
    assert_eq!(node.port(), port);
    assert_ne!(node.pid().unwrap(), old_pid);
    let mut conn = node.connection().await.unwrap();
    let v: Option<String> = conn.get("k").await.unwrap();
    assert_eq!(v.as_deref(), Some("v"));

    node.restart(DataOnRestart::Wipe).await.unwrap();
    let mut conn = node.connection().await.unwrap();
    let v: Option<String> = conn.get("k").await.unwrap();
    assert_eq!(v, None);
}

#[tokio::test]
async fn restart_keep_of_a_paused_node_works() {
    let cluster = Cluster::start(1).await.unwrap();
    let node = cluster.node(0);
    let mut conn = node.connection().await.unwrap();
    let _: () = conn.set("k", "v").await.unwrap();
    node.pause();
    node.restart(DataOnRestart::Keep).await.unwrap();
    let mut conn = node.connection().await.unwrap();
    let v: Option<String> = conn.get("k").await.unwrap();
    assert_eq!(v.as_deref(), Some("v"));
}

#[tokio::test]
async fn aof_always_survives_kill_9() {
    let cluster = Cluster::builder()
        .nodes(1)
        .persistence(Persistence::AofAlways)
        .start()
        .await
        .unwrap();
    let node = cluster.node(0);
    let mut conn = node.connection().await.unwrap();
    let _: () = conn.set("k", "v").await.unwrap();
    node.kill();
    node.restart(DataOnRestart::Keep).await.unwrap();
    let mut conn = node.connection().await.unwrap();
    let v: Option<String> = conn.get("k").await.unwrap();
    assert_eq!(v.as_deref(), Some("v"));
}

#[tokio::test]
async fn without_persistence_kill_9_loses_data() {
    let cluster = Cluster::start(1).await.unwrap();
    let node = cluster.node(0);
    let mut conn = node.connection().await.unwrap();
    let _: () = conn.set("k", "v").await.unwrap();
    node.kill();
    node.restart(DataOnRestart::Keep).await.unwrap();
    let mut conn = node.connection().await.unwrap();
    let v: Option<String> = conn.get("k").await.unwrap();
    assert_eq!(v, None);
}

#[tokio::test]
async fn keys_skips_unreachable_nodes() {
    let cluster = Cluster::start(3).await.unwrap();
    for (i, node) in cluster.nodes().iter().enumerate() {
        let mut conn = node.connection().await.unwrap();
        let _: () = conn.set(format!("lock:{i}"), "t").await.unwrap();
        let _: () = conn.set("other", "t").await.unwrap();
    }
    assert_eq!(
        cluster.keys("lock:*").await,
        vec![
            (0, "lock:0".to_owned()),
            (1, "lock:1".to_owned()),
            (2, "lock:2".to_owned())
        ]
    );
    cluster.node(1).pause();
    cluster.node(2).kill();
    let started = std::time::Instant::now();
    assert_eq!(cluster.keys("lock:*").await, vec![(0, "lock:0".to_owned())]);
    assert!(started.elapsed() < Duration::from_secs(2));
    cluster.node(1).resume();
}

#[tokio::test]
async fn command_calls_counts_commands() {
    let cluster = Cluster::start(1).await.unwrap();
    let node = cluster.node(0);
    assert_eq!(node.command_calls("evalsha").await, 0);
    let mut conn = node.connection().await.unwrap();
    for i in 0..3 {
        let _: () = conn.set("k", i).await.unwrap();
    }
    let script = redis::Script::new("return redis.call('GET', KEYS[1])");
    for _ in 0..2 {
        let _: String = script.key("k").invoke_async(&mut conn).await.unwrap();
    }
    assert_eq!(node.command_calls("set").await, 3);
    assert_eq!(node.command_calls("SET").await, 3);
    // The first invocation may fall back to EVAL/SCRIPT LOAD; the second is an EVALSHA hit.
    assert!(node.command_calls("evalsha").await >= 1);
    node.kill();
    assert_eq!(node.command_calls("set").await, 0);
}

#[tokio::test]
async fn requirepass_is_respected() {
    let cluster = Cluster::builder()
        .nodes(1)
        .arg("requirepass", "s3cret")
        .start()
        .await
        .unwrap();
    let node = cluster.node(0);
    assert_eq!(node.password(), Some("s3cret"));
    let mut conn = node.connection().await.unwrap();
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    let client = redis::Client::open(node.url()).unwrap();
    let mut anonymous = client.get_multiplexed_async_connection().await.unwrap();
    assert!(ping(&mut anonymous).await.is_err());
    node.restart(DataOnRestart::Keep).await.unwrap();
    assert!(node.command_calls("ping").await >= 1);
}

#[tokio::test]
async fn drop_kills_every_process() {
    let cluster = Cluster::builder()
        .nodes(3)
        .proxied(true)
        .start()
        .await
        .unwrap();
    cluster.node(1).pause();
    let pids: Vec<u32> = cluster.nodes().iter().map(|n| n.pid().unwrap()).collect();
    let dirs: Vec<_> = cluster.nodes().iter().map(|n| n.dir().to_owned()).collect();
    drop(cluster);
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} survived"
        );
    }
    for dir in dirs {
        assert!(!dir.exists(), "{} survived", dir.display());
    }
}

#[test]
fn missing_binary_is_explained() {
    // `std::env::set_var` is unsafe in edition 2024 (and `unsafe_code` is forbidden), so
    // the lookup runs in a child test process with an empty PATH instead.
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "missing_binary_probe",
            "--nocapture",
            "--ignored",
        ])
        .env("REDIS_SERVER_PROBE", "1")
        .env("PATH", "/nonexistent")
        .env_remove("REDIS_SERVER")
        .env_remove(SERVER_ENV)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("apt-get install redis-server"), "{stdout}");
    assert!(stdout.contains(SERVER_ENV), "{stdout}");
}

#[test]
fn missing_chosen_binary_is_explained() {
    let exe = std::env::current_exe().unwrap();
    for value in ["/nonexistent/valkey-server", "no-such-server"] {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "missing_binary_probe",
                "--nocapture",
                "--ignored",
            ])
            .env("REDIS_SERVER_PROBE", "1")
            .env(SERVER_ENV, value)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert!(
            stdout.contains(&format!("{SERVER_ENV}={value} names no server binary")),
            "{stdout}"
        );
    }
}

#[tokio::test]
async fn reports_which_server_runs() {
    let cluster = Cluster::start(2).await.unwrap();
    let version = cluster.server_version().await.unwrap();
    assert_eq!(cluster.node(1).server_version().await.unwrap(), version);
    let binary = cluster
        .node(0)
        .server_binary()
        .to_string_lossy()
        .into_owned();
    println!("{binary}: {version}");
    // The binary's name says which server it is (redis-server, valkey-server).
    let expected = if binary.contains("valkey") {
        "valkey"
    } else {
        "redis"
    };
    assert_eq!(version.name(), expected, "{binary}: {version}");
    assert_eq!(version.is_valkey(), expected == "valkey");
    assert!(version.numbers().0 >= 7, "{version}");
    assert_eq!(
        version.to_string(),
        format!("{expected} {}", version.version())
    );
}

#[tokio::test]
#[ignore = "run by missing_binary_is_explained in a child process"]
async fn missing_binary_probe() {
    if std::env::var_os("REDIS_SERVER_PROBE").is_none() {
        return;
    }
    let err = Cluster::start(1).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    println!("error: {err}");
}
