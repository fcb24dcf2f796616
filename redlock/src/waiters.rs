//! Fast hand-off: release publishes on the resource's channel; waiters share one subscription
//! connection per node and retry as soon as any node reports a release. Local waiters on the
//! same resources take turns in FIFO order, so none of them starves behind its neighbours.
//!
//! Each node's subscription connection belongs to one long-lived task (started on first use,
//! holding only a `Weak` to the shared state, aborted when the client is dropped). The task keeps
//! the connection subscribed to every channel that has interest: it connects (bounded by the
//! connect timeout), subscribes, forwards messages to the channel's waiters, and when the
//! connection breaks or a command times out (a hung node) it re-opens it with a capped backoff
//! and subscribes everything again. After a re-connect it wakes every waiter once: a release may
//! have been published while it was not listening.
//!
//! A waiter never waits for every node: a release publishes on every node where the holder's key
//! was deleted, and a holder has its key on a quorum, so a waiter hears every release once
//! `N − quorum + 1` nodes confirmed its channel (every quorum includes one of them). `interest`
//! waits for that many confirmations, bounded by the node timeout (and not at all once too
//! few nodes are reachable to provide them); the other nodes subscribe in the background. A hung
//! node thus never puts its timeout on the acquire path.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::backend::Wake;
use crate::det::{HashMap, HashSet};
use crate::error::SubError;
use crate::pubsub::{Message, SubClient, SubSink, SubStream};

/// A channel nobody waited on for this long is unsubscribed (after the next new waiter).
const IDLE: Duration = Duration::from_secs(30);
/// Releases by a client in a row that let its own waiter retry without the stagger other
/// clients' waiters keep; the next release is then open to everyone alike, so a client with many
/// tasks cannot keep a hot lock to itself.
pub(crate) const LOCAL_STREAK: u32 = 4;
/// How long after a release another client listened to, on a channel this client does not
/// listen on, this client's next acquire still staggers: other clients' waiters attempt within
/// their stagger (at most two round trips, or 1 ms) of hearing the release, so past a second
/// the release is long decided.
const HEARD_ELSEWHERE_FOR: Duration = Duration::from_secs(1);
/// Such releases remembered at most: when full, the stale ones are dropped (all of them, if none
/// is stale).
const HEARD_ELSEWHERE_MAX: usize = 1024;
/// First pause before re-opening a broken subscription connection; doubled per failure.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest pause between attempts to re-open a subscription connection.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Channels per `SUBSCRIBE`: each command is bounded by the node timeout, and a client
/// re-subscribing many thousands of channels after a re-connect must not need one reply to
/// them all within it.
const SUBSCRIBE_CHUNK: usize = 512;
/// How many times one round of subscriptions may split a refused `SUBSCRIBE` in halves to find
/// the refused channels. Past that, a refused command's channels all count as refused until
/// they are asked for again: a user that may subscribe no channel would otherwise cost the node
/// about two commands per channel every [`REFUSED_RETRY`].
const REFUSED_SPLITS: usize = 32;
/// How long channels a node refused (an ACL rule) wait before they are asked for again.
const REFUSED_RETRY: Duration = Duration::from_secs(10);
/// The weight of the latest race in a channel's [`Channel::won_share`]: the average spans about
/// the last 1 / `RACE_WEIGHT` races.
const RACE_WEIGHT: f64 = 0.1;
/// How long after another client's release was heard on a channel this client's races for the
/// lock still count, and its lead still holds it back: without another client taking the lock
/// lately, a client re-acquiring it races nobody (an idle client may stay subscribed and be
/// counted among the contenders), and must not be held back for winning.
const CONTENDED_FOR: Duration = Duration::from_secs(1);
/// Wake-up ids a channel remembers: a release's messages from its N nodes arrive within a few
/// round trips of each other, so only the last few releases can still have messages on the way.
const RECENT: usize = 8;

/// Per-channel interest: the notifier local waiters sleep on, how many wait, and since when
/// nobody waits.
struct Channel {
    notify: Arc<Notify>,
    waiters: usize,
    idle_since: Option<tokio::time::Instant>,
    /// Releases by this client that handed the lock to a local waiter without the stagger.
    handoffs: u64,
    /// How many of the last releases by this client did so in a row.
    streak: u32,
    /// Until when a lock on this channel's resource that this client took (by an acquirer
    /// with interest) is valid, while no release of it was seen — this client's own, or
    /// another client's message (the lock may have been handed to another client): its other
    /// waiters wait for that release instead of attempting, which could only be refused.
    held_until: Option<tokio::time::Instant>,
    /// Whether the last release heard on the channel was this client's (no other client's
    /// release message since): a task of this client acquiring now would reach the nodes ahead
    /// of every other client's waiter (they hear of the release later, and stagger), so it
    /// staggers too (see [`Interest::ahead_of_others`]).
    released_here: bool,
    /// Whether another client may have heard this client's latest release on the channel that
    /// the nodes told of: some node counted more subscribers receiving its wake-up than this
    /// client's own subscription there, or no node said (see [`Waiters::release_heard`]). Kept
    /// until the next release's answers, so local waiters woken before those answers judge by
    /// the previous release.
    others_heard: bool,
    /// The latest releases' wake-up ids already acted on (by a local release or the first
    /// node's message), oldest first, each with the nodes whose message for it arrived (bit i
    /// for node i): the other nodes' messages for them wake nobody, but tell
    /// [`Interest::wait_for_node`] that the node has deleted the key. Third, the nodes whose
    /// second wake-up of the release arrived (see [`Heard::Resent`]).
    recent: std::collections::VecDeque<(Wake, u64, u64)>,
    /// Notified on every message on the channel, repeats included (see
    /// [`Interest::wait_for_node`]).
    heard: Arc<Notify>,
    /// The share of its recent races for the lock (attempts after a stagger, against other
    /// clients' waiters) that this client won: a moving average, each race weighing
    /// [`RACE_WEIGHT`] (see [`Interest::lead`]).
    won_share: f64,
    /// Clients that heard this client's latest release that the nodes told of, itself
    /// included: the number of contenders a fair share is counted among.
    contenders: u32,
    /// When another client's release of the lock was last heard. Subscribers outlive their
    /// waiters, so the number of contenders counts idle clients too; only while another client
    /// took and released the lock lately is a race a race (see [`CONTENDED_FOR`]).
    others_released: Option<tokio::time::Instant>,
}

impl Channel {
    /// Records release `wake` as published by each node marked in `nodes`.
    fn published_by(&mut self, wake: Wake, nodes: &[bool]) {
        for (i, _) in nodes.iter().enumerate().filter(|(_, s)| **s) {
            self.first(Some(wake), Some(i));
        }
    }

