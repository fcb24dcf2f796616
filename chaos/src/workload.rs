//! The workload: clients contending for resources, each hold read-modify-writing the
//! resource's register, every operation recorded.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencing::FenceToken;
use futures_util::future::BoxFuture;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redlock::Redlock;

use crate::history::{Clock, Kind, Op, Outcome};

/// What a read-modify-write of a register did.
#[derive(Clone, Debug)]
pub struct Rmw {
    /// The value read, if the read succeeded.
    pub read: Option<i64>,
    /// Whether the write happened (`Ok`), did not (`Fail`: rejected or the read failed) or
    /// may have (`Unknown`).
    pub outcome: Outcome,
    /// Why it failed or is unknown.
    pub error: Option<String>,
}

/// The protected resource: one integer register per resource, behind a fence (or not).
pub trait Register: Send + Sync {
    /// Reads register `r` and writes the value read plus one. With a `token`, the read is
    /// preceded by an admission of the token (so a newer holder's read locks out older
    /// holders' writes) and the write is admitted by the fence; without one, both are plain.
    /// `gap` runs between the read and the write (where a client pause strikes).
    fn rmw<'a>(
        &'a self,
        r: u32,
        token: Option<&'a FenceToken>,
        gap: BoxFuture<'a, ()>,
    ) -> BoxFuture<'a, Rmw>;

    /// Register `r`'s value now (after the run).
    fn value(&self, r: u32) -> BoxFuture<'_, Result<i64, String>>;
}

/// How a paused client stops: its whole runtime (or process) halts.
pub trait Stop: Send + Sync {
    /// Halts the calling client for `lasts`.
    fn stop(&self, lasts: Duration) -> BoxFuture<'_, ()>;
}

/// Blocks the calling thread: with the client on its own current-thread runtime, that halts
/// every task of the client (its renewals, its connections) as a stopped process would.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockThread;

impl Stop for BlockThread {
    fn stop(&self, lasts: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move { std::thread::sleep(lasts) })
    }
}

/// A client's pending pause, set by the nemesis and taken at the next read→write gap.
#[derive(Debug, Default)]
pub struct PauseSlot(Mutex<Option<Duration>>, Mutex<Vec<(u64, u64)>>);

impl PauseSlot {
    /// Asks for a pause of `lasts` at the next gap.
    pub fn request(&self, lasts: Duration) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(lasts);
    }

    fn take(&self) -> Option<Duration> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    fn record(&self, start: u64, end: u64) {
        self.1
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((start, end));
    }

    /// Start and end (the run's clock, ns) of each pause that struck (taken at a gap between
    /// a read and its write) and ended.
    pub fn strikes(&self) -> Vec<(u64, u64)> {
        self.1
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Pause slots of every client of one process.
#[derive(Debug, Default)]
pub struct PauseSlots(pub Vec<Arc<PauseSlot>>);

impl PauseSlots {
    /// Start and end of each pause that struck, over every client.
    pub fn strikes(&self) -> Vec<(u64, u64)> {
        self.0.iter().flat_map(|s| s.strikes()).collect()
    }
}

impl crate::nemesis::Pauser for PauseSlots {
    fn pause(&self, client: usize, lasts: Duration) {
        if let Some(slot) = self.0.get(client) {
            slot.request(lasts);
        }
    }
}

/// One client's part of the workload.
#[derive(Clone, Debug)]
pub struct ClientPlan {
    /// Client number.
    pub id: u32,
    /// Number of resources to contend for.
    pub resources: u32,
    /// Seed of the client's choices.
    pub seed: u64,
    /// When to stop starting holds.
    pub until: tokio::time::Instant,
    /// Whether writes go through the fence.
    pub fencing: bool,
    /// How long a guarded hold lasts (several renewals).
    pub hold: Duration,
    /// Concurrent holders (tasks) of the client.
    pub tasks: u32,
}

/// The name of resource `r`.
pub fn resource_name(r: u32) -> String {
    format!("chaos:r{r}")
}

/// The kind of a lock error, for the history (never a secret).
pub fn error_kind(e: &impl std::fmt::Debug) -> String {
    let text = format!("{e:?}");
    text.split([' ', '{', '('])
        .next()
        .unwrap_or("error")
        .to_owned()
}

/// Where a client's operations go as they complete.
pub type Recorder = Arc<dyn Fn(Op) + Send + Sync>;

/// Runs one client until `plan.until`: `plan.tasks` tasks on one `Redlock`, each a separate
/// holder. Each hold acquires a random resource (now and then with a token of its own),
/// writes its register, sometimes keeps it under a renewing guard and writes again, and
/// releases it — or, now and then, abandons it (a crashed holder: no release, the keys
/// expire), or crashes and has a successor re-claim it with its token, write and release.
/// Every operation goes to `record`.
pub async fn client(
    plan: ClientPlan,
    redlock: Redlock,
    register: Arc<dyn Register>,
    clock: Arc<dyn Clock>,
    pause: Arc<PauseSlot>,
    stop: Arc<dyn Stop>,
    record: Recorder,
) {
    let holders = (0..plan.tasks.max(1)).map(|task| Holder {
        plan: &plan,
        task,
        redlock: &redlock,
        register: &register,
        clock: &clock,
        pause: &pause,
        stop: &stop,
        record: &record,
    });
    futures_util::future::join_all(holders.map(Holder::run)).await;
}

/// One task of a client.
struct Holder<'a> {
    plan: &'a ClientPlan,
    task: u32,
    redlock: &'a Redlock,
    register: &'a Arc<dyn Register>,
    clock: &'a Arc<dyn Clock>,
    pause: &'a PauseSlot,
    stop: &'a Arc<dyn Stop>,
    record: &'a Recorder,
}

