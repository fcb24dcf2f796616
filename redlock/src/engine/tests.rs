//! Algorithm tests on scripted fake nodes with paused time: every combination of per-node
//! behaviour on 5 nodes × cancellation points, checked against the protocol's invariants.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::*;
use crate::backend::{Backend, Op, Reply};
use crate::config::{Config, RetryPolicy};
use crate::core::{Core, PASS_OVER_REFUSED, Try};
use crate::error::{Error, NodeError, NodeErrorKind};

const NODE_TIMEOUT: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// Answers yes after 1 ms.
    Grant,
    /// Another owner holds the key: answers no after 1 ms, writes nothing.
    Refuse,
    /// Applies the command, then the reply is lost to a connection error (unknown outcome).
    Fail,
    /// Applies and answers after 20 ms (inside the node timeout).
    Slow,
    /// Applies and answers after 80 ms (after the node timeout): a late grant.
    Late,
    /// Never answers and never applies anything (dead or partitioned).
    Hang,
    /// Applies and answers at once, on the request's first poll (no real node does; not in
    /// the matrix).
    AtOnce,
}

const ALL: [Behaviour; 6] = [
    Behaviour::Grant,
    Behaviour::Refuse,
    Behaviour::Fail,
    Behaviour::Slow,
    Behaviour::Late,
    Behaviour::Hang,
];

impl Behaviour {
    fn latency(self) -> Option<Duration> {
        match self {
            Self::AtOnce => Some(Duration::ZERO),
            Self::Grant | Self::Refuse | Self::Fail => Some(Duration::from_millis(1)),
            Self::Slow => Some(Duration::from_millis(20)),
            Self::Late => Some(Duration::from_millis(80)),
            Self::Hang => None,
        }
    }
}

#[derive(Default)]
struct NodeData {
    /// key -> token
    keys: HashMap<String, String>,
    /// Time at which the last queued command applies: commands on one connection apply in order.
    last_apply: Option<Instant>,
    acquires: usize,
    releases: usize,
    stamp: u64,
    /// The server identity this node puts in its claims.
    id: Arc<str>,
}

struct FakeBackend {
    names: Vec<Arc<str>>,
    behaviour: Vec<Behaviour>,
    data: Vec<Arc<Mutex<NodeData>>>,
    /// Per node: its budget (a node whose connection is being opened gets a longer one).
    budgets: Vec<Duration>,
}

impl FakeBackend {
    fn new(behaviour: &[Behaviour]) -> Self {
        Self {
            names: (0..behaviour.len())
                .map(|i| Arc::from(format!("fake{i}")))
                .collect(),
            behaviour: behaviour.to_vec(),
            budgets: vec![NODE_TIMEOUT; behaviour.len()],
            data: (0..behaviour.len())
                .map(|i| {
                    Arc::new(Mutex::new(NodeData {
                        id: Arc::from(format!("server{i}")),
                        ..NodeData::default()
                    }))
                })
                .collect(),
        }
    }

    /// Nodes on which some key holds `token`.
    fn holding(&self, token: &str) -> Vec<usize> {
        (0..self.data.len())
            .filter(|&i| {
                self.data[i]
                    .lock()
                    .unwrap()
                    .keys
                    .values()
                    .any(|t| t == token)
            })
            .collect()
    }
}

fn apply(d: &mut NodeData, op: &Op, refuse: bool) -> Reply {
    match op {
        Op::Acquire { keys, token, .. } => {
            d.acquires += 1;
            let free = keys
                .iter()
                .all(|k| d.keys.get(k).is_none_or(|t| t == token.expose()));
            if refuse || !free {
                return Reply::No;
            }
            for k in keys.iter() {
                d.keys.insert(k.clone(), token.expose().to_owned());
            }
            d.stamp += 1;
            Reply::Yes {
                claim: Some(crate::claim::Claim {
                    node: Arc::clone(&d.id),
                    stamp_us: d.stamp,
                }),
                heard: None,
                kept: false,
                at_us: None,
            }
        }
        Op::Extend { keys, token, .. } => {
            if keys
                .iter()
                .all(|k| d.keys.get(k).map(String::as_str) == Some(token.expose()))
            {
                Reply::Yes {
                    claim: None,
                    heard: None,
                    kept: false,
                    at_us: None,
                }
            } else {
                Reply::No
            }
        }
        Op::Release { keys, token, .. } => {
            d.releases += 1;
            let mut n = 0;
            for k in keys.iter() {
                if d.keys.get(k).map(String::as_str) == Some(token.expose()) {
                    d.keys.remove(k);
                    n += 1;
                }
            }
            if n > 0 {
                Reply::Yes {
                    claim: None,
                    heard: None,
                    kept: false,
                    at_us: None,
                }
            } else {
                Reply::No
            }
        }
    }
}

