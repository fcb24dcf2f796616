//! The renewal driver: extends every guarded lock of a client in batches (one round trip per
//! node per tick), decides each lock at quorum like an `extend`, puts back keys a restarted node
//! lost, and fires the lost signal of locks past their validity or max hold.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, btree_map, hash_map};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
use crate::error::{Error, LostReason, NodeError, NodeErrorKind, NodeOutcome, Phase};
use crate::lease::{Held, NotRenewed};
use crate::lock::{self, Deadline, Lock};
use crate::telemetry;

/// Locks per batched renewal call; keeps one script call on a node short (~1–2 ms).
const BATCH_CHUNK: usize = 1000;

/// Locks a client's renewal calls may have in flight at once (each call goes to every node).
/// Many, so that over a slow link the calls of a round do not wait for one another (6,000 locks
/// at a 400 ms round trip, renewed every 667 ms, need them all in flight together); not too
/// many, so that a node works through at most this much renewal work (about 10 ms) before it
/// gets to an acquire that arrived meanwhile — 100,000 locks sent at once held every node long
/// enough that acquires timed out.
const RENEWAL_WINDOW: usize = 8 * BATCH_CHUNK;

/// At most this much renewal work (by the nodes' own measure, see [`Backend::renewal_cost`]) is
/// sent ahead of what the nodes have had time to run; a fifth of the node timeout when that is
/// less. Renewal calls share the connection with acquires and releases, and a node runs a
/// connection's requests in order: a round sent all at once (the whole window) kept every
/// acquire made meanwhile waiting behind it — with 100,000 locks held on five nodes sharing two
/// cores, long enough that all 64 acquires in flight timed out at each round. Paced, the calls
/// go out at the rate the nodes run them, so an acquire waits behind about this much; over a
/// slow link they are still all in flight together (the pace is the server's, not the link's).
/// Test `renewal_pacing::acquires_do_not_queue_behind_a_round_of_renewals`.
const PACE_BACKLOG: Duration = Duration::from_millis(10);

/// What the renewal driver works with: the client's nodes and settings, and the book of its
/// guarded locks. Held by the client; the driver holds it weakly and ends with the client.
pub(crate) struct Renewer<B> {
    backend: Arc<B>,
    config: Config,
    renewals: Arc<Renewals>,
    /// [`RENEWAL_WINDOW`] places for locks in renewal calls, shared by every round (fair: first
    /// come, first served).
    window: tokio::sync::Semaphore,
    /// When the nodes will have run the renewal work sent so far, at the pace they reported
    /// (see [`PACE_BACKLOG`]).
    paced_until: Mutex<Option<Instant>>,
}

/// Book-keeping of the renewal driver: every guarded lock, and when each is next due.
#[derive(Default)]
pub(crate) struct Renewals {
    state: Mutex<RenewState>,
    wake: Notify,
    next_id: AtomicU64,
    /// Numbers the renewal rounds (see [`Held::round`]); 0 is no round.
    next_round: AtomicU64,
}

/// The driver's work per wake is proportional to what is due or ending then, never to the
/// number of held locks: renewals wait in a heap by due time, and every lock's end (validity
/// or max hold, whichever is first) is kept in an ordered set, moved when a renewal moves it.
#[derive(Default)]
struct RenewState {
    entries: HashMap<u64, Entry>,
    /// Renewals by due time; an id no longer in `entries` is skipped.
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Every held lock's end on the monotonic clock, exactly one per entry.
    ends: BTreeSet<(Instant, u64)>,
    /// How many held locks renew at each interval: the shortest sets the driver's tick.
    intervals: BTreeMap<Duration, usize>,
    /// The runtimes a driver runs on: one on each runtime that made a guard while it had none
    /// (see [`Renewer::hold`]).
    drivers: Vec<tokio::runtime::Id>,
    /// Where the drivers count their ticks from, so that together they still run one round per
    /// tick: set by the first driver, kept for the client's life.
    epoch: Option<Instant>,
    /// When a driver will look again by itself; a new lock due later need not wake one.
    next_wake: Option<Instant>,
    /// The latest held lock on each key, by the key's hash (see [`RenewState::holder`]).
    by_key: HashMap<u64, u64>,
}

/// A key's place in [`RenewState::by_key`]: a hash, so that the index keeps no copy of the key.
fn key_hash(key: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<hash_map::DefaultHasher>::default().hash_one(key)
}

struct Entry {
    held: Arc<Held>,
    /// Where this lock sits in `ends`.
    end: Instant,
}

/// When a held lock ends unless renewed: its validity or its max hold, whichever is first.
fn end_of(held: &Held) -> Instant {
    held.valid_until().mono().min(held.hold_until)
}

impl RenewState {
    fn insert(&mut self, held: Arc<Held>, due: Instant) {
        let (id, end) = (held.id, end_of(&held));
        *self.intervals.entry(held.every).or_default() += 1;
        self.due.push(Reverse((due, id)));
        self.ends.insert((end, id));
        for key in held.keys.iter() {
            self.by_key.insert(key_hash(key), id);
        }
        self.entries.insert(id, Entry { held, end });
    }

    fn remove(&mut self, id: u64) {
        let Some(entry) = self.entries.remove(&id) else {
            return;
        };
        self.ends.remove(&(entry.end, id));
        for key in entry.held.keys.iter() {
            if let hash_map::Entry::Occupied(at) = self.by_key.entry(key_hash(key))
                && *at.get() == id
            {
                at.remove();
            }
        }
        if let btree_map::Entry::Occupied(mut count) = self.intervals.entry(entry.held.every) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
    }

    /// Moves a renewed lock's end to `end`.
    fn set_end(&mut self, id: u64, end: Instant) {
        if let Some(entry) = self.entries.get_mut(&id)
            && entry.end != end
        {
            self.ends.remove(&(entry.end, id));
            self.ends.insert((end, id));
            entry.end = end;
        }
    }

    /// The guarded lock of this client that holds `key`, if one does and has not ended.
    fn holder(&self, key: &str) -> Option<&Arc<Held>> {
        let id = self.by_key.get(&key_hash(key))?;
        let held = &self.entries.get(id)?.held;
        let live = !held.is_done() && !held.lost.is_cancelled();
        (live && held.keys.iter().any(|k| k == key)).then_some(held)
    }

    /// Fires the lost signal of `id` if it is past its validity or max hold, and forgets it
    /// if it is lost, released or dropped; otherwise puts its end where it now is.
    fn check(&mut self, id: u64, now: Instant, boot: Option<Duration>) {
        let Some(entry) = self.entries.get(&id) else {
            return;
        };
        let held = &entry.held;
        let reason = if held.is_done() || held.lost.is_cancelled() {
            None
        } else if now >= held.hold_until {
            Some(LostReason::MaxHold)
        } else if held.valid_until().remaining_at(now, boot).is_zero() {
            Some(LostReason::Expired)
        } else {
            let end = end_of(held);
            self.set_end(id, end);
            return;
        };
        if let Some(reason) = reason {
            held.fire(reason);
        }
        self.remove(id);
    }
}

