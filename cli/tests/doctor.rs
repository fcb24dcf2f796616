//! `redlock doctor` against real servers: a good cluster passes; a replica, an evicting
//! policy, one server listed twice, an even N and missing ACL permissions are flagged.

mod common;

use common::{nodes, output, redlock};
use redlock_testkit::Cluster;
use serde_json::Value;

/// `doctor --json` on `urls`: (exit code, report).
async fn doctor(urls: &str, extra: &[&str]) -> (Option<i32>, Value) {
    let mut args = vec!["--nodes", urls];
    args.extend_from_slice(extra);
    args.extend(["doctor", "--json", "--clock-sample", "100ms"]);
    let out = output(redlock(args)).await;
    let report = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (out.code, report)
}

/// The findings of `level` for `check` (on any node, or the whole list).
fn findings<'a>(report: &'a Value, level: &str, check: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["level"] == level && f["check"] == check)
        .collect()
}

#[tokio::test]
async fn a_good_cluster_passes() {
    let cluster = Cluster::start(3).await.unwrap();
    // Servers older than the quarantine (uptime is counted in whole seconds).
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    // The round trip is judged against the node timeout: 500 ms, so that a busy machine's
    // slow PINGs are not taken for a slow network (the default 50 ms warns at 25 ms).
    let extra = ["--restart-quarantine", "2s", "--node-timeout", "500ms"];
    let (code, report) = doctor(&nodes(&cluster), &extra).await;
    assert_eq!(report["errors"], 0, "{report:#}");
    assert_eq!(code, Some(0));
    assert_eq!(report["warnings"], 0, "{report:#}");
    for check in [
        "round trip",
        "server",
        "role",
        "eviction",
        "persistence",
        "acl",
        "pub/sub",
        "clock rate",
        "clock skew",
    ] {
        assert_eq!(
            findings(&report, "ok", check).len(),
            3,
            "{check}: {report:#}"
        );
    }
    // The probes leave nothing behind but the records a client writes anyway.
    for (_, key) in cluster.keys("*").await {
        assert!(!key.contains("doctor"), "{key}");
    }
    // The table form.
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "doctor",
        "--clock-sample",
        "50ms",
    ]))
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("LEVEL") && out.stdout.contains("0 error(s)"),
        "{}",
        out.stdout
    );
}

#[tokio::test]
async fn a_replica_an_evicting_policy_and_an_even_n_are_flagged() {
    let cluster = Cluster::start(4).await.unwrap();
    let mut replica = cluster.node(3).connection().await.unwrap();
    let _: () = redlock_testkit::redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(cluster.node(0).port())
        .query_async(&mut replica)
        .await
        .unwrap();
    let mut evicting = cluster.node(1).connection().await.unwrap();
    for (name, value) in [("maxmemory", "100mb"), ("maxmemory-policy", "allkeys-lru")] {
        let _: () = redlock_testkit::redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut evicting)
            .await
            .unwrap();
    }
    let (code, report) = doctor(&nodes(&cluster), &[]).await;
    assert_eq!(code, Some(1), "{report:#}");
    let role = findings(&report, "error", "role");
    assert_eq!(role.len(), 1, "{report:#}");
    assert_eq!(
        role[0]["node"],
        format!("127.0.0.1:{}", cluster.node(3).port())
    );
    let eviction = findings(&report, "error", "eviction");
    assert_eq!(eviction.len(), 1, "{report:#}");
    assert_eq!(
        eviction[0]["node"],
        format!("127.0.0.1:{}", cluster.node(1).port())
    );
    assert!(
        eviction[0]["message"]
            .as_str()
            .unwrap()
            .contains("allkeys-lru")
    );
    assert_eq!(
        findings(&report, "warn", "node count").len(),
        1,
        "{report:#}"
    );
    // The master of the replica is told that a failover can lose locks.
    assert_eq!(findings(&report, "warn", "role").len(), 1, "{report:#}");
    // Without a restart quarantine, no AOF is a warning.
    assert_eq!(
        findings(&report, "warn", "persistence").len(),
        4,
        "{report:#}"
    );
}

