//! Real Redis nodes: multiplexed connections opened in the background, a handshake that
//! preloads the scripts and learns the server's identity (and, with the restart quarantine on,
//! its uptime), requests handed over in program order, and error messages scrubbed of secrets.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{self, BoxFuture};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::{Backend, Batch, Fate, Op, Renewed, Reply};
use crate::engine;
use crate::error::{ConfigError, NodeError, NodeErrorKind};
use crate::scripts::{self, LuaScript};
use crate::token::Token;
use crate::url::{NodeSpec, scrub};

mod batch;
mod native;

use batch::Outbox;
use native::{DeleteIfEqual, Native};

/// Requests that may wait in one connection's client-side queue.
const REQUEST_QUEUE: usize = 1 << 16;

/// Requests that find a full queue (the outbox, or the requests waiting for a connection)
/// between two scans of it for requests nobody waits for any more: a scan reads every waiting
/// request, and one per this many keeps each request's share of that work to a few reads.
const RESCAN_AFTER: usize = REQUEST_QUEUE / 16;

/// Whether a request that finds its connection closed may go out once more on a new one (see
/// [`RedisNode::submit`]); a request sent again may not.
#[derive(Clone, Copy)]
enum Again {
    May,
    Not,
}

/// What a connection's handshake learned, shared by every request sent on that connection.
#[derive(Clone)]
struct Live {
    conn: MultiplexedConnection,
    /// Which connection of this node this is; a failure only forgets its own connection.
    generation: u64,
    /// The server's identity record as read at connect (`<id>@<created ms>`); every scripted
    /// acquire checks that the server still holds exactly this record.
    record: Arc<str>,
    /// The id part of the record: the node's name in claims and fence tokens.
    id: Arc<str>,
    /// While the node is in its restart quarantine it grants nothing.
    quarantined_until: Option<Instant>,
    /// Requests made while earlier ones are in flight on this connection, sent together.
    outbox: Arc<Outbox>,
    /// The conditional commands the server has natively.
    native: Native,
    /// The server refused a native command on this connection (see `RedisNode::request`):
    /// the scripts are used instead.
    native_refused: Arc<AtomicBool>,
    /// Whether answers still come back on this connection.
    heard: Arc<Heard>,
    /// Whether the runtime whose task drives this connection still runs.
    runtime: Arc<RuntimeWatch>,
}

/// Whether the runtime a connection was opened on still runs. The connection's I/O is a task
/// of that runtime (redis-rs spawns it there); once the runtime shuts down, every request on
/// the connection fails at once ("broken pipe") without being sent. A program without a
/// runtime of its own makes one per call (`Runtime::new()?.block_on(..)`), and each call found
/// the connections of the one before dead: a single attempt failed on every node, however
/// healthy (test `lifecycle::one_attempt_per_runtime_gets_the_lock_from_healthy_nodes`). A
/// task of the same runtime, which ends only when the connection is forgotten or the runtime
/// drops it, tells which; a request that finds the runtime gone opens a new connection on its
/// own runtime instead.
struct RuntimeWatch {
    gone: Arc<AtomicBool>,
    /// Dropped with the connection's last handle, which ends the watching task.
    _forgotten: oneshot::Sender<()>,
}

impl RuntimeWatch {
    /// Watches the current runtime (a connection opened outside one never counts as gone).
    fn current() -> Arc<Self> {
        struct SetOnDrop(Arc<AtomicBool>);
        impl Drop for SetOnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let gone = Arc::new(AtomicBool::new(false));
        let (forgotten, watched) = oneshot::channel::<()>();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let set = SetOnDrop(Arc::clone(&gone));
            drop(rt.spawn(async move {
                let _set = set;
                let _ = watched.await;
            }));
        }
        Arc::new(Self {
            gone,
            _forgotten: forgotten,
        })
    }

    fn gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }
}

/// Whether a connection still answers. A connection can go silent while its server is fine —
/// a middlebox that lost the session's state, a partition after which the kernel's
/// retransmissions back off for minutes — and a timeout, unlike an error, says nothing about
/// the connection: without this, such a connection was used on and on, and the node lost its
/// vote for as long as the TCP session lived (up to the kernel's retransmission limit, about
/// 15 minutes; for good behind a proxy that acknowledges what it does not forward). Test
/// `silent_connections::a_silent_connection_to_a_healthy_node_is_replaced`.
///
/// A request waits from when it is sent until its answer, and nothing coming back on the
/// connection for longer than the connect timeout while one waits is what starts a check. An
/// answer says the connection was alive then, not that the requests sent after it will be
/// answered: the wait goes on from that answer while any is still waiting. (An answer used to
/// end the wait whatever was still waiting, and a renewal sent just before the connection went
/// silent waited unchecked until its lock's validity ran out: test `silent_connections::a_
/// renewal_sent_just_before_its_connection_goes_silent_gets_the_connection_checked`.) A request
/// given up unanswered leaves the wait as it is: its answer may never come.
#[derive(Default)]
struct Heard {
    waits: Mutex<Waits>,
    /// A `PING` is checking the connection.
    probing: AtomicBool,
}

#[derive(Default)]
struct Waits {
    /// Requests sent and neither answered nor given up.
    pending: usize,
    /// Since when nothing came back while a request waited, as microseconds since the node's
    /// `born` plus one; 0 when no request waits unanswered.
    since: u64,
}

impl Waits {
    fn heard(&mut self, now: u64) {
        self.since = if self.pending > 0 { now } else { 0 };
    }
}

impl Heard {
    /// A request is sent at `now`; the [`Sent`] returned marks it answered or given up.
    fn sending(self: &Arc<Self>, now: u64) -> Sent {
        let mut w = lock(&self.waits);
        w.pending += 1;
        if w.since == 0 {
            w.since = now;
        }
        Sent(Some(Arc::clone(self)))
    }

    /// Something came back at `now`: the check's `PING` was answered.
    fn heard(&self, now: u64) {
        lock(&self.waits).heard(now);
    }

    /// Whether a request has waited for an answer since more than `patience` before `now`.
    fn silent_for(&self, now: u64, patience: Duration) -> bool {
        let since = lock(&self.waits).since;
        since != 0 && u128::from(now.saturating_sub(since)) > patience.as_micros()
    }
}

/// A request sent on a connection and not yet answered (see [`Heard`]); dropped unanswered, it
/// was given up.
struct Sent(Option<Arc<Heard>>);

impl Sent {
    fn answered(mut self, now: u64) {
        if let Some(heard) = self.0.take() {
            let mut w = lock(&heard.waits);
            w.pending = w.pending.saturating_sub(1);
            w.heard(now);
        }
    }
}

impl Drop for Sent {
    fn drop(&mut self) {
        if let Some(heard) = self.0.take() {
            let mut w = lock(&heard.waits);
            w.pending = w.pending.saturating_sub(1);
        }
    }
}

/// A check of a connection under way ([`Heard::probing`]), ended when this is dropped, however
/// the check ends: it runs on the runtime of the request that started it, and a check dropped
/// with its runtime once left the flag set, so that the connection was never checked again and
/// a healthy node behind a silent connection lost its vote for good (test `silent_connections::
/// a_check_cut_short_by_its_runtime_does_not_stop_later_checks`).
struct Probing(Arc<Heard>);

impl Drop for Probing {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
    }
}

/// Whether `answer` came from the server (a reply, an error reply), as opposed to an error made
/// on this side (a connection that failed, a quarantine) that proves nothing about it.
fn from_server<T>(answer: &Result<T, NodeError>) -> bool {
    match answer {
        Ok(_) => true,
        Err(e) => matches!(
            e.kind(),
            NodeErrorKind::Server | NodeErrorKind::Auth | NodeErrorKind::Identity
        ),
    }
}

/// The identities of one client's nodes. One server reached through two of the configured
/// addresses would cast two votes in a quorum; the second of them to connect is refused, and
/// the client reports the configuration error from then on.
pub(crate) struct Identities {
    names: Vec<Arc<str>>,
    ids: Mutex<Vec<Option<Arc<str>>>>,
    conflict: OnceLock<ConfigError>,
}

impl Identities {
    pub(crate) fn new(names: Vec<Arc<str>>) -> Self {
        let n = names.len();
        Self {
            names,
            ids: Mutex::new(vec![None; n]),
            conflict: OnceLock::new(),
        }
    }

    /// Records that node `index` is the server `id`; fails when another node already is.
    pub(crate) fn claim(&self, index: usize, id: &Arc<str>) -> Result<(), ConfigError> {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(other) = ids
            .iter()
            .enumerate()
            .position(|(j, known)| j != index && known.as_deref() == Some(&**id))
        {
            let (first, second) = (other.min(index), other.max(index));
            let err = ConfigError::SameServer {
                first,
                second,
                first_node: self.names[first].to_string(),
                second_node: self.names[second].to_string(),
                server: id.to_string(),
            };
            let _ = self.conflict.set(err.clone());
            return Err(err);
        }
        ids[index] = Some(Arc::clone(id));
        Ok(())
    }

    pub(crate) fn conflict(&self) -> Option<ConfigError> {
        self.conflict.get().cloned()
    }
}

