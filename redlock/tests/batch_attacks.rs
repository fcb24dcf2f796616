//! The outbox and the scripts under attack, from a review (2026-12-05; real redis-server
//! processes, loopback only, every wait bounded): a release made while a hung node's outbox is
//! full, a runtime torn down with a full outbox or dropped with its thread, and a re-arm of a
//! key without expiry. Each failed before its fix.

mod common;

use std::cell::RefCell;
use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redlock::{Error, Redlock, Token};
use redlock_testkit::Cluster;

/// A client whose node timeout (30 s) outlasts filling a hung node's outbox. With 8 s, a CI
/// run with test binaries side by side took 11 s to fill it: the first attempts' requests were
/// given up on (node timeout + 1 s) and scanned out, and the outbox never filled.
fn patient_client(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(120))
        .node_timeout(Duration::from_secs(30))
        .build()
        .expect("valid config")
}

/// A client whose connections are open (one lock taken and released).
async fn warmed(cluster: &Cluster) -> Redlock {
    warmed_at(cluster.urls()).await
}

/// [`warmed`], for the nodes at `urls`.
async fn warmed_at(urls: Vec<String>) -> Redlock {
    let rl = Redlock::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_secs(2))
        .build()
        .expect("valid config");
    let warm = rl.try_acquire("warm").await.unwrap();
    rl.release(warm).await.unwrap();
    // The lock above needs only a quorum: under load a node's first connection could still be
    // opening (see `releases_are_not_queued_for_a_hung_node_whose_connection_never_opened`).
    for report in rl.connect().await {
        assert!(
            matches!(report.outcome, redlock::NodeOutcome::Confirmed),
            "{}: {:?}",
            report.node,
            report.outcome
        );
    }
    rl
}

/// STRETCH edge: a key that holds our token and has no expiry (PTTL −1) must not be given
/// one by a re-arm: "an expiry only ever moves later".
#[tokio::test(flavor = "current_thread")]
async fn a_rearm_does_not_give_a_key_without_expiry_an_expiry() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = warmed(&cluster).await;
    let token = Token::random().unwrap();
    for i in 0..3 {
        common::set(&cluster, i, "redlock:lock:forever", token.expose()).await;
    }
    let lock = tokio::time::timeout(
        Duration::from_secs(5),
        rl.try_acquire_with_token(["forever"], &token),
    )
    .await
    .unwrap()
    .expect("re-arm of our own token");
    let pttls = common::pttls(&cluster, "redlock:lock:forever").await;
    drop(lock);
    assert_eq!(
        pttls,
        vec![-1, -1, -1],
        "a re-arm shortened a key without expiry to a finite TTL"
    );
}

/// Connections opened (a lock taken and released), a lock held on every node, then node 0
/// hung (SIGSTOP) with two requests in flight there, a lock taken on nodes 1 and 2 whose grant
/// waits first in node 0's outbox, and node 0's outbox filled with refused attempts (each leaves one acquire waiting there) until the
/// client refuses more. Returns the held lock, the two in flight, the lock whose grant waits,
/// and the first error that was not a refusal (`None` if the outbox never filled).
async fn fill_a_hung_outbox(
    cluster: &Cluster,
    rl: &Redlock,
) -> (
    redlock::Lock,
    Vec<redlock::Lock>,
    redlock::Lock,
    Option<Error>,
) {
    let warm = rl.try_acquire("warm").await.unwrap();
    rl.release(warm).await.unwrap();
    let held = rl.try_acquire("held").await.unwrap();
    cluster.node(0).pause();
    let in_flight = join_all(["p1", "p2"].iter().map(|n| rl.try_acquire(n))).await;
    let waiting = rl
        .try_acquire("victim")
        .await
        .expect("granted by nodes 1 and 2");
    let mut attempts = 0usize;
    let mut full = None;
    while attempts <= (1 << 16) && full.is_none() {
        let n = 4096;
        let r = join_all((0..n).map(|_| rl.try_acquire("held"))).await;
        attempts += n;
        full = r.into_iter().find_map(|r| match r {
            Err(Error::Busy { .. }) => None,
            Ok(_) => panic!("a held lock was granted"),
            Err(e) => Some(e),
        });
    }
    (
        held,
        in_flight.into_iter().flatten().collect(),
        waiting,
        full,
    )
}

