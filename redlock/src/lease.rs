//! Leases: [`LockGuard`], the shareable [`Lease`] view, the lost signal, and the renewal driver
//! that extends every held lock of a `Redlock` in batches (one round trip per node per tick).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Batch};
use crate::client::Core;
use crate::engine;
use crate::error::{Error, NodeOutcome, NodeReport, Phase};
use crate::lock::{Claim, Lock};
use crate::token::Token;

/// Locks per batched renewal call; keeps one script call on a node short (~1–2 ms).
const BATCH_CHUNK: usize = 1000;

/// Why a lease's lost signal fired.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LostReason {
    /// The validity deadline passed without a successful extension.
    Expired,
    /// An extension did not reach a quorum (or found the lock taken over).
    ExtendFailed(Box<Error>),
    /// The configured maximum hold time was reached; renewal stopped.
    MaxHold,
    /// The lock was released (or its guard dropped).
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Expired => f.write_str("validity deadline passed without a successful extension"),
            Self::ExtendFailed(e) => write!(f, "extension failed: {e}"),
            Self::MaxHold => f.write_str("maximum hold time reached"),
            Self::Released => f.write_str("released"),
        }
    }
}

/// State shared by a guard, its leases and the renewal driver.
pub(crate) struct Held {
    id: u64,
    pub(crate) resources: Arc<[String]>,
    pub(crate) keys: Arc<[String]>,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    claims: Vec<Claim>,
    valid_until: Mutex<Instant>,
    hold_until: Instant,
    lost: CancellationToken,
    reason: OnceLock<LostReason>,
    done: AtomicBool,
}

impl Held {
    fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the first reason and fires the signal (later reasons are ignored).
    fn fire(&self, reason: LostReason) {
        if self.reason.set(reason).is_ok() {
            tracing::debug!(token = %self.token, reason = %self.reason.get().map(ToString::to_string).unwrap_or_default(), "lease lost");
        }
        self.lost.cancel();
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
    /// # Cancel safety
    /// Safe: it only observes the signal.
    pub async fn lost(&self) -> LostReason {
        self.held.lost.cancelled().await;
        self.reason().unwrap_or(LostReason::Released)
    }

    /// The same signal as a [`CancellationToken`], to pass into code that already uses one.
    /// Cancelling it yourself does not release the lock.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.held.lost.child_token()
    }

    /// Whether the signal has fired.
    pub fn is_lost(&self) -> bool {
        self.held.lost.is_cancelled()
    }

    /// The reason, once the signal has fired.
    pub fn reason(&self) -> Option<LostReason> {
        self.held.reason.get().cloned()
    }

    /// Local validity deadline after the last successful extension.
    pub fn valid_until(&self) -> std::time::Instant {
        self.held.valid_until().into_std()
    }

    /// Validity left now; zero once lost.
    pub fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.held
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// The lock's token (redacted in `Debug`).
    pub fn token(&self) -> &Token {
        &self.held.token
    }

    /// The locked resources.
    pub fn resources(&self) -> &[String] {
        &self.held.resources
    }

    /// The claim stamps of the grant.
    pub fn claims(&self) -> &[Claim] {
        &self.held.claims
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
    pub async fn release(mut self) -> Result<crate::ReleaseReport, Error> {
        self.released = true;
        let held = Arc::clone(&self.lease.held);
        self.core.finish(&held);
        self.core.release_held(held).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let held = Arc::clone(&self.lease.held);
        self.core.finish(&held);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let core = Arc::clone(&self.core);
                rt.spawn(async move {
                    if let Err(e) = core.release_held(held).await {
                        tracing::warn!(error = %e, "background release of a dropped guard failed");
                    }
                });
            }
            Err(_) => tracing::warn!(
                "LockGuard dropped outside a tokio runtime; the lock expires with its TTL"
            ),
        }
    }
}

/// What a guard needs from its client, without naming the backend type.
pub(crate) trait Releaser: Send + Sync + 'static {
    /// Marks the lease done, stops its renewal and fires `Released`.
    fn finish(&self, held: &Arc<Held>);
    /// Owner-checked release of the held lock.
    fn release_held(
        &self,
        held: Arc<Held>,
    ) -> futures_util::future::BoxFuture<'_, Result<crate::ReleaseReport, Error>>;
}

impl<B: Backend> Releaser for Core<B> {
    fn finish(&self, held: &Arc<Held>) {
        held.done.store(true, Ordering::SeqCst);
        self.renewals.remove(held.id);
        held.fire(LostReason::Released);
    }

