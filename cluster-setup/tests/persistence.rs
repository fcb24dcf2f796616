//! Partial data loss on restart: AOF with `everysec`, `kill -9` without saving, and restores
//! from older RDB snapshots.

use std::time::Duration;

use redlock_testkit::redis::{self, AsyncCommands};
use redlock_testkit::{Cluster, DataOnRestart, Persistence, RedisNode};

async fn one_node(persistence: Persistence) -> Cluster {
    Cluster::builder()
        .nodes(1)
        .persistence(persistence)
        .start()
        .await
        .unwrap()
}

async fn set(node: &RedisNode, key: &str, value: &str) {
    let mut conn = node.connection().await.unwrap();
    let () = conn.set(key, value).await.unwrap();
}

async fn get(node: &RedisNode, key: &str) -> Option<String> {
    let mut conn = node.connection().await.unwrap();
    conn.get(key).await.unwrap()
}

async fn config_get(node: &RedisNode, name: &str) -> String {
    let mut conn = node.connection().await.unwrap();
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(&mut conn)
        .await
        .unwrap();
    pair[1].clone()
}

/// `run_id` and `uptime_in_seconds` of the running process, from `INFO server`.
#[derive(Debug)]
struct Incarnation {
    run_id: String,
    uptime_s: u64,
}

async fn incarnation(node: &RedisNode) -> Incarnation {
    let mut conn = node.connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} in INFO server:\n{info}"))
            .to_owned()
    };
    Incarnation {
        run_id: field("run_id"),
        uptime_s: field("uptime_in_seconds").parse().unwrap(),
    }
}

/// Asserts that `after` is a new process that started less than two seconds ago.
fn assert_fresh_process(before: &Incarnation, after: &Incarnation) {
    assert_eq!(after.run_id.len(), 40, "{after:?}");
    assert_ne!(before.run_id, after.run_id, "same process: {after:?}");
    assert!(after.uptime_s < 2, "{after:?}");
}

#[tokio::test]
async fn aof_everysec_kill_9_keeps_writes_older_than_two_seconds() {
    let cluster = one_node(Persistence::AofEverysec).await;
    let node = cluster.node(0);
    assert_eq!(config_get(node, "appendonly").await, "yes");
    assert_eq!(config_get(node, "appendfsync").await, "everysec");
    assert_eq!(config_get(node, "save").await, "");
    assert_eq!(config_get(node, "dbfilename").await, "dump.rdb");

    set(node, "old", "1").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    set(node, "fresh", "2").await;
    let first = incarnation(node).await;
    assert!(first.uptime_s >= 2, "{first:?}");

    node.kill();
    node.restart(DataOnRestart::AsOnDisk).await.unwrap();
    let second = incarnation(node).await;
    assert_fresh_process(&first, &second);
    assert_eq!(get(node, "old").await.as_deref(), Some("1"));
    // Written just before the kill: it may or may not have reached the file.
    let fresh = get(node, "fresh").await;
    assert!(matches!(fresh.as_deref(), None | Some("2")), "{fresh:?}");

    // `AsOnDisk` on a running node kills it the same way.
    node.restart(DataOnRestart::AsOnDisk).await.unwrap();
    assert_fresh_process(&second, &incarnation(node).await);
    assert_eq!(get(node, "old").await.as_deref(), Some("1"));
    assert_eq!(config_get(node, "appendfsync").await, "everysec");
}

#[tokio::test]
async fn as_on_disk_does_not_save_first_unlike_keep() {
    let cluster = one_node(Persistence::None).await;
    let node = cluster.node(0);
    set(node, "saved", "1").await;
    let first = incarnation(node).await;
    node.restart(DataOnRestart::Keep).await.unwrap();
    let second = incarnation(node).await;
    assert_fresh_process(&first, &second);
    assert_eq!(get(node, "saved").await.as_deref(), Some("1"));

    set(node, "unsaved", "1").await;
    node.pause();
    // A paused node is killed as it is: no resume, no SAVE.
    node.restart(DataOnRestart::AsOnDisk).await.unwrap();
    assert_fresh_process(&second, &incarnation(node).await);
    // The file still holds what Keep saved, and nothing since.
    assert_eq!(get(node, "saved").await.as_deref(), Some("1"));
    assert_eq!(get(node, "unsaved").await, None);
}

#[tokio::test]
async fn keep_under_aof_everysec_flushes_the_aof_with_a_graceful_shutdown() {
    let cluster = one_node(Persistence::AofEverysec).await;
    let node = cluster.node(0);
    set(node, "k", "v").await;
    let first = incarnation(node).await;
    node.pause();
    node.restart(DataOnRestart::Keep).await.unwrap();
    assert_fresh_process(&first, &incarnation(node).await);
    assert_eq!(get(node, "k").await.as_deref(), Some("v"));
    // SHUTDOWN NOSAVE, not SAVE: no RDB file was written.
    assert!(!node.dir().join("dump.rdb").exists());
}

