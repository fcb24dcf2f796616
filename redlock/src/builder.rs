//! `Redlock::builder()`: noun setters, validated once in `build()`.

use std::sync::Arc;
use std::time::Duration;

use crate::client::Redlock;
use crate::config::{Config, RetryPolicy, check_ttl};
use crate::core::Core;
use crate::error::{ConfigError, Error};
use crate::node::{Identities, NodeKeys, RedisBackend, RedisNode};
use crate::nodes::Nodes;
use crate::pubsub::SubClient;
use crate::url::{NodeSpec, redact_url};
use crate::waiters::Waiters;

/// Longest node name accepted: names travel in fence tokens, which cap them at this length.
pub const MAX_NODE_NAME_LEN: usize = 128;

// The builder is where a client is made: `Redlock::builder()` starts it here, so that the
// client does not depend on its builder.
impl Redlock {
    /// Starts a builder.
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::default()
    }
}

/// Builds a [`Redlock`]. Nothing connects until the first request.
#[must_use]
#[derive(Default)]
pub struct RedlockBuilder {
    nodes: Vec<(Option<String>, String)>,
    config: Config,
    tls_root_ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.nodes.iter().map(|(_, u)| redact_url(u)).collect();
        f.debug_struct("RedlockBuilder")
            .field("nodes", &urls)
            .field("config", &self.config)
            .field("tls_root_ca", &self.tls_root_ca.as_ref().map(|_| "<pem>"))
            .finish()
    }
}