    fn release_held(
        &self,
        held: Arc<Held>,
    ) -> futures_util::future::BoxFuture<'_, Result<crate::ReleaseReport, Error>> {
        Box::pin(async move {
            self.release_parts(&held.resources, &held.keys, &held.token)
                .await
        })
    }
}

/// Book-keeping of the renewal driver: every guarded lock, and when each is next due.
#[derive(Default)]
pub(crate) struct Renewals {
    state: Mutex<RenewState>,
    wake: Notify,
    next_id: AtomicU64,
}

#[derive(Default)]
struct RenewState {
    entries: HashMap<u64, Arc<Held>>,
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    running: bool,
}

impl Renewals {
    fn lock(&self) -> std::sync::MutexGuard<'_, RenewState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remove(&self, id: u64) {
        self.lock().entries.remove(&id);
    }
}

/// The renewal interval and the driver's tick for a configuration.
fn cadence(ttl: Duration, renew_every: Option<Duration>) -> (Duration, Duration) {
    let every = renew_every.unwrap_or(ttl / 3);
    let tick = (every / 8).clamp(Duration::from_millis(5), Duration::from_secs(1));
    (every, tick)
}

/// When a lock renewed at `now` is next due: 0–20 % early, at random.
fn next_due(now: Instant, every: Duration) -> Instant {
    let early: f64 = rand::rng().random_range(0.0..0.2);
    now + every.mul_f64(1.0 - early)
}

impl<B: Backend> Core<B> {
    /// Turns a lock into a renewed guard, starting the renewal driver if needed.
    pub(crate) fn guard(self: &Arc<Self>, lock: Lock) -> LockGuard {
        let (every, _) = cadence(lock.ttl, self.config.renew_every);
        let now = Instant::now();
        let held = Arc::new(Held {
            id: self.renewals.next_id.fetch_add(1, Ordering::Relaxed),
            resources: lock.resources,
            keys: lock.keys,
            token: lock.token,
            ttl: lock.ttl,
            claims: lock.claims,
            valid_until: Mutex::new(lock.valid_until),
            hold_until: now + self.config.max_hold,
            lost: CancellationToken::new(),
            reason: OnceLock::new(),
            done: AtomicBool::new(false),
        });
        let start = {
            let mut st = self.renewals.lock();
            st.entries.insert(held.id, Arc::clone(&held));
            st.due.push(Reverse((next_due(now, every), held.id)));
            !std::mem::replace(&mut st.running, true)
        };
        if start {
            tokio::spawn(drive(Arc::downgrade(self)));
        } else {
            self.renewals.wake.notify_one();
        }
        LockGuard {
            lease: Lease { held },
            core: Arc::clone(self) as Arc<dyn Releaser>,
            released: false,
        }
    }
}