/// A release is never refused by a full outbox: the lock's own grant, still waiting in the
/// same outbox, is sent when the node wakes, and only the release queued behind it deletes
/// it. Before the fix the release was refused on node 0 ("65536 requests are already
/// waiting") and the key stayed there for the TTL after the node resumed.
#[tokio::test(flavor = "current_thread")]
async fn a_release_is_sent_even_when_a_hung_nodes_outbox_is_full() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = patient_client(&cluster);
    let started = Instant::now();
    let (held, in_flight, waiting, full) = fill_a_hung_outbox(&cluster, &rl).await;
    println!("outbox full after {:?}: {full:?}", started.elapsed());
    assert!(full.is_some(), "node 0's outbox never refused a request");
    let report = rl
        .release(waiting)
        .await
        .expect("released on nodes 1 and 2");
    println!("release on node 0: {:?}", report.nodes[0]);
    cluster.node(0).resume();
    // Node 0 runs what waited: the grant, then (with the fix) the release behind it.
    let gone = common::eventually(Duration::from_secs(5), || async {
        common::pttls(&cluster, "redlock:lock:victim").await[0] == -2
    })
    .await;
    let pttls = common::pttls(&cluster, "redlock:lock:victim").await;
    for lock in in_flight {
        let _ = rl.release(lock).await;
    }
    let _ = rl.release(held).await;
    assert!(
        gone,
        "node 0 keeps the released lock's key (PTTL per node {pttls:?}); its release there: {:?}",
        report.nodes[0]
    );
}

/// While a hung node's outbox is full, the other nodes must still be served: a lock they can
/// grant is granted, within the node timeout. Before the fix every request refused by the full
/// outbox first scanned all 65,536 waiting requests for ones nobody waited for any more, under
/// the outbox's lock and on the runtime's thread, so refusing a few thousand took minutes and
/// the healthy nodes' answers timed out (a CI run under load: "timed out after 8s" on nodes 1
/// and 2, then the release of a lock they held timed out too).
#[tokio::test(flavor = "current_thread")]
async fn healthy_nodes_are_served_while_a_hung_nodes_outbox_is_full() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = patient_client(&cluster);
    let (held, in_flight, waiting, full) = fill_a_hung_outbox(&cluster, &rl).await;
    assert!(full.is_some(), "node 0's outbox never refused a request");
    let started = Instant::now();
    let names: Vec<String> = (0..8192).map(|i| format!("fresh-{i}")).collect();
    let mut granted = Vec::new();
    let mut failed = Vec::new();
    for chunk in names.chunks(4096) {
        for r in join_all(chunk.iter().map(|n| rl.try_acquire(n.as_str()))).await {
            match r {
                Ok(lock) => granted.push(lock),
                Err(e) => failed.push(e),
            }
        }
    }
    let took = started.elapsed();
    println!(
        "{} granted, {} failed in {took:?}; first failure: {:?}",
        granted.len(),
        failed.len(),
        failed.first()
    );
    cluster.node(0).resume();
    for lock in granted.into_iter().chain(in_flight).chain([held, waiting]) {
        let _ = rl.release(lock).await;
    }
    assert!(
        failed.is_empty(),
        "{} of 8,192 locks that nodes 1 and 2 could grant failed while node 0's outbox was \
         full; the first: {:?}",
        failed.len(),
        failed.first()
    );
}

/// A test that panics (here deliberately, as a failing assertion would) while node 0 hangs
/// with a full outbox: the runtime torn down by the panic must not abort the process. Before
/// the fix it did, with a stack overflow: a runtime shutting down drops a spawned task at once,
/// so each batch's task gave its place back inside `spawn`, which sent the next batch, and so
/// on, one level deeper per batch of 128 requests.
#[tokio::test(flavor = "current_thread")]
#[should_panic(expected = "deliberate")]
async fn a_runtime_torn_down_with_a_full_outbox_does_not_overflow_the_stack() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = patient_client(&cluster);
    let started = Instant::now();
    let (_held, _in_flight, _waiting, full) = fill_a_hung_outbox(&cluster, &rl).await;
    panic!(
        "deliberate, with node 0's outbox full after {:?} ({full:?})",
        started.elapsed()
    );
}

