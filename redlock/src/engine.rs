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

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use tokio::task::coop::Unconstrained;
use tokio::time::{Instant, Sleep};

use crate::backend::{Backend, Op, Reach, Reply};
use crate::background::Background;
use crate::claim::Claim;
use crate::config::{Config, drift};
use crate::error::{
    Error, NodeError, NodeErrorKind, NodeOutcome, NodeReport, Phase as PhaseName, Retries,
};
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
    /// The claims of the nodes that granted so far (stamped acquires only), in node order.
    pub(crate) claims: Vec<Claim>,
    /// Per node, how many subscribers heard a release's wake-up there (releases that deleted
    /// something, on nodes that say); empty when no node said.
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

/// What a node's answer carries besides its outcome: a grant's claim, how many subscribers
/// heard a release's wake-up, whether an acquire grant kept a key, and the node's clock at the
/// grant when asked for (`Reply::Yes`).
type Extras = (Option<Claim>, Option<u32>, bool, Option<u64>);

/// What the phase knows of one node.
#[derive(Debug)]
struct Slot {
    outcome: NodeOutcome,
    claim: Option<Claim>,
    heard: Option<u32>,
    /// The grant re-armed a key that held the token already, rather than created it.
    kept: bool,
    /// For an attempt with the caller's token, the last moment on the node's clock (µs) at
    /// which the cleanup of its grant there may still delete (see [`cleanup_deadline`]).
    before_us: Option<u64>,
    /// For an attempt with the caller's token, the node's clock read before its grant (or a
    /// put-back's): the release of the lock bounds its delete by it (see
    /// [`Granted::release_request`]).
    clock: Option<Clock>,
    /// Its request answered (not only timed out): for a release whose deletes are waited for
    /// (`State::deletes`), the delete is done on the node.
    answered: bool,
    /// Renewals' put-backs of the lock's keys handed to the node and not answered yet, since
    /// when (the earliest) and until when they may answer (the latest).
    repairing: u32,
    repair_since: Option<Instant>,
    repair_until: Option<Instant>,
    /// A put-back may have written the lock's keys on the node without its clock being read.
    put_back: bool,
    /// The cleanup request was sent to it.
    cleaned: bool,
    /// Its cleanup was sent and has neither answered nor run out of time.
    cleaning: bool,
    /// Its answer was read by the last node deadline (see [`State::take_cleanup`]).
    read_in_time: bool,
}

/// A phase's answers, shared by its driver, its caller and (after [`Phase::keep`]) the lock.
struct State {
    slots: Vec<Slot>,
    positive: usize,
    pending: usize,
    needed: usize,
    goal: Goal,
    /// The verdict was reached (at most once per phase).
    decided: bool,
    /// The decision, from the moment it is reached until the caller takes it.
    decision: Option<Decision>,
    abandoned: bool,
    /// The attempt succeeded and its caller took the lock ([`Phase::keep`]): no cleanup.
    kept: bool,
    /// Notified after each node's outcome is recorded (and its cleanup handed over), once
    /// somebody waits for one (see [`Unanswered`]).
    recorded: Option<Arc<Notify>>,
    /// When the phase was created, before any of its requests was sent.
    started: Instant,
    /// A release whose deletes may still land on a node whose answer is out, until
    /// `settles_by`, after the driver is gone too (see [`Granted::release_request`]).
    deletes: bool,
    /// The last node deadline: an attempt with the caller's token sends no cleanup after it
    /// (see `take_cleanup`).
    last_deadline: Instant,
    /// By when everything the phase sent has answered or been given up on, and the next
    /// attempt with its token goes ahead whatever is still out (see
    /// [`Unanswered::settles_by`]): a cleanup's [`DELIVERY_GRACE`] after the last node
    /// deadline, and one longest node budget more, by which a cleanup of a grant that came
    /// near the end of a long budget still reaches its node before its deadline there (see
    /// [`cleanup_deadline`]).
    settles_by: Instant,
    /// The driver is gone (finished, or dropped with its runtime): an answer still out will
    /// not be read, and leads to no cleanup.
    unfollowed: bool,
    /// An acquire with the caller's token (`try_acquire_with_token`). Keys holding that token
    /// may be a lock the caller, or whoever handed it the token, still holds, and the cleanup's
    /// owner-checked delete cannot tell them from this attempt's: it goes only to nodes that
    /// answered within their budget that they created every key — not to those that kept one,
    /// nor to those that did not answer in time (an answer after that is not read: its cleanup
    /// would go behind what the caller sent since, and deleted the keys a retry with the same
    /// token had just kept, test `api_attacks::a_late_grant_cleanup_does_not_delete_the_
    /// retried_lock`). Deleting by the token everywhere, a failed re-claim of a held lock
    /// deleted it while its `Lock` said it was valid, and a rival took it (test `api_attacks::
    /// a_failed_reclaim_with_the_token_does_not_delete_the_held_lock`). An answer within the
    /// budget that comes after the attempt ended is cleaned up when it comes; the next attempt
    /// with the same token waits for it (see `reclaim`).
    own_token: bool,
    /// Whether the attempt's requests left the client for each node (an acquire with a fresh
    /// token; see [`Reach`]): its cleanup, and the release of the lock it became, spare a node
    /// none of them reached.
    reach: Option<Reach>,
    /// Nodes a renewal or an extension found the lock's keys on, or a put-back was sent to,
    /// after the acquire: one bit per node, for the 64 first (see [`Granted::may_have_held`]).
    held_on: u64,
}

/// Node `i`'s bit in a mask of nodes; `None` past the 64th.
pub(crate) fn node_bit(i: usize) -> Option<u64> {
    u32::try_from(i).ok().and_then(|i| 1u64.checked_shl(i))
}

impl State {
    fn new(goal: Goal, n: usize, own_token: bool, reach: Option<Reach>) -> Self {
        Self {
            slots: (0..n)
                .map(|_| Slot {
                    outcome: NodeOutcome::Pending,
                    claim: None,
                    heard: None,
                    kept: false,
                    before_us: None,
                    clock: None,
                    answered: false,
                    repairing: 0,
                    repair_since: None,
                    repair_until: None,
                    put_back: false,
                    cleaned: false,
                    cleaning: false,
                    read_in_time: false,
                })
                .collect(),
            positive: 0,
            pending: n,
            needed: needed(goal, n),
            goal,
            decided: false,
            decision: None,
            abandoned: false,
            kept: false,
            recorded: None,
            started: Instant::now(),
            deletes: false,
            last_deadline: Instant::now(),
            settles_by: Instant::now(),
            unfollowed: false,
            own_token,
            reach,
            held_on: 0,
        }
    }

