//! Plain configuration types of a test cluster.

use std::path::PathBuf;

/// How each node persists its data.
///
/// Every mode passes `--save ""` (no automatic RDB snapshots) and `--dbfilename dump.rdb`: an
/// RDB file is only written by an explicit `SAVE` ([`DataOnRestart::Keep`],
/// [`RedisNode::snapshot`](crate::RedisNode::snapshot)). At start a node loads its AOF when AOF
/// is on, else `dump.rdb` if there is one.
///
/// Default: [`Persistence::None`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Persistence {
    /// No automatic RDB snapshots and no AOF (`--appendonly no`): a `kill -9` loses every
    /// key written since the last explicit `SAVE`.
    #[default]
    None,
    /// `--appendonly yes --appendfsync always`: every write is fsynced before it is
    /// acknowledged, so a `kill -9` loses nothing.
    AofAlways,
    /// `--appendonly yes --appendfsync everysec`: the AOF is fsynced about once a second, so
    /// a crash may lose roughly the last second of acknowledged writes (up to two seconds when
    /// a slow fsync delays the next write); older writes survive.
    ///
    /// With a `kill -9` only the writes still in redis-server's own buffer are lost: what it
    /// already handed to the kernel survives in the page cache. That is usually everything,
    /// so a key written just before the kill may or may not come back; tests must accept
    /// both. For a deterministic partial loss restore an older
    /// [`Snapshot`](crate::Snapshot).
    AofEverysec,
}

/// What happens to a node's data on [`RedisNode::restart`](crate::RedisNode::restart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataOnRestart {
    /// Keep every acknowledged key: a running node (resumed first if paused) persists
    /// everything before it stops — `SAVE` under [`Persistence::None`], a graceful
    /// `SHUTDOWN` (which flushes and fsyncs the AOF) under [`Persistence::AofEverysec`],
    /// nothing under [`Persistence::AofAlways`] whose AOF is always fsynced. A node that was
    /// already killed restarts with whatever its data files hold, as with `AsOnDisk`.
    Keep,
    /// Delete the data files: the node comes back empty.
    Wipe,
    /// `kill -9` (even a paused node, without resuming it, without `SAVE`) and restart with
    /// whatever the data files hold: under [`Persistence::None`] the last explicit `SAVE` (or
    /// nothing), under the AOF modes what the AOF holds. The "crashed and came back with what
    /// was on disk" case.
    AsOnDisk,
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
    /// The clock-shifting preload library, if the cluster has fake clocks.
    pub(crate) clock_lib: Option<PathBuf>,
}

impl NodeConfig {
    /// The binary's file name (`redis-server`, `valkey-server`), for messages.
    pub(crate) fn server_name(&self) -> &str {
        self.binary
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("server")
    }

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