/// Where a node keeps its records, and how it treats restarts.
#[derive(Debug, Clone)]
pub(crate) struct NodeKeys {
    /// The server's identity record.
    pub(crate) identity: Arc<str>,
    /// The claim-stamp counter.
    pub(crate) stamp: Arc<str>,
    /// Restart quarantine (`None` = off).
    pub(crate) quarantine: Option<Duration>,
}

/// A request waiting for the connection: `send` is called once with it (or with the error that
/// kept it from opening), in the order the requests were made.
struct Deferred {
    send: Box<dyn FnOnce(Result<Live, NodeError>) + Send>,
    /// Set when its caller stops waiting, for a request that need not reach the node: it is
    /// then not sent, and makes room in a full queue. `None` for one that must reach it.
    gone: Option<Arc<AtomicBool>>,
}

impl Deferred {
    fn abandoned(&self) -> bool {
        self.gone
            .as_ref()
            .is_some_and(|g| g.load(Ordering::Acquire))
    }
}

/// Marks a waiting request abandoned when its caller's future is dropped.
struct Gone(Arc<AtomicBool>);

impl Drop for Gone {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The connection, or the requests waiting for it to open.
#[derive(Default)]
struct Slot {
    live: Option<Live>,
    /// Requests made while the connection was not open (or while earlier ones were still
    /// being handed over): sent in this order once it is.
    queue: VecDeque<Deferred>,
    /// A background task is opening the connection (or handing the queue over).
    opening: bool,
    /// Requests that found the queue full since it was last rid of abandoned ones, modulo
    /// [`RESCAN_AFTER`].
    found_full: usize,
}

/// The task opening a node's connection. If it ends without finishing — its runtime shut down,
/// or there was none — the node is marked "not opening" again and the waiting requests fail,
/// so the next request starts a new opening instead of queueing behind one that is gone.
struct Opener {
    node: Arc<RedisNode>,
    finished: bool,
}

impl Opener {
    /// The opening is over and the queue handed over; nothing to undo.
    fn finish(&mut self) {
        self.finished = true;
    }
}

/// A release on its way to a node. Dropped before its answer — its phase stopped waiting for
/// the node, or the cleanup's grace ran out just after the request was handed to the connection
/// — it is driven on in a task of its own for [`engine::DELIVERY_GRACE`] more: the connection
/// skips a command whose caller is gone before the command is written, and a release skipped
/// that way leaves the grant it should delete until its TTL.
struct SeenThrough(Option<BoxFuture<'static, Result<Reply, NodeError>>>);

impl SeenThrough {
    fn boxed(
        call: BoxFuture<'static, Result<Reply, NodeError>>,
    ) -> BoxFuture<'static, Result<Reply, NodeError>> {
        Box::pin(Self(Some(call)))
    }
}

impl Future for SeenThrough {
    type Output = Result<Reply, NodeError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(call) = self.0.as_mut() else {
            return Poll::Pending;
        };
        let answer = ready!(call.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(answer)
    }
}

impl Drop for SeenThrough {
    fn drop(&mut self) {
        if let (Some(call), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            drop(rt.spawn(tokio::time::timeout(engine::DELIVERY_GRACE, call)));
        }
    }
}

impl Drop for Opener {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let stranded: Vec<Deferred> = {
            let mut slot = lock(&self.node.slot);
            slot.opening = false;
            slot.queue.drain(..).collect()
        };
        for request in stranded {
            (request.send)(Err(NodeError::new(
                NodeErrorKind::Connect,
                "the task opening the connection ended (its runtime shut down) before it was open",
            )));
        }
    }
}

