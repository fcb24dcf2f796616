//! The quorum engine: fan a request out to every node in parallel, decide as soon as the
//! outcome is known, and keep folding in late answers so nothing leaks.
//!
//! The driver owns the per-node futures. The caller's task polls it while it waits for the
//! decision, so a phase whose nodes all answer by then (always with one node) costs no task;
//! whatever is still in flight when the phase is dropped — late answers after the decision, or
//! everything when the caller's future was dropped — is driven on by a spawned task. So
//! dropping the caller's future never drops a request that may already have reached a node.
//!
//! When an acquire attempt is abandoned (failure, exhausted validity, or the caller's future
//! dropped), every node that granted or whose outcome is unknown gets the cleanup request —
//! immediately for nodes that already answered, and on arrival for late answers.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::{self as future, BoxFuture, Either};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::{Backend, Op, Reply};
use crate::claim::Claim;
use crate::config::{Config, drift};
use crate::error::{Error, NodeError, NodeOutcome, NodeReport, Phase as PhaseName, Retries};
use crate::telemetry;

/// Which answers count towards the phase's goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Goal {
    /// Acquire and extend: a quorum of `Yes`.
    Quorum,
    /// Release: enough nodes *confirmed* not holding our key (deleted it or never had it) that
    /// the rest cannot form a quorum: N − quorum + 1.
    NoQuorumLeft,
}

/// The verdict rule, kept pure for the algorithm tests: success once `positive ≥ needed`,
/// failure once even every pending node answering positively could not reach `needed`.
pub(crate) fn verdict(positive: usize, pending: usize, needed: usize) -> Option<bool> {
    if positive >= needed {
        Some(true)
    } else if positive + pending < needed {
        Some(false)
    } else {
        None
    }
}

/// The quorum for `n` nodes: ⌊n/2⌋ + 1.
pub(crate) fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// How many confirmations `goal` needs out of `n` nodes.
pub(crate) fn needed(goal: Goal, n: usize) -> usize {
    match goal {
        Goal::Quorum => quorum(n),
        Goal::NoQuorumLeft => n - quorum(n) + 1,
    }
}

/// Validity left after a phase that took `elapsed`: TTL − elapsed − (TTL·drift_factor + 2 ms).
/// `None` when nothing positive is left.
pub(crate) fn validity(ttl: Duration, elapsed: Duration, drift_factor: f64) -> Option<Duration> {
    let left = ttl
        .checked_sub(drift(ttl, drift_factor))?
        .checked_sub(elapsed)?;
    (!left.is_zero()).then_some(left)
}

/// The error of a phase that missed its goal — one rule for acquire, extend and renewal. More
/// refusals than the nodes a quorum can spare mean another owner holds the key: `Busy` for an
/// acquire, `Lost` for an extension. Otherwise too many nodes failed or timed out.
/// A `Busy` carries the history of one attempt; the acquire loop replaces it with its own.
fn missed(
    phase: PhaseName,
    resources: &Arc<[String]>,
    positive: usize,
    refused: usize,
    nodes: Vec<NodeReport>,
    elapsed: Duration,
) -> Error {
    let n = nodes.len();
    let required = quorum(n);
    let resources = Arc::clone(resources);
    match phase {
        PhaseName::Acquire if refused > n - required => Error::Busy {
            resources,
            granted: positive,
            required,
            nodes,
            retries: Retries::single(elapsed),
        },
        PhaseName::Extend if refused > n - required => Error::NotHeld {
            resources,
            held: positive,
            required,
            nodes,
        },
        _ => Error::QuorumUnreachable {
            resources,
            phase,
            granted: positive,
            required,
            nodes,
            retries: (phase == PhaseName::Acquire).then(|| Retries::single(elapsed)),
        },
    }
}