    /// Records node `i`'s answer; keeps the decision the first time it is known. Returns whether
    /// the node now needs the cleanup request (attempt abandoned and the node may hold our key).
    fn settle(
        &mut self,
        i: usize,
        outcome: NodeOutcome,
        (claim, heard, kept, at_us): Extras,
    ) -> bool {
        let counts = match self.goal {
            Goal::Quorum => matches!(outcome, NodeOutcome::Confirmed),
            Goal::NoQuorumLeft => matches!(outcome, NodeOutcome::Confirmed | NodeOutcome::Refused),
        };
        self.positive += usize::from(counts);
        self.pending -= 1;
        let slot = &mut self.slots[i];
        slot.answered |= outcome.answered();
        slot.claim = claim;
        slot.heard = heard;
        slot.kept = kept;
        let read = Instant::now();
        let clock = self.own_clock(at_us, read);
        let slot = &mut self.slots[i];
        slot.clock = clock;
        slot.read_in_time = read <= self.last_deadline;
        slot.before_us = clock.map(|c| cleanup_deadline(c.at, self.settles_by, read));
        slot.outcome = outcome;
        if !self.decided
            && let Some(success) = verdict(self.positive, self.pending, self.needed)
        {
            self.decided = true;
            self.decision = Some(self.snapshot(success));
        } else if let Some(decided) = self.decision.take() {
            // Decided, and the caller has not taken the decision yet: it shows every answer
            // recorded until then. A pass of the driver records every answer that is ready,
            // and the caller takes the decision after the pass: answers recorded in the pass
            // after the deciding one read "still to answer" in it, while the phase knew them,
            // and were neither counted at the decision nor followed after it. A release's first
            // node that deleted nothing was missed so (a local waiter waited out its node
            // timeout: test `waiting::a_local_waiter_does_not_wait_for_a_first_node_that_lost_
            // the_key_and_answered_with_the_quorum`). An answer cannot change the verdict. The
            // claims stay the deciding quorum's (`Lock::claims`; later grants' claims reach
            // the lock's fencing token through its grants).
            self.decision = Some(Decision {
                claims: decided.claims,
                ..self.snapshot(decided.success)
            });
        }
        self.take_cleanup(i)
    }

    /// For an attempt with the caller's token, the node's clock `at_us` its answer (read at
    /// `read`) carried.
    fn own_clock(&self, at_us: Option<u64>, read: Instant) -> Option<Clock> {
        at_us.filter(|_| self.own_token).map(|at| Clock {
            at,
            sent: self.started,
            read,
        })
    }

    /// The decision as of now.
    fn snapshot(&self, success: bool) -> Decision {
        let heard = if self.slots.iter().any(|s| s.heard.is_some()) {
            self.slots.iter().map(|s| s.heard).collect()
        } else {
            Vec::new()
        };
        Decision {
            success,
            outcomes: self.slots.iter().map(|s| s.outcome.clone()).collect(),
            claims: self.slots.iter().filter_map(|s| s.claim.clone()).collect(),
            heard,
            positive: self.positive,
            needed: self.needed,
        }
    }

    /// Whether node `i`'s answer is still out.
    fn unanswered(&self, i: usize) -> bool {
        self.slots
            .get(i)
            .is_some_and(|s| s.outcome == NodeOutcome::Pending)
    }

    fn take_cleanup(&mut self, i: usize) -> bool {
        let abandoned = self.abandoned;
        let slot = &mut self.slots[i];
        let may_hold = if self.own_token {
            // Only for a grant whose answer was read by the last node deadline (the caller's
            // future may not be polled for a while), and not after `settles_by`: until then its
            // deletes are waited for by the next attempt with the token (`reclaim`), not after.
            // A cleanup of answers read only after a stall deleted the keys such an attempt had
            // kept, and a rival took the lock (test `reclaim_attacks::a_reclaim_polled_again_
            // after_its_deadlines_deletes_nothing`). Cut off at the last deadline itself, it
            // skipped every attempt whose failure was decided by a node's timeout — recorded at
            // that deadline — and the grants answered in time stayed for the TTL (test
            // `reclaim_attacks::a_failed_reclaim_decided_by_a_timeout_cleans_up_the_node_that_
            // granted`, found in review).
            slot.outcome == NodeOutcome::Confirmed
                && !slot.kept
                && slot.read_in_time
                && Instant::now() <= self.settles_by
        } else {
            !matches!(slot.outcome, NodeOutcome::Pending) && slot.outcome.may_hold()
        };
        let due = abandoned && !slot.cleaned && may_hold;
        slot.cleaned |= due;
        slot.cleaning |= due;
        due
    }

    /// Whether node `i`'s answer is still out, or the cleanup it leads to is still on its way
    /// or may still come: a grant it created, while the attempt is neither given up (which
    /// sends the cleanup) nor kept by its caller.
    fn unsettled(&self, i: usize) -> bool {
        if self.deletes {
            // A delete that has not answered may still land, until `settles_by`.
            return self.slots.get(i).is_some_and(|s| !s.answered);
        }
        // An acquire's grants, until it is given up or kept; a release has none.
        let open = self.goal == Goal::Quorum && !self.abandoned && !self.kept;
        (self.unanswered(i) && !self.unfollowed)
            || self.slots.get(i).is_some_and(|s| {
                s.cleaning
                    || (open && s.outcome == NodeOutcome::Confirmed && (!self.own_token || !s.kept))
            })
    }

    /// Whether some node is [`unsettled`](Self::unsettled).
    fn any_unsettled(&self) -> bool {
        (0..self.slots.len()).any(|i| self.unsettled(i))
    }
}

/// Changes the phase's state with `change`, then tells whoever waits for a change of it (see
/// [`Unanswered`]).
fn changed(state: &Mutex<State>, change: impl FnOnce(&mut State)) {
    let recorded = {
        let mut st = lock(state);
        change(&mut st);
        st.recorded.clone()
    };
    if let Some(recorded) = recorded {
        recorded.notify_waiters();
    }
}

/// A running phase. For phases with a cleanup request (acquire), dropping this value without
/// calling [`Phase::keep`] abandons the attempt and releases every node that may hold it.
pub(crate) struct Phase<B: Backend> {
    backend: Arc<B>,
    state: Arc<Mutex<State>>,
    cleanup: Option<Arc<Op>>,
    name: PhaseName,
    /// The driver, until it finished or was handed to a task of its own (see [`Drop`]).
    driver: Option<Driver<B>>,
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
    ///
    /// With `first`, `op` goes to that node first and to the others only once it did not
    /// refuse (see [`first_node`]); after its refusal the others count as refusing unasked.
    pub(crate) fn start(
        backend: &Arc<B>,
        name: PhaseName,
        op: Arc<Op>,
        goal: Goal,
        cleanup: Option<Arc<Op>>,
        first: Option<First>,
    ) -> Self {
        Self::launch(backend, name, op, goal, cleanup, first, Deletes::default())
    }

    /// A release phase: `op` to every node but those `spared` (a node none of the lock's
    /// requests reached, see [`Reach`]), which count as having had nothing to delete.
    ///
    /// The release of a lock taken with the caller's token (`own_token`) bounds each delete by a
    /// deadline on its node's clock and counts as unsettled until every delete answered or
    /// surely passed its deadline (see [`Granted::release_request`]); the next attempt with
    /// the token waits for it (see `reclaim`). With `waited`, the next attempt with the token
    /// waits for the deletes until they answered or the phase settles, bounded or not (a lock
    /// whose token was handed to the caller: no node clock bounds its deletes).
    pub(crate) fn release(
        backend: &Arc<B>,
        op: Arc<Op>,
        spared: &[bool],
        own_token: Option<&Granted>,
        drift_factor: f64,
        waited: bool,
    ) -> Self {
        Self::launch(
            backend,
            PhaseName::Release,
            op,
            Goal::NoQuorumLeft,
            None,
            None,
            Deletes {
                spared,
                bounded: own_token.map(|g| (g, drift_factor)),
                waited,
            },
        )
    }

