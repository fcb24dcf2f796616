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
    /// The node did what the phase asked. Acquire: it granted the lock. Extend: it re-armed
    /// the TTL. Release: it deleted our key. Connect: it answered the handshake.
    Confirmed,
    /// Acquire: another owner holds the key. Extend: the key no longer holds our token.
    /// Release: the key was already gone (expired) or belongs to someone else — or none of the
    /// lock's requests ever left this client for the node (they waited for a node that did not
    /// answer, and the release withdrew them unsent), so it has nothing to delete. Also an acquire
    /// that raced other clients' waiters and was refused by the node it asks first: the other
    /// nodes were not asked (see [`Config::race_via_first_node`](crate::Config::race_via_first_node)).
    Refused,
    /// The node answered with an error or the connection failed. The outcome is *unknown*: the
    /// command may still have run, so the node is treated as possibly holding the lock.
    Failed(NodeError),
    /// No answer within the node's budget `after`: the node timeout for a request (plus the
    /// connect allowance when the request had to open the connection first), the connect
    /// timeout for [`Redlock::connect`](crate::Redlock::connect). Also an unknown outcome.
    TimedOut {
        /// The budget that ran out.
        after: Duration,
    },
    /// Still in flight when the overall outcome was decided; it is finished in the background.
    Pending,
}

impl NodeOutcome {
    /// True for the outcomes after which the node may hold our key (grant or unknown).
    pub fn may_hold(&self) -> bool {
        !matches!(self, Self::Refused)
    }

    /// Whether the node answered the request, so that it is done there: not a timeout, nor an
    /// I/O error on this side of the connection (the request may have been written all the
    /// same, and still be on its way).
    pub(crate) fn answered(&self) -> bool {
        match self {
            Self::Confirmed | Self::Refused => true,
            Self::Failed(e) => e.kind() != NodeErrorKind::Io,
            Self::TimedOut { .. } | Self::Pending => false,
        }
    }
}

impl fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Confirmed => f.write_str("confirmed"),
            Self::Refused => f.write_str("refused"),
            Self::Failed(e) => write!(f, "error: {e}"),
            Self::TimedOut { after } => write!(f, "timed out: no answer within {after:?}"),
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
    /// Not a fault of the node: the request never left this client. It waited to be sent
    /// (behind others, or for a node that did not answer) until the lock's release withdrew
    /// it, and nothing of it was written on the node. Or it is the delete of a release of a
    /// lock taken with the caller's token, withheld from a node whose grant was never read:
    /// no deadline on that node's clock could bound it (what the lock left there expires with
    /// its TTL).
    Withdrawn,
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

impl std::error::Error for NodeError {}

/// The resources of a lock, for messages: `"orders:42"`, or `["a", "b"]` for several.
pub(crate) struct Names<'a>(pub(crate) &'a [String]);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [one] => write!(f, "{one:?}"),
            many => write!(f, "{many:?}"),
        }
    }
}

/// The operating system's random source failed (no lock token could be made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntropyError {
    message: Arc<str>,
    os_error: Option<i32>,
}

impl EntropyError {
    pub(crate) fn new(err: &getrandom::Error) -> Self {
        Self {
            message: err.to_string().into(),
            os_error: err.raw_os_error(),
        }
    }

    /// The operating system's error code, when the failure came with one.
    pub fn os_error(&self) -> Option<i32> {
        self.os_error
    }
}

impl fmt::Display for EntropyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EntropyError {}