#[tokio::test]
async fn the_same_server_listed_twice_is_flagged() {
    let cluster = Cluster::start(2).await.unwrap();
    let urls = format!(
        "{},{},redis://localhost:{}",
        cluster.node(0).url(),
        cluster.node(1).url(),
        cluster.node(0).port()
    );
    let (code, report) = doctor(&urls, &[]).await;
    assert_eq!(code, Some(1), "{report:#}");
    let same = findings(&report, "error", "independence");
    assert_eq!(same.len(), 1, "{report:#}");
    let msg = same[0]["message"].as_str().unwrap();
    assert!(msg.contains("#0") && msg.contains("#2"), "{msg}");
}

#[tokio::test]
async fn missing_acl_permissions_are_flagged() {
    let cluster = Cluster::start(3).await.unwrap();
    for node in cluster.nodes() {
        let mut conn = node.connection().await.unwrap();
        let _: () = redlock_testkit::redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "locker",
                "on",
                ">lockerpw",
                "~redlock:*",
                "resetchannels",
                "-@all",
            ])
            .arg(&[
                "+ping",
                "+get",
                "+set",
                "+evalsha",
                "+eval",
                "+script|load",
                "+info",
                "+hello",
                "+time",
                "+pexpire",
            ])
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://locker:lockerpw@127.0.0.1:{}", n.port()))
        .collect();
    let (code, report) = doctor(&urls.join(","), &[]).await;
    assert_eq!(code, Some(1), "{report:#}");
    let acl = findings(&report, "error", "acl");
    assert_eq!(acl.len(), 3, "{report:#}");
    assert!(
        acl[0]["message"].as_str().unwrap().contains("DEL"),
        "{report:#}"
    );
    assert_eq!(findings(&report, "warn", "pub/sub").len(), 3, "{report:#}");
    assert_eq!(
        findings(&report, "warn", "config").len(),
        3,
        "CONFIG denied: {report:#}"
    );
    assert!(!report.to_string().contains("lockerpw"));
}

/// A cluster whose servers are all younger than the restart quarantine grants no lock until
/// the quarantine is over: `doctor` says so. It reported "ok" with no warning while every
/// `redlock run` failed with 69 (found in review).
#[tokio::test]
async fn a_cluster_inside_its_restart_quarantine_is_warned_about() {
    let cluster = Cluster::start(3).await.unwrap();
    let (code, report) = doctor(&nodes(&cluster), &["--restart-quarantine", "30s"]).await;
    assert_no_voting_node_is_warned_about(code, &report);
    assert_eq!(report["errors"], 0, "{report:#}");
}

/// One quarantine warning, that none of the 3 nodes votes, and exit 0 (warnings alone).
fn assert_no_voting_node_is_warned_about(code: Option<i32>, report: &Value) {
    let warned = findings(report, "warn", "quarantine");
    assert_eq!(warned.len(), 1, "{report:#}");
    assert!(
        warned[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("only 0 of 3 nodes")),
        "{report:#}"
    );
    assert_eq!(code, Some(0), "warnings alone exit 0: {report:#}");
}

/// Servers whose clocks were stepped back past their start report a negative uptime; the
/// client counts them as just started (quarantined), so `doctor` must warn as it does for a
/// fresh cluster. It left them out of its count and said "ok: 0 of 3 nodes are past the
/// restart quarantine".
#[tokio::test]
async fn servers_whose_clocks_went_back_past_their_start_are_warned_about() {
    let cluster = Cluster::builder()
        .nodes(3)
        .fake_clock(true)
        .start()
        .await
        .unwrap();
    // Old enough for a 2 s quarantine, then an hour back.
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    for i in 0..3 {
        cluster.node(i).jump_clock(-3_600_000).unwrap();
    }
    let (code, report) = doctor(&nodes(&cluster), &["--restart-quarantine", "2s"]).await;
    assert_no_voting_node_is_warned_about(code, &report);
}
