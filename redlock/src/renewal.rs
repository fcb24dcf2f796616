//! The renewal driver: extends every guarded lock of a client in batches (one round trip per
//! node per tick), decides each lock at quorum like an `extend`, puts back keys a restarted node
//! lost, and fires the lost signal of locks past their validity or max hold.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Batch, BatchEntry, Op, Renewed};
use crate::config::Config;
use crate::det::HashMap;
use crate::engine::{self, Decision, Judge};
use crate::error::{Error, LostReason, NodeError, NodeOutcome, Phase};
use crate::lease::Held;
use crate::lock::{self, Deadline, Lock};
use crate::telemetry;

/// Locks per batched renewal call; keeps one script call on a node short (~1–2 ms).
const BATCH_CHUNK: usize = 1000;

/// What the renewal driver works with: the client's nodes and settings, and the book of its
/// guarded locks. Held by the client; the driver holds it weakly and ends with the client.
pub(crate) struct Renewer<B> {
    backend: Arc<B>,
    config: Config,
    renewals: Arc<Renewals>,
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
    /// When the driver will look again by itself; a new lock due later need not wake it.
    next_wake: Option<Instant>,
}

impl Renewals {
    fn lock(&self) -> std::sync::MutexGuard<'_, RenewState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remove(&self, id: u64) {
        self.lock().entries.remove(&id);
    }
}

/// How often a lock of `ttl` is renewed, and the driver's tick for it.
fn cadence(ttl: Duration, renew_every: Option<Duration>) -> (Duration, Duration) {
    // A configured interval is the client's; a lock of a shorter TTL (taken by another client)
    // is still renewed at least twice per TTL.
    let every = renew_every.unwrap_or(ttl / 3).min(ttl / 2);
    (every, tick(every))
}

