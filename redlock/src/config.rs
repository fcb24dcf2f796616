//! Plain-data configuration with documented defaults.

use std::time::Duration;

use crate::error::ConfigError;

/// Default lock time-to-live: 10 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Default clock drift factor: 1 % of the TTL (plus a constant 2 ms).
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// Default per-node timeout for one request on an open connection: 50 ms.
///
/// Loopback and same-rack round trips are well under 1 ms; 50 ms tolerates a GC pause or a slow
/// fsync on one node while keeping a hung node's cost far below the TTL.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Default time allowed to open a connection (TCP, TLS, AUTH, script preload): 1 s.
/// It is added to the node timeout only while a node has no open connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default minimum validity below which an acquisition counts as failed: 0 (any positive
/// validity is accepted).
pub const DEFAULT_MIN_VALIDITY: Duration = Duration::ZERO;
/// Default key prefix: lock keys are `redlock:lock:<resource>`, the stamp key `redlock:stamp`.
pub const DEFAULT_KEY_PREFIX: &str = "redlock:";
/// Default maximum resource name length in bytes.
pub const DEFAULT_MAX_RESOURCE_LEN: usize = 512;
/// Maximum number of resources in one lock.
pub const MAX_RESOURCES_PER_LOCK: usize = 64;
/// Default longest time a guard keeps renewing a lock: 1 hour. Leases are never infinite.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(3600);
/// Default number of attempts made by `acquire`.
pub const DEFAULT_RETRY_ATTEMPTS: u32 = 10;
/// Default base delay between attempts.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(100);
/// Default jitter: the delay is drawn uniformly from `delay ± jitter/2`.
pub const DEFAULT_RETRY_JITTER: Duration = Duration::from_millis(100);

/// The clock-drift allowance: TTL·drift_factor + 2 ms.
pub(crate) fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor) + Duration::from_millis(2)
}

/// The TTL checks shared by `build()` and [`LockRequest`](crate::LockRequest): at least 1 ms,
/// at most one year (Redis takes `PX` as a signed 64-bit count of ms; stay far from it), above
/// the drift allowance plus the minimum validity (else no acquisition could succeed), and above
/// the node timeout. `build()` passes a zero `node_timeout` and checks the node timeout against
/// its TTL on its own (`InvalidNodeTimeout`: the node timeout is its setting too); a request
/// whose TTL is not above the client's node timeout gets `InvalidTtl`. One rule for both: a
/// request that named its client's own TTL and minimum validity was refused (it also counted
/// the node timeout into the validity the TTL must leave) where the client's own acquires were
/// not (test `config::a_request_is_held_to_the_rule_its_client_was_built_with`).
pub(crate) fn check_ttl(
    ttl: Duration,
    drift_factor: f64,
    node_timeout: Duration,
    min_validity: Duration,
) -> Result<(), ConfigError> {
    let ttl_err = |reason: String| ConfigError::InvalidTtl { ttl, reason };
    if ttl < Duration::from_millis(1) {
        return Err(ttl_err("must be at least 1 ms".to_owned()));
    }
    if ttl > Duration::from_secs(365 * 24 * 3600) {
        return Err(ttl_err("must be at most one year".to_owned()));
    }
    let drift = drift(ttl, drift_factor);
    // Saturating: the minimum validity is the caller's and may be anything, `Duration::MAX`
    // too (which overflowed here: a panic instead of this error).
    if ttl <= drift.saturating_add(min_validity) {
        return Err(ttl_err(format!(
            "must exceed the drift allowance {drift:?} plus the minimum validity {min_validity:?}"
        )));
    }
    if !node_timeout.is_zero() && ttl <= node_timeout {
        return Err(ttl_err(format!(
            "must exceed the node timeout {node_timeout:?}"
        )));
    }
    Ok(())
}

