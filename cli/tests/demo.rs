//! `redlock demo` (feature `demo`) end to end: it starts its own cluster, every step shows what
//! it sets out to show (the demo checks each exit code and the counter itself and exits
//! non-zero otherwise), and it leaves no lock key and no server behind.

mod common;

use std::time::Duration;

use common::redlock;

/// Run with a user's settings for their own nodes in the environment and the config file — a
/// password and a restart quarantine, either of which failed every step of the demo: they are
/// not for the demo's cluster.
#[tokio::test]
async fn the_demo_shows_every_step_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "restart_quarantine = \"60s\"\nnode_timeout = \"1ms\"\n",
    )
    .unwrap();
    let mut demo = redlock(["demo"]);
    demo.env("REDLOCK_PASSWORD", "the-users-own")
        .env("REDLOCK_CONFIG", &config);
    let out = tokio::time::timeout(Duration::from_secs(90), demo.output())
        .await
        .expect("the demo finished within 90 s")
        .expect("redlock ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    for shown in [
        "-> exit 75",
        "-> exit 69",
        "-> exit 79",
        "counter = 12 (exactly 12",
        "lock keys left on the nodes: 0",
        "every step showed what it should",
    ] {
        assert!(stdout.contains(shown), "{shown:?} not shown:\n{stdout}");
    }
}