/// Why an acquire stopped retrying: which budget ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GaveUp {
    /// Only one attempt was asked for (`try_acquire`, `LockRequest::wait(Duration::ZERO)`, a
    /// policy of one attempt).
    SingleAttempt,
    /// The retry policy's `max_attempts` were made (attempts made on a release heard count only
    /// once the time the policy's attempts would take has passed; see
    /// [`RetryPolicy::max_attempts`](crate::RetryPolicy::max_attempts)).
    Attempts,
    /// The retry policy's `deadline` (or the request's `wait`) passed: no attempt could start
    /// before it.
    Deadline,
    /// The call queued behind this client's other acquirers of the same resources for its
    /// whole wait limit, then made one attempt.
    Queue,
    /// The call waited for the release of a lock this client holds (a guard, or a lock one of
    /// its waiting acquirers took) for its whole wait limit, then made one attempt.
    LocalHolder,
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::SingleAttempt => "one attempt was asked for",
            Self::Attempts => "the retry policy's attempts are used up",
            Self::Deadline => "the retry deadline (wait) passed",
            Self::Queue => "queued behind this client's other acquirers for the whole wait limit",
            Self::LocalHolder => {
                "waited for this client's own holder of the lock for the whole wait limit"
            }
        })
    }
}

/// What an acquire did before it gave up: kept on [`Error::Busy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retries {
    /// Attempts made, the last one included.
    pub attempts: u32,
    /// Time from the call's start until it gave up (queueing, attempts and pauses).
    pub waited: Duration,
    /// Which budget ran out.
    pub gave_up: GaveUp,
}

impl Retries {
    /// The history of one attempt that took `waited`; the acquire loop replaces it with the
    /// call's whole history when it gives up.
    pub(crate) fn single(waited: Duration) -> Self {
        Self {
            attempts: 1,
            waited,
            gave_up: GaveUp::SingleAttempt,
        }
    }
}

impl fmt::Display for Retries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gave up after {} attempt{} in {:?}: {}",
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.waited,
            self.gave_up
        )
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

/// `"; gave up after …"` for an acquire's history, nothing without one.
pub(crate) struct History<'a>(pub(crate) &'a Option<Retries>);