/// Everything a [`Redlock`](crate::Redlock) needs besides its nodes.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Time-to-live of a lock on each node. Default: [`DEFAULT_TTL`].
    pub ttl: Duration,
    /// Drift allowance as a fraction of the TTL; 2 ms are always added.
    /// Default: [`DEFAULT_DRIFT_FACTOR`].
    pub drift_factor: f64,
    /// Per-node bound on one request. Default: [`DEFAULT_NODE_TIMEOUT`].
    pub node_timeout: Duration,
    /// Bound on opening a connection. Default: [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
    /// An acquisition whose validity is not above this fails with `ValidityExhausted`.
    /// Default: [`DEFAULT_MIN_VALIDITY`].
    pub min_validity: Duration,
    /// How `acquire` retries. Default: [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// Prefix of every key this crate writes. Default: [`DEFAULT_KEY_PREFIX`].
    pub key_prefix: String,
    /// Longest resource name accepted, in bytes. Default: [`DEFAULT_MAX_RESOURCE_LEN`].
    pub max_resource_len: usize,
    /// Whether each grant issues per-node claim stamps ([`Lock::claims`](crate::Lock::claims),
    /// the basis of fencing). Turning them off makes a single-resource acquire a plain
    /// `SET NX PX` — the cheapest request Redis serves — for locks that are never fenced.
    /// Default: `true`.
    pub claim_stamps: bool,
    /// Whether an attempt that races other clients' waiters for a lock just released goes
    /// through one node first, the same for every client (chosen by hashing node names and the
    /// resource; clients agree when they address the nodes alike): refused there, it asks no
    /// other node; granted there, it asks the rest. This keeps racers from splitting the nodes'
    /// votes so that none reaches a quorum, and spares the nodes the losers' requests, for one
    /// more round trip on the winner's acquire. When that node has not answered within a
    /// quarter of the node timeout, the others are asked anyway; a node that fails or misses its
    /// whole budget is passed over for 10 s, one that refuses while a quorum of the others
    /// grants for 1 s.
    /// Uncontended acquires always ask every node at once. Default: `true`.
    pub race_via_first_node: bool,
    /// How often a [`LockGuard`](crate::LockGuard) renews its lock. `None` = TTL/3; at most half
    /// of the validity a renewal leaves (TTL − drift allowance). Each renewal is scheduled 0–20 %
    /// early at random, so locks taken together spread out. Default: `None`.
    pub renew_every: Option<Duration>,
    /// Longest a guard renews a lock; after that its lost signal fires and renewal stops.
    /// `Duration::MAX` turns the limit off (the guard renews until it is released or the lock
    /// is lost; see [`RedlockBuilder::no_max_hold`](crate::RedlockBuilder::no_max_hold)).
    /// Default: [`DEFAULT_MAX_HOLD`].
    pub max_hold: Duration,
    /// When set, a node whose server restarted — or lost its identity record (its data) — less
    /// than this ago counts towards no acquire quorum, whatever data it kept: a node restored
    /// from an older snapshot, or killed with AOF `everysec`, may lack a live lock key. Learned
    /// from `INFO server` (`uptime_in_seconds`) when a connection opens; the ACL user needs
    /// `+info`. New servers are quarantined too. Set it to at least the longest TTL any client
    /// uses (`build()` logs a warning when it is shorter than this client's TTL). Default: `None` (see docs/leases.md for the trade-off).
    pub restart_quarantine: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_TTL,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            min_validity: DEFAULT_MIN_VALIDITY,
            retry: RetryPolicy::default(),
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            max_resource_len: DEFAULT_MAX_RESOURCE_LEN,
            claim_stamps: true,
            race_via_first_node: true,
            renew_every: None,
            max_hold: DEFAULT_MAX_HOLD,
            restart_quarantine: None,
        }
    }
}

/// How [`Redlock::acquire`](crate::Redlock::acquire) retries a busy or unreachable lock.
///
/// Always bounded: by a number of attempts, a deadline, or both (whichever comes first).
/// Between attempts it sleeps `delay ± jitter/2`, uniformly at random, so that contenders
/// do not retry in lock-step. Each attempt uses a fresh token.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Maximum attempts including the first. Default: [`DEFAULT_RETRY_ATTEMPTS`].
    ///
    /// Counted are the first attempt, the retry right after subscribing to the lock's release
    /// notifications, and every attempt after a pause slept out. Attempts made because a
    /// release was heard are not counted (a busy lock is released far more often than the
    /// delay) until `max_attempts × (delay + jitter/2 + node timeout)` (or the `deadline`, if
    /// sooner) has passed since the call began; after that they count like any other.
    pub max_attempts: Option<u32>,
    /// No attempt starts after this much time since the call began. A pause that would cross
    /// it ends the call, unless a release notification can end it first: the waiter then waits
    /// for one until the deadline. Default: none.
    pub deadline: Option<Duration>,
    /// Base delay between attempts. Default: [`DEFAULT_RETRY_DELAY`].
    pub delay: Duration,
    /// Width of the uniform jitter around `delay`. Default: [`DEFAULT_RETRY_JITTER`].
    pub jitter: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: Some(DEFAULT_RETRY_ATTEMPTS),
            deadline: None,
            delay: DEFAULT_RETRY_DELAY,
            jitter: DEFAULT_RETRY_JITTER,
        }
    }
}