    /// Whether another client released the lock within [`CONTENDED_FOR`].
    fn contended(&self, now: tokio::time::Instant) -> bool {
        self.others_released
            .is_some_and(|at| now.saturating_duration_since(at) <= CONTENDED_FOR)
    }

    /// Records `wake` as acted on, heard from `node` (`None` for this client's own release),
    /// and says what it is to the channel. A message without an id always counts as new.
    fn first(&mut self, wake: Option<Wake>, node: Option<usize>) -> Heard {
        let Some(wake) = wake else {
            return Heard::New;
        };
        let bit = node.map_or(0, node_bit);
        if let Some((_, nodes, _)) = self.recent.iter_mut().find(|(w, _, _)| *w == wake) {
            *nodes |= bit;
            return Heard::Repeat;
        }
        if let Some((_, nodes, resent)) =
            self.recent.iter_mut().find(|(w, _, _)| w.resent() == wake)
        {
            *nodes |= bit;
            if *resent & bit != 0 {
                return Heard::Repeat;
            }
            *resent |= bit;
            return Heard::Resent;
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((wake, bit, 0));
        Heard::New
    }
}

/// What a message on a channel is to it (see [`Channel::first`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Heard {
    /// A release not heard of before (or a message without a wake-up id): it wakes the waiters.
    New,
    /// Another node's message of a release already heard: it wakes nobody.
    Repeat,
    /// A node's second wake-up of a release heard already ([`Wake::resent`]): its first went
    /// out before its delete (the server refused the native delete, and the release script
    /// followed). A waiter the first one woke was refused there and waits again: this one
    /// wakes the waiters, once per node. It stays part of the release it belongs to, as the
    /// latest release is what waits for a node's message wait for; as a release of its own,
    /// it hid the other nodes' messages from waits for them, which then ran out.
    Resent,
}

/// Node `i`'s bit in [`Channel::recent`]; nodes past the 64th share the last bit (a wait for
/// one of them may end early, never late).
fn node_bit(i: usize) -> u64 {
    1 << i.min(63)
}

/// What one node's subscription task reports.
#[derive(Default)]
struct NodeState {
    /// Channels the node confirmed on the open connection (and that are not being
    /// unsubscribed).
    subscribed: HashSet<String>,
    /// Channels the node refused on the open connection (see [`NodeSub::subscribe`]): not
    /// asked for again until [`REFUSED_RETRY`] passed or the connection is re-opened.
    refused: HashSet<String>,
    /// The last connection attempt or command failed; cleared once the node answers again.
    down: bool,
    /// How many times the connection was lost (and its subscriptions with it): a channel
    /// confirmed on one connection says nothing of the messages after a later one opened.
    lost: u64,
}

struct State {
    /// Channels with interest: what every node's connection should be subscribed to.
    channels: HashMap<String, Channel>,
    nodes: Vec<NodeState>,
    /// Channels this client does not listen on whose lock it released while another client
    /// listened, and when (see [`Waiters::standing`]).
    heard_elsewhere: HashMap<String, tokio::time::Instant>,
}

impl State {
    /// Nodes whose subscription to `channel` is confirmed.
    fn confirmed(&self, channel: &str) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.subscribed.contains(channel))
            .count()
    }
}

/// The state shared between the client and its subscription tasks.
struct Shared {
    state: Mutex<State>,
    /// Woken whenever a node's confirmations or reachability change.
    changed: Notify,
}

/// A running subscription task: `poke` makes it compare its subscriptions with the channels
/// of interest.
struct NodeTask {
    poke: Arc<Notify>,
    handle: AbortHandle,
}

/// How a wait for a node's message of the latest release ended (see
/// [`Interest::wait_for_node`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeWait {
    /// No wait: no release was heard, or the node's message of it had arrived already.
    Published,
    /// No wait: the node is not subscribed, and its message would never come.
    Unheard,
    /// The node's message arrived during the wait.
    Arrived,
    /// The limit ran out first.
    TimedOut,
    /// Another release was heard first (only from [`Interest::wait_for_node_or_release`]).
    NewRelease,
}

/// Where a client stands on a lock's channel before its first attempt (see
/// [`Waiters::standing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// It listens: a refusal can wait for the release at once.
    Listening,
    /// It does not listen, and released the lock a moment ago while another client listened.
    HeardElsewhere,
    /// Neither.
    Neither,
}

/// Subscriptions and local turn-taking for one client.
pub(crate) struct Waiters {
    shared: Arc<Shared>,
    /// Queues of single-resource locks, by key.
    turns: Arc<TurnMap>,
    /// Queues of multi-resource locks, by [`many_key`]: a map of their own, so that no single
    /// key (which may hold any character) names the queue of a set.
    turns_many: Arc<TurnMap>,
    clients: Vec<SubClient>,
    tasks: Mutex<Vec<Option<NodeTask>>>,
    timeout: Duration,
    connect_timeout: Duration,
}

impl std::fmt::Debug for Waiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiters")
            .field("nodes", &self.clients.len())
            .finish()
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        for task in lock(&self.tasks).iter().flatten() {
            task.handle.abort();
        }
    }
}

/// The FIFO queues of a client's acquirers, by set of resources; each entry lives as long as
/// someone is queued on it.
type TurnMap = Mutex<HashMap<Arc<str>, Weak<tokio::sync::Mutex<Queue>>>>;

/// The queue name of a multi-resource lock: each key with its length in front, so that no two
/// lists of keys share a name whatever characters the keys hold (joining them with a separator
/// let `["a", "b"]` and a single resource named `"a\nb"` share one). The keys are sorted: the
/// queue is the set's, as docs/leases.md says, and `["a", "b"]` and `["b", "a"]` (two sets
/// iterated in different orders) had two queues, whose tasks did not take turns (found in
/// review).
fn many_key(keys: &[String]) -> String {
    use std::fmt::Write;
    let mut sorted: Vec<&String> = keys.iter().collect();
    sorted.sort_unstable();
    let mut name = String::with_capacity(keys.iter().map(|k| k.len() + 4).sum());
    for key in sorted {
        let _ = write!(name, "{}:{key}", key.len());
    }
    name
}

/// The FIFO queue of one client's acquirers of one set of resources: the turns are the locks of
/// a tokio mutex, which queues its lockers in arrival order. Leaves the map with its last
/// handle.
struct Queue {
    key: Arc<str>,
    turns: Weak<TurnMap>,
}

impl Drop for Queue {
    fn drop(&mut self) {
        let Some(turns) = self.turns.upgrade() else {
            return;
        };
        let mut turns = lock(&turns);
        // A new queue may have taken the key since the last handle went; keep that one.
        if turns.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            turns.remove(&self.key);
        }
    }
}

