//! Command-line arguments (clap derive). Durations are parsed with `humantime`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Parses `30s`, `500ms`, `2m`, `1h 30m` (humantime).
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (write a duration like 30s, 500ms, 2m)"))
}

/// [`duration`], more than zero: a setting the library rejects at zero is a usage error here,
/// not one blamed on wherever another setting it shares its kind of error with came from.
pub(crate) fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        d if d.is_zero() => Err("must be more than zero".into()),
        d => Ok(d),
    }
}

/// flock(1) for a Redis cluster: run a command under a Redlock quorum lock, inspect a lock,
/// check a cluster.
///
/// Nodes come from --nodes, else $REDLOCK_NODES, else the config file. A password is taken
/// from the URL, else from $REDLOCK_PASSWORD.
#[derive(Debug, Parser)]
#[command(name = "redlock", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// Comma-separated node URLs: redis://[user[:password]@]host[:port][/db], rediss://…,
    /// redis+unix:///path. Overrides $REDLOCK_NODES and the config file.
    #[arg(long, global = true, value_name = "URL,URL,…", value_delimiter = ',')]
    pub(crate) nodes: Option<Vec<String>>,
    /// Config file (TOML). Default: $REDLOCK_CONFIG, else $XDG_CONFIG_HOME/redlock/config.toml
    /// (~/.config/redlock/config.toml), else /etc/redlock/config.toml, where present.
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,
    /// Prefix of every key the lock writes. Default: the config file's, else "redlock:".
    #[arg(long, global = true, value_name = "PREFIX")]
    pub(crate) key_prefix: Option<String>,
    /// Per-node bound on one request. Default: the config file's, else 50ms.
    #[arg(long, global = true, value_name = "DURATION", value_parser = duration)]
    pub(crate) node_timeout: Option<Duration>,
    /// Bound on opening a connection to one node (TCP, TLS, AUTH). Default: the config file's,
    /// else 1s.
    #[arg(long, global = true, value_name = "DURATION", value_parser = duration)]
    pub(crate) connect_timeout: Option<Duration>,
    /// Keep a restarted (or new) node out of every quorum for this long after it starts; set
    /// it to at least the longest TTL any client uses. Default: the config file's, else off.
    #[arg(long, global = true, value_name = "DURATION", value_parser = duration)]
    pub(crate) restart_quarantine: Option<Duration>,
    /// PEM bundle of CA certificates for rediss:// nodes instead of the system store.
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) tls_ca: Option<PathBuf>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command while holding a lock: renewed while it runs, released when it exits.
    Run(RunArgs),
    /// Show who holds a lock, node by node.
    Status(StatusArgs),
    /// Check every node for what a Redlock deployment needs.
    Doctor(DoctorArgs),
    /// Start a local cluster and show the commands at work (needs the `demo` feature).
    Demo(DemoArgs),
}

/// `redlock run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The resource to lock (the key is the key prefix + "lock:" + RESOURCE).
    pub(crate) resource: String,
    /// Lock time-to-live on each node; the lock is renewed about every TTL/3 while the command
    /// runs.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = duration)]
    pub(crate) ttl: Duration,
    /// How long to wait for a busy lock; 0s = one attempt. Exit 75 when still busy.
    #[arg(long, default_value = "0s", value_name = "DURATION", value_parser = duration)]
    pub(crate) wait: Duration,
    /// Leave the lock to expire at its TTL when the command exits instead of releasing it
    /// (once-per-slot jobs: another host starting in the same slot does not run).
    #[arg(long)]
    pub(crate) keep: bool,
    /// After the lock is lost: time between SIGTERM and SIGKILL to the command.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = duration)]
    pub(crate) grace: Duration,
    /// Longest time the lock is renewed; past it the lock counts as lost.
    #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = positive_duration)]
    pub(crate) max_hold: Duration,
    /// The command and its arguments (after `--`), passed on as they are, UTF-8 or not.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

/// `redlock status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The resource to inspect.
    pub(crate) resource: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redlock doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// How long to watch each node's clock to measure its rate against the local clock.
    #[arg(long, default_value = "500ms", value_name = "DURATION", value_parser = duration)]
    pub(crate) clock_sample: Duration,
    /// The drift factor the clients use (a clock rate off by more is an error).
    #[arg(long, default_value_t = redlock::DEFAULT_DRIFT_FACTOR, value_name = "FRACTION")]
    pub(crate) drift_factor: f64,
}

/// `redlock demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {}