impl Backend for FakeBackend {
    fn len(&self) -> usize {
        self.names.len()
    }

    fn name(&self, i: usize) -> &Arc<str> {
        &self.names[i]
    }

    fn budget(&self, i: usize) -> Duration {
        self.budgets[i]
    }

    fn extend_many(
        &self,
        i: usize,
        batch: Arc<crate::backend::Batch>,
    ) -> BoxFuture<'static, Result<Vec<crate::backend::Renewed>, NodeError>> {
        let data = Arc::clone(&self.data[i]);
        async move {
            let d = data.lock().unwrap();
            Ok(batch
                .locks
                .iter()
                .map(|lock| {
                    let ours = lock
                        .keys
                        .iter()
                        .all(|k| d.keys.get(k).map(String::as_str) == Some(lock.token.expose()));
                    if ours {
                        crate::backend::Renewed::Extended
                    } else {
                        crate::backend::Renewed::Refused
                    }
                })
                .collect())
        }
        .boxed()
    }

    /// A node that refuses everything holds another owner's key for good.
    fn holder(
        &self,
        i: usize,
        key: Arc<str>,
    ) -> BoxFuture<'static, Result<Option<u64>, NodeError>> {
        let value = if self.behaviour[i] == Behaviour::Refuse {
            Some("another owner's token".to_owned())
        } else {
            self.data[i].lock().unwrap().keys.get(&*key).cloned()
        };
        futures_util::future::ready(Ok(value.map(|v| crate::backend::fingerprint(v.as_bytes()))))
            .boxed()
    }

    fn call(&self, i: usize, op: Arc<Op>) -> BoxFuture<'static, Result<Reply, NodeError>> {
        let behaviour = self.behaviour[i];
        let data = Arc::clone(&self.data[i]);
        let Some(latency) = behaviour.latency() else {
            return futures_util::future::pending().boxed();
        };
        if behaviour == Behaviour::AtOnce {
            let reply = apply(&mut data.lock().unwrap(), &op, false);
            return futures_util::future::ready(Ok(reply)).boxed();
        }
        // Fix the apply time now, in call order, like a pipelined connection does.
        let apply_at = {
            let mut d = data.lock().unwrap();
            let at = (Instant::now() + latency).max(d.last_apply.unwrap_or_else(Instant::now));
            d.last_apply = Some(at);
            at
        };
        // Once sent, a request runs on the node whether or not anyone still waits for it.
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            tokio::time::sleep_until(apply_at).await;
            let refuse = behaviour == Behaviour::Refuse;
            let _ = tx.send(apply(&mut data.lock().unwrap(), &op, refuse));
        });
        async move {
            let reply = rx.await.expect("fake node task");
            if behaviour == Behaviour::Fail {
                Err(NodeError::new(NodeErrorKind::Io, "connection reset"))
            } else {
                Ok(reply)
            }
        }
        .boxed()
    }
}

fn core(behaviour: &[Behaviour], ttl: Duration) -> Core<FakeBackend> {
    let config = Config {
        ttl,
        node_timeout: NODE_TIMEOUT,
        retry: RetryPolicy::once(),
        ..Config::default()
    };
    Core::new(config, FakeBackend::new(behaviour), None)
}

fn combos(n: usize) -> Vec<Vec<Behaviour>> {
    let mut out = vec![vec![]];
    for _ in 0..n {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                ALL.iter().map(move |b| {
                    let mut v = prefix.clone();
                    v.push(*b);
                    v
                })
            })
            .collect();
    }
    out
}

