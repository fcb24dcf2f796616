//! The simulated nodes and the network between them and the clients.
//!
//! Each node is a key space with `PX` expiry on the node's own clock, a script cache, pub/sub
//! subscriptions and an inbox of requests ordered by arrival. One task per cluster executes the
//! requests that have arrived, in arrival order (a node runs one command at a time, like Redis),
//! and schedules their replies. Requests on one connection arrive in the order they were sent,
//! and so do its replies and messages, whatever the delays drawn: TCP does not reorder.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Batch, Wake};
use crate::error::{NodeError, NodeErrorKind};
use crate::token::Token;

/// Script-cache bits, one per script of [`crate::scripts::all`].
const IDENTITY: u8 = 1;
const ACQUIRE: u8 = 2;
const ACQUIRE_UNSTAMPED: u8 = 4;
const EXTEND: u8 = 8;
const EXTEND_MANY: u8 = 16;
const RELEASE: u8 = 32;
const ALL_SCRIPTS: u8 = IDENTITY | ACQUIRE | ACQUIRE_UNSTAMPED | EXTEND | EXTEND_MANY | RELEASE;

/// Where every node's clock starts (µs since the Unix epoch): November 2023.
const CLOCK_START_US: i64 = 1_700_000_000_000_000;

/// What survives a restart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Keep {
    /// Every key (a clean shutdown with a fresh snapshot).
    All,
    /// Each lock key independently with this probability (a snapshot or AOF that missed the
    /// last writes); the identity record and the stamp key are kept.
    Fraction(f64),
    /// Nothing, not even the identity record (a new, empty server).
    None,
}

/// One connection between a client and a node.
pub(crate) struct Conn {
    /// Cancelled when the connection breaks.
    pub(crate) token: CancellationToken,
    /// Arrival of the last request, and of the last reply or message, on this connection.
    fifo: Mutex<(Instant, Instant)>,
}

/// A script call, with the arguments the script would get.
pub(crate) enum Call {
    Acquire {
        /// The stamp key, for the stamped script.
        stamp: Option<Arc<str>>,
        identity: Arc<str>,
        record: Arc<str>,
        keys: Arc<[String]>,
        token: Token,
        ttl_ms: u64,
        /// A grant answers the node's clock beside its value.
        timed: bool,
    },
    Extend {
        keys: Arc<[String]>,
        token: Token,
        ttl_ms: u64,
    },
    ExtendMany(Arc<Batch>),
    Release {
        keys: Arc<[String]>,
        token: Token,
        channels: Arc<[String]>,
        wake: Wake,
        /// The last moment on the node's clock (µs) at which it may still delete.
        before_us: Option<u64>,
    },
}

impl Call {
    fn script(&self) -> u8 {
        match self {
            Self::Acquire { stamp: Some(_), .. } => ACQUIRE,
            Self::Acquire { stamp: None, .. } => ACQUIRE_UNSTAMPED,
            Self::Extend { .. } => EXTEND,
            Self::ExtendMany(_) => EXTEND_MANY,
            Self::Release { .. } => RELEASE,
        }
    }
}

/// A request to a node.
pub(crate) enum Req {
    /// A new connection's handshake: `SCRIPT LOAD` of every script, then the identity script.
    Hello {
        identity: Arc<str>,
        fresh: String,
    },
    /// `INFO server`: the uptime.
    Info,
    /// `PTTL key`: −2 when missing, −1 without expiry, else the ms left.
    Pttl {
        key: String,
    },
    /// `GET key`.
    Get {
        key: String,
    },
    /// `SET key token NX PX ttl`.
    SetNx {
        key: String,
        token: Token,
        ttl_ms: u64,
    },
    /// `EVALSHA` (`sha`) or `EVAL` of a script.
    Script {
        sha: bool,
        call: Call,
    },
    /// `SCRIPT LOAD` of every script.
    LoadScripts,
    /// Opens a subscription connection whose messages go to `tx`.
    OpenSub {
        tx: mpsc::UnboundedSender<(Instant, String, String)>,
    },
    Subscribe(Vec<String>),
    Unsubscribe(Vec<String>),
    Ping,
}

