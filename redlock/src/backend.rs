//! The seam between the quorum engine and the nodes: one small trait, so the engine runs on
//! real Redis nodes in production and on scripted fakes in the algorithm tests.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::claim::Claim;
use crate::error::{ConfigError, NodeError};
use crate::token::Token;

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
    },
}

impl Op {
    /// Whether an acquire must run the acquire script even for one fresh key without a stamp,
    /// where a plain `SET NX PX` would grant alike: it re-arms a token that may be on the node,
    /// or asks for the identity record to be checked.
    pub(crate) fn scripted(&self) -> bool {
        matches!(self, Op::Acquire { rearm, checked, .. } if *rearm || *checked)
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
    /// token already (re-armed it rather than created it; see `scripts::KEPT`).
    Yes {
        claim: Option<Claim>,
        heard: Option<u32>,
        kept: bool,
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
    /// with the node's claim when `stamped` (`node` = the server's identity), or a refusal.
    pub(crate) fn acquired(answer: i64, stamped: bool, node: &Arc<str>) -> Self {
        match crate::scripts::grant(answer) {
            Some((value, kept)) => Reply::Yes {
                claim: stamped.then(|| Claim {
                    node: Arc::clone(node),
                    stamp_us: value,
                }),
                heard: None,
                kept,
            },
            None => Reply::No,
        }
    }

    /// A release's answer: `Yes` when it deleted anything, with how many subscribers heard
    /// its wake-up on the node, if known.
    pub(crate) fn released(n: i64, heard: Option<u32>) -> Self {
        if n > 0 {
            Reply::Yes {
                claim: None,
                heard,
                kept: false,
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