/// The renewal driver: one per client while it has guarded locks. Each tick it fires the lost
/// signal of locks past their validity or max hold, and renews every lock due within the next
/// tick in one batched call per node (in a spawned task, so a slow node cannot delay the
/// expiry checks).
async fn drive<B: Backend>(core: Weak<Core<B>>) {
    let epoch = Instant::now();
    loop {
        let Some(core) = core.upgrade() else { return };
        let (every, tick) = cadence(core.config.ttl, core.config.renew_every);
        let now = Instant::now();
        // Renewals run on tick boundaries only, each taking everything due before the tick
        // ends (renewing up to one tick early, never late): however often the driver wakes,
        // a node sees one batch per tick.
        let ticks = (now - epoch).as_nanos() / tick.as_nanos().max(1) + 1;
        let tick_end = epoch + tick * u32::try_from(ticks).unwrap_or(u32::MAX);
        let mut due = Vec::new();
        let wake_at = {
            let mut st = core.renewals.lock();
            let mut wake_at = tick_end;
            st.entries.retain(|_, held| {
                if held.done.load(Ordering::SeqCst) {
                    return false;
                }
                if now >= held.hold_until {
                    held.fire(LostReason::MaxHold);
                    return false;
                }
                let valid_until = held.valid_until();
                if now >= valid_until {
                    held.fire(LostReason::Expired);
                    return false;
                }
                wake_at = wake_at.min(valid_until).min(held.hold_until);
                true
            });
            if st.entries.is_empty() {
                st.due.clear();
                st.running = false;
                return;
            }
            while let Some(Reverse((at, id))) = st.due.peek().copied() {
                if at > tick_end {
                    break;
                }
                st.due.pop();
                if let Some(held) = st.entries.get(&id) {
                    due.push(Arc::clone(held));
                }
            }
            wake_at
        };
        if !due.is_empty() {
            let c = Arc::clone(&core);
            tokio::spawn(async move { c.renew(due, every).await });
        }
        let renewals = Arc::clone(&core.renewals);
        drop(core);
        let wake = renewals.wake.notified();
        tokio::select! {
            () = wake => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }
}

impl<B: Backend> Core<B> {
    /// Extends `locks` with one call per node (per chunk) and reschedules or fires each.
    async fn renew(self: Arc<Self>, locks: Vec<Arc<Held>>, every: Duration) {
        for chunk in locks.chunks(BATCH_CHUNK) {
            let started = Instant::now();
            let batch = Arc::new(Batch {
                ttl_ms: u64::try_from(self.config.ttl.as_millis()).unwrap_or(u64::MAX),
                locks: chunk
                    .iter()
                    .map(|h| (Arc::clone(&h.keys), h.token.clone()))
                    .collect(),
            });
            let n = self.backend.len();
            // A batch is one script doing work for every lock in it, and the renewal starts
            // with most of the validity left: allow it more than one request's node timeout
            // (a tight bound turned a busy moment into lost locks), but never a quarter TTL.
            let per_lock =
                Duration::from_micros(20) * u32::try_from(chunk.len()).unwrap_or(u32::MAX);
            let budget = |i: usize| {
                (self.backend.budget(i) * 2 + per_lock)
                    .min(self.config.ttl / 4)
                    .max(self.backend.budget(i))
            };
            let answers = join_all((0..n).map(|i| {
                let call = self.backend.extend_many(i, Arc::clone(&batch));
                tokio::time::timeout(budget(i), call)
            }))
            .await;
            let elapsed = started.elapsed();
            let quorum = engine::quorum(n);
            let now = Instant::now();
            let mut rescheduled = Vec::new();
            for (j, held) in chunk.iter().enumerate() {
                let outcome = |i: usize| match &answers[i] {
                    Ok(Ok(v)) if v.get(j) == Some(&true) => NodeOutcome::Granted,
                    Ok(Ok(_)) => NodeOutcome::Refused,
                    Ok(Err(e)) => NodeOutcome::Failed(e.clone()),
                    Err(_) => NodeOutcome::TimedOut,
                };
                let outcomes: Vec<NodeOutcome> = (0..n).map(outcome).collect();
                let yes = outcomes
                    .iter()
                    .filter(|o| **o == NodeOutcome::Granted)
                    .count();
                let refused = outcomes
                    .iter()
                    .filter(|o| **o == NodeOutcome::Refused)
                    .count();
                crate::telemetry::extend_done(yes >= quorum);
                if held.done.load(Ordering::SeqCst) {
                    continue;
                }
                let validity = engine::validity(held.ttl, elapsed, self.config.drift_factor);
                match validity {
                    Some(left) if yes >= quorum && left > self.config.min_validity => {
                        *held
                            .valid_until
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner) = started + elapsed + left;
                        rescheduled.push((next_due(now, every), held.id));
                    }
                    _ => {
                        let nodes: Vec<NodeReport> = outcomes
                            .into_iter()
                            .enumerate()
                            .map(|(i, outcome)| NodeReport {
                                node: self.backend.name(i).clone(),
                                outcome,
                            })
                            .collect();
                        let error = if yes >= quorum {
                            Error::ValidityExhausted {
                                phase: Phase::Extend,
                                elapsed,
                                ttl: held.ttl,
                                drift: engine::drift(held.ttl, self.config.drift_factor),
                                min_validity: self.config.min_validity,
                            }
                        } else if refused > n - quorum {
                            Error::Lost {
                                held: yes,
                                required: quorum,
                                nodes,
                            }
                        } else {
                            Error::QuorumUnreachable {
                                phase: Phase::Extend,
                                granted: yes,
                                required: quorum,
                                nodes,
                            }
                        };
                        held.fire(LostReason::ExtendFailed(Box::new(error)));
                        self.renewals.remove(held.id);
                    }
                }
            }
            let mut st = self.renewals.lock();
            for (at, id) in rescheduled {
                if st.entries.contains_key(&id) {
                    st.due.push(Reverse((at, id)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cadence_defaults_to_a_third_of_the_ttl() {
        let (every, tick) = cadence(Duration::from_secs(9), None);
        assert_eq!(every, Duration::from_secs(3));
        assert_eq!(tick, Duration::from_millis(375));
        let (_, tick) = cadence(Duration::from_millis(30), None);
        assert_eq!(tick, Duration::from_millis(5));
    }

    #[test]
    fn renewals_are_scheduled_early_never_late() {
        let now = Instant::now();
        for _ in 0..1000 {
            let at = next_due(now, Duration::from_secs(1));
            assert!(at > now + Duration::from_millis(799) && at <= now + Duration::from_secs(1));
        }
    }
}
