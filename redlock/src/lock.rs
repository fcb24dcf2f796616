//! A held lock and what `release` reports.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::claim::Claim;
use crate::error::{NodeOutcome, NodeReport};
use crate::token::Token;

/// A TTL in the unit the nodes take (`PX`, ms), saturating.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

/// A validity deadline kept on two clocks. Timers run on the monotonic clock, which stops
/// while the machine is suspended — but Redis keys keep expiring then. On Linux the deadline is
/// also kept on `CLOCK_BOOTTIME`, which counts suspended time, and validity is the smaller of
/// the two: after a suspend, a lock reports the time actually left, usually none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    mono: Instant,
    boot: Option<Duration>,
}

impl Deadline {
    /// `left` after `start` (both clocks read at once by [`Deadline::clocks`], usually in the
    /// past).
    pub(crate) fn after(start: (Instant, Option<Duration>), left: Duration) -> Self {
        // On the boot clock from its own reading at `start`: a suspend since then (the answers
        // read after the machine woke up) counts against the validity, the keys expired on the
        // nodes meanwhile (test `a_suspend_before_the_deadline_is_made_counts_against_it`).
        let mono = start.0 + left;
        let boot = start.1.map(|b| b + left);
        Self { mono, boot }
    }

    /// Validity left now: the smaller of what the two clocks say.
    pub(crate) fn remaining(&self) -> Duration {
        let (now, boot) = Self::clocks();
        self.remaining_at(now, boot)
    }

    /// Both clocks read once, for checking many deadlines against the same moment.
    pub(crate) fn clocks() -> (Instant, Option<Duration>) {
        (Instant::now(), boot_now())
    }

    /// Validity left at the moment `clocks()` returned `(now, boot)`.
    pub(crate) fn remaining_at(&self, now: Instant, boot: Option<Duration>) -> Duration {
        let mono = self.mono.saturating_duration_since(now);
        match (self.boot, boot) {
            (Some(deadline), Some(now)) => mono.min(deadline.saturating_sub(now)),
            _ => mono,
        }
    }

    /// The deadline on the monotonic clock alone.
    pub(crate) fn mono(&self) -> Instant {
        self.mono
    }

    /// Whether no validity is left.
    pub(crate) fn passed(&self) -> bool {
        self.remaining().is_zero()
    }

    /// The deadline as a monotonic instant, pulled in when a suspend ate into it (the two
    /// clocks otherwise differ by nanoseconds, which must not make the deadline wobble).
    pub(crate) fn instant(&self) -> Instant {
        let now = Instant::now();
        let mono_left = self.mono.saturating_duration_since(now);
        let left = self.remaining();
        if left + Duration::from_millis(1) < mono_left {
            now + left
        } else {
            self.mono
        }
    }
}

