//! Where the nodes and settings come from: `--nodes`, else `$REDLOCK_NODES`, else the config
//! file; other settings from their flag, else the config file, else the library's default.
//! Passwords come from the URL, else from `$REDLOCK_PASSWORD`. None of this is ever shown.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redlock::{ConfigError, Error, Redlock, RedlockBuilder};
use serde::Deserialize;
use url::Url;

use crate::args::{Global, duration};
use crate::exit::{self, Failure};

/// Environment variable with the node URLs, comma-separated.
pub(crate) const NODES_ENV: &str = "REDLOCK_NODES";
/// Environment variable with the password for URLs that carry none.
pub(crate) const PASSWORD_ENV: &str = "REDLOCK_PASSWORD";
/// Environment variable naming the config file.
pub(crate) const CONFIG_ENV: &str = "REDLOCK_CONFIG";

/// Where a setting came from, which decides the exit code of an error in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The command line or the environment: an error is a usage error (64).
    CommandLine,
    /// The config file: an error is a configuration error (78).
    File,
}

impl Source {
    fn failure(self, message: String) -> Failure {
        match self {
            Self::CommandLine => Failure::usage(message),
            Self::File => Failure::config(message),
        }
    }
}

/// The config file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    nodes: Option<Vec<String>>,
    key_prefix: Option<String>,
    node_timeout: Option<String>,
    connect_timeout: Option<String>,
    restart_quarantine: Option<String>,
    tls_ca: Option<PathBuf>,
}

/// Everything a command needs to reach the nodes.
pub(crate) struct Settings {
    /// Node URLs with the password filled in from the environment: secret, never shown.
    urls: Vec<String>,
    pub(crate) nodes_source: Source,
    pub(crate) key_prefix: Option<(String, Source)>,
    pub(crate) node_timeout: Option<(Duration, Source)>,
    pub(crate) connect_timeout: Option<(Duration, Source)>,
    pub(crate) restart_quarantine: Option<(Duration, Source)>,
    pub(crate) tls_ca: Option<Vec<u8>>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("nodes", &self.urls.len())
            .field("nodes_source", &self.nodes_source)
            .field("key_prefix", &self.key_prefix)
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("restart_quarantine", &self.restart_quarantine)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// Resolves the settings from the flags, the environment and the config file.
    pub(crate) fn resolve(global: &Global) -> Result<Self, Failure> {
        let file = load_file(global.config.as_deref())?;
        let (raw, nodes_source) = if let Some(nodes) = &global.nodes {
            (nodes.clone(), Source::CommandLine)
        } else if let Some(env) = std::env::var_os(NODES_ENV).filter(|v| !v.is_empty()) {
            let env = env
                .into_string()
                .map_err(|_| Failure::usage(format!("${NODES_ENV} is not valid UTF-8")))?;
            (
                env.split(',').map(str::to_owned).collect(),
                Source::CommandLine,
            )
        } else if let Some((path, file)) = &file
            && let Some(nodes) = &file.nodes
        {
            warn_if_readable(path, nodes);
            (nodes.clone(), Source::File)
        } else {
            return Err(Failure::usage(format!(
                "no nodes: give --nodes URL,URL,…, set ${NODES_ENV}, or list them in a config file (see --config)"
            )));
        };
        let raw: Vec<String> = raw
            .into_iter()
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if raw.is_empty() {
            return Err(nodes_source.failure("the node list is empty".into()));
        }
        let password = std::env::var(PASSWORD_ENV).ok().filter(|p| !p.is_empty());
        let urls = raw
            .iter()
            .map(|u| with_password(u, password.as_deref()))
            .collect();
        let file_cfg = file.as_ref().map(|(_, f)| f);
        // A duration given by its flag, else by the config file's `name`, else none.
        type Given = Option<(Duration, Source)>;
        let flag_or_file = |flag: Option<Duration>,
                            field: fn(&FileConfig) -> &Option<String>,
                            name: &str|
         -> Result<Given, Failure> {
            if let Some(t) = flag {
                return Ok(Some((t, Source::CommandLine)));
            }
            file_cfg
                .and_then(|f| field(f).as_deref())
                .map(|v| match duration(v) {
                    Ok(t) => Ok((t, Source::File)),
                    Err(e) => Err(Failure::config(format!("config file: {name}: {e}"))),
                })
                .transpose()
        };
        let key_prefix = match (
            &global.key_prefix,
            file_cfg.and_then(|f| f.key_prefix.clone()),
        ) {
            (Some(p), _) => Some((p.clone(), Source::CommandLine)),
            (None, Some(p)) => Some((p, Source::File)),
            (None, None) => None,
        };
        let node_timeout = flag_or_file(global.node_timeout, |f| &f.node_timeout, "node_timeout")?;
        let connect_timeout = flag_or_file(
            global.connect_timeout,
            |f| &f.connect_timeout,
            "connect_timeout",
        )?;
        let restart_quarantine = flag_or_file(
            global.restart_quarantine,
            |f| &f.restart_quarantine,
            "restart_quarantine",
        )?;
        let tls_ca = match (&global.tls_ca, file_cfg.and_then(|f| f.tls_ca.clone())) {
            (Some(p), _) => Some(read_ca(p, Source::CommandLine)?),
            (None, Some(p)) => Some(read_ca(&p, Source::File)?),
            (None, None) => None,
        };
        Ok(Self {
            urls,
            nodes_source,
            key_prefix,
            node_timeout,
            connect_timeout,
            restart_quarantine,
            tls_ca,
        })
    }