/// Lets every in-flight request, late answer and background cleanup finish.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// An acquire of key "k" with a fresh token.
fn fresh_acquire() -> Arc<Op> {
    Arc::new(Op::Acquire {
        stamped: false,
        keys: Arc::from(vec!["k".to_owned()]),
        token: crate::token::Token::random().unwrap(),
        ttl_ms: 10_000,
        rearm: false,
        checked: false,
        reach: None,
    })
}

/// The first node of a racing attempt on resource "r".
fn first(backend: &FakeBackend) -> Option<usize> {
    first_node(backend.names.iter().map(|n| rank_seed(n)), "r", |_| true)
}

/// One acquire attempt on nodes behaving as `behaviour`, cancelled at `cancel_at`, checked
/// against the protocol's invariants. `contended`: the attempt goes through one node first
/// (see `first_node`), as a contended lock's attempts do.
async fn check(
    behaviour: &[Behaviour],
    ttl: Duration,
    cancel_at: Option<Duration>,
    contended: bool,
) {
    let core = core(behaviour, ttl);
    let fast_yes = behaviour
        .iter()
        .filter(|b| matches!(b, Behaviour::Grant | Behaviour::Slow))
        .count();
    // A refusal of the first node stands for them all: the others are not asked.
    let first_refuses =
        contended && first(&core.backend).is_some_and(|f| behaviour[f] == Behaviour::Refuse);
    let start = Instant::now();
    let once = RetryPolicy::once();
    let fut = async {
        if contended {
            let (resources, keys) = core.keys(vec!["r".into()]).expect("valid resource");
            attempt(&core, &resources, &keys, true).await
        } else {
            core.acquire(vec!["r".into()], &once, None).await
        }
    };
    let result = match cancel_at {
        // `None`: the acquire future was dropped mid-flight.
        Some(at) => tokio::time::timeout(at, fut).await.ok(),
        None => Some(fut.await),
    };
    let elapsed = start.elapsed();
    let drift = drift(ttl, 0.01);
    let ctx = format!("{behaviour:?} ttl={ttl:?} cancel={cancel_at:?}");
    match result {
        Some(Ok(lock)) => {
            assert!(fast_yes >= 3, "success without a quorum of grants: {ctx}");
            assert!(elapsed < ttl - drift, "success with no validity: {ctx}");
            // On the paused clock alone: the lock's deadline also runs on the machine's boot
            // clock, which keeps going while a loaded machine stalls this thread between the
            // decision and this check (the 21 ms TTL's ~18 ms of validity ran out there).
            let left = lock
                .valid_until
                .mono()
                .saturating_duration_since(Instant::now());
            assert!(left > Duration::ZERO, "{ctx}");
            assert!(left <= ttl - drift - elapsed, "validity too long: {ctx}");
            assert!(lock.claims().len() >= 3, "{ctx}");
            let token = lock.token().expose().to_owned();
            let released = core.release(lock).await;
            let confirm = behaviour
                .iter()
                .filter(|b| !matches!(b, Behaviour::Fail | Behaviour::Hang | Behaviour::Late))
                .count();
            assert_eq!(released.is_ok(), confirm >= 3, "release verdict: {ctx}");
            settle().await;
            assert_eq!(
                core.backend.holding(&token),
                Vec::<usize>::new(),
                "leak after release: {ctx}"
            );
        }
        Some(Err(e)) => {
            match &e {
                Error::Busy { .. } | Error::QuorumUnreachable { .. } => {
                    assert!(e.nodes().len() == 5, "{ctx}");
                }
                Error::ValidityExhausted { .. } => assert!(fast_yes >= 3, "{ctx}"),
                other => panic!("unexpected error {other:?}: {ctx}"),
            }
            if fast_yes >= 3 && !first_refuses {
                assert!(
                    matches!(e, Error::ValidityExhausted { .. }),
                    "a quorum granted in time but acquire failed with {e}: {ctx}"
                );
            }
            settle().await;
            assert_no_keys(&core, &ctx);
        }
        None => {
            settle().await;
            assert_no_keys(&core, &ctx);
        }
    }
}

fn assert_no_keys(core: &Core<FakeBackend>, ctx: &str) {
    for (i, d) in core.backend.data.iter().enumerate() {
        let d = d.lock().unwrap();
        assert!(
            d.keys.is_empty(),
            "node {i} still holds {:?}: {ctx}",
            d.keys
        );
        if d.acquires > 0 && core.backend.behaviour[i] != Behaviour::Refuse {
            assert!(
                d.releases > 0,
                "node {i} got an acquire but no release: {ctx}"
            );
        }
    }
}