impl Renewals {
    fn lock(&self) -> std::sync::MutexGuard<'_, RenewState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes every driver, and the next one to wait if none waits now: a driver whose runtime
    /// is not running (a current-thread runtime between `block_on` calls) cannot act on a
    /// wake-up, and `notify_one` woke the driver that had waited longest — that one (found in
    /// review).
    fn wake_drivers(&self) {
        self.wake.notify_waiters();
        self.wake.notify_one();
    }

    fn remove(&self, id: u64) {
        self.lock().remove(id);
    }
}

/// Whether the boot clock ran ahead of the monotonic one between two readings: the machine was
/// suspended, and a lock may have run out on the boot clock before its monotonic end.
fn suspended(before: (Instant, Option<Duration>), now: (Instant, Option<Duration>)) -> bool {
    match (before.1, now.1) {
        (Some(b0), Some(b1)) => {
            b1.saturating_sub(b0) > now.0.saturating_duration_since(before.0) + SUSPEND_SLACK
        }
        _ => false,
    }
}

/// How far the boot clock may run ahead of the monotonic one between two readings before the
/// driver counts it as a suspend (the two are read a few nanoseconds apart).
const SUSPEND_SLACK: Duration = Duration::from_millis(2);

/// The most validity a renewal of a lock of `ttl` can leave: its TTL less the drift allowance.
fn renewed_validity(ttl: Duration, drift_factor: f64) -> Duration {
    engine::validity(ttl, Duration::ZERO, drift_factor).unwrap_or_default()
}

/// How often a lock of `ttl` is renewed, and the driver's tick for it.
fn cadence(
    ttl: Duration,
    drift_factor: f64,
    renew_every: Option<Duration>,
) -> (Duration, Duration) {
    // A configured interval is the client's; a lock of a shorter TTL (taken by another client)
    // is still renewed at least twice per validity a renewal leaves. Half of the TTL used to be
    // the bound: with a drift allowance above the interval, a renewed lock was due again at
    // once (test `leases::renewals_keep_their_interval_with_a_large_drift_factor`).
    let every = renew_every
        .unwrap_or(ttl / 3)
        .min(renewed_validity(ttl, drift_factor) / 2);
    (every, tick(every))
}

/// The driver's tick when the shortest renewal interval of its locks is `every`.
fn tick(every: Duration) -> Duration {
    (every / 8).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// When a lock valid until `valid_until` is next renewed: when its remaining validity has
/// dropped to `renewed − every`, where `renewed` is the most validity a renewal leaves (so a
/// fresh or just renewed lock is renewed about `every` after it was taken, and a lock with
/// little validity left at once), 0–20 % of `every` early at random.
fn due_at(valid_until: &Deadline, renewed: Duration, every: Duration, now: Instant) -> Instant {
    let early: f64 = crate::det::range(0.0, 0.2);
    let lead = renewed.saturating_sub(every) + every.mul_f64(early);
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
            window: tokio::sync::Semaphore::new(RENEWAL_WINDOW),
            paced_until: Mutex::new(None),
        }
    }

    /// Registers a lock for renewal, starting a renewal driver on the current runtime if none
    /// runs there. The first renewal is due from the lock's own validity and TTL.
    ///
    /// One driver per runtime that makes guards, not one per client: a driver is a task of its
    /// runtime and ends with it. With one per client, a guard made on a second runtime while
    /// the first one's driver ran was never renewed again once the first runtime ended, and
    /// its lost signal never fired (test `lifecycle::a_guard_on_a_second_runtime_is_renewed_
    /// after_the_first_runtime_ends`). The drivers share the book: each takes what is due when
    /// it wakes, on the same ticks.
    pub(crate) fn hold(self: &Arc<Self>, lock: Lock) -> Arc<Held> {
        let (every, _) = cadence(lock.ttl, self.config.drift_factor, self.config.renew_every);
        let now = Instant::now();
        let renewed = renewed_validity(lock.ttl, self.config.drift_factor);
        let due = due_at(&lock.valid_until, renewed, every, now);
        let held = Arc::new(Held {
            id: self.renewals.next_id.fetch_add(1, Ordering::Relaxed),
            resources: lock.resources,
            keys: lock.keys,
            token: lock.token,
            ttl: lock.ttl,
            min_validity: lock.min_validity,
            origin: lock.origin,
            granted: lock.granted,
            since: now,
            every,
            claims: lock.claims,
            valid_until: Mutex::new(lock.valid_until),
            hold_until: crate::lock::far_after(now, self.config.max_hold),
            lost: CancellationToken::new(),
            reason: OnceLock::new(),
            held_on: std::sync::atomic::AtomicU64::new(0),
            round: std::sync::atomic::AtomicU64::new(0),
            done: Mutex::new(false),
        });
        // A guard is made on a runtime (`LockGuard::new` checks); without one, no driver starts
        // here and the guard relies on the others'.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let (start, wake) = {
            let mut st = self.renewals.lock();
            st.insert(Arc::clone(&held), due);
            // Waking a driver costs a pass over every held lock: only when it would otherwise
            // look too late (a burst of 20,000 guards made that quadratic).
            let wake = st.next_wake.is_none_or(|w| due < w);
            let start = runtime
                .as_ref()
                .map(tokio::runtime::Handle::id)
                .filter(|id| !st.drivers.contains(id));
            if let Some(id) = start {
                st.drivers.push(id);
            }
            (start.zip(runtime), wake)
        };
        if let Some((id, runtime)) = start {
            // The mark travels with the task: if the task is dropped — even before it first
            // runs, when its runtime shuts down — the next guard made there (or on a runtime
            // made later) starts a new driver.
            let running = DriverRunning {
                renewals: Arc::clone(&self.renewals),
                id,
                stopped: false,
            };
            runtime.spawn(drive(Arc::downgrade(self), running));
        }
        // Also when a driver was just started here: it runs only once this runtime does, which
        // a current-thread runtime between `block_on` calls does not, and the drivers already
        // running must look at the new lock (found in review: a short lock guarded on a fresh
        // runtime that then sat idle expired while a busy runtime's driver slept to its tick).
        if wake {
            self.renewals.wake_drivers();
        }
        held
    }

    /// Until when a guarded lock of this client holds `key` (its validity, renewed as it is
    /// renewed, or its max hold if sooner), if one does. A guard's release forgets it here
    /// before the release is sent.
    pub(crate) fn held_until(&self, key: &str) -> Option<Instant> {
        let st = self.renewals.lock();
        let held = st.holder(key)?;
        Some(end_of(held)).filter(|end| *end > Instant::now())
    }

    /// Marks the lease done, stops its renewal and fires `reason`.
    pub(crate) fn finish(&self, held: &Held, reason: LostReason) {
        *held.done.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.renewals.remove(held.id);
        held.fire(reason);
    }
}