    /// The node URLs, passwords included. Never print them.
    pub(crate) fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The key prefix in force.
    pub(crate) fn prefix(&self) -> &str {
        self.key_prefix
            .as_ref()
            .map_or(redlock::DEFAULT_KEY_PREFIX, |(p, _)| p)
    }

    /// The per-node timeout in force.
    pub(crate) fn timeout(&self) -> Duration {
        self.node_timeout
            .map_or(redlock::DEFAULT_NODE_TIMEOUT, |(t, _)| t)
    }

    /// The connection-opening bound in force.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
            .map_or(redlock::DEFAULT_CONNECT_TIMEOUT, |(t, _)| t)
    }

    /// A client builder with the nodes and every setting applied.
    pub(crate) fn builder(&self) -> RedlockBuilder {
        let mut b = Redlock::builder().nodes(self.urls.iter().cloned());
        if let Some((p, _)) = &self.key_prefix {
            b = b.key_prefix(p.clone());
        }
        if let Some((t, _)) = self.node_timeout {
            b = b.node_timeout(t);
        }
        if let Some((t, _)) = self.connect_timeout {
            b = b.connect_timeout(t);
        }
        if let Some((q, _)) = self.restart_quarantine {
            b = b.restart_quarantine(q);
        }
        if let Some(ca) = &self.tls_ca {
            b = b.tls_root_ca(ca.clone());
        }
        b
    }

    /// [`Settings::builder`] for a command that takes no lock (`status`, `doctor`): its TTL is
    /// never used, so it is set long enough for any node timeout `run` accepts (the library
    /// requires the node timeout to be shorter than the TTL; its default TTL is 10 s, `run`'s
    /// 30 s).
    pub(crate) fn lockless_builder(&self) -> RedlockBuilder {
        self.builder().ttl(std::time::Duration::from_secs(3600))
    }

    /// Builds the client (no connection yet); the library validates every URL and setting and
    /// its errors never show a password.
    pub(crate) fn build(&self, builder: RedlockBuilder) -> Result<Redlock, Failure> {
        builder.build().map_err(|e| self.config_failure(&e))
    }

    /// The failure for a library error found in the settings, with the exit code of where the
    /// faulty setting came from.
    pub(crate) fn config_failure(&self, e: &Error) -> Failure {
        let source = match e {
            Error::Config(c) => match c {
                ConfigError::NoNodes
                | ConfigError::InvalidNodeUrl { .. }
                | ConfigError::DuplicateNode { .. }
                | ConfigError::InvalidNodeName { .. }
                | ConfigError::DuplicateName { .. }
                | ConfigError::Tls(_) => self.nodes_source,
                ConfigError::SameServer { .. } => Source::File,
                ConfigError::InvalidKeyPrefix(_) | ConfigError::OverlappingKeyPrefix(_) => self
                    .key_prefix
                    .as_ref()
                    .map_or(Source::CommandLine, |(_, s)| *s),
                ConfigError::InvalidNodeTimeout { .. } => {
                    self.node_timeout.map_or(Source::CommandLine, |(_, s)| s)
                }
                ConfigError::InvalidConnectTimeout(_) => {
                    self.connect_timeout.map_or(Source::CommandLine, |(_, s)| s)
                }
                ConfigError::InvalidLease(_) => self
                    .restart_quarantine
                    .map_or(Source::CommandLine, |(_, s)| s),
                _ => Source::CommandLine,
            },
            _ => Source::CommandLine,
        };
        source.failure(e.to_string())
    }
}