/// One Redis master. Its connection is opened in the background, once for all callers, and a
/// request waits for it only within its own budget; requests are handed to the connection in
/// the order they were made, also while it is being opened.
pub(crate) struct RedisNode {
    index: usize,
    name: Arc<str>,
    client: Client,
    /// The database the node's keys are in.
    db: i64,
    password: Option<String>,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    keys: NodeKeys,
    identities: Arc<Identities>,
    slot: Mutex<Slot>,
    generation: AtomicU64,
    reloading: AtomicBool,
    /// The origin of the times kept in [`Heard`].
    born: Instant,
    renewal_cost: RenewalCost,
    distance: Distance,
    /// [`engine::rank_seed`] of the server's identity, read at connect; 0 until then.
    rank_seed: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RedisNode {
    pub(crate) fn new(
        index: usize,
        spec: &NodeSpec,
        connect_timeout: Duration,
        tls_root_ca: Option<&[u8]>,
        keys: NodeKeys,
        identities: Arc<Identities>,
    ) -> Result<Self, String> {
        let password = spec.info.redis_settings().password().map(str::to_owned);
        let db = spec.info.redis_settings().db();
        let client = match (spec.tls, tls_root_ca) {
            #[cfg(feature = "tls")]
            (true, Some(ca)) => {
                // Without a process-wide provider rustls cannot build a client config; ignore
                // the error when the application already installed one.
                let _ = rustls::crypto::ring::default_provider().install_default();
                Client::build_with_tls(
                    spec.info.clone(),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(ca.to_vec()),
                    },
                )
            }
            _ => {
                #[cfg(feature = "tls")]
                if spec.tls {
                    let _ = rustls::crypto::ring::default_provider().install_default();
                }
                Client::open(spec.info.clone())
            }
        }
        .map_err(|e| scrub(&e.to_string(), &[password.as_deref()]))?;
        // Our own per-node timeout bounds every call; the client must not race it with a
        // response timeout of its own (which would also drop the reply we wait for).
        // The request queue must have room: a request is handed to the connection with one
        // poll in the caller's task (see `engine::handed_over`), and only a request that finds
        // room is queued at once, in program order. With the default of 50, two tasks waiting
        // for room could be let in in either order, and a release could overtake its acquire.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None)
            .set_pipeline_buffer_size(REQUEST_QUEUE);
        Ok(Self {
            index,
            name: spec.name.clone(),
            client,
            db,
            password,
            config,
            connect_timeout,
            keys,
            identities,
            slot: Mutex::default(),
            generation: AtomicU64::new(0),
            reloading: AtomicBool::new(false),
            born: Instant::now(),
            renewal_cost: RenewalCost::default(),
            distance: Distance::default(),
            rank_seed: AtomicU64::new(0),
        })
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The client, for the release-notification subscription.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Builds the request on the open connection. With the connection open and nobody waiting
    /// before it, the request is created at once, and the caller's first poll hands it to the
    /// connection. Otherwise it joins the queue of requests waiting for the connection, which
    /// the task opening it hands over in order, in one pass, as soon as it is open — so a release
    /// made after its acquire while the connection was being opened still reaches the node
    /// after it. The caller waits for the connection only as long as it waits for the answer
    /// (its node timeout); the opening goes on in the background, bounded by the connect
    /// timeout.
    ///
    /// A queued request nobody waits for any more is not sent, unless it `must_reach` the node:
    /// a release (or the cleanup of an abandoned attempt) may undo a grant queued ahead of it,
    /// and the phase that made that grant may wait for it longer than the release's phase waits
    /// (a racing attempt allows its other nodes more time), so a grant could land with nothing
    /// left to remove it. Releases are owner-checked: one sent late deletes only what is still
    /// ours.
    fn with_live<T, F>(
        self: &Arc<Self>,
        must_reach: bool,
        request: F,
    ) -> BoxFuture<'static, Result<T, NodeError>>
    where
        T: Send + 'static,
        F: FnOnce(Live) -> BoxFuture<'static, Result<T, NodeError>> + Send + 'static,
    {
        self.with_live_as(must_reach, true, None, request)
    }

    /// [`RedisNode::with_live`]; with `watch`, the request counts as sent to the server, and
    /// its answer as a sign of life of the connection (see [`Heard`]). A request that waits
    /// for the connection to open is recorded as waiting in `fate`, as in the outbox (see
    /// [`RedisNode::submit`]): its lock's release withdraws it, and spares the node.
    fn with_live_as<T, F>(
        self: &Arc<Self>,
        must_reach: bool,
        watch: bool,
        fate: Option<&Fate>,
        request: F,
    ) -> BoxFuture<'static, Result<T, NodeError>>
    where
        T: Send + 'static,
        F: FnOnce(Live) -> BoxFuture<'static, Result<T, NodeError>> + Send + 'static,
    {
        let node = Arc::clone(self);
        let request = move |live: Live| {
            if !watch {
                return request(live);
            }
            let sent = node.micros();
            let waiting = live.heard.sending(sent);
            let call = request(live);
            async move {
                let answer = call.await;
                if from_server(&answer) {
                    let now = node.micros();
                    waiting.answered(now);
                    node.distance.note(now.saturating_sub(sent));
                }
                answer
            }
            .boxed()
        };
        let mut slot = lock(&self.slot);
        if slot.live.as_ref().is_some_and(|l| l.runtime.gone()) {
            // Its runtime shut down: nothing can be sent on it any more (see `RuntimeWatch`).
            slot.live = None;
        }
        if !slot.opening
            && slot.queue.is_empty()
            && let Some(live) = &slot.live
        {
            let live = live.clone();
            drop(slot);
            if watch {
                self.check_silence(&live);
            }
            return request(live);
        }
        // Bounded like the outbox: while a connection to a hung node opens (up to the connect
        // timeout), requests wait here, each with its keys and token; without a bound a long
        // connect timeout let them grow with the request rate (test `tests::requests_waiting_
        // for_a_connection_are_bounded`: 66,536 of 66,536 waited). A release (or cleanup) is
        // never refused: the grant it undoes may have been sent on an earlier connection.
        // Requests nobody waits for any more make room, found by a scan of the whole queue
        // once per `RESCAN_AFTER` requests that find it full, as in the outbox (test
        // `tests::requests_nobody_waits_for_make_room_while_the_connection_opens`: refused
        // after 65,536 abandoned ones).
        if !must_reach && slot.queue.len() >= REQUEST_QUEUE {
            if slot.found_full == 0 {
                slot.queue.retain(|d| !d.abandoned());
            }
            slot.found_full = (slot.found_full + 1) % RESCAN_AFTER;
        }
        if !must_reach && slot.queue.len() >= REQUEST_QUEUE {
            if let Some(f) = fate {
                f.refused();
            }
            return future::ready(Err(NodeError::new(
                NodeErrorKind::Io,
                format!("{REQUEST_QUEUE} requests are already waiting for this node's connection"),
            )))
            .boxed();
        }
        // Nothing records a request waiting here but `fate`: unmarked, every release of a
        // lock whose acquire waited for a connection that opened only later (the node hung
        // while it opened) went to the node too, and ran there once it resumed (test
        // `batch_attacks::releases_are_not_queued_for_a_hung_node_whose_connection_never_
        // opened`: 2,000 of 2,000). Handed over, the request goes through the outbox, which
        // sends none that was withdrawn meanwhile.
        if fate.is_some_and(|f| !f.waiting()) {
            return future::ready(Err(batch::withdrawn())).boxed();
        }
        let (tx, rx) = oneshot::channel();
        let gone = (!must_reach).then(|| Gone(Arc::new(AtomicBool::new(false))));
        slot.queue.push_back(Deferred {
            gone: gone.as_ref().map(|g| Arc::clone(&g.0)),
            send: Box::new(move |conn: Result<Live, NodeError>| {
                // Nobody waits for this request any more (its phase gave up on it after its
                // budget and delivery grace): an acquire or extension not sent changes nothing.
                if tx.is_closed() && !must_reach {
                    return;
                }
                let call = match conn {
                    Ok(live) => engine::handed_over(request(live)),
                    Err(e) => engine::Handed::answered(Err(e)),
                };
                // Dropped unanswered, a request that must reach the node is seen through (see
                // `RedisNode::run`).
                let _ = tx.send(call);
            }),
        });
        let open = !std::mem::replace(&mut slot.opening, true);
        drop(slot);
        if open {
            self.spawn_open();
        }
        async move {
            let _gone = gone;
            match rx.await {
                Ok(call) => call.await,
                Err(_) => Err(NodeError::new(
                    NodeErrorKind::Io,
                    "the connection task ended before sending the request",
                )),
            }
        }
        .boxed()
    }

    /// Opens the connection in a background task, then hands the waiting requests over.
    fn spawn_open(self: &Arc<Self>) {
        let opener = Opener {
            node: Arc::clone(self),
            finished: false,
        };
        let open = async move {
            let mut opener = opener;
            let node = Arc::clone(&opener.node);
            let result = match tokio::time::timeout(node.connect_timeout, node.handshake()).await {
                Ok(result) => result,
                Err(_) => Err(NodeError::new(
                    NodeErrorKind::Connect,
                    format!(
                        "no connection within the connect timeout ({:?})",
                        node.connect_timeout
                    ),
                )),
            };
            // The connection counts as open at once (for request budgets), but requests keep
            // queueing while earlier ones are handed over: it is used directly only once the
            // queue is empty.
            lock(&node.slot).live = result.as_ref().ok().cloned();
            loop {
                let waiting = {
                    let mut slot = lock(&node.slot);
                    if slot.queue.is_empty() {
                        slot.opening = false;
                        opener.finish();
                        return;
                    }
                    std::mem::take(&mut slot.queue)
                };
                for request in waiting {
                    (request.send)(result.clone());
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(open)),
            // Dropping the future fails the queued requests (see `Opener`).
            Err(_) => drop(open),
        }
    }

    /// Whether the connection is open (requests are sent at once). Not one whose runtime shut
    /// down (see [`RuntimeWatch`]): the next request opens a new connection, and its budget
    /// allows for that; budgeted as on an open connection, one attempt per runtime over a
    /// 24 ms round trip failed on every node (test `lifecycle::one_attempt_per_runtime_gets_
    /// the_lock_over_a_slower_link`).
    pub(crate) fn is_open(&self) -> bool {
        lock(&self.slot)
            .live
            .as_ref()
            .is_some_and(|l| !l.runtime.gone())
    }

    /// The connection a request made now goes out on, if it goes out on the open one at
    /// once (see [`RedisNode::with_live`]): its generation, which changes whenever the
    /// connection is replaced. `None` while none is open or requests wait for one.
    pub(crate) fn connection(&self) -> Option<u64> {
        let slot = lock(&self.slot);
        if slot.opening || !slot.queue.is_empty() {
            return None;
        }
        slot.live
            .as_ref()
            .filter(|l| !l.runtime.gone())
            .map(|l| l.generation)
    }

    /// Whether connection `generation` is still the one requests go out on. Asked by a caller
    /// that waits on a request it sent there, so the connection is checked as a new request on
    /// it would check it (see [`RedisNode::check_silence`]): one that has gone silent gets
    /// checked, and replaced if its server answers a new connection, without waiting for
    /// another request to be made on it.
    pub(crate) fn still_current(self: &Arc<Self>, generation: u64) -> bool {
        let live = match &lock(&self.slot).live {
            Some(l) if l.generation != generation => return false,
            Some(l) if l.heard.silent_for(self.micros(), self.connect_timeout) => l.clone(),
            Some(_) => return true,
            None => return false,
        };
        self.check_silence(&live);
        true
    }

    /// Opens the connection now (if it is not open), waiting for the outcome.
    pub(crate) async fn connect(self: &Arc<Self>) -> Result<(), NodeError> {
        self.with_live_as(false, false, None, |_| future::ready(Ok(())).boxed())
            .await
    }

    /// Connects, preloads the scripts, reads (or creates) the server's identity record and,
    /// with the restart quarantine on, the server's uptime.
    async fn handshake(&self) -> Result<Live, NodeError> {
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| self.node_error(&e, None))?;
        let fresh = Token::random()
            .map_err(|e| NodeError::new(NodeErrorKind::Io, format!("no randomness: {e}")))?;
        let mut pipe = redis::pipe();
        for s in scripts::all() {
            pipe.cmd("SCRIPT").arg("LOAD").arg(s.source).ignore();
        }
        pipe.cmd("EVALSHA")
            .arg(&scripts::IDENTITY.sha)
            .arg(1)
            .arg(&*self.keys.identity)
            .arg(&fresh.expose()[..16])
            .arg(self.db);
        let answers: Vec<(String, String, String)> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.node_error(&e, None))?;
        let Some((record, now_ms, server)) = answers.into_iter().next() else {
            return Err(NodeError::new(
                NodeErrorKind::Server,
                "no answer to the identity script",
            ));
        };
        let (id, created_ms) = parse_record(&record, &self.keys.identity)?;
        // The server's own record (database 0's): the same for every database of one server.
        let (server, _) = parse_record(&server, &self.keys.identity)?;
        // Without an answer (an old server, or an ACL user without HELLO) the scripts serve.
        let native = match redis::cmd("HELLO")
            .query_async::<redis::Value>(&mut conn)
            .await
        {
            Ok(hello) => Native::from_hello(&hello),
            Err(_) => Native::default(),
        };
        let quarantined_until = match self.keys.quarantine {
            None => None,
            Some(q) => {
                let info: String = redis::cmd("INFO")
                    .arg("server")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| {
                        let mut err = self.node_error(&e, None);
                        if err.kind() == NodeErrorKind::Auth {
                            err = NodeError::new(
                                NodeErrorKind::Auth,
                                format!("the restart quarantine reads the server's uptime with INFO, which the user may not run (grant +info): {err}"),
                            );
                        }
                        err
                    })?;
                quarantine_until(
                    q,
                    info_field(&info, "uptime_in_seconds"),
                    created_ms,
                    &now_ms,
                )?
            }
        };
        self.identities
            .claim(self.index, &server)
            .map_err(|e| NodeError::new(NodeErrorKind::Identity, e.to_string()))?;
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        // Ranked by the server from now on (0 stands for "not known").
        self.rank_seed
            .store(crate::engine::rank_seed(&id).max(1), Ordering::Relaxed);
        tracing::debug!(node = %self.name, server = %id, quarantined_for = ?quarantined_until.map(|u| u.saturating_duration_since(Instant::now())), "connected");
        Ok(Live {
            conn,
            generation,
            record: record.into(),
            id,
            quarantined_until,
            outbox: Arc::default(),
            native,
            native_refused: Arc::default(),
            heard: Arc::default(),
            runtime: RuntimeWatch::current(),
        })
    }

    /// Microseconds since `born`, plus one (0 means "none" in [`Heard`]).
    fn micros(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// When a request on `live` has waited for an answer longer than the connect timeout,
    /// checks the connection with a `PING` in the background (one check at a time). Answered,
    /// the connection is merely slow, or its last requests were dropped before their answers
    /// came. Not answered within the connect timeout, a `PING` on a new connection tells a
    /// silent connection from a hung server: only when the server answers that one, and the
    /// old connection's `PING` stays unanswered for another connect timeout, is the old
    /// connection forgotten, so that the next request opens a new one, as after a broken
    /// connection. Checked when a request is made on the connection, and while a renewal
    /// waits on a call sent there ([`RedisNode::still_current`]).
    ///
    /// A hung server (`SIGSTOP`, a long fork) keeps its connection: the requests queued on it
    /// run in order when it wakes. Replacing that connection too let a cleanup sent on the new
    /// one run before the grant it undoes, still waiting on the old one, and leave that key for
    /// a TTL (a 1.5 s pause under load: 1 to 3 keys left in 4 of 8 runs).
    fn check_silence(self: &Arc<Self>, live: &Live) {
        let patience = self.connect_timeout;
        if !live.heard.silent_for(self.micros(), patience)
            || live.heard.probing.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let probing = Probing(Arc::clone(&live.heard));
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (node, live) = (Arc::clone(self), live.clone());
        drop(rt.spawn(async move {
            let _probing = probing;
            let mut conn = live.conn.clone();
            let mut ping = Box::pin(async move {
                redis::cmd("PING")
                    .query_async::<redis::Value>(&mut conn)
                    .await
            });
            // Whether the server answers a new connection is asked while the old one's `PING`
            // waits, and asked again at once after a try that ran out of time (a busy moment
            // while it opened; a hung server answers no try), for as long as the `PING` waits.
            // Asked only after the `PING` had waited, and not again after a try that ran out of
            // time, a check met by one slow opening took 2.4 s longer, and a guarded lock that
            // needed the node kept 0.4 s of its 8 s (test `silent_connections::a_guard_keeps_
            // its_lock_when_the_check_of_a_silent_connection_meets_a_slow_opening`). The old
            // connection is still given as long as before to answer — two connect timeouts
            // for its `PING`, and one after the server answered elsewhere — so that a
            // connection that is merely slow (a long round trip behind a backlog) is kept.
            let ping_sent = tokio::time::Instant::now();
            let elsewhere = async {
                loop {
                    let next = tokio::time::Instant::now() + patience;
                    if node.answers_elsewhere(patience).await {
                        break;
                    }
                    // A try that failed at once (a refused connection) waits out its connect
                    // timeout before the next: back to back, the check opened 6,074 connections
                    // in 2 s while new ones were closed as soon as accepted (test `silent_
                    // connections::a_check_whose_new_connections_fail_at_once_does_not_open_
                    // them_back_to_back`, found in review).
                    tokio::time::sleep_until(next).await;
                }
            };
            let answer = tokio::select! {
                answer = &mut ping => Some(answer),
                () = elsewhere => match tokio::time::timeout_at(
                    (ping_sent + patience * 2).max(tokio::time::Instant::now() + patience),
                    &mut ping,
                )
                .await
                {
                    Ok(answer) => Some(answer),
                    Err(_) => {
                        tracing::debug!(node = %node.name, ?patience, "no answer on the connection while the server answers a new one; replacing it");
                        node.invalidate(live.generation);
                        node.retire(&live);
                        None
                    }
                },
            };
            match answer {
                Some(Ok(_)) => live.heard.heard(node.micros()),
                Some(Err(e)) if e.code().is_some() => live.heard.heard(node.micros()),
                Some(Err(e)) => drop(node.failed(&live, &e, "")),
                None => {}
            }
        }));
    }

    /// Whether the server answers a `PING` on a new connection within `patience`.
    async fn answers_elsewhere(&self, patience: Duration) -> bool {
        let ping = async {
            let mut conn = self
                .client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await?;
            redis::cmd("PING")
                .query_async::<redis::Value>(&mut conn)
                .await
        };
        match tokio::time::timeout(patience, ping).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => e.code().is_some(),
            Err(_) => false,
        }
    }

    /// Forgets connection `generation` after it failed, so the next call reconnects.
    fn invalidate(&self, generation: u64) {
        let mut slot = lock(&self.slot);
        if slot
            .live
            .as_ref()
            .is_some_and(|l| l.generation == generation)
        {
            slot.live = None;
        }
    }

    /// Loads the scripts again after a node lost its script cache (`SCRIPT FLUSH`). Runs in
    /// the background, one reload at a time.
    ///
    /// The flag is cleared when the task ends, also when it is dropped unfinished with its
    /// runtime: left set, no later loss of the cache was ever reloaded, and every acquire on
    /// the node failed with `NOSCRIPT` for as long as the connection lived (test
    /// `lifecycle::a_script_reload_cut_short_by_its_runtime_does_not_stop_later_reloads`).
    fn reload_scripts(self: &Arc<Self>, mut conn: MultiplexedConnection) {
        struct Reloading(Arc<RedisNode>);
        impl Drop for Reloading {
            fn drop(&mut self) {
                self.0.reloading.store(false, Ordering::SeqCst);
            }
        }
        if self.reloading.swap(true, Ordering::SeqCst) {
            return;
        }
        let reloading = Reloading(Arc::clone(self));
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        drop(rt.spawn(async move {
            let node = &reloading.0;
            let mut load = redis::pipe();
            for s in scripts::all() {
                load.cmd("SCRIPT").arg("LOAD").arg(s.source).ignore();
            }
            let done: redis::RedisResult<()> =
                tokio::time::timeout(node.connect_timeout, load.query_async(&mut conn))
                    .await
                    .unwrap_or_else(|_| Ok(()));
            if let Err(e) = done {
                tracing::debug!(node = %node.name, error = %node.node_error(&e, None), "reloading scripts failed");
            }
        }));
    }

    fn node_error(&self, e: &redis::RedisError, token: Option<&str>) -> NodeError {
        let kind = match e.code() {
            _ if e.kind() == redis::ErrorKind::AuthenticationFailed => NodeErrorKind::Auth,
            Some("WRONGPASS" | "NOAUTH" | "NOPERM") => NodeErrorKind::Auth,
            _ if e.is_connection_refusal() => NodeErrorKind::Connect,
            _ if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() => {
                NodeErrorKind::Io
            }
            Some(_) => NodeErrorKind::Server,
            None => NodeErrorKind::Io,
        };
        NodeError::new(
            kind,
            scrub(&e.to_string(), &[self.password.as_deref(), token]),
        )
    }

    /// Converts a command error, dropping the connection when it is broken (a request that
    /// found it so before it was written goes out again on a new one: see
    /// [`RedisNode::submit`]).
    fn failed(&self, live: &Live, e: &redis::RedisError, token: &str) -> NodeError {
        if e.is_unrecoverable_error() || e.is_connection_dropped() || e.is_io_error() {
            self.invalidate(live.generation);
        }
        self.node_error(e, Some(token))
    }

    /// `EVALSHA`, and on `NOSCRIPT` an `EVAL` that also reloads the script. Only for scripts
    /// that never create a key: the fallback is a second request, sent later than the first,
    /// so it may run after requests that were made after it.
    async fn eval<T: redis::FromRedisValue>(
        &self,
        live: &Live,
        script: &LuaScript,
        keys: &[&str],
        args: &[&str],
        token: &str,
    ) -> Result<T, NodeError> {
        let mut conn = live.conn.clone();
        let res: redis::RedisResult<T> = evalsha(script, keys, args).query_async(&mut conn).await;
        let res = match res {
            Err(e) if e.code() == Some("NOSCRIPT") => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(script.source).arg(keys.len()).arg(keys).arg(args);
                cmd.query_async(&mut conn).await
            }
            other => other,
        };
        res.map_err(|e| self.failed(live, &e, token))
    }

    async fn set_nx(
        &self,
        live: &Live,
        key: &str,
        token: &str,
        ttl_ms: u64,
    ) -> Result<Reply, NodeError> {
        let mut conn = live.conn.clone();
        let res: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut conn)
            .await;
        match res {
            Ok(Some(_)) => Ok(Reply::Yes {
                claim: None,
                heard: None,
                kept: false,
                at_us: None,
            }),
            Ok(None) => Ok(Reply::No),
            Err(e) => Err(self.failed(live, &e, token)),
        }
    }

    /// Whether an acquire can be a plain `SET NX PX`: one key, no stamp, neither a re-arm (a
    /// token that may be on the node) nor an identity check asked for (`scripted`), and no
    /// restart quarantine (whose identity check needs the script).
    fn plain_set_nx(&self, stamped: bool, keys: usize, scripted: bool) -> bool {
        !stamped && keys == 1 && !scripted && self.keys.quarantine.is_none()
    }

    /// One acquire request on the open connection; `scripted`: see [`Self::plain_set_nx`].
    async fn acquire(self: &Arc<Self>, live: Live, op: &Op) -> Result<Reply, NodeError> {
        let Op::Acquire {
            stamped,
            ref keys,
            ref token,
            ttl_ms,
            ..
        } = *op
        else {
            return Err(NodeError::new(NodeErrorKind::Server, "not an acquire"));
        };
        let (scripted, timed) = (op.scripted(), op.timed());
        // (The restart quarantine was checked when the request was submitted.)
        let t = token.expose();
        if let ([key], true) = (&**keys, self.plain_set_nx(stamped, keys.len(), scripted)) {
            return self.set_nx(&live, key, t, ttl_ms).await;
        }
        let ttl = ttl_ms.to_string();
        // A fourth argument asks a grant for the node's clock (`scripts::GRANT_CLOCK`).
        let args = [t, ttl.as_str(), &*live.record, "t"];
        let args = if timed { &args[..] } else { &args[..3] };
        let (script, mut all) = if stamped {
            (
                &*scripts::ACQUIRE,
                vec![&*self.keys.identity, &*self.keys.stamp],
            )
        } else {
            (&*scripts::ACQUIRE_UNSTAMPED, vec![&*self.keys.identity])
        };
        all.extend(keys.iter().map(String::as_str));
        let mut conn = live.conn.clone();
        let answer: redis::Value = match evalsha(script, &all, args).query_async(&mut conn).await {
            Ok(answer) => answer,
            Err(e) if e.code() == Some("NOSCRIPT") => {
                // Not executed. No late EVAL: it would run after anything sent meanwhile —
                // possibly this very lock's release — and leave a key nobody owns. The vote
                // is lost for this attempt only; the scripts are reloaded for the next.
                self.reload_scripts(live.conn.clone());
                return Err(NodeError::new(
                    NodeErrorKind::Server,
                    "NOSCRIPT: the node lost its script cache; not executed (reloading the scripts)",
                ));
            }
            Err(e) => return Err(self.failed(&live, &e, t)),
        };
        // A grant asked for the clock answers `{value, clock}`; anything else one integer.
        let (answer, at_us) = match answer {
            redis::Value::Int(n) => (n, None),
            redis::Value::Array(pair) => match pair.as_slice() {
                [redis::Value::Int(n), redis::Value::Int(at)] => (*n, u64::try_from(*at).ok()),
                _ => return Err(unexpected_acquire_answer()),
            },
            _ => return Err(unexpected_acquire_answer()),
        };
        self.acquired(&live, stamped, at_us, answer)
    }

    /// What an acquire script's answer means: a grant (with its claim when stamped, and the
    /// node's clock `at_us` if it answered one), a refusal, or a changed identity record, after
    /// which the connection is dropped.
    fn acquired(
        &self,
        live: &Live,
        stamped: bool,
        at_us: Option<u64>,
        answer: i64,
    ) -> Result<Reply, NodeError> {
        match answer {
            scripts::IDENTITY_CHANGED => {
                self.invalidate(live.generation);
                Err(NodeError::new(
                    NodeErrorKind::Identity,
                    "the server's identity record changed since the connection was opened (data loss or another server); nothing granted, reconnecting",
                ))
            }
            n => Ok(Reply::acquired(n, stamped, at_us, &live.id)),
        }
    }

    /// Sends `op`, recording its trip in `fate` (see [`Reach`](crate::backend::Reach)); see
    /// [`RedisNode::with_live`] for the order requests reach the node in, and
    /// [`RedisNode::submit`] for how requests made while others are in flight are sent together.
    pub(crate) fn run(
        self: &Arc<Self>,
        op: Arc<Op>,
        fate: Option<Fate>,
    ) -> BoxFuture<'static, Result<Reply, NodeError>> {
        self.run_as(op, fate, Again::May)
    }

    /// [`RedisNode::run`]; `again` tells whether the request may go out once more on a new
    /// connection if it finds its connection closed.
    fn run_as(
        self: &Arc<Self>,
        op: Arc<Op>,
        fate: Option<Fate>,
        again: Again,
    ) -> BoxFuture<'static, Result<Reply, NodeError>> {
        let node = Arc::clone(self);
        let waits = fate.clone();
        if matches!(*op, Op::Release { .. }) {
            return self.with_live_as(true, true, waits.as_ref(), move |live| {
                SeenThrough::boxed(node.submit(live, op, fate, again))
            });
        }
        self.with_live_as(false, true, waits.as_ref(), move |live| {
            node.submit(live, op, fate, again)
        })
    }

    async fn request(self: &Arc<Self>, live: Live, op: &Op) -> Result<Reply, NodeError> {
        match op {
            Op::Acquire { .. } => self.acquire(live, op).await,
            Op::Release {
                keys,
                token,
                channels,
                wake,
                before_us: None,
            } if keys.len() == 1
                && live.native.delete_if_equal.is_some()
                && !live.native_refused.load(Ordering::Acquire) =>
            {
                let t = token.expose();
                let mut conn = live.conn.clone();
                let cmd = match live.native.delete_if_equal {
                    Some(DeleteIfEqual::DelEx) => {
                        let mut cmd = redis::cmd("DELEX");
                        cmd.arg(&*keys[0]).arg("IFEQ").arg(t);
                        cmd
                    }
                    _ => {
                        let mut cmd = redis::cmd("DELIFEQ");
                        cmd.arg(&*keys[0]).arg(t);
                        cmd
                    }
                };
                // The wake-up goes in the same round trip as the delete, as in the release
                // script: other clients' waiters hear of the release when this client's answers
                // arrive, not one round trip later (by then this client's own waiter, woken at
                // once, would have reached every node ahead of them). Unlike the script, it is
                // sent even when the delete found nothing (the lock had expired, or another
                // holder has it): waiters woken for nothing are refused and wait again. Best
                // effort, like the script's: an error there does not fail the release. Its
                // answer is how many subscribers the wake-up reached.
                let mut pipe = redis::pipe();
                pipe.ignore_errors().add_command(cmd);
                if let Some(channel) = channels.first() {
                    pipe.cmd("PUBLISH").arg(&**channel).arg(wake.message());
                }
                let answers: Vec<redis::RedisResult<redis::Value>> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.failed(&live, &e, t))?;
                let mut answers = answers.into_iter();
                let deleted = match answers.next() {
                    Some(Ok(redis::Value::Int(n))) => n,
                    // Refused by the server itself (an ACL user without the command — the
                    // recipe for the server's last version, kept through an upgrade — or a
                    // renamed command): the release script does the same, and this connection
                    // uses it from now on. An error was final before: every lone release on
                    // the node failed, and each lock stayed for its TTL (found in review; test
                    // `acl::a_release_falls_back_to_the_script_when_the_native_delete_is_
                    // refused`). A key of another type is another owner's, as in the script.
                    // The wake-up sent with the refused delete went out while the key was
                    // still there: a waiter it woke found the lock held, and would drop the
                    // script's wake-up as a repeat if it carried the same id (test `acl::a_
                    // waiter_hears_a_release_whose_native_delete_was_refused`).
                    Some(Err(e)) if e.code().is_some_and(|c| c != "WRONGTYPE") => {
                        tracing::debug!(node = %self.name, error = %self.node_error(&e, Some(t)), "native conditional delete refused; using the release script on this connection");
                        live.native_refused.store(true, Ordering::Release);
                        return self
                            .release_scripted(&live, keys, token, channels, wake.resent(), None)
                            .await;
                    }
                    Some(Err(e)) => return Err(self.failed(&live, &e, t)),
                    _ => {
                        return Err(NodeError::new(
                            NodeErrorKind::Server,
                            "unexpected answer to the conditional delete",
                        ));
                    }
                };
                let heard = match answers.next() {
                    Some(Ok(redis::Value::Int(n))) => u32::try_from(n).ok(),
                    _ => None,
                };
                Ok(Reply::released(deleted, heard))
            }
            Op::Extend {
                keys,
                token,
                ttl_ms,
            } => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let ttl = ttl_ms.to_string();
                let t = token.expose();
                let n: i64 = self
                    .eval(&live, &scripts::EXTEND, &keys, &[t, &ttl], t)
                    .await?;
                Ok(Reply::counted(n))
            }
            Op::Release {
                keys,
                token,
                channels,
                wake,
                before_us,
            } => {
                self.release_scripted(&live, keys, token, channels, *wake, *before_us)
                    .await
            }
        }
    }

    /// An owner-checked release by the release script ([`scripts::RELEASE`], or
    /// [`scripts::RELEASE_BEFORE`] with a deadline).
    async fn release_scripted(
        &self,
        live: &Live,
        keys: &[String],
        token: &Token,
        channels: &[String],
        wake: crate::backend::Wake,
        before_us: Option<u64>,
    ) -> Result<Reply, NodeError> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let t = token.expose();
        let wake = wake.message();
        let before = before_us.map(|us| us.to_string());
        let mut args: Vec<&str> = Vec::with_capacity(channels.len() + 3);
        args.extend(before.as_deref());
        args.push(t);
        args.push(&wake);
        args.extend(channels.iter().map(String::as_str));
        let script = match before_us {
            Some(_) => &scripts::RELEASE_BEFORE,
            None => &scripts::RELEASE,
        };
        let (n, heard): (i64, i64) = self.eval(live, script, &keys, &args, t).await?;
        Reply::released_before(n, u32::try_from(heard).ok())
    }

    /// `PTTL key`: `None` when the key is missing, `Duration::MAX` when it has no expiry. A
    /// read on the open connection, outside the group commit (its order against other
    /// requests does not matter).
    pub(crate) fn expiry(
        self: &Arc<Self>,
        key: Arc<str>,
    ) -> BoxFuture<'static, Result<Option<Duration>, NodeError>> {
        let node = Arc::clone(self);
        self.with_live(false, move |live| {
            async move {
                let mut conn = live.conn.clone();
                let ms: i64 = redis::cmd("PTTL")
                    .arg(&*key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| node.failed(&live, &e, ""))?;
                Ok(match ms {
                    -2 => None,
                    ms if ms < 0 => Some(Duration::MAX),
                    ms => Some(Duration::from_millis(ms.unsigned_abs())),
                })
            }
            .boxed()
        })
    }

    /// `GET key`, answered as a fingerprint of the value (see [`Backend::holder`]).
    pub(crate) fn holder(
        self: &Arc<Self>,
        key: Arc<str>,
    ) -> BoxFuture<'static, Result<Option<u64>, NodeError>> {
        let node = Arc::clone(self);
        self.with_live(false, move |live| {
            async move {
                let mut conn = live.conn.clone();
                let value: Option<Vec<u8>> = redis::cmd("GET")
                    .arg(&*key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| node.failed(&live, &e, ""))?;
                Ok(value.as_deref().map(crate::backend::fingerprint))
            }
            .boxed()
        })
    }

    /// One batched renewal call.
    pub(crate) fn extend_many(
        self: &Arc<Self>,
        batch: Arc<Batch>,
    ) -> BoxFuture<'static, Result<Vec<Renewed>, NodeError>> {
        let node = Arc::clone(self);
        self.with_live(false, move |live| node.submit_renewal(live, batch))
    }

    async fn extend_many_on(&self, live: Live, batch: &Batch) -> Result<Vec<Renewed>, NodeError> {
        let numbers: Vec<(String, String)> = batch
            .locks
            .iter()
            .map(|l| (l.keys.len().to_string(), l.ttl_ms.to_string()))
            .collect();
        let mut keys: Vec<&str> = Vec::new();
        let mut args: Vec<&str> = Vec::with_capacity(3 * batch.locks.len());
        for (lock, (count, ttl)) in batch.locks.iter().zip(&numbers) {
            keys.extend(lock.keys.iter().map(String::as_str));
            args.push(lock.token.expose());
            args.push(count);
            args.push(ttl);
        }
        let sent = std::time::Instant::now();
        // Tokens of many locks are in flight here; none of them may reach an error message.
        let out: Vec<i64> = self
            .eval(&live, &scripts::EXTEND_MANY, &keys, &args, "")
            .await
            .map_err(|e| {
                let mut msg = e.message().to_owned();
                for lock in &batch.locks {
                    msg = scrub(&msg, &[Some(lock.token.expose())]);
                }
                NodeError::new(e.kind(), msg)
            })?;
        let mut out = out;
        // A call with entries sent without keys (their locks ended) ran a loop for them too:
        // not counted for the pace, it would read as far more work per key than there is.
        if out.len() == batch.locks.len() + 1
            && let Some(service_us) = out.pop()
            && batch.locks.iter().all(|l| !l.keys.is_empty())
        {
            let keys = batch
                .locks
                .iter()
                .map(|l| l.keys.len())
                .sum::<usize>()
                .max(1);
            self.renewal_cost
                .note(sent, std::time::Instant::now(), service_us, keys);
        }
        Ok(out
            .into_iter()
            .map(|v| match v {
                1 => Renewed::Extended,
                2 => Renewed::Missing,
                _ => Renewed::Refused,
            })
            .collect())
    }

    /// What renewing one key costs this node's server, as its last renewal calls measured (or
    /// a guess before the first one answered).
    pub(crate) fn renewal_cost(&self) -> Duration {
        self.renewal_cost.per_key()
    }
}

