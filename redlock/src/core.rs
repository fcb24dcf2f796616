//! `Core`: the protocol of one client — acquire (with the client-local FIFO turns), extend,
//! release and guard — on top of the quorum engine, generic over its nodes so the algorithm
//! tests can run it on fakes.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{Backend, Op, Reach, Wake};
use crate::background::Background;
use crate::config::{Config, MAX_RESOURCES_PER_LOCK, RetryPolicy};
use crate::engine::{self, First, Goal, Judge, Phase};
use crate::error::{
    Error, GaveUp, LostReason, NodeOutcome, Phase as PhaseName, ResourceError, Retries,
};
use crate::lease::{Held, LockGuard, Releaser};
use crate::lock::{self, Deadline, Lock, ReleaseReport};
use crate::renewal::Renewer;
use crate::telemetry;
use crate::token::Token;
use crate::waiters::{Interest, LocalHolder, NodeWait, Standing, Waiters};

/// A shared, immutable list of resource names or keys.
type Names = Arc<[String]>;

/// The terms one lock is taken on: the TTL the nodes get (`PX`), from which validity is
/// computed and which renewals re-arm, and the validity every phase of the lock must leave.
/// The client's configuration gives the defaults; a [`LockRequest`](crate::LockRequest) may
/// set its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Terms {
    pub(crate) ttl: Duration,
    pub(crate) min_validity: Duration,
}

/// One acquisition attempt's token, and how it is made.
#[derive(Debug)]
pub(crate) struct Try {
    pub(crate) token: Token,
    /// The token is the caller's, reused across attempts: a node that holds it already
    /// re-arms it instead of refusing.
    pub(crate) rearm: bool,
    /// The attempt races other clients' waiters: it asks the resource's first node first.
    pub(crate) racing: bool,
}

/// Longest time `wait_released` goes without probing the nodes: it bounds what a lost release
/// notification costs.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// What a probe of the nodes found about one key.
enum Probe {
    /// No quorum can hold it.
    Free,
    /// It may be held: `held` nodes have the key, `unknown` did not answer; `free_at` is when
    /// enough of the keys expire that no quorum holds it, unless they are renewed.
    Held {
        held: usize,
        unknown: usize,
        free_at: Option<Instant>,
    },
}

/// Passes node `node` over as a first node for `span` from now.
fn pass_over(
    passed_over: &[std::sync::atomic::AtomicU64],
    born: Instant,
    node: usize,
    span: Duration,
) {
    let until = micros_since(born, Instant::now() + span);
    passed_over[node].fetch_max(until, std::sync::atomic::Ordering::Relaxed);
}

/// Microseconds from `born` to `at` (0 before it).
fn micros_since(born: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(born).as_micros()).unwrap_or(u64::MAX)
}

/// The protocol, generic over its nodes so the algorithm tests can run it on fakes.
pub(crate) struct Core<B> {
    pub(crate) config: Config,
    pub(crate) backend: Arc<B>,
    /// The node list this client talks to; a lock remembers the one it was taken on.
    pub(crate) origin: Arc<str>,
    lock_prefix: String,
    channel_prefix: String,
    renewer: Arc<Renewer<B>>,
    waiters: Option<Arc<Waiters>>,
    /// The round trip of this client's latest acquire attempt, in µs: the unit of the stagger
    /// after a release for a waiter that has not made an attempt of its own yet.
    round_trip_us: std::sync::atomic::AtomicU64,
    /// Per node: until when it is not a contended lock's first node (see `Core::first_node`),
    /// in µs since `born`; 0 = usable.
    passed_over: Arc<[std::sync::atomic::AtomicU64]>,
    /// Per node: a check whether the key it refused a lock with stays is running (see
    /// `Core::check_first_node`).
    checking: Arc<[std::sync::atomic::AtomicBool]>,
    born: Instant,
    /// Per node: where the first node's ranking starts until the backend knows the server
    /// ([`Backend::rank_seed`]): the normalised address or configured name (set by the builder).
    rank_seeds: Arc<[u64]>,
}

/// How long a node that failed a racing attempt, or did not answer it within its budget, is
/// not used as the first node: the node after it in the ranking is. Long enough that a hung
/// node costs a hot lock's racers its patience (a quarter of its budget) a few times, not on
/// every hand-off. A node that is only slow keeps its place (unless it is far, see
/// [`far_nodes`]), so that clients under load still agree on the first node.
const PASS_OVER: Duration = Duration::from_secs(10);

/// How long a first node that refused a lock a quorum of the other nodes granted is passed
/// over. The refusal may come from a key a release missed (stale until its TTL), which would
/// refuse every racer; or from another client's racer holding that node for a moment, which
/// only looks the same. Passing over is this client's own view, and clients that disagree on
/// the first node split votes again; a long span let such a lookalike start a chain of them
/// (each split's retry could see another). Short, so a lookalike costs little, and a stale
/// key at most about one retry delay per span.
pub(crate) const PASS_OVER_REFUSED: Duration = Duration::from_secs(1);

/// How much further than the nodes a quorum needs a node must be, beyond twice their
/// distance, to be no contended lock's first node (see [`far_nodes`]). Well above what load
/// adds to a round trip on one network, so that clients there agree on which nodes are far.
const FAR_MARGIN: Duration = Duration::from_millis(1);

/// The nodes far from this client (a bit per node index; nodes past 64 are never far): those
/// whose distance (see `Backend::distance`) is more than twice that of the `quorum`-th
/// nearest node plus [`FAR_MARGIN`]. A quorum of nearer nodes can grant a lock without them,
/// and a racing attempt through such a node waits for it: for the release to reach it, for
/// its message back, for a round trip before the other nodes are asked. On 5 nodes with the
/// first node 2 ms further each way, 4 clients handed a hot key over 139–141 times a second
/// through it, 370–388 with this rule (test `handoff::a_slow_first_node_is_not_asked_first`).
///
/// Clients must agree on the first node (or their racers split votes), and each judges from
/// its own round trips: a node far from every client (a loaded host, a distant zone) is far
/// for all of them; nodes spread over zones near some clients and far from others are judged
/// alike as long as a quorum's distance is itself a zone away, which doubles the threshold.
/// Nothing is far until a quorum of nodes answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Far(u64);

impl Far {
    fn contains(self, i: usize) -> bool {
        i < 64 && self.0 & (1 << i) != 0
    }
}

fn far_nodes(n: usize, quorum: usize, distance: impl Fn(usize) -> Option<Duration>) -> Far {
    let n = n.min(64);
    let distance = &distance;
    // The quorum-th nearest known distance, without allocating: the nearest d with at least
    // `quorum` known distances at or below it.
    let reference = (0..n)
        .filter_map(distance)
        .filter(|&d| (0..n).filter_map(distance).filter(|&e| e <= d).count() >= quorum)
        .min();
    let Some(reference) = reference else {
        return Far::default();
    };
    let limit = reference.saturating_mul(2).saturating_add(FAR_MARGIN);
    Far((0..n).fold(0, |bits, i| {
        if distance(i).is_some_and(|d| d > limit) {
            bits | (1 << i)
        } else {
            bits
        }
    }))
}

/// How many node timeouts apart the two reads of a first node's refusing key are (see
/// `Core::check_first_node`). A racer's key lives for its attempt — at most its first node's
/// patience (a quarter of a node timeout) and the other nodes' budget (a node timeout) — and
/// the round trip of its cleanup.
const STALE_AFTER: u32 = 2;

/// A random pause of up to two round trips (or [`STAGGER_MIN`], whichever is longer), taken by
/// a waiter woken by a release that was not handed to it: every client's waiter hears the same
/// release, and staggering their attempts lets the first one win cleanly instead of all of them
/// splitting the nodes' votes. A client that won more than its fair share of the recent races
/// (`lead`, see `Interest::lead`) waits [`LEAD_WEIGHT`] ranges per share more.
///
/// Never past `deadline`, the retry policy's (no attempt starts after it): the range follows
/// the last attempt's round trip, which a node timeout can stretch.
async fn stagger(round_trip: Duration, lead: f64, deadline: Option<Instant>) {
    let holdback = LEAD_WEIGHT * lead;
    telemetry::stagger(holdback);
    let unit: f64 = crate::det::unit();
    let range = (round_trip * 2).max(STAGGER_MIN);
    let pause = range.mul_f64(unit + holdback);
    crate::timer::sleep(until_deadline(pause, deadline)).await;
}

/// Stagger ranges added per share of the races won beyond a fair one: a client that won a
/// quarter of eight clients' races (twice its share) waits one range more. Strong enough to
/// undo the head start of the clients that hear releases first (test
/// `clients_that_hear_releases_later_still_get_their_share`), bounded by eight ranges.
const LEAD_WEIGHT: f64 = 8.0;

