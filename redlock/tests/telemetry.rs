//! The `metrics` facade sees acquisitions, contention, per-node failures and releases.

mod common;

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use redlock_testkit::Cluster;

/// A metric's name, labels and value, flattened from the debugging recorder.
type Row = (String, Vec<(String, String)>, DebugValue);

fn counter(snapshot: &[Row], name: &str, label: Option<(&str, &str)>) -> u64 {
    snapshot
        .iter()
        .filter(|(n, labels, _)| {
            n == name && label.is_none_or(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

// A current-thread runtime keeps the driver tasks on this thread, where the local recorder is.
#[tokio::test(flavor = "current_thread")]
async fn counters_and_histograms_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    let cluster = Cluster::start(3).await.unwrap();
    let rl = common::client(cluster.urls(), Duration::from_secs(5));
    let lock = rl.try_acquire("m").await.unwrap();
    let busy = rl.try_acquire("m").await.unwrap_err();
    assert!(busy.is_busy());
    rl.release(lock).await.unwrap();
    cluster.node(0).kill();
    cluster.node(1).kill();
    let unreachable = rl.try_acquire("m").await.unwrap_err();
    assert!(unreachable.is_quorum_unreachable());

    let snapshot: Vec<Row> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.name().to_owned(), labels, value)
        })
        .collect();
    assert_eq!(
        counter(
            &snapshot,
            "redlock_acquire_total",
            Some(("outcome", "acquired"))
        ),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            "redlock_acquire_total",
            Some(("outcome", "busy"))
        ),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            "redlock_acquire_total",
            Some(("outcome", "unreachable"))
        ),
        1
    );
    assert_eq!(counter(&snapshot, "redlock_contention_total", None), 1);
    assert_eq!(
        counter(
            &snapshot,
            "redlock_release_total",
            Some(("outcome", "released"))
        ),
        1
    );
    assert!(
        counter(
            &snapshot,
            "redlock_node_errors_total",
            Some(("phase", "acquire"))
        ) >= 2
    );
    let latencies = snapshot
        .iter()
        .find(|(n, _, _)| n == "redlock_acquire_seconds")
        .map(|(_, _, v)| match v {
            DebugValue::Histogram(h) => h.len(),
            _ => 0,
        });
    assert!(latencies.unwrap_or(0) >= 1, "no acquire latency recorded");
}
