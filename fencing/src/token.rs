//! Fencing tokens: claim tokens (a grant's per-node stamps) and scalar tokens.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::ser::{Serialize, Serializer};

use crate::error::FenceError;

/// Most claims one token may carry. A Redlock quorum of more than 32 masters is not a
/// configuration anyone runs; the cap keeps hostile input cheap to reject.
pub const MAX_CLAIMS: usize = 32;

/// Longest node name in bytes (after decoding the text form).
pub const MAX_NODE_NAME_LEN: usize = 128;

/// Largest stamp (and scalar token) a resource accepts: `i64::MAX`, so that every backend can
/// store it exactly (PostgreSQL `bigint`). Redlock's stamps are µs since 1970 (about 2^51 today).
pub const MAX_STAMP: u64 = i64::MAX as u64;

/// Longest accepted text form, checked before anything else is parsed. Every valid token fits
/// (even 32 claims whose 128-byte names are fully percent-encoded); a typical token of a
/// 5-node lock is about 150 bytes.
pub const MAX_TOKEN_TEXT_LEN: usize =
    VERSION.len() + MAX_CLAIMS * (1 + 3 * MAX_NODE_NAME_LEN + 1 + 19);

/// Version prefix of the text form. A future format gets a new prefix; this one never changes.
const VERSION: &str = "f1";

/// A Redlock grant's fencing token: the set of `(node name, claim stamp)` pairs of the nodes
/// that granted it.
///
/// Per node, stamps strictly increase across grants, so on any node two grants share, the
/// later grant has the larger stamp. Invariants, checked by [`FenceToken::new`] and by parsing:
/// 1 to [`MAX_CLAIMS`] claims, node names non-empty, at most [`MAX_NODE_NAME_LEN`] bytes and
/// distinct, stamps at most [`MAX_STAMP`]. Claims are kept sorted by node name.
///
/// # Text form
///
/// `f1,<node>=<stamp>,<node>=<stamp>…`, claims sorted by node name (bytewise), stamps in
/// decimal without leading zeros, node names percent-encoded except for
/// `A–Z a–z 0–9 - . _ ~ : @ / [ ]`. It is ASCII without spaces, quotes or semicolons, so it fits
/// in an HTTP header value, an environment variable or a URL query value as is, e.g.
/// `f1,127.0.0.1:7001=1716200000000001,127.0.0.1:7002=1716200000000017`. `Display` always
/// produces this canonical form and `parse` accepts only it (apart from claim order), so equal
/// tokens have equal text. Serde uses the same string.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct FenceToken {
    claims: Box<[(Arc<str>, u64)]>,
}

impl FenceToken {
    /// Builds a token from `(node name, stamp)` pairs in any order.
    ///
    /// # Errors
    ///
    /// [`FenceError::EmptyToken`] without claims, [`FenceError::TooManyClaims`],
    /// [`FenceError::InvalidNodeName`] (empty, longer than [`MAX_NODE_NAME_LEN`], or with a
    /// NUL byte),
    /// [`FenceError::StampOutOfRange`], [`FenceError::DuplicateNode`].
    pub fn new<I, N>(claims: I) -> Result<Self, FenceError>
    where
        I: IntoIterator<Item = (N, u64)>,
        N: Into<Arc<str>>,
    {
        let mut out = Vec::new();
        for (node, stamp) in claims {
            if out.len() == MAX_CLAIMS {
                return Err(FenceError::TooManyClaims { max: MAX_CLAIMS });
            }
            let node: Arc<str> = node.into();
            check_name(&node)?;
            check_stamp(stamp)?;
            out.push((node, stamp));
        }
        Self::from_vec(out)
    }

    fn from_vec(mut claims: Vec<(Arc<str>, u64)>) -> Result<Self, FenceError> {
        if claims.is_empty() {
            return Err(FenceError::EmptyToken);
        }
        claims.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = claims.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(FenceError::DuplicateNode {
                node: w[0].0.to_string(),
            });
        }
        Ok(Self {
            claims: claims.into_boxed_slice(),
        })
    }

    /// The claims, sorted by node name.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, u64)> + Clone + '_ {
        self.claims.iter().map(|(n, s)| (&**n, *s))
    }

    /// The stamp this token carries for `node`, if any.
    pub fn stamp(&self, node: &str) -> Option<u64> {
        self.claims
            .binary_search_by(|(n, _)| (**n).cmp(node))
            .ok()
            .map(|i| self.claims[i].1)
    }

    /// Number of claims (the number of nodes that granted; at least a quorum for a token from
    /// `redlock::Lock::fence`).
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    /// Always false: a token has at least one claim. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    pub(crate) fn entries(&self) -> &[(Arc<str>, u64)] {
        &self.claims
    }
}

