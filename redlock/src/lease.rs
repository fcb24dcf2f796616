//! Leases: [`LockGuard`], the shareable [`Lease`] view and the lost signal. The renewal driver
//! that keeps them alive is in `renewal.rs`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::claim::Claim;
use crate::error::{Error, LostReason};
use crate::lock::{Deadline, Lock, ReleaseReport};
use crate::token::Token;

/// State shared by a guard, its leases and the renewal driver.
pub(crate) struct Held {
    pub(crate) id: u64,
    pub(crate) resources: Arc<[String]>,
    pub(crate) keys: Arc<[String]>,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    /// The validity every renewal must leave (the lock's own).
    pub(crate) min_validity: Duration,
    /// The node list of the client that took the lock.
    pub(crate) origin: Arc<str>,
    /// Every grant's claim, for the fence token.
    pub(crate) granted: Option<crate::engine::Granted>,
    /// When the lease began (its guard was made).
    pub(crate) since: Instant,
    /// How often this lock is renewed (from its own TTL).
    pub(crate) every: Duration,
    pub(crate) claims: Vec<Claim>,
    pub(crate) valid_until: Mutex<Deadline>,
    pub(crate) hold_until: Instant,
    pub(crate) lost: CancellationToken,
    pub(crate) reason: OnceLock<LostReason>,
    /// The nodes this lease marked with [`Held::held_on`], one bit per node (a cache of the
    /// lock's record, which lives in `granted`).
    pub(crate) held_on: AtomicU64,
    /// The renewal round this lock is in (0: none), so that a round dropped before it ends
    /// gives back the locks it has not settled, and only those (see `renewal::GiveBack`).
    pub(crate) round: AtomicU64,
    /// Set when the guard is released or dropped. Held while a renewal hands over a repair,
    /// so a repair is either sent before the release or not at all.
    pub(crate) done: Mutex<bool>,
}

/// Why [`Held::renewed`] did not move a lease's validity.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NotRenewed {
    /// The validity ran out first: the lease is lost.
    Passed,
    /// The lease ended first (released, stopped, lost): nothing to do.
    Ended,
}

