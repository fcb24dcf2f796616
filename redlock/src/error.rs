//! The crate's one error type and its per-node detail.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Which protocol step an error or report belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Taking the lock (`SET NX PX` script on every node).
    Acquire,
    /// Re-arming the TTL of a held lock.
    Extend,
    /// Owner-checked delete.
    Release,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Acquire => "acquire",
            Self::Extend => "extend",
            Self::Release => "release",
        })
    }
}

/// What one node answered in one phase.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeOutcome {
    /// Acquire: the node granted the lock. Extend: it re-armed the TTL. Release: it deleted our key.
    Granted,
    /// Acquire: another owner holds the key. Extend: the key no longer holds our token.
    /// Release: the key was already gone (expired) or belongs to someone else.
    Refused,
    /// The node answered with an error or the connection failed. The outcome is *unknown*: the
    /// command may still have run, so the node is treated as possibly holding the lock.
    Failed(NodeError),
    /// No answer within the per-node timeout. Also an unknown outcome.
    TimedOut,
    /// Still in flight when the overall outcome was decided; it is finished in the background.
    Pending,
}

impl NodeOutcome {
    /// True for the outcomes after which the node may hold our key (grant or unknown).
    pub fn may_hold(&self) -> bool {
        !matches!(self, Self::Refused)
    }
}

impl fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Granted => f.write_str("granted"),
            Self::Refused => f.write_str("refused"),
            Self::Failed(e) => write!(f, "error: {e}"),
            Self::TimedOut => f.write_str("timed out"),
            Self::Pending => f.write_str("pending"),
        }
    }
}

/// A node's error, with secrets already scrubbed from the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeError {
    kind: NodeErrorKind,
    message: Arc<str>,
}

/// Coarse classes of node errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeErrorKind {
    /// Could not connect (refused, unreachable, TLS handshake).
    Connect,
    /// The server rejected the credentials.
    Auth,
    /// The connection broke while a command was in flight.
    Io,
    /// The server answered with an error (e.g. `WRONGTYPE`, `OOM`, `READONLY`).
    Server,
    /// The node may not grant because it is in its restart quarantine: its server restarted,
    /// lost its data, or is new, less than the configured quarantine ago.
    Quarantined,
    /// The server's identity record is not what the client expects: it changed since the
    /// connection was opened (the data was lost), or the same server is configured twice.
    Identity,
}

impl NodeError {
    pub(crate) fn new(kind: NodeErrorKind, message: impl Into<Arc<str>>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The class of error.
    pub fn kind(&self) -> NodeErrorKind {
        self.kind
    }

    /// The message, free of passwords and tokens.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// One node's line in an error or report: its display name (`host:port`, never a password) and
/// what it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeReport {
    /// The node's name (by default `host:port`).
    pub node: Arc<str>,
    /// What it answered in this phase.
    pub outcome: NodeOutcome,
}

pub(crate) struct NodeList<'a>(pub(crate) &'a [NodeReport]);

impl fmt::Display for NodeList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}: {}", r.node, r.outcome)?;
        }
        Ok(())
    }
}

