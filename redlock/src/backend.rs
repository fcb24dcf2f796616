//! The seam between the quorum engine and the nodes: one small trait, so the engine runs on
//! real Redis nodes in production and on scripted fakes in the algorithm tests.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::error::NodeError;
use crate::token::Token;

/// One request sent to every node of a phase.
#[derive(Debug)]
pub(crate) enum Op {
    /// Grant (or re-arm our own token) and, with a stamp key, return the node's claim stamp.
    Acquire {
        /// `None` when claim stamps are off.
        stamp_key: Option<Arc<str>>,
        /// The node's birth record, for the restart quarantine.
        born_key: Arc<str>,
        /// Restart quarantine in ms; 0 = off.
        quarantine_ms: u64,
        keys: Arc<[String]>,
        token: Token,
        ttl_ms: u64,
        /// The token may already be on the node (re-acquire with a known token).
        rearm: bool,
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
    },
}

/// A node's answer, stripped to what the quorum engine needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Granted / extended / deleted. Acquire grants carry the node's claim stamp (µs).
    Yes { stamp_us: Option<u64> },
    /// Refused / not ours / already gone.
    No,
}

/// A set of N nodes the engine can talk to.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Number of nodes.
    fn len(&self) -> usize;
    /// Display name of node `i` (never contains a secret).
    fn name(&self, i: usize) -> &Arc<str>;
    /// How long the engine waits for node `i`'s answer to one request. Real nodes add the
    /// connect timeout while they have no connection yet.
    fn budget(&self, i: usize) -> Duration;
    /// Sends `op` to node `i`. The future must make progress on its own once created
    /// (it is polled from a spawned task) and must not borrow `self`.
    fn call(&self, i: usize, op: Arc<Op>) -> BoxFuture<'static, Result<Reply, NodeError>>;
    /// Extends many locks on node `i` in one round trip; one `true` per extended lock.
    fn extend_many(
        &self,
        i: usize,
        batch: Arc<Batch>,
    ) -> BoxFuture<'static, Result<Vec<bool>, NodeError>>;
}

/// Locks renewed together: their keys and tokens, and the TTL they all get.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) ttl_ms: u64,
    pub(crate) locks: Vec<(Arc<[String]>, Token)>,
}