/// A turn in the FIFO queue of one set of resources: the next acquirer's turn starts when it is
/// dropped.
pub(crate) struct Turn {
    _held: tokio::sync::OwnedMutexGuard<Queue>,
}

/// A waiter's registration. The subscription outlives it: a hot key's waiters come and go far
/// faster than a subscribe round trip, so channels are dropped only after [`IDLE`].
pub(crate) struct Interest {
    waiters: Arc<Waiters>,
    channel: String,
    pub(crate) notify: Arc<Notify>,
    /// Notified on every message on the channel, the other nodes' messages of a release
    /// already acted on included.
    pub(crate) heard: Arc<Notify>,
}

impl Drop for Interest {
    fn drop(&mut self) {
        if let Some(c) = lock(&self.waiters.shared.state)
            .channels
            .get_mut(&self.channel)
        {
            c.waiters = c.waiters.saturating_sub(1);
            if c.waiters == 0 {
                c.idle_since = Some(tokio::time::Instant::now());
            }
        }
    }
}

/// What [`Interest::wait_for_local_holder`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalHolder {
    /// No lock of this client is known to hold the channel's resource (any more), or the
    /// wait's limit passed: attempt.
    NotHeld,
    /// A release was seen; `handed` when it was a local hand-off (see [`Interest::handoffs`]).
    Released { handed: bool },
}

impl Interest {
    /// Records that an acquirer with this interest took the lock, valid until `until`: until
    /// this client releases it (or `until` passes), [`Interest::wait_for_local_holder`] waits.
    /// (A guard of this client is recorded by [`Interest::held_by`].)
    pub(crate) fn taken(&self, until: tokio::time::Instant) {
        if let Some(c) = lock(&self.waiters.shared.state)
            .channels
            .get_mut(&self.channel)
        {
            c.held_until = Some(until);
        }
    }

    /// Records the lock as held until the time `holder` answers, if it answers one: a guard
    /// of this client (looked up in its renewer). `holder` runs under the waiters' lock, which
    /// a release takes to clear the record (see [`Waiters::notify_local`]), so a record made
    /// from a lookup that came before the release is cleared by it, and one after it finds
    /// nothing: a lookup and its record taken one after the other put a released guard's
    /// validity back after the release had cleared it, and another waiter slept until then
    /// with the lock free. Returns whether the lock is now recorded as held by this client
    /// (by a guard, or by a lock one of its waiting acquirers took).
    pub(crate) fn held_by(&self, holder: impl FnOnce() -> Option<tokio::time::Instant>) -> bool {
        let mut state = lock(&self.waiters.shared.state);
        let Some(c) = state.channels.get_mut(&self.channel) else {
            return false;
        };
        if let Some(until) = holder() {
            c.held_until = Some(until);
        }
        c.held_until
            .is_some_and(|until| until > tokio::time::Instant::now())
    }