/// Everything that can go wrong. Variants name the phase and carry per-node detail.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another owner holds the resource on enough nodes that no quorum was possible.
    #[error(
        "lock is busy: held by another owner ({granted}/{required} nodes granted; {})",
        NodeList(nodes)
    )]
    Busy {
        /// Nodes that granted before the attempt was decided (their grants were released).
        granted: usize,
        /// The quorum, ⌊N/2⌋+1.
        required: usize,
        /// Per-node outcomes.
        nodes: Vec<NodeReport>,
    },
    /// Too many nodes failed or timed out for a quorum in this phase.
    #[error(
        "{phase}: quorum unreachable ({granted}/{required} nodes confirmed; {})",
        NodeList(nodes)
    )]
    QuorumUnreachable {
        /// The phase that failed.
        phase: Phase,
        /// Nodes that answered positively.
        granted: usize,
        /// Nodes needed: the quorum for acquire/extend, N − quorum + 1 for release.
        required: usize,
        /// Per-node outcomes.
        nodes: Vec<NodeReport>,
    },
    /// A quorum answered, but the time it took (plus clock drift) left no usable validity.
    #[error(
        "{phase}: validity exhausted: took {elapsed:?} of a {ttl:?} TTL (drift allowance {drift:?}, minimum validity {min_validity:?})"
    )]
    ValidityExhausted {
        /// The phase (acquire or extend).
        phase: Phase,
        /// Time from the first request to the quorum decision.
        elapsed: Duration,
        /// The lock's TTL.
        ttl: Duration,
        /// TTL·drift_factor + 2 ms.
        drift: Duration,
        /// The configured minimum validity.
        min_validity: Duration,
    },
    /// The lock is no longer ours on a quorum (it expired or was taken over). Reported by
    /// `extend`; the lock is left as it is on every node.
    #[error(
        "lock lost: our token is held on only {held}/{required} nodes ({})",
        NodeList(nodes)
    )]
    Lost {
        /// Nodes that still held our token.
        held: usize,
        /// The quorum.
        required: usize,
        /// Per-node outcomes.
        nodes: Vec<NodeReport>,
    },
    /// The lock of a [`with_lock`](crate::Redlock::with_lock) call was lost while the work ran;
    /// the work was cancelled.
    #[error("lock lost while the work ran ({reason}); the work was cancelled")]
    LockLost {
        /// Why the lock was lost.
        reason: LostReason,
    },
    /// A resource name or list was rejected before anything was sent.
    #[error("invalid resource: {0}")]
    InvalidResource(#[from] ResourceError),
    /// The configuration was rejected by `build()`, or found unusable on connecting (the same
    /// server behind two of the configured addresses).
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The lock was taken by a client of other nodes. A lock can only be extended, guarded or
    /// released by a client of the same node list (same addresses and databases); it keeps its
    /// own TTL whichever client renews it.
    #[error(
        "the lock was taken by a client of other nodes ({lock_nodes}); this client uses {client_nodes}"
    )]
    ForeignLock {
        /// The node list of the client that took the lock.
        lock_nodes: String,
        /// The node list of this client.
        client_nodes: String,
    },
    /// [`Redlock::wait_released`](crate::Redlock::wait_released) ran out of time: the
    /// resource was still held (or too many nodes did not answer to tell) when its timeout
    /// passed.
    #[error(
        "waited {waited:?} for {resource:?} to be released: still held on {held} nodes ({unknown} did not answer)"
    )]
    WaitTimedOut {
        /// The resource waited for.
        resource: String,
        /// Time from the call's start to giving up.
        waited: Duration,
        /// Nodes that held a key for it at the last check.
        held: usize,
        /// Nodes that did not answer at the last check.
        unknown: usize,
    },
    /// The operating system's random source failed while generating a token.
    #[error("could not generate a lock token: {0}")]
    Entropy(getrandom::Error),
}

impl Error {
    /// Held by someone else; retrying later is expected to work.
    pub fn is_busy(&self) -> bool {
        matches!(self, Self::Busy { .. })
    }

    /// Too many nodes unreachable.
    pub fn is_quorum_unreachable(&self) -> bool {
        matches!(self, Self::QuorumUnreachable { .. })
    }

    /// A wait ran out of its time ([`Error::WaitTimedOut`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::WaitTimedOut { .. })
    }

    /// The lock was lost.
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::Lost { .. })
    }

    /// Whether another attempt of the same call may succeed (busy, unreachable, exhausted).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Busy { .. } | Self::QuorumUnreachable { .. } | Self::ValidityExhausted { .. }
        )
    }

    /// Per-node detail, for the variants that carry it.
    pub fn nodes(&self) -> &[NodeReport] {
        match self {
            Self::Busy { nodes, .. }
            | Self::QuorumUnreachable { nodes, .. }
            | Self::Lost { nodes, .. } => nodes,
            _ => &[],
        }
    }
}

/// Why a resource name or list was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceError {
    /// No resources were given.
    #[error("no resources given")]
    NoResources,
    /// A resource name is empty.
    #[error("resource name #{index} is empty")]
    Empty {
        /// Position in the list.
        index: usize,
    },
    /// A resource name is longer than allowed.
    #[error("resource name #{index} is {len} bytes; the maximum is {max}")]
    TooLong {
        /// Position in the list.
        index: usize,
        /// Its length in bytes.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// More resources than allowed in one lock.
    #[error("{count} resources in one lock; the maximum is {max}")]
    TooMany {
        /// How many were given.
        count: usize,
        /// The maximum.
        max: usize,
    },
    /// The same resource appears twice.
    #[error("resource #{index} repeats an earlier one")]
    Duplicate {
        /// Position of the repeat.
        index: usize,
    },
}

