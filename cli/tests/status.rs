//! `redlock status` against real servers: held by a quorum with a short token prefix, JSON,
//! and nodes that do not answer.

mod common;

use common::{finish, nodes, output, redlock, wait_for_key};
use redlock_testkit::Cluster;
use redlock_testkit::redis::AsyncCommands;

#[tokio::test]
async fn shows_the_holder_by_token_prefix_and_json_parses() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let script = format!("while [ ! -e {} ]; do sleep 0.02; done", stop.display());
    let holder = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "orders:7",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    wait_for_key(&cluster, "redlock:lock:orders:7", 3).await;
    let mut conn = cluster.node(0).connection().await.unwrap();
    let token: String = conn.get("redlock:lock:orders:7").await.unwrap();

    let out = output(redlock(["--nodes", &nodes(&cluster), "status", "orders:7"])).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("held by a quorum: 3/3"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains(&token[..6]), "{}", out.stdout);
    assert!(
        !out.all().contains(&token[..9]),
        "at most 8 characters of the token: {}",
        out.all()
    );

    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "status",
        "orders:7",
        "--json",
    ]))
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(!out.all().contains(&token[..9]));
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(json["held_by_quorum"], true);
    assert_eq!(json["quorum"], 2);
    let prefix = json["holder_token_prefix"].as_str().unwrap();
    assert!(!prefix.is_empty() && prefix.len() <= 8 && token.starts_with(prefix));
    let per_node = json["nodes"].as_array().unwrap();
    assert_eq!(per_node.len(), 3);
    for n in per_node {
        assert_eq!(n["reachable"], true);
        assert_eq!(n["held"], true);
        let pttl = n["pttl_ms"].as_i64().unwrap();
        assert!(pttl > 0 && pttl <= 30_000, "{pttl}");
    }

    std::fs::write(&stop, "").unwrap();
    assert_eq!(finish(holder).await.code, Some(0));
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "status",
        "orders:7",
        "--json",
    ]))
    .await;
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(json["held_by_quorum"], false);
    assert_eq!(json["holder_nodes"], 0);
}

#[tokio::test]
async fn unreachable_nodes_are_reported_and_too_few_exit_69() {
    let cluster = Cluster::start(3).await.unwrap();
    cluster.node(1).kill();
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "status",
        "r",
        "--json",
    ]))
    .await;
    assert_eq!(out.code, Some(0), "a quorum answered: {out:?}");
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(json["nodes"][1]["reachable"], false);
    assert_eq!(json["reachable"], 2);
    cluster.node(2).kill();
    let out = output(redlock(["--nodes", &nodes(&cluster), "status", "r"])).await;
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.stdout.contains("unknown"), "{}", out.stdout);
}
