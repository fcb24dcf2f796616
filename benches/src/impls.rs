//! The four implementations behind one small async interface.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock::{Redlock, RetryPolicy};
use serde::Serialize;

use crate::BenchError;
use crate::floor::Floor;

/// Which implementation a measurement ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub(crate) enum Impl {
    /// This workspace's `redlock` crate.
    Redlock,
    /// crates.io `rslock` (tokio).
    Rslock,
    /// crates.io `redlock` 2.x (sync, on the blocking pool).
    RedlockRs,
    /// The raw-protocol floor.
    Floor,
}

impl Impl {
    pub(crate) const ALL: [Impl; 4] = [Impl::Redlock, Impl::Rslock, Impl::RedlockRs, Impl::Floor];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Impl::Redlock => "redlock",
            Impl::Rslock => "rslock",
            Impl::RedlockRs => "redlock-rs",
            Impl::Floor => "floor",
        }
    }

    /// Whether the implementation can wait for a held lock (retry loop or wake-ups).
    pub(crate) fn waits(self) -> bool {
        !matches!(self, Impl::Floor)
    }

    /// Whether the implementation renews held locks by itself.
    pub(crate) fn renews(self) -> bool {
        matches!(self, Impl::Redlock | Impl::Rslock)
    }
}

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
    Redlock(Redlock),
    Rslock(rslock::LockManager),
    RedlockRs(Arc<redlock_rs::RedLock>),
    Floor(Arc<Floor>),
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
            Impl::Redlock => {
                let retry = match setup.wait_deadline {
                    Some(d) => RetryPolicy::deadline(d),
                    None => RetryPolicy::once(),
                };
                let rl = Redlock::builder()
                    .nodes(urls)
                    .ttl(setup.ttl)
                    .retry(retry)
                    .build()?;
                rl.connect().await;
                Client::Redlock(rl)
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
        })
    }

    pub(crate) fn which(&self) -> Impl {
        match self {
            Client::Redlock(_) => Impl::Redlock,
            Client::Rslock(_) => Impl::Rslock,
            Client::RedlockRs(_) => Impl::RedlockRs,
            Client::Floor(_) => Impl::Floor,
        }
    }

    /// One acquire attempt (per the client's retry settings) and, on success, a release.
    pub(crate) async fn cycle(&self, resource: &str, ttl: Duration) -> Result<(), String> {
        match self {
            Client::Redlock(rl) => {
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
        }
    }

    /// Waits for `resource` (per the client's retry settings), holds it for `hold`, releases
    /// it. Returns how long the acquire waited.
    pub(crate) async fn wait_hold_release(
        &self,
        resource: &str,
        ttl: Duration,
        hold: Duration,
    ) -> Result<Duration, String> {
        match self {
            Client::Redlock(rl) => {
                let t = Instant::now();
                let lock = rl
                    .acquire(resource)
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                let waited = t.elapsed();
                tokio::time::sleep(hold).await;
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
                tokio::time::sleep(hold).await;
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
                    std::thread::sleep(hold);
                    drop(guard); // its Drop releases on every node
                    Ok(waited)
                })
                .await
                .map_err(|e| format!("blocking task: {e}"))?
            }
            Client::Floor(_) => Err("the floor cannot wait".to_owned()),
        }
    }
}
