//! The seam between the quorum engine and the nodes: one small trait, so the engine runs on
//! real Redis nodes in production and on scripted fakes in the algorithm tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::claim::Claim;
use crate::error::{ConfigError, NodeError, NodeErrorKind};
use crate::token::Token;

/// Why a release bounded on the node's clock deleted nothing.
const PAST_DEADLINE: &str = "the delete's deadline on the node's clock had passed (its clock stepped forward, or runs faster than the drift factor allows): nothing deleted, and what is there expires with its TTL";

/// One request sent to every node of a phase.
#[derive(Debug)]
pub(crate) enum Op {
    /// Grant (or re-arm our own token) and, with claim stamps on, return the node's claim.
    Acquire {
        /// Whether the grant issues a claim stamp.
        stamped: bool,
        keys: Arc<[String]>,
        token: Token,
        ttl_ms: u64,
        /// The token may already be on the node (re-acquire with a known token, or a renewal
        /// putting back keys a node lost).
        rearm: bool,
        /// The node's identity record is checked even where a plain `SET NX PX` would do
        /// (no stamp, one key, a fresh token): a racing attempt, which asks first the node the
        /// identity records rank first, learns this way that a record changed (an operator
        /// deleted it, say) and reconnects, which reads the new one; otherwise the client
        /// ranked by the old record for as long as its connection lasted.
        checked: bool,
        /// Whether the lock's requests ever left this client for each node (see [`Reach`]);
        /// `None` for an acquire with the caller's token, whose keys may hold somebody's
        /// lock already.
        reach: Option<Reach>,
    },
    /// Owner-checked `PEXPIRE` of every key.
    Extend {
        keys: Arc<[String]>,
        token: Token,
        ttl_ms: u64,
    },
    /// Owner-checked delete of every key, publishing a wake-up on each deleted key's channel.
    Release {
        keys: Arc<[String]>,
        token: Token,
        channels: Arc<[String]>,
        /// The message every node publishes for this release (see [`Wake`]).
        wake: Wake,
        /// The last moment on the node's clock (`TIME`, µs) at which it may still delete:
        /// the cleanup of an attempt with the caller's token, which must not run after the
        /// token's next attempt could have kept the keys (see `scripts::RELEASE_BEFORE`).
        /// `None` for every other release.
        before_us: Option<u64>,
    },
}

impl Op {
    /// Where this request's trip to node `node` is recorded, if anywhere (see [`Reach`]).
    pub(crate) fn fate(&self, node: usize) -> Option<Fate> {
        match self {
            Op::Acquire {
                reach: Some(reach), ..
            } if node < reach.nodes() => Some(Fate {
                reach: reach.clone(),
                node,
            }),
            _ => None,
        }
    }

    /// Whether an acquire must run the acquire script even for one fresh key without a stamp,
    /// where a plain `SET NX PX` would grant alike: it re-arms a token that may be on the node,
    /// or asks for the identity record to be checked.
    pub(crate) fn scripted(&self) -> bool {
        matches!(self, Op::Acquire { rearm, checked, .. } if *rearm || *checked)
    }

    /// Whether an acquire's grant answers the node's clock (`scripts::GRANT_CLOCK`): one that
    /// re-arms a token that may be on the node (the caller's own, or a put-back), so that the
    /// cleanup of an attempt with the caller's token can be bounded on the node's clock (see
    /// `scripts::RELEASE_BEFORE`).
    pub(crate) fn timed(&self) -> bool {
        matches!(self, Op::Acquire { rearm: true, .. })
    }

    /// This release, bounded to run on the node only up to `before_us` on its clock.
    pub(crate) fn before(&self, before_us: u64) -> Option<Op> {
        match self {
            Op::Release {
                keys,
                token,
                channels,
                wake,
                ..
            } => Some(Op::Release {
                keys: Arc::clone(keys),
                token: token.clone(),
                channels: Arc::clone(channels),
                wake: *wake,
                before_us: Some(before_us),
            }),
            _ => None,
        }
    }
}