impl RedlockBuilder {
    /// Adds independent Redis masters by URL: `redis://[user[:password]@]host[:port][/db]`,
    /// `rediss://…` (TLS) or `redis+unix:///path`. Each is named `host:port` (or the socket path).
    /// A TCP URL's query may hold only `protocol`, and it takes no `#` fragment: `build()`
    /// refuses `?db=`, `?password=` and `#insecure`, which redis-rs would ignore or read as
    /// "skip the certificate checks".
    pub fn nodes<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.nodes
            .extend(urls.into_iter().map(|u| (None, u.into())));
        self
    }

    /// Adds one node with an explicit display name (used in reports, metrics and fence tokens).
    pub fn named_node(mut self, name: impl Into<String>, url: impl Into<String>) -> Self {
        self.nodes.push((Some(name.into()), url.into()));
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Lock time-to-live. Default: [`DEFAULT_TTL`](crate::DEFAULT_TTL).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = ttl;
        self
    }

    /// Clock drift factor. Default: [`DEFAULT_DRIFT_FACTOR`](crate::DEFAULT_DRIFT_FACTOR).
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.config.drift_factor = factor;
        self
    }

    /// Per-node request timeout. Default: [`DEFAULT_NODE_TIMEOUT`](crate::DEFAULT_NODE_TIMEOUT).
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// Connection-opening timeout. Default: [`DEFAULT_CONNECT_TIMEOUT`](crate::DEFAULT_CONNECT_TIMEOUT).
    ///
    /// Also how long a request may wait for an answer before a `PING` checks its connection,
    /// and how long that check's steps may take before a silent connection to a server that
    /// answers on a new one is replaced (docs/protocol.md, "Connections").
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Minimum validity for a successful acquisition. Default: zero.
    pub fn min_validity(mut self, min: Duration) -> Self {
        self.config.min_validity = min;
        self
    }

    /// Retry policy of `acquire`. Default: [`RetryPolicy::default`].
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.config.retry = retry;
        self
    }

    /// Prefix of every key. Default: [`DEFAULT_KEY_PREFIX`](crate::DEFAULT_KEY_PREFIX).
    ///
    /// At most 64 printable ASCII characters without spaces, empty or ending with a character
    /// that is not a letter or digit (`"myapp:"`), and without `lock:` as a segment of its own
    /// (`"myapp:lock:"`): otherwise another client's prefix could make one of its keys ours —
    /// with `app:` and `app:lock:` on the same servers, one client's stamp key would be the
    /// other's lock key of the resource `stamp`. `build` refuses others with
    /// [`ConfigError::OverlappingKeyPrefix`](crate::ConfigError::OverlappingKeyPrefix).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.key_prefix = prefix.into();
        self
    }

    /// Longest accepted resource name in bytes. Default: [`DEFAULT_MAX_RESOURCE_LEN`](crate::DEFAULT_MAX_RESOURCE_LEN).
    pub fn max_resource_len(mut self, max: usize) -> Self {
        self.config.max_resource_len = max;
        self
    }

    /// How often guards renew their locks. Default: TTL/3. At most half of the validity a
    /// renewal leaves (TTL − drift allowance): a longer interval is cut to that.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.config.renew_every = Some(every);
        self
    }

    /// Longest time a guard keeps renewing one lock. Default: [`DEFAULT_MAX_HOLD`](crate::DEFAULT_MAX_HOLD).
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.config.max_hold = max;
        self
    }

    /// Turns the max-hold limit off: guards renew until they are released, dropped, or the
    /// lock is lost (sets [`Config::max_hold`] to `Duration::MAX`). For long-running holders
    /// such as leader election or a job whose length is not known; a holder that hangs then
    /// keeps the lock for as long as its process lives, so watch `redlock_leases_held`.
    pub fn no_max_hold(mut self) -> Self {
        self.config.max_hold = Duration::MAX;
        self
    }

    /// Enables the restart quarantine (see [`Config::restart_quarantine`]).
    pub fn restart_quarantine(mut self, quarantine: Duration) -> Self {
        self.config.restart_quarantine = Some(quarantine);
        self
    }

    /// Whether grants issue claim stamps (needed for fencing). Default: `true`.
    pub fn claim_stamps(mut self, on: bool) -> Self {
        self.config.claim_stamps = on;
        self
    }

    /// Whether racing attempts go through one node first (see
    /// [`Config::race_via_first_node`]). Default: `true`.
    pub fn race_via_first_node(mut self, on: bool) -> Self {
        self.config.race_via_first_node = on;
        self
    }

    /// PEM bundle of CA certificates trusted for `rediss://` nodes instead of the system store.
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_ca = Some(pem.into());
        self
    }

    /// Validates everything and returns the client. Does not connect.
    ///
    /// # Errors
    /// [`Error::Config`] naming the first problem: no nodes, a malformed or duplicate URL
    /// (shown without its password), a zero TTL or one not above the drift allowance, a drift
    /// factor outside [0, 0.5), a node timeout of zero or not below the TTL, an unbounded
    /// retry policy, or a bad key prefix.
    pub fn build(self) -> Result<Redlock, Error> {
        let c = &self.config;
        if self.nodes.is_empty() {
            return Err(ConfigError::NoNodes.into());
        }
        validate(c)?;

        let mut specs: Vec<NodeSpec> = Vec::with_capacity(self.nodes.len());
        for (index, (name, url)) in self.nodes.iter().enumerate() {
            let spec = NodeSpec::parse(url, name.as_deref()).map_err(|reason| {
                ConfigError::InvalidNodeUrl {
                    index,
                    url: redact_url(url),
                    reason,
                }
            })?;
            if spec.name.is_empty()
                || spec.name.len() > MAX_NODE_NAME_LEN
                || spec.name.chars().any(char::is_control)
            {
                return Err(ConfigError::InvalidNodeName {
                    index,
                    name: spec.name.to_string(),
                }
                .into());
            }
            if let Some(first) = specs.iter().position(|s| s.identity == spec.identity) {
                return Err(ConfigError::DuplicateNode {
                    first,
                    second: index,
                    node: spec.name.to_string(),
                }
                .into());
            }
            if let Some(first) = specs.iter().position(|s| s.name == spec.name) {
                return Err(ConfigError::DuplicateName {
                    first,
                    second: index,
                    name: spec.name.to_string(),
                }
                .into());
            }
            specs.push(spec);
        }
        if specs.len().is_multiple_of(2) {
            tracing::warn!(
                nodes = specs.len(),
                "an even number of nodes tolerates no more failures than one node fewer"
            );
        }
        if let Some(quarantine) = c.restart_quarantine
            && quarantine < c.ttl
        {
            tracing::warn!(
                ?quarantine,
                ttl = ?c.ttl,
                "restart_quarantine is shorter than the ttl: a node that restarted without its \
                 data can vote again while a lock's key is still live on other nodes"
            );
        }
        let identities = Arc::new(Identities::new(
            specs.iter().map(|s| Arc::clone(&s.name)).collect(),
        ));
        let keys = node_keys(c);
        let mut nodes = Vec::with_capacity(specs.len());
        for (index, spec) in specs.iter().enumerate() {
            let node = RedisNode::new(
                index,
                spec,
                c.connect_timeout,
                self.tls_root_ca.as_deref(),
                keys.clone(),
                Arc::clone(&identities),
            )
            .map_err(|reason| match spec.tls {
                true => ConfigError::Tls(reason),
                false => ConfigError::InvalidNodeUrl {
                    index,
                    url: redact_url(&self.nodes[index].1),
                    reason,
                },
            })?;
            nodes.push(Arc::new(node));
        }
        let ids: Vec<&str> = specs.iter().map(|s| s.identity.as_str()).collect();
        let backend = RedisBackend {
            nodes,
            node_timeout: c.node_timeout,
            connect_timeout: c.connect_timeout,
            identities,
            background: crate::background::Background::default(),
        };
        let waiters = Waiters::new(
            backend
                .nodes
                .iter()
                .map(|n| SubClient::Redis(n.client().clone()))
                .collect(),
            c.node_timeout.max(Duration::from_millis(200)),
            c.connect_timeout,
        );
        Ok(Redlock::from_core(
            Core::new(self.config, Nodes::Redis(backend), Some(waiters)).with_node_ids(&ids),
        ))
    }

    /// Validates the configuration like [`RedlockBuilder::build`] and returns a client of the
    /// simulated nodes of `cluster` (named `sim0`, `sim1`, …); the node URLs given to this
    /// builder are not used. For testing the client under faults; not for production.
    ///
    /// # Errors
    /// [`Error::Config`] as for [`RedlockBuilder::build`]; [`ConfigError::NoNodes`] for a
    /// cluster without nodes.
    #[cfg(feature = "simulation")]
    pub fn build_simulated(self, cluster: &crate::sim::SimCluster) -> Result<Redlock, Error> {
        if cluster.is_empty() {
            return Err(ConfigError::NoNodes.into());
        }
        validate(&self.config)?;
        let c = &self.config;
        let backend = crate::sim::SimBackend::new(cluster, c, node_keys(c));
        let waiters = Waiters::new(
            backend
                .sub_clients()
                .into_iter()
                .map(SubClient::Sim)
                .collect(),
            c.node_timeout.max(Duration::from_millis(200)),
            c.connect_timeout,
        );
        Ok(Redlock::from_core(Core::new(
            self.config,
            Nodes::Sim(backend),
            Some(waiters),
        )))
    }
}