impl Held {
    pub(crate) fn valid_until(&self) -> Deadline {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn is_done(&self) -> bool {
        *self.done.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the lease is lost: the signal fired, or the validity passed (also across a
    /// suspend the driver has not noticed yet, which fires the signal now).
    pub(crate) fn check_lost(&self) -> bool {
        if self.lost.is_cancelled() {
            return true;
        }
        if self.valid_until().passed() {
            self.fire(LostReason::Expired);
            return true;
        }
        false
    }

    /// Moves the validity to `deadline`, a renewal's, unless the validity ran out or the lease
    /// ended first. A renewal decided after the validity ran out (before the driver fired
    /// `Expired`: its timer a millisecond late, its task behind another) may count keys put
    /// back after then, which say nothing of the time between, when another client could have
    /// taken the lock; whether the lease survived used to depend on which of the two came
    /// first (test `a_renewal_decided_after_the_validity_ran_out_does_not_revive_the_lease`,
    /// found in review). Checked under the validity's lock, as [`Held::fire`] sets it.
    pub(crate) fn renewed(&self, deadline: Deadline) -> Result<(), NotRenewed> {
        let mut valid_until = self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.reason.get().is_some() {
            return Err(NotRenewed::Ended);
        }
        if valid_until.passed() {
            return Err(NotRenewed::Passed);
        }
        *valid_until = deadline;
        Ok(())
    }

    /// Node `i` may hold the lock's keys from now on (see [`Granted::held_on`]); the lock's
    /// record is written once per node, this lease's copy read first.
    ///
    /// [`Granted::held_on`]: crate::engine::Granted::held_on
    pub(crate) fn held_on(&self, i: usize) {
        let Some(bit) = crate::engine::node_bit(i) else {
            return;
        };
        if self.held_on.load(Ordering::Relaxed) & bit == 0
            && self.held_on.fetch_or(bit, Ordering::Relaxed) & bit == 0
            && let Some(granted) = &self.granted
        {
            granted.held_on(i);
        }
    }

    /// Whether node `i` may have held the lock's keys at some point (see
    /// [`Granted::may_have_held`]); true when the lock has no record of its grants.
    ///
    /// [`Granted::may_have_held`]: crate::engine::Granted::may_have_held
    pub(crate) fn may_have_held_on(&self, i: usize) -> bool {
        self.granted.as_ref().is_none_or(|g| g.may_have_held(i))
    }

    /// Records the first reason and fires the signal (later reasons are ignored). The first
    /// reason ends the lease: it is logged and counted then, once.
    pub(crate) fn fire(&self, reason: LostReason) {
        // A lease that ended for any reason but its holder's `stop_renewal` has no validity
        // left from now on: nothing read from it later (the lock `stop_renewal` returns,
        // `Lease::valid_until`) may say otherwise. (A renewal that found the lock taken over
        // left the last renewal's deadline in place.) The reason is recorded first, under the
        // validity's lock: whoever finds the validity passed then finds the reason too, and
        // its own `Expired` is ignored. Zeroed first, a guard's release was reported as
        // `Expired` when its lease was read in between (test `renewal_attacks::a_released_
        // guard_is_reported_released_while_its_lease_is_read`: 17 of 1,000 releases).
        let first = if matches!(reason, LostReason::RenewalStopped) {
            self.reason.set(reason).is_ok()
        } else {
            let mut valid_until = self
                .valid_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let first = self.reason.set(reason).is_ok();
            if !valid_until.passed() {
                *valid_until = Deadline::after(Deadline::clocks(), Duration::ZERO);
            }
            first
        };
        if first && let Some(reason) = self.reason.get() {
            crate::telemetry::lease_ended(&self.resources, reason, self.since.elapsed());
        }
        self.lost.cancel();
    }

    /// The lock again, as plain data: what it holds, how long it stays valid, its claims.
    pub(crate) fn to_lock(&self) -> Lock {
        Lock {
            resources: Arc::clone(&self.resources),
            keys: Arc::clone(&self.keys),
            token: self.token.clone(),
            ttl: self.ttl,
            min_validity: self.min_validity,
            valid_until: self.valid_until(),
            claims: self.claims.clone(),
            granted: self.granted.clone(),
            origin: Arc::clone(&self.origin),
        }
    }
}

/// A cheap, cloneable view of a held lock: its validity and its lost signal. Handed to the
/// work in [`Redlock::with_lock`](crate::Redlock::with_lock); it cannot release the lock.
#[derive(Clone)]
pub struct Lease {
    held: Arc<Held>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("resources", &self.held.resources)
            .field("token", &self.held.token)
            .field("remaining", &self.remaining())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Lease {
    /// Resolves when the lock is lost (or released), with the reason.
    ///
    /// It resolves by the lease's deadline at the latest, also when nothing renews the lock
    /// any more: the renewal driver is a task of a runtime that made a guard, and when every
    /// such runtime has ended (the guard lives on in another), nothing would fire the signal —
    /// awaited on a tokio runtime (with its timer enabled, as every call of this crate needs),
    /// this waits for the deadline itself. Elsewhere (another executor) it waits for the
    /// signal only. That wait counts the monotonic clock: after a suspend with no driver left
    /// it resolves late; `is_lost()` tells at once.
    ///
    /// # Cancel safety
    /// Safe: it only observes the signal and the clock.
    pub async fn lost(&self) -> LostReason {
        // A guard moved to a runtime whose own driver never ran waited here for good once the
        // runtime it was made on ended (test `lifecycle::a_guard_moved_to_another_runtime_is_
        // told_it_is_lost_when_renewal_ends`).
        if tokio::runtime::Handle::try_current().is_err() {
            self.held.lost.cancelled().await;
            return self.reason().unwrap_or(LostReason::Released);
        }
        loop {
            let end = self.held.valid_until().mono();
            crate::det::select! {
                () = self.held.lost.cancelled() => break,
                () = tokio::time::sleep_until(end) => {
                    // Renewed meanwhile: wait for the new deadline.
                    if self.held.check_lost() {
                        break;
                    }
                }
            }
        }
        self.reason().unwrap_or(LostReason::Released)
    }

    /// The same signal as a [`CancellationToken`], to pass into code that already uses one.
    /// Cancelling it yourself does not release the lock.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.held.lost.child_token()
    }

    /// Whether the lock is lost: the signal fired, or the validity passed — checked here too,
    /// so a lease never reports "held" past its deadline (e.g. right after a suspend).
    pub fn is_lost(&self) -> bool {
        self.held.check_lost()
    }

    /// The reason, once the signal has fired.
    pub fn reason(&self) -> Option<LostReason> {
        self.held.reason.get().cloned()
    }

    /// Local validity deadline after the last successful extension (pulled in by time the
    /// machine spent suspended, on Linux).
    pub fn valid_until(&self) -> std::time::Instant {
        self.held.valid_until().instant().into_std()
    }

    /// Validity left now; zero once lost. On Linux, time the machine spent suspended counts.
    pub fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.held.valid_until().remaining()
    }

    /// The lock's token (redacted in `Debug`). Reading it means it may be handed on: the
    /// lock's release then goes to every node (see [`Lock::token`](crate::Lock::token)).
    pub fn token(&self) -> &Token {
        if let Some(granted) = &self.held.granted {
            granted.pin();
        }
        &self.held.token
    }

    /// The locked resources.
    pub fn resources(&self) -> &[String] {
        &self.held.resources
    }

    /// The locked resources, shared.
    pub(crate) fn held_resources(&self) -> &Arc<[String]> {
        &self.held.resources
    }

    /// The claim stamps of the grant.
    pub fn claims(&self) -> &[Claim] {
        &self.held.claims
    }

    /// The lock's fencing token, as [`Lock::fence`] gives it: the claims of every node that
    /// granted it. Pass it with each write to the protected resource (`docs/fencing.md`).
    ///
    /// `None` when the lock has no claims (`claim_stamps(false)`) or they cannot form a token.
    pub fn fence(&self) -> Option<fencing::FenceToken> {
        crate::lock::fence_of(self.held.granted.as_ref(), &self.held.claims)
    }

    /// The lock's fencing token once every node has answered the acquire, as
    /// [`Lock::fence_settled`] gives it: fence the first write with this.
    ///
    /// # Cancel safety
    /// Safe: it only waits.
    pub async fn fence_settled(&self) -> Option<fencing::FenceToken> {
        crate::lock::settle_grants(self.held.granted.as_ref()).await;
        self.fence()
    }

    /// The lock's TTL: what every node was given, and what every renewal re-arms.
    pub fn ttl(&self) -> Duration {
        self.held.ttl
    }
}

/// A lock that renews itself until it is released, lost, or held for `max_hold`.
///
/// Release it with [`LockGuard::release`]. Dropping a guard stops renewal and releases the lock
/// in the background — best effort: it needs a running tokio runtime, and nothing reports
/// whether it worked (the keys expire with their TTL otherwise).
#[must_use = "dropping a LockGuard releases the lock at once"]
pub struct LockGuard {
    lease: Lease,
    core: Arc<dyn Releaser>,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockGuard").field(&self.lease).finish()
    }
}

impl std::ops::Deref for LockGuard {
    type Target = Lease;
    fn deref(&self) -> &Lease {
        &self.lease
    }
}

impl LockGuard {
    /// A guard of `held`, released through `core`.
    pub(crate) fn new(held: Arc<Held>, core: Arc<dyn Releaser>) -> Self {
        Self {
            lease: Lease { held },
            core,
            released: false,
        }
    }

