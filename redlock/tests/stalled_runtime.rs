//! A client whose thread stalls — a long GC-like pause, a blocking call on the runtime's only
//! thread — while an attempt waits for nodes that do not answer still gets an answer once the
//! thread runs again. The attempt used to hang forever: after a stall longer than the node
//! timeout plus the one-second delivery grace, the phase's driver gave up on the silent nodes
//! without recording them, so the decision was never made.

mod common;

use std::time::{Duration, Instant};

use redlock_testkit::Cluster;

#[test]
fn an_attempt_on_hung_nodes_is_decided_after_a_stall() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cluster = Cluster::start(3).await.unwrap();
        let rl = common::client(cluster.urls(), Duration::from_secs(10));
        // Open every connection, then hang a majority: they accept and never answer.
        let lock = rl.try_acquire("stall").await.expect("healthy acquire");
        rl.release(lock).await.expect("release");
        cluster.node(1).pause();
        cluster.node(2).pause();
        let attempt = tokio::spawn({
            let rl = rl.clone();
            async move { rl.try_acquire("stall").await }
        });
        // Let the attempt send its requests, then stall the only thread for longer than the
        // node timeout (50 ms) plus the delivery grace (1 s).
        tokio::time::sleep(Duration::from_millis(10)).await;
        std::thread::sleep(Duration::from_millis(1300));
        let resumed = Instant::now();
        let outcome = tokio::time::timeout(Duration::from_secs(5), attempt).await;
        cluster.node(1).resume();
        cluster.node(2).resume();
        let outcome = outcome.expect("the attempt was decided after the stall");
        let err = outcome
            .expect("task")
            .expect_err("a majority never answered");
        assert!(err.is_quorum_unreachable(), "{err}");
        assert!(
            resumed.elapsed() < Duration::from_secs(1),
            "{:?}",
            resumed.elapsed()
        );
    });
}