impl RetryPolicy {
    /// Exactly one attempt.
    pub fn once() -> Self {
        Self::attempts(1)
    }

    /// At most `n` attempts, default delay and jitter.
    pub fn attempts(n: u32) -> Self {
        Self {
            max_attempts: Some(n),
            ..Self::default()
        }
    }

    /// Attempts until `deadline` has passed since the call began (no attempt limit).
    pub fn deadline(deadline: Duration) -> Self {
        Self {
            max_attempts: None,
            deadline: Some(deadline),
            ..Self::default()
        }
    }

    /// Also bound by a deadline.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the base delay and jitter. Any durations are accepted: times computed from them
    /// that would overflow saturate (a `Duration::MAX` delay waits for ever, or until the
    /// deadline).
    #[must_use]
    pub fn with_delay(mut self, delay: Duration, jitter: Duration) -> Self {
        self.delay = delay;
        self.jitter = jitter;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        match (self.max_attempts, self.deadline) {
            (None, None) => Err("set max_attempts, a deadline, or both".into()),
            (Some(0), _) => Err("max_attempts must be at least 1".into()),
            (_, Some(d)) if d.is_zero() => Err("deadline must be positive".into()),
            _ => Ok(()),
        }
    }

    /// Whether the policy allows one attempt only (`try_acquire`): such a call neither waits in
    /// nor joins the client's queue of acquirers.
    pub(crate) fn single_attempt(&self) -> bool {
        self.max_attempts == Some(1)
    }

    /// How long a waiter may queue for its turn behind this client's other waiters: the
    /// deadline if set, else roughly the time its attempts would have taken.
    pub(crate) fn wait_limit(&self, node_timeout: Duration) -> Duration {
        self.deadline
            .unwrap_or_else(|| self.attempts_time(self.max_attempts.unwrap_or(1), node_timeout))
    }

    /// The longest that `attempts` attempts and their pauses would take:
    /// `attempts × (delay + jitter/2 + node_timeout)`.
    fn attempts_time(&self, attempts: u32, node_timeout: Duration) -> Duration {
        // Saturating: the builder accepts any delay and jitter, `Duration::MAX` included.
        self.delay
            .saturating_add(self.jitter / 2)
            .saturating_add(node_timeout)
            .saturating_mul(attempts)
    }

    /// How long attempts made on a release heard go uncounted: the longest that the policy's
    /// attempts and pauses would take, `max_attempts × (delay + jitter/2 + node_timeout)`, or
    /// the deadline if sooner. `Duration::MAX` for a policy without `max_attempts` (its
    /// deadline alone bounds it).
    pub(crate) fn release_limit(&self, node_timeout: Duration) -> Duration {
        let Some(max) = self.max_attempts else {
            return Duration::MAX;
        };
        let limit = self.attempts_time(max, node_timeout);
        self.deadline.map_or(limit, |d| limit.min(d))
    }

    /// For a waiter woken early by release notifications, when [`next_delay`](Self::next_delay)
    /// found no pause because it would cross the deadline: the time left until the deadline,
    /// to wait for a release in (an attempt follows only a release heard; a pause that reaches
    /// the deadline ends the call). `None` when the attempts are used up, the policy has no
    /// deadline, or it has passed.
    pub(crate) fn pause_cut_at_deadline(&self, attempts: u32, spent: Duration) -> Option<Duration> {
        if self.max_attempts.is_some_and(|max| attempts >= max) {
            return None;
        }
        self.deadline?
            .checked_sub(spent)
            .filter(|left| !left.is_zero())
    }