    fn launch(
        backend: &Arc<B>,
        name: PhaseName,
        op: Arc<Op>,
        goal: Goal,
        cleanup: Option<Arc<Op>>,
        first: Option<First>,
        Deletes {
            spared,
            bounded,
            waited,
        }: Deletes<'_>,
    ) -> Self {
        let n = backend.len();
        let (own_token, reach) = match &*op {
            Op::Acquire { rearm, reach, .. } => (*rearm, reach.clone()),
            _ => (false, None),
        };
        let state = Arc::new(Mutex::new(State::new(goal, n, own_token, reach)));
        // Hand the requests over here, in the caller's order; the driver only polls them.
        let now = Instant::now();
        let mut first = first.filter(|f| f.node < n);
        let first_node = first.as_ref().map(|f| f.node);
        // The first node's answer is awaited at most a quarter of the shortest budget (not of
        // its own, which a connection being opened lengthens), and every other node keeps its
        // whole budget from the latest moment it may be asked.
        let patience = match first_node {
            Some(_) => patience(&**backend),
            None => Duration::ZERO,
        };
        let (mut open, opened) = match first_node {
            Some(_) => {
                let (open, opened) = tokio::sync::watch::channel(Gate::Waiting);
                (Some(open), Some(opened))
            }
            None => (None, None),
        };
        // A release's deletes bounded on the nodes' clocks: each may land until the phase
        // settles (its last deadline, the grace, one longest budget more), and every node's
        // clock has surely passed its deadline by `passed`. A delete that waits for the
        // acquire's (or a put-back's) answer first is kept going until that answer may come,
        // and may land one longest budget later: the release's driver stopped at its own grace
        // and dropped it before a grant read later (its node's connection being opened), and
        // the key stayed for the TTL (found in review).
        let mut pending_until = None;
        let bounded = bounded.map(|(g, drift_factor)| {
            let longest = (0..n).map(|i| backend.budget(i)).max().unwrap_or_default();
            pending_until = g.pending_until();
            let own = now + longest + DELIVERY_GRACE + longest;
            let settles_by = pending_until.map_or(own, |p| own.max(p + longest));
            (g, drift_factor, settles_by)
        });
        let mut passed = now;
        let mut calls = Vec::with_capacity(n);
        for i in 0..n {
            let budget = backend.budget(i);
            let (request, deadline) = match (first.take_if(|f| f.node == i), &opened) {
                (Some(f), _) => {
                    let call = backend.call(i, Arc::clone(&op));
                    // One gate for the one first node.
                    let request = match open.take() {
                        Some(open) => {
                            first_call(call, open, now + patience, now + budget, f.missed)
                        }
                        None => call,
                    };
                    (request, now + budget)
                }
                (None, Some(opened)) => {
                    let weak = Arc::downgrade(&state);
                    let request = gated(
                        Arc::clone(backend),
                        i,
                        Arc::clone(&op),
                        opened.clone(),
                        weak,
                    );
                    (request, now + patience + budget)
                }
                (None, None) if spared.get(i) == Some(&true) => {
                    let nothing: BoxFuture<'static, _> =
                        Box::pin(std::future::ready(Ok(Reply::No)));
                    (nothing, now + budget)
                }
                (None, None) => match &bounded {
                    Some((g, drift_factor, settles_by)) => {
                        let (request, by) =
                            g.release_request(backend, i, &op, *settles_by, *drift_factor);
                        passed = passed.max(by);
                        (request, now + budget)
                    }
                    None => (backend.call(i, Arc::clone(&op)), now + budget),
                },
            };
            calls.push(Call {
                request: Some(handed_over(request)),
                deadline,
                budget,
                settled: false,
            });
        }
        let last_deadline = calls.iter().map(|c| c.deadline).max().unwrap_or(now);
        let give_up = (last_deadline + DELIVERY_GRACE).max(pending_until.unwrap_or(now));
        {
            let mut st = lock(&state);
            st.last_deadline = last_deadline;
            st.settles_by = last_deadline + DELIVERY_GRACE + (last_deadline - now);
            if waited || bounded.is_some() {
                st.deletes = true;
                st.settles_by = st.settles_by.max(passed);
            }
        }
        let earliest = calls.iter().map(|c| c.deadline).min().unwrap_or(give_up);
        let driver = Driver {
            backend: Arc::clone(backend),
            state: Arc::clone(&state),
            calls,
            first_node,
            timer: Box::pin(tokio::time::sleep_until(earliest)),
            give_up,
            cleanup: cleanup.clone(),
            phase: name,
            follows_late: waited || bounded.is_some() || own_token,
        };
        Self {
            backend: Arc::clone(backend),
            state,
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
        std::future::poll_fn(|cx| {
            if let Some(driver) = self.driver.as_mut()
                && Pin::new(driver).poll(cx).is_ready()
            {
                self.driver = None;
            }
            let mut st = lock(&self.state);
            if let Some(d) = st.decision.take() {
                return Poll::Ready(d);
            }
            // The driver keeps the decision before it finishes: one that finished without
            // (it panicked) never will. The phase failed then, with what is known of each
            // node, rather than hanging or panicking here.
            if self.driver.is_none() {
                return Poll::Ready(st.snapshot(false));
            }
            Poll::Pending
        })
        .await
    }

    /// The attempt succeeded and the caller owns the result: late grants belong to the lock,
    /// and the lock's release reaches every node. The returned handle sees the claims of grants
    /// that arrive after the decision too.
    pub(crate) fn keep(mut self) -> Granted {
        self.cleanup = None;
        // Its grants are settled now (see `State::unsettled`).
        changed(&self.state, |st| st.kept = true);
        Granted(Arc::clone(&self.state))
    }

    /// Gives up the attempt now (consumes the phase; same as dropping it).
    pub(crate) fn abandon(self) {}

    /// The nodes whose answer is still out, to be watched after the phase is given up on
    /// (`None` when every node answered or timed out).
    pub(crate) fn unanswered(&self) -> Option<Unanswered> {
        let unanswered = Unanswered(Arc::clone(&self.state));
        unanswered.any().then_some(unanswered)
    }

    /// Replaces the cleanup request of a phase that has one, for an abandonment from here on
    /// (the driver has sent none yet: it cleans up only once the phase is dropped).
    pub(crate) fn set_cleanup(&mut self, op: Arc<Op>) {
        if self.cleanup.is_none() {
            return;
        }
        if let Some(driver) = self.driver.as_mut() {
            driver.cleanup = Some(Arc::clone(&op));
        }
        self.cleanup = Some(op);
    }
}

impl<B: Backend> Drop for Phase<B> {
    fn drop(&mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            // Grants that get no cleanup are settled now (see `State::unsettled`); those that
            // get one count as being cleaned up from here on.
            let mut targets = Vec::new();
            changed(&self.state, |st| {
                st.abandoned = true;
                targets = (0..st.slots.len())
                    .filter(|&i| st.take_cleanup(i))
                    .collect();
            });
            for i in targets {
                send_cleanup(
                    &self.backend,
                    &self.state,
                    i,
                    Arc::clone(&cleanup),
                    self.name,
                );
            }
        }
        // Requests still in flight: their answers are folded in (late claims, cleanups of late
        // grants of an abandoned attempt, telemetry) by a task of their own.
        if let Some(driver) = self.driver.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let task = self.backend.background().map(Background::task);
                    drop(rt.spawn(async move {
                        let _task = task;
                        driver.await;
                    }));
                }
                Err(_) => tracing::warn!(
                    phase = ?self.name,
                    "no runtime to follow the requests still in flight; a grant among them expires with its TTL"
                ),
            }
        }
    }
}

