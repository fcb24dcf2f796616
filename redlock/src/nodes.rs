//! The nodes a client talks to: real Redis masters or simulated ones, behind the [`Backend`]
//! seam.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::backend::{Backend, Batch, Op, Renewed, Reply};
use crate::error::{ConfigError, NodeError};

/// The nodes a [`Redlock`](crate::Redlock) talks to: real Redis masters, or (for testing the
/// client under faults) simulated ones. Dispatch is one match per request.
pub(crate) enum Nodes {
    Redis(crate::node::RedisBackend),
    #[cfg(feature = "simulation")]
    Sim(crate::sim::SimBackend),
}

impl Nodes {
    /// Opens node `i`'s connection now, waiting for the outcome.
    pub(crate) fn connect(&self, i: usize) -> BoxFuture<'static, Result<(), NodeError>> {
        match self {
            Self::Redis(b) => {
                let node = Arc::clone(&b.nodes[i]);
                Box::pin(async move { node.connect().await })
            }
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.connect(i),
        }
    }
}

impl Backend for Nodes {
    #[inline]
    fn background(&self) -> Option<&crate::background::Background> {
        match self {
            Self::Redis(b) => b.background(),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.background(),
        }
    }

    #[inline]
    fn len(&self) -> usize {
        match self {
            Self::Redis(b) => b.len(),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.len(),
        }
    }

    #[inline]
    fn name(&self, i: usize) -> &Arc<str> {
        match self {
            Self::Redis(b) => b.name(i),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.name(i),
        }
    }

    #[inline]
    fn budget(&self, i: usize) -> Duration {
        match self {
            Self::Redis(b) => b.budget(i),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.budget(i),
        }
    }

    #[inline]
    fn rank_seed(&self, i: usize) -> Option<u64> {
        match self {
            Self::Redis(b) => b.rank_seed(i),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.rank_seed(i),
        }
    }

    #[inline]
    fn distance(&self, i: usize) -> Option<Duration> {
        match self {
            Self::Redis(b) => b.distance(i),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.distance(i),
        }
    }

    #[inline]
    fn call(&self, i: usize, op: Arc<Op>) -> BoxFuture<'static, Result<Reply, NodeError>> {
        match self {
            Self::Redis(b) => b.call(i, op),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.call(i, op),
        }
    }

    #[inline]
    fn extend_many(
        &self,
        i: usize,
        batch: Arc<Batch>,
    ) -> BoxFuture<'static, Result<Vec<Renewed>, NodeError>> {
        match self {
            Self::Redis(b) => b.extend_many(i, batch),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.extend_many(i, batch),
        }
    }

    #[inline]
    fn connection(&self, i: usize) -> Option<u64> {
        match self {
            Self::Redis(b) => b.connection(i),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.connection(i),
        }
    }

    #[inline]
    fn still_current(&self, i: usize, connection: u64) -> bool {
        match self {
            Self::Redis(b) => b.still_current(i, connection),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.still_current(i, connection),
        }
    }

    #[inline]
    fn renewal_cost(&self, i: usize) -> Option<Duration> {
        match self {
            Self::Redis(b) => b.renewal_cost(i),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.renewal_cost(i),
        }
    }

    #[inline]
    fn expiry(
        &self,
        i: usize,
        key: Arc<str>,
    ) -> BoxFuture<'static, Result<Option<Duration>, NodeError>> {
        match self {
            Self::Redis(b) => b.expiry(i, key),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.expiry(i, key),
        }
    }

    #[inline]
    fn holder(
        &self,
        i: usize,
        key: Arc<str>,
    ) -> BoxFuture<'static, Result<Option<u64>, NodeError>> {
        match self {
            Self::Redis(b) => b.holder(i, key),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.holder(i, key),
        }
    }

    #[inline]
    fn misconfigured(&self) -> Option<ConfigError> {
        match self {
            Self::Redis(b) => b.misconfigured(),
            #[cfg(feature = "simulation")]
            Self::Sim(b) => b.misconfigured(),
        }
    }
}