/// The configuration checks of `build()`, shared by every way of building a client.
fn validate(c: &Config) -> Result<(), Error> {
    if !(c.drift_factor.is_finite() && (0.0..0.5).contains(&c.drift_factor)) {
        return Err(ConfigError::InvalidDriftFactor(c.drift_factor).into());
    }
    check_ttl(c.ttl, c.drift_factor, Duration::ZERO, c.min_validity)?;
    if c.node_timeout.is_zero() || c.node_timeout >= c.ttl {
        return Err(ConfigError::InvalidNodeTimeout {
            timeout: c.node_timeout,
            ttl: c.ttl,
        }
        .into());
    }
    if c.connect_timeout.is_zero() {
        return Err(ConfigError::InvalidConnectTimeout(c.connect_timeout).into());
    }
    c.retry.validate().map_err(ConfigError::InvalidRetry)?;
    if let Some(every) = c.renew_every
        && (every.is_zero() || every >= c.ttl)
    {
        return Err(ConfigError::InvalidLease(format!(
            "renew_every {every:?} must be > 0 and shorter than the ttl {:?}",
            c.ttl
        ))
        .into());
    }
    if c.max_hold.is_zero() {
        return Err(ConfigError::InvalidLease("max_hold must be positive".into()).into());
    }
    if c.restart_quarantine
        .is_some_and(|q| q < Duration::from_millis(1))
    {
        return Err(ConfigError::InvalidLease(
            "restart_quarantine must be at least 1 ms (leave it unset to turn it off)".into(),
        )
        .into());
    }
    let prefix_ok = c.key_prefix.len() <= 64 && c.key_prefix.bytes().all(|b| b.is_ascii_graphic());
    if !prefix_ok {
        return Err(ConfigError::InvalidKeyPrefix(c.key_prefix.clone()).into());
    }
    if !prefix_is_separated(&c.key_prefix) {
        return Err(ConfigError::OverlappingKeyPrefix(c.key_prefix.clone()).into());
    }
    if c.max_resource_len == 0 {
        return Err(ConfigError::InvalidMaxResourceLen.into());
    }
    Ok(())
}

/// Whether no other prefix that passes this check can make its keys collide with this one's.
///
/// A client writes `<p>node`, `<p>stamp` and `<p>lock:<resource>`. Another client's key equals
/// one of these only if one prefix is the other followed by `lock:` (then its records are the
/// first client's lock keys, or both share lock keys under different resource names). That
/// cannot happen when every prefix is empty or ends with a byte that is not a letter or digit,
/// and has no `lock:` at its start or right after such a byte.
fn prefix_is_separated(p: &str) -> bool {
    let b = p.as_bytes();
    let ends = b.last().is_none_or(|c| !c.is_ascii_alphanumeric());
    let segment = |i: usize| i == 0 || !b[i - 1].is_ascii_alphanumeric();
    ends && !p.match_indices("lock:").any(|(i, _)| segment(i))
}

/// Where a client keeps its records on every node, and how it treats restarts.
pub(crate) fn node_keys(c: &Config) -> NodeKeys {
    NodeKeys {
        identity: format!("{}node", c.key_prefix).into(),
        stamp: format!("{}stamp", c.key_prefix).into(),
        quarantine: c.restart_quarantine,
    }
}