#[tokio::test]
async fn restore_snapshot_brings_back_the_snapshot_and_loses_later_writes() {
    let cluster = one_node(Persistence::None).await;
    let node = cluster.node(0);
    set(node, "a", "1").await;
    set(node, "b", "1").await;
    let older = node.snapshot().await.unwrap();
    assert!(older.path().starts_with(node.dir()), "{older:?}");
    assert!(std::fs::metadata(older.path()).unwrap().len() > 0);

    set(node, "a", "2").await;
    set(node, "c", "1").await;
    let () = node.connection().await.unwrap().del("b").await.unwrap();
    let newer = node.snapshot().await.unwrap();
    assert_ne!(older.path(), newer.path());
    set(node, "d", "1").await;

    let first = incarnation(node).await;
    node.restore_snapshot(&older).await.unwrap();
    let second = incarnation(node).await;
    assert_fresh_process(&first, &second);
    assert_eq!(get(node, "a").await.as_deref(), Some("1"));
    assert_eq!(get(node, "b").await.as_deref(), Some("1"));
    assert_eq!(get(node, "c").await, None);
    assert_eq!(get(node, "d").await, None);

    node.restore_snapshot(&newer).await.unwrap();
    assert_fresh_process(&second, &incarnation(node).await);
    assert_eq!(get(node, "a").await.as_deref(), Some("2"));
    assert_eq!(get(node, "b").await, None);
    assert_eq!(get(node, "c").await.as_deref(), Some("1"));
    assert_eq!(get(node, "d").await, None);
}

#[tokio::test]
async fn restore_snapshot_under_aof_survives_later_restarts() {
    for persistence in [Persistence::AofAlways, Persistence::AofEverysec] {
        let cluster = one_node(persistence).await;
        let node = cluster.node(0);
        set(node, "a", "1").await;
        let snapshot = node.snapshot().await.unwrap();
        set(node, "a", "2").await;
        set(node, "b", "1").await;

        let first = incarnation(node).await;
        node.restore_snapshot(&snapshot).await.unwrap();
        let second = incarnation(node).await;
        assert_fresh_process(&first, &second);
        assert_eq!(
            get(node, "a").await.as_deref(),
            Some("1"),
            "{persistence:?}"
        );
        assert_eq!(get(node, "b").await, None, "{persistence:?}");
        assert_eq!(config_get(node, "appendonly").await, "yes");

        // The AOF now holds the snapshot's keys: a restart that loads the AOF keeps them.
        set(node, "c", "1").await;
        node.restart(DataOnRestart::Keep).await.unwrap();
        assert_fresh_process(&second, &incarnation(node).await);
        assert_eq!(
            get(node, "a").await.as_deref(),
            Some("1"),
            "{persistence:?}"
        );
        assert_eq!(get(node, "b").await, None, "{persistence:?}");
        assert_eq!(
            get(node, "c").await.as_deref(),
            Some("1"),
            "{persistence:?}"
        );
    }
}

#[tokio::test]
async fn a_snapshot_can_be_restored_on_another_node() {
    let cluster = Cluster::start(2).await.unwrap();
    set(cluster.node(0), "from", "node 0").await;
    set(cluster.node(1), "from", "node 1").await;
    set(cluster.node(1), "only-on-1", "x").await;
    let snapshot = cluster.node(0).snapshot().await.unwrap();
    cluster.node(1).restore_snapshot(&snapshot).await.unwrap();
    assert_eq!(
        get(cluster.node(1), "from").await.as_deref(),
        Some("node 0")
    );
    assert_eq!(get(cluster.node(1), "only-on-1").await, None);
    assert_eq!(
        get(cluster.node(0), "from").await.as_deref(),
        Some("node 0")
    );
}

#[tokio::test]
async fn snapshot_errors_are_clear_and_a_bad_snapshot_leaves_the_node_alone_or_fails_loudly() {
    let cluster = one_node(Persistence::None).await;
    let node = cluster.node(0);
    set(node, "k", "v").await;
    let snapshot = node.snapshot().await.unwrap();

    // A snapshot file that is gone: the node is not touched.
    std::fs::remove_file(snapshot.path()).unwrap();
    let pid = node.pid().unwrap();
    let err = node.restore_snapshot(&snapshot).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("cannot read snapshot"), "{err}");
    assert_eq!(node.pid(), Some(pid));

    // A file that is not an RDB file: redis-server refuses to start, and says why.
    let snapshot = node.snapshot().await.unwrap();
    std::fs::write(snapshot.path(), b"not an rdb file").unwrap();
    let err = node.restore_snapshot(&snapshot).await.unwrap_err();
    assert!(err.to_string().contains("log tail"), "{err}");
    assert!(!node.is_running());
    node.restart(DataOnRestart::Wipe).await.unwrap();
    assert_eq!(get(node, "k").await, None);

    // No snapshot of a node that is down.
    node.kill();
    assert!(node.snapshot().await.is_err());
}