/// How far the node is from this client: about the shortest round trip of its recent answers,
/// in µs plus one (0 before the first answer, which sets it). It falls at once to a faster
/// answer and rises towards a slower one by a sixteenth of the difference but at most an eighth
/// of itself per answer, so that one slow answer (queueing under load, a late wake-up of this
/// process, a node pausing for a moment) barely moves it, while a node that stays slower is
/// followed within a few dozen answers (from 0.2 to 1.4 ms in about 17). A node's round trip
/// counts the wait in its outbox too, which a node every client's racers ask first has more
/// of; hence the floor, not an average.
#[derive(Default)]
struct Distance(AtomicU64);

impl Distance {
    fn note(&self, micros: u64) {
        let sample = micros.saturating_add(1);
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 || sample <= old {
                    sample
                } else {
                    old.saturating_add(((sample - old) / 16).min(old / 8 + 1))
                })
            });
    }

    fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            n => Some(Duration::from_micros(n - 1)),
        }
    }
}

/// How long a renewal call keeps a node's server busy per key: a moving average, in
/// nanoseconds per key, of what the calls took.
///
/// A call took at least what its script ran (it reports that). When it was sent before the
/// previous call's answer came, it took at most the gap between the two answers: the node
/// answers a connection's calls in order, so with calls waiting there that gap is what the
/// later call cost the node — reading its arguments and writing its answer included, which the
/// script's own time leaves out (about half of a call's latency in the runs of the pacing
/// test). A call sent on its own cost at least its script's time and at most its latency,
/// which counts the round trip too: an estimate outside those bounds moves towards them (down
/// again after a moment when the node was slow), one inside them stays — over a slow link the
/// latency says little, and the calls must not be paced by the link.
#[derive(Default)]
struct RenewalCost {
    per_key_ns: AtomicU64,
    last_answer: Mutex<Option<std::time::Instant>>,
}