/// A node's reply.
#[derive(Debug)]
pub(crate) enum Resp {
    Ok,
    NoScript,
    Int(i64),
    Ints(Vec<i64>),
    Bool(bool),
    Hello {
        record: String,
        now_ms: String,
    },
    Info {
        uptime: String,
    },
    /// A bulk string, or nil.
    Bulk(Option<String>),
}

struct Value {
    data: String,
    /// Node time (ms) after which the key is gone.
    expires_ms: Option<i64>,
}

struct Queued {
    at: Instant,
    seq: u64,
    conn: Arc<Conn>,
    req: Req,
    reply: oneshot::Sender<(Resp, Instant)>,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct Sub {
    conn: Arc<Conn>,
    channels: BTreeSet<String>,
    tx: mpsc::UnboundedSender<(Instant, String, String)>,
}

/// One simulated Redis master.
pub(crate) struct Node {
    /// The node's clock is `base_us + (now − base_real) × rate`.
    base_real: Option<Instant>,
    base_us: i64,
    rate: f64,
    /// The node's clock when it last started.
    boot_us: i64,
    data: BTreeMap<String, Value>,
    scripts: u8,
    pub(crate) paused: bool,
    pub(crate) partitioned: bool,
    delay: Duration,
    jitter: Duration,
    loss: f64,
    queue: BinaryHeap<Reverse<Queued>>,
    conns: Vec<Arc<Conn>>,
    subs: Vec<Sub>,
}

impl Node {
    fn new() -> Self {
        Self {
            base_real: None,
            base_us: CLOCK_START_US,
            rate: 1.0,
            boot_us: CLOCK_START_US,
            data: BTreeMap::new(),
            scripts: 0,
            paused: false,
            partitioned: false,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            loss: 0.0,
            queue: BinaryHeap::new(),
            conns: Vec::new(),
            subs: Vec::new(),
        }
    }

    /// The node's clock at `now`, in µs.
    pub(crate) fn clock_us(&mut self, now: Instant) -> i64 {
        let base = *self.base_real.get_or_insert(now);
        let ran = now.saturating_duration_since(base).as_secs_f64() * 1e6 * self.rate;
        self.base_us.saturating_add(ran as i64)
    }

    pub(crate) fn set_rate(&mut self, now: Instant, rate: f64) {
        self.base_us = self.clock_us(now);
        self.base_real = Some(now);
        self.rate = rate;
    }

    pub(crate) fn jump(&mut self, delta_ms: i64) {
        self.base_us = self.base_us.saturating_add(delta_ms.saturating_mul(1000));
    }

    pub(crate) fn set_delay(&mut self, base: Duration, jitter: Duration) {
        self.delay = base;
        self.jitter = jitter;
    }

    pub(crate) fn set_loss(&mut self, p: f64) {
        self.loss = if p.is_finite() {
            p.clamp(0.0, 1.0)
        } else {
            0.0
        };
    }

    /// One direction's delay.
    fn link(&self, rng: &mut SmallRng) -> Duration {
        if self.jitter.is_zero() {
            self.delay
        } else {
            self.delay + self.jitter.mul_f64(rng.random::<f64>())
        }
    }

    /// Breaks every open connection: their requests and messages are gone.
    pub(crate) fn kill_connections(&mut self) {
        for c in self.conns.drain(..) {
            c.token.cancel();
        }
        self.subs.clear();
        self.queue.clear();
    }

    pub(crate) fn restart(&mut self, now: Instant, keep: Keep, rng: &mut SmallRng) {
        self.kill_connections();
        match keep {
            Keep::All => {}
            Keep::None => self.data.clear(),
            Keep::Fraction(f) => self
                .data
                .retain(|_, v| v.expires_ms.is_none() || rng.random::<f64>() < f),
        }
        self.scripts = 0;
        self.boot_us = self.clock_us(now);
    }

    pub(crate) fn flush_scripts(&mut self) {
        self.scripts = 0;
    }

    /// Live lock keys (keys with a TTL) at `now` on the node's clock.
    pub(crate) fn lock_keys(&mut self, now: Instant) -> usize {
        let ms = self.clock_us(now).div_euclid(1000);
        self.data
            .values()
            .filter(|v| v.expires_ms.is_some_and(|e| ms <= e))
            .count()
    }

