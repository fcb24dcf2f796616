//! Simulated nodes, for testing the client under faults; not for production.
//!
//! A [`SimCluster`] is N in-memory nodes that run the client's scripts with the semantics the
//! Lua scripts have on Redis — keys with `PX` expiry on the node's own clock, owner checks,
//! all-or-nothing multi-key grants, claim stamps, the identity record, batched renewals,
//! owner-checked releases that publish on each deleted key's channel — behind a simulated
//! network with per-node faults. [`RedlockBuilder::build_simulated`](crate::RedlockBuilder::build_simulated)
//! builds a real [`Redlock`](crate::Redlock) on it: acquire, extend, release, guards and their
//! renewal driver, and the hand-off waiters all run their production code.
//!
//! Time is tokio's: on a `current_thread` runtime with a paused clock
//! (`start_paused(true)`), simulated seconds cost microseconds. Each node's clock is
//! `real × rate + offset`, where *real* is tokio's clock.
//!
//! Determinism: on such a runtime, the same seed gives the same history. [`SimCluster::new`]
//! seeds the cluster's fault generator and installs a seeded generator for the calling thread
//! ([`seed_thread`]), from which the client draws its tokens and retry jitter; with the
//! `simulation` feature the client's maps iterate in a fixed order and its `select!`s poll in
//! the order written. Code driving a simulation must be as careful (`select!` with `biased;`,
//! no `HashMap` iteration with a random hasher, no wall-clock reads).

mod backend;
pub(crate) mod rng;
mod world;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub(crate) use backend::{SimBackend, SubClient, SubSink, SubStream};
use world::Inner;
pub use world::Keep;

/// Installs a generator seeded with `seed` for the current thread: every random value the
/// client draws on this thread (tokens, retry jitter, renewal spread, node identities) comes
/// from it, and lock validity follows tokio's clock alone (not the boot clock). It starts a
/// new history: the thread's record of attempts with a caller's token starts empty, so call it
/// between histories, not within one (an attempt it forgot would not be waited for). Called by
/// [`SimCluster::new`]; call it again to restart the sequence.
pub fn seed_thread(seed: u64) {
    rng::install(seed);
}

/// Removes the current thread's generator: the client draws from the operating system again.
pub fn unseed_thread() {
    rng::remove();
}

/// The name of simulated node `i`, as clients see it.
pub(crate) fn node_name(i: usize) -> String {
    format!("sim{i}")
}

/// A handle to N simulated nodes; clones share them.
///
/// Fault controls take a node index.
///
/// # Panics
/// Every method taking a node index panics when it is not below [`SimCluster::len`], like
/// slice indexing.
#[derive(Clone)]
pub struct SimCluster {
    pub(crate) inner: Arc<Inner>,
    len: usize,
}

impl std::fmt::Debug for SimCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.inner.world();
        let paused: Vec<usize> = (0..self.len).filter(|&i| w.nodes[i].paused).collect();
        let partitioned: Vec<usize> = (0..self.len).filter(|&i| w.nodes[i].partitioned).collect();
        f.debug_struct("SimCluster")
            .field("nodes", &self.len)
            .field("paused", &paused)
            .field("partitioned", &partitioned)
            .finish()
    }
}

