//! The crate's one error type.

use crate::high_water::HighWater;
use crate::token::Token;

/// Everything that can go wrong: a rejected token (`Stale`, `Unrelated`), bad token input, or
/// a backend failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The resource has already admitted a newer grant: on a node that both share, the offered
    /// token's stamp is below the resource's high-water mark. The writer is a stale holder (paused,
    /// delayed, or whose lease expired) and must not write.
    #[error(
        "stale fence token {offered}: the resource already admitted a newer grant (high water {high_water})"
    )]
    Stale {
        /// The rejected token.
        offered: Token,
        /// The resource's high-water map at the time of the check.
        high_water: HighWater,
    },
    /// The token shares no node with the resource's non-empty history: it comes from another
    /// lock cluster (or node names changed, or the other token family was used on this
    /// resource), so nothing orders it against what was admitted.
    #[error(
        "unrelated fence token {offered}: it shares no node with the resource's high water {high_water} (another cluster, renamed nodes, or a scalar/claim mix-up)"
    )]
    Unrelated {
        /// The rejected token.
        offered: Token,
        /// The resource's high-water map at the time of the check.
        high_water: HighWater,
    },
    /// An empty string, or a token without claims.
    #[error("empty fence token")]
    EmptyToken,
    /// Text longer than any valid token: rejected before parsing.
    #[error("fence token text is {len} bytes, more than the maximum {max}")]
    TokenTooLong {
        /// Length of the input in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More claims than any lock can have.
    #[error("fence token has more than {max} claims")]
    TooManyClaims {
        /// The limit ([`MAX_CLAIMS`](crate::MAX_CLAIMS)).
        max: usize,
    },
    /// The text form does not parse; or a backend's admission function rejected its node and
    /// stamp lists as malformed (lists of different lengths, a NULL or negative stamp, …).
    #[error("malformed fence token at byte {position}: {reason}")]
    MalformedToken {
        /// Byte offset in the input text (0 for lists rejected by a backend).
        position: usize,
        /// What was wrong there.
        reason: &'static str,
    },
    /// A node name that is empty or too long.
    #[error("invalid node name in fence token: {reason}")]
    InvalidNodeName {
        /// What was wrong.
        reason: &'static str,
    },
    /// A stamp or scalar above [`MAX_STAMP`](crate::MAX_STAMP).
    #[error("fence stamp {stamp} is out of range (maximum 2^63 - 1)")]
    StampOutOfRange {
        /// The offending value (`u64::MAX` when it did not even fit a `u64`).
        stamp: u64,
    },
    /// The same node twice in one token.
    #[error("node {node:?} appears twice in the fence token")]
    DuplicateNode {
        /// The repeated node name.
        node: String,
    },
    /// A backend was configured with an unusable name (table, key prefix).
    #[error("invalid fence configuration: {reason}")]
    InvalidConfig {
        /// What was wrong.
        reason: String,
    },
    /// A resource name the backend cannot store: PostgreSQL text cannot hold a NUL byte, and
    /// its high-water table a name longer than
    /// [`MAX_PG_RESOURCE_LEN`](crate::MAX_PG_RESOURCE_LEN). Nothing was sent.
    #[error("invalid resource name: {reason}")]
    InvalidResource {
        /// What was wrong.
        reason: &'static str,
    },
    /// A write's expiry was out of range (see `RedisFence::set_if_admitted_with`); nothing
    /// was sent.
    #[error("invalid expiry for a fenced write: {reason}")]
    InvalidExpiry {
        /// What was wrong.
        reason: &'static str,
    },
    /// `MemoryFence::admit` or `admit_with` was called from inside a write that `admit_with`
    /// runs on the same fence. That admission would have to wait for the write it is part of;
    /// nothing was admitted or changed.
    #[error(
        "fence admission called from inside a fenced write on the same MemoryFence (it would wait for itself)"
    )]
    ReentrantAdmission,
    /// A backend answered something this crate did not expect (schema drift, a foreign value
    /// under a fence key).
    #[error("unexpected reply from the fence backend: {reason}")]
    UnexpectedReply {
        /// What was unexpected.
        reason: String,
    },
    /// The backend (Redis or PostgreSQL) failed: a connection error, a server error, an
    /// aborted transaction. The outcome of the admission is unknown; with PostgreSQL the
    /// caller's transaction is usually aborted and must be rolled back.
    ///
    /// The backend's own error is the [`source`](std::error::Error::source) of this one (the
    /// client library's error type is not part of this crate's API, so a new major version of
    /// it is not a breaking change here).
    #[error(transparent)]
    Backend(BackendError),
}