/// Every combination of 6 behaviours on 5 nodes, each with 5 cancellation points and a TTL
/// the slow answers exhaust.
async fn matrix(contended: bool) {
    let cancels = [
        None,
        Some(Duration::ZERO),
        Some(Duration::from_millis(5)),
        Some(Duration::from_millis(30)),
        Some(Duration::from_millis(60)),
    ];
    let mut runs = 0;
    for behaviour in combos(5) {
        for cancel in cancels {
            check(&behaviour, Duration::from_secs(1), cancel, contended).await;
            runs += 1;
        }
        // A TTL so short that a 20 ms answer exhausts the validity (21 ms − 2.21 ms drift).
        check(&behaviour, Duration::from_millis(21), None, contended).await;
        runs += 1;
    }
    assert_eq!(runs, 6usize.pow(5) * 6);
}

#[tokio::test(start_paused = true)]
async fn matrix_of_node_behaviours_and_cancellation_points() {
    matrix(false).await;
}

/// The same matrix for an attempt that races other clients' waiters, which asks one node
/// first (a separate test, so that the two run side by side).
#[tokio::test(start_paused = true)]
async fn matrix_of_node_behaviours_and_cancellation_points_for_a_racing_attempt() {
    matrix(true).await;
}

/// A contended attempt goes through one node first: refused there, it asks no other node;
/// granted there, it asks every node; with that node silent, it asks the others after a
/// quarter of the node timeout.
#[tokio::test(start_paused = true)]
async fn a_contended_attempt_asks_one_node_first() {
    use Behaviour::*;
    let first = self::first(&FakeBackend::new(&[Grant; 5])).expect("five nodes");
    let contend = |behaviour: Vec<Behaviour>| async move {
        let core = core(&behaviour, Duration::from_secs(1));
        let (resources, keys) = core.keys(vec!["r".into()]).expect("valid resource");
        let started = Instant::now();
        let result = attempt(&core, &resources, &keys, true).await;
        let elapsed = started.elapsed();
        settle().await;
        let asked: Vec<usize> = (0..5)
            .map(|i| core.backend.data[i].lock().unwrap().acquires)
            .collect();
        (result, elapsed, asked)
    };
    let with_first = |b: Behaviour| {
        let mut v = vec![Grant; 5];
        v[first] = b;
        v
    };

    let (result, _, asked) = contend(with_first(Refuse)).await;
    assert!(result.unwrap_err().is_busy());
    let mut only_first = vec![0; 5];
    only_first[first] = 1;
    assert_eq!(
        asked, only_first,
        "refused at the first node, no other is asked"
    );

    let (result, elapsed, asked) = contend(with_first(Grant)).await;
    assert!(result.is_ok());
    assert_eq!(asked, vec![1; 5]);
    // One round trip to the first node, then one to the rest (1 ms each here).
    assert!(elapsed >= Duration::from_millis(2), "{elapsed:?}");

    let (result, elapsed, asked) = contend(with_first(Hang)).await;
    assert!(result.is_ok(), "the other four grant");
    assert_eq!(asked.iter().sum::<usize>(), 4);
    assert!(elapsed >= NODE_TIMEOUT / 4, "{elapsed:?}");
    assert!(
        elapsed < NODE_TIMEOUT / 4 + Duration::from_millis(5),
        "{elapsed:?}"
    );

    // The first node fails: the others are asked at once.
    let (result, elapsed, asked) = contend(with_first(Fail)).await;
    assert!(result.is_ok(), "the other four grant");
    assert_eq!(asked, vec![1; 5]);
    assert!(elapsed < Duration::from_millis(5), "{elapsed:?}");

    // One node: nothing to split, its answer decides alone.
    assert_eq!(self::first(&FakeBackend::new(&[Grant; 1])), None);
}