    /// A cloneable view for the code doing the work.
    pub fn lease(&self) -> Lease {
        self.lease.clone()
    }

    /// Stops renewal, fires the lost signal with [`LostReason::Released`], then releases the
    /// lock (owner-checked) — in that order, so a renewal racing the release can only extend our
    /// own key, never bring it back.
    ///
    /// # Errors
    /// As [`Redlock::release`](crate::Redlock::release).
    ///
    /// # Cancel safety
    /// The deletes are sent by a background task; dropping the future does not stop them.
    pub async fn release(mut self) -> Result<ReleaseReport, Error> {
        self.released = true;
        let held = Arc::clone(&self.lease.held);
        self.core.finish(&held, LostReason::Released);
        self.core.release_held(held).await
    }

    /// Stops renewing and hands the lock back as a plain [`Lock`]: nothing is deleted, and the
    /// keys stay on the nodes until their TTL runs out (counted from the last renewal). For a
    /// job that must run at most once per time slot: keep the lock after the work so that no
    /// other worker runs the same slot again before it ends.
    ///
    /// The leases of this guard fire their lost signal with [`LostReason::RenewalStopped`]
    /// (they are views of a renewed lock, and it is no longer renewed). The returned lock keeps
    /// the validity of the last renewal ([`Lock::remaining`]); it can still be released early
    /// with [`Redlock::release`](crate::Redlock::release) or extended with
    /// [`Redlock::extend`](crate::Redlock::extend), and dropping it deletes nothing.
    ///
    /// A renewal already in flight when this is called may still land on the nodes and re-arm
    /// the TTL once more; the returned lock's validity does not count it (it never overstates).
    pub fn stop_renewal(mut self) -> Lock {
        self.released = true;
        let held = Arc::clone(&self.lease.held);
        self.core.finish(&held, LostReason::RenewalStopped);
        held.to_lock()
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let held = Arc::clone(&self.lease.held);
        self.core.finish(&held, LostReason::Released);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let core = Arc::clone(&self.core);
                let task = core.background();
                let release = async move {
                    let _task = task;
                    if let Err(e) = core.release_held(held).await {
                        tracing::warn!(error = %e, "background release of a dropped guard failed");
                    }
                };
                crate::engine::start_then_spawn(&rt, Box::pin(release));
            }
            Err(_) => tracing::warn!(
                "LockGuard dropped outside a tokio runtime; the lock expires with its TTL"
            ),
        }
    }
}