/// The validity a phase that reached its quorum leaves, counted from the phase's start on the
/// given TTL — the TTL the nodes were actually sent — or `ValidityExhausted` when it is not
/// above `min_validity`. One rule for acquire, extend and renewal.
fn validity_left(
    phase: PhaseName,
    resources: &Arc<[String]>,
    ttl: Duration,
    elapsed: Duration,
    drift_factor: f64,
    min_validity: Duration,
) -> Result<Duration, Error> {
    validity(ttl, elapsed, drift_factor)
        .filter(|left| *left > min_validity)
        .ok_or_else(|| Error::ValidityExhausted {
            resources: Arc::clone(resources),
            phase,
            elapsed,
            ttl,
            drift: drift(ttl, drift_factor),
            min_validity,
            retries: (phase == PhaseName::Acquire).then(|| Retries::single(elapsed)),
        })
}

/// How a decided acquire or extend phase is judged — one rule for acquire, extend and renewal:
/// a missed goal becomes `Busy` / `Lost` / `QuorumUnreachable` (see [`missed`]); a reached one
/// leaves the validity of the TTL the nodes were sent, counted from the phase's start, or
/// `ValidityExhausted` when it is not above `min_validity`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Judge<'a> {
    phase: PhaseName,
    /// The lock's resources, named in its errors.
    resources: &'a Arc<[String]>,
    /// The TTL the nodes were sent.
    ttl: Duration,
    drift_factor: f64,
    min_validity: Duration,
}

impl<'a> Judge<'a> {
    /// The rule for `phase` of the lock of `resources` on `ttl`, under the client's drift
    /// factor and minimum validity.
    pub(crate) fn new(
        phase: PhaseName,
        resources: &'a Arc<[String]>,
        ttl: Duration,
        config: &Config,
    ) -> Self {
        Self {
            phase,
            resources,
            ttl,
            drift_factor: config.drift_factor,
            min_validity: config.min_validity,
        }
    }

    /// The same rule with the lock's own minimum validity instead of the client's.
    pub(crate) fn min_validity(mut self, min_validity: Duration) -> Self {
        self.min_validity = min_validity;
        self
    }

    /// The span from the phase's start for which the lock is valid, given that the phase was
    /// decided `elapsed` after its start; or the error. Counts contention, split votes and
    /// extensions.
    pub(crate) fn judge<B: Backend>(
        &self,
        d: &Decision,
        backend: &B,
        elapsed: Duration,
    ) -> Result<Duration, Error> {
        if self.phase == PhaseName::Extend {
            telemetry::extend_done(d.success);
        }
        if !d.success {
            let refused = d.count(|o| matches!(o, NodeOutcome::Refused));
            let err = missed(
                self.phase,
                self.resources,
                d.positive,
                refused,
                d.reports(backend),
                elapsed,
            );
            if self.phase == PhaseName::Acquire {
                if err.is_busy() {
                    telemetry::contention();
                }
                if d.positive > 0 {
                    telemetry::split_vote();
                }
            }
            return Err(err);
        }
        let left = validity_left(
            self.phase,
            self.resources,
            self.ttl,
            elapsed,
            self.drift_factor,
            self.min_validity,
        )?;
        Ok(elapsed + left)
    }
}

/// What the caller learns when the phase is decided.
#[derive(Debug)]
pub(crate) struct Decision {
    pub(crate) success: bool,
    /// Answers so far; nodes still in flight are `Pending`.
    pub(crate) outcomes: Vec<NodeOutcome>,
    /// Claims of the nodes that granted (stamped acquires only).
    pub(crate) claims: Vec<Option<Claim>>,
    /// Per node, how many subscribers heard a release's wake-up there (releases that deleted
    /// something, on nodes that say).
    pub(crate) heard: Vec<Option<u32>>,
    /// Nodes that counted towards the goal.
    pub(crate) positive: usize,
    pub(crate) needed: usize,
}

impl Decision {
    pub(crate) fn reports<B: Backend>(&self, backend: &B) -> Vec<NodeReport> {
        self.outcomes
            .iter()
            .enumerate()
            .map(|(i, outcome)| NodeReport {
                node: backend.name(i).clone(),
                outcome: outcome.clone(),
            })
            .collect()
    }

    pub(crate) fn count(&self, f: impl Fn(&NodeOutcome) -> bool) -> usize {
        self.outcomes.iter().filter(|o| f(o)).count()
    }
}

/// What a node's positive answer carried besides the yes: the claim of a stamped grant, and how
/// many subscribers heard a release's wake-up.
type Extras = (Option<Claim>, Option<u32>);

