//! The six implementations behind one small async interface.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use distributed_lock_redis::RedisLockProvider;
use redlock::{Redlock, RetryPolicy};
use serde::Serialize;

use crate::BenchError;
use crate::floor::Floor;

/// Which implementation a measurement ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub(crate) enum Impl {
    /// This workspace's `redlock` crate.
    Redlock,
    /// The same crate with claim stamps off (`claim_stamps(false)`): what the stamps cost.
    /// Measured for uncontended latency and throughput only.
    RedlockUnstamped,
    /// crates.io `rslock` (tokio).
    Rslock,
    /// crates.io `redlock` 2.x (sync, on the blocking pool).
    RedlockRs,
    /// The raw-protocol floor.
    Floor,
    /// crates.io `redis-lock` 0.5 (`lock_across`, tokio, redis 0.27).
    RedisLock,
    /// crates.io `distributed-lock-redis` 0.2 (fred 9).
    DistLock,
}

impl Impl {
    pub(crate) const ALL: [Impl; 7] = [
        Impl::Redlock,
        Impl::RedlockUnstamped,
        Impl::Rslock,
        Impl::RedlockRs,
        Impl::Floor,
        Impl::RedisLock,
        Impl::DistLock,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Impl::Redlock => "redlock",
            Impl::RedlockUnstamped => "redlock-unstamped",
            Impl::Rslock => "rslock",
            Impl::RedlockRs => "redlock-rs",
            Impl::Floor => "floor",
            Impl::RedisLock => "redis-lock",
            Impl::DistLock => "distributed-lock-redis",
        }
    }

    /// Whether the implementation can wait for a held lock (retry loop or wake-ups).
    /// distributed-lock-redis cannot: its `acquire(timeout)` makes one attempt and returns
    /// `Timeout` when that attempt fails (`lock.rs`), whatever the timeout.
    pub(crate) fn waits(self) -> bool {
        !matches!(self, Impl::Floor | Impl::DistLock)
    }

    /// Whether this is only a configuration of another implementation, measured in the
    /// uncontended and throughput scenarios and left out of the others.
    pub(crate) fn variant(self) -> bool {
        matches!(self, Impl::RedlockUnstamped)
    }

    /// The implementations measured in every scenario: [`Impl::ALL`] without the variants.
    pub(crate) fn in_every_scenario() -> impl Iterator<Item = Impl> {
        Impl::ALL.into_iter().filter(|w| !w.variant())
    }

    /// Whether the implementation renews held locks by itself.
    pub(crate) fn renews(self) -> bool {
        matches!(self, Impl::Redlock | Impl::Rslock | Impl::DistLock)
    }
}

/// Called by a contender right after it won the lock, while it holds it.
pub(crate) type OnWin = Arc<dyn Fn() + Send + Sync>;

/// How a client is configured for one scenario.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup {
    pub(crate) ttl: Duration,
    /// One attempt per acquire for every implementation (peers' retries off).
    pub(crate) single_attempt: bool,
    /// The floor's per-call bound (it has no per-node timeout of its own).
    pub(crate) floor_timeout: Option<Duration>,
    /// This crate's retry deadline for waiting acquires (hot key); `None` = one attempt.
    pub(crate) wait_deadline: Option<Duration>,
}

/// One connected client of one implementation.
#[derive(Clone)]
pub(crate) enum Client {
    /// This crate; the `Impl` says whether claim stamps are on.
    Redlock(Redlock, Impl),
    Rslock(rslock::LockManager),
    RedlockRs(Arc<redlock_rs::RedLock>),
    Floor(Arc<Floor>),
    RedisLock(Arc<RedisLockClient>),
    DistLock(Arc<RedisLockProvider>),
}

/// redis-lock's `lock_across` takes `&[Arc<Mutex<C>>]` and holds each mutex for a whole round
/// trip. One multiplexed connection per node is opened once; every call wraps clones of them in
/// fresh mutexes, so concurrent calls of one client pipeline on those connections (as the
/// floor's and rslock's do) instead of queueing on one mutex per node.
#[derive(Debug)]
pub(crate) struct RedisLockClient {
    conns: Vec<redis_027::aio::MultiplexedConnection>,
    ttl: Duration,
    retry: Duration,
    duration: Duration,
}

impl RedisLockClient {
    fn options(&self) -> redis_lock::LockAcrossOptions {
        redis_lock::LockAcrossOptions {
            ttl: self.ttl,
            retry: self.retry,
            duration: self.duration,
        }
    }