    /// While this client holds a lock on the channel's resource, waits — at most `limit` — for
    /// a release: this client's (see [`Waiters::notify_local`]), or any other client's message
    /// on the channel (the lock may have been handed to another client and released there).
    /// Repeats of a release already acted on do not end the wait.
    pub(crate) async fn wait_for_local_holder(&self, limit: Duration) -> LocalHolder {
        // `limit` follows the retry policy, which may be a century (`Duration::MAX` too).
        let deadline = crate::lock::far_after(tokio::time::Instant::now(), limit);
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let (held_until, handoffs) = {
                let state = lock(&self.waiters.shared.state);
                let c = state.channels.get(&self.channel);
                (c.and_then(|c| c.held_until), c.map_or(0, |c| c.handoffs))
            };
            let now = tokio::time::Instant::now();
            let Some(until) = held_until.filter(|u| *u > now) else {
                return LocalHolder::NotHeld;
            };
            crate::det::select! {
                () = notified => {}
                () = tokio::time::sleep_until(until.min(deadline)) => return LocalHolder::NotHeld,
            }
            let (released, handed) = {
                let state = lock(&self.waiters.shared.state);
                let c = state.channels.get(&self.channel);
                (
                    c.is_none_or(|c| c.held_until.is_none()),
                    c.is_some_and(|c| c.handoffs != handoffs),
                )
            };
            if released {
                return LocalHolder::Released { handed };
            }
        }
    }

    /// Waits — at most `limit` — until node `node` has published the latest release heard on
    /// the channel (its message arrived), so that an attempt sent to that node first finds the
    /// key deleted there. A waiter acts on the first node's message; the release may still be
    /// on its way to the others (the releasing client opening its connection to them, say), and
    /// an attempt refused by a node the release had not reached yet then slept out its retry
    /// delay, since the other nodes' messages of that release wake nobody.
    ///
    /// Returns at once when no release was heard or the node published it
    /// ([`NodeWait::Published`]), or when the node is not subscribed: its message would never
    /// come ([`NodeWait::Unheard`]).
    pub(crate) async fn wait_for_node(&self, node: usize, limit: Duration) -> NodeWait {
        self.wait_node(node, limit, false).await
    }

    /// [`wait_for_node`](Self::wait_for_node) that also ends when another release is heard on
    /// the channel ([`NodeWait::NewRelease`]): a waiter waiting for one node's message of a
    /// release in place of its pause must not miss the next release (the node may never
    /// publish this one: its delete found nothing, say).
    pub(crate) async fn wait_for_node_or_release(&self, node: usize, limit: Duration) -> NodeWait {
        self.wait_node(node, limit, true).await
    }

    async fn wait_node(&self, node: usize, limit: Duration, or_release: bool) -> NodeWait {
        let deadline = crate::lock::far_after(tokio::time::Instant::now(), limit);
        let mut waited = false;
        let latest = |state: &State| {
            state
                .channels
                .get(&self.channel)
                .and_then(|c| c.recent.back().map(|(w, _, _)| *w))
        };
        let before = latest(&lock(&self.waiters.shared.state));
        loop {
            let heard = self.heard.notified();
            let mut heard = std::pin::pin!(heard);
            heard.as_mut().enable();
            {
                let state = lock(&self.waiters.shared.state);
                if or_release && latest(&state) != before {
                    return NodeWait::NewRelease;
                }
                let subscribed = state
                    .nodes
                    .get(node)
                    .is_some_and(|n| n.subscribed.contains(&self.channel));
                match (self.published(&state, node), waited, subscribed) {
                    (true, false, _) => return NodeWait::Published,
                    (true, true, _) => return NodeWait::Arrived,
                    (false, _, false) => return NodeWait::Unheard,
                    (false, _, true) => {}
                }
            }
            crate::det::select! {
                () = heard => waited = true,
                () = tokio::time::sleep_until(deadline) => return NodeWait::TimedOut,
            }
        }
    }

    /// Which connection to node `node` has confirmed the channel, if one has: the node, and
    /// how many of its connections were lost before this one (see
    /// [`Interest::listened_since`]).
    pub(crate) fn listening(&self, node: usize) -> Option<Listening> {
        let state = lock(&self.waiters.shared.state);
        state
            .nodes
            .get(node)
            .filter(|n| n.subscribed.contains(&self.channel))
            .map(|n| Listening { node, lost: n.lost })
    }

    /// Whether node `node` still listens on the channel on the connection that confirmed it
    /// when [`listening`](Self::listening) said `then`. A node that refused an attempt sent
    /// after that publishes its delete of the key it refused with on this connection, so its
    /// message comes; one that confirmed the channel later may have published the release
    /// before its `SUBSCRIBE` arrived, and its message never comes (a waiter woken by another
    /// node's message waited for it its whole node timeout: test `handoff::a_first_node_
    /// subscribed_after_it_published_the_release_is_not_waited_for`).
    pub(crate) fn listened_since(&self, node: usize, then: Option<Listening>) -> bool {
        then.is_some() && self.listening(node) == then
    }

    /// Whether no release was heard on the channel yet, or node `node`'s message of the latest
    /// one arrived.
    pub(crate) fn node_published(&self, node: usize) -> bool {
        self.published(&lock(&self.waiters.shared.state), node)
    }

    fn published(&self, state: &State, node: usize) -> bool {
        state
            .channels
            .get(&self.channel)
            .and_then(|c| c.recent.back())
            .is_none_or(|(_, nodes, _)| nodes & node_bit(node) != 0)
    }

    /// Whether an acquire made now would reach the nodes ahead of other clients' waiters: the
    /// last release heard on the channel was this client's, and another client may have heard
    /// it too (with nobody else subscribed, there is nobody to be ahead of).
    pub(crate) fn ahead_of_others(&self) -> bool {
        lock(&self.waiters.shared.state)
            .channels
            .get(&self.channel)
            .is_some_and(|c| c.released_here && c.others_heard)
    }

    /// Whether other clients' waiters may be racing for the lock after the release just heard:
    /// it was another client's, or this client's while other clients listened (see
    /// [`Channel::others_heard`]). If not, a waiter woken by it has nobody to stagger against.
    pub(crate) fn others_compete(&self) -> bool {
        lock(&self.waiters.shared.state)
            .channels
            .get(&self.channel)
            .is_none_or(|c| !c.released_here || c.others_heard)
    }

    /// Records the result of a race for the lock: an attempt made after a stagger, against
    /// other clients' waiters woken by the same release.
    /// Counted only while another client released the lock within [`CONTENDED_FOR`], and
    /// after this client's own release only when lost: a task of this client coming back for
    /// the lock then may race nobody but idle subscribers, which it cannot tell from waiters,
    /// but another client took the lock from it when it lost. Leaving out every race after
    /// its own release made each of two clients taking turns (each the releaser of every
    /// other race, and losing it) look like the winner of every race it ran, twice a fair
    /// share, and held back both by 2.5–2.8 stagger ranges on average (test
    /// `local_fifo::two_clients_taking_turns_are_not_held_back_for_winning`).
    pub(crate) fn raced(&self, won: bool) {
        let now = tokio::time::Instant::now();
        if let Some(c) = lock(&self.waiters.shared.state)
            .channels
            .get_mut(&self.channel)
            && !(c.released_here && won)
            && c.contended(now)
        {
            c.won_share = c.won_share * (1.0 - RACE_WEIGHT) + if won { RACE_WEIGHT } else { 0.0 };
        }
    }

    /// How much more than its fair share of the recent races this client won (0 when not
    /// more), which lengthens its next stagger. A node sends a release's message to its
    /// subscribers one after another, always in the same order, and a busy client process
    /// wakes its waiters late: the clients that hear first win more than their share however
    /// the stagger is drawn. Holding back the clients that win more than their share lets the
    /// others catch up, and costs nothing while the races are shared fairly. Nothing either
    /// unless another client released the lock within [`CONTENDED_FOR`].
    pub(crate) fn lead(&self) -> f64 {
        let now = tokio::time::Instant::now();
        lock(&self.waiters.shared.state)
            .channels
            .get(&self.channel)
            .filter(|c| c.contended(now))
            .map_or(0.0, |c| {
                (c.won_share - 1.0 / f64::from(c.contenders.max(1))).max(0.0)
            })
    }

    /// Local hand-offs on the channel so far: when it grew while a waiter slept, the wake-up was
    /// a release by this client meant for it, and it retries at once instead of after the
    /// stagger that keeps the waiters of several clients from splitting the nodes' votes.
    pub(crate) fn handoffs(&self) -> u64 {
        lock(&self.waiters.shared.state)
            .channels
            .get(&self.channel)
            .map_or(0, |c| c.handoffs)
    }
}

/// A node's connection that confirmed a channel (see [`Interest::listening`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listening {
    node: usize,
    /// Connections to the node lost before this one.
    lost: u64,
}