/// The requests of an attempt given up on whose answers were still out. A grant among them is
/// cleaned up once it arrives; until then it refuses the next attempt of the same lock at that
/// node, as if somebody else held it.
#[derive(Clone)]
pub(crate) struct Unanswered(Arc<Mutex<State>>);

impl Unanswered {
    /// Whether `node`'s answer is still out.
    pub(crate) fn at(&self, node: usize) -> bool {
        lock(&self.0).unanswered(node)
    }

    /// Whether `node` refused (its answer came after the attempt was decided).
    pub(crate) fn refused(&self, node: usize) -> bool {
        lock(&self.0)
            .slots
            .get(node)
            .is_some_and(|s| s.outcome == NodeOutcome::Refused)
    }

    /// Whether some node's answer is still out.
    pub(crate) fn any(&self) -> bool {
        let st = lock(&self.0);
        (0..st.slots.len()).any(|i| st.unanswered(i))
    }

    /// By when the phase's requests and cleanups have all answered or been given up on, if it
    /// was given up or kept by then.
    pub(crate) fn settles_by(&self) -> Instant {
        lock(&self.0).settles_by
    }

    /// Whether some node's answer, or a cleanup it led to, is still out.
    pub(crate) fn any_unsettled(&self) -> bool {
        lock(&self.0).any_unsettled()
    }

    /// Waits — at most until `until` — until every node answered (or timed out) and the
    /// cleanups those answers led to answered (or ran out of time): what the attempt did on
    /// the nodes is then done, and a request sent afterwards, by any path to the servers, comes
    /// after it.
    pub(crate) async fn settled(&self, until: Instant) {
        self.wait(until, State::any_unsettled).await;
    }

    /// Waits — at most until `until` — until `node` answered (or timed out) and, if it granted,
    /// its cleanup was handed over: a request sent to the node afterwards reaches it behind the
    /// cleanup.
    pub(crate) async fn answered(&self, node: usize, until: Instant) {
        self.wait(until, |st| st.unanswered(node)).await;
    }

    /// Waits — at most until `until` — while `pending` holds.
    async fn wait(&self, until: Instant, pending: impl Fn(&State) -> bool) {
        let recorded = {
            let mut st = lock(&self.0);
            if !pending(&st) {
                return;
            }
            Arc::clone(st.recorded.get_or_insert_with(Default::default))
        };
        let _ = tokio::time::timeout_at(until, async {
            loop {
                let next = recorded.notified();
                let mut next = std::pin::pin!(next);
                next.as_mut().enable();
                if !pending(&lock(&self.0)) {
                    return;
                }
                next.await;
            }
        })
        .await;
    }
}

/// A release's terms for [`Phase::launch`]: the nodes it spares, and, for a lock taken with the
/// caller's token, the lock's grants and the drift factor, by which its deletes are bounded
/// (see [`Granted::release_request`]).
#[derive(Default)]
struct Deletes<'a> {
    spared: &'a [bool],
    bounded: Option<(&'a Granted, f64)>,
    /// The next attempt with the lock's token waits for the deletes (see `State::deletes`):
    /// bounded ones, or those of a lock whose token was handed to the caller.
    waited: bool,
}

/// Why the delete of a bounded release was not sent to a node.
const WITHHELD: &str = "delete not sent: this lock (taken with the caller's token) may have written on the node without the node's clock being read, so no deadline on that clock could bound the delete; what the lock left there expires with its TTL";

/// A node's clock (`TIME`, µs) as an answer read it: `at`, answered to a request sent at `sent`
/// and read here at `read`.
#[derive(Debug, Clone, Copy)]
struct Clock {
    at: u64,
    sent: Instant,
    read: Instant,
}

/// What a bounded release sends a node (see [`Granted::release_request`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delete {
    /// A delete that runs up to this moment on the node's clock (µs).
    Before(u64),
    /// Nothing: nothing of the lock is there (the node refused its acquire, and no put-back
    /// reached it).
    NothingThere,
    /// Nothing: a delete would have no deadline (the lock may have written there, but the
    /// node's clock was never read).
    Unbounded,
}

/// How a lock's token came about, for its release (see [`Granted::token_use`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenUse {
    /// A fresh token nobody outside the library has seen.
    Fresh,
    /// The caller's own (`try_acquire_with_token`).
    Own,
    /// A fresh token the caller read (`Lock::token`, `Lease::token`).
    Read,
}

/// The claims of a kept acquire, including grants that arrived after the quorum decision.
#[derive(Clone)]
pub(crate) struct Granted(Arc<Mutex<State>>);

impl Granted {
    /// Waits until no node's answer to the acquire is still out: each answered, or its
    /// deadline passed (bounded by the last deadline and the delivery grace, should no driver
    /// record the timeouts).
    pub(crate) async fn answered(&self) {
        let until = lock(&self.0).last_deadline + DELIVERY_GRACE;
        Unanswered(Arc::clone(&self.0))
            .wait(until, |st| (0..st.slots.len()).any(|i| st.unanswered(i)))
            .await;
    }

    /// Every claim received so far, sorted by node name.
    pub(crate) fn claims(&self) -> Vec<Claim> {
        let mut claims: Vec<Claim> = lock(&self.0)
            .slots
            .iter()
            .filter_map(|s| s.claim.clone())
            .collect();
        claims.sort_by(|a, b| a.node.cmp(&b.node));
        claims
    }

    /// Whether the lock was taken with the caller's token.
    pub(crate) fn own_token(&self) -> bool {
        lock(&self.0).own_token
    }

    /// A renewal's put-back of the lock's keys was handed to node `i`, and may answer until
    /// `until` (see [`Granted::repair_done`]): the lock's release waits for its answer there.
    pub(crate) fn repair_sent(&self, i: usize, until: Instant) {
        let now = Instant::now();
        changed(&self.0, |st| {
            if let Some(s) = st.slots.get_mut(i) {
                s.repairing += 1;
                s.repair_since = Some(s.repair_since.map_or(now, |t| t.min(now)));
                s.repair_until = Some(s.repair_until.map_or(until, |t| t.max(until)));
            }
        });
    }

