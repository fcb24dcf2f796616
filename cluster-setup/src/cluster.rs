//! A set of independent redis-server masters.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use crate::clock::preload_library;
use crate::config::{NodeConfig, Persistence, TlsFiles};
use crate::node::{RedisNode, find_server};
use crate::server::ServerVersion;

/// Default number of nodes of [`ClusterBuilder`].
pub const DEFAULT_NODES: usize = 5;

/// Per-node bound of [`Cluster::keys`]: an unreachable node is skipped after this long.
const KEYS_TIMEOUT: Duration = Duration::from_millis(300);

/// Builds a [`Cluster`]. Obtain one with [`Cluster::builder`].
#[must_use]
#[derive(Clone, Debug)]
pub struct ClusterBuilder {
    nodes: usize,
    proxied: bool,
    persistence: Persistence,
    args: Vec<(String, String)>,
    tls: Option<TlsFiles>,
    fake_clock: bool,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            nodes: DEFAULT_NODES,
            proxied: false,
            persistence: Persistence::default(),
            args: Vec::new(),
            tls: None,
            fake_clock: false,
        }
    }
}

impl ClusterBuilder {
    /// Number of independent masters. Default: [`DEFAULT_NODES`] (5).
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }

    /// Puts a [`FaultProxy`](crate::FaultProxy) in front of every node;
    /// [`RedisNode::client_url`] then points at the proxy. Default: `false`.
    pub fn proxied(mut self, yes: bool) -> Self {
        self.proxied = yes;
        self
    }

    /// How nodes persist data. Default: [`Persistence::None`].
    pub fn persistence(mut self, p: Persistence) -> Self {
        self.persistence = p;
        self
    }

    /// Extra `--name value` argument for every node, e.g. `.arg("requirepass", "x")`.
    /// A leading `--` on `name` is accepted and ignored.
    pub fn arg(mut self, name: &str, value: &str) -> Self {
        let name = name.trim_start_matches("--");
        self.args.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Every node also listens for TLS on its own port ([`RedisNode::tls_port`]).
    /// Default: no TLS.
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Gives every node its own realtime clock that tests can step forward or back with
    /// [`RedisNode::jump_clock`], as an NTP step would. Default: `false`.
    ///
    /// Each redis-server runs with a small preload library (`LD_PRELOAD`, built from
    /// `src/clock_shift.c` when the testkit is compiled) that adds the node's offset to
    /// `gettimeofday`, `time`, `timespec_get` and `clock_gettime` of the realtime clocks;
    /// monotonic clocks, sleeps and timeouts are left alone. Redis 7 keeps key expiry in
    /// realtime milliseconds, so a jump moves every TTL on that node (see
    /// [`RedisNode::jump_clock`]). The offset starts at zero and survives restarts.
    ///
    /// libfaketime cannot do this for Debian's redis-server: jemalloc reads the clock while
    /// initialising under its own lock, libfaketime initialises itself inside that call and
    /// allocates, and the server deadlocks before it listens.
    pub fn fake_clock(mut self, yes: bool) -> Self {
        self.fake_clock = yes;
        self
    }

    /// Starts every node in parallel and waits until each answers `PING`.
    ///
    /// # Errors
    ///
    /// Fails if `redis-server` cannot be found (the message says how to install it), if
    /// [`fake_clock`](Self::fake_clock) is on but its preload library was not built (a
    /// [`FakeClockUnavailable`](crate::FakeClockUnavailable) of kind `NotFound`), or if a
    /// node does not become ready within 10 s (the message quotes the end of its log).
    /// Nodes that did start are killed again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops (and so kills) every node started so far.
    pub async fn start(self) -> io::Result<Cluster> {
        let config = Arc::new(NodeConfig {
            binary: find_server()?,
            persistence: self.persistence,
            tls: self.tls,
            args: self.args,
            clock_lib: if self.fake_clock {
                Some(preload_library()?)
            } else {
                None
            },
        });
        let started =
            join_all((0..self.nodes).map(|_| RedisNode::launch(Arc::clone(&config), self.proxied)))
                .await;
        let nodes = started.into_iter().collect::<io::Result<Vec<_>>>()?;
        Ok(Cluster { nodes })
    }
}

/// Independent redis-server masters on loopback, for tests.
///
/// Dropping the cluster kills every process (`SIGKILL`, then reaped) and deletes the nodes'
/// temporary directories.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<RedisNode>,
}

impl Cluster {
    /// A builder with the defaults documented on [`ClusterBuilder`].
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// Starts `n` plain nodes: `Cluster::builder().nodes(n).start()`.
    ///
    /// # Errors
    ///
    /// As [`ClusterBuilder::start`].
    ///
    /// # Cancel safety
    ///
    /// As [`ClusterBuilder::start`].
    pub async fn start(n: usize) -> io::Result<Cluster> {
        Cluster::builder().nodes(n).start().await
    }

    /// Which server the nodes run and its version (`redis 7.0.15`, `valkey 9.1.2`), asked of
    /// the first node that answers (every node runs the same binary).
    ///
    /// # Errors
    ///
    /// The last node's error if none answers (see [`RedisNode::server_version`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn server_version(&self) -> io::Result<ServerVersion> {
        let mut last_err = io::Error::other("the cluster has no nodes");
        for node in &self.nodes {
            match node.server_version().await {
                Ok(version) => return Ok(version),
                Err(e) => last_err = e,
            }
        }
        Err(last_err)
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i`.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    pub fn node(&self, i: usize) -> &RedisNode {
        &self.nodes[i]
    }

    /// All nodes, in start order.
    pub fn nodes(&self) -> &[RedisNode] {
        &self.nodes
    }

    /// [`RedisNode::client_url`] of every node, in order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::client_url).collect()
    }

    /// [`RedisNode::tls_url`] of every node, in order; `None` for a cluster started without
    /// [`ClusterBuilder::tls`].
    pub fn tls_urls(&self) -> Option<Vec<String>> {
        self.nodes.iter().map(RedisNode::tls_url).collect()
    }

    /// `(node index, key)` for every key matching `pattern` on every node that answers
    /// directly (not through the proxy) within 300 ms; killed or paused nodes are skipped.
    /// Sorted by node index, then key.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn keys(&self, pattern: &str) -> Vec<(usize, String)> {
        let per_node = join_all(
            self.nodes
                .iter()
                .map(|node| node.keys(pattern, KEYS_TIMEOUT)),
        )
        .await;
        let mut keys: Vec<(usize, String)> = per_node
            .into_iter()
            .enumerate()
            .filter_map(|(i, keys)| keys.ok().map(|keys| (i, keys)))
            .flat_map(|(i, keys)| keys.into_iter().map(move |key| (i, key)))
            .collect();
        keys.sort();
        keys
    }
}