#[test]
fn verdict_is_decided_exactly_when_the_count_allows() {
    for needed in 1..=4 {
        for positive in 0..=7 {
            for pending in 0..=7 {
                let v = verdict(positive, pending, needed);
                assert_eq!(v == Some(true), positive >= needed);
                assert_eq!(
                    v == Some(false),
                    positive < needed && positive + pending < needed
                );
            }
        }
    }
    assert_eq!(quorum(1), 1);
    assert_eq!(quorum(4), 3);
    assert_eq!(quorum(5), 3);
    assert_eq!(needed(Goal::NoQuorumLeft, 5), 3);
    assert_eq!(needed(Goal::NoQuorumLeft, 4), 2);
}

#[test]
fn validity_subtracts_elapsed_and_drift() {
    let ttl = Duration::from_secs(10);
    assert_eq!(
        validity(ttl, Duration::from_millis(98), 0.01),
        Some(Duration::from_millis(10_000 - 98 - 100 - 2))
    );
    assert_eq!(validity(ttl, Duration::from_millis(9_898), 0.01), None);
    assert_eq!(validity(ttl, Duration::from_secs(11), 0.01), None);
}

#[tokio::test(start_paused = true)]
async fn failed_extend_never_deletes_and_reports_lost() {
    use Behaviour::*;
    let core = core(
        &[Grant, Grant, Grant, Refuse, Refuse],
        Duration::from_secs(1),
    );
    let mut lock = core
        .acquire(vec!["r".into()], &RetryPolicy::once(), None)
        .await
        .unwrap();
    let before = lock.valid_until;
    // Another owner takes over two of the three nodes we hold.
    for i in 0..2 {
        core.backend.data[i]
            .lock()
            .unwrap()
            .keys
            .insert("redlock:lock:r".into(), "someone-else".into());
    }
    let err = core.extend(&mut lock).await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert_eq!(
        lock.valid_until, before,
        "a failed extend must not change the lock"
    );
    assert_eq!(core.backend.holding(lock.token().expose()), vec![2]);
}

#[tokio::test(start_paused = true)]
async fn retries_are_bounded_by_attempts_and_deadline() {
    use Behaviour::*;
    let core = core(
        &[Refuse, Refuse, Refuse, Grant, Grant],
        Duration::from_secs(1),
    );
    let policy = RetryPolicy::attempts(4).with_delay(Duration::from_millis(100), Duration::ZERO);
    let start = Instant::now();
    let err = core
        .acquire(vec!["r".into()], &policy, None)
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err}");
    assert_eq!(core.backend.data[0].lock().unwrap().acquires, 4);
    assert!(start.elapsed() >= Duration::from_millis(300));

    let core = self::core(&[Hang, Hang, Hang, Grant, Grant], Duration::from_secs(1));
    let policy = RetryPolicy::deadline(Duration::from_millis(500))
        .with_delay(Duration::from_millis(100), Duration::ZERO);
    let start = Instant::now();
    let err = core
        .acquire(vec!["r".into()], &policy, None)
        .await
        .unwrap_err();
    assert!(err.is_quorum_unreachable(), "{err}");
    assert!(start.elapsed() < Duration::from_millis(500) + NODE_TIMEOUT);
    assert!(core.backend.data[3].lock().unwrap().acquires >= 3);
}

/// A phase whose driver is first polled long after every deadline and the delivery grace (its
/// thread stalled) still records the silent nodes as timed out and decides; it used to stop
/// without recording them, and the decision never came.
#[tokio::test(start_paused = true)]
async fn a_phase_polled_after_a_stall_records_the_silent_nodes() {
    let backend = Arc::new(FakeBackend::new(&[
        Behaviour::Grant,
        Behaviour::Hang,
        Behaviour::Hang,
    ]));
    let op = fresh_acquire();
    let mut phase = Phase::start(&backend, PhaseName::Acquire, op, Goal::Quorum, None, None);
    tokio::time::advance(NODE_TIMEOUT + DELIVERY_GRACE + Duration::from_secs(1)).await;
    let d = tokio::time::timeout(Duration::from_secs(10), phase.decided())
        .await
        .expect("decided");
    assert!(!d.success);
    // Decided by the timeouts.
    assert!(
        d.count(|o| matches!(o, NodeOutcome::TimedOut { .. })) >= 1,
        "{:?}",
        d.outcomes
    );
}