    /// The put-back sent to node `i` answered (`Some(Ok(clock))`: granted, with the node's
    /// clock; `Some(Err(()))`: refused), or not (`None`: timed out or failed, so it may have
    /// written).
    pub(crate) fn repair_done(&self, i: usize, answer: Option<Result<Option<u64>, ()>>) {
        let read = Instant::now();
        changed(&self.0, |st| {
            let own_token = st.own_token;
            if let Some(s) = st.slots.get_mut(i) {
                s.repairing = s.repairing.saturating_sub(1);
                // Sent no earlier than the earliest put-back still out.
                let sent = s.repair_since.unwrap_or(read);
                if s.repairing == 0 {
                    (s.repair_since, s.repair_until) = (None, None);
                }
                match answer {
                    Some(Ok(clock)) => {
                        // The latest reading bounds the delete the closest.
                        let newer = s.clock.is_none_or(|c| c.sent < sent);
                        if let (true, true, Some(at)) = (own_token, newer, clock) {
                            s.clock = Some(Clock { at, sent, read });
                        }
                        s.put_back |= s.clock.is_none();
                    }
                    Some(Err(())) => {}
                    None => s.put_back = true,
                }
            }
        });
    }

    /// The release's request to node `i` for a lock taken with the caller's token, whose deletes
    /// may land until `settles_by`, and when the node's clock has surely passed its deadline.
    ///
    /// The deadline on the node's clock (µs) counts from the clock the node answered before its
    /// grant (or a put-back's) — late enough that a delete landing by `settles_by` runs, while
    /// the node's clock counts at most `1 + drift_factor` of the real time — and the node's
    /// clock has surely passed it once it counted at least `1 - drift_factor` of the real time
    /// since. A delete written later deletes nothing, so the next attempt with the token, sent
    /// after that, cannot lose its keys to it. The longer the lock was held, the wider the two
    /// bounds apart: a re-claim after a release with a delete unanswered waits about
    /// `2 · drift_factor` of the time since the grant more.
    ///
    /// A node whose answer to the acquire (or to a put-back) is still out gets its delete once
    /// that answer is in, with its clock (released at once after the decision, a grant not yet
    /// recorded had no clock; one read after its node's timeout was never bounded). A node that
    /// refused the acquire, and that no put-back reached, gets nothing and counts as having
    /// nothing to delete. A node the lock may have written on without its clock being read (no
    /// answer in time, an error, a put-back that did not answer) gets nothing either — a delete
    /// with no deadline, landing at any time, might take what a re-claim keeps there — and
    /// counts as unknown ([`NodeErrorKind::Withdrawn`]): what is there expires with the TTL.
    fn release_request<B: Backend>(
        &self,
        backend: &Arc<B>,
        i: usize,
        op: &Arc<Op>,
        settles_by: Instant,
        drift_factor: f64,
    ) -> (BoxFuture<'static, Result<Reply, NodeError>>, Instant) {
        let (pending, (delete, passed)) = {
            let st = lock(&self.0);
            (
                Self::pending(&st, i),
                Self::delete_for(&st, i, settles_by, drift_factor),
            )
        };
        let Some((sent, until)) = pending else {
            return (Self::send(backend, i, op, delete), passed);
        };
        // Sent once the answer is in, or the acquire's driver (or the put-back) gave up.
        let granted = self.clone();
        let (backend, op) = (Arc::clone(backend), Arc::clone(op));
        let request = Box::pin(async move {
            Unanswered(Arc::clone(&granted.0))
                .wait(until, |st| Self::pending(st, i).is_some())
                .await;
            let (delete, _) = Self::delete_for(&lock(&granted.0), i, settles_by, drift_factor);
            Self::send(&backend, i, &op, delete).await
        });
        // A clock it answers was read by `until`, after `sent`: the node's clock has surely
        // passed the deadline by then plus that bound's span.
        let (_, latest) = Self::bound(
            Clock {
                at: 0,
                sent,
                read: until,
            },
            settles_by,
            drift_factor,
        );
        (request, passed.max(latest))
    }

    /// For a node whose answer to the acquire or to a put-back is still to come: when the
    /// earliest of those requests was sent, and until when they may answer.
    fn pending(st: &State, i: usize) -> Option<(Instant, Instant)> {
        let s = st.slots.get(i)?;
        let acquire = (!s.answered && !st.unfollowed)
            .then(|| (st.started, st.last_deadline + DELIVERY_GRACE));
        let repair = s.repair_since.zip(s.repair_until);
        match (acquire, repair) {
            (Some((a, x)), Some((b, y))) => Some((a.min(b), x.max(y))),
            (one, other) => one.or(other),
        }
    }

    /// Until when the answers the release of this lock waits for before sending a delete may
    /// come (see [`Granted::release_request`]), if any is still out.
    fn pending_until(&self) -> Option<Instant> {
        let st = lock(&self.0);
        (0..st.slots.len())
            .filter_map(|i| Self::pending(&st, i).map(|(_, until)| until))
            .max()
    }

    /// What the release sends node `i` (see [`Granted::release_request`]), and by when the
    /// node's clock has surely passed its deadline.
    fn delete_for(
        st: &State,
        i: usize,
        settles_by: Instant,
        drift_factor: f64,
    ) -> (Delete, Instant) {
        let Some(s) = st.slots.get(i) else {
            return (Delete::Unbounded, settles_by);
        };
        match s.clock {
            Some(clock) => {
                let (before, passed) = Self::bound(clock, settles_by, drift_factor);
                (Delete::Before(before), passed)
            }
            None if s.outcome == NodeOutcome::Refused && !s.put_back && s.repairing == 0 => {
                (Delete::NothingThere, settles_by)
            }
            None => (Delete::Unbounded, settles_by),
        }
    }

    /// The deadline on a node's clock that `clock` bounds for a delete landing by
    /// `settles_by`, and when the node's clock has surely passed it.
    fn bound(clock: Clock, settles_by: Instant, drift_factor: f64) -> (u64, Instant) {
        // `build()` keeps the factor below 0.5.
        let (fast, slow) = (1.0 + drift_factor, 1.0 - drift_factor);
        let margin = Duration::from_millis(1);
        // The node's clock at `settles_by` is at most this far past `at`: it was read after
        // its request was sent. (Counted from the acquire, a put-back's clock made a re-claim
        // wait about as long as the lock had been held, found in review.)
        let upto = settles_by
            .saturating_duration_since(clock.sent)
            .mul_f64(fast)
            + margin;
        let before = clock
            .at
            .saturating_add(u64::try_from(upto.as_micros()).unwrap_or(u64::MAX));
        // And at least `slow` of the time since its answer was read.
        (before, clock.read + upto.div_f64(slow) + margin)
    }