struct State {
    outcomes: Vec<NodeOutcome>,
    claims: Vec<Option<Claim>>,
    heard: Vec<Option<u32>>,
    positive: usize,
    pending: usize,
    needed: usize,
    goal: Goal,
    tx: Option<oneshot::Sender<Decision>>,
    abandoned: bool,
    cleaned: Vec<bool>,
}

impl State {
    /// Records node `i`'s answer; sends the decision the first time it is known. Returns whether
    /// the node now needs the cleanup request (attempt abandoned and the node may hold our key).
    fn settle(&mut self, i: usize, outcome: NodeOutcome, (claim, heard): Extras) -> bool {
        let counts = match self.goal {
            Goal::Quorum => matches!(outcome, NodeOutcome::Confirmed),
            Goal::NoQuorumLeft => matches!(outcome, NodeOutcome::Confirmed | NodeOutcome::Refused),
        };
        self.positive += usize::from(counts);
        self.pending -= 1;
        self.claims[i] = claim;
        self.heard[i] = heard;
        self.outcomes[i] = outcome;
        if self.tx.is_some()
            && let Some(success) = verdict(self.positive, self.pending, self.needed)
        {
            let decision = Decision {
                success,
                outcomes: self.outcomes.clone(),
                claims: self.claims.clone(),
                heard: self.heard.clone(),
                positive: self.positive,
                needed: self.needed,
            };
            if let Some(tx) = self.tx.take() {
                // A closed receiver means the caller's future was dropped; its guard has
                // then marked the phase abandoned, which the return value below handles.
                let _ = tx.send(decision);
            }
        }
        self.take_cleanup(i)
    }

    fn take_cleanup(&mut self, i: usize) -> bool {
        let due = self.abandoned
            && !self.cleaned[i]
            && !matches!(self.outcomes[i], NodeOutcome::Pending)
            && self.outcomes[i].may_hold();
        self.cleaned[i] |= due;
        due
    }
}

/// A running phase. For phases with a cleanup request (acquire), dropping this value without
/// calling [`Phase::keep`] abandons the attempt and releases every node that may hold it.
pub(crate) struct Phase<B: Backend> {
    backend: Arc<B>,
    state: Arc<Mutex<State>>,
    rx: oneshot::Receiver<Decision>,
    cleanup: Option<Arc<Op>>,
    name: PhaseName,
    /// The driver, until it finished or was handed to a task of its own (see [`Drop`]).
    driver: Option<BoxFuture<'static, ()>>,
}

