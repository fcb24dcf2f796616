//! [`LockRequest`]: the options of one lock (TTL, how long to wait, retry policy, minimum
//! validity) without a second client, and the three ways to take it.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use crate::config::{RetryPolicy, check_ttl};
use crate::core::{Core, Terms};
use crate::error::{ConfigError, Error, LostReason};
use crate::lease::{Lease, LockGuard};
use crate::lock::Lock;
use crate::nodes::Nodes;

/// One lock to take, with its own options; made by [`Redlock::lock`](crate::Redlock::lock)
/// or [`Redlock::lock_many`](crate::Redlock::lock_many). Options not set are the client's
/// ([`Config`](crate::Config)).
///
/// ```no_run
/// # async fn demo(rl: redlock::Redlock) -> Result<(), redlock::Error> {
/// use std::time::Duration;
/// // A 60 s lock, waiting up to 5 s for the current holder to leave.
/// let lock = rl
///     .lock("reports:daily")
///     .ttl(Duration::from_secs(60))
///     .wait(Duration::from_secs(5))
///     .acquire()
///     .await?;
/// rl.release(lock).await?;
/// # Ok(()) }
/// ```
///
/// The terminal methods ([`acquire`](Self::acquire), [`guard`](Self::guard),
/// [`with_lock`](Self::with_lock)) take the request by value, so a closure can return
/// `rl.lock(r).acquire()` as its future; clone a request to take it again (each time as a new
/// lock). Options are checked when it is taken; a bad one is an
/// [`Error::Config`] and nothing is sent.
#[must_use = "a LockRequest does nothing until acquire(), guard() or with_lock() is awaited"]
#[derive(Clone)]
pub struct LockRequest {
    core: Arc<Core<Nodes>>,
    resources: Vec<String>,
    ttl: Option<Duration>,
    wait: Option<Duration>,
    retry: Option<RetryPolicy>,
    min_validity: Option<Duration>,
}

impl std::fmt::Debug for LockRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockRequest")
            .field("resources", &self.resources)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("retry", &self.retry)
            .field("min_validity", &self.min_validity)
            .finish()
    }
}

impl LockRequest {
    pub(crate) fn new(core: Arc<Core<Nodes>>, resources: Vec<String>) -> Self {
        Self {
            core,
            resources,
            ttl: None,
            wait: None,
            retry: None,
            min_validity: None,
        }
    }

    /// The TTL of this lock: what every node is given (`PX`), what its validity is computed
    /// from, and what every extension and renewal re-arms. It must exceed the drift allowance
    /// (TTL·drift_factor + 2 ms) plus the minimum validity, and the node timeout — the rule the
    /// client's own TTL was built with — and be at most one year. Default: the client's
    /// [`Config::ttl`](crate::Config::ttl).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to keep trying while the lock is held elsewhere (or nodes fail): attempts go
    /// on, woken early by release notifications, until this much time has passed since the
    /// call began; then the last attempt's error ([`Error::Busy`] while it is held) is
    /// returned. `Duration::ZERO` = exactly one attempt, like
    /// [`Redlock::try_acquire`](crate::Redlock::try_acquire) (it neither joins nor waits for
    /// the client's FIFO queue of acquirers).
    ///
    /// It replaces the attempt limit and deadline of the retry policy (the client's, or the
    /// one given with [`retry`](Self::retry), whichever order they are called in) and keeps
    /// its delay and jitter. Default: the policy alone decides.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The retry policy of this lock. Default: the client's
    /// [`Config::retry`](crate::Config::retry).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// The validity an acquisition of this lock must leave (else
    /// [`Error::ValidityExhausted`]); its extensions and renewals are held to the same.
    /// Default: the client's [`Config::min_validity`](crate::Config::min_validity).
    pub fn min_validity(mut self, min: Duration) -> Self {
        self.min_validity = Some(min);
        self
    }

    /// The resources this request locks.
    pub fn resources(&self) -> &[String] {
        &self.resources
    }