    /// The value of `key` at `now` on the node's clock.
    pub(crate) fn value(&mut self, now: Instant, key: &str) -> Option<String> {
        let ms = self.clock_us(now).div_euclid(1000);
        self.get(ms, key).map(str::to_owned)
    }

    fn get(&mut self, ms: i64, key: &str) -> Option<&str> {
        let expired = self
            .data
            .get(key)
            .is_some_and(|v| v.expires_ms.is_some_and(|e| ms > e));
        if expired {
            self.data.remove(key);
            return None;
        }
        self.data.get(key).map(|v| v.data.as_str())
    }

    fn set(&mut self, key: &str, data: &str, expires_ms: Option<i64>) {
        self.data.insert(
            key.to_owned(),
            Value {
                data: data.to_owned(),
                expires_ms,
            },
        );
    }

    fn pexpire(&mut self, ms: i64, key: &str, ttl_ms: u64) {
        if self.get(ms, key).is_some()
            && let Some(v) = self.data.get_mut(key)
        {
            v.expires_ms = Some(ms.saturating_add(ttl(ttl_ms)));
        }
    }

    /// Runs `req`, as the node would, at `now`.
    fn exec(
        &mut self,
        now: Instant,
        conn: &Arc<Conn>,
        req: Req,
        rng: &mut SmallRng,
        log: Option<&mut String>,
    ) -> Resp {
        let us = self.clock_us(now).max(0);
        let ms = us / 1000;
        let resp = match req {
            Req::Hello { identity, fresh } => {
                self.scripts = ALL_SCRIPTS;
                let record = match self.get(ms, &identity) {
                    Some(v) => v.to_owned(),
                    None => {
                        let v = format!("{fresh}@{ms}");
                        self.set(&identity, &v, None);
                        v
                    }
                };
                Resp::Hello {
                    record,
                    now_ms: ms.to_string(),
                }
            }
            Req::Info => Resp::Info {
                uptime: (us.saturating_sub(self.boot_us))
                    .div_euclid(1_000_000)
                    .to_string(),
            },
            Req::SetNx { key, token, ttl_ms } => {
                if self.get(ms, &key).is_some() {
                    Resp::Bool(false)
                } else {
                    self.set(&key, token.expose(), Some(ms.saturating_add(ttl(ttl_ms))));
                    Resp::Bool(true)
                }
            }
            Req::LoadScripts => {
                self.scripts = ALL_SCRIPTS;
                Resp::Ok
            }
            Req::Script { sha, call } => {
                let bit = call.script();
                if sha && self.scripts & bit == 0 {
                    Resp::NoScript
                } else {
                    // `EVAL` caches the script it ran.
                    self.scripts |= bit;
                    self.script(us, call, rng)
                }
            }
            Req::OpenSub { tx } => {
                self.subs.retain(|s| !s.conn.token.is_cancelled());
                self.subs.push(Sub {
                    conn: Arc::clone(conn),
                    channels: BTreeSet::new(),
                    tx,
                });
                Resp::Ok
            }
            Req::Subscribe(channels) => {
                if let Some(s) = self.subs.iter_mut().find(|s| Arc::ptr_eq(&s.conn, conn)) {
                    s.channels.extend(channels);
                }
                Resp::Ok
            }
            Req::Unsubscribe(channels) => {
                if let Some(s) = self.subs.iter_mut().find(|s| Arc::ptr_eq(&s.conn, conn)) {
                    for c in &channels {
                        s.channels.remove(c);
                    }
                }
                Resp::Ok
            }
            Req::Ping => Resp::Ok,
            Req::Get { key } => Resp::Bulk(self.get(ms, &key).map(str::to_owned)),
            Req::Pttl { key } => Resp::Int(match self.get(ms, &key) {
                None => -2,
                Some(_) => self
                    .data
                    .get(&key)
                    .and_then(|v| v.expires_ms)
                    .map_or(-1, |e| e.saturating_sub(ms).max(0)),
            }),
        };
        if let Some(log) = log {
            let _ = write!(log, " -> {resp:?}");
        }
        resp
    }