/// Whether the requests that can write a lock's keys (its acquire, and a renewal's put-back
/// of keys a node lost) ever left this client for each node, so that its release can spare a
/// node none of them reached. Without it, a client taking and releasing locks while a node
/// hung queued a release for that node per lock, without bound (a release is never dropped:
/// the grant it undoes may be waiting in the same outbox), and the node, once resumed, ran
/// them all before it could grant again (test `batch_attacks::releases_are_not_queued_for_a_
/// hung_node_their_grants_never_reached`).
///
/// Per node: not known (no request reached the node layer, or its backend does not record
/// trips: such a node always gets the release), refused by the client before it waited
/// anywhere (a full outbox, a restart's quarantine), waiting in the client (for the
/// connection to open, or in the connection's outbox), sent
/// (handed to the connection: it may be written), or withdrawn (never to be sent). The outbox
/// marks a request sent before handing it over and does not send a withdrawn one; the release
/// withdraws a refused or waiting one, and spares the node only then. Both are one atomic
/// step, so exactly one of them wins: either the request never leaves the client, or the
/// release goes out after it, in order. Only the release withdraws: a refusal is not final,
/// and a later put-back of a guard's keys to that node is sent (a refusal that was final kept
/// every later put-back from the node, and the guard on a bare quorum for good: test
/// `repair_races::a_repair_refused_by_the_quarantine_does_not_block_the_later_ones`).
///
/// Once the caller read the lock's token ([`Lock::token`](crate::Lock::token),
/// [`Lease::token`](crate::Lease::token)), the lock is pinned and its release goes to every
/// node: the token may have been handed on, and a re-claim with it (`try_acquire_with_token`)
/// writes keys this record knows nothing of. Sparing node 0 then left the key such a re-claim
/// wrote there until the TTL, after the release had returned (test `api_attacks::a_release_
/// deletes_what_a_reclaim_with_the_token_wrote_on_a_hung_node`).
#[derive(Clone)]
pub(crate) struct Reach(Arc<[AtomicU8]>);

const UNKNOWN: u8 = 0;
const REFUSED: u8 = 1;
const WAITING: u8 = 2;
const SENT: u8 = 3;
const WITHDRAWN: u8 = 4;

impl std::fmt::Debug for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reach").finish_non_exhaustive()
    }
}

impl Reach {
    /// One entry per node, then the pin.
    pub(crate) fn new(nodes: usize) -> Self {
        Self((0..=nodes).map(|_| AtomicU8::new(UNKNOWN)).collect())
    }

    fn nodes(&self) -> usize {
        self.0.len() - 1
    }

    /// The lock's token left the library (see above): no node is spared from here on.
    pub(crate) fn pin(&self) {
        self.0[self.nodes()].store(WITHDRAWN, Ordering::Release);
    }

    /// Whether the lock's token left the library (see [`Reach::pin`]).
    pub(crate) fn pinned(&self) -> bool {
        self.0[self.nodes()].load(Ordering::Acquire) != UNKNOWN
    }

    /// Withdraws the lock's requests to `node` that are still waiting in this client, if
    /// every one of its requests there is: then none of them ever reached the node, nor ever
    /// will, and it needs no release. `false` when one may have been sent, or nothing is known.
    pub(crate) fn withdraw(&self, node: usize) -> bool {
        if node >= self.nodes() || self.0[self.nodes()].load(Ordering::Acquire) != UNKNOWN {
            return false;
        }
        self.0.get(node).is_some_and(|s| {
            s.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| match v {
                REFUSED | WAITING | WITHDRAWN => Some(WITHDRAWN),
                _ => None,
            })
            .is_ok()
        })
    }
}

/// One node's entry of a lock's [`Reach`], carried by a request to that node.
#[derive(Clone, Debug)]
pub(crate) struct Fate {
    reach: Reach,
    node: usize,
}

impl Fate {
    fn slot(&self) -> &AtomicU8 {
        &self.reach.0[self.node]
    }

