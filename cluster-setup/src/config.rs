//! Plain configuration types of a test cluster.

use std::path::PathBuf;

/// How each node persists its data.
///
/// Default: [`Persistence::None`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Persistence {
    /// No RDB snapshots (`--save ""`) and no AOF: a `kill -9` loses every key.
    #[default]
    None,
    /// `--appendonly yes --appendfsync always`: every write is fsynced before it is
    /// acknowledged, so a `kill -9` loses nothing.
    AofAlways,
}

/// What happens to a node's data on [`RedisNode::restart`](crate::RedisNode::restart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataOnRestart {
    /// Keep the keys: a running node saves before it is killed.
    Keep,
    /// Delete the data files: the node comes back empty.
    Wipe,
}

/// PEM files for a TLS listener on every node (`tls-port`, `tls-cert-file`, `tls-key-file`,
/// `tls-ca-cert-file`; client certificates are not required).
///
/// Fields are public so the struct can be written as a literal; it is deliberately not
/// `#[non_exhaustive]` for that reason.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TlsFiles {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM).
    pub key: PathBuf,
    /// CA certificate(s) (PEM).
    pub ca: PathBuf,
}

impl TlsFiles {
    /// Bundles the three PEM paths.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>, ca: impl Into<PathBuf>) -> Self {
        TlsFiles {
            cert: cert.into(),
            key: key.into(),
            ca: ca.into(),
        }
    }
}

/// Everything a node needs to (re)spawn, shared by all nodes of a cluster.
#[derive(Debug)]
pub(crate) struct NodeConfig {
    pub(crate) binary: PathBuf,
    pub(crate) persistence: Persistence,
    pub(crate) tls: Option<TlsFiles>,
    /// Extra `--name value` arguments, in order.
    pub(crate) args: Vec<(String, String)>,
}

impl NodeConfig {
    /// The last `requirepass` among the extra arguments, as redis-server would apply it.
    pub(crate) fn password(&self) -> Option<&str> {
        self.args
            .iter()
            .rev()
            .find(|(name, _)| name == "requirepass")
            .map(|(_, value)| value.as_str())
            .filter(|value| !value.is_empty())
    }
}