    /// The Lua scripts of [`crate::scripts`], step by step.
    fn script(&mut self, us: i64, call: Call, rng: &mut SmallRng) -> Resp {
        let ms = us / 1000;
        match call {
            Call::Acquire {
                stamp,
                identity,
                record,
                keys,
                token,
                ttl_ms,
                timed,
            } => {
                if self.get(ms, &identity) != Some(&*record) {
                    return Resp::Int(crate::scripts::IDENTITY_CHANGED);
                }
                let t = token.expose();
                let expires = Some(ms.saturating_add(ttl(ttl_ms)));
                // As the scripts: a key holding the token already is re-armed and reported
                // (`scripts::KEPT`).
                let kept = keys.iter().any(|k| self.get(ms, k) == Some(t));
                let answer = |value: i64| {
                    if kept {
                        -crate::scripts::KEPT - value
                    } else {
                        value
                    }
                };
                if stamp.is_some() && keys.len() == 1 {
                    let k = &keys[0];
                    match self.get(ms, k) {
                        None => self.set(k, t, expires),
                        Some(v) if v == t => self.pexpire(ms, k, ttl_ms),
                        Some(_) => return Resp::Int(0),
                    }
                } else {
                    if keys.iter().any(|k| self.get(ms, k).is_some_and(|v| v != t)) {
                        return Resp::Int(0);
                    }
                    for k in keys.iter() {
                        self.set(k, t, expires);
                    }
                }
                // A grant asked for the clock answers it beside its value
                // (`scripts::GRANT_CLOCK`).
                let reply = |value: i64| {
                    if timed {
                        Resp::Ints(vec![answer(value), us])
                    } else {
                        Resp::Int(answer(value))
                    }
                };
                let Some(stamp) = stamp else {
                    return reply(1);
                };
                let last = self
                    .get(ms, &stamp)
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0);
                let issued = if us > last { us } else { last + 1 };
                self.set(&stamp, &issued.to_string(), None);
                reply(issued)
            }
            Call::Extend {
                keys,
                token,
                ttl_ms,
            } => {
                if keys.iter().any(|k| self.get(ms, k) != Some(token.expose())) {
                    return Resp::Int(0);
                }
                for k in keys.iter() {
                    self.pexpire(ms, k, ttl_ms);
                }
                Resp::Int(1)
            }
            Call::ExtendMany(batch) => {
                let mut out = Vec::with_capacity(batch.locks.len());
                for lock in &batch.locks {
                    let t = lock.token.expose();
                    let mut ok = 1;
                    for k in lock.keys.iter() {
                        match self.get(ms, k) {
                            None => ok = 2,
                            Some(v) if v != t => {
                                ok = 0;
                                break;
                            }
                            Some(_) => {}
                        }
                    }
                    if ok > 0 {
                        for k in lock.keys.iter() {
                            self.pexpire(ms, k, lock.ttl_ms);
                        }
                    }
                    out.push(ok);
                }
                Resp::Ints(out)
            }
            Call::Release {
                keys,
                token,
                channels,
                wake,
                before_us,
            } => {
                if before_us.is_some_and(|b| u64::try_from(us).map_or(true, |us| us > b)) {
                    return Resp::Int(-1);
                }
                let mut n = 0;
                for (i, k) in keys.iter().enumerate() {
                    if self.get(ms, k) == Some(token.expose()) {
                        self.data.remove(k);
                        n += 1;
                        if let Some(c) = channels.get(i) {
                            self.publish(c, &wake.message(), rng);
                        }
                    }
                }
                Resp::Int(n)
            }
        }
    }

    /// Sends a message to every connection subscribed to `channel`, each after its own
    /// delay, in order per connection; a lossy link may lose it.
    fn publish(&mut self, channel: &str, message: &str, rng: &mut SmallRng) {
        let now = Instant::now();
        for i in 0..self.subs.len() {
            let s = &self.subs[i];
            if s.conn.token.is_cancelled() || !s.channels.contains(channel) {
                continue;
            }
            if self.loss > 0.0 && rng.random::<f64>() < self.loss {
                continue;
            }
            let d = self.link(rng);
            let s = &self.subs[i];
            let mut fifo = lock(&s.conn.fifo);
            let at = (now + d).max(fifo.1);
            fifo.1 = at;
            drop(fifo);
            let _ = s.tx.send((at, channel.to_owned(), message.to_owned()));
        }
    }
}

