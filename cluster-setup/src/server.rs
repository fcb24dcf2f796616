//! Which server the testkit runs: Redis or Valkey, and its version.

use std::fmt;

/// The flavour and version of a running server, from its `INFO server` reply: Valkey reports
/// `server_name:valkey` and `valkey_version:9.1.2` (and `redis_version:7.2.4` for the
/// compatibility of clients that only read that field); Redis reports only `redis_version`.
///
/// Its `Display` is `"redis 7.0.15"` or `"valkey 9.1.2"`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServerVersion {
    name: String,
    version: String,
}

impl ServerVersion {
    /// Parses an `INFO server` reply; `None` if it names no version at all.
    pub fn from_info(info: &str) -> Option<ServerVersion> {
        let field = |name: &str| {
            info.lines().find_map(|line| {
                line.strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .map(str::trim)
                    .filter(|value| !value.is_empty())
            })
        };
        let name = field("server_name").unwrap_or("redis").to_ascii_lowercase();
        let version = field(&format!("{name}_version")).or_else(|| field("redis_version"))?;
        Some(ServerVersion {
            version: version.to_owned(),
            name,
        })
    }

    /// `"redis"` or `"valkey"` (whatever `server_name` says, lower case).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's own version, e.g. `"7.0.15"` or `"9.1.2"` (for Valkey not the
    /// `redis_version` it reports for compatibility).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Whether the server is Valkey.
    pub fn is_valkey(&self) -> bool {
        self.name == "valkey"
    }

    /// `(major, minor, patch)` of [`version`](Self::version); missing or unparsable parts
    /// count as 0.
    pub fn numbers(&self) -> (u32, u32, u32) {
        let mut parts = self
            .version
            .split('.')
            .map(|part| part.parse::<u32>().unwrap_or(0));
        let mut next = || parts.next().unwrap_or(0);
        (next(), next(), next())
    }

    /// Whether this is `name` (`"redis"`, `"valkey"`) at `major.minor` or later.
    pub fn at_least(&self, name: &str, major: u32, minor: u32) -> bool {
        let (have_major, have_minor, _) = self.numbers();
        self.name.eq_ignore_ascii_case(name) && (have_major, have_minor) >= (major, minor)
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis() {
        let info =
            "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\nprocess_id:42\r\n";
        let v = ServerVersion::from_info(info).unwrap();
        assert_eq!(v.to_string(), "redis 7.0.15");
        assert!(!v.is_valkey());
        assert_eq!(v.numbers(), (7, 0, 15));
        assert!(v.at_least("redis", 7, 0));
        assert!(!v.at_least("redis", 7, 4));
        assert!(!v.at_least("valkey", 7, 0));
    }

    #[test]
    fn parses_valkey() {
        let info = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\nvalkey_release_stage:ga\r\n";
        let v = ServerVersion::from_info(info).unwrap();
        assert_eq!(v.to_string(), "valkey 9.1.2");
        assert!(v.is_valkey());
        assert!(v.at_least("valkey", 9, 0));
        assert!(!v.at_least("redis", 7, 0));
    }

    #[test]
    fn no_version_is_none() {
        assert_eq!(
            ServerVersion::from_info("# Server\r\nprocess_id:1\r\n"),
            None
        );
    }
}