    fn conns(&self) -> Vec<Arc<tokio::sync::Mutex<redis_027::aio::MultiplexedConnection>>> {
        self.conns
            .iter()
            .map(|c| Arc::new(tokio::sync::Mutex::new(c.clone())))
            .collect()
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.which().name())
    }
}

impl Client {
    /// Builds and warms up a client over `urls`. A minority of unreachable nodes is fine.
    pub(crate) async fn connect(
        which: Impl,
        urls: &[String],
        setup: Setup,
    ) -> Result<Client, BenchError> {
        Ok(match which {
            Impl::Redlock | Impl::RedlockUnstamped => {
                let retry = match setup.wait_deadline {
                    Some(d) => RetryPolicy::deadline(d),
                    None => RetryPolicy::once(),
                };
                let rl = Redlock::builder()
                    .nodes(urls)
                    .ttl(setup.ttl)
                    .retry(retry)
                    .claim_stamps(which == Impl::Redlock)
                    .build()?;
                rl.connect().await;
                Client::Redlock(rl, which)
            }
            Impl::Rslock => {
                let mut lm = rslock::LockManager::new(urls.to_vec());
                if setup.single_attempt {
                    lm.set_retry(1, Duration::from_millis(1));
                }
                Client::Rslock(lm)
            }
            Impl::RedlockRs => {
                let mut rl = redlock_rs::RedLock::new(urls.to_vec());
                if setup.single_attempt {
                    // Its delay is drawn from 0..delay even after the last attempt: 1 ms
                    // is the smallest value that does not panic.
                    rl.set_retry(1, 1);
                }
                Client::RedlockRs(Arc::new(rl))
            }
            Impl::Floor => Client::Floor(Arc::new(
                Floor::connect(urls, setup.ttl, setup.floor_timeout).await?,
            )),
            Impl::RedisLock => {
                let mut conns = Vec::with_capacity(urls.len());
                for url in urls {
                    // redis 0.27's default: no response timeout.
                    let conn = redis_027::Client::open(url.as_str())?
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(|e| format!("redis-lock: connecting {url}: {e}"))?;
                    conns.push(conn);
                }
                let (retry, duration) = if setup.single_attempt {
                    // One attempt: the loop re-checks `duration` only after the attempt and a
                    // `retry` sleep, so 1 ms of each (its sleep after a failed attempt stays).
                    (Duration::from_millis(1), Duration::from_millis(1))
                } else if let Some(d) = setup.wait_deadline {
                    // Waiting (hot key): its default 100 ms retry delay, our waiting budget.
                    (redis_lock::DEFAULT_RETRY_DELAY, d)
                } else {
                    (
                        redis_lock::DEFAULT_RETRY_DELAY,
                        redis_lock::DEFAULT_DURATION,
                    )
                };
                Client::RedisLock(Arc::new(RedisLockClient {
                    conns,
                    ttl: setup.ttl,
                    retry,
                    duration,
                }))
            }
            Impl::DistLock => {
                // Its defaults are expiry 30 s, min validity 27 s (acquire timeout = their
                // difference, 3 s), extension every 10 s: the same proportions at our TTL.
                let provider = RedisLockProvider::builder()
                    .urls(urls)
                    .expiry(setup.ttl)
                    .min_validity(setup.ttl.mul_f64(0.9))
                    .extension_cadence(setup.ttl / 3)
                    .build()
                    .await?;
                Client::DistLock(Arc::new(provider))
            }
        })
    }

    pub(crate) fn which(&self) -> Impl {
        match self {
            Client::Redlock(_, which) => *which,
            Client::Rslock(_) => Impl::Rslock,
            Client::RedlockRs(_) => Impl::RedlockRs,
            Client::Floor(_) => Impl::Floor,
            Client::RedisLock(_) => Impl::RedisLock,
            Client::DistLock(_) => Impl::DistLock,
        }
    }

