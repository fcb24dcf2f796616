#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod det;

mod backend;
mod background;
mod builder;
mod claim;
mod client;
mod config;
mod core;
mod engine;
mod error;
mod lease;
mod lock;
mod node;
mod nodes;
mod pubsub;
mod reclaim;
mod renewal;
mod request;
mod scripts;
#[cfg(feature = "simulation")]
pub mod sim;
mod telemetry;
mod timer;
mod token;
mod url;
mod waiters;

pub use builder::{MAX_NODE_NAME_LEN, RedlockBuilder};
pub use claim::Claim;
pub use client::Redlock;
pub use config::{
    Config, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR, DEFAULT_KEY_PREFIX, DEFAULT_MAX_HOLD,
    DEFAULT_MAX_RESOURCE_LEN, DEFAULT_MIN_VALIDITY, DEFAULT_NODE_TIMEOUT, DEFAULT_RETRY_ATTEMPTS,
    DEFAULT_RETRY_DELAY, DEFAULT_RETRY_JITTER, DEFAULT_TTL, MAX_RESOURCES_PER_LOCK, RetryPolicy,
};
pub use error::{
    ConfigError, EntropyError, Error, GaveUp, LostReason, NodeError, NodeErrorKind, NodeOutcome,
    NodeReport, Phase, ResourceError, Retries,
};
/// The fencing token of a lock ([`Lock::fence`], [`Lease::fence`]), from the `fencing` crate.
pub use fencing::FenceToken;
pub use lease::{Lease, LockGuard};
pub use lock::{Lock, ReleaseReport};
pub use request::LockRequest;
pub use token::{TOKEN_BYTES, Token};