impl RenewalCost {
    /// The guess before any call answered: a few times what a quiet server takes (1–3 µs), so
    /// that the first round of a client holding many locks is not sent all at once either.
    const GUESS: Duration = Duration::from_micros(10);

    /// Notes a call of `keys` keys sent at `sent` and answered at `answered`, whose script
    /// ran `script_us` µs on the server.
    fn note(
        &self,
        sent: std::time::Instant,
        answered: std::time::Instant,
        script_us: i64,
        keys: usize,
    ) {
        let previous = lock(&self.last_answer).replace(answered);
        let script = Duration::from_micros(u64::try_from(script_us).unwrap_or(0));
        let old = self.per_key();
        let per_key = |d: Duration| d / u32::try_from(keys.max(1)).unwrap_or(u32::MAX);
        let sample = match previous {
            // Waiting behind the previous call: the gap between the answers is its cost.
            Some(previous) if sent < previous => {
                per_key(answered.saturating_duration_since(previous).max(script))
            }
            // On its own: it cost at least its script's time and at most its latency (which
            // counts the round trip too); an estimate between the two stays.
            _ => old
                .min(per_key(answered.saturating_duration_since(sent)))
                .max(per_key(script)),
        };
        if sample == old {
            return;
        }
        let (old, sample) = (
            u64::try_from(old.as_nanos()).unwrap_or(u64::MAX),
            u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX),
        );
        // Racing updates may lose one sample; the average needs no more than that.
        let new = (old.saturating_mul(3).saturating_add(sample) / 4).max(1);
        self.per_key_ns.store(new, Ordering::Relaxed);
    }

    fn per_key(&self) -> Duration {
        match self.per_key_ns.load(Ordering::Relaxed) {
            0 => Self::GUESS,
            ns => Duration::from_nanos(ns),
        }
    }
}