/// A mutex's guard, however an earlier holder of it panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Waiters {
    /// `timeout` bounds one subscription command and a waiter's wait for confirmations;
    /// `connect_timeout` bounds opening a subscription connection.
    pub(crate) fn new(
        clients: Vec<SubClient>,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        let n = clients.len();
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    channels: HashMap::default(),
                    heard_elsewhere: HashMap::default(),
                    nodes: (0..n).map(|_| NodeState::default()).collect(),
                }),
                changed: Notify::new(),
            }),
            turns: Arc::default(),
            turns_many: Arc::default(),
            clients,
            tasks: Mutex::new((0..n).map(|_| None).collect()),
            timeout,
            connect_timeout,
        }
    }

    /// Joins the FIFO queue of this client's acquirers of the lock on `keys` (one queue per set
    /// of resources) and waits up to `limit` for its turn, which lasts until the returned
    /// [`Turn`] is dropped. `None` when the limit passed first (the place in the queue is given
    /// up).
    pub(crate) async fn turn(&self, keys: &[String], limit: Duration) -> Option<Turn> {
        let (map, key) = match keys {
            [key] => (&self.turns, std::borrow::Cow::Borrowed(key.as_str())),
            keys => (&self.turns_many, std::borrow::Cow::Owned(many_key(keys))),
        };
        let queue = {
            let mut turns = lock(map);
            match turns.get(&*key).and_then(Weak::upgrade) {
                Some(q) => q,
                None => {
                    let key: Arc<str> = Arc::from(&*key);
                    let q = Arc::new(tokio::sync::Mutex::new(Queue {
                        key: Arc::clone(&key),
                        turns: Arc::downgrade(map),
                    }));
                    turns.insert(key, Arc::downgrade(&q));
                    q
                }
            }
        };
        let held = tokio::time::timeout(limit, queue.lock_owned()).await.ok()?;
        Some(Turn { _held: held })
    }

    /// Wakes local waiters on `channel` at once (a release by this client, whose nodes will
    /// publish `wake`: those messages then wake nobody here). While a local waiter is there, up
    /// to [`LOCAL_STREAK`] releases in a row are local hand-offs (see [`Interest::handoffs`]);
    /// the one after that is not.
    ///
    /// Nodes in `spared` (the release does not go there: none of the lock's requests reached
    /// them) count as having published it: they have nothing of the lock to delete, and a
    /// waiter waiting for such a first node's message waited out its node timeout (test
    /// `waiting::a_local_waiter_does_not_wait_for_a_first_node_the_release_spared`).
    pub(crate) fn notify_local(&self, channel: &str, wake: Wake, spared: &[bool]) {
        if let Some(c) = lock(&self.shared.state).channels.get_mut(channel) {
            c.first(Some(wake), None);
            c.published_by(wake, spared);
            c.held_until = None;
            c.released_here = true;
            if c.waiters > 0 {
                if c.streak < LOCAL_STREAK {
                    c.streak += 1;
                    c.handoffs += 1;
                } else {
                    c.streak = 0;
                }
            }
            c.notify.notify_waiters();
            c.heard.notify_waiters();
        }
    }

    /// Nodes in `none` answered this client's release `wake` on `channel` that they deleted
    /// nothing (the key was gone: a restart without its data, an eviction; or someone else's):
    /// they publish nothing of it, and count as having published it. A local waiter waiting
    /// for such a first node's message waited out its node timeout (test `waiting::a_local_
    /// waiter_does_not_wait_for_a_first_node_that_lost_the_holders_key`).
    pub(crate) fn published_nothing(&self, channel: &str, wake: Wake, none: &[bool]) {
        if let Some(c) = lock(&self.shared.state).channels.get_mut(channel) {
            c.published_by(wake, none);
            c.heard.notify_waiters();
        }
    }

    /// Whether this client listens on `channel`: a task of it waits for a release there, or
    /// did lately (see [`IDLE`]).
    pub(crate) fn listens_on(&self, channel: &str) -> bool {
        lock(&self.shared.state).channels.contains_key(channel)
    }

    /// What the nodes told of this client's release on `channels`: per node, how many
    /// subscribers received its wake-ups there. A node that counted more than this client's own
    /// confirmed subscriptions on it had another client listening. With no node telling (the
    /// release deleted nothing, every publish failed, or the nodes are simulated), another
    /// client is assumed to have heard.
    pub(crate) fn release_heard(&self, channels: &[String], heard: &[Option<u32>]) {
        let mut state = lock(&self.shared.state);
        let mut told = false;
        // The most other clients' subscriptions any node counted.
        let mut others = 0usize;
        for (i, heard) in heard.iter().enumerate() {
            let (Some(heard), Some(node)) = (heard, state.nodes.get(i)) else {
                continue;
            };
            told = true;
            let ours = channels
                .iter()
                .filter(|c| node.subscribed.contains(*c))
                .count();
            others = others.max(
                usize::try_from(*heard)
                    .unwrap_or(usize::MAX)
                    .saturating_sub(ours),
            );
        }
        let now = tokio::time::Instant::now();
        let others_listen = others > 0;
        for name in channels {
            if let Some(c) = state.channels.get_mut(name) {
                c.others_heard = others_listen || !told;
                if told {
                    c.contenders = u32::try_from(others).unwrap_or(u32::MAX).saturating_add(1);
                }
            } else if others_listen {
                // This client does not listen here, so it would not know others wait.
                if state.heard_elsewhere.len() >= HEARD_ELSEWHERE_MAX {
                    state
                        .heard_elsewhere
                        .retain(|_, at| now - *at <= HEARD_ELSEWHERE_FOR);
                    if state.heard_elsewhere.len() >= HEARD_ELSEWHERE_MAX {
                        state.heard_elsewhere.clear();
                    }
                }
                state.heard_elsewhere.insert(name.clone(), now);
            }
        }
    }

    /// Where this client stands on `channel` before its first attempt, in one look at the
    /// shared state: whether it listens there (see [`Waiters::subscribed`]), and if not,
    /// whether it released the lock within [`HEARD_ELSEWHERE_FOR`] while another client
    /// listened. That client's waiter heard of the release after this client did and
    /// staggers, so this client's own next attempt should too; each such release is answered
    /// once.
    pub(crate) fn standing(&self, channel: &str) -> Standing {
        let mut state = lock(&self.shared.state);
        if self.listens(&state, channel) {
            return Standing::Listening;
        }
        match state.heard_elsewhere.remove(channel) {
            Some(at) if at.elapsed() <= HEARD_ELSEWHERE_FOR => Standing::HeardElsewhere,
            _ => Standing::Neither,
        }
    }

    /// Confirmations a channel needs so that every quorum includes a node that confirmed it.
    fn needed(&self) -> usize {
        let n = self.clients.len();
        n - (n / 2 + 1) + 1
    }

    /// Registers interest in `channel` and waits (bounded by the node timeout, and by `until`
    /// when given) until enough nodes confirmed the subscription that every release reaches
    /// this client; the rest subscribe in the background. Subscription failures are not
    /// errors: waiters then fall back to their retry delay.
    pub(crate) async fn interest(
        self: &Arc<Self>,
        channel: &str,
        until: Option<tokio::time::Instant>,
    ) -> Interest {
        let now = tokio::time::Instant::now();
        let (notify, heard, changed) = {
            let mut state = lock(&self.shared.state);
            let before = state.channels.len();
            state
                .channels
                .retain(|_, c| c.idle_since.is_none_or(|t| now - t <= IDLE));
            let mut changed = state.channels.len() != before;
            let c = state.channels.entry(channel.to_owned()).or_insert_with(|| {
                changed = true;
                Channel {
                    notify: Arc::new(Notify::new()),
                    waiters: 0,
                    idle_since: None,
                    handoffs: 0,
                    streak: 0,
                    recent: std::collections::VecDeque::with_capacity(RECENT),
                    heard: Arc::new(Notify::new()),
                    held_until: None,
                    released_here: false,
                    others_heard: true,
                    won_share: 0.0,
                    contenders: 1,
                    others_released: None,
                }
            });
            c.waiters += 1;
            c.idle_since = None;
            (Arc::clone(&c.notify), Arc::clone(&c.heard), changed)
        };
        // Registered before any wait, so a cancelled caller still drops its interest.
        let interest = Interest {
            waiters: Arc::clone(self),
            channel: channel.to_owned(),
            notify,
            heard,
        };
        self.run_tasks(changed);
        let needed = self.needed();
        let mut end = tokio::time::Instant::now() + self.timeout;
        if let Some(until) = until {
            end = end.min(until);
        }
        let _ = tokio::time::timeout_at(end, async {
            loop {
                let changed = self.shared.changed.notified();
                let mut changed = std::pin::pin!(changed);
                changed.as_mut().enable();
                if self.settled(channel, needed) {
                    return;
                }
                changed.await;
            }
        })
        .await;
        interest
    }

    /// Whether enough nodes confirmed a subscription to `channel` that a release cannot go
    /// unheard (a channel waited on recently keeps its subscription for a while).
    pub(crate) fn subscribed(&self, channel: &str) -> bool {
        self.listens(&lock(&self.shared.state), channel)
    }

    fn listens(&self, state: &State, channel: &str) -> bool {
        state.channels.contains_key(channel) && state.confirmed(channel) >= self.needed()
    }

    /// Whether `channel` has `needed` confirmations, or cannot get them soon because too many
    /// nodes are down.
    fn settled(&self, channel: &str, needed: usize) -> bool {
        let state = lock(&self.shared.state);
        let confirmed = state.confirmed(channel);
        let pending = state
            .nodes
            .iter()
            .filter(|n| !n.down && !n.subscribed.contains(channel) && !n.refused.contains(channel))
            .count();
        confirmed >= needed || confirmed + pending < needed
    }

    /// Starts every node's subscription task that is not running (first use, or its runtime
    /// went away) and, if the channels of interest `changed`, tells the running ones.
    fn run_tasks(&self, changed: bool) {
        let mut tasks = lock(&self.tasks);
        for (index, slot) in tasks.iter_mut().enumerate() {
            match slot {
                Some(task) if !task.handle.is_finished() => {
                    if changed {
                        task.poke.notify_one();
                    }
                }
                _ => {
                    // A new task opens a new connection: it counts as one more lost, so that
                    // nothing the old one confirmed passes for the new one's.
                    let mut state = lock(&self.shared.state);
                    let lost = state.nodes[index].lost + 1;
                    state.nodes[index] = NodeState {
                        lost,
                        ..NodeState::default()
                    };
                    drop(state);
                    let poke = Arc::new(Notify::new());
                    let node = NodeSub {
                        shared: Arc::downgrade(&self.shared),
                        index,
                        client: self.clients[index].clone(),
                        poke: Arc::clone(&poke),
                        timeout: self.timeout,
                        connect_timeout: self.connect_timeout,
                    };
                    let handle = tokio::spawn(node.run()).abort_handle();
                    *slot = Some(NodeTask { poke, handle });
                }
            }
        }
    }
}