fn check_name(node: &str) -> Result<(), FenceError> {
    if node.is_empty() {
        return Err(FenceError::InvalidNodeName {
            reason: "empty node name",
        });
    }
    if node.len() > MAX_NODE_NAME_LEN {
        return Err(FenceError::InvalidNodeName {
            reason: "node name longer than MAX_NODE_NAME_LEN bytes",
        });
    }
    // PostgreSQL text cannot hold it: a token every backend can store is one none refuses.
    if node.contains('\0') {
        return Err(FenceError::InvalidNodeName {
            reason: "node name contains a NUL byte",
        });
    }
    Ok(())
}

pub(crate) fn check_stamp(stamp: u64) -> Result<(), FenceError> {
    if stamp > MAX_STAMP {
        return Err(FenceError::StampOutOfRange { stamp });
    }
    Ok(())
}

fn is_raw(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.' | b'_' | b'~' | b':' | b'@' | b'/' | b'[' | b']'
        )
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_text_form(f, self.iter())
    }
}

/// Writes `(node, stamp)` pairs, sorted by node name, in the text form of a token. Also
/// [`HighWater`](crate::HighWater)'s form, which may hold more than [`MAX_CLAIMS`] nodes.
pub(crate) fn write_text_form<'a>(
    f: &mut fmt::Formatter<'_>,
    claims: impl Iterator<Item = (&'a str, u64)>,
) -> fmt::Result {
    f.write_str(VERSION)?;
    for (node, stamp) in claims {
        f.write_str(",")?;
        for &b in node.as_bytes() {
            if is_raw(b) {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "%{b:02X}")?;
            }
        }
        write!(f, "={stamp}")?;
    }
    Ok(())
}

impl fmt::Debug for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FenceToken({self})")
    }
}

impl FromStr for FenceToken {
    type Err = FenceError;

    /// Parses the canonical text form (see the type's docs); claims may come in any order.
    fn from_str(s: &str) -> Result<Self, FenceError> {
        if s.len() > MAX_TOKEN_TEXT_LEN {
            return Err(FenceError::TokenTooLong {
                len: s.len(),
                max: MAX_TOKEN_TEXT_LEN,
            });
        }
        if s.trim().is_empty() || s == VERSION {
            return Err(FenceError::EmptyToken);
        }
        let bad =
            |position: usize, reason: &'static str| FenceError::MalformedToken { position, reason };
        let Some(rest) = s.strip_prefix(VERSION).and_then(|r| r.strip_prefix(',')) else {
            return Err(bad(0, "expected the version prefix `f1,`"));
        };
        let claims_count = rest.bytes().filter(|&b| b == b',').count() + 1;
        if claims_count > MAX_CLAIMS {
            return Err(FenceError::TooManyClaims { max: MAX_CLAIMS });
        }
        let mut claims = Vec::with_capacity(claims_count);
        let mut offset = VERSION.len() + 1;
        for part in rest.split(',') {
            let Some(eq) = part.find('=') else {
                return Err(bad(offset, "expected `node=stamp`"));
            };
            let name = decode_name(&part[..eq], offset)?;
            let stamp = parse_stamp(&part[eq + 1..], offset + eq + 1)?;
            claims.push((Arc::<str>::from(name), stamp));
            offset += part.len() + 1;
        }
        Self::from_vec(claims)
    }
}

fn decode_name(raw: &str, offset: usize) -> Result<String, FenceError> {
    let bad = |at: usize, reason: &'static str| FenceError::MalformedToken {
        position: offset + at,
        reason,
    };
    if raw.is_empty() {
        return Err(FenceError::InvalidNodeName {
            reason: "empty node name",
        });
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .ok_or_else(|| bad(i, "truncated %-escape"))?;
            let v = hex_value(hex[0])
                .zip(hex_value(hex[1]))
                .map(|(h, l)| h << 4 | l)
                .ok_or_else(|| bad(i, "%-escape needs two upper-case hex digits"))?;
            if is_raw(v) {
                return Err(bad(i, "needless %-escape (not canonical)"));
            }
            out.push(v);
            i += 3;
        } else if is_raw(b) {
            out.push(b);
            i += 1;
        } else {
            return Err(bad(i, "character must be %-escaped"));
        }
    }
    if out.len() > MAX_NODE_NAME_LEN {
        return Err(FenceError::InvalidNodeName {
            reason: "node name longer than MAX_NODE_NAME_LEN bytes",
        });
    }
    if out.contains(&0) {
        return Err(FenceError::InvalidNodeName {
            reason: "node name contains a NUL byte",
        });
    }
    String::from_utf8(out).map_err(|_| bad(0, "node name is not UTF-8"))
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn parse_stamp(raw: &str, position: usize) -> Result<u64, FenceError> {
    let bad = |reason| FenceError::MalformedToken { position, reason };
    if raw.is_empty() {
        return Err(bad("missing stamp"));
    }
    if !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("stamp must be decimal digits"));
    }
    if raw.len() > 1 && raw.starts_with('0') {
        return Err(bad("leading zero in stamp (not canonical)"));
    }
    // At most 20 digits fit in u64; anything longer is out of range rather than malformed.
    let stamp = raw
        .parse::<u64>()
        .map_err(|_| FenceError::StampOutOfRange { stamp: u64::MAX })?;
    check_stamp(stamp)?;
    Ok(stamp)
}

