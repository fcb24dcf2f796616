//! Everything in the client that would make two runs differ: randomness, hash-map order and
//! `select!` tie-breaks. The default build uses the usual sources; with the `simulation`
//! feature, a thread with a seed installed (`sim::seed_thread`) draws from a seeded
//! generator instead, maps iterate in a fixed order and `select!` polls its branches in order,
//! so the same seed gives the same history on a paused, single-threaded runtime.

use rand::Rng;

/// `tokio::select!`, polling its branches in the order written under the `simulation` feature
/// (tokio's random start otherwise comes from a seed nobody can set).
#[cfg(feature = "simulation")]
macro_rules! select {
    ($($t:tt)*) => { tokio::select! { biased; $($t)* } };
}

/// `tokio::select!` as is.
#[cfg(not(feature = "simulation"))]
macro_rules! select {
    ($($t:tt)*) => { tokio::select! { $($t)* } };
}

pub(crate) use select;

/// The hasher of the client's maps: fixed under the `simulation` feature, so iteration order
/// depends only on what was inserted.
#[cfg(feature = "simulation")]
pub(crate) type Hasher = std::hash::BuildHasherDefault<std::hash::DefaultHasher>;
/// The hasher of the client's maps.
#[cfg(not(feature = "simulation"))]
pub(crate) type Hasher = std::hash::RandomState;

pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, Hasher>;
pub(crate) type HashSet<T> = std::collections::HashSet<T, Hasher>;

/// A uniform draw from [0, 1).
pub(crate) fn unit() -> f64 {
    #[cfg(feature = "simulation")]
    if let Some(v) = crate::sim::rng::with(|r| r.random()) {
        return v;
    }
    rand::rng().random()
}

/// A uniform draw from `[lo, hi)`.
pub(crate) fn range(lo: f64, hi: f64) -> f64 {
    #[cfg(feature = "simulation")]
    if let Some(v) = crate::sim::rng::with(|r| r.random_range(lo..hi)) {
        return v;
    }
    rand::rng().random_range(lo..hi)
}

/// A uniform random `u64` (not for secrets).
pub(crate) fn id() -> u64 {
    #[cfg(feature = "simulation")]
    if let Some(v) = crate::sim::rng::with(|r| r.random()) {
        return v;
    }
    rand::rng().random()
}

/// Fills `buf` with random bytes: the operating system's CSPRNG.
pub(crate) fn fill(buf: &mut [u8]) -> Result<(), getrandom::Error> {
    #[cfg(feature = "simulation")]
    if crate::sim::rng::with(|r| r.fill(&mut *buf)).is_some() {
        return Ok(());
    }
    getrandom::fill(buf)
}

/// Whether this thread runs a simulation: validity then follows tokio's (paused) clock alone.
pub(crate) fn simulated() -> bool {
    #[cfg(feature = "simulation")]
    {
        crate::sim::rng::active()
    }
    #[cfg(not(feature = "simulation"))]
    {
        false
    }
}

/// Which simulated history this thread runs: a number that changes each time a seed is
/// installed on it (`sim::seed_thread`).
#[cfg(feature = "simulation")]
pub(crate) fn history() -> u64 {
    crate::sim::rng::history()
}