/// Fails an acquire on a connection whose server is still in its restart quarantine.
fn quarantine_check(live: &Live) -> Result<(), NodeError> {
    if let Some(until) = live.quarantined_until {
        let now = Instant::now();
        if now < until {
            return Err(NodeError::new(
                NodeErrorKind::Quarantined,
                format!(
                    "in restart quarantine: the server restarted (or lost its data) too recently to grant; it rejoins in {:?}",
                    until - now
                ),
            ));
        }
    }
    Ok(())
}

/// An acquire script's answer of a shape none of them gives.
fn unexpected_acquire_answer() -> NodeError {
    NodeError::new(
        NodeErrorKind::Server,
        "unexpected answer from the acquire script",
    )
}

fn evalsha(script: &LuaScript, keys: &[&str], args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&script.sha).arg(keys.len()).arg(keys).arg(args);
    cmd
}

/// The id part of a server's identity record (`<id>@<created ms>`) and its creation time;
/// fails for a record this client does not write.
pub(crate) fn parse_record(
    record: &str,
    identity_key: &str,
) -> Result<(Arc<str>, Option<u64>), NodeError> {
    let (id, created_ms) = match record.split_once('@') {
        Some((id, created)) => (id, created.parse::<u64>().ok()),
        None => (record, None),
    };
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(NodeError::new(
            NodeErrorKind::Identity,
            format!("the server's identity record {identity_key} is not one this client writes"),
        ));
    }
    Ok((id.into(), created_ms))
}