impl SimCluster {
    /// `nodes` healthy nodes with instant links and synchronised clocks. Seeds the fault
    /// generator with `seed`, and the current thread's generator (see [`seed_thread`]) with a
    /// value derived from it.
    pub fn new(nodes: usize, seed: u64) -> Self {
        seed_thread(seed ^ 0x9e37_79b9_7f4a_7c15);
        Self {
            inner: Arc::new(Inner::new(nodes, seed)),
            len: nodes,
        }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The node a racing attempt on `resource` asks first (an attempt after a release
    /// notification and a stagger goes through one node first), while no node is passed over
    /// for keeping such attempts waiting. `None` with one node.
    pub fn first_node(&self, resource: &str) -> Option<usize> {
        let names: Vec<String> = (0..self.len).map(node_name).collect();
        crate::engine::first_node(
            names.iter().map(|n| crate::engine::rank_seed(n)),
            resource,
            |_| true,
        )
    }

    /// Whether the cluster has no nodes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn node<T>(
        &self,
        i: usize,
        f: impl FnOnce(&mut world::Node, &mut rand::rngs::SmallRng) -> T,
    ) -> T {
        assert!(i < self.len, "node {i} of a cluster of {}", self.len);
        let mut w = self.inner.world();
        let w = &mut *w;
        f(&mut w.nodes[i], &mut w.rng)
    }

    /// Node `i` stops executing requests (like `SIGSTOP`): they wait, in order, until
    /// [`resume`](Self::resume). Its clock keeps running, and so do its keys' TTLs.
    pub fn pause(&self, i: usize) {
        self.node(i, |n, _| n.paused = true);
    }

    /// Node `i` executes the requests that arrived while it was paused, then runs on.
    pub fn resume(&self, i: usize) {
        self.node(i, |n, _| n.paused = false);
        self.inner.poke();
    }

    /// Whether node `i` is paused.
    pub fn is_paused(&self, i: usize) -> bool {
        self.node(i, |n, _| n.paused)
    }

    /// Every message between node `i` and its clients takes `base` plus a uniform draw from
    /// `[0, jitter)`, in each direction. Messages on one connection keep their order.
    pub fn set_delay(&self, i: usize, base: Duration, jitter: Duration) {
        self.node(i, |n, _| n.set_delay(base, jitter));
    }

    /// Each request to node `i` is lost with probability `p`: half of the time before it
    /// runs, half of the time after it ran (its reply is lost). The client sees its node
    /// timeout either way. Release notifications from the node are lost with probability `p`
    /// too.
    pub fn set_loss(&self, i: usize, p: f64) {
        self.node(i, |n, _| n.set_loss(p));
    }

    /// Cuts node `i` off: requests, replies and messages that reach the cut are lost (the
    /// client times out); connections stay open, as TCP does not notice a silent partition.
    pub fn partition(&self, i: usize) {
        self.node(i, |n, _| n.partitioned = true);
    }

    /// Ends node `i`'s partition.
    pub fn heal(&self, i: usize) {
        self.node(i, |n, _| n.partitioned = false);
    }

    /// Whether node `i` is partitioned.
    pub fn is_partitioned(&self, i: usize) -> bool {
        self.node(i, |n, _| n.partitioned)
    }

    /// From now on node `i`'s clock runs at `rate` × real time (1.0 = in step).
    pub fn set_clock_rate(&self, i: usize, rate: f64) {
        let now = Instant::now();
        let rate = if rate.is_finite() { rate.max(0.0) } else { 1.0 };
        self.node(i, |n, _| n.set_rate(now, rate));
    }

    /// Steps node `i`'s clock by `delta_ms` (forward when positive, back when negative): key
    /// expiry, claim stamps and the uptime all follow it.
    pub fn jump_clock(&self, i: usize, delta_ms: i64) {
        self.node(i, |n, _| n.jump(delta_ms));
    }

    /// Node `i`'s clock, in ms since the Unix epoch.
    pub fn node_time_ms(&self, i: usize) -> i64 {
        let now = Instant::now();
        self.node(i, |n, _| n.clock_us(now).div_euclid(1000))
    }

    /// Restarts node `i` at once, keeping `keep` of its data: every connection breaks (requests
    /// in flight fail with a connection error), the script cache is empty, and the uptime
    /// starts again from zero. Clients reconnect and handshake again, re-reading the identity
    /// record (a new one after [`Keep::None`]) and, with the restart quarantine configured,
    /// the uptime.
    pub fn restart(&self, i: usize, keep: Keep) {
        let now = Instant::now();
        self.node(i, |n, rng| n.restart(now, keep, rng));
    }

    /// Empties node `i`'s script cache (`SCRIPT FLUSH`): the next scripted call of each
    /// client fails with `NOSCRIPT` there — an acquire then counts as a failed vote and the
    /// client reloads the scripts; extend, release and renewal fall back to `EVAL`.
    pub fn script_flush(&self, i: usize) {
        self.node(i, |n, _| n.flush_scripts());
    }

    /// Breaks every connection to node `i`: requests in flight fail with a connection error,
    /// subscriptions end, and the next request reconnects with a fresh handshake.
    pub fn kill_connections(&self, i: usize) {
        self.node(i, |n, _| n.kill_connections());
    }

    /// Resumes, heals, and clears the delay, loss and clock rate of node `i` (clock steps
    /// stay).
    pub fn clear_faults(&self, i: usize) {
        let now = Instant::now();
        self.node(i, |n, _| {
            n.paused = false;
            n.partitioned = false;
            n.set_delay(Duration::ZERO, Duration::ZERO);
            n.set_loss(0.0);
            n.set_rate(now, 1.0);
        });
        self.inner.poke();
    }

    /// Live lock keys on node `i` (keys with a TTL, judged by the node's clock).
    pub fn lock_keys(&self, i: usize) -> usize {
        let now = Instant::now();
        self.node(i, |n, _| n.lock_keys(now))
    }

    /// The value of `key` on node `i` now (a lock key's value is the holder's token), if the
    /// key is live.
    pub fn value(&self, i: usize, key: &str) -> Option<String> {
        let now = Instant::now();
        self.node(i, |n, _| n.value(now, key))
    }

    /// Starts (or stops) recording every request the nodes execute, with the time and the
    /// reply, for [`take_log`](Self::take_log).
    pub fn record(&self, on: bool) {
        let mut w = self.inner.world();
        w.log = on.then(Vec::new);
    }

    /// The requests executed since the last call (when recording).
    pub fn take_log(&self) -> Vec<String> {
        let mut w = self.inner.world();
        match w.log.as_mut() {
            Some(log) => std::mem::take(log),
            None => Vec::new(),
        }
    }
}
