//! Node faults on real `redis-server` processes of a testkit [`Cluster`].
//!
//! | kind | inject | heal |
//! | --- | --- | --- |
//! | `node-pause` | `SIGSTOP` | `SIGCONT` |
//! | `kill` | `kill -9` | restart with no data (`DataOnRestart::Wipe`) |
//! | `kill-aof` | `kill -9` | restart from the data files (`AsOnDisk`; the cluster must run `Persistence::AofAlways`) |
//! | `kill-snapshot` | `kill -9` | restore the newest rolling snapshot taken at least [`SNAPSHOT_AGE`] before the kill |
//! | `delay`, `drop`, `partition` | the node's `FaultProxy`: `set_delay(amount, jitter)`, `blackhole`, `partition` | `heal` |
//! | `clock-forward`, `clock-back` | `jump_clock(±amount)` (the cluster must be built with `fake_clock(true)`) | nothing: the step stays |
//! | `script-flush` | `SCRIPT FLUSH` | nothing |
//! | `client-kill` | `CLIENT KILL` of every client connection | nothing |
//! | `debug-sleep` | `DEBUG SLEEP amount`, returns once the server sleeps | waits (bounded) until the sleep is over |
//! | `churn` | a task doing `CLIENT KILL` every [`CHURN_EVERY`] | stops the task |
//!
//! Every fault acts on all its nodes at once; an error on one node does not stop the others,
//! and the errors are reported together.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::{BoxFuture, join_all};
use redlock_testkit::{Cluster, DataOnRestart, DebugSleep, FaultProxy, RedisNode, Snapshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use crate::nemesis::{Fault, Faults, Kind};

/// How often `churn` kills every client connection of its nodes.
pub const CHURN_EVERY: Duration = Duration::from_millis(100);
/// How often the rolling snapshots are taken, by default.
pub const SNAPSHOT_EVERY: Duration = Duration::from_secs(1);
/// How old a snapshot must be for `kill-snapshot` to restore it, by default: the writes of
/// (at least) this long before the kill are lost.
pub const SNAPSHOT_AGE: Duration = Duration::from_secs(2);
/// Rolling snapshots older than this are deleted.
const SNAPSHOT_RETAIN: Duration = Duration::from_secs(20);
/// Bound on one node's rolling snapshot (a paused or sleeping node does not answer `SAVE`).
const SNAPSHOT_TIMEOUT: Duration = Duration::from_millis(500);
/// Slack on top of a `debug-sleep`'s own length when healing waits for it to end.
const DEBUG_SLEEP_SLACK: Duration = Duration::from_secs(3);

/// One node's rolling snapshots, oldest first, with when each was taken.
type Ring = VecDeque<(Instant, Snapshot)>;

/// Injects node faults into a proxied testkit cluster.
#[derive(Debug)]
pub struct RealFaults {
    cluster: Arc<Cluster>,
    /// Per node: rolling snapshots, oldest first.
    snapshots: Arc<Vec<Mutex<Ring>>>,
    /// The minimum age of a restored snapshot.
    snapshot_age: Duration,
    /// The task taking rolling snapshots, if any.
    snapshotter: Option<JoinHandle<()>>,
    /// Per `kill-snapshot` fault id: the snapshot each node is restored from.
    restore: Mutex<HashMap<usize, Vec<(usize, Snapshot)>>>,
    /// Per `debug-sleep` fault id: the sleeps to wait for.
    sleeps: Mutex<HashMap<usize, Vec<DebugSleep>>>,
    /// Per `churn` fault id: the task killing connections.
    churn: Mutex<HashMap<usize, JoinHandle<()>>>,
}

impl RealFaults {
    /// Faults for `cluster` (built with `proxied(true)`), without rolling snapshots: a
    /// `kill-snapshot` then fails to inject.
    pub fn new(cluster: Arc<Cluster>) -> Self {
        let snapshots = (0..cluster.len())
            .map(|_| Mutex::new(VecDeque::new()))
            .collect();
        Self {
            cluster,
            snapshots: Arc::new(snapshots),
            snapshot_age: SNAPSHOT_AGE,
            snapshotter: None,
            restore: Mutex::default(),
            sleeps: Mutex::default(),
            churn: Mutex::default(),
        }
    }

    /// Snapshots every node now and then every `every` (a node that does not answer within
    /// 500 ms is skipped that round), so that `kill-snapshot` can restore a node to the newest
    /// snapshot taken at least `age` before the kill — or, early in a run, to the oldest one.
    /// Snapshots older than 20 s are deleted. Must be called within a tokio runtime; the task
    /// stops when `self` is dropped.
    pub fn with_rolling_snapshots(mut self, every: Duration, age: Duration) -> Self {
        self.snapshot_age = age;
        if let Some(old) = self.snapshotter.take() {
            old.abort();
        }
        let cluster = Arc::clone(&self.cluster);
        let snapshots = Arc::clone(&self.snapshots);
        self.snapshotter = Some(tokio::spawn(async move {
            loop {
                let taken = join_all(
                    cluster
                        .nodes()
                        .iter()
                        .map(|node| timeout(SNAPSHOT_TIMEOUT, node.snapshot())),
                )
                .await;
                let now = Instant::now();
                for (ring, taken) in snapshots.iter().zip(taken) {
                    let mut ring = lock(ring);
                    if let Ok(Ok(snapshot)) = taken {
                        ring.push_back((now, snapshot));
                    }
                    while ring
                        .front()
                        .is_some_and(|(at, _)| now.duration_since(*at) > SNAPSHOT_RETAIN)
                    {
                        if let Some((_, old)) = ring.pop_front() {
                            let _ = fs::remove_file(old.path());
                        }
                    }
                }
                tokio::time::sleep(every).await;
            }
        }));
        self
    }

    fn nodes<'a>(&'a self, fault: &'a Fault) -> impl Iterator<Item = (usize, &'a RedisNode)> + 'a {
        fault.nodes.iter().map(|&i| (i, self.cluster.node(i)))
    }

    /// The snapshot of node `i` that a `kill-snapshot` now restores.
    fn old_snapshot(&self, i: usize) -> Result<Snapshot, String> {
        let ring = lock(&self.snapshots[i]);
        let now = Instant::now();
        ring.iter()
            .rev()
            .find(|(at, _)| now.duration_since(*at) >= self.snapshot_age)
            .or_else(|| ring.front())
            .map(|(_, snapshot)| snapshot.clone())
            .ok_or_else(|| {
                format!(
                    "node {i} has no snapshot to restore (rolling snapshots are off or none \
                     has succeeded yet)"
                )
            })
    }

    async fn inject_on(&self, fault: &Fault, i: usize, node: &RedisNode) -> Result<(), String> {
        let amount_ms = || i64::try_from(fault.amount.as_millis()).unwrap_or(i64::MAX);
        match fault.kind {
            Kind::NodePause => node.pause(),
            Kind::Kill | Kind::KillAof => node.kill(),
            Kind::KillSnapshot => {
                let snapshot = self.old_snapshot(i)?;
                node.kill();
                lock(&self.restore)
                    .entry(fault.id)
                    .or_default()
                    .push((i, snapshot));
            }
            Kind::Delay => proxy_of(node)?.set_delay(fault.amount, fault.jitter),
            Kind::Drop => proxy_of(node)?.blackhole(),
            Kind::Partition => proxy_of(node)?.partition(),
            Kind::ClockForward => node.jump_clock(amount_ms()).map_err(|e| e.to_string())?,
            Kind::ClockBack => node.jump_clock(-amount_ms()).map_err(|e| e.to_string())?,
            Kind::ScriptFlush => node.script_flush().await.map_err(|e| e.to_string())?,
            Kind::ClientKill => {
                node.kill_clients().await.map_err(|e| e.to_string())?;
            }
            Kind::DebugSleep => {
                let sleep = node
                    .debug_sleep(fault.amount)
                    .await
                    .map_err(|e| e.to_string())?;
                lock(&self.sleeps).entry(fault.id).or_default().push(sleep);
            }
            Kind::Churn => {} // one task for all nodes, started by `inject`
            Kind::Pause => return Err("a client pause is not a node fault".to_owned()),
        }
        Ok(())
    }

    async fn heal_on(&self, fault: &Fault, i: usize, node: &RedisNode) -> Result<(), String> {
        match fault.kind {
            Kind::NodePause => node.resume(),
            Kind::Kill => node
                .restart(DataOnRestart::Wipe)
                .await
                .map_err(|e| e.to_string())?,
            Kind::KillAof => node
                .restart(DataOnRestart::AsOnDisk)
                .await
                .map_err(|e| e.to_string())?,
            Kind::KillSnapshot => {
                let snapshot = lock(&self.restore).get_mut(&fault.id).and_then(|chosen| {
                    let at = chosen.iter().position(|(n, _)| *n == i)?;
                    Some(chosen.swap_remove(at).1)
                });
                // Without one the node was not killed at inject: nothing to heal.
                if let Some(snapshot) = snapshot {
                    node.restore_snapshot(&snapshot)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            Kind::Delay | Kind::Drop | Kind::Partition => proxy_of(node)?.heal(),
            Kind::ClockForward
            | Kind::ClockBack
            | Kind::ScriptFlush
            | Kind::ClientKill
            | Kind::DebugSleep
            | Kind::Churn
            | Kind::Pause => {}
        }
        Ok(())
    }

    /// Kills every client connection of `fault`'s nodes every [`CHURN_EVERY`] until aborted.
    fn start_churn(&self, fault: &Fault) {
        let cluster = Arc::clone(&self.cluster);
        let nodes = fault.nodes.clone();
        let task = tokio::spawn(async move {
            loop {
                // A node that cannot be reached this round is tried again the next.
                let _ = join_all(nodes.iter().map(|&i| cluster.node(i).kill_clients())).await;
                tokio::time::sleep(CHURN_EVERY).await;
            }
        });
        if let Some(old) = lock(&self.churn).insert(fault.id, task) {
            old.abort();
        }
    }

    /// Waits until every `DEBUG SLEEP` of `fault` is over.
    async fn end_sleeps(&self, fault: &Fault) -> Result<(), String> {
        let sleeps = lock(&self.sleeps).remove(&fault.id).unwrap_or_default();
        let results = timeout(fault.amount + DEBUG_SLEEP_SLACK, join_all(sleeps))
            .await
            .map_err(|_| format!("DEBUG SLEEP {:?} did not end in time", fault.amount))?;
        let errors: Vec<String> = results
            .into_iter()
            .filter_map(|r| r.err().map(|e| e.to_string()))
            .collect();
        joined(errors)
    }
}

impl Drop for RealFaults {
    fn drop(&mut self) {
        if let Some(task) = self.snapshotter.take() {
            task.abort();
        }
        for (_, task) in lock(&self.churn).drain() {
            task.abort();
        }
    }
}

impl Faults for RealFaults {
    fn inject<'a>(&'a self, fault: &'a Fault) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let results =
                join_all(self.nodes(fault).map(|(i, node)| async move {
                    on_node(i, self.inject_on(fault, i, node).await)
                }))
                .await;
            if fault.kind == Kind::Churn {
                self.start_churn(fault);
            }
            joined(results.into_iter().filter_map(Result::err).collect())
        })
    }

    fn heal<'a>(&'a self, fault: &'a Fault) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let mut errors = Vec::new();
            match fault.kind {
                Kind::Churn => {
                    let task = lock(&self.churn).remove(&fault.id);
                    if let Some(task) = task {
                        task.abort();
                        let _ = task.await;
                    }
                }
                Kind::DebugSleep => {
                    if let Err(e) = self.end_sleeps(fault).await {
                        errors.push(e);
                    }
                }
                _ => {}
            }
            let results =
                join_all(self.nodes(fault).map(|(i, node)| async move {
                    on_node(i, self.heal_on(fault, i, node).await)
                }))
                .await;
            lock(&self.restore).remove(&fault.id);
            errors.extend(results.into_iter().filter_map(Result::err));
            joined(errors)
        })
    }
}

fn proxy_of(node: &RedisNode) -> Result<&FaultProxy, String> {
    node.proxy()
        .ok_or_else(|| format!("node {} has no fault proxy", node.port()))
}

fn on_node(i: usize, result: Result<(), String>) -> Result<(), String> {
    result.map_err(|e| format!("node {i}: {e}"))
}

fn joined(errors: Vec<String>) -> Result<(), String> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