    /// The pause before the next attempt, or `None` when the policy is used up.
    /// `attempts` = attempts made so far, `spent` = time since the call began.
    pub(crate) fn next_delay(
        &self,
        attempts: u32,
        spent: Duration,
        unit: f64, // uniform in [0, 1)
    ) -> Option<Duration> {
        if self.max_attempts.is_some_and(|max| attempts >= max) {
            return None;
        }
        let half = self.jitter / 2;
        let spread = Duration::try_from_secs_f64(self.jitter.as_secs_f64() * unit.clamp(0.0, 1.0))
            .unwrap_or(self.jitter);
        let delay = self.delay.saturating_sub(half).saturating_add(spread);
        match self.deadline {
            Some(deadline) if spent.saturating_add(delay) >= deadline => None,
            _ => Some(delay),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enormous_delays_saturate_instead_of_overflowing() {
        let p = RetryPolicy::attempts(3).with_delay(Duration::MAX, Duration::MAX);
        assert_eq!(p.wait_limit(Duration::from_millis(50)), Duration::MAX);
        assert_eq!(
            p.next_delay(1, Duration::from_secs(1), 0.99),
            Some(Duration::MAX)
        );
        let p =
            RetryPolicy::deadline(Duration::from_secs(2)).with_delay(Duration::MAX, Duration::ZERO);
        assert_eq!(p.next_delay(1, Duration::from_secs(1), 0.5), None);
    }

    #[test]
    fn attempts_on_releases_heard_go_uncounted_for_the_time_the_attempts_would_take() {
        let ms = Duration::from_millis;
        let p = RetryPolicy::attempts(3).with_delay(ms(100), ms(50));
        assert_eq!(p.release_limit(ms(50)), ms(3 * (100 + 25 + 50)));
        assert_eq!(
            p.clone().with_deadline(ms(200)).release_limit(ms(50)),
            ms(200)
        );
        assert_eq!(
            RetryPolicy::deadline(ms(200)).release_limit(ms(50)),
            Duration::MAX
        );
        let forever = RetryPolicy::attempts(3).with_delay(Duration::MAX, Duration::MAX);
        assert_eq!(forever.release_limit(ms(50)), Duration::MAX);
    }

    #[test]
    fn retry_is_bounded_by_attempts_and_deadline() {
        let p = RetryPolicy::attempts(3).with_delay(Duration::from_millis(100), Duration::ZERO);
        assert_eq!(
            p.next_delay(1, Duration::ZERO, 0.5),
            Some(Duration::from_millis(100))
        );
        assert_eq!(p.next_delay(3, Duration::ZERO, 0.5), None);
        let p = RetryPolicy::deadline(Duration::from_millis(250));
        assert!(
            p.next_delay(1_000_000, Duration::from_millis(100), 0.0)
                .is_some()
        );
        assert_eq!(p.next_delay(1, Duration::from_millis(240), 0.0), None);
        assert!(RetryPolicy::default().validate().is_ok());
        let unbounded = RetryPolicy {
            max_attempts: None,
            ..RetryPolicy::default()
        };
        assert!(unbounded.validate().is_err());
        assert!(RetryPolicy::attempts(0).validate().is_err());
    }

    #[test]
    fn jitter_stays_in_range() {
        let p = RetryPolicy::default();
        for unit in [0.0, 0.25, 0.5, 0.999] {
            let d = p.next_delay(1, Duration::ZERO, unit).unwrap();
            assert!(
                d >= Duration::from_millis(50) && d < Duration::from_millis(150),
                "{d:?}"
            );
        }
    }

    #[test]
    fn a_pause_cut_at_the_deadline_is_what_is_left_of_it() {
        let ms = Duration::from_millis;
        let wait = RetryPolicy::deadline(ms(3000)).with_delay(ms(5000), Duration::ZERO);
        assert_eq!(wait.next_delay(1, ms(1), 0.5), None);
        assert_eq!(wait.pause_cut_at_deadline(1, ms(1)), Some(ms(2999)));
        assert_eq!(wait.pause_cut_at_deadline(1, ms(3000)), None);
        assert_eq!(
            RetryPolicy::attempts(3).pause_cut_at_deadline(1, ms(1)),
            None
        );
        let both = RetryPolicy::attempts(2).with_deadline(ms(100));
        assert_eq!(both.pause_cut_at_deadline(1, ms(10)), Some(ms(90)));
        assert_eq!(both.pause_cut_at_deadline(2, ms(10)), None);
    }
}
