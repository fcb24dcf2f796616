#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod clock;
mod cluster;
mod config;
mod node;
mod pg;
mod pki;
mod proxy;
mod server;

pub use clock::FakeClockUnavailable;
pub use cluster::{Cluster, ClusterBuilder, DEFAULT_NODES};
pub use config::{DataOnRestart, Persistence, TlsFiles};
pub use node::{DebugSleep, LEGACY_SERVER_ENV, RedisNode, SERVER_ENV, Snapshot};
pub use pg::{PgServer, tokio_postgres};
pub use pki::TestPki;
pub use proxy::FaultProxy;
/// The workspace's `redis` crate, so tests use the same version as the testkit.
pub use redis;
pub use server::ServerVersion;