    /// One acquire attempt (per the client's retry settings) and, on success, a release.
    pub(crate) async fn cycle(&self, resource: &str, ttl: Duration) -> Result<(), String> {
        match self {
            Client::Redlock(rl, _) => {
                let lock = rl
                    .try_acquire(resource)
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                rl.release(lock)
                    .await
                    .map(drop)
                    .map_err(|e| format!("release: {e}"))
            }
            Client::Rslock(lm) => {
                let lock = lm
                    .lock(resource.as_bytes(), ttl)
                    .await
                    .map_err(|e| format!("lock: {e:?}"))?;
                lm.unlock(&lock).await;
                Ok(())
            }
            Client::RedlockRs(rl) => {
                let rl = Arc::clone(rl);
                let resource = resource.to_owned();
                let ttl_ms = ttl.as_millis() as usize;
                tokio::task::spawn_blocking(move || match rl.lock(resource.as_bytes(), ttl_ms) {
                    Ok(Some(lock)) => {
                        rl.unlock(&lock);
                        Ok(())
                    }
                    Ok(None) => Err("lock: not acquired".to_owned()),
                    Err(e) => Err(format!("lock: {e}")),
                })
                .await
                .map_err(|e| format!("blocking task: {e}"))?
            }
            Client::Floor(f) => f.cycle(resource).await,
            Client::RedisLock(c) => {
                redis_lock::lock_across(&c.conns(), resource, async {}, c.options())
                    .await
                    .map_err(|e| format!("lock_across: {e}"))
            }
            Client::DistLock(p) => {
                let handle = p
                    .create_lock(resource)
                    .try_acquire()
                    .await
                    .map_err(|e| format!("try_acquire: {e}"))?
                    .ok_or_else(|| "try_acquire: not acquired".to_owned())?;
                handle.release().await.map_err(|e| format!("release: {e}"))
            }
        }
    }

    /// Waits for `resource` (per the client's retry settings), holds it for `hold` (see
    /// [`hold_for`]), releases it. Returns how long the acquire waited. `on_win` runs while the lock is held.
    pub(crate) async fn wait_hold_release(
        &self,
        resource: &str,
        ttl: Duration,
        hold: Duration,
        on_win: OnWin,
    ) -> Result<Duration, String> {
        match self {
            Client::Redlock(rl, _) => {
                let t = Instant::now();
                let lock = rl
                    .acquire(resource)
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                let waited = t.elapsed();
                on_win();
                hold_for(hold).await;
                rl.release(lock)
                    .await
                    .map_err(|e| format!("release: {e}"))?;
                Ok(waited)
            }
            Client::Rslock(lm) => {
                let t = Instant::now();
                let lock = lm
                    .acquire_no_guard(resource.as_bytes(), ttl)
                    .await
                    .map_err(|e| format!("acquire: {e:?}"))?;
                let waited = t.elapsed();
                on_win();
                hold_for(hold).await;
                lm.unlock(&lock).await;
                Ok(waited)
            }
            Client::RedlockRs(rl) => {
                let rl = Arc::clone(rl);
                let resource = resource.to_owned();
                let ttl_ms = ttl.as_millis() as usize;
                tokio::task::spawn_blocking(move || {
                    let t = Instant::now();
                    let guard = rl
                        .acquire(resource.as_bytes(), ttl_ms)
                        .map_err(|e| format!("acquire: {e}"))?;
                    let waited = t.elapsed();
                    on_win();
                    std::thread::sleep(hold);
                    drop(guard); // its Drop releases on every node
                    Ok(waited)
                })
                .await
                .map_err(|e| format!("blocking task: {e}"))?
            }
            Client::RedisLock(c) => {
                let t = Instant::now();
                let work = async move {
                    let waited = t.elapsed();
                    on_win();
                    hold_for(hold).await;
                    waited
                };
                redis_lock::lock_across(&c.conns(), resource, work, c.options())
                    .await
                    .map_err(|e| format!("lock_across: {e}"))
            }
            Client::Floor(_) | Client::DistLock(_) => Err(format!(
                "{} cannot wait for a held lock",
                self.which().name()
            )),
        }
    }
}

/// Holds a lock for `hold` as precisely as the OS sleeps: on a blocking-pool thread, because
/// tokio's timer has millisecond ticks and a `sleep` of 1 ms that starts just after a tick
/// takes about 2 ms (2.1 ms on this machine) — the hot-key scenario's "1 ms hold" would hold
/// twice as long and set every implementation's hand-off rate.
pub(crate) async fn hold_for(hold: Duration) {
    if tokio::task::spawn_blocking(move || std::thread::sleep(hold))
        .await
        .is_err()
    {
        // The blocking pool is shutting down: the runtime is going away with the run.
        tokio::time::sleep(hold).await;
    }
}