fn ttl(ttl_ms: u64) -> i64 {
    i64::try_from(ttl_ms).unwrap_or(i64::MAX)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every node, the fault generator and the task executing requests.
pub(crate) struct World {
    pub(crate) nodes: Vec<Node>,
    pub(crate) rng: SmallRng,
    seq: u64,
    task: Option<AbortHandle>,
    /// When the task wakes by itself next.
    planned: Option<Instant>,
    /// Executed requests, when recording.
    pub(crate) log: Option<Vec<String>>,
    epoch: Option<Instant>,
}

/// A cluster's shared state.
pub(crate) struct Inner {
    pub(crate) world: Mutex<World>,
    pub(crate) wake: Arc<Notify>,
}

impl Drop for Inner {
    /// Lets the network task see that the nodes are gone and end.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

fn closed() -> NodeError {
    NodeError::new(
        NodeErrorKind::Io,
        "the connection to the node broke (closed by the server or reset)",
    )
}

impl Inner {
    pub(crate) fn new(nodes: usize, seed: u64) -> Self {
        Self {
            world: Mutex::new(World {
                nodes: (0..nodes).map(|_| Node::new()).collect(),
                rng: SmallRng::seed_from_u64(seed),
                seq: 0,
                task: None,
                planned: None,
                log: None,
                epoch: None,
            }),
            wake: Arc::new(Notify::new()),
        }
    }

    pub(crate) fn world(&self) -> std::sync::MutexGuard<'_, World> {
        lock(&self.world)
    }

    /// Opens a connection to node `i` (it breaks with the node's connections).
    pub(crate) fn open(&self, i: usize) -> Arc<Conn> {
        let now = Instant::now();
        let conn = Arc::new(Conn {
            token: CancellationToken::new(),
            fifo: Mutex::new((now, now)),
        });
        let mut w = self.world();
        let conns = &mut w.nodes[i].conns;
        if conns.len() >= 64 {
            conns.retain(|c| !c.token.is_cancelled());
        }
        conns.push(Arc::clone(&conn));
        conn
    }

    /// Sends `req` to node `i` on `conn` now; the future resolves with the reply, fails when
    /// the connection breaks first, and never resolves when the request or its reply is lost.
    pub(crate) fn send(
        self: &Arc<Self>,
        i: usize,
        conn: &Arc<Conn>,
        req: Req,
    ) -> impl Future<Output = Result<Resp, NodeError>> + Send + 'static {
        let rx = self.enqueue(i, conn, req);
        let conn = Arc::clone(conn);
        let inner = Arc::clone(self);
        async move {
            let rx = rx?;
            let reply = async {
                match rx.await {
                    Ok((resp, at)) => {
                        if at > Instant::now() {
                            tokio::time::sleep_until(at).await;
                        }
                        if inner.world().nodes[i].partitioned {
                            std::future::pending::<()>().await;
                        }
                        resp
                    }
                    // Lost on the way, or dropped by the node.
                    Err(_) => std::future::pending().await,
                }
            };
            crate::det::select! {
                () = conn.token.cancelled() => Err(closed()),
                resp = reply => Ok(resp),
            }
        }
    }

    fn enqueue(
        self: &Arc<Self>,
        i: usize,
        conn: &Arc<Conn>,
        req: Req,
    ) -> Result<oneshot::Receiver<(Resp, Instant)>, NodeError> {
        if conn.token.is_cancelled() {
            return Err(closed());
        }
        let now = Instant::now();
        let (tx, rx) = oneshot::channel();
        let mut w = self.world();
        let w = &mut *w;
        if w.task.as_ref().is_none_or(AbortHandle::is_finished) {
            let task = tokio::spawn(serve(Arc::downgrade(self), Arc::clone(&self.wake)));
            w.task = Some(task.abort_handle());
            w.planned = None;
        }
        let node = &mut w.nodes[i];
        let d = node.link(&mut w.rng);
        let mut fifo = lock(&conn.fifo);
        let at = (now + d).max(fifo.0);
        fifo.0 = at;
        drop(fifo);
        w.seq += 1;
        node.queue.push(Reverse(Queued {
            at,
            seq: w.seq,
            conn: Arc::clone(conn),
            req,
            reply: tx,
        }));
        if !node.paused && w.planned.is_none_or(|p| at < p) {
            w.planned = Some(at);
            self.wake.notify_one();
        }
        Ok(rx)
    }

    /// Makes the task look at the queues again (after a resume).
    pub(crate) fn poke(&self) {
        self.world().planned = None;
        self.wake.notify_one();
    }
}

