//! Attempts with a caller's token (`try_acquire_with_token`), across the process.
//!
//! Such an attempt that fails or is dropped deletes, by the token, the keys it created; the
//! keys holding that token may meanwhile stand for a lock taken again with it, and the delete
//! cannot tell them apart. So a new attempt with a token waits until what the earlier attempts
//! with the same token on any of the same keys did on the nodes is done: their answers in,
//! their cleanups answered (or given up on). Sent before that, its request could reach a node
//! ahead of the delete, which then took the keys it had just kept, and a rival got the lock
//! (tests `api_attacks::a_dropped_token_attempt_does_not_delete_the_retried_lock`, `a_second_
//! client_reclaiming_the_token_keeps_its_lock`, `a_reclaim_through_other_addresses_of_the_
//! nodes_keeps_its_lock`).
//!
//! * By token and keys, not by client or node addresses: a second client, or one that reaches
//!   the same servers at other addresses, was not waited for. Attempts on other keys are not
//!   waited for: a cleanup deletes only its own attempt's keys.
//! * Until the cleanups answered, not until they were handed to a connection: a request that
//!   takes another way to the server (another connection, a proxy) can overtake them.
//! * Each wait lasts at most as long as the earlier attempt can still act: its last node
//!   deadline plus a cleanup's grace (`engine::DELIVERY_GRACE`) plus its longest node budget
//!   (`engine::Unanswered::settles_by`). A cleanup still unanswered then is not waited for: it
//!   can no longer delete anything by then, since it carries a deadline on the node's clock
//!   that ends before it (`engine::cleanup_deadline`). A cleanup that did not answer within its
//!   grace is waited for until then too. (Such an attempt is the call's only one: no retry
//!   deadline applies.)
//! * An attempt takes its place before it waits, so two started together wait for each other
//!   (the second for the first): attempts with one token on one key take turns.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::engine::Unanswered;
use crate::token::Token;
use crate::waiters::lock;

/// How long past its own wait an attempt that has not started yet holds up the ones after
/// it: its task may be late to run. One that starts later than that takes a new place.
const START_SLACK: Duration = Duration::from_millis(100);

/// The attempts with a caller's token that may still act on the nodes, process-wide, by
/// token: a call reads only its own token's. (One list scanned whole by every call made the
/// calls quadratic while a node hung, each attempt staying listed for its node timeout: 16,384
/// re-claims that nodes 1 and 2 could grant took 18–31 s against 0.6–1.9 s for as many plain
/// acquires, and healthy nodes timed out.)
static ATTEMPTS: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

/// The registry a call uses: the process's, or on a simulated history's thread that thread's
/// own. A simulated history runs on one thread, on a paused clock of its own: another history's
/// attempts are none of its business, and a sweep that judged their horizons by this clock
/// dropped them early and changed that history (seen as batch runs of the chaos suite that did
/// not replay, test `histories_side_by_side_are_the_histories_of_their_seeds`).
fn registry() -> &'static Mutex<Registry> {
    #[cfg(feature = "simulation")]
    if crate::det::simulated() {
        return SIMULATED.with(Simulated::current);
    }
    &ATTEMPTS
}

/// A simulated thread's registry (see [`registry`]) and the history it holds attempts of.
#[cfg(feature = "simulation")]
struct Simulated {
    registry: &'static Mutex<Registry>,
    history: std::cell::Cell<u64>,
}

#[cfg(feature = "simulation")]
impl Simulated {
    /// The registry, emptied first if the thread started a new history since it was last used:
    /// a replay of the same seed on the same thread would otherwise meet the last history's
    /// attempts (same tokens, same keys) and wait for them, on the last history's clock.
    fn current(&self) -> &'static Mutex<Registry> {
        let history = crate::det::history();
        if self.history.replace(history) != history {
            *lock(self.registry) = Registry::default();
        }
        self.registry
    }
}

#[cfg(feature = "simulation")]
thread_local! {
    static SIMULATED: Simulated = Simulated {
        registry: Box::leak(Box::default()),
        history: std::cell::Cell::new(0),
    };
}

#[derive(Default)]
struct Registry {
    by_token: HashMap<Token, Vec<Entry>>,
    /// Calls since the whole registry was last swept of attempts that cannot act any more.
    since_sweep: usize,
}

impl Registry {
    /// Drops the attempts that cannot act any more: the token's own at every call, the whole
    /// registry once per as many calls as it has tokens (so each call's share stays small).
    fn sweep(&mut self, token: &Token) {
        let live = |e: &Entry| e.attempt.horizon().is_some();
        if let Some(entries) = self.by_token.get_mut(token) {
            entries.retain(live);
        }
        self.since_sweep += 1;
        if self.since_sweep >= self.by_token.len() {
            self.since_sweep = 0;
            self.by_token.retain(|_, entries| {
                entries.retain(live);
                !entries.is_empty()
            });
        }
    }
}

struct Entry {
    keys: Arc<[String]>,
    attempt: Arc<Attempt>,
}

/// One registered attempt.
struct Attempt {
    stage: Mutex<Stage>,
    /// Notified when the attempt starts or leaves.
    changed: Notify,
}

enum Stage {
    /// Waiting for the attempts before it; counts as starting until `until`.
    Starting { until: Instant },
    /// Done waiting, in time: sending its requests now (the attempt does so without pausing).
    Sending,
    /// Its requests were sent.
    Started(Unanswered),
    /// Left without sending anything, or settled.
    Done,
}