/// The renewal driver: one per client while it has guarded locks. Each wake it fires the lost
/// signal of locks past their validity or max hold, and renews every lock due within the
/// current tick, in calls of at most [`BATCH_CHUNK`] locks per node sent together (in a spawned
/// task, so a slow node cannot delay the expiry checks). A wake costs what is due or ending,
/// not a pass over every held lock.
async fn drive<B: Backend>(renewer: Weak<Renewer<B>>, mut running: DriverRunning) {
    let epoch = *running
        .renewals
        .lock()
        .epoch
        .get_or_insert_with(Instant::now);
    let mut last = Deadline::clocks();
    loop {
        let Some(renewer) = renewer.upgrade() else {
            running.stop();
            return;
        };
        // One reading of the clocks for every lock checked in this wake.
        let (now, boot) = Deadline::clocks();
        let mut due = Vec::new();
        let wake_at = {
            let mut st = renewer.renewals.lock();
            if suspended(last, (now, boot)) {
                // Rare: check every lock on both clocks.
                let ids: Vec<u64> = st.entries.keys().copied().collect();
                for id in ids {
                    st.check(id, now, boot);
                }
            }
            while let Some(&(end, id)) = st.ends.first() {
                if end > now {
                    break;
                }
                st.check(id, now, boot);
            }
            let Some(&shortest) = st.intervals.keys().next() else {
                // Nothing held: this driver ends, and the others when they look again (woken
                // now); a guard made meanwhile on a runtime whose driver is still marked wakes
                // that one instead.
                st.due.clear();
                st.drivers.retain(|id| *id != running.id);
                st.next_wake = None;
                drop(st);
                running.disarm();
                renewer.renewals.wake.notify_waiters();
                return;
            };
            // Renewals run on tick boundaries only, each taking everything due before the tick
            // ends (renewing up to one tick early, never late): however often the driver wakes,
            // a node sees one round of calls per tick. The tick follows the shortest renewal
            // interval.
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
                if let Some(entry) = st.entries.get(&id)
                    && !entry.held.is_done()
                    && !entry.held.lost.is_cancelled()
                {
                    due.push(Arc::clone(&entry.held));
                }
            }
            let wake = st
                .ends
                .first()
                .map_or(tick_end, |&(end, _)| end.min(tick_end));
            st.next_wake = Some(wake);
            wake
        };
        last = (now, boot);
        if !due.is_empty() {
            // Made here, not in the round's task: a task dropped before it first ran (its
            // runtime shut down right after this pass) gives its locks back too.
            let round = GiveBack::new(&renewer.renewals, due);
            let r = Arc::clone(&renewer);
            tokio::spawn(async move { r.renew(round).await });
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

/// Marks a renewal driver as gone when its task ends without saying so itself — dropped with
/// its runtime — so that the next `guard()` on a runtime starts a new one there instead of
/// waking nobody.
struct DriverRunning {
    renewals: Arc<Renewals>,
    /// The runtime the driver runs on.
    id: tokio::runtime::Id,
    stopped: bool,
}

impl DriverRunning {
    /// The driver cleared the mark itself (under the state lock); nothing to undo.
    fn disarm(&mut self) {
        self.stopped = true;
    }

    /// The driver ends now: clear its mark.
    fn stop(&mut self) {
        self.clear();
        self.stopped = true;
    }

    /// Forgets this driver, and wakes the others: the time it was to look again is no longer
    /// anybody's (a lock due before theirs would wait for them).
    fn clear(&self) {
        let mut st = self.renewals.lock();
        st.drivers.retain(|id| *id != self.id);
        st.next_wake = None;
        drop(st);
        self.renewals.wake_drivers();
    }
}

impl Drop for DriverRunning {
    fn drop(&mut self) {
        if !self.stopped {
            self.clear();
        }
    }
}

/// The locks of a renewal round, given back to the drivers if the round is dropped before it
/// ends — with its runtime, which a driver of another runtime outlives. A lock taken off the
/// due list for a round is put on it again only when the round settles it, so a round cut
/// short took its locks with it: never renewed again, they expired with every node healthy
/// (test `lifecycle::a_renewal_round_cut_short_by_its_runtime_gives_its_locks_back`). Each
/// that is still held and still in this round ([`Held::round`]: not settled, nor taken into a
/// later round since) is due at once. Also when the thread is unwinding: a current-thread
/// runtime dropped by a panicking test drops its rounds then, with other runtimes' locks in
/// them (a round that panicked itself is given back too, and tried again).
pub(crate) struct GiveBack {
    renewals: Arc<Renewals>,
    round: u64,
    locks: Vec<Arc<Held>>,
}

impl GiveBack {
    /// Puts `locks`, just taken off the due list, in a new round (which renews them from here).
    fn new(renewals: &Arc<Renewals>, locks: Vec<Arc<Held>>) -> Self {
        let round = renewals.next_round.fetch_add(1, Ordering::Relaxed) + 1;
        for held in &locks {
            held.round.store(round, Ordering::Release);
        }
        Self {
            renewals: Arc::clone(renewals),
            round,
            locks,
        }
    }
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        // A round that ended settled every lock: nothing is still in it, and the book is not
        // locked.
        let left: Vec<u64> = self
            .locks
            .iter()
            .filter(|held| {
                held.round
                    .compare_exchange(self.round, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            })
            .map(|held| held.id)
            .collect();
        if left.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut st = self.renewals.lock();
        let mut any = false;
        for id in left {
            if st.entries.contains_key(&id) {
                st.due.push(Reverse((now, id)));
                any = true;
            }
        }
        if any {
            st.next_wake = None;
        }
        drop(st);
        if any {
            self.renewals.wake_drivers();
        }
    }
}

/// What one node said about each lock of a batch.
type BatchAnswer = Result<Result<Vec<Renewed>, NodeError>, tokio::time::error::Elapsed>;

impl<B: Backend> Renewer<B> {
    /// Renews `locks` in batches of one call per node, each decided at quorum like an `extend`,
    /// and reschedules, retries or fires each lock.
    ///
    /// The calls go out together, as long as no more than [`RENEWAL_WINDOW`] locks are in
    /// flight (counting other rounds still going): over a slow link a round of many calls costs
    /// about one round trip, not one per call.
    async fn renew(self: Arc<Self>, round: GiveBack) {
        let calls = round.locks.chunks(BATCH_CHUNK).map(|chunk| async {
            let places = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
            // Never closed: the semaphore lives as long as `self`.
            let Ok(_places) = self.window.acquire_many(places).await else {
                return;
            };
            self.pace(chunk).await;
            self.renew_batch(chunk).await;
        });
        futures_util::future::join_all(calls).await;
        // Every lock was settled (its round cleared): the give-back finds nothing to do.
        drop(round);
    }

    /// Waits until `chunk` can be sent with no more than [`PACE_BACKLOG`] of renewal work
    /// ahead of it on the slowest node, and books its own work. Never longer than a quarter of
    /// the validity its locks have left: renewing them in time comes first.
    async fn pace(&self, chunk: &[Arc<Held>]) {
        let Some(per_key) = (0..self.backend.len())
            .filter_map(|i| self.backend.renewal_cost(i))
            .max()
        else {
            return;
        };
        let keys: usize = chunk.iter().map(|h| h.keys.len()).sum();
        let work = per_key.saturating_mul(u32::try_from(keys).unwrap_or(u32::MAX));
        let backlog = PACE_BACKLOG.min(self.config.node_timeout / 5);
        let now = Instant::now();
        let wait = {
            let mut until = self
                .paced_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let start = until.map_or(now, |u| u.max(now));
            *until = Some(start + work);
            start.saturating_duration_since(now + backlog)
        };
        let left = chunk
            .iter()
            .map(|h| h.valid_until().remaining())
            .min()
            .unwrap_or_default();
        let wait = wait.min(left / 4);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    async fn renew_batch(&self, chunk: &[Arc<Held>]) {
        let (now, boot) = Deadline::clocks();
        let started = now;
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
        // A batch is one script doing work for every lock in it, and may run after the rest of
        // the window: allow it more than one request's node timeout (a tight bound
        // turned a busy moment into lost locks), but never a quarter of the shortest TTL. A
        // node still being connected gets no more, and the batch is decided at quorum: a hung
        // or connecting minority is not waited for. Past the budget a call is waited for only
        // as long as a retry could not do better (below).
        let per_lock =
            Duration::from_micros(20) * u32::try_from(RENEWAL_WINDOW).unwrap_or(u32::MAX);
        let node_timeout = self.config.node_timeout;
        let budget = (node_timeout * 2 + per_lock)
            .min(shortest_ttl / 4)
            .max(node_timeout);
        // Each node's part of the round goes on until the round is decided (see
        // [`NodePart`]): its call waited for past the budget while a retry could not do
        // better, and sent again after a failure.
        let deciding = Arc::new(AtomicBool::new(true));
        let useful_until = started
            + chunk
                .iter()
                .map(|h| h.valid_until().remaining_at(now, boot))
                .max()
                .unwrap_or_default();
        let every = chunk.iter().map(|h| h.every).min().unwrap_or(shortest_ttl);
        let locks: Arc<[Arc<Held>]> = chunk.into();
        let mut calls: FuturesUnordered<_> = (0..n)
            .map(|i| {
                let part = NodePart {
                    i,
                    budget,
                    every,
                    useful_until,
                    deciding: Arc::clone(&deciding),
                    locks: Arc::clone(&locks),
                };
                let answer = part.run(Arc::clone(&self.backend), Arc::clone(&batch));
                async move { (i, answer.await, started.elapsed()) }
            })
            .collect();
        let m = chunk.len();
        let mut undecided = m;
        let mut pending = n;
        let mut round = Round {
            started,
            started_boot: boot,
            outcomes: vec![vec![NodeOutcome::Pending; n]; m],
            missing: vec![Vec::new(); m],
            lost_by: vec![0; m],
            taken: vec![0; m],
            putting_back: vec![0; m],
            put_back_on: vec![Vec::new(); m],
            yes: vec![0; m],
            decided: vec![None; m],
            settled: vec![false; m],
            renewed_at: vec![false; m],
            renewed: 0,
        };
        // Decide each lock as soon as its quorum outcome is known, and settle it then: a hung
        // or slow minority node is not waited for, and a lock decided is not held up by the
        // others of its round (a round stays open for as long as one of them is undecided and
        // its nodes are asked again; the decided ones used to keep their old deadlines until
        // then, and expired: test `renewal_attacks::a_lock_decided_in_a_round_does_not_wait_
        // for_an_undecided_one`).
        // Put-backs under way in this round, each node `i`'s for lock `j`: whether it took the
        // keys back (see the `Missing` answer below).
        let mut putting_back: FuturesUnordered<PutBack> = FuturesUnordered::new();
        // Past the budget: the nodes still to answer are late (see `put_back_early`).
        let mut late = false;
        let budget_ends = started + budget;
        while undecided > 0 {
            let (i, answer, waited) = crate::det::select! {
                Some(answer) = calls.next() => answer,
                () = tokio::time::sleep_until(budget_ends), if !late => {
                    late = true;
                    for (j, held) in chunk.iter().enumerate() {
                        self.put_back_early(&mut round, (j, held), late, &mut putting_back);
                    }
                    continue;
                }
                Some((i, j, took)) = putting_back.next() => {
                    round.put_back(j, i, took, quorum);
                    if !round.settled[j] && round.decide(j, pending, quorum) {
                        undecided -= 1;
                        self.settle_all(&mut round, chunk, vec![j]);
                    }
                    continue;
                }
                else => break,
            };
            pending -= 1;
            let answer: &BatchAnswer = &answer;
            let mut now_decided = Vec::new();
            for (j, held) in chunk.iter().enumerate() {
                // A lock settled on an earlier answer keeps its tally as it was judged (the
                // first version of this loop indexed the tally the settling had taken, and
                // panicked: test `renewal_attacks::locks_decided_on_different_answers_of_a_
                // round_are_all_renewed`); a node telling that it lost the keys of a lock
                // renewed at its quorum gets them put back.
                if let Ok(Ok(v)) = answer
                    && matches!(v.get(j), Some(Renewed::Extended))
                {
                    held.held_on(i);
                }
                if round.settled[j] {
                    if let Ok(Ok(v)) = answer
                        && matches!(v.get(j), Some(Renewed::Missing))
                    {
                        round.missing_after((j, held), i, &self.backend, self.config.node_timeout);
                    }
                    continue;
                }
                let outcome = match answer {
                    Ok(Ok(v)) => match v.get(j) {
                        Some(Renewed::Extended) => NodeOutcome::Confirmed,
                        Some(Renewed::Missing) => {
                            round.missing[j].push(i);
                            round.lost_by[j] += 1;
                            NodeOutcome::Refused
                        }
                        _ => {
                            round.taken[j] += 1;
                            NodeOutcome::Refused
                        }
                    },
                    Ok(Err(e)) => NodeOutcome::Failed(e.clone()),
                    Err(_) => NodeOutcome::TimedOut { after: waited },
                };
                round.yes[j] += usize::from(outcome == NodeOutcome::Confirmed);
                round.outcomes[j][i] = outcome;
                round.withdraw_put_backs(j, quorum);
                self.put_back_early(&mut round, (j, held), late, &mut putting_back);
                if round.decide(j, pending, quorum) {
                    undecided -= 1;
                    now_decided.push(j);
                }
            }
            self.settle_all(&mut round, chunk, now_decided);
        }
        // Nodes still to answer are read on (below) about within their budget: a call past it
        // ends at its next check, and none is sent again.
        deciding.store(false, Ordering::Release);
        telemetry::renewal_round(started.elapsed());
        let unsettled: Vec<usize> = (0..m).filter(|&j| !round.settled[j]).collect();
        self.settle_all(&mut round, chunk, unsettled);
        telemetry::renewal_outcomes(round.renewed, chunk.len() as u64 - round.renewed);
        if !calls.is_empty() {
            // The node that lost keys is often the last to answer (a new connection, an empty
            // script cache): its answers, each bounded by the batch budget, are read on — to
            // put the keys back of the locks renewed at their quorum, and to note where the
            // keys are held (see `put_back_early`).
            let backend = Arc::clone(&self.backend);
            let node_timeout = self.config.node_timeout;
            let late: Vec<(Arc<Held>, bool)> = chunk
                .iter()
                .zip(&round.renewed_at)
                .map(|(held, &renewed)| (Arc::clone(held), renewed))
                .collect();
            tokio::spawn(async move {
                while let Some((i, answer, _)) = calls.next().await {
                    let Ok(Ok(renewed)) = &answer else {
                        continue;
                    };
                    for (j, (held, repairable)) in late.iter().enumerate() {
                        match renewed.get(j) {
                            Some(Renewed::Extended) => held.held_on(i),
                            Some(Renewed::Missing) if *repairable => {
                                repair(&backend, node_timeout, held, &[i]);
                            }
                            _ => {}
                        }
                    }
                }
            });
        }
    }

    /// Puts lock `j`'s keys back at once on the nodes that answered `round` that they lost
    /// them and never held them as far as the client knows (see [`Held::may_have_held_on`]: the
    /// acquire's grant there was lost on the way — dropped by a partition, say — and no
    /// renewal or put-back reached it since), if the lock is undecided, renewed on some node,
    /// lost by fewer than a quorum, held by nobody else on any node that answered, and the
    /// round is `late` (past its budget, some node still to answer). Each counts as renewing
    /// the lock if it took the keys while it still can (see [`Round::can_count`]; they expire
    /// later than the renewal counts from). They were refusals, and with another node hung the
    /// round waited for that one until the validity ran out: the lease was lost although a
    /// quorum answered and nobody else held the keys (test `leases::a_grant_dropped_by_a_
    /// partition_is_put_back_while_another_node_hangs`, what CI showed).
    ///
    /// Not on a node that may have held the keys: they may have been deleted there (a release
    /// by a client the lock was handed to, or taken away) rather than lost, and a put-back
    /// counted as a renewal brought a released lock back while a hung node hid the delete
    /// (found in review; `leases::a_key_deleted_on_a_node_that_granted_is_not_put_back_while_
    /// another_hangs`, `…a_renewal_repaired…`). A grant answered late or lost with its
    /// connection may have written all the same, a known limit in docs/leases.md. Nor with the
    /// keys gone from a quorum (`leases::a_renewal_that_finds_the_keys_gone_from_a_quorum_puts_
    /// nothing_back`), nor before the budget: a round answered in time is decided as before
    /// (put back before it was, on a node whose delete came first while the deletes reached
    /// the nodes one after another, the key kept the lock alive: `run_lost::a_started_process_
    /// whose_main_thread_exited_is_stopped_too`, in the lanes).
    fn put_back_early(
        &self,
        round: &mut Round,
        (j, held): (usize, &Arc<Held>),
        late: bool,
        putting_back: &mut FuturesUnordered<PutBack>,
    ) {
        let quorum = engine::quorum(self.backend.len());
        if !late
            || round.decided[j].is_some()
            || round.yes[j] == 0
            || !round.can_count(j, quorum)
            || round.missing[j].is_empty()
        {
            return;
        }
        for node in std::mem::take(&mut round.missing[j]) {
            if held.may_have_held_on(node) {
                round.missing[j].push(node);
                continue;
            }
            match put_back(&self.backend, self.config.node_timeout, held, node) {
                Some(took) => {
                    // Its outcome stays the refusal it answered until the put-back counts: a
                    // round decided without it judges that answer.
                    round.putting_back[j] += 1;
                    putting_back.push(Box::pin(
                        async move { (node, j, took.await.unwrap_or(false)) },
                    ));
                }
                None => round.missing[j].push(node),
            }
        }
    }

    /// Settles locks `js` of a round (see [`Renewer::settle`]) and hands them back to the
    /// driver.
    fn settle_all(&self, round: &mut Round, chunk: &[Arc<Held>], js: Vec<usize>) {
        let now = Instant::now();
        let settled: Vec<_> = js
            .into_iter()
            .filter_map(|j| self.settle(round, j, &chunk[j], now))
            .collect();
        self.reschedule(settled);
    }

    /// Judges lock `j` of a round from its decision (`None`: undecided when the round ended)
    /// and applies the outcome: a new deadline and its next renewal, a loss, or a retry.
    /// Answers when and how the driver is to take it up again, counted from `now`.
    fn settle(
        &self,
        round: &mut Round,
        j: usize,
        held: &Arc<Held>,
        now: Instant,
    ) -> Option<(Instant, u64, Option<Instant>)> {
        round.settled[j] = true;
        held.round.store(0, Ordering::Release);
        let started = round.started;
        let (ok, elapsed) = round.decided[j].unwrap_or((false, started.elapsed()));
        let decision = Decision {
            success: ok,
            outcomes: std::mem::take(&mut round.outcomes[j]),
            claims: Vec::new(),
            heard: Vec::new(),
            positive: round.yes[j],
            needed: engine::quorum(self.backend.len()),
        };
        let missing = std::mem::take(&mut round.missing[j]);
        // The lock's own TTL: the one this batch sent the nodes.
        let result = Judge::new(Phase::Extend, &held.resources, held.ttl, &self.config)
            .min_validity(held.min_validity)
            .judge(&decision, &*self.backend, elapsed);
        if held.is_done() || held.lost.is_cancelled() {
            round.renewed += u64::from(result.is_ok());
            return None;
        }
        // No lock's next round comes sooner than one tick of its interval after this round
        // started: the driver takes everything due before the current tick ends, so a lock
        // rescheduled inside that tick (an interval under the 5 ms shortest tick, or a retry
        // gap of a few milliseconds as the validity runs out) used to be taken again as soon as
        // this round ended, and renewals ran back to back (tests `leases::renewals_shorter_
        // than_a_tick_come_once_per_tick`, `…failed_renewals_are_not_retried_back_to_back`).
        let next_round = started + tick(held.every) + Duration::from_nanos(1);
        match result {
            Ok(valid_for) => {
                let deadline = Deadline::after((started, round.started_boot), valid_for);
                match held.renewed(deadline) {
                    Ok(()) => round.renewed += 1,
                    Err(NotRenewed::Passed) => {
                        held.fire(LostReason::Expired);
                        self.renewals.remove(held.id);
                        return None;
                    }
                    Err(NotRenewed::Ended) => return None,
                }
                let most = renewed_validity(held.ttl, self.config.drift_factor);
                let due = due_at(&deadline, most, held.every, now).max(next_round);
                repair(&self.backend, self.config.node_timeout, held, &missing);
                // Locks renewed at their quorum: a node answering later that it lost their
                // keys still gets them put back.
                round.renewed_at[j] = true;
                Some((due, held.id, Some(deadline.mono().min(held.hold_until))))
            }
            // The key is held by another token on too many nodes: definitely lost.
            Err(error @ Error::NotHeld { .. }) => {
                held.fire(LostReason::RenewalFailed(Box::new(error)));
                self.renewals.remove(held.id);
                None
            }
            // Unknown (nodes failed or were slow): try again while validity remains; the
            // driver fires `Expired` at the deadline if no renewal gets through by then.
            Err(error) => {
                let left = held.valid_until().remaining();
                tracing::debug!(token = %held.token, %error, ?left, "renewal failed; retrying within the validity");
                Some((
                    (now + retry_gap(held.every, left)).max(next_round),
                    held.id,
                    None,
                ))
            }
        }
    }

    /// Hands settled locks back to the driver: each one's next round, and its new end.
    fn reschedule(&self, settled: Vec<(Instant, u64, Option<Instant>)>) {
        if settled.is_empty() {
            return;
        }
        let mut st = self.renewals.lock();
        let mut sooner = false;
        for (at, id, end) in settled {
            if st.entries.contains_key(&id) {
                st.due.push(Reverse((at, id)));
                sooner |= st.next_wake.is_none_or(|w| at < w);
                if let Some(end) = end {
                    st.set_end(id, end);
                }
            }
        }
        drop(st);
        // Only a retry due before the driver's next look needs to wake it.
        if sooner {
            self.renewals.wake_drivers();
        }
    }
}

/// What a renewal round has heard and settled so far, per lock of its batch.
/// A put-back under way in a round (see [`Renewer::put_back_early`]): node, lock, and whether
/// the node took the keys.
type PutBack = std::pin::Pin<Box<dyn std::future::Future<Output = (usize, usize, bool)> + Send>>;

struct Round {
    started: Instant,
    /// The boot clock read with `started` (see [`Deadline::clocks`]).
    started_boot: Option<Duration>,
    /// Each node's outcome.
    outcomes: Vec<Vec<NodeOutcome>>,
    /// The nodes that answered that they lost the lock's keys.
    missing: Vec<Vec<usize>>,
    /// Per lock of the batch: how many nodes answered, before it was decided, that they lost
    /// its keys.
    lost_by: Vec<usize>,
    /// Per lock of the batch: how many nodes answered, before it was decided, that someone
    /// else holds its keys.
    taken: Vec<usize>,
    /// Per lock of the batch: put-backs of its keys under way, on nodes that lost them before
    /// it was decided (each counts as a node still to answer).
    putting_back: Vec<usize>,
    /// Per lock of the batch: the nodes whose put-back counted as renewing it.
    put_back_on: Vec<Vec<usize>>,
    /// How many nodes confirmed.
    yes: Vec<usize>,
    /// The verdict, and when it was reached.
    decided: Vec<Option<(bool, Duration)>>,
    /// Per lock of the batch: judged and handed back to the driver.
    settled: Vec<bool>,
    /// Per lock of the batch: renewed at its quorum (a node answering later that it lost the
    /// lock's keys gets them put back).
    renewed_at: Vec<bool>,
    renewed: u64,
}

impl Round {
    /// Node `i`'s put-back of lock `j`'s keys answered: it renews the lock there if the node
    /// `took` them and it still can count (see [`Round::can_count`]); else the node's answer
    /// stays the refusal it was.
    fn put_back(&mut self, j: usize, i: usize, took: bool, quorum: usize) {
        self.putting_back[j] -= 1;
        if self.settled[j] {
            return;
        }
        if took && self.can_count(j, quorum) {
            self.yes[j] += 1;
            self.outcomes[j][i] = NodeOutcome::Confirmed;
            self.put_back_on[j].push(i);
        }
    }

    /// Takes back lock `j`'s put-backs that counted once it can no longer count them (see
    /// [`Round::can_count`]): their nodes' answers are the refusals they were. Counted for
    /// good, a put-back made a quorum with a node renewing after a quorum had lost the keys,
    /// and the keys were put back on every node that lost them (test `leases::a_put_back_that_
    /// counted_stops_counting_once_a_quorum_lost_the_keys`, found in review).
    fn withdraw_put_backs(&mut self, j: usize, quorum: usize) {
        if self.can_count(j, quorum) || self.put_back_on[j].is_empty() {
            return;
        }
        for i in std::mem::take(&mut self.put_back_on[j]) {
            self.yes[j] -= 1;
            self.outcomes[j][i] = NodeOutcome::Refused;
        }
    }

    /// Whether a put-back of lock `j`'s keys can still count as renewing it: fewer than a
    /// `quorum` of nodes lost the keys and none said another owner holds them, also among the
    /// answers that came after it was sent (an answer of another owner used to be overlooked
    /// then, and the lock renewed: test `leases::another_owner_answering_after_a_put_back_was_
    /// sent_loses_the_lease`, found in review).
    fn can_count(&self, j: usize, quorum: usize) -> bool {
        self.lost_by[j] < quorum && self.taken[j] == 0
    }

    /// Decides lock `j` if it is undecided and its verdict is known, counting as still to
    /// answer the `pending` nodes and its put-backs under way while they can still count (one
    /// that can no longer count used to keep the round undecided until it answered, up to the
    /// node timeout and a second). Answers whether it was decided now.
    fn decide(&mut self, j: usize, pending: usize, quorum: usize) -> bool {
        if self.decided[j].is_some() {
            return false;
        }
        let putting_back = if self.can_count(j, quorum) {
            self.putting_back[j]
        } else {
            0
        };
        let Some(ok) = engine::verdict(self.yes[j], pending + putting_back, quorum) else {
            return false;
        };
        self.decided[j] = Some((ok, self.started.elapsed()));
        true
    }

    /// Node `i` answered, after lock `j` was renewed at its quorum, that it lost the lock's
    /// keys: they are put back there.
    fn missing_after<B: Backend>(
        &self,
        (j, held): (usize, &Arc<Held>),
        i: usize,
        backend: &Arc<B>,
        node_timeout: Duration,
    ) {
        if self.renewed_at[j] {
            repair(backend, node_timeout, held, &[i]);
        }
    }
}

/// One node's part of a renewal round.
///
/// Past its budget, the node's call is waited for while its answer can still decide a lock:
/// while the round is deciding, some lock of it is still valid, and the call's connection is
/// still the node's (checked while waited on). A node answers one connection's requests in
/// order, so a call sent again would go out behind this one and could not be answered sooner;
/// given up at the budget and retried with the round, a renewal slower than its budget (a
/// slow link, or load on top of one) was lost with the validity the retry had left (test
/// `leases::a_renewal_answered_after_its_budget_but_within_the_validity_keeps_the_lock`: 200
/// of 200 lost over a 600 ms round trip).
///
/// A call that failed is sent again to this node alone after the retry gap, within the same
/// round, and one whose connection was replaced is sent again at once: the other nodes' calls
/// are not dropped for it. While the call is waited for, its connection is checked as a new
/// request on it would check it, so a connection that went silent while its server answers is
/// replaced. A first version of the wait ended every node's wait when any node failed (one
/// dead node of five then brought the slow-link losses back), and before it, the version that
/// only waited lost the lock when one node hung while another came back from a short failure
/// (`leases::a_renewal_is_retried_when_a_node_fails_while_another_hangs`) or when a needed
/// node's connection went silent (`silent_connections::a_guard_keeps_its_lock_when_a_needed_
/// nodes_connection_goes_silent`); the next version ended the wait once the connection had
/// been silent for the connect timeout and resent after the retry gap, to get it checked, and
/// came back too late under load in the same test. A call sent later than the round's start
/// can only leave the key longer than the validity the round counts from its start.
///
/// Each call carries only the locks of the round that have not ended (released, handed back
/// by `stop_renewal`, lost, past their max hold): the others go as entries without keys, which
/// change nothing, and when none is left nothing is sent. A call sent again after the nodes
/// came back re-armed the keys of a lock `stop_renewal` had handed back long before (test
/// `job_leases::no_renewal_is_sent_after_stop_renewal_returns`), and so would one sent after
/// the round waited for pacing or for room in the window.
struct NodePart {
    i: usize,
    budget: Duration,
    every: Duration,
    useful_until: Instant,
    deciding: Arc<AtomicBool>,
    /// The round's locks, in the batch's order.
    locks: Arc<[Arc<Held>]>,
}

impl NodePart {
    async fn run<B: Backend>(self, backend: Arc<B>, batch: Arc<Batch>) -> BatchAnswer {
        let i = self.i;
        let check = (self.budget / 4).max(Duration::from_millis(5));
        let mut last = None;
        loop {
            let Some((batch, unasked)) = self.live(&batch) else {
                return last.unwrap_or_else(|| {
                    Ok(Err(NodeError::new(
                        NodeErrorKind::Withdrawn,
                        "not sent: every lock of the renewal call ended first",
                    )))
                });
            };
            let sent_on = backend.connection(i);
            let mut call = std::pin::pin!(engine::handed_over(
                backend.extend_many(i, Arc::clone(&batch))
            ));
            let mut answer = tokio::time::timeout(self.budget, &mut call).await;
            let mut replaced = false;
            while answer.is_err() && self.deciding() {
                let Some(connection) = sent_on else { break };
                if !backend.still_current(i, connection) {
                    replaced = true;
                    break;
                }
                let left = self.useful_until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                answer = tokio::time::timeout(check.min(left), &mut call).await;
            }
            // An entry sent without keys answers "extended" for nothing: it is a refusal here
            // (its lock ended; it must not count as renewed, nor mark the node as holding it).
            if let (Ok(Ok(answers)), Some(unasked)) = (&mut answer, &unasked) {
                for (a, &skip) in answers.iter_mut().zip(unasked) {
                    if skip {
                        *a = Renewed::Refused;
                    }
                }
            }
            if matches!(answer, Ok(Ok(_))) || !self.deciding() {
                return answer;
            }
            let left = self.useful_until.saturating_duration_since(Instant::now());
            // A call waited for until its connection was replaced goes out again at once, on
            // the new connection; a failed one after the retry gap.
            let gap = if replaced {
                Duration::ZERO
            } else {
                retry_gap(self.every, left)
            };
            if left <= gap || left.is_zero() {
                return answer;
            }
            tokio::time::sleep(gap).await;
            if !self.deciding() {
                return answer;
            }
            last = Some(answer);
        }
    }

    /// `batch` for the locks that have not ended, the others without keys (marked in the
    /// mask, `None` when there are none); `None` when every lock ended.
    fn live(&self, batch: &Arc<Batch>) -> Option<(Arc<Batch>, Option<Vec<bool>>)> {
        let ended = |h: &Arc<Held>| h.is_done() || h.lost.is_cancelled();
        let mask: Vec<bool> = self.locks.iter().map(ended).collect();
        let over = mask.iter().filter(|&&e| e).count();
        if over == 0 {
            return Some((Arc::clone(batch), None));
        }
        if over == self.locks.len() {
            return None;
        }
        let none: Arc<[String]> = Arc::new([]);
        let locks = batch
            .locks
            .iter()
            .zip(&mask)
            .map(|(entry, &skip)| BatchEntry {
                keys: if skip {
                    Arc::clone(&none)
                } else {
                    Arc::clone(&entry.keys)
                },
                token: entry.token.clone(),
                ttl_ms: entry.ttl_ms,
            })
            .collect();
        Some((Arc::new(Batch { locks }), Some(mask)))
    }

    fn deciding(&self) -> bool {
        self.deciding.load(Ordering::Acquire)
    }
}

/// Puts back the keys of a lock that nodes lost (found missing by a renewal): each such node
/// gets an owner-checked `SET NX` of the lock's keys, as a grant — refused when anyone else
/// holds them, and not sent to a node in its restart quarantine. The lock regains the
/// redundancy a restart took.
fn repair<B: Backend>(backend: &Arc<B>, node_timeout: Duration, held: &Arc<Held>, nodes: &[usize]) {
    for &i in nodes {
        drop(put_back(backend, node_timeout, held, i));
    }
}

/// [`repair`] on node `i`: whether the node took the keys back, once it answered (`false` also
/// for no answer in time); `None` when nothing is sent.
fn put_back<B: Backend>(
    backend: &Arc<B>,
    node_timeout: Duration,
    held: &Arc<Held>,
    i: usize,
) -> Option<tokio::sync::oneshot::Receiver<bool>> {
    let op = Arc::new(Op::Acquire {
        stamped: false,
        keys: Arc::clone(&held.keys),
        token: held.token.clone(),
        ttl_ms: lock::ttl_ms(held.ttl),
        rearm: true,
        checked: false,
        // The lock's own record of which nodes its requests reached: a put-back that reaches
        // a node means its release must go there too.
        reach: held
            .granted
            .as_ref()
            .and_then(crate::engine::Granted::reach),
    });
    // Handed over under the `done` lock: a release is either sent after the repair, on the
    // same connections (so it deletes what the repair set), or the repair is not sent. Nor is
    // it sent for a lease that ended (lost, expired, `max_hold`): the repair of a node answering
    // after the quorum, read on by a task of its own, used to put a key back with a fresh TTL
    // after `max_hold` fired (test `renewal_attacks::no_key_is_put_back_after_max_hold`).
    let done = held.done.lock().unwrap_or_else(PoisonError::into_inner);
    if *done || held.lost.is_cancelled() {
        return None;
    }
    // A lock taken with the caller's token bounds its release's deletes by the nodes' clocks:
    // its release waits for the put-back's answer, which has the node's clock (see
    // `engine::Granted::release_request`).
    let own_token = held
        .granted
        .clone()
        .filter(crate::engine::Granted::own_token);
    if let Some(g) = &own_token {
        g.repair_sent(i, Instant::now() + node_timeout + engine::DELIVERY_GRACE);
    }
    held.held_on(i);
    let call = engine::handed_over(backend.call(i, op));
    drop(done);
    let node = backend.name(i).clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let answer = tokio::time::timeout(node_timeout + engine::DELIVERY_GRACE, call).await;
        let heard = match &answer {
            Ok(Ok(crate::backend::Reply::Yes { at_us, .. })) => {
                tracing::debug!(%node, "renewal put back keys the node had lost");
                Some(Ok(*at_us))
            }
            Ok(Ok(_)) => {
                tracing::debug!(%node, "keys lost by the node are held by another owner there");
                Some(Err(()))
            }
            Ok(Err(e)) => {
                tracing::debug!(%node, error = %e, "repair not done");
                None
            }
            Err(_) => {
                tracing::debug!(%node, "repair timed out");
                None
            }
        };
        if let Some(g) = own_token {
            g.repair_done(i, heard);
        }
        let _ = tx.send(matches!(heard, Some(Ok(_))));
    });
    Some(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ids on the due list, in no order, each as often as it is there.
    fn due_ids(renewals: &Renewals) -> Vec<u64> {
        renewals
            .lock()
            .due
            .iter()
            .map(|Reverse((_, id))| *id)
            .collect()
    }

    /// A held lock on `renewals`' book, taken off the due list for a round.
    fn taken(renewals: &Renewals, id: u64) -> Arc<Held> {
        let held = Arc::new(Held::for_test(
            id,
            Deadline::after(Deadline::clocks(), Duration::from_secs(10)),
        ));
        let mut st = renewals.lock();
        st.insert(Arc::clone(&held), Instant::now());
        assert!(st.due.pop().is_some());
        held
    }

    /// A round's task dropped before it first ran (its runtime shut down right after the
    /// driver's pass) gives its locks back: the give-back is made with the round, by the
    /// driver, and travels into the task. Made inside the task, it did not exist yet, and the
    /// locks were never due again (found in review).
    #[test]
    fn a_round_dropped_before_it_ran_gives_its_locks_back() {
        let renewals = Arc::new(Renewals::default());
        let held = taken(&renewals, 7);
        let give_back = GiveBack::new(&renewals, vec![Arc::clone(&held)]);
        let round = async move {
            let _give_back = give_back;
            std::future::pending::<()>().await;
        };
        drop(round);
        assert_eq!(due_ids(&renewals), vec![7]);
        assert_eq!(held.round.load(Ordering::Acquire), 0);
    }

    /// A lock the round settled and a later round (of another runtime's driver) took again is
    /// not given back by the first round's drop: "not on the due list" is not "not settled",
    /// and the lock was due twice from then on (found in review).
    #[test]
    fn a_lock_settled_and_taken_again_is_not_given_back_twice() {
        let renewals = Arc::new(Renewals::default());
        let held = taken(&renewals, 9);
        let first = GiveBack::new(&renewals, vec![Arc::clone(&held)]);
        // The first round settles it (as `Renewer::settle` and `reschedule` do) ...
        held.round.store(0, Ordering::Release);
        renewals.lock().due.push(Reverse((Instant::now(), 9)));
        // ... and a later round takes it.
        assert!(renewals.lock().due.pop().is_some());
        let second = GiveBack::new(&renewals, vec![Arc::clone(&held)]);
        drop(first);
        assert!(
            due_ids(&renewals).is_empty(),
            "given back by the round that settled it"
        );
        drop(second);
        assert_eq!(due_ids(&renewals), vec![9]);
    }

    /// A lock that ended while its round was out is not given back.
    #[test]
    fn an_ended_lock_is_not_given_back() {
        let renewals = Arc::new(Renewals::default());
        let held = taken(&renewals, 3);
        let give_back = GiveBack::new(&renewals, vec![Arc::clone(&held)]);
        renewals.remove(3);
        drop(give_back);
        assert!(due_ids(&renewals).is_empty());
    }

    #[test]
    fn cadence_defaults_to_a_third_of_the_ttl() {
        let (every, tick) = cadence(Duration::from_secs(9), 0.01, None);
        assert_eq!(every, Duration::from_secs(3));
        assert_eq!(tick, Duration::from_millis(375));
        let (_, tick) = cadence(Duration::from_millis(30), 0.01, None);
        assert_eq!(tick, Duration::from_millis(5));
    }

    #[test]
    fn renewals_are_due_from_the_remaining_validity() {
        let now = Instant::now();
        let renewed = Duration::from_secs(3);
        let every = Duration::from_secs(1);
        for _ in 0..1000 {
            // A lock with all the validity a renewal leaves is due about `every` from now,
            // never late.
            let fresh = Deadline::after((now, None), renewed);
            let at = due_at(&fresh, renewed, every, now);
            assert!(
                at > now + Duration::from_millis(790) && at <= now + every,
                "{at:?}"
            );
            // A lock with less than `renewed − every` left is due at once.
            let late = Deadline::after((now, None), Duration::from_millis(700));
            assert_eq!(due_at(&late, renewed, every, now), now);
        }
    }

    #[test]
    fn a_renewed_lock_is_not_due_at_once_whatever_the_drift_factor() {
        let now = Instant::now();
        let ttl = Duration::from_secs(1);
        for factor in [0.0, 0.01, 0.2, 0.4, 0.49] {
            let (every, _) = cadence(ttl, factor, None);
            let renewed = renewed_validity(ttl, factor);
            let at = due_at(&Deadline::after((now, None), renewed), renewed, every, now);
            assert!(
                at >= now + every.mul_f64(0.79) && at <= now + every,
                "drift factor {factor}: due {:?} after a renewal, every {every:?}",
                at - now
            );
            // At least half of what a renewal leaves is left when a renewal is due.
            assert!(renewed.saturating_sub(every) >= renewed / 2, "{factor}");
        }
    }

    #[test]
    fn a_lock_with_a_shorter_ttl_is_renewed_at_least_twice_per_ttl() {
        let (every, _) = cadence(Duration::from_secs(1), 0.01, Some(Duration::from_secs(5)));
        // Half of what a renewal leaves: (1 s − 12 ms) / 2.
        assert_eq!(every, Duration::from_millis(494));
    }
}
