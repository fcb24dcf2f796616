//! Fencing tokens and resource-side admission checks.
//!
//! A lease cannot stop a paused holder; only the resource can, by rejecting writes that carry a
//! token older than one it has already admitted. This crate provides:
//!
//! * [`FenceToken`]: a Redlock grant's per-node claim stamps `{(node, stamp)}`, with a compact
//!   stable text form (`FromStr`/`Display`) and serde support. `redlock::Lock::fence()` returns
//!   one; no extra system is needed.
//! * [`ScalarToken`]: a `u64` from an authoritative monotonic source the user already trusts
//!   (for example a PostgreSQL sequence, `PgSequence` with the `postgres` feature).
//! * The admission rule, on a per-resource [`HighWater`] map, and three places to keep it:
//!   [`MemoryFence`], `RedisFence` (feature `redis`) and `PgFence` (feature `postgres`).
//!
//! The rule, for a claim token `T` and the resource's high-water map `H`: admit iff
//! `T[k] ≥ H[k]` for every node `k` in both, and — when `H` is not empty — `T` shares at least
//! one node with `H`; on admission raise `H[k]` to `max(H[k], T[k])` for every `k` in `T`. A
//! scalar token `s` is admitted iff `s ≥ last` (equal = the same grant retrying). Malformed
//! input (see [`FenceError::is_malformed`]) is never admitted and changes nothing, in every
//! backend. See `docs/fencing.md` for why this is safe and exactly what it assumes.
//!
//! Every backend counts the tokens it refuses in the `metrics` counter
//! `fencing_rejections_total` (labels `backend` = `memory` | `redis` | `postgres`, `kind` =
//! `stale` | `unrelated`).
//!
//! ```
//! use fencing::{Admission, FenceError, FenceToken, MemoryFence};
//!
//! let fence = MemoryFence::new();
//! let a: FenceToken = "f1,n1=100,n2=100".parse()?; // an older grant on n1, n2
//! let b: FenceToken = "f1,n2=200,n3=150".parse()?; // a newer grant on n2, n3
//! assert_eq!(fence.admit("orders:42", &b)?, Admission::Advanced);
//! assert_eq!(fence.admit("orders:42", &b)?, Admission::Repeated); // b retries: fine
//! assert!(matches!(fence.admit("orders:42", &a), Err(FenceError::Stale { .. })));
//! # Ok::<(), FenceError>(())
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod high_water;
mod memory;
#[cfg(feature = "postgres")]
mod pg;
mod pg_sql;
#[cfg(feature = "redis")]
mod redis_fence;
mod telemetry;
mod token;

pub use error::{Backend, BackendError, FenceError};
pub use high_water::{Admission, HighWater};
pub use memory::MemoryFence;
#[cfg(feature = "postgres")]
pub use pg::PgSequence;
pub use pg_sql::{DEFAULT_PG_TABLE, MAX_PG_RESOURCE_LEN, PgFence};
#[cfg(feature = "redis")]
pub use redis_fence::{DEFAULT_REDIS_PREFIX, Expiry, RedisFence};
pub use token::{
    FenceToken, MAX_CLAIMS, MAX_NODE_NAME_LEN, MAX_STAMP, MAX_TOKEN_TEXT_LEN, ScalarToken, Token,
    TokenRef,
};
