//! `tracing` events and `metrics` facade calls, in one place so names stay consistent.
//!
//! Metric names (all prefixed `redlock_`):
//! - `redlock_acquire_seconds` (histogram, label `outcome`): wall time of `acquire`/`try_acquire`
//!   including retries.
//! - `redlock_acquire_attempts` (histogram): attempts per call.
//! - `redlock_acquire_total` (counter, label `outcome`: `acquired`, `busy`, `unreachable`,
//!   `exhausted`, `error`).
//! - `redlock_contention_total` (counter): attempts refused because another owner held the lock.
//! - `redlock_split_votes_total` (counter): failed acquire attempts that still won at least one
//!   node — the votes were split between contenders (or nodes failed) and nobody of them may have
//!   reached the quorum; the grants are released again.
//! - `redlock_node_errors_total` / `redlock_node_timeouts_total` (counters, labels `node`, `phase`).
//! - `redlock_extend_total`, `redlock_release_total` (counters, label `outcome`).
//! - `redlock_cleanup_total` (counter, label `outcome`): background releases of abandoned grants.
//! - `redlock_leases_held` (gauge): leases (guards) alive now, this process.
//! - `redlock_lease_lost_total` (counter, label `reason`: `expired`, `renewal_failed`,
//!   `max_hold`): leases that ended without their holder asking; each is also logged at `warn`
//!   with the resources and the reason (never the token). A release (`released`) or
//!   `stop_renewal` (`renewal_stopped`) is not a loss and is not counted here.
//! - `redlock_hold_seconds` (histogram, label `reason`: every `LostReason` label): how long each
//!   lease lived, from its guard's creation to its end.
//! - `redlock_renewal_seconds` (histogram): wall time of one batched renewal round (one call
//!   per node for up to 1,000 locks), from its start until every lock in it was decided.
//! - `redlock_renewal_total` (counter, label `outcome`: `renewed`, `failed`): renewals of single
//!   locks; `failed` = not renewed by a quorum in that round (lost, or retried while validity
//!   remains).
//! - `redlock_renewal_min_validity_seconds` (histogram): per renewal round, the smallest
//!   validity any of its locks had left when the round started — how close renewals run to
//!   expiry.

use std::time::Duration;

use crate::backend::Reply;
use crate::error::{Error, LostReason, NodeError, NodeErrorKind, NodeOutcome, Phase};

pub(crate) fn node_outcome(node: &str, phase: Phase, outcome: &NodeOutcome) {
    match outcome {
        // The lock was released before the request left this client: nothing the node did.
        NodeOutcome::Failed(e) if e.kind() == NodeErrorKind::Withdrawn => {
            tracing::trace!(node, %phase, "request withdrawn unsent by the lock's release");
        }
        NodeOutcome::Failed(e) => {
            tracing::debug!(node, %phase, kind = ?e.kind(), error = %e, "node error");
            metrics::counter!("redlock_node_errors_total", "node" => node.to_owned(), "phase" => phase_label(phase)).increment(1);
        }
        NodeOutcome::TimedOut { .. } => {
            tracing::debug!(node, %phase, "node timed out");
            metrics::counter!("redlock_node_timeouts_total", "node" => node.to_owned(), "phase" => phase_label(phase)).increment(1);
        }
        other => tracing::trace!(node, %phase, outcome = %other, "node answered"),
    }
}

pub(crate) fn cleanup(
    node: &str,
    phase: Phase,
    result: &Result<Result<Reply, NodeError>, tokio::time::error::Elapsed>,
) {
    let outcome = match result {
        Ok(Ok(Reply::Yes { .. })) => "released",
        Ok(Ok(Reply::No)) => "not_held",
        Ok(Err(_)) => "error",
        Err(_) => "timeout",
    };
    tracing::debug!(node, %phase, outcome, "released abandoned grant");
    metrics::counter!("redlock_cleanup_total", "outcome" => outcome).increment(1);
}

