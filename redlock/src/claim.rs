//! A node's part of a grant: what fencing tokens are made of.

use std::sync::Arc;

/// One node's part of a grant: the server's identity and the claim stamp it issued (µs, strictly increasing
/// per node across all grants). The set of claims of a lock is its fencing token
/// (`docs/fencing.md`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Claim {
    /// The server's identity: a random id the server keeps in its identity record (created
    /// once), the same whichever address or client reaches it.
    pub node: Arc<str>,
    /// The stamp the node's acquire script issued.
    pub stamp_us: u64,
}