/// Until when a freshly connected server is in its restart quarantine `q`, from its uptime
/// (`uptime_in_seconds` of `INFO server`) and the age of its identity record.
pub(crate) fn quarantine_until(
    q: Duration,
    uptime: Option<&str>,
    created_ms: Option<u64>,
    now_ms: &str,
) -> Result<Option<Instant>, NodeError> {
    let uptime = uptime.and_then(|v| v.parse::<i64>().ok()).ok_or_else(|| {
        NodeError::new(
            NodeErrorKind::Server,
            "INFO server has no uptime_in_seconds",
        )
    })?;
    // Whole seconds round down, so the age is never overstated. Redis counts the uptime on its
    // wall clock: stepped back past the server's start, it is negative, and the server counts
    // as just started (before, every connection failed until the clock had caught up; test
    // `a_server_whose_clock_went_back_past_its_start_sits_out_the_quarantine`).
    let mut age = Duration::from_secs(u64::try_from(uptime).unwrap_or(0));
    if let (Some(created), Ok(now)) = (created_ms, now_ms.parse::<u64>()) {
        age = age.min(Duration::from_millis(now.saturating_sub(created)));
    }
    Ok(q.checked_sub(age)
        .map(|left| crate::lock::far_after(Instant::now(), left)))
}

/// The value of `field` in an `INFO` reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// How much longer than its node timeout a request may wait for a connection being opened:
/// at most four node timeouts (and never more than the connect timeout), so a fresh process or
/// a reconnect after a broken connection does not fail requests that a loopback or LAN
/// handshake would serve, while a hung or unreachable node still costs at most
/// 5 × `node_timeout` — 250 ms by default. Renewals never get it.
pub(crate) fn connect_allowance(node_timeout: Duration, connect_timeout: Duration) -> Duration {
    (node_timeout * 4).min(connect_timeout)
}

/// The production backend: N independent Redis masters.
pub(crate) struct RedisBackend {
    pub(crate) nodes: Vec<Arc<RedisNode>>,
    pub(crate) node_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) identities: Arc<Identities>,
    pub(crate) background: crate::background::Background,
}

impl Backend for RedisBackend {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn background(&self) -> Option<&crate::background::Background> {
        Some(&self.background)
    }

    fn name(&self, i: usize) -> &Arc<str> {
        self.nodes[i].name()
    }

    fn budget(&self, i: usize) -> Duration {
        if self.nodes[i].is_open() {
            self.node_timeout
        } else {
            self.node_timeout + connect_allowance(self.node_timeout, self.connect_timeout)
        }
    }

