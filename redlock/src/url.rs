//! Node URLs: parsed with a real URL parser (the `url` crate, as redis-rs does), checked so
//! that no part of a password can be misread as host, path or query, and shown with every
//! password hidden.
//!
//! Where the password lives:
//!
//! * `redis://` and `rediss://`: in the userinfo, `redis://[user][:password]@host[:port][/db]`.
//!   redis-rs percent-decodes it, so a password with `/`, `?`, `#` (which end the host part),
//!   `%` or anything else unusual is written percent-encoded (`%2F`, `%3F`, `%23`, `%25`, …).
//!   `@` and `:` may also be written raw: the userinfo ends at the *last* `@` and the password
//!   starts after the *first* `:`.
//! * `redis+unix://` and `unix://`: in the `pass` query parameter,
//!   `redis+unix:///path?db=1&user=u&pass=p`. redis-rs form-decodes it: `%XX` is decoded and
//!   `+` means a space, so `&`, `#`, `+` and `%` in the password must be percent-encoded.

use std::sync::Arc;

use ::url::Url;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

/// Schemes of TCP nodes (the second one with TLS).
const TCP_SCHEMES: [&str; 2] = ["redis", "rediss"];
/// Schemes of unix-socket nodes.
const UNIX_SCHEMES: [&str; 2] = ["redis+unix", "unix"];
/// Query parameters redis-rs reads from a unix-socket URL.
const UNIX_QUERY_KEYS: [&str; 4] = ["db", "user", "pass", "protocol"];
/// Query parameters whose values are never shown.
const SECRET_QUERY_KEYS: [&str; 2] = ["pass", "password"];
/// Stands in for anything hidden.
const MASK: &str = "***";

/// A parsed, validated node address.
#[derive(Clone)]
pub(crate) struct NodeSpec {
    pub(crate) name: Arc<str>,
    /// `host:port` or socket path plus db, used to detect duplicates.
    pub(crate) identity: String,
    /// Holds the percent-decoded password, as it is sent in `AUTH`.
    pub(crate) info: ConnectionInfo,
    pub(crate) tls: bool,
}

impl std::fmt::Debug for NodeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSpec")
            .field("name", &self.name)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl NodeSpec {
    /// Parses `redis://[user[:password]@]host[:port][/db]`, `rediss://…` or
    /// `redis+unix:///path[?db=…&user=…&pass=…]` (see the module documentation for where
    /// reserved characters must be percent-encoded).
    ///
    /// On failure returns a reason that never quotes the URL, so it cannot contain the
    /// password in any form.
    pub(crate) fn parse(url: &str, name: Option<&str>) -> Result<Self, String> {
        let url = checked(url)?;
        if TCP_SCHEMES.contains(&url.scheme()) {
            // redis-rs reads nothing but `protocol` from a TCP URL's query, and reads a
            // fragment `#insecure` as "skip the certificate checks": a URL that says more was
            // taken without a word for something else (`?db=3` as database 0, `?password=` as
            // no password).
            if url.fragment().is_some() {
                return Err(
                    "a redis:// or rediss:// URL takes no '#' fragment (`#insecure` \
                            would turn certificate checks off): percent-encode '#' in a \
                            password as %23"
                        .into(),
                );
            }
            if url.query_pairs().any(|(key, _)| key != "protocol") {
                return Err(
                    "unknown query parameter: a redis:// or rediss:// URL takes only \
                            `protocol`; the database goes in the path (`/3`), the password in \
                            the userinfo (`redis://user:password@host`)"
                        .into(),
                );
            }
        }
        let secrets = secrets_of(&url);
        let info = url.into_connection_info().map_err(|e| {
            // redis-rs's URL errors are fixed texts; scrubbing is a second line of defence.
            scrub(
                &format!("not a valid Redis URL ({e})"),
                &secrets.iter().map(|s| Some(s.as_str())).collect::<Vec<_>>(),
            )
        })?;
        let db = info.redis_settings().db();
        if db < 0 {
            return Err("the database number must be 0 or more".into());
        }
        let (identity, default_name, tls) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let hp = format!("{}:{port}", host.to_ascii_lowercase());
                (format!("{hp}/{db}"), hp, false)
            }
            ConnectionAddr::TcpTls { host, port, .. } => {
                let hp = format!("{}:{port}", host.to_ascii_lowercase());
                (format!("{hp}/{db}"), hp, true)
            }
            ConnectionAddr::Unix(path) => {
                let p = path.display().to_string();
                (format!("{p}/{db}"), p, false)
            }
            _ => return Err("unsupported address type".into()),
        };
        if tls && !cfg!(feature = "tls") {
            return Err("rediss:// needs the `tls` feature of the redlock crate".into());
        }
        let info = info.set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        Ok(Self {
            name: name.map_or_else(|| default_name.into(), Into::into),
            identity,
            info,
            tls,
        })
    }
}