impl<B: Backend> std::fmt::Debug for Phase<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phase").field("name", &self.name).finish()
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<B: Backend> Phase<B> {
    /// Sends `op` to every node. Must run inside a tokio runtime.
    pub(crate) fn start(
        backend: &Arc<B>,
        name: PhaseName,
        op: Arc<Op>,
        goal: Goal,
        cleanup: Option<Arc<Op>>,
    ) -> Self {
        let n = backend.len();
        let (tx, rx) = oneshot::channel();
        let state = Arc::new(Mutex::new(State {
            outcomes: vec![NodeOutcome::Pending; n],
            claims: vec![None; n],
            heard: vec![None; n],
            positive: 0,
            pending: n,
            needed: needed(goal, n),
            goal,
            tx: Some(tx),
            abandoned: false,
            cleaned: vec![false; n],
        }));
        // Hand the requests over here, in the caller's order; the driver only polls them.
        let now = Instant::now();
        let budgets: Vec<Duration> = (0..n).map(|i| backend.budget(i)).collect();
        let calls: FuturesUnordered<_> = (0..n)
            .map(|i| {
                let call = handed_over(backend.call(i, Arc::clone(&op)));
                Box::pin(async move { (i, call.await) }) as Tagged
            })
            .collect();
        let driver = drive(
            Arc::clone(backend),
            Arc::clone(&state),
            calls,
            now,
            budgets,
            cleanup.clone(),
            name,
        )
        .boxed();
        Self {
            backend: Arc::clone(backend),
            state,
            rx,
            cleanup,
            name,
            driver: Some(driver),
        }
    }

    /// Waits until the outcome is decided, driving the requests meanwhile.
    ///
    /// Cancel safety: dropping this future (and the phase) abandons an acquire attempt; the
    /// driver goes on in a task of its own and releases whatever was granted.
    pub(crate) async fn decided(&mut self) -> Decision {
        let received = match self.driver.as_mut() {
            Some(driver) => match future::select(&mut self.rx, driver).await {
                Either::Left((received, _)) => received.map_err(|_| ()),
                // The driver sends the decision before it finishes: it is in the channel now.
                // If it is not, it never will be; the state then speaks for itself below,
                // rather than this waiting forever.
                Either::Right(((), _)) => {
                    self.driver = None;
                    self.rx.try_recv().map_err(|_| ())
                }
            },
            None => (&mut self.rx).await.map_err(|_| ()),
        };
        match received {
            Ok(d) => d,
            // No decision (the driver panicked, or ended without one): the phase failed, with
            // what is known of each node, rather than hanging or panicking here.
            Err(_) => {
                let st = lock(&self.state);
                Decision {
                    success: false,
                    outcomes: st.outcomes.clone(),
                    claims: st.claims.clone(),
                    heard: st.heard.clone(),
                    positive: st.positive,
                    needed: st.needed,
                }
            }
        }
    }

    /// The attempt succeeded and the caller owns the result: late grants belong to the lock,
    /// and the lock's release reaches every node. The returned handle sees the claims of grants
    /// that arrive after the decision too.
    pub(crate) fn keep(mut self) -> Granted {
        self.cleanup = None;
        Granted(Arc::clone(&self.state))
    }

    /// Gives up the attempt now (consumes the phase; same as dropping it).
    pub(crate) fn abandon(self) {}
}

impl<B: Backend> Drop for Phase<B> {
    fn drop(&mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            let targets: Vec<usize> = {
                let mut st = lock(&self.state);
                st.abandoned = true;
                (0..st.outcomes.len())
                    .filter(|&i| st.take_cleanup(i))
                    .collect()
            };
            for i in targets {
                send_cleanup(&self.backend, i, Arc::clone(&cleanup), self.name);
            }
        }
        // Requests still in flight: their answers are folded in (late claims, cleanups of late
        // grants of an abandoned attempt, telemetry) by a task of their own.
        if let Some(driver) = self.driver.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(driver)),
                Err(_) => tracing::warn!(
                    phase = ?self.name,
                    "no runtime to follow the requests still in flight; a grant among them expires with its TTL"
                ),
            }
        }
    }
}

/// The claims of a kept acquire, including grants that arrived after the quorum decision.
#[derive(Clone)]
pub(crate) struct Granted(Arc<Mutex<State>>);

impl Granted {
    /// Every claim received so far, sorted by node name.
    pub(crate) fn claims(&self) -> Vec<Claim> {
        let mut claims: Vec<Claim> = lock(&self.0).claims.iter().flatten().cloned().collect();
        claims.sort_by(|a, b| a.node.cmp(&b.node));
        claims
    }
}

/// How long a request may still wait in the client to be written after the caller stopped
/// waiting for its answer. Dropping a request that has not been written yet cancels it, which
/// is harmless for an acquire but would lose a release: under load, requests can queue in the
/// client for longer than the node timeout. Bounded so a hung node cannot pin memory for long.
pub(crate) const DELIVERY_GRACE: Duration = Duration::from_secs(1);

/// Polls a fresh request once, here in the caller's task, so that it is handed to the node's
/// connection in program order: a release or cleanup issued after an acquire is queued behind
/// it on every node, whatever order the driver later polls in. (Leaving the first poll to the
/// driver let a later phase's request overtake an earlier one under load, and a release that
/// overtakes its acquire leaves the key behind.) Exempt from tokio's cooperative budget so the
/// poll cannot be refused for budget reasons.
pub(crate) fn handed_over<T: Send + 'static>(call: BoxFuture<'static, T>) -> BoxFuture<'static, T> {
    let mut call: BoxFuture<'static, T> = Box::pin(tokio::task::unconstrained(call));
    match call
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(answer) => Box::pin(std::future::ready(answer)),
        std::task::Poll::Pending => call,
    }
}