thread_local! {
    /// A runtime kept per thread, as synchronous wrappers around async clients often do.
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

/// The child process of the test below: on a thread of its own, with a runtime kept in a
/// thread-local, it leaves an acquire in flight to a hung node (the process `pid`) and returns,
/// so that the runtime is dropped with the thread's locals.
fn hung_request_at_thread_exit(urls: Vec<String>, pid: String) {
    let worker = std::thread::spawn(move || {
        RUNTIME.with(|rt| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            *rt.borrow_mut() = Some(runtime);
        });
        RUNTIME.with(|rt| {
            let rt = rt.borrow();
            rt.as_ref().unwrap().block_on(async move {
                let rl = common::client(urls, Duration::from_secs(10));
                let _ = rl.connect().await;
                let lock = rl.acquire("thread-exit").await.unwrap();
                rl.release(lock).await.unwrap();
                let stopped = Command::new("kill").args(["-STOP", &pid]).status().unwrap();
                assert!(stopped.success());
                tokio::spawn(async move {
                    let _ = rl.try_acquire("thread-exit-2").await;
                    std::future::pending::<()>().await;
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
            });
        });
    });
    worker.join().expect("the worker thread ended");
}

/// A runtime kept in a thread-local is dropped with the thread's locals, and with it a task
/// whose request to a hung node holds one of the connection's places. Giving that place back
/// read the outbox's own thread-local, which can be gone by then: "cannot access a Thread
/// Local Storage value during or after destruction", a panic in a destructor (found in
/// review; in another shape of the same teardown the process aborted). Run in a child process.
#[test]
fn a_runtime_dropped_with_its_thread_does_not_panic() {
    if let (Ok(urls), Ok(pid)) = (
        std::env::var("BATCH_ATTACKS_CHILD_URLS"),
        std::env::var("BATCH_ATTACKS_CHILD_PID"),
    ) {
        hung_request_at_thread_exit(urls.split(',').map(str::to_owned).collect(), pid);
        return;
    }
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let cluster = main.block_on(Cluster::start(3)).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_runtime_dropped_with_its_thread_does_not_panic",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BATCH_ATTACKS_CHILD_URLS", cluster.urls().join(","))
        .env(
            "BATCH_ATTACKS_CHILD_PID",
            cluster.node(0).pid().unwrap().to_string(),
        )
        .output()
        .unwrap();
    cluster.node(0).resume();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let panics: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("panicked") || l.contains("cannot access") || l.contains("abort"))
        .collect();
    println!("child: {:?}, {panics:?}", out.status);
    drop(cluster);
    assert!(
        out.status.success() && panics.is_empty(),
        "the child process did not end cleanly: {:?}, {panics:?}",
        out.status
    );
}

/// The same cycles while node 0 hangs before this client's first connection to it has opened:
/// every request to it waits for the connection, not in its outbox. A release withdraws such a
/// waiting request as it withdraws one in the outbox, and spares the node. Before, nothing
/// recorded the requests waiting for the connection, so every release went to node 0 too, and
/// ran there once it resumed and the connection opened: the 1,159 and 4,587 deletes counted in
/// CI by the test above, whose client's first connection to node 0 had not opened when node 0
/// was paused (its warm-up lock needs only a quorum).
#[tokio::test(flavor = "current_thread")]
async fn releases_are_not_queued_for_a_hung_node_whose_connection_never_opened() {
    const CYCLES: usize = 2_000;
    let (cluster, urls) = cluster_of_this_test().await;
    // A connect timeout that outlasts the cycles: the connection opened while node 0 hung is
    // still opening when it resumes, and then opens. A node timeout of 1 s: nodes 1 and 2
    // decide every cycle, and with 200 ms a busy machine once stalled this test's one thread
    // long enough that 64 releases in flight timed out on both (a fresh-clone CI run).
    let rl = Redlock::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(20))
        .build()
        .expect("valid config");
    cluster.node(0).pause();
    let started = Instant::now();
    let failed = cycles(&rl, CYCLES).await;
    let took = started.elapsed();
    cluster.node(0).resume();
    // The connection opens now; whatever waited for it is sent.
    let reports = rl.connect().await;
    assert!(
        matches!(reports[0].outcome, redlock::NodeOutcome::Confirmed),
        "node 0's connection opens once it resumes: {:?}",
        reports[0].outcome
    );
    let ran = settled_deletes(&cluster, 0).await;
    println!(
        "{CYCLES} cycles in {took:?} while node 0 hung before its connection opened, {} failed; \
         owner-checked deletes on node 0: {ran}",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "nodes 1 and 2 were healthy: {:?}",
        failed.first()
    );
    assert!(
        took < Duration::from_secs(15),
        "the cycles ended within the connect timeout"
    );
    assert!(
        ran < 200,
        "node 0 ran {ran} releases queued while its connection was opening, for {CYCLES} locks \
         whose grants never reached it"
    );
}