/// `url` with every password replaced by `***`, for messages and `Debug`.
///
/// A URL that [`NodeSpec::parse`] accepts is shown whole except for the password of its
/// userinfo and the values of `pass`/`password` query parameters. Anything else is shown only
/// in part: nothing up to its last `@` (the userinfo as any parser would see it), and for a
/// TCP scheme nothing from the first `?` or `#` after that, for any other scheme nothing from
/// the first `?` or `#` at all (the query, where a unix-socket URL keeps its password).
pub(crate) fn redact_url(url: &str) -> String {
    match checked(url) {
        Ok(parsed) => redact_parsed(&parsed).unwrap_or_else(|| redact_unparsed(url.trim())),
        Err(_) => redact_unparsed(url.trim()),
    }
}

/// Replaces every occurrence of each secret (of 3 bytes or more) in `text` with `***`.
pub(crate) fn scrub(text: &str, secrets: &[Option<&str>]) -> String {
    let mut out = text.to_owned();
    for s in secrets.iter().flatten() {
        if s.len() >= 3 {
            out = out.replace(s, MASK);
        }
    }
    out
}

/// Parses `raw` and rejects every URL that a parser would read differently from what was
/// probably meant. Errors never quote the input.
fn checked(raw: &str) -> Result<Url, String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err("empty URL".into());
    }
    if raw.chars().any(char::is_control) {
        // The URL parser silently drops tabs and newlines, which would change a password.
        return Err("the URL contains control characters (tab, newline, …)".into());
    }
    let expected = "expected a redis://, rediss:// or redis+unix:// URL";
    let (scheme, rest) = split_scheme(raw).ok_or(expected)?;
    let scheme = scheme.to_ascii_lowercase();
    let unix = if TCP_SCHEMES.contains(&scheme.as_str()) {
        false
    } else if UNIX_SCHEMES.contains(&scheme.as_str()) {
        true
    } else {
        return Err(expected.into());
    };
    if !unix {
        // The host part ends at the first '/', '?' or '#'; an '@' after that means a user
        // name or password contains one of them raw, and the parser would take part of the
        // password for the host, port, path or query.
        let host_part_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if rest[host_part_end..].contains('@') {
            return Err(
                "'@' after the end of the host part: a user name or password \
                        containing '/', '?' or '#' must percent-encode them (%2F, %3F, %23)"
                    .into(),
            );
        }
    }
    let url = Url::parse(raw).map_err(|e| format!("not a valid URL: {e}"))?;
    if unix {
        if url.fragment().is_some() {
            return Err(
                "a redis+unix:// URL takes no '#' fragment: percent-encode '#' in a \
                        password as %23"
                    .into(),
            );
        }
        if url
            .query_pairs()
            .any(|(key, _)| !UNIX_QUERY_KEYS.contains(&key.as_ref()))
        {
            return Err(
                "unknown query parameter (a redis+unix:// URL takes db, user, pass and \
                        protocol): percent-encode '&' in a password as %26"
                    .into(),
            );
        }
    }
    Ok(url)
}

/// `(scheme, rest)` of `scheme://rest`, if the scheme is well formed (RFC 3986).
fn split_scheme(raw: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = raw.split_once("://")?;
    let mut chars = scheme.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    well_formed.then_some((scheme, rest))
}

/// Every form of every password in `url` that text derived from it could contain.
fn secrets_of(url: &Url) -> Vec<String> {
    let mut secrets: Vec<String> = url.password().map(str::to_owned).into_iter().collect();
    for (key, value) in url.query_pairs() {
        if SECRET_QUERY_KEYS.contains(&key.as_ref()) {
            secrets.push(value.into_owned());
        }
    }
    secrets
}

/// A checked URL with its secrets masked; `None` if the parser cannot set a password on it.
fn redact_parsed(url: &Url) -> Option<String> {
    let mut shown = url.clone();
    if url.password().is_some() {
        shown.set_password(Some(MASK)).ok()?;
    }
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(key, value)| {
            let value = if SECRET_QUERY_KEYS.contains(&key.as_ref()) {
                MASK.to_owned()
            } else {
                value.into_owned()
            };
            (key.into_owned(), value)
        })
        .collect();
    if pairs
        .iter()
        .any(|(key, _)| SECRET_QUERY_KEYS.contains(&key.as_str()))
    {
        shown.query_pairs_mut().clear().extend_pairs(pairs);
    }
    Some(shown.into())
}

