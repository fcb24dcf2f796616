//! `Redlock`: the public client, a thin facade over `Core`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use crate::backend::Backend;
use crate::background::Background;
use crate::config::{Config, RetryPolicy};
use crate::core::Core;
use crate::error::{Error, NodeOutcome, NodeReport};
use crate::lease::{Lease, LockGuard};
use crate::lock::{Lock, ReleaseReport};
use crate::nodes::Nodes;
use crate::request::LockRequest;
use crate::token::Token;

/// A Redlock client over N independent Redis masters. Cheap to clone; `Send + Sync`.
///
/// ```no_run
/// # async fn demo() -> Result<(), redlock::Error> {
/// use std::time::Duration;
/// let rl = redlock::Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .ttl(Duration::from_secs(10))
///     .build()?;
/// let lock = rl.acquire("orders:42").await?;
/// // … work that must finish before lock.valid_until() …
/// rl.release(lock).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redlock {
    core: Arc<Core<Nodes>>,
}

/// A release not started yet: its future was dropped before its first poll. It starts the
/// release in a task of its own, so that the lock does not stay for its TTL: it did, since
/// nothing was sent (test `api_attacks::a_release_future_dropped_before_its_first_poll_still_
/// releases`). (Starting the release when `release` is called instead made a started release
/// hold a connection's in-flight place until its future was polled: two releases started and
/// awaited later left no place for the client's next requests.)
struct Unstarted {
    core: Arc<Core<Nodes>>,
    lock: Option<Lock>,
}

impl Drop for Unstarted {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let core = Arc::clone(&self.core);
                let task = core.backend.background().map(Background::task);
                let release = async move {
                    let _task = task;
                    drop(core.release(lock).await);
                };
                crate::engine::start_then_spawn(&rt, Box::pin(release));
            }
            Err(_) => tracing::warn!(
                resources = ?lock.resources(),
                "a release dropped outside a tokio runtime before it started: its keys expire with their TTL"
            ),
        }
    }
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = &self.core.backend;
        let names: Vec<&str> = (0..backend.len()).map(|i| &**backend.name(i)).collect();
        f.debug_struct("Redlock")
            .field("nodes", &names)
            .field("quorum", &self.quorum())
            .field("config", &self.core.config)
            .finish()
    }
}

fn owned<I, S>(resources: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    resources
        .into_iter()
        .map(|s| s.as_ref().to_owned())
        .collect()
}

impl Redlock {
    pub(crate) fn from_core(core: Core<Nodes>) -> Self {
        Self {
            core: Arc::new(core),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.core.config
    }

    /// Nodes that must grant: ⌊N/2⌋ + 1.
    pub fn quorum(&self) -> usize {
        self.core.quorum()
    }

    /// The nodes' display names, in configuration order.
    pub fn node_names(&self) -> Vec<Arc<str>> {
        let backend = &self.core.backend;
        (0..backend.len())
            .map(|i| backend.name(i).clone())
            .collect()
    }

    /// The node a contended acquire of `resource` asks first right now, as an index into the
    /// nodes in configuration order (see docs/leases.md, "Hand-off without waiting out a retry
    /// delay"): the node every client of the same servers ranks first for it (by the servers'
    /// identities, however the client addresses them), unless this client passes it over for
    /// the moment (it failed, its connection is not open while another node's is, or it is far
    /// from this client). Until the client's connection to a node has read the server's
    /// identity record, that node ranks by its configured name or address: before the client
    /// has connected, the answer may differ from other clients'.
    /// `None` with one node, or with `race_via_first_node(false)`.
    ///
    /// A hot lock's racing attempts all go through this node, so it is where the lock's
    /// contention shows first; two clients that answer differently for a resource are racing
    /// through different nodes.
    pub fn first_node(&self, resource: &str) -> Option<usize> {
        if !self.core.config.race_via_first_node {
            return None;
        }
        self.core.first_node_index(resource)
    }

    /// A request for a lock on `resource` with options of its own — TTL, how long to wait,
    /// retry policy, minimum validity — taken with [`LockRequest::acquire`],
    /// [`LockRequest::guard`] or [`LockRequest::with_lock`]. Options not set are the client's.
    ///
    /// ```no_run
    /// # async fn demo(rl: redlock::Redlock) -> Result<(), redlock::Error> {
    /// use std::time::Duration;
    /// let guard = rl.lock("jobs:nightly").ttl(Duration::from_secs(30)).guard().await?;
    /// // … renewed with its own 30 s TTL until released …
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, resource: &str) -> LockRequest {
        LockRequest::new(Arc::clone(&self.core), vec![resource.to_owned()])
    }