    /// The request for `delete`.
    fn send<B: Backend>(
        backend: &Arc<B>,
        i: usize,
        op: &Arc<Op>,
        delete: Delete,
    ) -> BoxFuture<'static, Result<Reply, NodeError>> {
        match delete {
            Delete::Before(us) => match op.before(us) {
                Some(bounded) => backend.call(i, Arc::new(bounded)),
                None => backend.call(i, Arc::clone(op)),
            },
            Delete::NothingThere => Box::pin(std::future::ready(Ok(Reply::No))),
            Delete::Unbounded => Box::pin(std::future::ready(Err(NodeError::new(
                NodeErrorKind::Withdrawn,
                WITHHELD,
            )))),
        }
    }

    /// Whether the lock's requests left the client for each node (see [`Reach`]).
    pub(crate) fn reach(&self) -> Option<Reach> {
        lock(&self.0).reach.clone()
    }

    /// Whether the lock was taken with the caller's token, or its token was handed to the
    /// caller (see [`Granted::pin`]), or neither: who may re-claim it with the token.
    pub(crate) fn token_use(&self) -> TokenUse {
        let st = lock(&self.0);
        if st.own_token {
            TokenUse::Own
        } else if st.reach.as_ref().is_some_and(Reach::pinned) {
            TokenUse::Read
        } else {
            TokenUse::Fresh
        }
    }

    /// The lock's token was handed to the caller: its release spares no node (see [`Reach`]).
    pub(crate) fn pin(&self) {
        if let Some(reach) = &lock(&self.0).reach {
            reach.pin();
        }
    }

    /// The nodes the lock's release may spare: every request of the lock to them is withdrawn
    /// unsent, now (see [`Reach::withdraw`]). Empty when none is.
    pub(crate) fn withdraw_unsent(&self) -> Vec<bool> {
        let st = lock(&self.0);
        let Some(reach) = &st.reach else {
            return Vec::new();
        };
        // Allocated only once a node is spared: a release on healthy nodes spares none.
        let mut spared = Vec::new();
        for i in 0..st.slots.len() {
            if reach.withdraw(i) {
                spared.resize(st.slots.len(), false);
                spared[i] = true;
            }
        }
        spared
    }

    /// Node `i` may hold the lock's keys from now on: a renewal or an extension found them
    /// there, or a put-back was sent there (which may have written them, answered or not).
    pub(crate) fn held_on(&self, i: usize) {
        if let Some(bit) = node_bit(i) {
            lock(&self.0).held_on |= bit;
        }
    }

    /// Whether node `i` may have held the lock's keys at some point: it granted the acquire (so
    /// far: its answer may still be on the way), or was marked by [`Granted::held_on`]. A node past the 64th counts as having held them.
    /// Kept with the lock, not its guard: a lock guarded again after `stop_renewal` keeps what
    /// the first guard's renewals learnt.
    pub(crate) fn may_have_held(&self, i: usize) -> bool {
        let st = lock(&self.0);
        node_bit(i).is_none_or(|bit| st.held_on & bit != 0)
            || st
                .slots
                .get(i)
                .is_some_and(|s| s.outcome == NodeOutcome::Confirmed)
    }

    /// The nodes that refused so far (their answers may still be on the way), in node order;
    /// no allocation when none did.
    pub(crate) fn refused(&self) -> Vec<usize> {
        let st = lock(&self.0);
        (0..st.slots.len())
            .filter(|&i| matches!(st.slots[i].outcome, NodeOutcome::Refused))
            .collect()
    }
}

/// How long a request may still wait in the client to be written after the caller stopped
/// waiting for its answer. Dropping a request that has not been written yet cancels it, which
/// is harmless for an acquire but would lose a release: under load, requests can queue in the
/// client for longer than the node timeout. Bounded so a hung node cannot pin memory for long.
pub(crate) const DELIVERY_GRACE: Duration = Duration::from_secs(1);

/// How much of the real time that passes the nodes' clocks are taken to count at least, for
/// [`cleanup_deadline`]: a tenth slow is far beyond any clock that keeps time (docs/assumptions.md).
const NODE_CLOCK_RATE: f64 = 0.9;

/// The last moment on a node's clock (µs) at which the cleanup of a grant of an attempt with
/// the caller's token may still delete there (`scripts::RELEASE_BEFORE`): `at_us` is the node's
/// clock read before the grant, `read` when its answer was read. The next attempt with the
/// token in this process is sent once that cleanup answered, or else at the attempt's
/// `settles_by`, so at least that long after `read`, and after the grant; the node's clock
/// counts at least [`NODE_CLOCK_RATE`] of it unless it is stepped back. A cleanup written after
/// the re-claim (its runtime stopped running) then deletes nothing. Counted from the grant, a
/// fixed 0.9 s was too short for a node whose answer took most of a 1 s budget: its cleanup
/// came 0.92 s after the grant, and the failed re-claim's key stayed for its TTL (test
/// `reclaim_attacks::a_failed_reclaims_cleanup_reaches_a_slow_node_in_time`); counted to the
/// last deadline plus the grace alone, it was too short for a node 480 ms away with a 1 s
/// budget, and 1.2 s away with a 3 s one (found in review).
fn cleanup_deadline(at_us: u64, settles_by: Instant, read: Instant) -> u64 {
    let waited = settles_by.saturating_duration_since(read);
    let window = waited
        .mul_f64(NODE_CLOCK_RATE)
        .saturating_sub(Duration::from_millis(1));
    at_us.saturating_add(u64::try_from(window.as_micros()).unwrap_or(u64::MAX))
}

/// A request handed to its node's connection (see [`handed_over`]): its answer if it came at
/// once, or the request, polled outside tokio's cooperative budget.
pub(crate) enum Handed<T> {
    Answered(Option<T>),
    Waiting(Unconstrained<BoxFuture<'static, T>>),
}

impl<T> Handed<T> {
    /// A request that is answered before it was sent (e.g. it could not be).
    pub(crate) fn answered(answer: T) -> Self {
        Self::Answered(Some(answer))
    }
}

// Nothing in it is pinned: the answer is moved out, the request is boxed.
impl<T> Unpin for Handed<T> {}

impl<T> Future for Handed<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.get_mut() {
            Self::Answered(answer) => Poll::Ready(
                answer
                    .take()
                    .expect("a handed-over request polled after its answer"),
            ),
            Self::Waiting(call) => Pin::new(call).poll(cx),
        }
    }
}

/// Polls a fresh request once, here in the caller's task, so that it is handed to the node's
/// connection in program order: a release or cleanup issued after an acquire is queued behind
/// it on every node, whatever order the driver later polls in. (Leaving the first poll to the
/// driver let a later phase's request overtake an earlier one under load, and a release that
/// overtakes its acquire leaves the key behind.) Exempt from tokio's cooperative budget so the
/// poll cannot be refused for budget reasons.
pub(crate) fn handed_over<T: Send + 'static>(call: BoxFuture<'static, T>) -> Handed<T> {
    let mut call = tokio::task::coop::unconstrained(call);
    match Pin::new(&mut call).poll(&mut Context::from_waker(std::task::Waker::noop())) {
        Poll::Ready(answer) => Handed::answered(answer),
        Poll::Pending => Handed::Waiting(call),
    }
}

/// Starts `work` here, in the caller's task, and drives the rest of it in a task of `rt`:
/// what its first poll does — requests handed to the connections, a release registered for
/// the re-claims with its token (see `reclaim`) — is done when this returns, in the caller's
/// order. Started in the spawned task alone, the release of a dropped guard was registered
/// only once that task first ran, after a re-claim with the token made right after the drop:
/// the re-claim did not wait for it, its deletes landed after the re-claim's re-arms, and the
/// re-claimed lock was on no node (tests `reclaim_attacks::a_reclaim_right_after_dropping_
/// the_guard_keeps_its_lock`, `…_an_unpolled_release_keeps_its_lock`).
pub(crate) fn start_then_spawn(rt: &tokio::runtime::Handle, work: BoxFuture<'static, ()>) {
    let started = handed_over(work);
    if matches!(started, Handed::Waiting(_)) {
        drop(rt.spawn(started));
    }
}