/// What a waiter does next in [`Attempt::settled`].
enum Next {
    /// Waits for a change until then, and looks again.
    Until(Instant),
    /// Waits for a change.
    Changed,
    /// Waits for the attempt's requests and cleanups.
    Settled(Unanswered),
}

impl Attempt {
    /// Until when the attempt may still act on the nodes; `None` once it cannot.
    fn horizon(&self) -> Option<Instant> {
        let now = Instant::now();
        match &*lock(&self.stage) {
            Stage::Starting { until } => (now < *until).then_some(*until),
            Stage::Sending => Some(now),
            Stage::Started(u) => {
                let by = u.settles_by();
                (now < by && u.any_unsettled()).then_some(by)
            }
            Stage::Done => None,
        }
    }

    /// Waits until the attempt cannot act on the nodes any more.
    ///
    /// A place that has not started counts as ended only when its end is seen together with
    /// its stage, under the stage's lock, where a start is claimed too: a waiter that woke at
    /// the end and went ahead without looking again went ahead of an attempt that had started
    /// moments before, whose cleanup then deleted what it kept (test `reclaim_attacks::a_
    /// waiter_polled_late_does_not_go_ahead_of_an_attempt_that_started_in_time`).
    async fn settled(&self) {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            let next = {
                let now = Instant::now();
                match &*lock(&self.stage) {
                    Stage::Starting { until } if now >= *until => return,
                    Stage::Starting { until } => Next::Until(*until),
                    // Started in time, and moments from `Started`.
                    Stage::Sending => Next::Changed,
                    Stage::Started(u) => Next::Settled(u.clone()),
                    Stage::Done => return,
                }
            };
            match next {
                // Looked at again when the end comes.
                Next::Until(end) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(end) => {}
                    }
                }
                Next::Changed => changed.await,
                Next::Settled(u) => return u.settled(u.settles_by()).await,
            }
        }
    }

    fn set(&self, stage: Stage) {
        *lock(&self.stage) = stage;
        self.changed.notify_waiters();
    }
}

/// An attempt's place among those with its token. Dropped before [`Turn::started`] (the
/// attempt was cancelled while it waited), it leaves at once.
pub(crate) struct Turn(Arc<Attempt>);

impl Turn {
    /// The attempt sent its requests: the ones after it wait for `phase` (none: nothing to
    /// wait for).
    pub(crate) fn started(self, phase: Option<Unanswered>) {
        self.0.set(phase.map_or(Stage::Done, Stage::Started));
    }

    /// Whether the place still holds up the attempts after it; if so, it goes on holding them
    /// up until the attempt started (checked and marked at once, so that none of them goes
    /// ahead between the check and the attempt's requests).
    fn claim(&self) -> bool {
        let mut stage = lock(&self.0.stage);
        let in_time = matches!(&*stage, Stage::Starting { until } if Instant::now() < *until);
        if in_time {
            *stage = Stage::Sending;
        }
        in_time
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let starting = matches!(
            &*lock(&self.0.stage),
            Stage::Starting { .. } | Stage::Sending
        );
        if starting {
            self.0.set(Stage::Done);
        }
    }
}

/// Lists a release of a lock with the caller's `token` on `keys` whose deletes are on their way:
/// the attempts with the token after it wait for them like for an earlier attempt's cleanup.
pub(crate) fn register(token: &Token, keys: &Arc<[String]>, deletes: Unanswered) {
    let mut all = lock(registry());
    all.sweep(token);
    all.by_token.entry(token.clone()).or_default().push(Entry {
        keys: Arc::clone(keys),
        attempt: Arc::new(Attempt {
            stage: Mutex::new(Stage::Started(deletes)),
            changed: Notify::new(),
        }),
    });
}

/// Takes a place for an attempt with the caller's `token` on `keys`, and waits until the
/// earlier attempts with the same token on any of those keys cannot act on the nodes any more
/// (see the module's documentation). The attempt must send its requests right after, and
/// report it with [`Turn::started`].
pub(crate) async fn take(token: &Token, keys: &Arc<[String]>) -> Turn {
    loop {
        let (earlier, turn) = {
            let mut all = lock(registry());
            all.sweep(token);
            let entries = all.by_token.entry(token.clone()).or_default();
            let earlier: Vec<Arc<Attempt>> = entries
                .iter()
                .filter(|e| e.keys.iter().any(|k| keys.contains(k)))
                .map(|e| Arc::clone(&e.attempt))
                .collect();
            let now = Instant::now();
            let horizon = earlier
                .iter()
                .filter_map(|a| a.horizon())
                .max()
                .map_or(now, |h| h.max(now));
            let attempt = Arc::new(Attempt {
                stage: Mutex::new(Stage::Starting {
                    until: horizon + START_SLACK,
                }),
                changed: Notify::new(),
            });
            entries.push(Entry {
                keys: Arc::clone(keys),
                attempt: Arc::clone(&attempt),
            });
            (earlier, Turn(attempt))
        };
        for attempt in &earlier {
            attempt.settled().await;
        }
        // Waited past its place (an earlier attempt started and took longer than its place
        // said, or this task ran late): the attempts after it may have gone ahead, and a new
        // place waits for them.
        if turn.claim() {
            return turn;
        }
    }
}
