//! A held lock and what `release` reports.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{NodeOutcome, NodeReport};
use crate::token::Token;

/// One node's part of a grant: its name and the claim stamp it issued (µs, strictly increasing
/// per node across all grants). The set of claims of a lock is its fencing token (DESIGN §5).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Claim {
    /// The node's name.
    pub node: Arc<str>,
    /// The stamp the node's acquire script issued.
    pub stamp_us: u64,
}

/// A lock held on a quorum of nodes.
///
/// Plain data: dropping it does **not** release anything — the keys then expire after the TTL.
/// Give it back with [`Redlock::release`](crate::Redlock::release) as soon as the work is done.
#[must_use = "a dropped Lock stays held on the nodes until its TTL expires; release it"]
pub struct Lock {
    pub(crate) resources: Arc<[String]>,
    pub(crate) keys: Arc<[String]>,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) valid_until: Instant,
    pub(crate) claims: Vec<Claim>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("resources", &self.resources)
            .field("token", &self.token)
            .field("remaining", &self.remaining())
            .field("claims", &self.claims)
            .finish()
    }
}

impl Lock {
    /// The lock's token (redacted in `Debug`; see [`Token::expose`]).
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The resource names (without the key prefix), in the order given.
    pub fn resources(&self) -> &[String] {
        &self.resources
    }

    /// The TTL each node was given.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The local deadline of the lock's validity: TTL − elapsed − drift after the last
    /// successful acquire or extend, on the monotonic clock. Work must finish before it.
    pub fn valid_until(&self) -> std::time::Instant {
        self.valid_until.into_std()
    }

    /// Validity left now (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Whether validity is left.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }

    /// The granting quorum's `(node, stamp)` claims, sorted by node name.
    pub fn claims(&self) -> &[Claim] {
        &self.claims
    }

    /// The lock's fencing token: the granting quorum's claims as a [`fencing::FenceToken`],
    /// for the protected resource to check (DESIGN §5, `docs/fencing.md`).
    ///
    /// `None` when the lock has no claims (`claim_stamps(false)`), or when they cannot form a
    /// token: more than [`fencing::MAX_CLAIMS`] nodes, or a node name that is empty or longer
    /// than [`fencing::MAX_NODE_NAME_LEN`] bytes.
    pub fn fence(&self) -> Option<fencing::FenceToken> {
        if self.claims.is_empty() {
            return None;
        }
        fencing::FenceToken::new(
            self.claims
                .iter()
                .map(|c| (Arc::clone(&c.node), c.stamp_us)),
        )
        .map_err(|e| tracing::warn!(error = %e, "lock claims do not form a fence token"))
        .ok()
    }
}

/// What `release` found on each node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReleaseReport {
    /// Per node: `Granted` = our key was deleted there, `Refused` = it was already gone (or
    /// someone else's), `Failed`/`TimedOut` = unknown, `Pending` = still in flight when the
    /// release was decided (finished in the background).
    pub nodes: Vec<NodeReport>,
}

impl ReleaseReport {
    /// Nodes on which our key was still present and has been deleted.
    pub fn released(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Granted))
    }

    /// Nodes that confirmed they no longer held our key (expired or taken over).
    pub fn not_held(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Refused))
    }

    /// Nodes whose outcome is unknown or still pending.
    pub fn unknown(&self) -> usize {
        self.nodes.len() - self.released() - self.not_held()
    }

    /// True when no node still held the lock: it had expired everywhere that answered.
    pub fn was_expired(&self) -> bool {
        self.released() == 0
    }

    fn count(&self, f: impl Fn(&NodeOutcome) -> bool) -> usize {
        self.nodes.iter().filter(|r| f(&r.outcome)).count()
    }
}