/// What a guard needs from its client, without naming the backend type.
pub(crate) trait Releaser: Send + Sync + 'static {
    /// Marks the lease done, stops its renewal and fires `reason`.
    fn finish(&self, held: &Arc<Held>, reason: LostReason);
    /// Counts a background task of the client until it is dropped (see
    /// [`crate::background`]).
    fn background(&self) -> Option<crate::background::Task>;
    /// Owner-checked release of the held lock.
    fn release_held(
        &self,
        held: Arc<Held>,
    ) -> futures_util::future::BoxFuture<'_, Result<ReleaseReport, Error>>;
}

#[cfg(test)]
impl Held {
    /// A lease of one key, valid until `valid_until`, as the renewal driver holds it.
    pub(crate) fn for_test(id: u64, valid_until: Deadline) -> Self {
        let now = Instant::now();
        Self {
            id,
            resources: Arc::from(vec!["r".to_owned()]),
            keys: Arc::from(vec!["lock:r".to_owned()]),
            token: Token::random().expect("entropy"),
            ttl: Duration::from_secs(10),
            min_validity: Duration::ZERO,
            origin: Arc::from("test"),
            granted: None,
            since: now,
            every: Duration::from_secs(3),
            claims: Vec::new(),
            valid_until: Mutex::new(valid_until),
            hold_until: now + Duration::from_secs(3600),
            lost: CancellationToken::new(),
            reason: OnceLock::new(),
            held_on: AtomicU64::new(0),
            round: AtomicU64::new(0),
            done: Mutex::new(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal decided after the lease's validity ran out, before the driver fired `Expired`
    /// (its timer a millisecond late, its task behind another): the lease stays lost. Its
    /// decision may count keys a renewal put back after the validity ran out, which say nothing
    /// of the time between — when another client could have taken the lock.
    #[test]
    fn a_renewal_decided_after_the_validity_ran_out_does_not_revive_the_lease() {
        let started = Deadline::clocks();
        let lease = Held::for_test(1, Deadline::after(started, Duration::ZERO));
        let renewal = Deadline::after(started, Duration::from_secs(9));
        assert_eq!(lease.renewed(renewal), Err(NotRenewed::Passed));
        assert!(lease.valid_until().passed());

        let lease = Held::for_test(1, Deadline::after(started, Duration::from_secs(5)));
        assert_eq!(lease.renewed(renewal), Ok(()));
        assert_eq!(lease.valid_until(), renewal);
    }

    /// A lease its holder stopped keeps the validity it had: a renewal settling after that
    /// changes nothing, and does not end it as expired (a first version fired `Expired` then,
    /// which zeroed the validity of the lock `stop_renewal` had handed back; found in review).
    #[test]
    fn a_renewal_settling_after_stop_renewal_leaves_the_validity() {
        let started = Deadline::clocks();
        let before = Deadline::after(started, Duration::from_secs(5));
        let lease = Held::for_test(1, before);
        lease.fire(LostReason::RenewalStopped);
        let renewal = Deadline::after(started, Duration::from_secs(9));
        assert_eq!(lease.renewed(renewal), Err(NotRenewed::Ended));
        assert_eq!(lease.valid_until(), before);
    }
}