impl Holder<'_> {
    async fn run(self) {
        let plan = self.plan;
        let clock = self.clock;
        let record = |op: Op| (self.record)(op);
        let mut rng = StdRng::seed_from_u64(
            plan.seed ^ (u64::from(plan.id) << 32) ^ (u64::from(self.task) << 48),
        );
        let mut hold: u64 = 0;
        while tokio::time::Instant::now() < plan.until {
            hold += 1;
            let r = rng.random_range(0..plan.resources.max(1));
            let base = Op {
                client: plan.id,
                task: self.task,
                resource: r,
                hold,
                kind: Kind::Acquire,
                outcome: Outcome::Ok,
                invoke: clock.now(),
                complete: 0,
                valid_until: None,
                fence: None,
                read: None,
                wrote: None,
                error: None,
            };
            let own_token = rng.random_range(0..16u8) == 0;
            let acquired = if own_token {
                self.acquire_with_own_token(r, &mut rng).await
            } else {
                self.redlock.acquire(&resource_name(r)).await
            };
            let now = clock.now();
            let lock = match acquired {
                Ok(lock) => {
                    record(Op {
                        complete: now,
                        valid_until: Some(deadline_ns(now, lock.valid_until())),
                        fence: lock.fence().as_ref().map(ToString::to_string),
                        ..base.clone()
                    });
                    lock
                }
                Err(e) => {
                    record(Op {
                        outcome: Outcome::Fail,
                        complete: now,
                        error: Some(error_kind(&e)),
                        ..base
                    });
                    // Back off before trying again, as an application would.
                    tokio::time::sleep(Duration::from_millis(rng.random_range(10..50))).await;
                    continue;
                }
            };
            let fence = lock.fence_settled().await;
            let token = fence.as_ref().filter(|_| plan.fencing);
            let write = || self.write(&base, token, fence.as_ref());
            let style = rng.random_range(0..32u8);
            if style == 0 {
                // Abandoned: write once, then walk away like a crashed holder.
                record(write().await);
                drop(lock);
                continue;
            }
            if style <= 2 {
                // Guarded: renewals keep it across several TTLs; write, hold, write again.
                let guard = match self.redlock.guard(lock) {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::error!(error = %e, "guard refused a lock of its own client");
                        continue;
                    }
                };
                let lease = guard.lease();
                record(write().await);
                tokio::select! {
                    // Polled in order, so simulated runs stay deterministic.
                    biased;
                    () = tokio::time::sleep(plan.hold) => {}
                    _ = lease.lost() => {}
                }
                if !lease.is_lost() {
                    record(write().await);
                }
                let invoke = clock.now();
                let valid_until = deadline_ns(invoke, lease.valid_until());
                let released = guard.release().await;
                record(release_op(
                    &base,
                    invoke,
                    valid_until,
                    clock.now(),
                    released,
                ));
                continue;
            }
            if style == 3 {
                // Restarted: the holder writes and crashes, and its successor re-claims the
                // lock with the token it persisted, writes and releases. One hold: the same
                // token's.
                record(write().await);
                let token = lock.token().clone();
                drop(lock);
                let restart = plan.hold.mul_f64(rng.random_range(0.0..0.5));
                tokio::time::sleep(restart).await;
                self.reclaim(&base, &token).await;
                continue;
            }
            record(write().await);
            let invoke = clock.now();
            let valid_until = deadline_ns(invoke, lock.valid_until());
            let reclaim = own_token.then(|| lock.token().clone());
            let released = self.redlock.release(lock).await;
            let failed = released.is_err();
            record(release_op(
                &base,
                invoke,
                valid_until,
                clock.now(),
                released,
            ));
            // A holder with a token of its own whose release failed takes the lock again with
            // that token at once (to finish its job, or to release it once more): the re-claim
            // must not lose its keys to the failed release's late deletes. One hold: the same
            // token's.
            if let (true, Some(token)) = (failed, reclaim) {
                self.reclaim(&base, &token).await;
            }
        }
    }

    /// An acquire with a token of the caller's own, as a caller that stores its token before
    /// it asks (so that it can re-claim the lock after a crash): single attempts with that
    /// token, retried after a short pause (each waits for the cleanup of the one before).
    async fn acquire_with_own_token(
        &self,
        r: u32,
        rng: &mut StdRng,
    ) -> Result<redlock::Lock, redlock::Error> {
        let token = redlock::Token::random().map_err(redlock::Error::Entropy)?;
        let mut tries = 0;
        loop {
            tries += 1;
            let got = self
                .redlock
                .try_acquire_with_token([resource_name(r)], &token)
                .await;
            match got {
                Err(e) if e.is_retryable() && tries < 4 => {
                    tokio::time::sleep(Duration::from_millis(rng.random_range(5..20))).await;
                }
                got => return got,
            }
        }
    }

    /// A successor's re-claim of the hold `base` with the token its crashed predecessor
    /// persisted: recorded as another acquire of the same hold; when it succeeds, a write and
    /// the release follow.
    async fn reclaim(&self, base: &Op, token: &redlock::Token) {
        let invoke = self.clock.now();
        let resource = resource_name(base.resource);
        let again = self
            .redlock
            .try_acquire_with_token([resource.as_str()], token)
            .await;
        let now = self.clock.now();
        let base = Op {
            invoke,
            ..base.clone()
        };
        let lock = match again {
            Ok(lock) => lock,
            Err(e) => {
                (self.record)(Op {
                    outcome: Outcome::Fail,
                    complete: now,
                    error: Some(error_kind(&e)),
                    ..base
                });
                return;
            }
        };
        (self.record)(Op {
            complete: now,
            valid_until: Some(deadline_ns(now, lock.valid_until())),
            fence: lock.fence().as_ref().map(ToString::to_string),
            ..base.clone()
        });
        let fence = lock.fence_settled().await;
        let token = fence.as_ref().filter(|_| self.plan.fencing);
        (self.record)(self.write(&base, token, fence.as_ref()).await);
        let invoke = self.clock.now();
        let valid_until = deadline_ns(invoke, lock.valid_until());
        let released = self.redlock.release(lock).await;
        (self.record)(release_op(
            &base,
            invoke,
            valid_until,
            self.clock.now(),
            released,
        ));
    }

    /// One read-modify-write of the hold's register; a pending pause strikes between the read
    /// and the write.
    async fn write(&self, base: &Op, token: Option<&FenceToken>, fence: Option<&FenceToken>) -> Op {
        let invoke = self.clock.now();
        let gap: BoxFuture<'_, ()> = Box::pin(async {
            if let Some(lasts) = self.pause.take() {
                let start = self.clock.now();
                self.stop.stop(lasts).await;
                self.pause.record(start, self.clock.now());
            }
        });
        let done = self.register.rmw(base.resource, token, gap).await;
        Op {
            kind: Kind::Write,
            outcome: done.outcome,
            invoke,
            complete: self.clock.now(),
            fence: fence.map(ToString::to_string),
            read: done.read,
            wrote: done.read.map(|v| v + 1),
            error: done.error,
            ..base.clone()
        }
    }
}

/// `deadline` on the run's clock, given that the clock reads `now_ns` now. Deadlines are read
/// against tokio's clock, so this holds for real and simulated (paused) time alike.
fn deadline_ns(now_ns: u64, deadline: std::time::Instant) -> u64 {
    let now = tokio::time::Instant::now().into_std();
    if deadline >= now {
        now_ns + (deadline - now).as_nanos() as u64
    } else {
        now_ns.saturating_sub((now - deadline).as_nanos() as u64)
    }
}

fn release_op(
    base: &Op,
    invoke: u64,
    valid_until: u64,
    complete: u64,
    released: Result<redlock::ReleaseReport, redlock::Error>,
) -> Op {
    let (outcome, error) = match released {
        Ok(_) => (Outcome::Ok, None),
        Err(e) => (Outcome::Unknown, Some(error_kind(&e))),
    };
    Op {
        kind: Kind::Release,
        outcome,
        invoke,
        complete,
        valid_until: Some(valid_until),
        error,
        ..base.clone()
    }
}