/// Answers ready together are recorded in one pass of the driver, in node order, and the caller
/// takes the decision after the pass: it shows the answers recorded after the deciding one. They
/// read "still to answer" in it while the phase knew them, so a release's first node that
/// deleted nothing was neither counted at the decision nor followed after it (test `waiting::a_
/// local_waiter_does_not_wait_for_a_first_node_that_lost_the_key_and_answered_with_the_quorum`).
#[tokio::test(start_paused = true)]
async fn a_decision_shows_the_answers_recorded_in_the_pass_that_decided() {
    let backend = Arc::new(FakeBackend::new(&[Behaviour::AtOnce; 3]));
    backend.data[2]
        .lock()
        .unwrap()
        .keys
        .insert("k".to_owned(), "another owner's token".to_owned());
    let op = fresh_acquire();
    let mut phase = Phase::start(&backend, PhaseName::Acquire, op, Goal::Quorum, None, None);
    let d = phase.decided().await;
    assert!(d.success);
    assert_eq!(
        d.outcomes,
        vec![
            NodeOutcome::Confirmed,
            NodeOutcome::Confirmed,
            NodeOutcome::Refused
        ]
    );
    assert_eq!(d.positive, 2);
    // The claims stay the deciding quorum's (`Lock::claims`).
    assert_eq!(d.claims.len(), 2);
}

/// The first node's connection is being opened, so its budget is longer than the others'
/// (node timeout + connect allowance): the others are still asked in time, and each keeps its
/// whole budget from when it was asked. (A client does not pick such a node first; the engine
/// must cope when it becomes one after the pick.)
#[tokio::test(start_paused = true)]
async fn a_first_node_with_a_longer_budget_does_not_time_the_others_out() {
    use Behaviour::*;
    let mut backend = FakeBackend::new(&[Grant; 5]);
    let f = first(&backend).expect("five nodes");
    backend.behaviour[f] = Hang;
    backend.budgets[f] = NODE_TIMEOUT * 5;
    let backend = Arc::new(backend);
    let op = fresh_acquire();
    let first = First {
        node: f,
        missed: Box::new(|| {}),
    };
    let mut phase = Phase::start(
        &backend,
        PhaseName::Acquire,
        op,
        Goal::Quorum,
        None,
        Some(first),
    );
    let d = phase.decided().await;
    assert!(d.success, "four nodes grant: {:?}", d.outcomes);

    // Nor does the client pick it: its request would wait for the connection.
    let config = Config {
        ttl: Duration::from_secs(1),
        node_timeout: NODE_TIMEOUT,
        retry: RetryPolicy::once(),
        ..Config::default()
    };
    let mut backend = FakeBackend::new(&[Grant; 5]);
    backend.budgets[f] = NODE_TIMEOUT * 5;
    let core = Core::new(config, backend, None);
    let picked = core.first_node_index("r").expect("four open nodes");
    assert_ne!(picked, f);
}

/// A first node that refuses while a quorum of the others grants, and keeps the key it refused
/// with, holds a key nobody else does (a release or cleanup missed it): racing through it would
/// refuse every racer until the key expires. A client that sees this passes the node over.
#[tokio::test(start_paused = true)]
async fn a_first_node_refusing_against_a_quorum_is_passed_over() {
    // An attempt that does not race asks every node, and wins four.
    let (core, _) = refused_by_first_node().await;
    let (resources, keys) = core.keys(vec!["r".into()]).expect("valid resource");
    // A racing attempt now goes through another node.
    let result = attempt(&core, &resources, &keys, true).await;
    assert!(
        result.is_ok(),
        "racing through the refusing node: {result:?}"
    );
}

/// A first node that refused against a quorum because another client's racer held it for a
/// moment looks the same as one holding a stale key. Passing it over is this client's own
/// view, and clients that disagree on the first node split votes again; with a 10 s span one
/// such lookalike kept the client on another first node for 10 s, and the hot-key bench saw
/// thousands of split votes in 10 s in some runs. The span for a refusal is short: the node is
/// the first node again 1.1 s later.
#[tokio::test(start_paused = true)]
async fn a_first_node_passed_over_for_a_refusal_is_back_soon() {
    let (core, first) = refused_by_first_node().await;
    assert_ne!(core.first_node_index("r"), Some(first), "passed over");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(
        core.first_node_index("r"),
        Some(first),
        "still passed over 1.1 s after the refusal (span {PASS_OVER_REFUSED:?})"
    );
}