/// The driver's tick when the shortest renewal interval of its locks is `every`.
fn tick(every: Duration) -> Duration {
    (every / 8).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// When a lock valid until `valid_until` is next renewed: when its remaining validity has
/// dropped to `ttl − every` (so a fresh lock is renewed about `every` after it was taken, and a
/// lock with little validity left at once), 0–20 % of `every` early at random.
fn due_at(valid_until: &Deadline, ttl: Duration, every: Duration, now: Instant) -> Instant {
    let early: f64 = crate::det::range(0.0, 0.2);
    let lead = ttl.saturating_sub(every) + every.mul_f64(early);
    let deadline = now + valid_until.remaining();
    deadline.checked_sub(lead).map_or(now, |due| due.max(now))
}

/// After a renewal batch that reached no decision (too many nodes failed or were slow), the
/// lock is tried again this soon, as long as validity remains.
fn retry_gap(every: Duration, left: Duration) -> Duration {
    (every / 4).min(left / 4).max(Duration::from_millis(5))
}

impl<B: Backend> Renewer<B> {
    pub(crate) fn new(backend: Arc<B>, config: Config) -> Self {
        Self {
            backend,
            config,
            renewals: Arc::default(),
        }
    }

    /// Registers a lock for renewal, starting the renewal driver if needed. The first renewal
    /// is due from the lock's own validity and TTL.
    pub(crate) fn hold(self: &Arc<Self>, lock: Lock) -> Arc<Held> {
        let (every, _) = cadence(lock.ttl, self.config.renew_every);
        let now = Instant::now();
        let due = due_at(&lock.valid_until, lock.ttl, every, now);
        let held = Arc::new(Held {
            id: self.renewals.next_id.fetch_add(1, Ordering::Relaxed),
            resources: lock.resources,
            keys: lock.keys,
            token: lock.token,
            ttl: lock.ttl,
            min_validity: lock.min_validity,
            taker: lock.taker,
            origin: lock.origin,
            granted: lock.granted,
            since: now,
            every,
            claims: lock.claims,
            valid_until: Mutex::new(lock.valid_until),
            hold_until: crate::lock::far_after(now, self.config.max_hold),
            lost: CancellationToken::new(),
            reason: OnceLock::new(),
            done: Mutex::new(false),
        });
        let (start, wake) = {
            let mut st = self.renewals.lock();
            st.entries.insert(held.id, Arc::clone(&held));
            st.due.push(Reverse((due, held.id)));
            // Waking the driver costs a pass over every held lock: only when it would otherwise
            // look too late (a burst of 20,000 guards made that quadratic).
            let wake = st.next_wake.is_none_or(|w| due < w);
            (!std::mem::replace(&mut st.running, true), wake)
        };
        if start {
            // The flag travels with the task: if the task is dropped — even before it first
            // runs, when its runtime shuts down — the next guard starts a new driver.
            let running = DriverRunning {
                renewals: Arc::clone(&self.renewals),
                stopped: false,
            };
            tokio::spawn(drive(Arc::downgrade(self), running));
        } else if wake {
            self.renewals.wake.notify_one();
        }
        held
    }

    /// Marks the lease done, stops its renewal and fires `reason`.
    pub(crate) fn finish(&self, held: &Held, reason: LostReason) {
        *held.done.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.renewals.remove(held.id);
        held.fire(reason);
    }
}

/// The renewal driver: one per client while it has guarded locks. Each tick it fires the lost
/// signal of locks past their validity or max hold, and renews every lock due within the next
/// tick in one batched call per node (in a spawned task, so a slow node cannot delay the
/// expiry checks).
async fn drive<B: Backend>(renewer: Weak<Renewer<B>>, mut running: DriverRunning) {
    let epoch = Instant::now();
    loop {
        let Some(renewer) = renewer.upgrade() else {
            running.stop();
            return;
        };
        // One reading of the clocks for every lock: the driver checks all of them per wake.
        let (now, boot) = Deadline::clocks();
        let mut due = Vec::new();
        let wake_at = {
            let mut st = renewer.renewals.lock();
            let mut wake_at = None::<Instant>;
            let mut shortest = None::<Duration>;
            st.entries.retain(|_, held| {
                if held.is_done() {
                    return false;
                }
                if now >= held.hold_until {
                    held.fire(LostReason::MaxHold);
                    return false;
                }
                if held.lost.is_cancelled() {
                    return false;
                }
                let valid_until = held.valid_until();
                if valid_until.remaining_at(now, boot).is_zero() {
                    held.fire(LostReason::Expired);
                    return false;
                }
                let soonest = valid_until.mono().min(held.hold_until);
                wake_at = Some(wake_at.map_or(soonest, |w| w.min(soonest)));
                shortest = Some(shortest.map_or(held.every, |s| s.min(held.every)));
                true
            });
            let Some(shortest) = shortest else {
                st.due.clear();
                st.running = false;
                st.next_wake = None;
                drop(st);
                running.disarm();
                return;
            };
            // Renewals run on tick boundaries only, each taking everything due before the tick
            // ends (renewing up to one tick early, never late): however often the driver wakes,
            // a node sees one batch per tick. The tick follows the shortest renewal interval.
            let tick = tick(shortest);
            let ticks = (now - epoch).as_nanos() / tick.as_nanos().max(1) + 1;
            // In nanoseconds: a `u32` count of 5 ms ticks would run out after 248 days.
            let tick_end = epoch
                + Duration::from_nanos(
                    u64::try_from(ticks.saturating_mul(tick.as_nanos())).unwrap_or(u64::MAX),
                );
            while let Some(Reverse((at, id))) = st.due.peek().copied() {
                if at > tick_end {
                    break;
                }
                st.due.pop();
                if let Some(held) = st.entries.get(&id) {
                    due.push(Arc::clone(held));
                }
            }
            let wake = wake_at.map_or(tick_end, |w| w.min(tick_end));
            st.next_wake = Some(wake);
            wake
        };
        if !due.is_empty() {
            let r = Arc::clone(&renewer);
            tokio::spawn(async move { r.renew(due).await });
        }
        let renewals = Arc::clone(&renewer.renewals);
        drop(renewer);
        let wake = renewals.wake.notified();
        crate::det::select! {
            () = wake => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }
}

/// Marks the renewal driver as gone when its task ends without saying so itself — dropped with
/// its runtime — so that the next `guard()` starts a new one instead of waking nobody.
struct DriverRunning {
    renewals: Arc<Renewals>,
    stopped: bool,
}

impl DriverRunning {
    /// The driver cleared the flag itself (under the state lock); nothing to undo.
    fn disarm(&mut self) {
        self.stopped = true;
    }

    /// The driver ends now: clear the flag.
    fn stop(&mut self) {
        self.renewals.lock().running = false;
        self.stopped = true;
    }
}

impl Drop for DriverRunning {
    fn drop(&mut self) {
        if !self.stopped {
            self.renewals.lock().running = false;
        }
    }
}

/// What one node said about each lock of a batch.
type BatchAnswer = Result<Result<Vec<Renewed>, NodeError>, tokio::time::error::Elapsed>;

impl<B: Backend> Renewer<B> {
    /// Renews `locks` in batches of one call per node, each decided at quorum like an `extend`,
    /// and reschedules, retries or fires each lock.
    async fn renew(self: Arc<Self>, locks: Vec<Arc<Held>>) {
        for chunk in locks.chunks(BATCH_CHUNK) {
            self.renew_batch(chunk).await;
        }
    }

    async fn renew_batch(&self, chunk: &[Arc<Held>]) {
        let started = Instant::now();
        let (now, boot) = Deadline::clocks();
        telemetry::renewal_started(
            chunk
                .iter()
                .map(|h| h.valid_until().remaining_at(now, boot))
                .min(),
        );
        let batch = Arc::new(Batch {
            locks: chunk
                .iter()
                .map(|h| BatchEntry {
                    keys: Arc::clone(&h.keys),
                    token: h.token.clone(),
                    ttl_ms: lock::ttl_ms(h.ttl),
                })
                .collect(),
        });
        let n = self.backend.len();
        let quorum = engine::quorum(n);
        let Some(shortest_ttl) = chunk.iter().map(|h| h.ttl).min() else {
            return;
        };
        // A batch is one script doing work for every lock in it: allow it more than one
        // request's node timeout (a tight bound turned a busy moment into lost locks), but
        // never a quarter of the shortest TTL. A node still being connected gets no more, and
        // the batch is decided at quorum: a hung or connecting minority is not waited for.
        let per_lock = Duration::from_micros(20) * u32::try_from(chunk.len()).unwrap_or(u32::MAX);
        let node_timeout = self.config.node_timeout;
        let mut calls: FuturesUnordered<_> = (0..n)
            .map(|i| {
                let budget = (node_timeout * 2 + per_lock)
                    .min(shortest_ttl / 4)
                    .max(node_timeout);
                let call = engine::handed_over(self.backend.extend_many(i, Arc::clone(&batch)));
                async move { (i, tokio::time::timeout(budget, call).await) }
            })
            .collect();
        let m = chunk.len();
        let mut outcomes = vec![vec![NodeOutcome::Pending; n]; m];
        let mut missing: Vec<Vec<usize>> = vec![Vec::new(); m];
        let mut yes = vec![0usize; m];
        let mut decided: Vec<Option<(bool, Duration)>> = vec![None; m];
        let mut undecided = m;
        let mut pending = n;
        // Decide each lock as soon as its quorum outcome is known; a hung or slow minority node
        // is not waited for.
        while undecided > 0 {
            let Some((i, answer)) = calls.next().await else {
                break;
            };
            pending -= 1;
            let answer: &BatchAnswer = &answer;
            for j in 0..m {
                let outcome = match answer {
                    Ok(Ok(v)) => match v.get(j) {
                        Some(Renewed::Extended) => NodeOutcome::Granted,
                        Some(Renewed::Missing) => {
                            missing[j].push(i);
                            NodeOutcome::Refused
                        }
                        _ => NodeOutcome::Refused,
                    },
                    Ok(Err(e)) => NodeOutcome::Failed(e.clone()),
                    Err(_) => NodeOutcome::TimedOut,
                };
                yes[j] += usize::from(outcome == NodeOutcome::Granted);
                outcomes[j][i] = outcome;
                if decided[j].is_none()
                    && let Some(ok) = engine::verdict(yes[j], pending, quorum)
                {
                    decided[j] = Some((ok, started.elapsed()));
                    undecided -= 1;
                }
            }
        }
        drop(calls);
        telemetry::renewal_round(started.elapsed());
        let now = Instant::now();
        let mut rescheduled = Vec::new();
        let mut renewed = 0u64;
        for (j, held) in chunk.iter().enumerate() {
            let (ok, elapsed) = decided[j].unwrap_or((false, started.elapsed()));
            let decision = Decision {
                success: ok,
                outcomes: std::mem::take(&mut outcomes[j]),
                claims: Vec::new(),
                positive: yes[j],
                needed: quorum,
            };
            // The lock's own TTL: the one this batch sent the nodes.
            let result = Judge::new(Phase::Extend, &held.resources, held.ttl, &self.config)
                .min_validity(held.min_validity)
                .judge(&decision, &*self.backend, elapsed);
            renewed += u64::from(result.is_ok());
            if held.is_done() || held.lost.is_cancelled() {
                continue;
            }
            match result {
                Ok(valid_for) => {
                    let deadline = Deadline::after(started, valid_for);
                    *held
                        .valid_until
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = deadline;
                    rescheduled.push((due_at(&deadline, held.ttl, held.every, now), held.id));
                    self.repair(held, &missing[j]);
                }
                // The key is held by another token on too many nodes: definitely lost.
                Err(error @ Error::Lost { .. }) => {
                    held.fire(LostReason::ExtendFailed(Box::new(error)));
                    self.renewals.remove(held.id);
                }
                // Unknown (nodes failed or were slow): try again while validity remains; the
                // driver fires `Expired` at the deadline if no renewal gets through by then.
                Err(error) => {
                    let left = held.valid_until().remaining();
                    tracing::debug!(token = %held.token, %error, ?left, "renewal failed; retrying within the validity");
                    rescheduled.push((now + retry_gap(held.every, left), held.id));
                }
            }
        }
        telemetry::renewal_outcomes(renewed, chunk.len() as u64 - renewed);
        let mut st = self.renewals.lock();
        for (at, id) in rescheduled {
            if st.entries.contains_key(&id) {
                st.due.push(Reverse((at, id)));
            }
        }
        drop(st);
        self.renewals.wake.notify_one();
    }

    /// Puts back the keys of a lock that nodes lost (found missing by a renewal that reached
    /// its quorum): each such node gets an owner-checked `SET NX` of the lock's keys, as a
    /// grant — refused when anyone else holds them, and not sent to a node in its restart
    /// quarantine. The lock regains the redundancy a restart took.
    fn repair(&self, held: &Arc<Held>, nodes: &[usize]) {
        if nodes.is_empty() {
            return;
        }
        let op = Arc::new(Op::Acquire {
            stamped: false,
            keys: Arc::clone(&held.keys),
            token: held.token.clone(),
            ttl_ms: lock::ttl_ms(held.ttl),
            rearm: true,
        });
        // Handed over under the `done` lock: a release is either sent after the repair, on the
        // same connections (so it deletes what the repair set), or the repair is not sent.
        let done = held.done.lock().unwrap_or_else(PoisonError::into_inner);
        if *done {
            return;
        }
        for &i in nodes {
            let call = engine::handed_over(self.backend.call(i, Arc::clone(&op)));
            let node = self.backend.name(i).clone();
            let budget = self.config.node_timeout;
            tokio::spawn(async move {
                match tokio::time::timeout(budget + engine::DELIVERY_GRACE, call).await {
                    Ok(Ok(crate::backend::Reply::Yes { .. })) => {
                        tracing::debug!(%node, "renewal put back keys the node had lost");
                    }
                    Ok(Ok(_)) => {
                        tracing::debug!(%node, "keys lost by the node are held by another owner there")
                    }
                    Ok(Err(e)) => tracing::debug!(%node, error = %e, "repair not done"),
                    Err(_) => tracing::debug!(%node, "repair timed out"),
                }
            });
        }
        drop(done);
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
    fn renewals_are_due_from_the_remaining_validity() {
        let now = Instant::now();
        let ttl = Duration::from_secs(3);
        let every = Duration::from_secs(1);
        for _ in 0..1000 {
            // A fresh lock (all of its TTL left) is due about `every` from now, never late.
            let fresh = Deadline::after(now, ttl);
            let at = due_at(&fresh, ttl, every, now);
            assert!(
                at > now + Duration::from_millis(790) && at <= now + every,
                "{at:?}"
            );
            // A lock with less than `ttl − every` left is due at once.
            let late = Deadline::after(now, Duration::from_millis(700));
            assert_eq!(due_at(&late, ttl, every, now), now);
        }
    }

    #[test]
    fn a_lock_with_a_shorter_ttl_is_renewed_at_least_twice_per_ttl() {
        let (every, _) = cadence(Duration::from_secs(1), Some(Duration::from_secs(5)));
        assert_eq!(every, Duration::from_millis(500));
    }
}