/// `now + d`, or a time a century away when that does not fit (`Duration::MAX` as "forever").
pub(crate) fn far_after(now: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(d.min(CENTURY))
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

/// Time since boot including suspended time (`CLOCK_BOOTTIME`), where the platform has it.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn boot_now() -> Option<Duration> {
    // A simulation runs on tokio's paused clock, which the boot clock does not follow.
    if crate::det::simulated() {
        return None;
    }
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    let now = Duration::new(
        u64::try_from(t.tv_sec()).ok()?,
        u32::try_from(t.tv_nsec()).ok()?,
    );
    #[cfg(test)]
    let now = now + suspend::slept();
    Some(now)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boot_now() -> Option<Duration> {
    let _ = crate::det::simulated();
    None
}

/// Simulated suspends for the unit tests: time that `CLOCK_BOOTTIME` counted while the
/// monotonic clock stood still.
#[cfg(test)]
pub(crate) mod suspend {
    use std::cell::Cell;
    use std::time::Duration;

    thread_local! {
        // Per thread, so a simulated suspend cannot disturb tests running beside it.
        static SLEPT: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    pub(crate) fn slept() -> Duration {
        SLEPT.with(Cell::get)
    }

    /// Adds `d` of suspended time, as seen from this thread.
    pub(crate) fn suspend(d: Duration) {
        SLEPT.with(|s| s.set(s.get() + d));
    }
}

/// A lock held on a quorum of nodes.
///
/// Plain data: dropping it does **not** release anything — the keys then expire after the TTL.
/// Give it back with [`Redlock::release`](crate::Redlock::release) as soon as the work is done.
#[must_use = "a dropped Lock stays held on the nodes until its TTL expires; release it"]
pub struct Lock {
    pub(crate) resources: Arc<[String]>,
    pub(crate) keys: Arc<[String]>,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    /// The validity every phase of this lock must leave (its request's, or the client's).
    pub(crate) min_validity: Duration,
    pub(crate) valid_until: Deadline,
    pub(crate) claims: Vec<Claim>,
    /// Every grant's claim, those that arrived after the quorum decision included.
    pub(crate) granted: Option<crate::engine::Granted>,
    /// The node list of the client that took it.
    pub(crate) origin: Arc<str>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("resources", &self.resources)
            .field("token", &self.token)
            .field("remaining", &self.remaining())
            .field("claims", &self.claims)
            .finish()
    }
}

impl Lock {
    /// The lock's token (redacted in `Debug`; see [`Token::expose`]).
    ///
    /// Reading it means it may be handed on (see [`Redlock::try_acquire_with_token`]): the
    /// lock's release then goes to every node, even one none of its own requests reached.
    /// Unless the lock was itself taken with `try_acquire_with_token`, a re-claim with this
    /// token waits for the deletes of a failed release of this lock only while the release
    /// waits for their answers (about twice the node timeout plus one second); later ones can
    /// take its keys: after a release that failed, or succeeded without every node's answer
    /// ([`ReleaseReport::unknown`] above 0), re-take the lock with a fresh token.
    ///
    /// [`Redlock::try_acquire_with_token`]: crate::Redlock::try_acquire_with_token
    pub fn token(&self) -> &Token {
        if let Some(granted) = &self.granted {
            granted.pin();
        }
        &self.token
    }

    /// The resource names (without the key prefix), in the order given.
    pub fn resources(&self) -> &[String] {
        &self.resources
    }

    /// The TTL each node was given.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The local deadline of the lock's validity: TTL − elapsed − drift after the last
    /// successful acquire or extend, on the monotonic clock — pulled in by any time the machine
    /// spent suspended since (on Linux). Work must finish before it.
    pub fn valid_until(&self) -> std::time::Instant {
        self.valid_until.instant().into_std()
    }

    /// Validity left now (zero once it has passed). On Linux, time the machine spent suspended
    /// counts: the keys kept expiring meanwhile.
    pub fn remaining(&self) -> Duration {
        self.valid_until.remaining()
    }

    /// Whether validity is left.
    pub fn is_valid(&self) -> bool {
        !self.valid_until.passed()
    }

    /// The granting quorum's `(node, stamp)` claims, sorted by node name.
    pub fn claims(&self) -> &[Claim] {
        &self.claims
    }

    /// The lock's fencing token, for the protected resource to check (`docs/fencing.md`): the
    /// claims of every node that granted it so far — the quorum's, and those that arrived after
    /// the decision (the more nodes a token names, the more likely it shares one with the
    /// resource's high water after nodes restarted without their data; a token that shares
    /// none is refused as `Unrelated`).
    ///
    /// `None` when the lock has no claims (`claim_stamps(false)`), or when they cannot form a
    /// token: more than [`fencing::MAX_CLAIMS`] nodes, or a node name that is empty or longer
    /// than [`fencing::MAX_NODE_NAME_LEN`] bytes.
    pub fn fence(&self) -> Option<fencing::FenceToken> {
        fence_of(self.granted.as_ref(), &self.claims)
    }

    /// [`fence`](Self::fence) once every node has answered the acquire or run out of time:
    /// the most nodes this lock's token can name. Right after `acquire` returns, `fence()`
    /// names the quorum that decided; the slower nodes' grants arrive later. A resource's high
    /// water learns only the names it is shown, and once every one of those nodes has restarted
    /// without its data (new names) it refuses every later token as `Unrelated` until an
    /// operator resets it — so fence the first write with this.
    ///
    /// Waits until every node of the acquire's last attempt answered or its node budget (the
    /// node timeout; longer while the node's connection is being opened) ran out, counted
    /// from that attempt's start: with every node answering, the slowest one's round trip.
    ///
    /// # Cancel safety
    /// Safe: it only waits.
    pub async fn fence_settled(&self) -> Option<fencing::FenceToken> {
        settle_grants(self.granted.as_ref()).await;
        self.fence()
    }
}

/// Waits until every node answered the acquire of `granted` (or ran out of time).
pub(crate) async fn settle_grants(granted: Option<&crate::engine::Granted>) {
    if let Some(granted) = granted {
        granted.answered().await;
    }
}

/// The fence token of a grant: every claim received so far (`granted`), else the quorum's.
pub(crate) fn fence_of(
    granted: Option<&crate::engine::Granted>,
    claims: &[Claim],
) -> Option<fencing::FenceToken> {
    let all = granted.map(crate::engine::Granted::claims);
    let claims = all.as_deref().unwrap_or(claims);
    if claims.is_empty() {
        return None;
    }
    fencing::FenceToken::new(claims.iter().map(|c| (Arc::clone(&c.node), c.stamp_us)))
        .map_err(|e| tracing::warn!(error = %e, "lock claims do not form a fence token"))
        .ok()
}

/// What `release` found on each node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReleaseReport {
    /// Per node: `Granted` = our key was deleted there, `Refused` = it was already gone (or
    /// someone else's, or the lock's requests never left this client for that node: they
    /// waited for it and were withdrawn unsent), `Failed`/`TimedOut` = unknown, `Pending` =
    /// still in flight when the release was decided (finished in the background).
    pub nodes: Vec<NodeReport>,
}