impl Serialize for FenceToken {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FenceToken {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TokenVisitor;
        impl Visitor<'_> for TokenVisitor {
            type Value = FenceToken;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fence token in text form (`f1,node=stamp,…`)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FenceToken, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(TokenVisitor)
    }
}

/// A token from an authoritative monotonic source (e.g. a PostgreSQL sequence, see
/// `PgSequence`). Admitted iff it is at least the resource's last admitted scalar (equal = the
/// same holder retrying; a sequence never hands one value to two holders).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ScalarToken(pub u64);

impl fmt::Display for ScalarToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for ScalarToken {
    type Err = FenceError;

    fn from_str(s: &str) -> Result<Self, FenceError> {
        if s.is_empty() {
            return Err(FenceError::EmptyToken);
        }
        if s.len() > 20 {
            return Err(FenceError::TokenTooLong {
                len: s.len(),
                max: 20,
            });
        }
        parse_stamp(s, 0).map(ScalarToken)
    }
}

impl Serialize for ScalarToken {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ScalarToken {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        u64::deserialize(deserializer).map(ScalarToken)
    }
}

/// An owned token of either family, as carried by [`FenceError::Stale`] and
/// [`FenceError::Unrelated`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Token {
    /// A claim token.
    Claims(FenceToken),
    /// A scalar token.
    Scalar(ScalarToken),
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Claims(t) => t.fmt(f),
            Token::Scalar(s) => write!(f, "scalar {s}"),
        }
    }
}

impl From<FenceToken> for Token {
    fn from(t: FenceToken) -> Self {
        Token::Claims(t)
    }
}

impl From<ScalarToken> for Token {
    fn from(t: ScalarToken) -> Self {
        Token::Scalar(t)
    }
}

/// A borrowed token of either family: what every `admit` takes (`&FenceToken`, `ScalarToken`
/// and `&Token` convert into it).
///
/// A scalar token is kept as the single claim of the reserved node name `""` (which no claim
/// token may use), so one rule and one storage layout serve both families, and a resource that
/// has admitted one family answers the other with [`FenceError::Unrelated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenRef<'a> {
    /// A claim token.
    Claims(&'a FenceToken),
    /// A scalar token.
    Scalar(ScalarToken),
}

impl<'a> From<&'a FenceToken> for TokenRef<'a> {
    fn from(t: &'a FenceToken) -> Self {
        TokenRef::Claims(t)
    }
}

impl From<ScalarToken> for TokenRef<'_> {
    fn from(t: ScalarToken) -> Self {
        TokenRef::Scalar(t)
    }
}

impl<'a> From<&'a Token> for TokenRef<'a> {
    fn from(t: &'a Token) -> Self {
        match t {
            Token::Claims(c) => TokenRef::Claims(c),
            Token::Scalar(s) => TokenRef::Scalar(*s),
        }
    }
}

impl<'a> TokenRef<'a> {
    /// An owned copy.
    pub fn to_token(self) -> Token {
        match self {
            TokenRef::Claims(c) => Token::Claims(c.clone()),
            TokenRef::Scalar(s) => Token::Scalar(s),
        }
    }

    /// The claims as stored at the resource, sorted by node name (a scalar is `("", value)`,
    /// and `""` sorts before every real name).
    pub(crate) fn pairs(self) -> impl Iterator<Item = (&'a str, u64)> + Clone {
        let (claims, scalar): (&'a [(Arc<str>, u64)], _) = match self {
            TokenRef::Claims(c) => (c.entries(), None),
            TokenRef::Scalar(s) => (&[], Some(("", s.0))),
        };
        scalar
            .into_iter()
            .chain(claims.iter().map(|(n, s)| (&**n, *s)))
    }

    /// Checks what the type cannot: a scalar within [`MAX_STAMP`].
    pub(crate) fn validate(self) -> Result<(), FenceError> {
        match self {
            TokenRef::Claims(_) => Ok(()),
            TokenRef::Scalar(s) => check_stamp(s.0),
        }
    }
}