    fn call(&self, i: usize, op: Arc<Op>) -> BoxFuture<'static, Result<Reply, NodeError>> {
        let fate = op.fate(i);
        self.nodes[i].run(op, fate)
    }

    fn extend_many(
        &self,
        i: usize,
        batch: Arc<Batch>,
    ) -> BoxFuture<'static, Result<Vec<Renewed>, NodeError>> {
        self.nodes[i].extend_many(batch)
    }

    fn connection(&self, i: usize) -> Option<u64> {
        self.nodes[i].connection()
    }

    fn still_current(&self, i: usize, connection: u64) -> bool {
        self.nodes[i].still_current(connection)
    }

    fn renewal_cost(&self, i: usize) -> Option<Duration> {
        Some(self.nodes[i].renewal_cost())
    }

    fn distance(&self, i: usize) -> Option<Duration> {
        self.nodes[i].distance.get()
    }

    fn rank_seed(&self, i: usize) -> Option<u64> {
        match self.nodes[i].rank_seed.load(Ordering::Relaxed) {
            0 => None,
            seed => Some(seed),
        }
    }

    fn expiry(
        &self,
        i: usize,
        key: Arc<str>,
    ) -> BoxFuture<'static, Result<Option<Duration>, NodeError>> {
        self.nodes[i].expiry(key)
    }

    fn holder(
        &self,
        i: usize,
        key: Arc<str>,
    ) -> BoxFuture<'static, Result<Option<u64>, NodeError>> {
        self.nodes[i].holder(key)
    }

    fn misconfigured(&self) -> Option<ConfigError> {
        self.identities.conflict()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Wake;
    use redlock_testkit::Cluster;

    /// A node of the client's for node 0 of `cluster`, not connected yet.
    fn node_of(cluster: &Cluster, connect_timeout: Duration) -> Arc<RedisNode> {
        let spec = NodeSpec::parse(&cluster.urls()[0], None).unwrap();
        let keys = NodeKeys {
            identity: "redlock:node".into(),
            stamp: "redlock:stamp".into(),
            quarantine: None,
        };
        let identities = Arc::new(Identities::new(vec!["n".into()]));
        let node = RedisNode::new(0, &spec, connect_timeout, None, keys, identities);
        Arc::new(node.unwrap())
    }

    /// [`node_of`], connected.
    async fn connected(cluster: &Cluster) -> Arc<RedisNode> {
        let node = node_of(cluster, Duration::from_secs(1));
        node.connect().await.unwrap();
        node
    }

    /// Requests made while the connection to a hung server opens wait for it, at most
    /// `REQUEST_QUEUE` of them; the next ones are refused at once, except releases.
    #[tokio::test(flavor = "current_thread")]
    async fn requests_waiting_for_a_connection_are_bounded() {
        let cluster = Cluster::start(1).await.unwrap();
        cluster.node(0).pause();
        let node = node_of(&cluster, Duration::from_secs(30));
        let token = Token::random().unwrap();
        let op = |kind: u8| match kind {
            0 => Arc::new(Op::Acquire {
                stamped: true,
                keys: vec!["redlock:lock:waits".to_owned()].into(),
                token: token.clone(),
                ttl_ms: 10_000,
                rearm: false,
                checked: false,
                reach: None,
            }),
            _ => Arc::new(Op::Release {
                keys: vec!["redlock:lock:waits".to_owned()].into(),
                token: token.clone(),
                channels: Vec::new().into(),
                wake: Wake::NONE,
                before_us: None,
            }),
        };
        let mut calls: Vec<_> = (0..REQUEST_QUEUE + 1_000)
            .map(|_| node.run(op(0), None))
            .collect();
        let waiting = lock(&node.slot).queue.len();
        let release = node.run(op(1), None);
        let after_release = lock(&node.slot).queue.len();
        let refused = calls.pop().unwrap().now_or_never();
        cluster.node(0).resume();
        assert_eq!(
            waiting, REQUEST_QUEUE,
            "requests waiting for the connection to open"
        );
        assert_eq!(after_release, REQUEST_QUEUE + 1, "a release still waits");
        assert!(
            matches!(&refused, Some(Err(e)) if e.kind() == NodeErrorKind::Io),
            "{refused:?}"
        );
        drop((calls, release));
    }

    /// Requests whose callers stopped waiting make room among those waiting for the
    /// connection to open: a full queue of them used to refuse every new request until the
    /// open ended (up to the connect timeout), while holding each one's keys and token.
    #[tokio::test(flavor = "current_thread")]
    async fn requests_nobody_waits_for_make_room_while_the_connection_opens() {
        let cluster = Cluster::start(1).await.unwrap();
        cluster.node(0).pause();
        let node = node_of(&cluster, Duration::from_secs(30));
        let token = Token::random().unwrap();
        let op = || {
            Arc::new(Op::Acquire {
                stamped: true,
                keys: vec!["redlock:lock:room".to_owned()].into(),
                token: token.clone(),
                ttl_ms: 10_000,
                rearm: false,
                checked: false,
                reach: None,
            })
        };
        let gone: Vec<_> = (0..REQUEST_QUEUE).map(|_| node.run(op(), None)).collect();
        drop(gone);
        let next = node.run(op(), None).now_or_never();
        let waiting = lock(&node.slot).queue.len();
        cluster.node(0).resume();
        assert!(
            next.is_none(),
            "a request after {REQUEST_QUEUE} abandoned ones was answered at once: {next:?}"
        );
        assert_eq!(waiting, 1, "requests waiting for the connection to open");
    }

    /// A release whose caller stops waiting right after handing it to the connection (a
    /// cleanup whose grace ran out, a release phase that gave up on the node) still deletes
    /// its key. The connection skips a command whose caller is gone before it is written; on a
    /// current-thread runtime the connection's task cannot write it before the drop.
    #[tokio::test(flavor = "current_thread")]
    async fn a_release_dropped_once_handed_to_the_connection_still_reaches_the_node() {
        let cluster = Cluster::start(1).await.unwrap();
        let node = connected(&cluster).await;
        let token = Token::random().unwrap();
        let key = "redlock:lock:dropped";
        let mut probe = cluster.node(0).connection().await.unwrap();
        let () = redis::cmd("SET")
            .arg(key)
            .arg(token.expose())
            .query_async(&mut probe)
            .await
            .unwrap();
        let release = Arc::new(Op::Release {
            keys: vec![key.to_owned()].into(),
            token,
            channels: Vec::new().into(),
            wake: Wake::NONE,
            before_us: None,
        });
        drop(engine::handed_over(node.run(release, None)));
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let left: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut probe)
                .await
                .unwrap();
            if left.is_none() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the release never reached the node"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A release with a deadline on the node's clock deletes until then and nothing after, on
    /// its own (`RELEASE_BEFORE`) and in a batch (`T`), and after it answers so (not "nothing
    /// there"); an acquire that re-arms a token answers
    /// the node's clock, with stamps and without, on its own and in a batch (`B`, `V`) — the
    /// clock, not the stamp, which here is an hour ahead of it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_release_with_a_deadline_deletes_only_until_it() {
        let cluster = Cluster::start(1).await.unwrap();
        let node = connected(&cluster).await;
        let mut probe = cluster.node(0).connection().await.unwrap();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut probe).await.unwrap();
        let now = secs * 1_000_000 + micros;
        let ahead = (now + 3_600_000_000).to_string();
        let () = redis::cmd("SET")
            .arg("redlock:stamp")
            .arg(&ahead)
            .query_async(&mut probe)
            .await
            .unwrap();
        let token = Token::random().unwrap();
        for key in ["live-alone", "late-alone", "live-batch", "late-batch"] {
            let () = redis::cmd("SET")
                .arg(format!("redlock:lock:{key}"))
                .arg(token.expose())
                .query_async(&mut probe)
                .await
                .unwrap();
        }
        let release = |key: &str, before_us: u64| {
            Arc::new(Op::Release {
                keys: vec![format!("redlock:lock:{key}")].into(),
                token: token.clone(),
                channels: Vec::new().into(),
                wake: Wake::NONE,
                before_us: Some(before_us),
            })
        };
        let acquire = |key: &str, rearm: bool, stamped: bool| {
            Arc::new(Op::Acquire {
                stamped,
                keys: vec![format!("redlock:lock:{key}")].into(),
                token: Token::random().unwrap(),
                ttl_ms: 10_000,
                rearm,
                checked: false,
                reach: None,
            })
        };
        let clock = |reply: Result<Reply, NodeError>| match reply {
            Ok(Reply::Yes { at_us, claim, .. }) => {
                if let Some(claim) = claim {
                    assert!(
                        claim.stamp_us > now + 3_000_000_000,
                        "stamps go on from the last"
                    );
                }
                at_us
            }
            other => panic!("not granted: {other:?}"),
        };
        let (late, soon) = (now - 1_000_000, now + 60_000_000);
        let alone = [
            node.run(release("live-alone", soon), None).await,
            node.run(release("late-alone", late), None).await,
        ];
        let mut clocks = Vec::new();
        for (key, stamped) in [("timed-alone", false), ("stamped-alone", true)] {
            clocks.push(clock(node.run(acquire(key, true, stamped), None).await));
        }
        // Two plain `SET NX` acquires take both places; what comes meanwhile waits and goes
        // as one call of the batch script.
        let scripts_before = cluster.node(0).command_calls("evalsha").await;
        let fill: Vec<_> = (0..2)
            .map(|i| node.run(acquire(&format!("fill-{i}"), false, false), None))
            .collect();
        let queued: Vec<_> = [
            release("live-batch", soon),
            release("late-batch", late),
            acquire("timed-batch", true, false),
            acquire("stamped-batch", true, true),
        ]
        .into_iter()
        .map(|op| node.run(op, None))
        .collect();
        let (_, mut batch) = futures_util::future::join(
            futures_util::future::join_all(fill),
            futures_util::future::join_all(queued),
        )
        .await;
        let scripts = cluster.node(0).command_calls("evalsha").await - scripts_before;
        assert_eq!(scripts, 1, "the four requests went as one script call");
        clocks.push(clock(batch.pop().unwrap()));
        clocks.push(clock(batch.pop().unwrap()));
        let mut left = Vec::new();
        for key in ["live-alone", "late-alone", "live-batch", "late-batch"] {
            let value: Option<String> = redis::cmd("GET")
                .arg(format!("redlock:lock:{key}"))
                .query_async(&mut probe)
                .await
                .unwrap();
            left.push(value.is_some());
        }
        println!("{alone:?} {batch:?}; keys left {left:?}; clocks {clocks:?}");
        assert_eq!(
            left,
            [false, true, false, true],
            "deleted before the deadline only"
        );
        // Past its deadline a delete says so, rather than that nothing was there.
        let past = |r: &Result<Reply, NodeError>| matches!(r, Err(e) if e.kind() == NodeErrorKind::Server && e.message().contains("deadline"));
        assert!(matches!(alone[0], Ok(Reply::Yes { .. })) && past(&alone[1]));
        assert!(matches!(batch[0], Ok(Reply::Yes { .. })) && past(&batch[1]));
        for at in clocks {
            assert!(
                at.is_some_and(|at| now <= at && at < soon),
                "the grant answers the node's clock: {at:?}, read {now} before"
            );
        }
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Calls waiting behind one another: the gap between their answers is what each cost, and
    /// the estimate follows it; the script's own time is a floor under it.
    #[test]
    fn the_renewal_cost_follows_the_gaps_between_waiting_calls() {
        let cost = RenewalCost::default();
        assert_eq!(cost.per_key(), RenewalCost::GUESS);
        let t0 = std::time::Instant::now();
        // Four calls of 1,000 keys sent together; each ran 2 ms of script and took 4 ms in all.
        cost.note(t0, t0 + us(4_000), 2_000, 1_000);
        for k in 2..=40u64 {
            cost.note(t0, t0 + us(4_000 * k), 2_000, 1_000);
        }
        let per_key = cost.per_key();
        assert!(per_key > us(3) && per_key < us(5), "{per_key:?}");
        // A gap shorter than the script ran (answers read late, then together): the script's
        // time counts.
        let t1 = t0 + us(200_000);
        for k in 1..=40u64 {
            cost.note(t0, t1 + us(k), 6_000, 1_000);
        }
        let per_key = cost.per_key();
        assert!(per_key > us(5) && per_key < us(7), "{per_key:?}");
    }

    /// A call on its own bounds the cost by its script's time and its latency, no more: over a
    /// slow link its latency is mostly the round trip, and must not pace the calls.
    #[test]
    fn a_call_on_its_own_only_moves_the_renewal_cost_into_its_bounds() {
        let cost = RenewalCost::default();
        let mut t = std::time::Instant::now();
        // 400 ms round trip, 1 ms of script for 1,000 keys: the guess (10 µs) is in bounds.
        for _ in 0..20 {
            cost.note(t, t + us(401_000), 1_000, 1_000);
            t += us(1_000_000);
        }
        assert_eq!(cost.per_key(), RenewalCost::GUESS);
        // A slow moment: the script ran 50 ms; the estimate rises towards it.
        for _ in 0..20 {
            cost.note(t, t + us(450_000), 50_000, 1_000);
            t += us(1_000_000);
        }
        assert!(cost.per_key() > us(45), "{:?}", cost.per_key());
        // A fast link again (latency 3 ms for 1,000 keys): the estimate comes down to it.
        for _ in 0..40 {
            cost.note(t, t + us(3_000), 1_000, 1_000);
            t += us(1_000_000);
        }
        let per_key = cost.per_key();
        assert!(per_key >= us(3) && per_key < us(4), "{per_key:?}");
    }
}

#[cfg(test)]
mod distance_tests {
    use super::Distance;
    use std::time::Duration;

    #[test]
    fn the_distance_follows_the_fast_answers_and_rises_slowly() {
        let d = Distance::default();
        assert_eq!(d.get(), None);
        d.note(200);
        assert_eq!(d.get(), Some(Duration::from_micros(200)));
        // One slow answer barely moves it; a faster one brings it down at once.
        d.note(40_000);
        let after_one = d.get().unwrap();
        assert!(after_one <= Duration::from_micros(227), "{after_one:?}");
        d.note(150);
        assert_eq!(d.get(), Some(Duration::from_micros(150)));
        // A node that stays 4 ms away is followed within a few dozen answers.
        let mut answers = 0;
        while d.get().unwrap() < Duration::from_micros(1_400) {
            d.note(4_200);
            answers += 1;
            assert!(answers < 40, "still {:?} after {answers} answers", d.get());
        }
        assert!(
            answers > 8,
            "one burst of {answers} slow answers made the node far"
        );
    }
}

#[cfg(test)]
mod quarantine_tests {
    use super::quarantine_until;
    use std::time::Duration;

    /// The quarantine runs from the younger of the server's uptime and its identity record's
    /// age; a negative uptime (a wall clock stepped back past the server's start) is a server
    /// that just started, and an uptime that is not a number is an error.
    #[test]
    fn the_quarantine_counts_a_negative_uptime_as_a_fresh_start() {
        let q = Duration::from_secs(3);
        assert!(quarantine_until(q, Some("5"), None, "0").unwrap().is_none());
        assert!(quarantine_until(q, Some("1"), None, "0").unwrap().is_some());
        assert!(
            quarantine_until(q, Some("-3597"), None, "0")
                .unwrap()
                .is_some()
        );
        // An old server whose identity record is 1 s old (on its clock) sits it out too.
        assert!(
            quarantine_until(q, Some("100"), Some(9_000), "10000")
                .unwrap()
                .is_some()
        );
        assert!(quarantine_until(q, Some("soon"), None, "0").is_err());
        assert!(quarantine_until(q, None, None, "0").is_err());
    }
}