impl fmt::Display for History<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => write!(f, "; {r}"),
            None => Ok(()),
        }
    }
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
        "lock {} is busy: held by another owner ({granted}/{required} nodes granted; {}); {retries}",
        Names(resources),
        NodeList(nodes)
    )]
    Busy {
        /// The resources of the lock.
        resources: Arc<[String]>,
        /// Nodes that granted before the attempt was decided (their grants were released).
        granted: usize,
        /// The quorum, ⌊N/2⌋+1.
        required: usize,
        /// Per-node outcomes.
        nodes: Vec<NodeReport>,
        /// The attempts made and which budget ran out.
        retries: Retries,
    },
    /// Too many nodes failed or timed out for a quorum in this phase.
    #[error(
        "{phase} {}: quorum unreachable ({granted}/{required} nodes confirmed; {}){}",
        Names(resources),
        NodeList(nodes),
        History(retries)
    )]
    QuorumUnreachable {
        /// The resources of the lock.
        resources: Arc<[String]>,
        /// The phase that failed.
        phase: Phase,
        /// Nodes that answered positively.
        granted: usize,
        /// Nodes needed: the quorum for acquire/extend, N − quorum + 1 for release.
        required: usize,
        /// Per-node outcomes.
        nodes: Vec<NodeReport>,
        /// Acquire: the attempts made and which budget ran out (the per-node outcomes are the
        /// last attempt's). `None` for extend and release, which make one attempt.
        retries: Option<Retries>,
    },
    /// A quorum answered, but the time it took (plus clock drift) left no usable validity.
    #[error(
        "{phase} {}: validity exhausted: took {elapsed:?} of a {ttl:?} TTL (drift allowance {drift:?}, minimum validity {min_validity:?}){}",
        Names(resources),
        History(retries)
    )]
    ValidityExhausted {
        /// The resources of the lock.
        resources: Arc<[String]>,
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
        /// Acquire: the attempts made and which budget ran out (`elapsed` is the last
        /// attempt's). `None` for extend and renewal.
        retries: Option<Retries>,
    },
    /// The lock is no longer ours on a quorum (it expired or was taken over). Reported by
    /// `extend`; the lock is left as it is on every node.
    #[error(
        "lock {} lost: our token is held on only {held}/{required} nodes ({})",
        Names(resources),
        NodeList(nodes)
    )]
    NotHeld {
        /// The resources of the lock.
        resources: Arc<[String]>,
        /// Nodes that still held our token.
        held: usize,
        /// The quorum.
        required: usize,
        /// Per-node outcomes.
        nodes: Vec<NodeReport>,
    },
    /// The lock of a [`with_lock`](crate::Redlock::with_lock) call was lost while the work ran;
    /// the work was cancelled.
    #[error(
        "lock {} lost while the work ran ({reason}); the work was cancelled",
        Names(resources)
    )]
    LeaseLost {
        /// The resources of the lock.
        resources: Arc<[String]>,
        /// Why the lock was lost.
        reason: LostReason,
    },
    /// A resource name or list was rejected before anything was sent.
    #[error("invalid resource: {0}")]
    InvalidResource(#[from] ResourceError),
    /// The configuration was rejected by `build()`, or found unusable on connecting (the same
    /// server behind two of the configured addresses); or an option of one call (a
    /// [`LockRequest`](crate::LockRequest)'s TTL, minimum validity or retry policy)
    /// was rejected before anything was sent.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The lock was taken by a client of other nodes. A lock can only be extended, guarded or
    /// released by a client of the same node list (same addresses and databases); it keeps its
    /// own TTL whichever client renews it.
    #[error(
        "lock {} was taken by a client of other nodes ({lock_nodes}); this client uses {client_nodes}",
        Names(resources)
    )]
    ForeignLock {
        /// The resources of the lock.
        resources: Arc<[String]>,
        /// The node list of the client that took the lock.
        lock_nodes: String,
        /// The node list of this client.
        client_nodes: String,
    },
    /// [`Redlock::wait_released`](crate::Redlock::wait_released) ran out of time: the
    /// resource was still held (or too many nodes did not answer to tell) when its timeout
    /// passed.
    #[error(
        "waited {waited:?} (the timeout given: {timeout:?}) for {resource:?} to be released: still held on {held} nodes ({unknown} did not answer)"
    )]
    WaitTimedOut {
        /// The resource waited for.
        resource: String,
        /// The timeout given to the call: the budget that ran out.
        timeout: Duration,
        /// Time from the call's start to giving up.
        waited: Duration,
        /// Nodes that held a key for it at the last check.
        held: usize,
        /// Nodes that did not answer at the last check.
        unknown: usize,
    },
    /// The operating system's random source failed while generating a token.
    #[error("could not generate a lock token: {0}")]
    Entropy(EntropyError),
    /// [`Redlock::guard`](crate::Redlock::guard) was called where no tokio runtime is current:
    /// the renewal runs as a task of one. The lock is not renewed and expires with its TTL.
    #[error(
        "lock {} cannot be guarded outside a tokio runtime (its renewal is a task); it is not renewed and expires with its TTL",
        Names(resources)
    )]
    NoRuntime {
        /// The resources of the lock.
        resources: Arc<[String]>,
    },
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

    /// The lock is no longer ours on a quorum ([`Error::NotHeld`]).
    pub fn is_not_held(&self) -> bool {
        matches!(self, Self::NotHeld { .. })
    }

    /// Whether another attempt of the same call may succeed (busy, unreachable, exhausted).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Busy { .. } | Self::QuorumUnreachable { .. } | Self::ValidityExhausted { .. }
        )
    }

    /// The resources of the lock the error is about, for the variants about one lock.
    pub fn resources(&self) -> &[String] {
        match self {
            Self::Busy { resources, .. }
            | Self::QuorumUnreachable { resources, .. }
            | Self::ValidityExhausted { resources, .. }
            | Self::NotHeld { resources, .. }
            | Self::LeaseLost { resources, .. }
            | Self::ForeignLock { resources, .. }
            | Self::NoRuntime { resources } => resources,
            Self::WaitTimedOut { resource, .. } => std::slice::from_ref(resource),
            _ => &[],
        }
    }

    /// The attempts an acquire made before giving up and which budget ran out: on every
    /// error an acquire returns after trying ([`Error::Busy`], and
    /// [`Error::QuorumUnreachable`] / [`Error::ValidityExhausted`] of the acquire phase).
    pub fn retries(&self) -> Option<&Retries> {
        match self {
            Self::Busy { retries, .. } => Some(retries),
            Self::QuorumUnreachable { retries, .. } | Self::ValidityExhausted { retries, .. } => {
                retries.as_ref()
            }
            _ => None,
        }
    }

    /// The error with `history` as its retry history, for the variants that keep one.
    pub(crate) fn with_retries(mut self, history: Retries) -> Self {
        match &mut self {
            Self::Busy { retries, .. } => *retries = history,
            Self::QuorumUnreachable { retries, .. } | Self::ValidityExhausted { retries, .. } => {
                *retries = Some(history);
            }
            _ => {}
        }
        self
    }

    /// Per-node detail, for the variants that carry it.
    pub fn nodes(&self) -> &[NodeReport] {
        match self {
            Self::Busy { nodes, .. }
            | Self::QuorumUnreachable { nodes, .. }
            | Self::NotHeld { nodes, .. } => nodes,
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
    /// The TTL is under 1 ms, too large for Redis, not larger than the drift allowance plus
    /// the minimum validity, or (a request's) not larger than the node timeout.
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
    /// The connect timeout is zero: every connection would time out at once.
    #[error("connect timeout {0:?} must be > 0")]
    InvalidConnectTimeout(Duration),
    /// The retry policy has neither an attempt limit nor a deadline, or a limit of zero.
    #[error("retry policy must be bounded: {0}")]
    InvalidRetry(String),
    /// The key prefix contains characters that are not allowed.
    #[error(
        "key prefix {0:?} is invalid: use at most 64 printable ASCII characters without spaces"
    )]
    InvalidKeyPrefix(String),
    /// The key prefix could make this client's keys another client's: it does not end with a
    /// separator, or it has `lock:` as a segment of its own. With prefixes `app:` and
    /// `app:lock:` on the same servers, one client's stamp key would be the other's lock key of
    /// the resource `stamp`, which would then never expire.
    #[error(
        "key prefix {0:?} could share keys with another client's prefix: end it with a character that is not a letter or digit (such as ':') and do not use `lock:` as a segment of it (e.g. \"myapp:\", not \"myapp\" or \"myapp:lock:\")"
    )]
    OverlappingKeyPrefix(String),
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
    RenewalFailed(Box<Error>),
    /// The configured maximum hold time was reached; renewal stopped.
    MaxHold,
    /// The lock was released (or its guard dropped).
    Released,
    /// Renewal was stopped by [`LockGuard::stop_renewal`](crate::LockGuard::stop_renewal): the
    /// keys stay on the nodes until their TTL, held by the returned [`Lock`](crate::Lock).
    RenewalStopped,
}