/// The least range of the stagger. A node sends a release's message to its subscribers one
/// after another in the order they subscribed, so the same clients hear every release first;
/// a range much wider than that head start keeps it from deciding who wins (test
/// `clients_that_hear_releases_later_still_get_their_share`).
const STAGGER_MIN: Duration = Duration::from_millis(1);

/// Whether a failed attempt found the lock held, or raced for, by someone else: busy, or
/// short of a quorum with some node refusing. A release (or a racer's cleanup) will come
/// then, and its message is what a waiter waits for. With a node down, a held lock can be
/// refused by fewer nodes than `Busy` needs — the holder's keys on two nodes of five, two
/// nodes that lost theirs granting, the fifth not answering — and such an attempt slept out
/// its retry delay without subscribing; a hot key with one of five nodes down made
/// contenders wait 0.2–1.5 s that way (test
/// `waiting::a_waiter_refused_with_a_node_down_is_woken_by_the_release`).
fn refused_somewhere(err: &Error) -> bool {
    match err {
        Error::Busy { .. } => true,
        Error::QuorumUnreachable { nodes, .. } => nodes
            .iter()
            .any(|r| matches!(r.outcome, NodeOutcome::Refused)),
        _ => false,
    }
}

/// The nodes that refused the attempt that failed with `err`, each with one of the lock's
/// `interests` (its resources' channels) on which that node's message of the last release
/// heard has not arrived: every such pair. `first`: the node a racing attempt asked first,
/// given when its answer came before the gate could open by the node's patience (the attempt
/// was over by then); when it refused, the others were not asked (its refusal shut the gate,
/// and they count as refusing unasked), so only it counts. After a gate opened by patience
/// every node was asked: a version that counted only a refusing first node then waited for
/// nothing while the node the release had not reached refused (test
/// `node_waits::a_split_vote_after_the_first_nodes_patience_waits_for_the_late_node`).
fn refused_unpublished<'a>(
    err: &Error,
    first: Option<usize>,
    interests: impl Iterator<Item = &'a Interest> + Clone,
) -> Vec<(&'a Interest, usize)> {
    let nodes = err.nodes();
    let refused = |i: usize| {
        nodes
            .get(i)
            .is_some_and(|r| matches!(r.outcome, NodeOutcome::Refused))
    };
    let asked: Vec<usize> = match first {
        Some(f) if refused(f) => vec![f],
        _ => (0..nodes.len()).filter(|&i| refused(i)).collect(),
    };
    asked
        .into_iter()
        .flat_map(|node| {
            interests
                .clone()
                .filter(move |interest| !interest.node_published(node))
                .map(move |interest| (interest, node))
        })
        .collect()
}

/// Waits for any of `candidates` (see [`refused_unpublished`]) at once: the first node's
/// message of its channel's latest release, or a new release on one of their channels, ends
/// the wait (a node not subscribed to a channel is left out: `Unheard` once none is left).
/// One at a time, an old release a node never told of (it had nothing to delete) on one
/// channel hid the node still on its way with the latest release on another.
async fn wait_for_any_node(candidates: &[(&Interest, usize)], limit: Duration) -> NodeWait {
    use futures_util::StreamExt;
    let mut waits: futures_util::stream::FuturesUnordered<_> = candidates
        .iter()
        .map(|(interest, node)| interest.wait_for_node_or_release(*node, limit))
        .collect();
    while let Some(r) = waits.next().await {
        if r != NodeWait::Unheard {
            return r;
        }
    }
    NodeWait::Unheard
}

/// Ends when a release is heard on the lock's first channel (`wake`, enabled before the
/// attempt) or on one of its others (`also`); never without either.
async fn release_heard(
    wake: &mut Option<std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>>,
    also: &mut [std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>],
) {
    let first = async {
        match wake.as_mut() {
            Some(w) => w.await,
            None => std::future::pending().await,
        }
    };
    let others = async {
        if also.is_empty() {
            std::future::pending::<()>().await;
        } else {
            futures_util::future::select_all(also.iter_mut()).await;
        }
    };
    crate::det::select! {
        () = first => {}
        () = others => {}
    }
}

/// `limit`, cut to what is left until the retry policy's `deadline` (no attempt starts after it).
fn until_deadline(limit: Duration, deadline: Option<Instant>) -> Duration {
    deadline.map_or(limit, |d| {
        limit.min(d.saturating_duration_since(Instant::now()))
    })
}

/// Whether the retry policy's `deadline` has passed.
fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// `err` with how the retries of an acquire that began at `started` ended, counted in the
/// acquire telemetry.
fn given_up(err: Error, attempts: u32, started: Instant, gave_up: GaveUp) -> Error {
    let err = err.with_retries(Retries {
        attempts,
        waited: started.elapsed(),
        gave_up,
    });
    telemetry::acquire_done(&Err(&err), attempts, started.elapsed());
    err
}

/// The cleanup of an acquire attempt on `keys`: an owner-checked delete that publishes a
/// wake-up on `channels`, or nothing with `None`.
fn attempt_cleanup(keys: &Names, token: &Token, channels: Option<Arc<[String]>>) -> Arc<Op> {
    let (channels, wake) = match channels {
        Some(channels) => (channels, Wake::random()),
        None => (Arc::from([]), Wake::NONE),
    };
    Arc::new(Op::Release {
        keys: Arc::clone(keys),
        token: token.clone(),
        channels,
        wake,
        before_us: None,
    })
}

impl<B: Backend> Core<B> {
    pub(crate) fn new(config: Config, backend: B, waiters: Option<Waiters>) -> Self {
        let p = &config.key_prefix;
        let origin: Vec<&str> = (0..backend.len()).map(|i| &**backend.name(i)).collect();
        let origin = origin.join(",").into();
        let n = backend.len();
        let rank_seeds = (0..n).map(|i| engine::rank_seed(backend.name(i))).collect();
        let backend = Arc::new(backend);
        Self {
            renewer: Arc::new(Renewer::new(Arc::clone(&backend), config.clone())),
            origin,
            lock_prefix: format!("{p}lock:"),
            channel_prefix: format!("{p}release:"),
            config,
            backend,
            waiters: waiters.map(Arc::new),
            round_trip_us: std::sync::atomic::AtomicU64::new(0),
            passed_over: (0..n)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
            checking: (0..n)
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
            born: Instant::now(),
            rank_seeds,
        }
    }

    /// The node a racing attempt on `resource` asks first (see `engine::first_node`), passing
    /// over the nodes that failed such an attempt lately, those whose connection is not open
    /// (their budget includes opening it: a request to them waits for the connection), and
    /// those far from this client (see [`far_nodes`]).
    pub(crate) fn first_node_index(&self, resource: &str) -> Option<usize> {
        let now = micros_since(self.born, Instant::now());
        let n = self.backend.len();
        let open_budget = (0..n).map(|i| self.backend.budget(i)).min()?;
        let far = far_nodes(n, self.quorum(), |i| self.backend.distance(i));
        let seeds = (0..n).map(|i| self.backend.rank_seed(i).unwrap_or(self.rank_seeds[i]));
        engine::first_node(seeds, resource, |i| {
            self.passed_over[i].load(std::sync::atomic::Ordering::Relaxed) <= now
                && self.backend.budget(i) <= open_budget
                && !far.contains(i)
        })
    }

    /// Passes over `resource`'s first node when it refused a lock a quorum of the others
    /// granted and the key it refused with stays: it holds a key they do not (a release or
    /// cleanup missed it), and would refuse every racer until that key expires. Checked when
    /// the lock is taken and again when it is released, when the slower nodes' answers are in.
    /// Costs nothing more than a look at the answers when no node refused (the common case).
    ///
    /// Another client's racer holding the node for a moment refuses the same way, but its key
    /// goes within its attempt's budget. Passing the node over for it made this client race
    /// through another node than every other client, so that their racers split the nodes'
    /// votes (hundreds of split votes in 10 s of the hot-key bench). So the key `key` is read
    /// on the node now and again [`STALE_AFTER`] node timeouts later, in the background; only
    /// when it held the same value both times is the node passed over. One check per node
    /// runs at a time.
    fn check_first_node(&self, resource: &str, key: &str, granted: &engine::Granted) {
        use std::sync::atomic::Ordering;
        if !self.config.race_via_first_node {
            return;
        }
        let refused = granted.refused();
        if refused.is_empty() {
            return;
        }
        let Some(f) = self
            .first_node_index(resource)
            .filter(|f| refused.contains(f))
        else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.checking[f].swap(true, Ordering::AcqRel) {
            return;
        }
        struct Checking(Arc<[std::sync::atomic::AtomicBool]>, usize);
        impl Drop for Checking {
            fn drop(&mut self) {
                self.0[self.1].store(false, Ordering::Release);
            }
        }
        let checking = Checking(Arc::clone(&self.checking), f);
        let backend = Arc::clone(&self.backend);
        let (passed_over, born) = (Arc::clone(&self.passed_over), self.born);
        let key: Arc<str> = key.into();
        let later = self.config.node_timeout * STALE_AFTER;
        let read = move || {
            let call = backend.holder(f, Arc::clone(&key));
            let budget = backend.budget(f);
            async move { tokio::time::timeout(budget, call).await.ok()?.ok()? }
        };
        drop(rt.spawn(async move {
            let _checking = checking;
            let Some(before) = read().await else {
                return;
            };
            tokio::time::sleep(later).await;
            if read().await == Some(before) {
                pass_over(&passed_over, born, f, PASS_OVER_REFUSED);
            }
        }));
    }

