//! The admission rule (`docs/fencing.md`, section 2) on a per-resource high-water map.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use crate::error::FenceError;
use crate::token::{FenceToken, TokenRef, write_text_form};

/// What an admitted token did to the resource's high water.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Admission {
    /// The token raised (or first set) the high water: a new grant, or a newer one.
    Advanced,
    /// Every claim equals the high water already: the same grant again (a retry, or another
    /// write of the same holder; their order is the holder's to keep).
    Repeated,
}

/// A resource's high-water map `H(node → stamp)`: the largest stamp admitted per node.
///
/// Only ever raised, never lowered. A scalar resource holds the one entry `("", last)`.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct HighWater {
    // Sorted by node name, distinct names.
    entries: Vec<(Arc<str>, u64)>,
}

/// The verdict of [`decide`], before it is applied.
enum Verdict {
    Advanced,
    Repeated,
    Stale,
    Unrelated,
}

impl HighWater {
    /// An empty map: the first token of either family is admitted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a map from stored `(node, stamp)` entries (any order; for a repeated node the
    /// largest stamp wins).
    pub fn from_entries<I, N>(entries: I) -> Self
    where
        I: IntoIterator<Item = (N, u64)>,
        N: Into<Arc<str>>,
    {
        let mut entries: Vec<(Arc<str>, u64)> =
            entries.into_iter().map(|(n, s)| (n.into(), s)).collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        entries.dedup_by(|later, first| later.0 == first.0);
        Self { entries }
    }

    /// True before anything was admitted.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of nodes with a mark.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The mark of `node`.
    pub fn get(&self, node: &str) -> Option<u64> {
        self.entries
            .binary_search_by(|(n, _)| (**n).cmp(node))
            .ok()
            .map(|i| self.entries[i].1)
    }

    /// The last admitted scalar token, on a scalar resource.
    pub fn scalar(&self) -> Option<u64> {
        self.get("")
    }

    /// The marks, sorted by node name (a scalar resource shows the node `""`).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, u64)> + '_ {
        self.entries.iter().map(|(n, s)| (&**n, *s))
    }

    /// Applies the admission rule without changing the map.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`], [`FenceError::Unrelated`], or [`FenceError::StampOutOfRange`] for
    /// a scalar above [`MAX_STAMP`](crate::MAX_STAMP).
    pub fn check<'a>(&self, token: impl Into<TokenRef<'a>>) -> Result<Admission, FenceError> {
        let token = token.into();
        token.validate()?;
        match self.decide(token) {
            Verdict::Advanced => Ok(Admission::Advanced),
            Verdict::Repeated => Ok(Admission::Repeated),
            Verdict::Stale => Err(FenceError::Stale {
                offered: token.to_token(),
                high_water: self.clone(),
            }),
            Verdict::Unrelated => Err(FenceError::Unrelated {
                offered: token.to_token(),
                high_water: self.clone(),
            }),
        }
    }

    /// Applies the admission rule and, when the token is admitted, raises the marks of its
    /// nodes to its stamps.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check); a rejected token leaves the map unchanged.
    pub fn admit<'a>(&mut self, token: impl Into<TokenRef<'a>>) -> Result<Admission, FenceError> {
        let token = token.into();
        let admission = self.check(token)?;
        if admission == Admission::Advanced {
            self.raise(token);
        }
        Ok(admission)
    }

    /// One merge pass over two sorted lists: admit iff no shared node is behind, and at least
    /// one node is shared unless the map is empty.
    fn decide(&self, token: TokenRef<'_>) -> Verdict {
        let mut shared = false;
        let mut same = true;
        let mut h = self.entries.iter().peekable();
        for (node, stamp) in token.pairs() {
            while h.next_if(|(n, _)| &**n < node).is_some() {}
            match h.next_if(|(n, _)| &**n == node) {
                Some((_, mark)) => {
                    shared = true;
                    match stamp.cmp(mark) {
                        Ordering::Less => return Verdict::Stale,
                        Ordering::Greater => same = false,
                        Ordering::Equal => {}
                    }
                }
                None => same = false,
            }
        }
        if self.entries.is_empty() {
            Verdict::Advanced
        } else if !shared {
            Verdict::Unrelated
        } else if same {
            Verdict::Repeated
        } else {
            Verdict::Advanced
        }
    }

    /// Raises the marks to the token's stamps (only called after the token was admitted, so
    /// no stamp is below its mark).
    fn raise(&mut self, token: TokenRef<'_>) {
        // New nodes are appended after the loop: the binary searches need a sorted list.
        let mut added = Vec::new();
        for (node, stamp) in token.pairs() {
            match self.entries.binary_search_by(|(n, _)| (**n).cmp(node)) {
                Ok(i) => self.entries[i].1 = self.entries[i].1.max(stamp),
                Err(_) => added.push((Arc::from(node), stamp)),
            }
        }
        if !added.is_empty() {
            self.entries.extend(added);
            self.entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
    }
}

impl From<&FenceToken> for HighWater {
    fn from(token: &FenceToken) -> Self {
        Self {
            entries: token.entries().to_vec(),
        }
    }
}

impl fmt::Display for HighWater {
    /// `{}` when empty, `scalar N` for a scalar resource, else the claim text form — also past
    /// [`MAX_CLAIMS`](crate::MAX_CLAIMS) nodes, which a high water reaches when nodes that lost
    /// their data come back under new names.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.entries[..] {
            [] => f.write_str("{}"),
            [(node, s)] if node.is_empty() => write!(f, "scalar {s}"),
            // A map mixing the scalar entry with claims (only reachable through from_entries).
            [(node, _), ..] if node.is_empty() => f
                .debug_map()
                .entries(self.entries.iter().map(|(n, s)| (n, s)))
                .finish(),
            _ => write_text_form(f, self.iter()),
        }
    }
}

impl fmt::Debug for HighWater {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HighWater({self})")
    }
}