    /// The request waits in the client's outbox. `false` when the lock's requests to this
    /// node were withdrawn: it must not wait to be sent.
    pub(crate) fn waiting(&self) -> bool {
        self.slot()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| match v {
                UNKNOWN | REFUSED => Some(WAITING),
                WAITING | SENT => Some(v),
                _ => None,
            })
            .is_ok()
    }

    /// The request is about to be handed to the connection (from then on it may be written).
    /// `false` when the lock's requests to this node were withdrawn: it must not be sent.
    pub(crate) fn sending(&self) -> bool {
        self.slot()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v != WITHDRAWN).then_some(SENT)
            })
            .is_ok()
    }

    /// The client refused the request before it waited anywhere (a full outbox, a restart's
    /// quarantine): it is never sent. Unless another request of the lock went to the node,
    /// the node needs no release.
    pub(crate) fn refused(&self) {
        let _ = self
            .slot()
            .compare_exchange(UNKNOWN, REFUSED, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// A release's wake-up id: what every node that deleted a key publishes on its channel. One
/// release is published by up to N nodes; a waiter acts on the first message and drops the
/// others with the same id, instead of retrying once per node. Random, so it says nothing
/// about the lock or its token. `Wake::NONE` for a cleanup, which publishes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Wake(pub(crate) u64);

impl Wake {
    /// For releases that publish nothing.
    pub(crate) const NONE: Wake = Wake(0);

    /// A fresh random id (never [`Wake::NONE`]).
    pub(crate) fn random() -> Self {
        Wake(crate::det::id().max(1))
    }

    /// The id of a release's second wake-up on a node whose first went out before the delete
    /// (a refused native delete, then the release script): derived from this one, so that every
    /// node of the release sends the same, and different from it, so that a waiter the early
    /// wake-up woke for nothing does not drop this one as a repeat. [`Wake::NONE`] stays
    /// itself.
    pub(crate) fn resent(self) -> Self {
        if self == Wake::NONE {
            return self;
        }
        let derived = (self.0.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15).max(1);
        Wake(if derived == self.0 {
            derived ^ 1
        } else {
            derived
        })
    }

    /// The published form: lowercase hex.
    pub(crate) fn message(self) -> String {
        format!("{:x}", self.0)
    }

    /// The id a published message carries; `None` for one without an id (an empty message
    /// from an older client, or anything else), which is never dropped as a repeat.
    pub(crate) fn parse(message: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(message).ok()?;
        if text.is_empty() || text.len() > 16 {
            return None;
        }
        u64::from_str_radix(text, 16)
            .ok()
            .filter(|v| *v != 0)
            .map(Wake)
    }
}

/// A node's answer, stripped to what the quorum engine needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Granted / extended / deleted. Stamped acquire grants carry the node's claim: the
    /// server's identity and the stamp it issued. A release that deleted something says, when
    /// the node told, how many subscribers heard its wake-up there (this client's own
    /// subscription among them). An acquire grant says whether it `kept` a key that held its
    /// token already (re-armed it rather than created it; see `scripts::KEPT`), and, when it
    /// was asked for ([`Op::timed`]), the node's clock at the grant (`TIME`, µs; a stamp).
    Yes {
        claim: Option<Claim>,
        heard: Option<u32>,
        kept: bool,
        at_us: Option<u64>,
    },
    /// Refused / not ours / already gone.
    No,
}

impl Reply {
    /// The answer of a script or command that counts what it did (keys extended or deleted):
    /// `Yes` when it did anything.
    pub(crate) fn counted(n: i64) -> Self {
        Self::released(n, None)
    }

    /// An acquire script's answer other than an error code (see `scripts::grant`): a grant,
    /// with the node's claim when `stamped` (`node` = the server's identity) and its clock
    /// `at_us` if it answered one (see [`Op::timed`]), or a refusal.
    pub(crate) fn acquired(
        answer: i64,
        stamped: bool,
        at_us: Option<u64>,
        node: &Arc<str>,
    ) -> Self {
        match crate::scripts::grant(answer) {
            Some((value, kept)) => Reply::Yes {
                claim: stamped.then(|| Claim {
                    node: Arc::clone(node),
                    stamp_us: value,
                }),
                heard: None,
                kept,
                at_us,
            },
            None => Reply::No,
        }
    }

    /// A release's answer, or an error when its deadline on the node's clock had passed
    /// (`scripts::RELEASE_BEFORE` answers −1): it deleted nothing, whatever is there.
    pub(crate) fn released_before(n: i64, heard: Option<u32>) -> Result<Self, NodeError> {
        if n < 0 {
            return Err(NodeError::new(NodeErrorKind::Server, PAST_DEADLINE));
        }
        Ok(Self::released(n, heard))
    }

    /// A release's answer: `Yes` when it deleted anything, with how many subscribers heard
    /// its wake-up on the node, if known.
    pub(crate) fn released(n: i64, heard: Option<u32>) -> Self {
        if n > 0 {
            Reply::Yes {
                claim: None,
                heard,
                kept: false,
                at_us: None,
            }
        } else {
            Reply::No
        }
    }
}

/// What a batched renewal found for one lock on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Every key held our token and was re-armed.
    Extended,
    /// No key is held by anyone else, but the node lost some (or all) of them; the present ones
    /// were re-armed.
    Missing,
    /// A key holds another token (or the lock is gone and the node may not say more).
    Refused,
}