/// FNV-1a of `parts`, continued from `h`.
fn fnv_from(mut h: u64, parts: &[&[u8]]) -> u64 {
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Where a node's hash for any resource starts (see [`first_node`]): FNV-1a of the node's
/// name and a separator. The name is the server's identity (the id of its identity record)
/// once a connection read it, so that clients reaching one server under different addresses
/// agree; the configured name or normalised address before that.
pub(crate) fn rank_seed(name: &str) -> u64 {
    fnv_from(0xcbf2_9ce4_8422_2325, &[name.as_bytes(), b"\n"])
}

/// MurmurHash3's 64-bit finaliser: every input bit moves every output bit. FNV-1a alone
/// barely moves the high bits for a change in the last bytes, so the comparison between two
/// nodes' hashes followed their names, not the resource: every resource ranked the same node
/// first (test `clients_naming_the_nodes_differently_agree_on_the_first_node`).
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Picks the node a contended lock is attempted on first, the same for every client of the
/// same servers: of the nodes `usable` allows, the one with the highest hash of the node's
/// [`rank_seed`] and `resource` (rendezvous hashing: FNV-1a, then [`mix`]), so that resources
/// spread over the nodes. `None` with one node, whose answer decides alone.
///
/// Waiters woken by one release race for the lock. Sent to every node at once, two attempts
/// that start within a round trip of each other can each win some nodes and neither a quorum
/// (a split vote: both clean up and try again). Through one node first, the loser is refused
/// there and asks no other node, and the winner asks the rest once that node granted: one more
/// round trip for the winner, no split between racers, and fewer requests for the nodes.
pub(crate) fn first_node(
    seeds: impl Iterator<Item = u64>,
    resource: &str,
    usable: impl Fn(usize) -> bool,
) -> Option<usize> {
    let mut nodes = 0;
    let mut best: Option<(usize, u64)> = None;
    for (i, seed) in seeds.enumerate() {
        nodes += 1;
        if usable(i) {
            let h = mix(fnv_from(seed, &[resource.as_bytes()]));
            if best.is_none_or(|(_, top)| h > top) {
                best = Some((i, h));
            }
        }
    }
    best.filter(|_| nodes >= 2).map(|(i, _)| i)
}

/// The node an attempt asks first (see [`Phase::start`]).
pub(crate) struct First {
    pub(crate) node: usize,
    /// Called when that node fails or does not answer within its budget.
    pub(crate) missed: Box<dyn FnOnce() + Send>,
}

/// How long the nodes after a racing attempt's first node wait for its answer before they are
/// asked anyway: a quarter of the shortest node budget (not of the first node's own, which a
/// connection being opened lengthens).
pub(crate) fn patience<B: Backend>(backend: &B) -> Duration {
    (0..backend.len())
        .map(|i| backend.budget(i))
        .min()
        .unwrap_or_default()
        / 4
}

/// Whether the nodes after the first may be asked (see [`Phase::start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    Waiting,
    Open,
    Shut,
}

/// The first node's request: opens the gate for the others unless the node refused; also
/// when it has not answered by `patience` (a hung node must not hold the attempt up for long).
/// Calls `missed` when the node fails (other than on a changed identity record) or has not
/// answered by `deadline`, its budget.
fn first_call(
    mut call: BoxFuture<'static, Result<Reply, NodeError>>,
    open: tokio::sync::watch::Sender<Gate>,
    patience: Instant,
    deadline: Instant,
    missed: Box<dyn FnOnce() + Send>,
) -> BoxFuture<'static, Result<Reply, NodeError>> {
    Box::pin(async move {
        let mut missed = Some(missed);
        let mut answer = None;
        for until in [patience, deadline] {
            answer = crate::det::select! {
                answer = &mut call => Some(answer),
                () = tokio::time::sleep_until(until) => None,
            };
            if answer.is_some() {
                break;
            }
            if until == patience {
                open.send_replace(Gate::Open);
            } else if let Some(missed) = missed.take() {
                missed();
            }
        }
        let answer = match answer {
            Some(answer) => answer,
            None => call.await,
        };
        // A node whose identity record changed since this client connected failed the request
        // for this client's stale view, not for anything wrong with the node, and the
        // connection is opened again at once: passing it over would rank the nodes differently
        // from every other client for the span (test
        // `handoff::a_client_follows_identity_records_replaced_while_it_was_connected`). Nor
        // is a request the lock's release withdrew before it was sent: the node was not asked.
        if answer
            .as_ref()
            .is_err_and(|e| !matches!(e.kind(), NodeErrorKind::Identity | NodeErrorKind::Withdrawn))
            && let Some(missed) = missed.take()
        {
            missed();
        }
        let verdict = match answer {
            Ok(Reply::No) => Gate::Shut,
            _ => Gate::Open,
        };
        open.send_if_modified(|g| {
            let waiting = *g == Gate::Waiting;
            if waiting {
                *g = verdict;
            }
            waiting
        });
        answer
    })
}

/// Node `i`'s request behind the gate: made once the gate opens (a node's request is queued
/// for it as soon as it is made), unless the phase gave up on the node or the attempt
/// meanwhile — nothing was sent then, so nothing needs cleaning up; a refusal, unasked, once
/// the gate shuts.
fn gated<B: Backend>(
    backend: Arc<B>,
    i: usize,
    op: Arc<Op>,
    mut opened: tokio::sync::watch::Receiver<Gate>,
    state: std::sync::Weak<Mutex<State>>,
) -> BoxFuture<'static, Result<Reply, NodeError>> {
    Box::pin(async move {
        let open = match opened.wait_for(|g| *g != Gate::Waiting).await {
            Ok(g) => *g == Gate::Open,
            Err(_) => true, // the first request is gone with its driver
        };
        let wanted = open
            && state.upgrade().is_some_and(|st| {
                let st = lock(&st);
                !st.abandoned && matches!(st.slots[i].outcome, NodeOutcome::Pending)
            });
        if !wanted {
            return Ok(Reply::No);
        }
        handed_over(backend.call(i, op)).await
    })
}