impl ReleaseReport {
    /// Nodes on which our key was still present and has been deleted.
    pub fn released(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Confirmed))
    }

    /// Nodes that confirmed they no longer held our key (expired or taken over).
    pub fn not_held(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Refused))
    }

    /// Nodes whose outcome is unknown or still pending.
    pub fn unknown(&self) -> usize {
        self.nodes.len() - self.released() - self.not_held()
    }

    /// True when no node still held the lock: it had expired everywhere that answered.
    pub fn was_expired(&self) -> bool {
        self.released() == 0
    }

    fn count(&self, f: impl Fn(&NodeOutcome) -> bool) -> usize {
        self.nodes.iter().filter(|r| f(&r.outcome)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suspend_counts_against_validity() {
        let d = Deadline::after(Deadline::clocks(), Duration::from_secs(10));
        assert!(d.remaining() > Duration::from_secs(9));
        // The machine sleeps 20 s: the monotonic clock stands still, the keys expire.
        suspend::suspend(Duration::from_secs(20));
        assert_eq!(d.remaining(), Duration::ZERO);
        assert!(d.passed());
        assert!(d.instant() <= Instant::now());
    }

    /// A suspend between the start of a phase and its decision (the answers read after the
    /// machine woke up) counts against the validity as one after it does: the keys expired on
    /// the nodes meanwhile. Counted from the boot clock read when the deadline was made, a
    /// renewal round over a suspend gave the lock its whole validity again (found in review).
    #[test]
    fn a_suspend_before_the_deadline_is_made_counts_against_it() {
        let start = Deadline::clocks();
        suspend::suspend(Duration::from_secs(20));
        let d = Deadline::after(start, Duration::from_secs(10));
        assert!(d.passed(), "{:?} left after a 20 s suspend", d.remaining());
    }
}
