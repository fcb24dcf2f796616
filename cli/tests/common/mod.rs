//! Helpers shared by the CLI tests: the built `redlock` binary, run with a clean environment
//! and bounded in time, against real redis-server processes from `redlock-testkit`.

#![allow(dead_code, unreachable_pub)]

use std::process::Stdio;
use std::time::Duration;

use redlock_testkit::Cluster;
use tokio::process::{Child, Command};

/// Bound on any one invocation of the binary in these tests.
pub const RUN_LIMIT: Duration = Duration::from_secs(15);

/// What a finished invocation printed and returned.
#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// stdout and stderr together, for "never printed" checks.
    pub fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// `redlock ARGS…` with no REDLOCK_* variables and no config file reachable by default.
pub fn redlock<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = isolated(env!("CARGO_BIN_EXE_redlock"));
    cmd.args(args);
    cmd
}

/// `program` (which may start `redlock` itself) with no REDLOCK_* variables and no config file
/// reachable, stdin empty, stdout and stderr captured, killed when dropped.
pub fn isolated(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_remove("REDLOCK_NODES")
        .env_remove("REDLOCK_PASSWORD")
        .env_remove("REDLOCK_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent-redlock-test")
        .env("HOME", "/nonexistent-redlock-test")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs `cmd` to the end, bounded by [`RUN_LIMIT`].
pub async fn output(mut cmd: Command) -> Output {
    let out = tokio::time::timeout(RUN_LIMIT, cmd.output())
        .await
        .expect("redlock finished within the limit")
        .expect("redlock ran");
    Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Waits for a spawned invocation, bounded by [`RUN_LIMIT`].
pub async fn finish(child: Child) -> Output {
    let out = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .expect("redlock finished within the limit")
        .expect("redlock ran");
    Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The `--nodes` value for a cluster.
pub fn nodes(cluster: &Cluster) -> String {
    cluster.urls().join(",")
}

/// Waits (bounded) until `key` exists on at least `count` nodes.
pub async fn wait_for_key(cluster: &Cluster, key: &str, count: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if cluster.keys(key).await.len() >= count {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} did not appear on {count} nodes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A `sh -c` script that creates `ready` and then runs until SIGTERM, on which it exits 0:
/// the command of a `redlock run` whose lock a test takes away.
pub fn until_sigterm(ready: &std::path::Path) -> String {
    format!(
        "trap 'exit 0' TERM; touch {}; while :; do sleep 0.02; done",
        ready.display()
    )
}

/// Whether strace(1) can be run here (tests that fail a system call or widen a race window
/// with it print "skipped" and return without it).
pub fn has_strace() -> bool {
    std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_ok()
}

/// Waits (bounded) until `path` exists.
pub async fn wait_for_file(path: &std::path::Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// No panic, and a one-line `redlock: …` message or clap's usage error.
pub fn assert_clean_failure(out: &Output) {
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    assert!(!out.stderr.trim().is_empty(), "a message is printed");
}

/// Deletes the lock key `key` on every node: the next renewal finds it gone everywhere, and
/// the lock is lost.
pub async fn steal(cluster: &Cluster, key: &str) {
    use redlock_testkit::redis::AsyncCommands;
    for node in cluster.nodes() {
        let mut conn = node.connection().await.unwrap();
        let _: i64 = conn.del(key).await.unwrap();
    }
}