/// A request tagged with its node.
type Tagged = BoxFuture<'static, (usize, Result<Reply, NodeError>)>;

/// Sends the cleanup request to node `i` in the background; it may wait up to
/// [`DELIVERY_GRACE`] to be delivered.
/// Outside a runtime (e.g. while it shuts down) nothing can be sent; the key then expires
/// with its TTL.
fn send_cleanup<B: Backend>(backend: &Arc<B>, i: usize, op: Arc<Op>, phase: PhaseName) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(node = %backend.name(i), "no runtime to release an abandoned grant; it expires with its TTL");
        return;
    };
    let call = handed_over(backend.call(i, op));
    let node = backend.name(i).clone();
    rt.spawn(async move {
        let result = tokio::time::timeout(DELIVERY_GRACE, call).await;
        telemetry::cleanup(&node, phase, &result);
    });
}

/// Folds the answers into the state as they arrive. One timer per phase (not per node) marks
/// nodes whose budget ran out as timed out; their requests keep being driven for
/// [`DELIVERY_GRACE`] more, so that a request still queued in the client is written.
async fn drive<B: Backend>(
    backend: Arc<B>,
    state: Arc<Mutex<State>>,
    mut calls: FuturesUnordered<Tagged>,
    started: Instant,
    budgets: Vec<Duration>,
    cleanup: Option<Arc<Op>>,
    phase: PhaseName,
) {
    let deadlines: Vec<Instant> = budgets.iter().map(|b| started + *b).collect();
    let give_up = deadlines.iter().max().copied().unwrap_or_else(Instant::now) + DELIVERY_GRACE;
    let mut settled = vec![false; deadlines.len()];
    let next_deadline = |settled: &[bool]| {
        deadlines
            .iter()
            .zip(settled)
            .filter(|(_, done)| !**done)
            .map(|(d, _)| *d)
            .min()
            .unwrap_or(give_up)
    };
    let mut timer = Box::pin(tokio::time::sleep_until(next_deadline(&settled)));
    loop {
        let (i, outcome, extras) = match future::select(calls.next(), timer.as_mut()).await {
            Either::Left((None, _)) => break,
            Either::Left((Some((i, _)), _)) if settled[i] => continue, // a late answer
            Either::Left((Some((i, answer)), _)) => match answer {
                Ok(Reply::Yes { claim, heard }) => (i, NodeOutcome::Confirmed, (claim, heard)),
                Ok(Reply::No) => (i, NodeOutcome::Refused, Extras::default()),
                Err(e) => (i, NodeOutcome::Failed(e), Extras::default()),
            },
            Either::Right(((), _)) => {
                // Nodes past their deadline are recorded before the driver may stop, even when
                // it was not polled for longer than the grace (a stalled thread): a node left
                // unrecorded would keep the decision from ever being made.
                let now = Instant::now();
                for i in 0..settled.len() {
                    if !settled[i] && deadlines[i] <= now {
                        settled[i] = true;
                        record(
                            &backend,
                            &state,
                            &cleanup,
                            phase,
                            i,
                            NodeOutcome::TimedOut { after: budgets[i] },
                            Extras::default(),
                        );
                    }
                }
                if now >= give_up {
                    break;
                }
                timer.as_mut().reset(next_deadline(&settled));
                continue;
            }
        };
        settled[i] = true;
        record(&backend, &state, &cleanup, phase, i, outcome, extras);
        if settled.iter().all(|s| *s) {
            timer.as_mut().reset(give_up);
        }
    }
}

fn record<B: Backend>(
    backend: &Arc<B>,
    state: &Mutex<State>,
    cleanup: &Option<Arc<Op>>,
    phase: PhaseName,
    i: usize,
    outcome: NodeOutcome,
    extras: Extras,
) {
    telemetry::node_outcome(backend.name(i), phase, &outcome);
    let needs_cleanup = lock(state).settle(i, outcome, extras);
    if let (true, Some(op)) = (needs_cleanup, cleanup) {
        send_cleanup(backend, i, Arc::clone(op), phase);
    }
}

#[cfg(test)]
mod tests;
