//! `redlock run`, `status` and `doctor` against nodes that only speak TLS (`rediss://`), with
//! the CA given by `--tls-ca`; and without it, the handshake fails rather than falling back.

mod common;

use common::{output, redlock};
use redlock_testkit::{Cluster, TestPki};

/// `redlock` with the TLS nodes, the CA and room for the handshake, then `args`. A debug
/// build's TLS handshake took longer than the default connection budget (five 50 ms node
/// timeouts, at most the 1 s connect timeout) while other test binaries ran beside this one;
/// this test is about reaching the nodes, not about speed.
fn with_ca(urls: &str, ca: &str, args: &[&str]) -> tokio::process::Command {
    let room = ["--node-timeout", "2s", "--connect-timeout", "10s"];
    redlock(
        ["--nodes", urls, "--tls-ca", ca]
            .iter()
            .chain(&room)
            .chain(args),
    )
}

#[tokio::test]
async fn run_status_and_doctor_reach_tls_nodes_with_a_custom_ca() {
    let pki = TestPki::generate().unwrap();
    let cluster = Cluster::builder()
        .nodes(3)
        .tls(pki.tls_files())
        .start()
        .await
        .unwrap();
    let urls = cluster.tls_urls().expect("a TLS listener").join(",");
    let ca = pki.ca_path();
    let ca = ca.to_str().unwrap();

    // `run` with --keep leaves the lock for `status` to find.
    let out = output(with_ca(
        &urls,
        ca,
        &["run", "--keep", "--ttl", "20s", "tls:job", "--", "true"],
    ))
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");

    let out = output(with_ca(&urls, ca, &["status", "tls:job", "--json"])).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(json["reachable"], 3, "{json:#}");
    assert_eq!(json["held_by_quorum"], true, "{json:#}");

    // A URL's scheme is case-insensitive, and `run` takes `REDISS://` with the CA; `status`
    // read only a lower-case `rediss://` as TLS with the CA, so it tried the system's roots
    // and found no node (found in review).
    let upper = urls.replace("rediss://", "REDISS://");
    let out = output(with_ca(&upper, ca, &["status", "tls:job", "--json"])).await;
    assert_eq!(out.code, Some(0), "REDISS://: {out:?}");
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(json["reachable"], 3, "REDISS://: {json:#}");

    let out = output(with_ca(
        &urls,
        ca,
        &["doctor", "--json", "--clock-sample", "100ms"],
    ))
    .await;
    let report: serde_json::Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let unreachable: Vec<_> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "reachable" && f["level"] != "ok")
        .collect();
    assert!(unreachable.is_empty(), "{report:#}");
    assert_eq!(report["errors"], 0, "{report:#}");

    // Without the CA: every node fails the handshake; status cannot tell (69), nothing is
    // read in plain text.
    let out = output(redlock(["--nodes", &urls, "status", "tls:job", "--json"])).await;
    assert_eq!(out.code, Some(69), "{out:?}");
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(json["reachable"], 0, "{json:#}");
}