    /// [`Core::first_node_index`], with what to do if that node fails.
    fn first_node(&self, resource: &str) -> Option<First> {
        let node = self.first_node_index(resource)?;
        let (passed_over, born) = (Arc::clone(&self.passed_over), self.born);
        Some(First {
            node,
            missed: Box::new(move || pass_over(&passed_over, born, node, PASS_OVER)),
        })
    }

    /// Interest in the release channels of a lock's resources after the first (none for one
    /// resource).
    ///
    /// They are registered together and wait for the nodes' confirmations together: one after
    /// another, twelve resources took 2.35 s to subscribe on a 200 ms round trip (test
    /// `api_attacks::a_multi_resource_waiter_subscribes_to_its_channels_at_once`).
    async fn other_interests(
        &self,
        waiters: &Arc<Waiters>,
        resources: &[String],
        deadline: Option<Instant>,
    ) -> Vec<Interest> {
        let channels = self.channels(resources.get(1..).unwrap_or_default());
        futures_util::future::join_all(channels.iter().map(|c| waiters.interest(c, deadline))).await
    }

    /// The wake-up channel of each resource.
    fn channels(&self, resources: &[String]) -> Arc<[String]> {
        resources
            .iter()
            .map(|r| format!("{}{r}", self.channel_prefix))
            .collect()
    }

    /// The wake-up channels of a lock's keys: those of the key prefix the lock was taken
    /// with (`<prefix>lock:<resource>` → `<prefix>release:<resource>`), which its waiters
    /// listen on — not this client's, should it have another prefix. A release through a
    /// client of the same nodes with another prefix published on its own channels, and the
    /// lock's waiters slept out their retry delay with the lock free (test `api_attacks::a_
    /// release_through_a_client_with_another_prefix_wakes_the_locks_waiters`).
    fn lock_channels(&self, resources: &[String], keys: &[String]) -> Arc<[String]> {
        resources
            .iter()
            .zip(keys)
            .map(|(r, k)| {
                k.strip_suffix(r.as_str())
                    .and_then(|k| k.strip_suffix("lock:"))
                    .map_or_else(
                        || format!("{}{r}", self.channel_prefix),
                        |p| format!("{p}release:{r}"),
                    )
            })
            .collect()
    }

    /// The client's default terms.
    pub(crate) fn terms(&self) -> Terms {
        Terms {
            ttl: self.config.ttl,
            min_validity: self.config.min_validity,
        }
    }

    pub(crate) fn quorum(&self) -> usize {
        engine::quorum(self.backend.len())
    }

    /// Sets the nodes' normalised addresses: the node list a lock is recognised by, and what
    /// ranks the nodes for a racing attempt's first node until a connection read the server's
    /// identity (which ranks it from then on) — so that two clients of the same nodes under
    /// different display names agree.
    pub(crate) fn with_node_ids(mut self, ids: &[&str]) -> Self {
        self.origin = ids.join(",").into();
        self.rank_seeds = ids.iter().map(|id| engine::rank_seed(id)).collect();
        self
    }

    /// Fails when the client found itself misconfigured after `build()` (one server behind two
    /// of its addresses): no vote of it may be counted then.
    pub(crate) fn usable(&self) -> Result<(), Error> {
        match self.backend.misconfigured() {
            Some(e) => Err(Error::Config(e)),
            None => Ok(()),
        }
    }

    /// Fails for a lock taken by a client of other nodes.
    pub(crate) fn owns(&self, lock: &Lock) -> Result<(), Error> {
        let origin = &lock.origin;
        if Arc::ptr_eq(origin, &self.origin) || **origin == *self.origin {
            Ok(())
        } else {
            Err(Error::ForeignLock {
                resources: Arc::clone(&lock.resources),
                lock_nodes: origin.to_string(),
                client_nodes: self.origin.to_string(),
            })
        }
    }

    /// Validates resource names and maps them to keys.
    pub(crate) fn keys(&self, resources: Vec<String>) -> Result<(Names, Names), ResourceError> {
        if resources.is_empty() {
            return Err(ResourceError::NoResources);
        }
        if resources.len() > MAX_RESOURCES_PER_LOCK {
            return Err(ResourceError::TooMany {
                count: resources.len(),
                max: MAX_RESOURCES_PER_LOCK,
            });
        }
        for (index, r) in resources.iter().enumerate() {
            if r.is_empty() {
                return Err(ResourceError::Empty { index });
            }
            if r.len() > self.config.max_resource_len {
                return Err(ResourceError::TooLong {
                    index,
                    len: r.len(),
                    max: self.config.max_resource_len,
                });
            }
            if resources[..index].contains(r) {
                return Err(ResourceError::Duplicate { index });
            }
        }
        let keys: Names = resources
            .iter()
            .map(|r| format!("{}{r}", self.lock_prefix))
            .collect();
        Ok((resources.into(), keys))
    }

    /// One acquisition attempt. One given up on whose requests to some nodes are still out
    /// adds them to `unanswered`.
    pub(crate) async fn attempt(
        &self,
        resources: &Arc<[String]>,
        keys: &Arc<[String]>,
        Try {
            token,
            rearm,
            racing,
        }: Try,
        terms: Terms,
        unanswered: &mut Vec<engine::Unanswered>,
    ) -> Result<Lock, Error> {
        self.usable()?;
        let ttl = terms.ttl;
        let clocks = Deadline::clocks();
        let started = clocks.0;
        // An attempt racing other clients' waiters goes through one node first, so that the
        // racers do not split the votes (see `engine::first_node`).
        let first = (racing && self.config.race_via_first_node)
            .then(|| self.first_node(&resources[0]))
            .flatten();
        let op = Arc::new(Op::Acquire {
            stamped: self.config.claim_stamps,
            keys: Arc::clone(keys),
            token: token.clone(),
            ttl_ms: lock::ttl_ms(ttl),
            rearm,
            // The first node is ranked by the servers' identity records: check them.
            checked: first.is_some(),
            // A fresh token is on no node yet: a node none of the attempt's requests reach
            // needs no cleanup, nor the lock's release.
            reach: (!rearm).then(|| Reach::new(self.backend.len())),
        });
        // Until the attempt is decided, its cleanup publishes a wake-up like a release: an
        // attempt abandoned then (its caller cancelled) may hold a quorum, which other clients'
        // waiters were refused by and now wait to hear gone. So does the cleanup of a success
        // thrown away (validity used up, a misconfiguration found).
        //
        // An attempt with the caller's token cleans up only the nodes where it created every
        // key: the keys holding that token may be a lock the caller (or whoever handed it the
        // token) still holds (see `engine::State::own_token`).
        let cleanup = attempt_cleanup(keys, &token, Some(self.channels(resources)));
        // An attempt with the caller's token waits until the earlier ones with it cannot
        // delete what it takes (see `reclaim`).
        let turn = match rearm {
            true => Some(crate::reclaim::take(&token, keys).await),
            false => None,
        };
        let mut phase = Phase::start(
            &self.backend,
            PhaseName::Acquire,
            op,
            Goal::Quorum,
            Some(cleanup),
            first,
        );
        if let Some(turn) = turn {
            turn.started(phase.unanswered());
        }
        let d = phase.decided().await;
        if !d.success {
            // The cleanup of a failed attempt publishes nothing: the holder still holds the
            // lock, and a wake-up would send every waiter (this one too) into an attempt failing
            // the same way, spending their retry policies in a few round trips.
            phase.set_cleanup(attempt_cleanup(keys, &token, None));
        }
        // A misconfiguration found while this attempt ran: none of its votes may count.
        // (Each way out but success gives the attempt up; the caller's next attempt watches
        // its requests still out.)
        if d.success
            && let Err(e) = self.usable()
        {
            unanswered.extend(phase.unanswered());
            phase.abandon();
            return Err(e);
        }
        // Validity counts from before the first request: TTL − elapsed − drift.
        let valid_for = match Judge::new(PhaseName::Acquire, resources, ttl, &self.config)
            .min_validity(terms.min_validity)
            .judge(&d, &*self.backend, started.elapsed())
        {
            Ok(valid_for) => valid_for,
            Err(e) => {
                unanswered.extend(phase.unanswered());
                phase.abandon();
                return Err(e);
            }
        };
        let granted = phase.keep();
        self.check_first_node(&resources[0], &keys[0], &granted);
        let mut claims = d.claims;
        claims.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(Lock {
            resources: Arc::clone(resources),
            keys: Arc::clone(keys),
            token,
            ttl,
            min_validity: terms.min_validity,
            valid_until: Deadline::after(clocks, valid_for),
            claims,
            granted: Some(granted),
            origin: Arc::clone(&self.origin),
        })
    }