impl LostReason {
    /// The reason as a `snake_case` label: `expired`, `renewal_failed`, `max_hold`, `released`,
    /// `renewal_stopped` (the `reason` label of the lease metrics).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::RenewalFailed(_) => "renewal_failed",
            Self::MaxHold => "max_hold",
            Self::Released => "released",
            Self::RenewalStopped => "renewal_stopped",
        }
    }

    /// Whether the lease ended without its holder asking: it expired, an extension failed, or
    /// the maximum hold time was reached (not `Released`, not `RenewalStopped`).
    pub fn is_loss(&self) -> bool {
        matches!(self, Self::Expired | Self::RenewalFailed(_) | Self::MaxHold)
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Expired => f.write_str("validity deadline passed without a successful extension"),
            Self::RenewalFailed(e) => write!(f, "extension failed: {e}"),
            Self::MaxHold => f.write_str("maximum hold time reached"),
            Self::Released => f.write_str("released"),
            Self::RenewalStopped => f.write_str("renewal stopped; the keys stay until their TTL"),
        }
    }
}

/// A subscription command failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SubError {
    /// The connection broke, timed out, or answered what it should not: re-open it.
    Broken,
    /// The node refused the command for lack of permission (an ACL channel rule); the
    /// connection is fine.
    Refused,
}