/// Sends the cleanup request to node `i` in the background; it may wait up to
/// [`DELIVERY_GRACE`] to be delivered. Once it answered or ran out of time, `state` records
/// it (see [`Unanswered::settled`]).
/// Outside a runtime (e.g. while it shuts down) nothing can be sent; the key then expires
/// with its TTL.
fn send_cleanup<B: Backend>(
    backend: &Arc<B>,
    state: &Arc<Mutex<State>>,
    i: usize,
    op: Arc<Op>,
    phase: PhaseName,
) {
    let (unsent, op) = {
        let st = lock(state);
        // None of the attempt's requests left the client for the node, nor ever will: it holds
        // nothing to clean up.
        let unsent = st.reach.as_ref().is_some_and(|r| r.withdraw(i));
        // The keys an attempt with the caller's token created may, a grace later, be the lock
        // taken again with the token: its delete must not run on the node after that, however
        // late it is written (see `cleanup_deadline`).
        let before = st.slots.get(i).and_then(|s| s.before_us);
        let bounded = before.and_then(|before| op.before(before));
        (unsent, bounded.map_or(op, Arc::new))
    };
    let state = Arc::clone(state);
    let done = move || {
        changed(&state, |st| {
            if let Some(slot) = st.slots.get_mut(i) {
                slot.cleaning = false;
            }
        });
    };
    if unsent {
        done();
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(node = %backend.name(i), "no runtime to release an abandoned grant; it expires with its TTL");
        done();
        return;
    };
    let call = handed_over(backend.call(i, op));
    let node = backend.name(i).clone();
    let task = backend.background().map(Background::task);
    // A task dropped unfinished (its runtime shut down) leaves the cleanup counted as under way
    // until the phase's `settles_by`: it may have been written and still be on its way, and a
    // re-claim sent as if it were done went ahead of it and lost its keys to it (test
    // `reclaim_attacks::a_cleanup_on_its_way_when_its_runtime_is_dropped_is_waited_for`). So
    // does a cleanup that has not answered within its grace, for the same reason: counted as
    // done then, a re-claim went ahead up to a second before `settles_by`, ahead of a cleanup
    // that was still on its way and whose deadline on the node counts to `settles_by`, and lost
    // its keys to it (test `reclaim_attacks::a_cleanup_held_in_the_network_does_not_delete_the_
    // reclaimed_lock`). And so does one whose call failed on this side of the connection (an
    // I/O error: the connection died, its runtime shut down): it may have been written all the
    // same (test `reclaim_attacks::a_cleanup_whose_connection_died_on_its_way_does_not_delete_
    // the_reclaimed_lock`). Any other answer — the node's, or an error before anything was
    // written (no connection, refused credentials) — settles it.
    rt.spawn(async move {
        let _task = task;
        let result = tokio::time::timeout(DELIVERY_GRACE, call).await;
        let answered = match &result {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => e.kind() != NodeErrorKind::Io,
            Err(_) => false,
        };
        if answered {
            done();
        }
        telemetry::cleanup(&node, phase, &result);
    });
}

/// One node's request, as the driver sees it.
struct Call {
    /// The request, until it answered or was given up on (its budget and the grace passed).
    request: Option<Handed<Result<Reply, NodeError>>>,
    /// When the node counts as timed out.
    deadline: Instant,
    budget: Duration,
    /// Its outcome is recorded: an answer, or a timeout.
    settled: bool,
}

/// Folds the answers into the state as they arrive. One timer per phase (not per node) marks
/// nodes whose budget ran out as timed out; their requests keep being driven for
/// [`DELIVERY_GRACE`] more, so that a request still queued in the client is written. Finished
/// when every request answered or the grace ran out. A handful of requests per phase, so each
/// wake-up polls those still out rather than tracking which one woke it.
struct Driver<B: Backend> {
    backend: Arc<B>,
    state: Arc<Mutex<State>>,
    calls: Vec<Call>,
    /// The node asked first, whose answer may open the gate for the others: polled before
    /// them, so that they are sent in the same pass (in program order, ahead of any release).
    first_node: Option<usize>,
    timer: Pin<Box<Sleep>>,
    /// The grace after the last deadline.
    give_up: Instant,
    cleanup: Option<Arc<Op>>,
    phase: PhaseName,
    /// Late answers are recorded (see `Slot::answered`): a release whose deletes are waited
    /// for (`State::deletes`), or an attempt with the caller's token.
    follows_late: bool,
}

impl<B: Backend> Driver<B> {
    fn record(&mut self, i: usize, outcome: NodeOutcome, extras: Extras) {
        self.calls[i].settled = true;
        telemetry::node_outcome(self.backend.name(i), self.phase, &outcome);
        let (needs_cleanup, recorded) = {
            let mut st = lock(&self.state);
            (st.settle(i, outcome, extras), st.recorded.clone())
        };
        if let (true, Some(op)) = (needs_cleanup, &self.cleanup) {
            send_cleanup(&self.backend, &self.state, i, Arc::clone(op), self.phase);
        }
        // After the cleanup was handed over: a request to the node sent from now on goes
        // behind it.
        if let Some(recorded) = recorded {
            recorded.notify_waiters();
        }
    }

    /// The earliest deadline of a node still unsettled; the grace's end once all are.
    fn next_deadline(&self) -> Instant {
        self.calls
            .iter()
            .filter(|c| !c.settled)
            .map(|c| c.deadline)
            .min()
            .unwrap_or(self.give_up)
    }
}

impl<B: Backend> Drop for Driver<B> {
    fn drop(&mut self) {
        // Also when its runtime drops its task unfinished: whoever waits for the answers still
        // out (see `Unanswered::settled`) would otherwise wait until its limit, every time.
        changed(&self.state, |st| st.unfollowed = true);
    }
}

impl<B: Backend> Future for Driver<B> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut out = 0;
        let (n, first) = (this.calls.len(), this.first_node);
        let order = first
            .into_iter()
            .chain((0..n).filter(move |&i| Some(i) != first));
        for i in order {
            let Some(request) = this.calls[i].request.as_mut() else {
                continue;
            };
            let Poll::Ready(answer) = Pin::new(request).poll(cx) else {
                out += 1;
                continue;
            };
            this.calls[i].request = None;
            let (outcome, extras) = match answer {
                Ok(Reply::Yes {
                    claim,
                    heard,
                    kept,
                    at_us,
                }) => (NodeOutcome::Confirmed, (claim, heard, kept, at_us)),
                Ok(Reply::No) => (NodeOutcome::Refused, Extras::default()),
                Err(e) => (NodeOutcome::Failed(e), Extras::default()),
            };
            if !this.calls[i].settled {
                this.record(i, outcome, extras);
            } else if this.follows_late {
                // A late answer, after its node was recorded as timed out: a release's delete
                // that answered is done on the node; a late grant of an attempt with the
                // caller's token has the node's clock, by which the lock's release bounds its
                // delete there (see `Granted::release_request`).
                let read = Instant::now();
                changed(&this.state, |st| {
                    let clock = st.own_clock(extras.3, read);
                    let slot = &mut st.slots[i];
                    slot.answered |= outcome.answered();
                    if clock.is_some() {
                        slot.clock = clock;
                    }
                });
            }
        }
        if out == 0 {
            return Poll::Ready(());
        }
        loop {
            let next = this.next_deadline();
            if this.timer.deadline() != next {
                this.timer.as_mut().reset(next);
            }
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Nodes past their deadline are recorded before the driver may stop, even when it
            // was not polled for longer than the grace (a stalled thread): a node left
            // unrecorded would keep the decision from ever being made.
            let now = Instant::now();
            for i in 0..this.calls.len() {
                if !this.calls[i].settled && this.calls[i].deadline <= now {
                    let after = this.calls[i].budget;
                    this.record(i, NodeOutcome::TimedOut { after }, Extras::default());
                }
            }
            if now >= this.give_up {
                return Poll::Ready(()); // what is still out is given up on
            }
        }
    }
}

#[cfg(test)]
mod tests;