impl FenceError {
    /// True for [`FenceError::Stale`]: a newer grant already wrote.
    pub fn is_stale(&self) -> bool {
        matches!(self, FenceError::Stale { .. })
    }

    /// True for [`FenceError::Unrelated`].
    pub fn is_unrelated(&self) -> bool {
        matches!(self, FenceError::Unrelated { .. })
    }

    /// True when the token was refused by the admission rule (`Stale` or `Unrelated`), as
    /// opposed to bad input or a backend failure.
    pub fn is_rejection(&self) -> bool {
        self.is_stale() || self.is_unrelated()
    }

    /// The typed error for a backend's malformed-input message, for callers that run the
    /// admission themselves through another client (sqlx, diesel, a Redis client of their
    /// own): the message of the PostgreSQL admission function's SQLSTATE `FN003` error, or the
    /// text after the `FENCEMALFORMED` code of the Redis script's error reply. Gives the variant
    /// [`FenceToken::new`](crate::FenceToken::new) gives for the same defect
    /// ([`is_malformed`](Self::is_malformed) is true, whatever the wording).
    pub fn from_malformed_message(message: &str) -> FenceError {
        malformed_from_backend(message)
    }

    /// True for [`FenceError::Backend`]: the backend failed and the outcome is unknown.
    pub fn is_backend(&self) -> bool {
        matches!(self, FenceError::Backend(_))
    }

    /// True for bad token input, whether found by this crate (parsing, [`FenceToken::new`])
    /// or by a backend's admission function given malformed node and stamp lists:
    /// `EmptyToken`, `TokenTooLong`, `TooManyClaims`, `MalformedToken`, `InvalidNodeName`,
    /// `StampOutOfRange`, `DuplicateNode`. Nothing was admitted or changed.
    ///
    /// [`FenceToken::new`]: crate::FenceToken::new
    pub fn is_malformed(&self) -> bool {
        matches!(
            self,
            FenceError::EmptyToken
                | FenceError::TokenTooLong { .. }
                | FenceError::TooManyClaims { .. }
                | FenceError::MalformedToken { .. }
                | FenceError::InvalidNodeName { .. }
                | FenceError::StampOutOfRange { .. }
                | FenceError::DuplicateNode { .. }
        )
    }
}

/// Which backend failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// Redis (or Valkey), used by `RedisFence`.
    Redis,
    /// PostgreSQL, used by `PgFence` and `PgSequence`.
    Postgres,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Redis => "redis",
            Backend::Postgres => "postgres",
        })
    }
}

/// A backend's failure: which backend, and its client library's error as the
/// [`source`](std::error::Error::source) (downcast it to `redis::RedisError` or
/// `tokio_postgres::Error` for the details).
#[derive(Debug)]
pub struct BackendError {
    backend: Backend,
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl BackendError {
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn new(
        backend: Backend,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            backend,
            source: Box::new(source),
        }
    }

