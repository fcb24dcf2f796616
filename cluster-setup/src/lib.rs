#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod clock;
mod cluster;
mod config;
mod node;
mod pg;
mod proxy;

pub use clock::FakeClockUnavailable;
pub use cluster::{Cluster, ClusterBuilder, DEFAULT_NODES};
pub use config::{DataOnRestart, Persistence, TlsFiles};
pub use node::{DebugSleep, RedisNode, Snapshot};
pub use pg::{PgServer, tokio_postgres};
pub use proxy::FaultProxy;
/// The workspace's `redis` crate, so tests use the same version as the testkit.
pub use redis;