/// A first node that refused against a quorum because another client's racer held it for a
/// moment: the racer's key is gone when the node is read again, and the node stays the first.
#[tokio::test(start_paused = true)]
async fn a_first_node_refusing_for_a_moment_is_not_passed_over() {
    let backend = FakeBackend::new(&[Behaviour::Grant; 5]);
    let first = first(&backend).expect("five nodes");
    let core = one_shot(backend);
    let (resources, keys) = core.keys(vec!["r".into()]).expect("valid resource");
    let racer = || core.backend.data[first].lock().unwrap();
    racer()
        .keys
        .insert(keys[0].clone(), "a racer's token".into());
    let lock = attempt(&core, &resources, &keys, false)
        .await
        .expect("four nodes grant");
    racer().keys.remove(&keys[0]);
    core.release(lock).await.expect("released");
    tokio::time::sleep(NODE_TIMEOUT * 2 + Duration::from_millis(1)).await;
    assert_eq!(core.first_node_index("r"), Some(first), "passed over");
}

/// One attempt of `core` on `resources` with a fresh token.
async fn attempt(
    core: &Core<FakeBackend>,
    resources: &Arc<[String]>,
    keys: &Arc<[String]>,
    racing: bool,
) -> Result<crate::lock::Lock, Error> {
    let token = crate::token::Token::random().expect("entropy");
    let how = Try {
        token,
        rearm: false,
        racing,
    };
    core.attempt(resources, keys, how, core.terms(), &mut Vec::new())
        .await
}

/// A client of `backend` with a 1 s TTL that makes one attempt per acquire.
fn one_shot(backend: FakeBackend) -> Core<FakeBackend> {
    let config = Config {
        ttl: Duration::from_secs(1),
        node_timeout: NODE_TIMEOUT,
        retry: RetryPolicy::once(),
        ..Config::default()
    };
    Core::new(config, backend, None)
}

/// A client whose lock on "r" (taken by an attempt that asks every node at once, and released)
/// was granted by four of five nodes and refused by the first node; and that node.
async fn refused_by_first_node() -> (Core<FakeBackend>, usize) {
    use Behaviour::*;
    let mut backend = FakeBackend::new(&[Grant; 5]);
    let first = first(&backend).expect("five nodes");
    backend.behaviour[first] = Refuse;
    let core = one_shot(backend);
    let (resources, keys) = core.keys(vec!["r".into()]).expect("valid resource");
    let lock = attempt(&core, &resources, &keys, false)
        .await
        .expect("four nodes grant");
    core.release(lock).await.expect("released");
    // The node is passed over once its key was read twice, two node timeouts apart.
    assert_eq!(core.first_node_index("r"), Some(first), "not checked yet");
    tokio::time::sleep(NODE_TIMEOUT * 2 + Duration::from_millis(1)).await;
    (core, first)
}

/// The gated nodes are asked in the driver's pass that opens the gate, whatever their index:
/// with nodes that answer at once, those after the first node in index order could otherwise
/// reach the quorum in that pass while those before it were not asked yet, and the release
/// that follows would reach those before the acquire did, leaving the key there.
#[tokio::test(start_paused = true)]
async fn gated_nodes_are_asked_in_the_pass_that_opens_the_gate() {
    use Behaviour::*;
    let probe = FakeBackend::new(&[Grant; 5]);
    let resource = (0..1000)
        .map(|k| format!("r{k}"))
        .find(|r| first_node(probe.names.iter().map(|n| rank_seed(n)), r, |_| true) == Some(1))
        .expect("a resource whose first node is node 1");
    let core = core(
        &[Grant, Grant, AtOnce, AtOnce, AtOnce],
        Duration::from_secs(1),
    );
    let (resources, keys) = core.keys(vec![resource]).expect("valid resource");
    let lock = attempt(&core, &resources, &keys, true)
        .await
        .expect("acquired");
    let token = lock.token().expose().to_owned();
    core.release(lock).await.expect("released");
    settle().await;
    assert_eq!(core.backend.holding(&token), Vec::<usize>::new());
}