impl World {
    /// Executes every request that has arrived at a running node; returns when the next one
    /// arrives.
    fn run_due(&mut self, now: Instant) -> Option<Instant> {
        let epoch = *self.epoch.get_or_insert(now);
        for i in 0..self.nodes.len() {
            loop {
                let node = &mut self.nodes[i];
                if node.paused {
                    break;
                }
                match node.queue.peek() {
                    Some(Reverse(q)) if q.at <= now => {}
                    _ => break,
                }
                let Some(Reverse(q)) = node.queue.pop() else {
                    break;
                };
                if q.conn.token.is_cancelled() || node.partitioned {
                    continue;
                }
                let mut lost_after = false;
                if node.loss > 0.0 {
                    let r: f64 = self.rng.random();
                    if r < node.loss / 2.0 {
                        continue;
                    }
                    lost_after = r < node.loss;
                }
                let mut line = self.log.as_ref().map(|_| {
                    format!(
                        "{:>9}us n{i} {}",
                        now.saturating_duration_since(epoch).as_micros(),
                        describe(&q.req)
                    )
                });
                let resp = node.exec(now, &q.conn, q.req, &mut self.rng, line.as_mut());
                if let (Some(log), Some(line)) = (self.log.as_mut(), line) {
                    log.push(line);
                }
                if lost_after {
                    continue;
                }
                let d = node.link(&mut self.rng);
                let mut fifo = lock(&q.conn.fifo);
                let at = (now + d).max(fifo.1);
                fifo.1 = at;
                drop(fifo);
                let _ = q.reply.send((resp, at));
            }
        }
        let next = self
            .nodes
            .iter()
            .filter(|n| !n.paused)
            .filter_map(|n| n.queue.peek().map(|Reverse(q)| q.at))
            .min();
        self.planned = next;
        next
    }
}

fn describe(req: &Req) -> String {
    match req {
        Req::Hello { .. } => "HELLO".into(),
        Req::Info => "INFO".into(),
        Req::Get { key } => format!("GET {key}"),
        Req::Pttl { key } => format!("PTTL {key}"),
        Req::SetNx { key, token, ttl_ms } => format!("SETNX {key} {token} {ttl_ms}"),
        Req::LoadScripts => "SCRIPT LOAD".into(),
        Req::OpenSub { .. } => "CONNECT(pubsub)".into(),
        Req::Subscribe(c) => format!("SUBSCRIBE {c:?}"),
        Req::Unsubscribe(c) => format!("UNSUBSCRIBE {c:?}"),
        Req::Ping => "PING".into(),
        Req::Script { sha, call } => {
            let how = if *sha { "EVALSHA" } else { "EVAL" };
            match call {
                Call::Acquire {
                    stamp,
                    keys,
                    token,
                    ttl_ms,
                    ..
                } => format!(
                    "{how} ACQUIRE{} {keys:?} {token} {ttl_ms}",
                    if stamp.is_some() { "" } else { "_UNSTAMPED" }
                ),
                Call::Extend {
                    keys,
                    token,
                    ttl_ms,
                } => format!("{how} EXTEND {keys:?} {token} {ttl_ms}"),
                Call::ExtendMany(b) => format!("{how} EXTEND_MANY {} locks", b.locks.len()),
                Call::Release { keys, token, .. } => format!("{how} RELEASE {keys:?} {token}"),
            }
        }
    }
}

/// The task executing requests as they arrive. Holds the cluster weakly: it ends with it.
async fn serve(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let notified = wake.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        let next = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            inner.world().run_due(Instant::now())
        };
        match next {
            Some(at) => {
                crate::det::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            None => notified.await,
        }
    }
}