    /// The backend that failed.
    pub fn backend(&self) -> Backend {
        self.backend
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.backend, self.source)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// Prefix of the malformed-input messages of the Redis admission script and the PostgreSQL
/// admission function.
const MALFORMED_PREFIX: &str = "malformed fence token: ";

/// Reason of the backends' error for lists of different lengths (or missing, or nested).
const LISTS_REASON: &str = "node and stamp lists are missing, not flat, or of different lengths";

/// Reason of the backends' error for a stamp that is NULL, negative, not a canonical decimal
/// or above `MAX_STAMP`.
const STAMP_REASON: &str = "stamp is not an integer from 0 to 2^63 - 1";

/// Maps the message of a backend's malformed-input error,
/// `malformed fence token: [claim <i>: ]<reason>`, to the variant that
/// [`FenceToken::new`](crate::FenceToken::new) gives for the same defect. The Redis script and
/// the PostgreSQL function check the same things in the same order and word them alike.
pub(crate) fn malformed_from_backend(message: &str) -> FenceError {
    let reason = message.strip_prefix(MALFORMED_PREFIX).unwrap_or(message);
    let reason = match reason
        .strip_prefix("claim ")
        .and_then(|r| r.split_once(": "))
    {
        Some((i, rest)) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => rest,
        _ => reason,
    };
    match reason {
        "no claims" => FenceError::EmptyToken,
        "more than 32 claims" => FenceError::TooManyClaims {
            max: crate::MAX_CLAIMS,
        },
        "NULL node name" => FenceError::InvalidNodeName {
            reason: "NULL node name",
        },
        "empty node name in a token of several claims" => FenceError::InvalidNodeName {
            reason: "empty node name",
        },
        "node name longer than 128 bytes" => FenceError::InvalidNodeName {
            reason: "node name longer than MAX_NODE_NAME_LEN bytes",
        },
        "node name contains a NUL byte" => FenceError::InvalidNodeName {
            reason: "node name contains a NUL byte",
        },
        "node name is not UTF-8" => FenceError::MalformedToken {
            position: 0,
            reason: "node name is not UTF-8",
        },
        STAMP_REASON => FenceError::MalformedToken {
            position: 0,
            reason: STAMP_REASON,
        },
        LISTS_REASON => FenceError::MalformedToken {
            position: 0,
            reason: LISTS_REASON,
        },
        other => match other.strip_prefix("node appears twice: ") {
            Some(node) => FenceError::DuplicateNode {
                node: node.to_owned(),
            },
            None => FenceError::MalformedToken {
                position: 0,
                reason: "rejected as malformed by the fence backend",
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_messages_map_to_the_variants_of_the_same_defect() {
        let m = |s: &str| malformed_from_backend(&format!("{MALFORMED_PREFIX}{s}"));
        assert!(matches!(m("no claims"), FenceError::EmptyToken));
        assert!(matches!(
            m("more than 32 claims"),
            FenceError::TooManyClaims { max: 32 }
        ));
        assert!(matches!(
            m("claim 2: NULL node name"),
            FenceError::InvalidNodeName {
                reason: "NULL node name"
            }
        ));
        assert!(matches!(
            m("claim 12: empty node name in a token of several claims"),
            FenceError::InvalidNodeName {
                reason: "empty node name"
            }
        ));
        assert!(matches!(
            m("claim 1: node name longer than 128 bytes"),
            FenceError::InvalidNodeName { .. }
        ));
        assert!(matches!(
            m("claim 3: stamp is not an integer from 0 to 2^63 - 1"),
            FenceError::MalformedToken {
                reason: STAMP_REASON,
                ..
            }
        ));
        assert!(matches!(
            m(LISTS_REASON),
            FenceError::MalformedToken {
                reason: LISTS_REASON,
                ..
            }
        ));
        // The name is everything after the marker, even when it contains the separator.
        assert!(matches!(
            m("claim 2: node appears twice: a: b"),
            FenceError::DuplicateNode { ref node } if node == "a: b"
        ));
        // An unknown wording is still malformed input, never a panic or a success.
        let e = m("claim x: something new");
        assert!(e.is_malformed(), "{e:?}");
        assert!(malformed_from_backend("").is_malformed());
    }
}