    /// A request for one lock on several resources: on each node, all of them or none (one
    /// script call). As [`Redlock::lock`] otherwise.
    pub fn lock_many<I, S>(&self, resources: I) -> LockRequest
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        LockRequest::new(Arc::clone(&self.core), owned(resources))
    }

    /// Acquires `resource`, retrying per the configured [`RetryPolicy`]. The same as
    /// `self.lock(resource).acquire()`.
    ///
    /// # Errors
    /// The last attempt's error: [`Error::Busy`], [`Error::QuorumUnreachable`] or
    /// [`Error::ValidityExhausted`] when the policy is used up; [`Error::InvalidResource`]
    /// at once for a bad name.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the attempt in flight: grants that arrive (or have arrived)
    /// are released in the background, so keys live no longer than one node round trip more —
    /// or, for a request that was waiting for a connection being opened, until that connection
    /// is open (at most the connect timeout), when the release follows it.
    pub async fn acquire(&self, resource: &str) -> Result<Lock, Error> {
        self.lock(resource).acquire().await
    }

    /// Acquires several resources as one lock: on each node, all of them or none (one script
    /// call). Retries per the configured policy. The same as
    /// `self.lock_many(resources).acquire()`.
    ///
    /// # Errors
    /// As [`Redlock::acquire`]; also
    /// [`ResourceError::Duplicate`](crate::error::ResourceError::Duplicate) and
    /// [`ResourceError::TooMany`](crate::error::ResourceError::TooMany).
    ///
    /// # Cancel safety
    /// As [`Redlock::acquire`].
    pub async fn acquire_many<I, S>(&self, resources: I) -> Result<Lock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.lock_many(resources).acquire().await
    }

    /// Exactly one attempt (`self.lock(resource).wait(Duration::ZERO).acquire()`), made at
    /// once: it neither joins nor waits for the queue of this
    /// client's other acquirers of `resource` (which [`Redlock::acquire`] serves in FIFO order),
    /// so it can win while they are queued if the lock is free on the nodes at that moment.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::QuorumUnreachable`], [`Error::ValidityExhausted`] or
    /// [`Error::InvalidResource`].
    ///
    /// # Cancel safety
    /// As [`Redlock::acquire`].
    pub async fn try_acquire(&self, resource: &str) -> Result<Lock, Error> {
        self.lock(resource).wait(Duration::ZERO).acquire().await
    }

    /// Exactly one attempt on several resources (all-or-nothing per node).
    ///
    /// # Errors
    /// As [`Redlock::try_acquire`].
    ///
    /// # Cancel safety
    /// As [`Redlock::acquire`].
    pub async fn try_acquire_many<I, S>(&self, resources: I) -> Result<Lock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.lock_many(resources)
            .wait(Duration::ZERO)
            .acquire()
            .await
    }

    /// One attempt with a token you already hold — for example after an acquire whose outcome
    /// was unknown, or after a restart of a process that persisted [`Token::expose`]. Nodes
    /// where the key already holds this token re-arm it (idempotent); others grant if free.
    ///
    /// # Errors
    /// As [`Redlock::try_acquire`].
    ///
    /// When the attempt fails, is refused or is dropped, it deletes only what it created, on
    /// nodes that answered within their budget that they created every key: on a node where a
    /// key held your token already (a lock you, or whoever gave you the token, may still hold)
    /// it deletes nothing, nor on a node that did not answer in time. Keys it re-armed keep
    /// their longer expiry; keys it wrote where it deletes nothing stay until released with
    /// the token (take the lock again with it, then release) or until the TTL.
    ///
    /// Calls with one token on the same keys in this process (through any client, at any
    /// addresses of the servers) take turns: each first waits until what the earlier ones did
    /// on the nodes is done — their answers in, the cleanups of what they created answered —
    /// so that no cleanup can delete what this call takes. Each wait lasts at most the time the
    /// earlier attempt allows its nodes (its node timeout, longer while a connection is being
    /// opened) plus one second, a cleanup's grace, plus that time once more: about twice the
    /// node timeout plus one second. Such a cleanup also carries a deadline on each node's
    /// clock that ends before then, after which it deletes nothing (docs/protocol.md). Another
    /// process is not waited for.
    ///
    /// The release of a lock taken with this method is waited for the same way — also one
    /// started in the background by a dropped guard or a dropped `release` future, from the
    /// moment of the drop — its deletes
    /// carry deadlines on the nodes' clocks, and a call after a release whose deletes did not
    /// all answer waits until they did or those deadlines have surely passed — about twice the
    /// node timeout plus one second, plus `2 · drift_factor` of the time the lock was held (up
    /// to twice that when a node's answer to the acquire was still out at the release). That
    /// release sends no delete to a node the lock may have written on without the node's clock
    /// being read (it never answered the acquire with a grant or a refusal; never counted as
    /// confirming): what is there expires with the TTL. After a release of a lock taken with a
    /// fresh token whose token you read ([`Lock::token`]) that failed, or succeeded without
    /// every node's answer ([`ReleaseReport::unknown`] above 0), re-take it with a fresh token:
    /// such a release has no node clock to bound its deletes by, and is waited for only while
    /// it waits for their answers (a delete held up in a connection later replaced is sent
    /// again after that).
    ///
    /// [`ReleaseReport::unknown`]: crate::ReleaseReport::unknown
    ///
    /// # Cancel safety
    /// As [`Redlock::acquire`], with the cleanup limited as above.
    pub async fn try_acquire_with_token<I, S>(
        &self,
        resources: I,
        token: &Token,
    ) -> Result<Lock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.core
            .acquire(owned(resources), &RetryPolicy::once(), Some(token))
            .await
    }

    /// Re-arms the lock's TTL on every node where it still holds our token. Succeeds when a
    /// quorum extended it; the new validity counts from the start of this call.
    ///
    /// A failed extension never deletes anything: the lock keeps its previous
    /// [`Lock::valid_until`], and [`Lock::remaining`] tells what is left.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when a quorum no longer holds our token, [`Error::QuorumUnreachable`]
    /// when too many nodes failed, [`Error::ValidityExhausted`] when it took too long.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the lock as it was locally; nodes that already ran the
    /// extension keep the longer TTL (still owner-checked).
    pub async fn extend(&self, lock: &mut Lock) -> Result<(), Error> {
        self.core.extend(lock).await
    }

    /// Owner-checked delete on every node. Returns once enough nodes confirmed that no quorum
    /// can still hold the lock; slower nodes finish in the background. Releasing a lock that
    /// already expired is not an error (see [`ReleaseReport::was_expired`]).
    ///
    /// # Errors
    /// [`Error::QuorumUnreachable`] when too many nodes failed to answer; the keys there
    /// expire with their TTL. [`Error::ForeignLock`] for a lock taken by a client of other
    /// nodes (see [`Redlock::owns`]): nothing is sent, and the keys expire with their TTL.
    ///
    /// # Cancel safety
    /// The deletes are sent by a background task; dropping the future does not stop them. A
    /// future dropped before its first poll (a `select!` whose other branch was ready) starts
    /// the release in a task of its own, on the runtime it is dropped in (outside one nothing
    /// can be sent, and the keys expire with their TTL).
    pub fn release(
        &self,
        lock: Lock,
    ) -> impl Future<Output = Result<ReleaseReport, Error>> + Send + '_ {
        let mut unstarted = Unstarted {
            core: Arc::clone(&self.core),
            lock: Some(lock),
        };
        async move {
            let lock = unstarted.lock.take();
            match lock {
                Some(lock) => self.core.release(lock).await,
                None => unreachable!("a release future is polled to its start once"),
            }
        }
    }

    /// Hands a lock to the renewal driver: it is extended about every TTL/3 (see
    /// [`Config::renew_every`]) until the guard is released, the lock is lost, or
    /// [`Config::max_hold`] passes. Renewals of all guarded locks of this client are batched:
    /// one round trip per node per tick.
    ///
    /// Renewals re-arm the lock's own TTL ([`Lock::ttl`]), whichever client of the same nodes
    /// took it. The first renewal is scheduled from the lock's remaining validity: a lock
    /// guarded late in its life is renewed at once.
    ///
    /// Must be called inside a tokio runtime (the driver is a spawned task).
    ///
    /// # Errors
    /// [`Error::ForeignLock`] for a lock taken by a client of other nodes (see
    /// [`Redlock::owns`]), [`Error::NoRuntime`] outside a tokio runtime; the lock is then not
    /// renewed and expires with its TTL.
    pub fn guard(&self, lock: Lock) -> Result<LockGuard, Error> {
        self.core.owns(&lock)?;
        // Checked before the lock is registered for renewal: spawning the driver outside a
        // runtime panicked with the lock registered, and the next guard's driver renewed it
        // with nobody to release it (test `lifecycle::a_guard_made_outside_a_runtime_is_an_
        // error_and_leaves_nothing_renewed`).
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime {
                resources: Arc::clone(&lock.resources),
            });
        }
        Ok(self.core.guard(lock))
    }

    /// Whether `lock` was taken by a client of the same node list (same normalised addresses
    /// and databases, in the same order) — the clients that may extend, guard or release it.
    pub fn owns(&self, lock: &Lock) -> bool {
        self.core.owns(lock).is_ok()
    }

    /// Acquires `resource` (retrying per policy), runs `work` with a [`Lease`] while the lock is
    /// renewed, and releases it on every exit path — success, error, panic or loss. The same as
    /// `self.lock(resource).with_lock(work)`; use [`Redlock::lock`] for per-lock options or
    /// several resources.
    ///
    /// If the lock is lost while `work` runs (renewal failed, validity passed, max hold reached),
    /// `work` is dropped at its next await point and the call returns [`Error::LeaseLost`] — also
    /// when `work` finished without reaching another await (it blocked the thread past the
    /// validity): its result is dropped then. A panic in `work` releases the lock and then
    /// resumes unwinding.
    ///
    /// # Errors
    /// As [`Redlock::acquire`], plus [`Error::LeaseLost`].
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and the guard, which releases the lock in the background.
    pub async fn with_lock<F, Fut, T>(&self, resource: &str, work: F) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock(resource).with_lock(work).await
    }

    /// Waits until `resource` is not held — no quorum of nodes has a key for it — without
    /// taking it. Returns at once when it is free now. For single-flight work such as a cache
    /// rebuild: one task takes the lock and rebuilds; the others wait here for it instead of
    /// each taking the lock in turn, then read what it built.
    ///
    /// It reads the keys' remaining TTLs (`PTTL`; an ACL user needs `+pttl`) and never
    /// creates, changes or deletes a key. After the first check it subscribes to the
    /// resource's release notifications (as waiting acquirers do) and checks again on each one,
    /// and also when the holders' keys would expire if not renewed, and at least every second:
    /// a notification that is lost costs at most that, never the whole timeout.
    ///
    /// "Not held" is a moment, not a promise: another client may take the lock right after.
    ///
    /// # Errors
    /// [`Error::WaitTimedOut`] when the resource was still held (or too few nodes answered
    /// to tell) after `timeout`; [`Error::InvalidResource`] for a bad name; [`Error::Config`]
    /// for a client found misconfigured on connecting.
    ///
    /// # Cancel safety
    /// Safe: it only reads and listens.
    pub async fn wait_released(&self, resource: &str, timeout: Duration) -> Result<(), Error> {
        self.core.wait_released(resource, timeout).await
    }

    /// Waits until the work this client goes on with in the background has ended: the release
    /// of a [`LockGuard`] dropped without [`LockGuard::release`], a [`release`](Self::release)
    /// future dropped before it was polled, the cleanup of an attempt that failed after some
    /// node granted, and the answers still awaited from a slow node when a phase was decided
    /// without it. Each of these is a task of the runtime it started on; a program that shuts
    /// that runtime down first (returns from `main`) drops them, and their keys stay until
    /// their TTL — the next run of a job finds its own lock held. Call this before returning.
    ///
    /// Every such task is bounded by its requests' node budgets plus a one-second grace for a
    /// node that does not answer, so this returns within about the node timeout plus one
    /// second (longer only while a node's connection is still being opened) unless new
    /// background work keeps starting, or a task waits on a runtime that is kept but no longer
    /// driven (a current-thread runtime between `block_on` calls: its tasks run only when it
    /// runs again); call it on the runtime that did the work, and wrap it in a timeout for a
    /// hard bound. Renewals of
    /// guards still alive are not background work here: release or drop those guards first.
    /// Clones of a client share its background work.
    ///
    /// # Cancel safety
    /// Safe: it only waits; the tasks go on without it.
    pub async fn settle(&self) {
        if let Some(background) = self.core.backend.background() {
            background.idle().await;
        }
    }

    /// Opens the connection to every node now instead of on first use, waiting up to the
    /// connect timeout. Returns each node's result (`Granted` = connected). A request waits
    /// for a connection being opened only within its budget — its node timeout plus up to
    /// four more, never more than the connect timeout (the opening goes on in the background)
    /// — so a process that must succeed on its very first request to distant nodes should
    /// call this first. A node that turns out to be the same server as another one
    /// reports [`NodeErrorKind::Identity`](crate::NodeErrorKind::Identity), and the client then
    /// refuses every operation with [`Error::Config`].
    ///
    /// # Cancel safety
    /// Safe; the connections go on opening in the background.
    pub async fn connect(&self) -> Vec<NodeReport> {
        let timeout = self.core.config.connect_timeout;
        let backend = &self.core.backend;
        join_all((0..backend.len()).map(|i| async move {
            let outcome = match tokio::time::timeout(timeout, backend.connect(i)).await {
                Ok(Ok(_)) => NodeOutcome::Confirmed,
                Ok(Err(e)) => NodeOutcome::Failed(e),
                Err(_) => NodeOutcome::TimedOut { after: timeout },
            };
            NodeReport {
                node: backend.name(i).clone(),
                outcome,
            }
        }))
        .await
    }
}