/// Three nodes that take a password, and their URLs with it: only the test's own client is
/// counted on them. A client of another test process whose node's port one of these took over
/// would reconnect to it and add its commands to the counts. (A CI run with the test binaries
/// side by side counted 2,474 deletes on node 0 where runs alone count 0–2.)
async fn cluster_of_this_test() -> (Cluster, Vec<String>) {
    const PASSWORD: &str = "only-this-test";
    let cluster = Cluster::builder()
        .nodes(3)
        .arg("requirepass", PASSWORD)
        .start()
        .await
        .unwrap();
    let urls = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://:{PASSWORD}@127.0.0.1:{}", n.port()))
        .collect();
    (cluster, urls)
}

/// `n` locks, each taken with `try_acquire` and released, 64 at a time; the errors.
async fn cycles(rl: &Redlock, n: usize) -> Vec<Error> {
    let names: Vec<String> = (0..n).map(|i| format!("cycle-{i}")).collect();
    let mut failed = Vec::new();
    for chunk in names.chunks(64) {
        let cycles = chunk.iter().map(|name| async {
            let lock = rl.try_acquire(name.as_str()).await?;
            rl.release(lock).await.map(drop)
        });
        failed.extend(join_all(cycles).await.into_iter().filter_map(Result::err));
    }
    failed
}

/// [`deletes_tried`] on node `i` once the node has worked through whatever waited for it:
/// when its count stops moving for 500 ms (at most 60 s).
async fn settled_deletes(cluster: &Cluster, i: usize) -> u64 {
    let mut ran = deletes_tried(cluster, i).await;
    let limit = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = deletes_tried(cluster, i).await;
        if now == ran || Instant::now() > limit {
            return now;
        }
        ran = now;
    }
}

/// The owner-checked deletes node `i` ran so far: `GET`s (the release scripts read each key
/// before deleting it) and the native deletes (`DELIFEQ`, `DELEX`), from `INFO commandstats`.
async fn deletes_tried(cluster: &Cluster, i: usize) -> u64 {
    let node = cluster.node(i);
    node.command_calls("get").await
        + node.command_calls("delifeq").await
        + node.command_calls("delex").await
}

/// Locks taken and released while node 0 hangs (SIGSTOP): nodes 1 and 2 grant and release
/// each one, and its grant on node 0 waits in node 0's outbox, unsent. A release is never
/// refused by the outbox (the grant it undoes may be waiting there), so before the fix every
/// release was queued for node 0 too, without bound: a review saw the client grow from 10 to
/// 110–204 MB over 160,000 such cycles, and node 0, once resumed, ran every queued release
/// before it could grant anything else. A release need not go where none of its lock's
/// requests was ever sent: it withdraws the waiting grant instead (never to be sent), and the
/// node is spared both.
#[tokio::test(flavor = "current_thread")]
async fn releases_are_not_queued_for_a_hung_node_their_grants_never_reached() {
    const CYCLES: usize = 20_000;
    let (cluster, urls) = cluster_of_this_test().await;
    let rl = warmed_at(urls).await;
    cluster.node(0).pause();
    let started = Instant::now();
    let failed = cycles(&rl, CYCLES).await;
    println!(
        "{CYCLES} cycles in {:?} while node 0 hung, {} failed",
        started.elapsed(),
        failed.len()
    );
    let before = deletes_tried(&cluster, 1).await;
    cluster.node(0).resume();
    let resumed = deletes_tried(&cluster, 0).await;
    let ran = settled_deletes(&cluster, 0).await;
    println!(
        "owner-checked deletes: node 1 {before}, node 0 {} after it resumed; script calls on \
         node 0: {}, script loads: {}",
        ran - resumed,
        cluster.node(0).command_calls("evalsha").await,
        cluster.node(0).command_calls("script|load").await
    );
    assert!(
        failed.is_empty(),
        "nodes 1 and 2 were healthy: {:?}",
        failed.first()
    );
    assert!(
        ran - resumed < 1_000,
        "node 0 ran {} releases queued while it hung, for {CYCLES} locks whose grants never \
         reached it",
        ran - resumed
    );
}
