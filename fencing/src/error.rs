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
    /// The text form does not parse.
    #[error("malformed fence token at byte {position}: {reason}")]
    MalformedToken {
        /// Byte offset in the input.
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
    /// A backend answered something this crate did not expect (schema drift, a foreign value
    /// under a fence key).
    #[error("unexpected reply from the fence backend: {reason}")]
    UnexpectedReply {
        /// What was unexpected.
        reason: String,
    },
    /// Redis failed (connection, script error). The outcome of the admission is unknown.
    #[cfg(feature = "redis")]
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// PostgreSQL failed. The caller's transaction is usually aborted and must be rolled back.
    #[cfg(feature = "postgres")]
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
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
}