/// Why a connection's service ended.
enum Ended {
    /// The connection broke or a command failed or timed out: re-open it.
    Broken,
    /// The client is gone.
    Gone,
}

/// One node's subscription task.
struct NodeSub {
    shared: Weak<Shared>,
    index: usize,
    client: SubClient,
    poke: Arc<Notify>,
    timeout: Duration,
    connect_timeout: Duration,
}

impl NodeSub {
    async fn run(self) {
        let mut backoff = BACKOFF_MIN;
        let mut reconnect = false;
        loop {
            let opened = tokio::time::timeout(self.connect_timeout, self.client.open()).await;
            if let Ok(Ok((sink, stream))) = opened {
                match self.serve(sink, stream, &mut reconnect, &mut backoff).await {
                    Ended::Gone => return,
                    Ended::Broken => {}
                }
            }
            let Some(shared) = self.shared.upgrade() else {
                return;
            };
            {
                let mut state = lock(&shared.state);
                let node = &mut state.nodes[self.index];
                node.lost += 1;
                node.subscribed.clear();
                node.refused.clear();
                node.down = true;
            }
            shared.changed.notify_waiters();
            drop(shared);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Keeps one open connection subscribed to the channels of interest until it breaks.
    async fn serve(
        &self,
        sink: SubSink,
        mut stream: SubStream,
        reconnect: &mut bool,
        backoff: &mut Duration,
    ) -> Ended {
        let mut verified = false;
        // When the channels the node refused are asked for again (its ACL may have changed).
        let mut retry_refused: Option<tokio::time::Instant> = None;
        loop {
            // Compare the connection's subscriptions with the channels of interest. A channel
            // to unsubscribe stops counting as confirmed before its UNSUBSCRIBE is sent; one
            // wanted again meanwhile is subscribed in the next round (the poke is kept), after
            // the UNSUBSCRIBE on the same connection, so it cannot be overtaken by it.
            let (subscribe, unsubscribe) = {
                let Some(shared) = self.shared.upgrade() else {
                    return Ended::Gone;
                };
                let mut state = lock(&shared.state);
                let State {
                    channels, nodes, ..
                } = &mut *state;
                let node = &mut nodes[self.index];
                node.refused.retain(|c| channels.contains_key(c));
                let unsubscribe: Vec<String> = node
                    .subscribed
                    .iter()
                    .filter(|c| !channels.contains_key(*c))
                    .cloned()
                    .collect();
                for c in &unsubscribe {
                    node.subscribed.remove(c);
                }
                let subscribe: Vec<String> = channels
                    .keys()
                    .filter(|c| !node.subscribed.contains(*c) && !node.refused.contains(*c))
                    .cloned()
                    .collect();
                (subscribe, unsubscribe)
            };
            if !unsubscribe.is_empty() {
                let mut s = sink.clone();
                let done = self
                    .command(
                        &mut stream,
                        async move { s.unsubscribe(&unsubscribe).await },
                    )
                    .await;
                if let Err(ended) = done.and_then(|r| r.map_err(|_| Ended::Broken)) {
                    return ended;
                }
            }
            if !subscribe.is_empty() {
                match self.subscribe(&sink, &mut stream, &subscribe).await {
                    Ok(0) => {}
                    Ok(_) => {
                        retry_refused
                            .get_or_insert_with(|| tokio::time::Instant::now() + REFUSED_RETRY);
                    }
                    Err(ended) => return ended,
                }
            } else if !verified {
                // Nothing to subscribe: make sure the node answers before counting it as up.
                let mut s = sink.clone();
                let done = self
                    .command(&mut stream, async move { s.ping().await })
                    .await;
                if let Err(ended) = done.and_then(|r| r.map_err(|_| Ended::Broken)) {
                    return ended;
                }
            }
            let Some(shared) = self.shared.upgrade() else {
                return Ended::Gone;
            };
            {
                let mut state = lock(&shared.state);
                state.nodes[self.index].down = false;
                if !verified && *reconnect {
                    // Releases published while the connection was down went unheard.
                    for c in state.channels.values_mut() {
                        c.held_until = None;
                        c.notify.notify_waiters();
                    }
                }
            }
            shared.changed.notify_waiters();
            drop(shared);
            if !verified {
                verified = true;
                *reconnect = true;
                *backoff = BACKOFF_MIN;
            }
            // Forward messages until the channels of interest change, or the refused ones are
            // due to be asked for again.
            let due = retry_refused;
            let retry = async move {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let mut retry = std::pin::pin!(retry);
            loop {
                crate::det::select! {
                    () = self.poke.notified() => break,
                    () = &mut retry => {
                        retry_refused = None;
                        if let Some(shared) = self.shared.upgrade() {
                            lock(&shared.state).nodes[self.index].refused.clear();
                        }
                        break;
                    }
                    msg = stream.next() => match msg {
                        Some(msg) => {
                            if !self.forward(&msg) {
                                return Ended::Gone;
                            }
                        }
                        None => return Ended::Broken,
                    },
                }
            }
        }
    }

    /// Subscribes `channels`, at most [`SUBSCRIBE_CHUNK`] per command, each command bounded by
    /// the timeout. Each confirmed chunk counts at once. A chunk the node refuses (an ACL rule
    /// on some of its channels: the whole command is refused) is split in halves until the
    /// refused channels are found alone (at most [`REFUSED_SPLITS`] splits); those are recorded
    /// as refused on this node, so one channel the node will not allow cannot keep the others
    /// unsubscribed. The number of channels refused, or why the connection must be re-opened.
    async fn subscribe(
        &self,
        sink: &SubSink,
        stream: &mut SubStream,
        channels: &[String],
    ) -> Result<usize, Ended> {
        let mut refused = 0;
        let mut parts: Vec<&[String]> = channels.chunks(SUBSCRIBE_CHUNK).rev().collect();
        // Splits left: each costs one more command.
        let mut splits = REFUSED_SPLITS;
        while let Some(part) = parts.pop() {
            let mut s = sink.clone();
            let reply = self
                .command(stream, async move { s.subscribe(part).await })
                .await?;
            let Some(shared) = self.shared.upgrade() else {
                return Err(Ended::Gone);
            };
            let mut state = lock(&shared.state);
            let node = &mut state.nodes[self.index];
            match reply {
                Ok(()) => node.subscribed.extend(part.iter().cloned()),
                Err(SubError::Refused) if part.len() > 1 && splits > 0 => {
                    splits -= 1;
                    let (first, second) = part.split_at(part.len() / 2);
                    parts.push(second);
                    parts.push(first);
                }
                Err(SubError::Refused) => {
                    if refused == 0 {
                        tracing::warn!(
                            node = self.index,
                            channel = %part[0],
                            "the node refused a subscription (an ACL channel rule?): waiters on \
                             the channel fall back to their retry delay there"
                        );
                    }
                    refused += part.len();
                    node.refused.extend(part.iter().cloned());
                }
                Err(SubError::Broken) => return Err(Ended::Broken),
            }
            drop(state);
            shared.changed.notify_waiters();
        }
        Ok(refused)
    }

    /// Runs one subscription command, bounded by the timeout, while forwarding the messages
    /// that arrive meanwhile: the node's reply, or why the connection must be re-opened (it
    /// broke or timed out).
    async fn command<F>(
        &self,
        stream: &mut SubStream,
        command: F,
    ) -> Result<Result<(), SubError>, Ended>
    where
        F: Future<Output = Result<(), SubError>>,
    {
        let command = tokio::time::timeout(self.timeout, command);
        let mut command = std::pin::pin!(command);
        loop {
            crate::det::select! {
                result = &mut command => {
                    return result.map_err(|_| Ended::Broken);
                }
                msg = stream.next() => match msg {
                    Some(msg) => {
                        if !self.forward(&msg) {
                            return Err(Ended::Gone);
                        }
                    }
                    None => return Err(Ended::Broken),
                },
            }
        }
    }

    /// Wakes the waiters on the message's channel, unless another node's message of the same
    /// release did already; `false` if the client is gone.
    fn forward(&self, msg: &Message) -> bool {
        let Some(shared) = self.shared.upgrade() else {
            return false;
        };
        let mut state = lock(&shared.state);
        let Some(c) = state.channels.get_mut(msg.channel()) else {
            return true;
        };
        let heard = c.first(Wake::parse(msg.payload()), Some(self.index));
        c.heard.notify_waiters();
        if heard == Heard::Resent {
            c.notify.notify_waiters();
        }
        if heard == Heard::New {
            // Another client's release: if it released the lock this client took (handed to
            // it), the local waiters must not wait for a release of their own.
            c.held_until = None;
            c.released_here = false;
            c.others_released = Some(tokio::time::Instant::now());
            c.notify.notify_waiters();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_of_resources_has_one_queue_whatever_its_order() {
        let k = |keys: &[&str]| many_key(&keys.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(k(&["a", "b"]), k(&["b", "a"]));
        assert_eq!(k(&["x", "a", "m"]), k(&["m", "x", "a"]));
        assert_ne!(k(&["a", "b"]), k(&["a\nb"]));
        assert_ne!(k(&["a", "b"]), k(&["a", "c"]));
    }

    /// Nothing listens on port 1: the subscription task fails at once and `interest` returns.
    fn waiters() -> Arc<Waiters> {
        let client = redis::Client::open("redis://127.0.0.1:1").expect("a valid URL");
        Arc::new(Waiters::new(
            vec![SubClient::Redis(client)],
            Duration::from_millis(20),
            Duration::from_millis(20),
        ))
    }

    /// Records that another client released the lock on `channel` just now.
    fn another_client_released(w: &Waiters, channel: &str) {
        lock(&w.shared.state)
            .channels
            .get_mut(channel)
            .expect("the channel")
            .others_released = Some(tokio::time::Instant::now());
    }

    #[tokio::test]
    async fn a_release_wakes_once_however_many_nodes_publish_it() {
        let w = waiters();
        let interest = w.interest("c", None).await;
        let first = |wake: Option<Wake>| {
            lock(&w.shared.state)
                .channels
                .get_mut("c")
                .expect("channel of interest")
                .first(wake, Some(0))
                == Heard::New
        };
        // This client's own release: the nodes' messages of it wake nobody here.
        let own = Wake(0x5eed);
        w.notify_local("c", own, &[]);
        assert!(!first(Some(own)));
        // Another client's release: its first message wakes, the other nodes' do not.
        let other = Wake(7);
        assert!(first(Some(other)));
        assert!(!first(Some(other)));
        // A message without an id is never taken for a repeat.
        assert!(first(None));
        assert!(first(None));
        // Only the latest releases are remembered.
        for id in 100..100 + RECENT as u64 {
            assert!(first(Some(Wake(id))));
        }
        assert!(
            first(Some(other)),
            "forgotten after {RECENT} newer releases"
        );
        drop(interest);
    }

    #[tokio::test]
    async fn a_resent_wake_up_wakes_once_per_node_and_stays_part_of_its_release() {
        let w = waiters();
        let interest = w.interest("c", None).await;
        let heard = |wake: Wake, node: usize| {
            lock(&w.shared.state)
                .channels
                .get_mut("c")
                .expect("channel of interest")
                .first(Some(wake), Some(node))
        };
        let x = Wake(0x1234);
        assert_eq!(heard(x, 0), Heard::New);
        assert_eq!(heard(x, 1), Heard::Repeat);
        // Node 0's delete was refused natively: its script's wake-up follows.
        assert_eq!(heard(x.resent(), 0), Heard::Resent);
        assert_eq!(heard(x.resent(), 0), Heard::Repeat);
        assert_eq!(heard(x.resent(), 1), Heard::Resent);
        // Still the latest release: node 2's message of it is what a wait for node 2 awaits.
        assert!(!interest.node_published(2));
        assert_eq!(heard(x, 2), Heard::Repeat);
        assert!(interest.node_published(2));
        drop(interest);
    }

    #[test]
    fn wake_ids_round_trip_and_reject_other_payloads() {
        let id = Wake::random();
        assert_ne!(id, Wake::NONE);
        assert_eq!(Wake::parse(id.message().as_bytes()), Some(id));
        for other in [&b""[..], b"0", b"xyz", b"12345678901234567", b"\xff"] {
            assert_eq!(Wake::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_resent_wake_up_is_the_same_for_every_node_and_never_a_repeat() {
        for _ in 0..1000 {
            let id = Wake::random();
            let again = id.resent();
            assert_eq!(again, id.resent());
            assert_ne!(again, id);
            assert_ne!(again, Wake::NONE);
            assert_eq!(Wake::parse(again.message().as_bytes()), Some(again));
        }
        assert_eq!(Wake::NONE.resent(), Wake::NONE);
    }

    #[tokio::test]
    async fn local_hand_offs_stop_after_a_streak_and_need_a_local_waiter() {
        let w = waiters();
        // Nobody of this client waits: a release hands nothing off.
        w.notify_local("c", Wake::random(), &[]);
        let interest = w.interest("c", None).await;
        w.notify_local("other", Wake::random(), &[]);
        assert_eq!(interest.handoffs(), 0);
        let mut seen = Vec::new();
        for _ in 0..2 * (LOCAL_STREAK + 1) {
            w.notify_local("c", Wake::random(), &[]);
            seen.push(interest.handoffs());
        }
        // LOCAL_STREAK hand-offs, one release open to everyone, and again.
        let streak = u64::from(LOCAL_STREAK);
        let expected: Vec<u64> = (1..=streak)
            .chain([streak])
            .chain(streak + 1..=2 * streak)
            .chain([2 * streak])
            .collect();
        assert_eq!(seen, expected);
        drop(interest);
        // The waiter left: releases hand nothing off any more.
        w.notify_local("c", Wake::random(), &[]);
        let again = w.interest("c", None).await;
        assert_eq!(again.handoffs(), 2 * streak);
    }

    #[tokio::test]
    async fn a_client_winning_more_than_its_share_of_races_is_held_back() {
        let w = waiters();
        let interest = w.interest("c", None).await;
        // Nothing known of other clients yet, and no race won: no lead.
        assert!(interest.lead() == 0.0);
        // The node counted four subscribers besides this client's own (unconfirmed here).
        w.release_heard(&["c".to_owned()], &[Some(4)]);
        assert_eq!(lock(&w.shared.state).channels["c"].contenders, 5);
        // Another client released the lock a moment ago: the races are contended.
        another_client_released(&w, "c");
        for _ in 0..60 {
            interest.raced(true);
        }
        let lead = interest.lead();
        assert!(
            (0.75..0.8).contains(&lead),
            "won nearly all races of five: {lead}"
        );
        // Winning one race in five (a fair share) brings the lead back to about nothing.
        for r in 0..100 {
            interest.raced(r % 5 == 0);
        }
        let lead = interest.lead();
        assert!(lead < 0.1, "a fair share: {lead}");
        // Losing every race: none.
        for _ in 0..60 {
            interest.raced(false);
        }
        assert!(interest.lead() == 0.0);
    }

    /// A client re-acquiring a lock that nobody else takes is not held back, even when an idle
    /// client stays subscribed and is counted among the contenders (found in review: a lone
    /// client's every acquire waited four extra stagger ranges).
    #[tokio::test(start_paused = true)]
    async fn a_client_alone_on_a_lock_is_not_held_back_for_winning() {
        let w = waiters();
        let interest = w.interest("c", None).await;
        // An idle client is subscribed: the node counts it.
        w.release_heard(&["c".to_owned()], &[Some(1)]);
        for _ in 0..60 {
            interest.raced(true);
        }
        assert!(interest.lead() == 0.0, "no other client took the lock");
        // The idle client took and released the lock once, long ago in lock terms; this
        // client's task keeps coming back after its own releases: they race nobody.
        {
            let mut state = lock(&w.shared.state);
            let c = state.channels.get_mut("c").expect("the channel");
            c.others_released = Some(tokio::time::Instant::now());
            c.released_here = true;
        }
        for _ in 0..60 {
            interest.raced(true);
        }
        assert!(interest.lead() == 0.0, "its own releases raced nobody");
        // But losing after its own release, it raced another client, which took the lock:
        // those count, and bring down a share that won races elsewhere.
        lock(&w.shared.state)
            .channels
            .get_mut("c")
            .expect("the channel")
            .won_share = 1.0;
        for _ in 0..60 {
            interest.raced(false);
        }
        assert!(
            interest.lead() == 0.0,
            "lost every race after its own release"
        );
        lock(&w.shared.state)
            .channels
            .get_mut("c")
            .expect("the channel")
            .released_here = false;
        // Another client takes and releases it: from then on the races count.
        another_client_released(&w, "c");
        for _ in 0..60 {
            interest.raced(true);
        }
        assert!(interest.lead() > 0.4, "won every contended race of two");
        // Once nobody else has taken it for a while, the lead no longer holds it back.
        tokio::time::advance(CONTENDED_FOR + Duration::from_millis(1)).await;
        assert!(interest.lead() == 0.0);
    }
}
