//! Server-native conditional commands, used instead of a script where the server has them: an
//! owner-checked delete as `DELIFEQ key token` (Valkey ≥ 9.0) or `DELEX key IFEQ token`
//! (Redis ≥ 8.4). Learned per node when its connection opens, from `HELLO`; a server that does
//! not answer it (or an older one) gets the scripts, which do the same. Only a lone single-key
//! request uses them: requests sent together go in one script call.
//!
//! An extension stays a script everywhere: `SET key token IFEQ token PX ttl` (Valkey ≥ 8.1,
//! Redis ≥ 8.4) sets the expiry whatever it was, and an owner-checked extension must never
//! shorten a key's expiry (another client may hold the same token on a longer TTL after a
//! hand-off; see `scripts::STRETCH`).

use redis::Value;

/// The owner-checked delete a server has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeleteIfEqual {
    /// `DELIFEQ key value` (Valkey ≥ 9.0).
    DelIfEq,
    /// `DELEX key IFEQ value` (Redis ≥ 8.4).
    DelEx,
}

/// What a node's server can do natively.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Native {
    pub(crate) delete_if_equal: Option<DeleteIfEqual>,
}

impl Native {
    /// From the server's name and version (`HELLO`'s `server` and `version`).
    pub(crate) fn of(server: &str, version: &str) -> Self {
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        match server {
            "valkey" => Native {
                delete_if_equal: (v >= (9, 0)).then_some(DeleteIfEqual::DelIfEq),
            },
            "redis" if v >= (8, 4) => Native {
                delete_if_equal: Some(DeleteIfEqual::DelEx),
            },
            _ => Native::default(),
        }
    }

    /// From a `HELLO` reply (a flat array of names and values in RESP2, a map in RESP3).
    pub(crate) fn from_hello(reply: &Value) -> Self {
        let pairs: Vec<(&Value, &Value)> = match reply {
            Value::Array(items) => items
                .chunks_exact(2)
                .map(|pair| (&pair[0], &pair[1]))
                .collect(),
            Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
            _ => Vec::new(),
        };
        let field = |name: &str| {
            pairs.iter().find_map(|(k, v)| match (text(k), text(v)) {
                (Some(k), Some(v)) if k == name => Some(v),
                _ => None,
            })
        };
        match (field("server"), field("version")) {
            (Some(server), Some(version)) => Native::of(&server, &version),
            _ => Native::default(),
        }
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_map_to_the_commands_they_have() {
        assert_eq!(Native::of("redis", "7.0.15"), Native::default());
        assert_eq!(Native::of("redis", "8.2.1"), Native::default());
        let redis84 = Native::of("redis", "8.4.0");
        assert_eq!(redis84.delete_if_equal, Some(DeleteIfEqual::DelEx));
        let valkey8 = Native::of("valkey", "8.0.2");
        assert_eq!(valkey8, Native::default());
        assert_eq!(Native::of("valkey", "8.1.0").delete_if_equal, None);
        let valkey9 = Native::of("valkey", "9.1.2");
        assert_eq!(valkey9.delete_if_equal, Some(DeleteIfEqual::DelIfEq));
        assert_eq!(Native::of("keydb", "9.9.9"), Native::default());
        assert_eq!(Native::of("valkey", "garbage"), Native::default());
    }

    #[test]
    fn hello_replies_in_both_protocols() {
        let s = |x: &str| Value::BulkString(x.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            s("server"),
            s("valkey"),
            s("version"),
            s("9.1.2"),
            s("proto"),
            Value::Int(2),
        ]);
        assert_eq!(Native::from_hello(&resp2), Native::of("valkey", "9.1.2"));
        let resp3 = Value::Map(vec![(s("server"), s("redis")), (s("version"), s("8.4.0"))]);
        assert_eq!(Native::from_hello(&resp3), Native::of("redis", "8.4.0"));
        assert_eq!(Native::from_hello(&Value::Nil), Native::default());
    }
}