    /// The terms and retry policy in force, checked.
    fn resolve(&self) -> Result<(Terms, RetryPolicy), Error> {
        let c = &self.core.config;
        let terms = Terms {
            ttl: self.ttl.unwrap_or(c.ttl),
            min_validity: self.min_validity.unwrap_or(c.min_validity),
        };
        if self.ttl.is_some() || self.min_validity.is_some() {
            check_ttl(
                terms.ttl,
                c.drift_factor,
                c.node_timeout,
                terms.min_validity,
            )?;
        }
        let base = self.retry.as_ref().unwrap_or(&c.retry);
        let policy = match self.wait {
            None => base.clone(),
            Some(wait) if wait.is_zero() => RetryPolicy::once(),
            Some(wait) => RetryPolicy {
                max_attempts: None,
                deadline: Some(wait),
                ..base.clone()
            },
        };
        policy.validate().map_err(ConfigError::InvalidRetry)?;
        Ok((terms, policy))
    }

    /// Takes the lock, retrying per the request's options, and returns it as a plain [`Lock`]
    /// (not renewed; release it with [`Redlock::release`](crate::Redlock::release)).
    ///
    /// # Errors
    /// [`Error::Config`] for an unusable option (nothing is sent); [`Error::InvalidResource`]
    /// for bad names (empty, too long, repeated, more than
    /// [`MAX_RESOURCES_PER_LOCK`](crate::MAX_RESOURCES_PER_LOCK)); otherwise the last
    /// attempt's error: [`Error::Busy`], [`Error::QuorumUnreachable`] or
    /// [`Error::ValidityExhausted`].
    ///
    /// # Cancel safety
    /// As [`Redlock::acquire`](crate::Redlock::acquire): grants of an abandoned attempt are
    /// released in the background.
    pub async fn acquire(self) -> Result<Lock, Error> {
        let (terms, policy) = self.resolve()?;
        self.core
            .acquire_on(self.resources, &policy, None, terms)
            .await
    }

    /// Takes the lock and hands it to the renewal driver (see
    /// [`Redlock::guard`](crate::Redlock::guard)): it is renewed with its own TTL until the
    /// guard is released, dropped, or the lock is lost.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire); once the guard exists it is returned.
    pub async fn guard(self) -> Result<LockGuard, Error> {
        let core = Arc::clone(&self.core);
        let lock = self.acquire().await?;
        Ok(core.guard(lock))
    }

    /// Takes the lock, runs `work` with a [`Lease`] while the lock is renewed, and releases it
    /// on every exit path — success, error, panic or loss.
    ///
    /// If the lock is lost while `work` runs (renewal failed, validity passed, max hold
    /// reached), `work` is dropped at its next await point and the call returns
    /// [`Error::LeaseLost`] — also when `work` finished without reaching another await (it
    /// blocked the thread past the validity): its result is dropped then. A panic in `work`
    /// releases the lock and then resumes unwinding.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), plus [`Error::LeaseLost`].
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and the guard, which releases the lock in the
    /// background.
    pub async fn with_lock<F, Fut, T>(self, work: F) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.guard().await?;
        let lease = guard.lease();
        let work = std::panic::AssertUnwindSafe(work(lease.clone())).catch_unwind();
        let outcome = tokio::select! {
            biased;
            reason = lease.lost() => Err(reason),
            done = work => Ok(done),
        };
        // Work that ends without another await can outlive the lock unseen: blocking the
        // runtime's only thread past the validity stops the renewals and the driver that fires
        // the lost signal alike, and the select then sees only the work's result (test
        // `renewal_attacks::with_lock_reports_a_loss_during_work_that_never_awaits_again`: the
        // result came back as done under the lock while a rival held it). So the lease is
        // asked once more, on both clocks, before the release makes it lost anyway.
        let outcome = match outcome {
            Ok(Ok(_)) if lease.is_lost() => Err(lease.reason().unwrap_or(LostReason::Expired)),
            other => other,
        };
        let released = guard.release().await;
        if let Err(e) = &released {
            tracing::warn!(error = %e, "with_lock: release after the work failed; the lock expires with its TTL");
        }
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(reason) => Err(Error::LeaseLost {
                resources: Arc::clone(lease.held_resources()),
                reason,
            }),
        }
    }
}