    /// Attempts per `policy` on the client's default terms, a fresh token each time unless
    /// `token` is given.
    pub(crate) async fn acquire(
        &self,
        resources: Vec<String>,
        policy: &RetryPolicy,
        token: Option<&Token>,
    ) -> Result<Lock, Error> {
        self.acquire_on(resources, policy, token, self.terms())
            .await
    }

    /// Attempts per `policy` on `terms`, a fresh token each time unless `token` is given.
    pub(crate) async fn acquire_on(
        &self,
        resources: Vec<String>,
        policy: &RetryPolicy,
        token: Option<&Token>,
        terms: Terms,
    ) -> Result<Lock, Error> {
        let (resources, keys) = self.keys(resources)?;
        let span = tracing::debug_span!("redlock.acquire", resources = ?&*resources, nodes = self.backend.len());
        async {
            let started = Instant::now();
            let deadline = policy.deadline.map(|d| lock::far_after(started, d));
            let mut attempts = 0u32;
            // The attempts the policy's `max_attempts` counts: the first, the retry right
            // after subscribing, and every attempt after a pause slept out. An attempt made
            // because a release was heard (and the quick retries it allows) is not counted: a
            // busy lock's releases come far more often than the retry delay, and a waiter that
            // lost a few races to other clients, or reached a node ahead of the release's
            // delete, gave up within milliseconds (test `handoff::races_lost_on_releases_heard_
            // do_not_use_up_an_attempt_bounded_policy`: 44 ms against the 600 ms of pauses of
            // `attempts(3)` with a 300 ms delay). Once the time the policy's attempts would
            // take has passed (`RetryPolicy::release_limit`), such attempts count like any
            // other, so a busy lock is given up soon after it. A call that hears no release
            // counts every attempt, as long as they take (test file `retry_limits`).
            let mut counted = 0u32;
            let mut on_release = false;
            let release_limit = policy.release_limit(self.config.node_timeout);
            // Within this client, acquirers of the same resources are served in FIFO order:
            // each takes its turn before its first attempt and keeps it until it returns, so a
            // task that releases and acquires again queues behind the client's waiters instead
            // of reaching the nodes before they do. A single attempt (`try_acquire`) neither
            // waits in nor joins the queue.
            // (`_turn` is only held, never read: dropping it passes the turn on.)
            let mut _turn = None;
            // Set when the next attempt is the last: why the call then gives up (a wait for the
            // turn, or for this client's own holder, that used up the policy's time).
            let mut last_attempt: Option<GaveUp> = None;
            if let Some(waiters) = self.waiters.as_ref().filter(|_| !policy.single_attempt()) {
                let limit = policy.wait_limit(self.config.node_timeout);
                _turn = waiters.turn(&keys, limit).await;
                // Queued for the whole limit: one attempt, then give up.
                last_attempt = _turn.is_none().then_some(GaveUp::Queue);
            }
            // Set once the lock turns out to be busy: the release notifications we wait for.
            // When this client still listens on the resource's channel (it was waited on
            // recently), set before the first attempt, so that a refusal waits for the release
            // at once instead of retrying first (the retry covers a release missed while
            // subscribing, which cannot happen here).
            let mut interest: Option<Interest> = None;
            // A lock of several resources also listens on the channels of the others: any of
            // them may be the one held elsewhere, and only the first one's release woke the
            // waiter, which slept out its retry delay with the lock free (test `api_attacks::
            // a_multi_resource_waiter_is_woken_by_the_release_of_its_second_resource`). They
            // only wake it; the first resource's channel keeps the rest of the waiting state.
            let mut others: Vec<Interest> = Vec::new();
            let channel = format!("{}{}", self.channel_prefix, resources[0]);
            if let Some(waiters) = self.waiters.as_ref().filter(|_| !policy.single_attempt()) {
                match waiters.standing(&channel) {
                    Standing::Listening => {
                        interest = Some(waiters.interest(&channel, deadline).await);
                        others = self.other_interests(waiters, &resources, deadline).await;
                    }
                    // This client released the lock a moment ago while another client's waiter
                    // listened; it knew of that release first, and does not listen itself, so
                    // it would reach the nodes ahead of that waiter every time. It staggers
                    // like it.
                    Standing::HeardElsewhere => stagger(self.round_trip(), 0.0, deadline).await,
                    Standing::Neither => {}
                }
            }
            // Quick retries left after split votes, granted by a release notification (see
            // below); a split vote without a release before it is waited out like a refusal.
            let mut quick_retries = 0u32;
            // The last wait ended on a release heard (its split votes may be the release not
            // having reached every node yet, see below).
            let mut after_release = false;
            // Failed attempts whose requests to some nodes were still out (see below).
            let mut unanswered: Vec<engine::Unanswered> = Vec::new();
            // The wait for the first node's message of the release heard was skipped before
            // the next attempt: the node was not known to hold the lock (see below).
            let mut first_skipped = false;
            // The next attempt follows a stagger: a race against other clients' waiters, whose
            // result counts towards this client's share (see `Interest::lead`).
            let mut racing = false;
            loop {
                // While another task of this client holds the lock, wait for its release rather
                // than make an attempt that can only be refused (bounded like the pause after
                // a refusal).
                if let Some(i) = interest.as_ref()
                    && let Some(limit) = self.local_wait_limit(policy, counted, started, &channel)
                {
                    // A guard of this client may hold the lock (taken without waiting, or
                    // renewed since it was taken): its release ends the wait, not the
                    // validity it had when it was taken (test `local_fifo::a_waiter_behind_
                    // its_clients_renewed_guard_waits_for_the_release`: 31 attempts in 1.5 s
                    // behind a renewed guard, 50 ms apart).
                    let round_trip = self.round_trip();
                    let waited = Instant::now();
                    // Whether this client held the lock during the wait (else the wait was
                    // only a look).
                    let mut behind_holder = false;
                    let outcome = loop {
                        behind_holder |= self.note_guard(i, &keys[0]);
                        let left = limit.saturating_sub(waited.elapsed());
                        match i.wait_for_local_holder(left).await {
                            // The validity recorded passed, and a renewal moved it on.
                            LocalHolder::NotHeld
                                if waited.elapsed() < limit
                                    && self.renewer.held_until(&keys[0]).is_some() => {}
                            outcome => break outcome,
                        }
                    };
                    if waited.elapsed() >= limit {
                        // A whole pause slept out: the attempt after it counts.
                        on_release = false;
                        // The wait used up the time the policy allows: one attempt, then give
                        // up (the policy's attempts were made in it). After a wait behind a
                        // guard of this client, the default policy took its ten attempts on top
                        // of it: 3.1 s instead of about one (test `local_fifo::a_wait_behind_
                        // its_clients_guard_ends_with_the_policy`).
                        // A wait of a few microseconds before a deadline, with no holder here,
                        // is not one (test `local_fifo::a_wait_for_another_clients_lock_gives_
                        // up_for_its_deadline`: 3 of 300 gave up `LocalHolder`).
                        if behind_holder
                            && started.elapsed() >= policy.wait_limit(self.config.node_timeout)
                        {
                            last_attempt = Some(GaveUp::LocalHolder);
                        }
                    }
                    match outcome {
                        LocalHolder::Released { handed } => {
                            quick_retries = 3;
                            after_release = true;
                            on_release = true;
                            // The attempt follows this wait, not an earlier stagger.
                            racing = false;
                            if !handed && i.others_compete() {
                                // Not a hand-off: staggered like every other client's waiters
                                // (unless none listen). This client's holder may not have
                                // reached the first node's key yet: its own release is heard
                                // before any node's message.
                                self.await_first_node(i, &resources[0], deadline).await;
                                stagger(round_trip, i.lead(), deadline).await;
                                racing = true;
                            }
                        }
                        // The last release heard on the channel was this client's, and other
                        // clients listen: its own task coming back for the lock knew of it
                        // first, and would reach the nodes ahead of every other client's waiter
                        // each time. It draws a stagger like them (an uncontended lock has no
                        // channel, and no stagger; nor does a lock nobody else listens on).
                        LocalHolder::NotHeld
                            if attempts == 0 && i.ahead_of_others() =>
                        {
                            stagger(round_trip, i.lead(), deadline).await;
                            racing = true;
                        }
                        LocalHolder::NotHeld => {}
                    }
                }
                attempts += 1;
                if !std::mem::take(&mut on_release) || started.elapsed() >= release_limit {
                    counted += 1;
                }
                let fixed = token.is_some();
                let token = match token {
                    Some(t) => t.clone(),
                    None => Token::random().map_err(Error::Entropy)?,
                };
                // Earlier failed attempts with requests still out (none on the fast path, which
                // then never ranks the nodes). A racing attempt asks the first node alone first:
                // it must not reach it ahead of the cleanup of an earlier attempt's late grant
                // there (the grant arrived after that attempt failed), which would refuse it
                // with this client's own key, and nobody publishes that key's cleanup. Waited
                // for at most a node timeout. And a refusal there while an earlier request was
                // still out may be this client's own late grant, not the holder's key.
                unanswered.retain(engine::Unanswered::any);
                let mut first_unsettled = false;
                if !unanswered.is_empty()
                    && let Some(node) = self.first_node_index(&resources[0])
                {
                    if racing && self.config.race_via_first_node {
                        let mut until = Instant::now() + self.config.node_timeout;
                        if let Some(deadline) = deadline {
                            until = until.min(deadline);
                        }
                        for earlier in &unanswered {
                            earlier.answered(node, until).await;
                        }
                    }
                    first_unsettled = unanswered.iter().any(|earlier| earlier.at(node));
                }
                // Where this attempt's requests still out, if any, will be watched.
                let this_attempt = unanswered.len();
                // Listen before trying, so a release between the attempt and the wait counts.
                let notified = interest.as_ref().map(|i| Arc::clone(&i.notify));
                let mut notified = notified.as_ref().map(|n| Box::pin(n.notified()));
                if let Some(n) = notified.as_mut() {
                    n.as_mut().enable();
                }
                let also_notify: Vec<Arc<tokio::sync::Notify>> =
                    others.iter().map(|i| Arc::clone(&i.notify)).collect();
                let mut also_notified: Vec<_> =
                    also_notify.iter().map(|n| Box::pin(n.notified())).collect();
                for n in &mut also_notified {
                    n.as_mut().enable();
                }
                let handoffs = interest.as_ref().map(Interest::handoffs);
                // A racing attempt made, without the wait, before the first node's message of
                // the release heard arrived (see the refusal below).
                let ahead_of_first = std::mem::take(&mut first_skipped)
                    && racing
                    && self.config.race_via_first_node
                    && interest.as_ref().is_some_and(|i| {
                        self.first_node_index(&resources[0])
                            .is_some_and(|node| !i.node_published(node))
                    });
                // The node this attempt asks first, if it races through one (see
                // `refused_unpublished`).
                let first_asked = (racing && self.config.race_via_first_node)
                    .then(|| self.first_node_index(&resources[0]))
                    .flatten();
                // Which connection of the first node listened on the lock's channel as this
                // attempt was sent: only a refusal there after that promises the node's message
                // of the release that deletes what it refused with (see
                // `Interest::listened_since`).
                // (Nothing to rank on the uncontended path, which has no interest.)
                let first_listened = interest.as_ref().and_then(|i| {
                    self.first_node_index(&resources[0])
                        .and_then(|node| i.listening(node))
                });
                let first_listens = |i: &Interest| {
                    self.first_node_index(&resources[0])
                        .is_some_and(|node| i.listened_since(node, first_listened))
                };
                let attempt_started = Instant::now();
                let result = self
                    .attempt(
                        &resources,
                        &keys,
                        Try {
                            token,
                            rearm: fixed,
                            racing,
                        },
                        terms,
                        &mut unanswered,
                    )
                    .await;
                let round_trip = attempt_started.elapsed();
                if std::mem::take(&mut racing)
                    && let Some(i) = interest.as_ref()
                {
                    match &result {
                        Ok(_) => i.raced(true),
                        Err(e) if e.is_busy() => i.raced(false),
                        // Nodes failed: nobody may have won this race.
                        Err(_) => {}
                    }
                }
                self.round_trip_us.store(
                    u64::try_from(round_trip.as_micros()).unwrap_or(u64::MAX),
                    std::sync::atomic::Ordering::Relaxed,
                );
                let err = match result {
                    Ok(lock) => {
                        if let Some(i) = interest.as_ref() {
                            i.taken(Instant::now() + lock.remaining());
                        }
                        tracing::debug!(attempts, token = %lock.token, remaining = ?lock.remaining(), "acquired");
                        telemetry::acquire_done(&Ok(()), attempts, started.elapsed());
                        return Ok(lock);
                    }
                    Err(e) => e,
                };
                let unit: f64 = crate::det::unit();
                // A pause that would cross the deadline ends the call — unless a release can
                // wake this waiter first: it then waits for one until the deadline, and gives up
                // there if none came (`cut`). A `wait` shorter than the retry delay used to give
                // up at the first refusal, 0.3 ms into a 3 s wait on a lock released 300 ms
                // later (test `wait_attacks::a_wait_shorter_than_the_retry_delay_still_waits_
                // for_a_release`).
                let wakeable = self.waiters.is_some() && refused_somewhere(&err);
                let mut cut = false;
                let pause = if err.is_retryable() && last_attempt.is_none() {
                    policy.next_delay(counted, started.elapsed(), unit).or_else(|| {
                        let left = policy
                            .pause_cut_at_deadline(counted, started.elapsed())
                            .filter(|_| wakeable);
                        cut = left.is_some();
                        left
                    })
                } else {
                    None
                };
                tracing::debug!(attempts, error = %err, retry_in = ?pause, "attempt failed");
                let Some(pause) = pause else {
                    let gave_up = if let Some(reason) = last_attempt {
                        reason
                    } else if policy.single_attempt() {
                        GaveUp::SingleAttempt
                    } else if policy.max_attempts.is_some_and(|max| counted >= max) {
                        GaveUp::Attempts
                    } else {
                        GaveUp::Deadline
                    };
                    return Err(given_up(err, attempts, started, gave_up));
                };
                match (&self.waiters, refused_somewhere(&err), &interest) {
                    (Some(waiters), true, None) => {
                        // Subscribe and retry at once: the holder may have left meanwhile. The
                        // subscription waits for confirmations at most until the deadline: it
                        // used to wait its whole node timeout, and with a majority that accepts
                        // connections but never answers, the retry after it started 1.8 s past
                        // a 2.2 s deadline (test `wait_attacks::no_attempt_starts_after_the_
                        // deadline_while_subscribing_to_hung_nodes`). No attempt follows a
                        // subscription that reached the deadline.
                        interest = Some(waiters.interest(&channel, deadline).await);
                        others = self.other_interests(waiters, &resources, deadline).await;
                        if passed(deadline) {
                            return Err(given_up(err, attempts, started, GaveUp::Deadline));
                        }
                    }
                    (_, _, Some(i)) if notified.is_some() => {
                        // The first node refused a racing attempt made without the wait for its
                        // message of the release heard (the node was not known to hold the lock,
                        // see below), before that message arrived: the attempt may have reached
                        // the node ahead of the release's delete, and the release wakes nobody
                        // again. It is retried through the node — a quick retry, at most three
                        // per release heard — once the node's message arrived (at once if it
                        // did during the attempt), or after the split-vote backoff when the node
                        // is not subscribed (or only confirmed the channel after the attempt was
                        // sent). A node that does not publish within a node timeout is slow to:
                        // the refusal then waits for a release like any other.
                        if ahead_of_first
                            && quick_retries > 0
                            && self.first_node_refused(&err, &resources[0], None)
                        {
                            let wait = if first_listens(i) {
                                self.await_first_node(i, &resources[0], deadline).await
                            } else {
                                NodeWait::Unheard
                            };
                            let retry = match wait {
                                NodeWait::Published | NodeWait::Arrived => true,
                                NodeWait::Unheard => {
                                    let unit: f64 = crate::det::unit();
                                    crate::timer::sleep((round_trip * 4).mul_f64(unit).min(pause))
                                        .await;
                                    true
                                }
                                // Not returned by this wait.
                                NodeWait::TimedOut | NodeWait::NewRelease => false,
                            };
                            if retry {
                                quick_retries -= 1;
                                racing = true;
                                on_release = true;
                                continue;
                            }
                        }
                        // After a release, the woken contenders may split the nodes' votes so
                        // that nobody reaches the quorum (this attempt won some nodes, but not
                        // enough). Every contender then cleans up its grants, and cleanups wake
                        // nobody, so waiting for a notification would sleep out the retry delay
                        // with the lock free. Such a split is retried after a short random
                        // backoff of up to four round trips — at most three times per release
                        // heard. A split vote without a release before it (say, a holder whose
                        // key one node lost) is waited out like any refusal, so it cannot spend
                        // the retry policy in a few round trips.
                        let split = matches!(
                            &err,
                            Error::Busy { granted, .. } | Error::QuorumUnreachable { granted, .. }
                                if *granted > 0
                        );
                        let quick = split && quick_retries > 0;
                        // After a release heard, a node refused the attempt that has not told
                        // of the latest release yet: it is still on its way there (the
                        // release's deletes reach the nodes at different times). That node's
                        // message wakes nobody — only a release's first message does — so the
                        // waiter used to sleep out its whole retry delay with the lock free
                        // about 100 ms after the release: after a split vote whose quick
                        // retries were used up (test `wait_attacks::a_release_that_reaches_the_
                        // other_nodes_late_still_wakes_the_waiter`: 4 s hand-offs), and after a
                        // refusal with nothing granted, when the racing attempt reached the
                        // first node ahead of the release (test `wait_attacks::a_waiter_refused_
                        // everywhere_ahead_of_the_release_is_still_woken`: 4 s), on any of the
                        // lock's resources (`wait_attacks::a_multi_resource_waiter_is_woken_by_
                        // its_second_resource_released_late`). It waits for that node's message
                        // instead (never past the pause or the deadline) and retries once it
                        // came; each such retry needs another node's message of the release,
                        // so a release allows at most one per node. The wait takes the place of
                        // the pause, and ends like it too: on a new release on any of the lock's
                        // channels, on a message without a wake-up id, on a subscription
                        // re-opened (releases may have gone unheard) — the pause below then
                        // follows as woken.
                        let mut woken_early = false;
                        let candidates = match !quick && after_release {
                            true => refused_unpublished(
                                &err,
                                first_asked
                                    .filter(|_| round_trip < engine::patience(&*self.backend)),
                                std::iter::once(i).chain(others.iter()),
                            ),
                            false => Vec::new(),
                        };
                        if !candidates.is_empty() {
                            let limit = until_deadline(pause, deadline);
                            // Borrowed: nodes that are not subscribed (`Unheard`) leave them
                            // to the pause below.
                            let r = crate::det::select! {
                                r = wait_for_any_node(&candidates, limit) => Some(r),
                                () = release_heard(&mut notified, &mut also_notified) => None,
                            };
                            match r {
                                None => woken_early = true,
                                Some(NodeWait::Arrived | NodeWait::Published) => {
                                    on_release = true;
                                    racing = true;
                                    continue;
                                }
                                // Another release: its attempt is staggered like any other.
                                Some(NodeWait::NewRelease) => {
                                    quick_retries = 3;
                                    on_release = true;
                                    stagger(round_trip, i.lead(), deadline).await;
                                    racing = true;
                                    continue;
                                }
                                Some(NodeWait::TimedOut) => {
                                    if passed(deadline) {
                                        return Err(given_up(
                                            err,
                                            attempts,
                                            started,
                                            GaveUp::Deadline,
                                        ));
                                    }
                                    // The pause was slept out: the next attempt counts.
                                    after_release = false;
                                    continue;
                                }
                                // The node is not subscribed: the wait below.
                                Some(NodeWait::Unheard) => {}
                            }
                        }
                        let wait = if quick {
                            quick_retries -= 1;
                            let unit: f64 = crate::det::unit();
                            (round_trip * 4).mul_f64(unit).min(pause)
                        } else {
                            quick_retries = 0;
                            pause
                        };
                        let woken = woken_early || crate::det::select! {
                            () = release_heard(&mut notified, &mut also_notified) => true,
                            () = crate::timer::sleep(wait) => false,
                        };
                        // A pause cut at the deadline that no release ended: the call is over.
                        if cut && !woken && passed(deadline) {
                            return Err(given_up(err, attempts, started, GaveUp::Deadline));
                        }
                        // A local hand-off: the release was this client's, meant for this
                        // waiter, whose attempt reaches every node right behind the deletes.
                        let handed = woken && interest.as_ref().map(Interest::handoffs) != handoffs;
                        // Woken by a release, or a quick retry after one: not counted.
                        on_release = woken || quick;
                        if woken {
                            quick_retries = 3;
                            after_release = true;
                        } else if quick {
                            // The split was a race against other clients' attempts, and so is
                            // its retry: through the first node, like theirs. Asking every node
                            // at once can win while another racer holds the first node, which
                            // looks like a first node holding a stale key (see
                            // `PASS_OVER_REFUSED`).
                            racing = true;
                        } else {
                            after_release = false;
                        }
                        if woken && !handed && interest.as_ref().is_none_or(Interest::others_compete)
                        {
                            // Every client's waiter hears the same release. Retrying all at once
                            // splits the nodes' votes so that nobody reaches a quorum; a random
                            // stagger lets the first one win cleanly. (A release of this client's
                            // that no other client listened to has no other waiters to race.)
                            let lead = interest.as_ref().map_or(0.0, Interest::lead);
                            // Only a first node that refused the attempt is known to have held
                            // the lock's key, and to publish its release; one that granted it
                            // (it missed the holder's key) or did not answer in time may never
                            // publish, nor one that may have refused with this client's own
                            // late grant of an earlier attempt, nor one that confirmed the channel
                            // after the attempt was sent (it may have published the release
                            // before). Without the wait (or with none to make: the node is not
                            // subscribed), an attempt that reaches it ahead of the release's
                            // delete is retried on its message, or soon after (above).
                            if let Some(i) = interest.as_ref()
                                && (first_unsettled
                                    || !first_listens(i)
                                    || !self.first_node_refused(
                                        &err,
                                        &resources[0],
                                        unanswered.get(this_attempt),
                                    )
                                    || self.await_first_node(i, &resources[0], deadline).await
                                        == NodeWait::Unheard)
                            {
                                first_skipped = true;
                            }
                            stagger(round_trip, lead, deadline).await;
                            racing = true;
                        }
                    }
                    _ => tokio::time::sleep(pause).await,
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Before a racing attempt (which asks `resource`'s first node first): waits, at most a
    /// node timeout, for that node's own message of the release just heard, so that the attempt
    /// does not reach it ahead of the release's delete. Test
    /// `local_fifo::a_waiter_hears_its_clients_lock_released_by_another_client`: a client that
    /// releases on connections it is still opening deletes on one node a few milliseconds
    /// after another; the waiter woken by the faster node's message was refused by the first
    /// node and slept out its 2 s retry delay (1 run in 15).
    ///
    /// Never past `deadline`, the retry policy's (no attempt starts after it).
    async fn await_first_node(
        &self,
        interest: &Interest,
        resource: &str,
        deadline: Option<Instant>,
    ) -> NodeWait {
        if !self.config.race_via_first_node {
            return NodeWait::Published;
        }
        let Some(node) = self.first_node_index(resource) else {
            return NodeWait::Published;
        };
        let limit = until_deadline(self.config.node_timeout, deadline);
        interest.wait_for_node(node, limit).await
    }

    /// Whether `resource`'s first node refused the attempt that failed with `err`.
    /// With `late`, the attempt's requests still out when it was decided: a refusal that came
    /// after the decision counts too.
    fn first_node_refused(
        &self,
        err: &Error,
        resource: &str,
        late: Option<&engine::Unanswered>,
    ) -> bool {
        let nodes = match err {
            Error::Busy { nodes, .. } | Error::QuorumUnreachable { nodes, .. } => nodes,
            _ => return false,
        };
        let Some(node) = self.first_node_index(resource) else {
            return false;
        };
        match nodes.get(node).map(|r| &r.outcome) {
            Some(NodeOutcome::Refused) => true,
            Some(NodeOutcome::Pending) => late.is_some_and(|late| late.refused(node)),
            _ => false,
        }
    }

    /// The last attempt's round trip, the scale of a stagger.
    fn round_trip(&self) -> Duration {
        Duration::from_micros(
            self.round_trip_us
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Records on `interest` until when a guard of this client holds `key`, if one does. The
    /// lookup runs under the waiters' lock, and a guard's release forgets the guard in the
    /// renewer before it clears the record under that lock: the record is either made before
    /// the release clears it, or not made.
    /// Returns whether the lock is recorded as held by this client (see [`Interest::held_by`]).
    fn note_guard(&self, interest: &Interest, key: &str) -> bool {
        interest.held_by(|| self.renewer.held_until(key))
    }

    /// How long a waiter may wait for the release of a lock held by another task of this
    /// client before it makes its next attempt: what is left of its turn's limit while the
    /// client hears releases on the channel, else (releases may go unheard) one retry delay.
    fn local_wait_limit(
        &self,
        policy: &RetryPolicy,
        attempts: u32,
        started: Instant,
        channel: &str,
    ) -> Option<Duration> {
        let waiters = self.waiters.as_ref()?;
        if waiters.subscribed(channel) {
            policy
                .wait_limit(self.config.node_timeout)
                .checked_sub(started.elapsed())
                .filter(|left| !left.is_zero())
        } else {
            policy.next_delay(attempts, started.elapsed(), crate::det::unit())
        }
    }

    pub(crate) async fn extend(&self, lock: &mut Lock) -> Result<(), Error> {
        self.owns(lock)?;
        self.usable()?;
        let span = tracing::debug_span!("redlock.extend", resources = ?&*lock.resources, token = %lock.token);
        async {
            let ttl = lock.ttl;
            let clocks = Deadline::clocks();
            let started = clocks.0;
            let op = Arc::new(Op::Extend {
                keys: Arc::clone(&lock.keys),
                token: lock.token.clone(),
                ttl_ms: lock::ttl_ms(ttl),
            });
            let mut phase = Phase::start(
                &self.backend,
                PhaseName::Extend,
                op,
                Goal::Quorum,
                None,
                None,
            );
            let d = phase.decided().await;
            // The new validity counts from the extension's start, never from the old deadline.
            let valid_for = Judge::new(PhaseName::Extend, &lock.resources, ttl, &self.config)
                .min_validity(lock.min_validity)
                .judge(&d, &*self.backend, started.elapsed())
                .inspect_err(|_| {
                    let refused = d.count(|o| matches!(o, NodeOutcome::Refused));
                    tracing::debug!(
                        granted = d.positive,
                        refused,
                        "extend failed; lock left as it was"
                    );
                })?;
            lock.valid_until = Deadline::after(clocks, valid_for);
            // The nodes that extended it hold the keys: a renewal of the lock guarded later
            // does not put them back there early (see `Granted::may_have_held`).
            if let Some(granted) = &lock.granted {
                for (i, outcome) in d.outcomes.iter().enumerate() {
                    if *outcome == NodeOutcome::Confirmed {
                        granted.held_on(i);
                    }
                }
            }
            Ok(())
        }
        .instrument(span)
        .await
    }

    pub(crate) async fn release(&self, lock: Lock) -> Result<ReleaseReport, Error> {
        self.owns(&lock)?;
        if let Some(granted) = &lock.granted
            && lock.is_valid()
        {
            // The nodes' late answers have arrived by now. Only while the lock is valid: no
            // other holder's key can be on the first node then, and a key that stays there is
            // stale. Released late, the key found was the next holder's, and the first node
            // was passed over for it (test `pass_over::a_late_release_does_not_pass_over_a_
            // first_node_held_by_the_next_holder`).
            self.check_first_node(&lock.resources[0], &lock.keys[0], granted);
        }
        self.release_parts(
            &lock.resources,
            &lock.keys,
            &lock.token,
            lock.granted.as_ref(),
        )
        .await
    }

    /// Owner-checked delete on every node, with a wake-up on the lock's channels. A node none
    /// of the lock's requests left this client for (they waited for a hung node) is spared:
    /// those requests are withdrawn instead, never to be sent (see [`Reach`]).
    pub(crate) async fn release_parts(
        &self,
        resources: &Names,
        keys: &Names,
        token: &Token,
        granted: Option<&engine::Granted>,
    ) -> Result<ReleaseReport, Error> {
        let span =
            tracing::debug_span!("redlock.release", resources = ?&**resources, token = %token);
        async {
            let channels = self.lock_channels(resources, keys);
            let wake = Wake::random();
            let op = Arc::new(Op::Release {
                keys: Arc::clone(keys),
                token: token.clone(),
                channels: Arc::clone(&channels),
                wake,
                before_us: None,
            });
            let (mut phase, spared) = start_release(
                &self.backend,
                op,
                granted,
                self.config.drift_factor,
                token,
                keys,
            );
            if let Some(w) = &self.waiters {
                // The deletes are now queued on every node's connection, and this client's
                // requests reach each node in the order they were made: a local waiter's
                // acquire, made from here on, arrives behind them and cannot find our keys.
                // So local waiters are woken now, without waiting for the release's round
                // trip or the nodes' notification. (Should the release fail, their attempt
                // is refused and they wait again.)
                for c in channels.iter() {
                    w.notify_local(c, wake, spared.as_deref().unwrap_or(&[]));
                }
            }
            let d = phase.decided().await;
            let nodes = d.reports(&*self.backend);
            if let Some(w) = &self.waiters {
                w.release_heard(&channels, &d.heard);
                // Nothing to do in the common case (every node deleted, none still to answer):
                // each call below takes the waiters' lock.
                let is = |o: fn(&NodeOutcome) -> bool| nodes.iter().any(|n| o(&n.outcome));
                if is(|o| matches!(o, NodeOutcome::Refused)) {
                    let deleted_nothing: Vec<bool> = nodes
                        .iter()
                        .map(|n| matches!(n.outcome, NodeOutcome::Refused))
                        .collect();
                    for c in channels.iter() {
                        w.published_nothing(c, wake, &deleted_nothing);
                    }
                }
                if is(|o| matches!(o, NodeOutcome::Pending))
                    && channels.iter().any(|c| w.listens_on(c))
                {
                    published_nothing_later(w, &channels, wake, &nodes, phase.unanswered());
                }
            }
            telemetry::release_done(d.success);
            if d.success {
                tracing::debug!(confirmed = d.positive, "released");
                Ok(ReleaseReport { nodes })
            } else {
                Err(Error::QuorumUnreachable {
                    resources: Arc::clone(resources),
                    phase: PhaseName::Release,
                    granted: d.positive,
                    required: d.needed,
                    nodes,
                    retries: None,
                })
            }
        }
        .instrument(span)
        .await
    }

    /// Whether `key` is free now: enough nodes confirmed they have no such key that no quorum
    /// can hold it (N − quorum + 1, decided as soon as they answered). Otherwise, how many
    /// nodes held it, how many did not answer, and when (on the monotonic clock) it would be
    /// free if nobody renews it. Reads only. A node not answered by `until` (or within its
    /// budget, if sooner) counts as unknown.
    async fn probe(&self, key: &Arc<str>, until: Option<Instant>) -> Probe {
        let n = self.backend.len();
        let needed = engine::needed(Goal::NoQuorumLeft, n);
        let now = Instant::now();
        let mut calls: futures_util::stream::FuturesUnordered<_> = (0..n)
            .map(|i| {
                let call = self.backend.expiry(i, Arc::clone(key));
                let by = now + self.backend.budget(i);
                tokio::time::timeout_at(until.map_or(by, |u| by.min(u)), call)
            })
            .collect();
        let started = Instant::now();
        let mut absent = 0;
        let mut expiries = Vec::new();
        let mut unknown = 0;
        while let Some(answer) = futures_util::StreamExt::next(&mut calls).await {
            match answer {
                Ok(Ok(None)) => absent += 1,
                Ok(Ok(Some(left))) => expiries.push(left),
                Ok(Err(_)) | Err(_) => unknown += 1,
            }
            if absent >= needed {
                return Probe::Free;
            }
        }
        // Free once `needed - absent` of the holding nodes' keys expired, absent renewals.
        expiries.sort();
        let free_at = expiries
            .get(needed - absent - 1)
            .filter(|left| **left != Duration::MAX)
            .map(|left| started + *left);
        Probe::Held {
            held: expiries.len(),
            unknown,
            free_at,
        }
    }

    /// Waits until no quorum holds `resource`, without taking it: probes the nodes now, then
    /// again on every release notification and at the latest [`RECHECK`] later (sooner when
    /// the holders' keys expire sooner), until `timeout` has passed.
    ///
    /// The wait ends by the deadline plus one node timeout: the check made at the deadline
    /// gets that long, the subscription nothing past the deadline; only the first check gets
    /// its whole budget (a timeout shorter than one check still gets one). A check's budget
    /// includes opening a connection (up to five node timeouts), and a check or subscription
    /// started just before the deadline used to run all of it past the deadline: with a
    /// majority hung, a 300 ms wait took about 700 ms (test
    /// `released::a_wait_on_a_hung_majority_ends_by_its_timeout`).
    pub(crate) async fn wait_released(
        &self,
        resource: &str,
        timeout: Duration,
    ) -> Result<(), Error> {
        let (resources, keys) = self.keys(vec![resource.to_owned()])?;
        self.usable()?;
        let key: Arc<str> = Arc::from(keys[0].as_str());
        let started = Instant::now();
        let deadline = lock::far_after(started, timeout);
        let mut interest: Option<Interest> = None;
        let mut first = true;
        loop {
            // Listen before probing, so a release between the probe and the wait counts. Every
            // node's message of a release counts, not only the first: the first node to delete
            // may publish before the others have, and a probe then still finds the key on a
            // quorum (it then waited for the 1 s re-check: test `returns_promptly_after_release`
            // failed so in a CI run).
            let notify = interest.as_ref().map(|i| Arc::clone(&i.heard));
            let mut notified = notify.as_ref().map(|n| Box::pin(n.notified()));
            if let Some(n) = notified.as_mut() {
                n.as_mut().enable();
            }
            let cut = (!first).then(|| deadline + self.config.node_timeout);
            first = false;
            let (held, unknown, free_at) = match self.probe(&key, cut).await {
                Probe::Free => return Ok(()),
                Probe::Held {
                    held,
                    unknown,
                    free_at,
                } => (held, unknown, free_at),
            };
            let timed_out = || Error::WaitTimedOut {
                resource: resources[0].clone(),
                timeout,
                waited: started.elapsed(),
                held,
                unknown,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(timed_out());
            }
            if interest.is_none()
                && let Some(waiters) = &self.waiters
            {
                // Subscribe, then probe again at once: the holder may have left meanwhile.
                let channel = format!("{}{}", self.channel_prefix, resources[0]);
                match tokio::time::timeout_at(deadline, waiters.interest(&channel, None)).await {
                    Ok(subscribed) => interest = Some(subscribed),
                    Err(_) => return Err(timed_out()),
                }
                continue;
            }
            let recheck = free_at
                .map_or(RECHECK, |at| {
                    at.saturating_duration_since(now) + Duration::from_millis(1)
                })
                .min(RECHECK);
            let until = (now + recheck).min(deadline);
            crate::det::select! {
                () = async { if let Some(n) = notified { n.await } else { std::future::pending().await } } => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// Turns a lock into a renewed guard, starting the renewal driver if needed.
    pub(crate) fn guard(self: &Arc<Self>, lock: Lock) -> LockGuard {
        let held = self.renewer.hold(lock);
        telemetry::lease_started();
        LockGuard::new(held, Arc::clone(self) as Arc<dyn Releaser>)
    }
}

/// The nodes of a release still to answer when it was decided, followed in the background:
/// each that answers having deleted nothing counts, for this client's waiters, as having
/// published the release (see [`Waiters::published_nothing`]). Under load the first node's
/// answer often comes after the quorum's, and a local waiter waited out the node timeout for
/// it (test `waiting::a_local_waiter_does_not_wait_for_a_first_node_that_lost_the_holders_key`
/// in a CI-like run). Only where this client listens on one of the lock's channels.
fn published_nothing_later(
    w: &Arc<Waiters>,
    channels: &Arc<[String]>,
    wake: Wake,
    nodes: &[crate::error::NodeReport],
    later: Option<engine::Unanswered>,
) {
    let pending: Vec<usize> = (0..nodes.len())
        .filter(|&i| matches!(nodes[i].outcome, NodeOutcome::Pending))
        .collect();
    let (Some(later), Ok(rt), false) = (
        later,
        tokio::runtime::Handle::try_current(),
        pending.is_empty(),
    ) else {
        return;
    };
    let (w, channels, n) = (Arc::clone(w), Arc::clone(channels), nodes.len());
    drop(rt.spawn(async move {
        let until = later.settles_by();
        for i in pending {
            later.answered(i, until).await;
            if later.refused(i) {
                let mut nothing = vec![false; n];
                nothing[i] = true;
                for c in channels.iter() {
                    w.published_nothing(c, wake, &nothing);
                }
            }
        }
    }));
}

/// Starts a release phase: the owner-checked delete on every node but those spared (see
/// [`engine::Granted::withdraw_unsent`]). The deletes of a lock taken with the caller's token
/// carry deadlines on the nodes' clocks and are, like an attempt's cleanup, waited for by the
/// next attempt with the token (see `reclaim`): sent before they landed, a re-claim kept the
/// keys and the late deletes took them (test `reclaim_attacks::a_reclaim_after_a_failed_
/// release_keeps_its_lock`). Returns the phase and the nodes spared.
fn start_release<B: Backend>(
    backend: &Arc<B>,
    op: Arc<Op>,
    granted: Option<&engine::Granted>,
    drift_factor: f64,
    token: &Token,
    keys: &Names,
) -> (Phase<B>, Option<Vec<bool>>) {
    let token_use = granted.map_or(engine::TokenUse::Fresh, engine::Granted::token_use);
    let own_token = granted.filter(|_| token_use == engine::TokenUse::Own);
    // A lock whose token the caller read may be re-claimed with it too; no node clock bounds
    // its deletes, but the re-claim waits for them as long as the release may still wait for
    // their answers (its node timeout, the 1 s grace, its node timeout again): deletes held up
    // for longer can still take the re-claimed keys (docs/protocol.md).
    let pinned = token_use == engine::TokenUse::Read;
    let spared = granted.map(engine::Granted::withdraw_unsent);
    let phase = Phase::release(
        backend,
        op,
        spared.as_deref().unwrap_or(&[]),
        own_token,
        drift_factor,
        pinned,
    );
    if (own_token.is_some() || pinned)
        && let Some(deletes) = phase.unanswered()
    {
        crate::reclaim::register(token, keys, deletes);
    }
    (phase, spared)
}

impl<B: Backend> Releaser for Core<B> {
    fn finish(&self, held: &Arc<Held>, reason: LostReason) {
        self.renewer.finish(held, reason);
    }

    fn background(&self) -> Option<crate::background::Task> {
        self.backend.background().map(Background::task)
    }

    fn release_held(
        &self,
        held: Arc<Held>,
    ) -> futures_util::future::BoxFuture<'_, Result<ReleaseReport, Error>> {
        Box::pin(async move {
            self.release_parts(
                &held.resources,
                &held.keys,
                &held.token,
                held.granted.as_ref(),
            )
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{FAR_MARGIN, far_nodes};
    use std::time::Duration;

    fn far(distances: &[Option<u64>], quorum: usize) -> Vec<usize> {
        let f = far_nodes(distances.len(), quorum, |i| {
            distances[i].map(Duration::from_micros)
        });
        (0..distances.len()).filter(|&i| f.contains(i)).collect()
    }

    #[test]
    fn a_node_much_further_than_a_quorum_is_far() {
        // One node 4 ms away, the others 0.2 ms: a quorum of 3 never needs it.
        assert_eq!(
            far(&[Some(200), Some(4200), Some(210), Some(190), Some(250)], 3),
            [1]
        );
        // Two of five far: still a quorum of near ones.
        assert_eq!(
            far(
                &[Some(4000), Some(200), Some(4100), Some(200), Some(200)],
                3
            ),
            [0, 2]
        );
        // One of three far.
        assert_eq!(far(&[Some(300), Some(300), Some(9000)], 2), [2]);
    }

    #[test]
    fn nodes_a_quorum_needs_are_never_far() {
        // Three of five far: a quorum needs one of them, and the reference is theirs.
        assert!(
            far(
                &[Some(200), Some(4000), Some(4100), Some(200), Some(4200)],
                3
            )
            .is_empty()
        );
        // Nodes spread over zones: two near, three a zone away (1.5 ms).
        assert!(
            far(
                &[Some(200), Some(250), Some(1500), Some(1600), Some(1550)],
                3
            )
            .is_empty()
        );
        // Within the margin of the reference, and exactly at the limit.
        let limit = 2 * 200 + u64::try_from(FAR_MARGIN.as_micros()).unwrap();
        assert!(far(&[Some(200), Some(200), Some(limit)], 2).is_empty());
        assert_eq!(far(&[Some(200), Some(200), Some(limit + 1)], 2), [2]);
    }

    #[test]
    fn nothing_is_far_before_a_quorum_answered() {
        assert!(far(&[None, Some(200), Some(9000), None, None], 3).is_empty());
        assert!(far(&[None, None, None], 2).is_empty());
        // Unknown nodes are never far; a quorum of known ones sets the reference.
        assert_eq!(
            far(&[None, Some(200), Some(9000), Some(200), Some(210)], 3),
            [2]
        );
    }
}