/// Label values are written out as literals, here and in the other per-lock calls, so that each
/// metric's key is static: the `metrics` macros build (allocate) a key on every call otherwise.
pub(crate) fn acquire_done(result: &Result<(), &Error>, attempts: u32, took: Duration) {
    let secs = took.as_secs_f64();
    macro_rules! done {
        ($outcome:literal) => {{
            metrics::counter!("redlock_acquire_total", "outcome" => $outcome).increment(1);
            metrics::histogram!("redlock_acquire_seconds", "outcome" => $outcome).record(secs);
        }};
    }
    match result {
        Ok(()) => done!("acquired"),
        Err(Error::Busy { .. }) => done!("busy"),
        Err(Error::QuorumUnreachable { .. }) => done!("unreachable"),
        Err(Error::ValidityExhausted { .. }) => done!("exhausted"),
        Err(_) => done!("error"),
    }
    metrics::histogram!("redlock_acquire_attempts").record(f64::from(attempts));
}

pub(crate) fn split_vote() {
    metrics::counter!("redlock_split_votes_total").increment(1);
}

/// An acquire paused before its attempt so that the waiters of several clients do not all reach
/// the nodes at once after a release; `holdback` is how many stagger ranges were added to the
/// pause because this client won more than its share of the recent races (0 while it does not).
pub(crate) fn stagger(holdback: f64) {
    metrics::counter!("redlock_staggers_total").increment(1);
    metrics::histogram!("redlock_stagger_holdback").record(holdback);
}

pub(crate) fn contention() {
    metrics::counter!("redlock_contention_total").increment(1);
}

pub(crate) fn extend_done(ok: bool) {
    if ok {
        metrics::counter!("redlock_extend_total", "outcome" => "extended").increment(1);
    } else {
        metrics::counter!("redlock_extend_total", "outcome" => "failed").increment(1);
    }
}

pub(crate) fn release_done(ok: bool) {
    if ok {
        metrics::counter!("redlock_release_total", "outcome" => "released").increment(1);
    } else {
        metrics::counter!("redlock_release_total", "outcome" => "failed").increment(1);
    }
}

/// A guard was made.
pub(crate) fn lease_started() {
    metrics::gauge!("redlock_leases_held").increment(1.0);
}

/// A lease ended (called once per lease, with its first reason).
pub(crate) fn lease_ended(resources: &[String], reason: &LostReason, held: Duration) {
    metrics::gauge!("redlock_leases_held").decrement(1.0);
    metrics::histogram!("redlock_hold_seconds", "reason" => reason.label())
        .record(held.as_secs_f64());
    if reason.is_loss() {
        tracing::warn!(?resources, reason = %reason, held = ?held, "lease lost");
        metrics::counter!("redlock_lease_lost_total", "reason" => reason.label()).increment(1);
    } else {
        tracing::debug!(?resources, reason = %reason, held = ?held, "lease ended");
    }
}

/// A renewal round starts; `min_left` is the smallest validity its locks have left.
pub(crate) fn renewal_started(min_left: Option<Duration>) {
    if let Some(left) = min_left {
        metrics::histogram!("redlock_renewal_min_validity_seconds").record(left.as_secs_f64());
    }
}

/// The locks of a renewal round were decided: `renewed` were, `failed` were not.
pub(crate) fn renewal_outcomes(renewed: u64, failed: u64) {
    metrics::counter!("redlock_renewal_total", "outcome" => "renewed").increment(renewed);
    metrics::counter!("redlock_renewal_total", "outcome" => "failed").increment(failed);
}

/// Every lock of a renewal round was decided, `took` after it started.
pub(crate) fn renewal_round(took: Duration) {
    metrics::histogram!("redlock_renewal_seconds").record(took.as_secs_f64());
}

fn phase_label(phase: Phase) -> &'static str {
    match phase {
        Phase::Acquire => "acquire",
        Phase::Extend => "extend",
        Phase::Release => "release",
    }
}