/// The config file to read, if any, and its contents.
fn load_file(flag: Option<&Path>) -> Result<Option<(PathBuf, FileConfig)>, Failure> {
    let explicit = flag.map(Path::to_path_buf).or_else(|| {
        std::env::var_os(CONFIG_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let path = match explicit {
        Some(p) => p,
        None => match default_paths().into_iter().find(|p| p.is_file()) {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Failure::config(format!("config file {}: {e}", path.display())))?;
    let parsed: FileConfig = toml::from_str(&text).map_err(|e| {
        // toml's messages quote the offending line, which may hold a password: keep only the
        // first line (the description and position), and not even a value quoted there (a
        // value of the wrong type is: `invalid type: string "redis://:pw@…", expected …`).
        let msg = unquoted(e.message().lines().next().unwrap_or("invalid TOML"));
        let at = e
            .span()
            .map(|s| format!(" (line {})", text[..s.start].lines().count().max(1)))
            .unwrap_or_default();
        Failure::config(format!("config file {}: {msg}{at}", path.display()))
    })?;
    Ok(Some((path, parsed)))
}

/// `$XDG_CONFIG_HOME/redlock/config.toml` (or `~/.config/…`), then `/etc/redlock/config.toml`.
fn default_paths() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    if let Some(dir) = xdg {
        paths.push(dir.join("redlock").join("config.toml"));
    }
    paths.push(PathBuf::from("/etc/redlock/config.toml"));
    paths
}

/// Warns when a config file holding passwords can be read by others.
fn warn_if_readable(path: &Path, nodes: &[String]) {
    use std::os::unix::fs::PermissionsExt;
    let has_password = nodes.iter().any(|u| {
        Url::parse(u.trim())
            .is_ok_and(|u| u.password().is_some() || u.query_pairs().any(|(k, _)| k == "pass"))
    });
    if let Ok(meta) = std::fs::metadata(path)
        && has_password
        && meta.permissions().mode() & 0o077 != 0
    {
        errln!(
            "redlock: warning: {} holds passwords and can be read by other users (chmod 600 it)",
            path.display()
        );
    }
}

fn read_ca(path: &Path, source: Source) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| source.failure(format!("TLS CA file {}: {e}", path.display())))
}

/// `text` with everything from its first double quote to its last replaced by `***`. A value
/// is quoted as it is, quotes inside it included (`string "…"…"`): masking between each pair
/// of quotes showed the part of a password after a `"` (found in review). Field names are
/// quoted with backticks and stay. A quote left open hides the rest.
fn unquoted(text: &str) -> String {
    match (text.find('"'), text.rfind('"')) {
        (Some(first), Some(last)) if first < last => {
            format!("{}\"***\"{}", &text[..first], &text[last + 1..])
        }
        (Some(first), _) => format!("{}\"***", &text[..first]),
        _ => text.to_owned(),
    }
}

/// `url` with `password` set when it has none. A URL that does not parse is left as it is, for
/// the library to reject with a message that does not show it.
fn with_password(raw: &str, password: Option<&str>) -> String {
    let Some(password) = password else {
        return raw.to_owned();
    };
    let Ok(mut url) = Url::parse(raw) else {
        return raw.to_owned();
    };
    match url.scheme().to_owned().as_str() {
        "redis" | "rediss"
            // Taken literally: `set_password` escapes what a password may not hold raw, but not
            // `%`, which would then be read as the start of an escape.
            if url.password().is_none()
                && url
                    .set_password(Some(&password.replace('%', "%25")))
                    .is_ok() =>
        {
            return url.into();
        }
        "redis+unix" | "unix" if !url.query_pairs().any(|(k, _)| k == "pass") => {
            url.query_pairs_mut().append_pair("pass", password);
            return url.into();
        }
        _ => {}
    }
    raw.to_owned()
}

/// A node's display name as the library forms it: `host:port` (port 6379 by default) or the
/// socket path. Never contains a password.
pub(crate) fn node_name(raw: &str) -> String {
    match Url::parse(raw.trim()) {
        Ok(url) if matches!(url.scheme(), "redis" | "rediss") => format!(
            "{}:{}",
            url.host_str().unwrap_or("?").to_ascii_lowercase(),
            url.port().unwrap_or(6379)
        ),
        Ok(url) => url.path().to_owned(),
        Err(_) => "?".to_owned(),
    }
}

/// Every form in which the passwords of `urls` could appear in a message.
pub(crate) fn secrets(urls: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for raw in urls {
        if let Ok(url) = Url::parse(raw.trim()) {
            if let Some(p) = url.password() {
                out.push(p.to_owned());
                if let Ok(decoded) = percent_encoding::percent_decode_str(p).decode_utf8() {
                    out.push(decoded.into_owned());
                }
            }
            for (k, v) in url.query_pairs() {
                if k == "pass" || k == "password" {
                    out.push(v.into_owned());
                }
            }
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// `text` with every secret replaced by `***`.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for s in secrets {
        out = out.replace(s.as_str(), "***");
    }
    out
}

/// The exit code for a library error met while running a command.
pub(crate) fn code_of(e: &Error) -> u8 {
    match e {
        Error::Busy { .. } => exit::BUSY,
        Error::QuorumUnreachable { .. } | Error::ValidityExhausted { .. } => exit::UNAVAILABLE,
        Error::InvalidResource(_) => exit::USAGE,
        Error::Config(_) => exit::CONFIG,
        Error::Entropy(_) => exit::OS_ERROR,
        _ => exit::SOFTWARE,
    }
}