/// Why `build()` rejected a configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No nodes were configured.
    #[error("no nodes configured; give at least one redis:// URL")]
    NoNodes,
    /// A node URL could not be parsed. The URL is shown with its password replaced by `***`.
    #[error("node #{index} ({url}): {reason}")]
    InvalidNodeUrl {
        /// Position in the node list.
        index: usize,
        /// The redacted URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two entries of the node list turned out, on connecting, to reach the same server (its
    /// identity record is the same), e.g. `127.0.0.1:6379` and `localhost:6379`. The client
    /// then refuses every operation: one server must not vote twice in a quorum.
    #[error(
        "nodes #{first} ({first_node}) and #{second} ({second_node}) reach the same server (identity {server}); Redlock needs independent masters"
    )]
    SameServer {
        /// Earlier position.
        first: usize,
        /// Later position.
        second: usize,
        /// The earlier node's name.
        first_node: String,
        /// The later node's name.
        second_node: String,
        /// The server's identity.
        server: String,
    },
    /// Two entries name the same server (same address, port and database).
    #[error(
        "nodes #{first} and #{second} are the same server ({node}); Redlock needs independent masters"
    )]
    DuplicateNode {
        /// Earlier position.
        first: usize,
        /// Later position.
        second: usize,
        /// The node's name.
        node: String,
    },
    /// A node name is empty, longer than [`MAX_NODE_NAME_LEN`](crate::MAX_NODE_NAME_LEN)
    /// bytes, or contains control characters.
    #[error("node #{index} has an unusable name {name:?}: 1 to 128 bytes, no control characters")]
    InvalidNodeName {
        /// Position in the node list.
        index: usize,
        /// The name.
        name: String,
    },
    /// Two nodes were given the same display name.
    #[error("nodes #{first} and #{second} share the name {name:?}; names must be unique")]
    DuplicateName {
        /// Earlier position.
        first: usize,
        /// Later position.
        second: usize,
        /// The name.
        name: String,
    },
    /// The TTL is zero, too large for Redis, or not larger than the drift allowance.
    #[error("ttl {ttl:?} is unusable: {reason}")]
    InvalidTtl {
        /// The TTL given.
        ttl: Duration,
        /// Why.
        reason: String,
    },
    /// The drift factor is negative, NaN, or so large the lock could never be valid.
    #[error("drift factor {0} must be finite and in [0, 0.5)")]
    InvalidDriftFactor(f64),
    /// The per-node timeout is zero or not shorter than the TTL.
    #[error("node timeout {timeout:?} must be > 0 and shorter than the ttl {ttl:?}")]
    InvalidNodeTimeout {
        /// The timeout given.
        timeout: Duration,
        /// The TTL.
        ttl: Duration,
    },
    /// The retry policy has neither an attempt limit nor a deadline, or a limit of zero.
    #[error("retry policy must be bounded: {0}")]
    InvalidRetry(String),
    /// The key prefix contains characters that are not allowed.
    #[error(
        "key prefix {0:?} is invalid: use at most 64 printable ASCII characters without spaces"
    )]
    InvalidKeyPrefix(String),
    /// A lease setting (renewal interval, max hold, quarantine) is unusable.
    #[error("lease setting: {0}")]
    InvalidLease(String),
    /// `max_resource_len` is zero.
    #[error("max_resource_len must be at least 1")]
    InvalidMaxResourceLen,
    /// The TLS configuration could not be used.
    #[error("TLS configuration: {0}")]
    Tls(String),
}

/// Why a lease's lost signal fired.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LostReason {
    /// The validity deadline passed without a successful extension.
    Expired,
    /// An extension did not reach a quorum (or found the lock taken over).
    ExtendFailed(Box<Error>),
    /// The configured maximum hold time was reached; renewal stopped.
    MaxHold,
    /// The lock was released (or its guard dropped).
    Released,
    /// Renewal was stopped by [`LockGuard::stop_renewal`](crate::LockGuard::stop_renewal): the
    /// keys stay on the nodes until their TTL, held by the returned [`Lock`](crate::Lock).
    RenewalStopped,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Expired => f.write_str("validity deadline passed without a successful extension"),
            Self::ExtendFailed(e) => write!(f, "extension failed: {e}"),
            Self::MaxHold => f.write_str("maximum hold time reached"),
            Self::Released => f.write_str("released"),
            Self::RenewalStopped => f.write_str("renewal stopped; the keys stay until their TTL"),
        }
    }
}

/// A subscription command failed (the connection broke, or the node refused it).
#[derive(Debug)]
pub(crate) struct SubError;