/// A set of N nodes the engine can talk to.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Number of nodes.
    fn len(&self) -> usize;
    /// Display name of node `i` (never contains a secret).
    fn name(&self, i: usize) -> &Arc<str>;
    /// How long the engine waits for node `i`'s answer to one request — including any wait for
    /// a connection being opened, which goes on in the background past it.
    fn budget(&self, i: usize) -> Duration;
    /// The client's background tasks (see [`crate::background`]); `None` where nothing waits
    /// for them.
    fn background(&self) -> Option<&crate::background::Background> {
        None
    }
    /// Sends `op` to node `i`. The future must make progress on its own once created
    /// (it is polled from a spawned task) and must not borrow `self`.
    fn call(&self, i: usize, op: Arc<Op>) -> BoxFuture<'static, Result<Reply, NodeError>>;
    /// Extends many locks on node `i` in one round trip, each with its own TTL; one answer per
    /// lock.
    fn extend_many(
        &self,
        i: usize,
        batch: Arc<Batch>,
    ) -> BoxFuture<'static, Result<Vec<Renewed>, NodeError>>;
    /// The connection to node `i` a request made now is sent on, when the backend keeps one
    /// open and sends at once: an id that changes whenever the connection is replaced. Answers
    /// on one connection come back in the order the requests went out. `None`: not known.
    fn connection(&self, i: usize) -> Option<u64> {
        let _ = i;
        None
    }
    /// Whether `connection` (from [`Backend::connection`]) is still node `i`'s connection,
    /// asked by a caller waiting on a request it sent there: the backend checks the connection
    /// as a new request on it would, which replaces it (later, in the background) if it has
    /// gone silent while its server answers.
    fn still_current(&self, i: usize, connection: u64) -> bool {
        let _ = (i, connection);
        false
    }
    /// How long a renewal call keeps node `i`'s server busy per key renewed, when the backend
    /// knows; renewal calls are paced by it (see `renewal.rs`). `None`: not paced.
    fn renewal_cost(&self, i: usize) -> Option<Duration> {
        let _ = i;
        None
    }
    /// How far node `i` is from this client: about the shortest round trip of its recent
    /// answers, when the backend measures it. `None`: not known (no answer yet, or not
    /// measured). Racing attempts do not ask a node much further than a quorum of the others
    /// first (see `Core::first_node_index`).
    fn distance(&self, i: usize) -> Option<Duration> {
        let _ = i;
        None
    }
    /// Where node `i`'s rank for a racing attempt's first node starts
    /// ([`engine::rank_seed`](crate::engine::rank_seed) of the server's identity), when the
    /// backend knows the server; `None`: ranked by its configured name.
    fn rank_seed(&self, i: usize) -> Option<u64> {
        let _ = i;
        None
    }
    /// How long `key` lives on node `i`: `None` when the node has no such key, `Duration::MAX`
    /// for a key without expiry. A read (`PTTL`): it never creates, changes or deletes a key.
    /// Backends without it answer with an error, which counts as an unknown outcome.
    fn expiry(
        &self,
        i: usize,
        key: Arc<str>,
    ) -> BoxFuture<'static, Result<Option<Duration>, NodeError>> {
        let _ = (i, key);
        Box::pin(std::future::ready(Err(NodeError::new(
            crate::error::NodeErrorKind::Server,
            "this backend cannot read a key's expiry",
        ))))
    }
    /// A fingerprint of the value `key` holds on node `i` (see [`fingerprint`]), `None` when the
    /// node has no such key. A read (`GET`): it never creates, changes or deletes a key. It
    /// tells whether the key still holds the same value a moment later, without the value (a
    /// lock token, which is a secret) leaving the node layer.
    fn holder(&self, i: usize, key: Arc<str>)
    -> BoxFuture<'static, Result<Option<u64>, NodeError>>;
    /// A configuration error found after `build()` — the same server behind two of the
    /// configured addresses — after which the client must not count any vote.
    fn misconfigured(&self) -> Option<ConfigError> {
        None
    }
}

/// Locks renewed together: their keys, tokens and each lock's own TTL.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) locks: Vec<BatchEntry>,
}

/// One lock of a renewal batch.
#[derive(Debug)]
pub(crate) struct BatchEntry {
    pub(crate) keys: Arc<[String]>,
    pub(crate) token: Token,
    pub(crate) ttl_ms: u64,
}

/// What [`Backend::holder`] answers for a key's value: equal for equal values within this
/// process, and not the value itself.
pub(crate) fn fingerprint(value: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}