/// What may be shown of a URL that did not pass [`checked`]; see [`redact_url`].
fn redact_unparsed(raw: &str) -> String {
    let (prefix, rest, tcp) = match split_scheme(raw) {
        Some((scheme, rest)) => (
            format!("{scheme}://"),
            rest,
            TCP_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()),
        ),
        None => (String::new(), raw, false),
    };
    let shown_from = rest.rfind('@').map_or(0, |at| at + 1);
    let search_from = if tcp { shown_from } else { 0 };
    let shown_to = rest[search_from..]
        .find(['?', '#'])
        .map_or(rest.len(), |i| search_from + i);
    if shown_to < shown_from {
        return format!("{prefix}{MASK}");
    }
    let mut out = prefix;
    if shown_from > 0 {
        out.push_str(MASK);
        out.push('@');
    }
    let shown = &rest[shown_from..shown_to];
    // Without an `@`, what follows the first `:` of a TCP URL may be a port or a password
    // whose `@` was lost (a list split on a comma inside it, a host left out): neither is
    // shown.
    let colon = if !tcp || shown_from > 0 {
        None
    } else if shown.starts_with('[') {
        shown.find("]:").map(|i| i + 1)
    } else {
        shown.find(':')
    };
    if let Some(colon) = colon {
        out.push_str(&shown[..=colon]);
        out.push_str(MASK);
        return out;
    }
    out.push_str(shown);
    if let Some(delimiter) = rest[shown_to..].chars().next() {
        out.push(delimiter);
        out.push_str(MASK);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Halves of the test passwords: alphanumeric, so any leaked piece shows one of them.
    const L: &str = "Kq7vZ";
    const R: &str = "Wm3xJ";
    /// Every RFC 3986 reserved character, `%`, space and non-ASCII.
    const AWKWARD: &[&str] = &[
        ":", "/", "?", "#", "[", "]", "@", "!", "$", "&", "'", "(", ")", "*", "+", ",", ";", "=",
        "%", " ", "é", "€", "🔒",
    ];

    fn percent_encode_all(s: &str) -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    fn password(url: &str) -> Result<Option<String>, String> {
        NodeSpec::parse(url, None)
            .map(|spec| spec.info.redis_settings().password().map(str::to_owned))
    }

    fn assert_hidden(text: &str) {
        assert!(!text.contains(L) && !text.contains(R), "{text}");
    }

    #[test]
    fn percent_encoded_passwords_are_decoded_exactly() {
        for c in AWKWARD {
            let pw = format!("{L}{c}{R}");
            let enc = percent_encode_all(&pw);
            for url in [
                format!("redis://alice:{enc}@127.0.0.1:7001"),
                format!("redis://:{enc}@127.0.0.1:7001/2"),
                format!("rediss://alice:{enc}@localhost:7001"),
                format!("redis+unix:///tmp/r.sock?db=1&pass={enc}"),
            ] {
                assert_eq!(password(&url), Ok(Some(pw.clone())), "{url}");
                assert_hidden(&redact_url(&url));
            }
        }
    }

    #[test]
    fn raw_reserved_characters_in_the_userinfo_are_read_or_rejected_never_misread() {
        for c in AWKWARD {
            let pw = format!("{L}{c}{R}");
            for url in [
                format!("redis://alice:{pw}@127.0.0.1:7001"),
                format!("redis://:{pw}@127.0.0.1:7001/0"),
            ] {
                match password(&url) {
                    // '%' followed by a non-hex digit stays as it is, like any other character.
                    Ok(got) => assert_eq!(got, Some(pw.clone()), "{url}"),
                    Err(reason) => {
                        assert!(["/", "?", "#"].contains(c), "{c:?} rejected: {reason}");
                        assert!(reason.contains("percent-encode"), "{reason}");
                        assert_hidden(&reason);
                    }
                }
                assert_hidden(&redact_url(&url));
            }
        }
    }

    #[test]
    fn raw_delimiters_in_a_unix_password_are_rejected() {
        for c in ["#", "&"] {
            let url = format!("redis+unix:///tmp/r.sock?pass={L}{c}{R}");
            let reason = password(&url).unwrap_err();
            assert!(reason.contains("percent-encode"), "{reason}");
            assert_hidden(&reason);
            assert_hidden(&redact_url(&url));
        }
        // Form decoding: a raw '+' is a space (documented), "%2B" is a '+'.
        assert_eq!(
            password("unix:///tmp/r.sock?pass=a+b%2Bc")
                .unwrap()
                .as_deref(),
            Some("a b+c")
        );
    }

    #[test]
    fn redaction_of_accepted_urls() {
        assert_eq!(
            redact_url("redis://alice:s3cret@host:6379/2"),
            "redis://alice:***@host:6379/2"
        );
        assert_eq!(redact_url("redis://:pw@h:1"), "redis://:***@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("rediss://u@h"), "rediss://u@h");
        assert_eq!(
            redact_url("redis://a:b%40c@h:1/0?protocol=resp3"),
            "redis://a:***@h:1/0?protocol=resp3"
        );
        assert_eq!(
            redact_url("redis://u:p@ss:w0rd@h:1"),
            "redis://u:***@h:1",
            "the userinfo ends at the last '@'"
        );
        assert_eq!(
            redact_url("redis+unix:///tmp/r.sock?db=2&user=u&pass=s3cret"),
            "redis+unix:///tmp/r.sock?db=2&user=u&pass=***"
        );
        assert_eq!(redact_url(" redis://h:1 "), "redis://h:1");
    }

    #[test]
    fn redaction_of_rejected_urls_hides_the_userinfo_and_the_query() {
        for (url, shown) in [
            ("redis://u:a/b@h:1", "redis://***@h:1"),
            ("redis://u:pw@h:notaport", "redis://***@h:notaport"),
            ("redis://:a?b@c#d@h:1", "redis://***@h:1"),
            ("redis://:pw@h:1/0?x=1@2", "redis://***@2"),
            ("redis://u:pw@h:1/x#frag", "redis://u:***@h:1/x#frag"),
            ("redis+unix:///tmp/s?pass=a#b", "redis+unix:///tmp/s?***"),
            ("redis+unix:///tmp/s?pass=a@b#c", "redis+unix://***"),
            ("unix:///tmp/s?pass=a&b", "unix:///tmp/s?***"),
            ("http://u:pw@h", "http://***@h"),
            ("u:pw@h:1", "***@h:1"),
            ("redis:/u:pw@h:1", "***@h:1"),
            ("not a url", "not a url"),
            ("", ""),
            // No `@`: after the first `:` may be a password (a list split on a comma inside
            // it, a host left out) as well as a port.
            ("redis://alice:pw", "redis://alice:***"),
            ("redis://:pw", "redis://:***"),
            ("redis://h:99999/0?x", "redis://h:***"),
            ("redis://[::1]:99999", "redis://[::1]:***"),
            ("redis://[::1", "redis://[::1"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn rejected_urls_give_reasons_without_the_userinfo() {
        for url in [
            "",
            "   ",
            "not a url",
            "http://127.0.0.1:1",
            "redis://u:topsecret@h:notaport",
            "redis://u:top/secret@h:1",
            "redis://u:top?secret@h:1",
            "redis://u:top#secret@h:1",
            "redis://u:top\tsecret@h:1",
            "redis://u:top%FFsecret@h:1",
            "redis://u:top[secret@[::1:1",
            "redis://u:topsecret@h:1/notadb",
            "redis://u:topsecret@0.0.0.0:1",
            "rediss://u:topsecret@h:1#nope",
            "redis+unix:///s?pass=top#secret",
            "redis+unix:///s?pass=top&secret",
            "redis://",
        ] {
            let reason = NodeSpec::parse(url, None).unwrap_err();
            assert!(!reason.is_empty(), "{url}");
            for piece in ["top", "secret"] {
                assert!(!reason.contains(piece), "{url}: {reason}");
                assert!(
                    !redact_url(url).contains(piece),
                    "{url}: {}",
                    redact_url(url)
                );
            }
        }
    }

    #[test]
    fn parse_names_and_rejects() {
        let s = NodeSpec::parse("redis://127.0.0.1:7001", None).unwrap();
        assert_eq!(&*s.name, "127.0.0.1:7001");
        assert!(!s.tls);
        let s = NodeSpec::parse("redis://u:pw@Host:7002/3", Some("n2")).unwrap();
        assert_eq!(&*s.name, "n2");
        assert_eq!(s.identity, "host:7002/3");
        assert_eq!(s.info.redis_settings().username(), Some("u"));
        assert_eq!(s.info.redis_settings().password(), Some("pw"));
        let s = NodeSpec::parse("REDIS://h:1", None).unwrap();
        assert_eq!(&*s.name, "h:1");
        let s = NodeSpec::parse("redis+unix:///tmp/r.sock?db=4", None).unwrap();
        assert_eq!(&*s.name, "/tmp/r.sock");
        assert_eq!(s.identity, "/tmp/r.sock/4");
        assert!(NodeSpec::parse("", None).is_err());
        assert!(NodeSpec::parse("http://x", None).is_err());
        #[cfg(feature = "tls")]
        assert!(NodeSpec::parse("rediss://h:1", None).unwrap().tls);
    }

    #[test]
    fn scrub_replaces_secrets_of_three_bytes_or_more() {
        assert_eq!(
            scrub("a s3cret b s3cret", &[Some("s3cret"), None]),
            "a *** b ***"
        );
        assert_eq!(scrub("ab", &[Some("ab")]), "ab");
    }
}
