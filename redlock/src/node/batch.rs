//! Group commit per connection: a request made while the connection has [`MAX_IN_FLIGHT`]
//! requests in flight waits in the connection's outbox, and everything that waited is sent
//! together, as one call of the batch script, when one of them comes back. An idle connection
//! sends a request at once, on its own, so coalescing adds no latency when there is no load;
//! under load each node runs one script call for many locks instead of one call per lock.
//!
//! Order is kept: the outbox is first in, first out; a request only bypasses it when it is
//! empty, and a batch is handed to the connection while the outbox is locked, so a release made
//! after its acquire still reaches the node after it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use futures_util::future::{self, BoxFuture};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{
    Again, Live, REQUEST_QUEUE, RESCAN_AFTER, RedisNode, from_server, lock, quarantine_check,
};
use crate::backend::{Batch, Fate, Op, Renewed, Reply};
use crate::engine;
use crate::error::{NodeError, NodeErrorKind};
use crate::scripts;
use crate::url::scrub;

/// Calls one connection may have in flight before new requests wait for the next batch.
/// Two keep the connection busy: one batch runs on the server while the next one forms.
pub(super) const MAX_IN_FLIGHT: usize = 2;

/// Requests in one batch; the rest wait for the next one. Bounds how long one script call
/// holds the server (a batch of acquires runs in well under a millisecond).
pub(super) const MAX_BATCH: usize = 128;

type Answer<T> = oneshot::Sender<Result<T, NodeError>>;

/// A request waiting in the outbox, with where its answer goes.
struct Queued {
    op: Arc<Op>,
    answer: Answer<Reply>,
    /// Where the request's trip is recorded (see [`Reach`](crate::backend::Reach)).
    fate: Option<Fate>,
}

impl Queued {
    /// Nobody waits for the answer any more (its phase gave up on the node), and leaving it
    /// unsent changes nothing anyone relies on: an acquire not sent grants nothing, an
    /// extension not sent leaves the keys as they are. Releases are always sent — a cleanup
    /// nobody waits for still deletes a grant.
    fn abandoned(&self) -> bool {
        self.answer.is_closed() && !matches!(*self.op, Op::Release { .. })
    }

    /// Taken out of the outbox to be sent: `None` when its lock's release withdrew it (it is
    /// answered with an error and never sent).
    fn sending(self) -> Option<Self> {
        if self.fate.as_ref().is_none_or(Fate::sending) {
            return Some(self);
        }
        self.fail(withdrawn());
        None
    }

    fn fail(self, e: NodeError) {
        drop(self.answer.send(Err(e)));
    }
}

/// One connection's outbox.
#[derive(Default)]
pub(super) struct Outbox {
    state: Mutex<State>,
    /// Cancelled when the connection was replaced as silent (see [`RedisNode::retire`]): its
    /// calls in flight stop waiting, and nothing waits in it or is queued on it any more.
    replaced: CancellationToken,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    in_flight: usize,
    /// Requests that found the queue full since its last scan, modulo [`RESCAN_AFTER`] (the
    /// first one scans).
    found_full: usize,
}

/// One of the connection's in-flight places. Giving it back (dropping it — when the answer
/// came, or when the caller stopped waiting) sends what waited meanwhile.
struct Place {
    node: Arc<RedisNode>,
    live: Live,
}

thread_local! {
    /// Set while a place given back on this thread sends what waited: the places given back
    /// meanwhile (a runtime shutting down drops a spawned batch's task, and its place, inside
    /// `spawn`) are queued here and handled by that same loop. Handled where they were
    /// dropped, each sent the next batch from inside the last one's `spawn`, one level deeper
    /// per batch of 128 requests, and a full outbox overflowed the stack and aborted the
    /// process (test `batch_attacks::a_runtime_torn_down_with_a_full_outbox_does_not_overflow_
    /// the_stack`).
    static GIVEN_BACK: std::cell::RefCell<Option<GivenBack>> =
        const { std::cell::RefCell::new(None) };
}

/// Places given back while a flush ran on this thread (see [`GIVEN_BACK`]).
type GivenBack = Vec<(Arc<RedisNode>, Live)>;

/// Clears [`GIVEN_BACK`] however the loop that set it ends.
struct Flushing;

impl Drop for Flushing {
    fn drop(&mut self) {
        let _ = GIVEN_BACK.try_with(|g| *g.borrow_mut() = None);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // A thread's locals can be gone already when a runtime kept in one of them is dropped
        // with the thread, and with it the tasks that hold places: reading `GIVEN_BACK` then
        // panicked in this destructor, and the process aborted (test `batch_attacks::a_
        // runtime_dropped_with_its_thread_does_not_panic`). Such a place is given back directly
        // (nothing can be sent any more: its runtime is gone).
        let nested = GIVEN_BACK.try_with(|g| {
            let mut g = g.borrow_mut();
            match g.as_mut() {
                Some(queued) => {
                    queued.push((Arc::clone(&self.node), self.live.clone()));
                    true
                }
                None => {
                    *g = Some(Vec::new());
                    false
                }
            }
        });
        let Ok(nested) = nested else {
            self.node.flush(&self.live);
            return;
        };
        if nested {
            return;
        }
        let _flushing = Flushing;
        self.node.flush(&self.live);
        while let Some((node, live)) = GIVEN_BACK
            .try_with(|g| g.borrow_mut().as_mut()?.pop())
            .ok()
            .flatten()
        {
            node.flush(&live);
        }
    }
}

pub(super) fn withdrawn() -> NodeError {
    NodeError::new(
        NodeErrorKind::Withdrawn,
        "withdrawn unsent by the lock's release (it waited to be sent to this node)",
    )
}

/// The answer of a call in flight on a connection replaced as silent.
fn replaced() -> NodeError {
    NodeError::new(
        NodeErrorKind::Io,
        "no answer: the connection went silent and was replaced (outcome unknown)",
    )
}

/// A request not sent because its connection was replaced as silent.
fn not_sent() -> NodeError {
    NodeError::new(
        NodeErrorKind::Io,
        "not sent: the connection went silent and was replaced",
    )
}

fn gone() -> NodeError {
    NodeError::new(
        NodeErrorKind::Io,
        "the connection's batch ended before answering",
    )
}

/// The keys of a request.
fn keys(op: &Op) -> &[String] {
    match op {
        Op::Acquire { keys, .. } | Op::Extend { keys, .. } | Op::Release { keys, .. } => keys,
    }
}

fn token(op: &Op) -> &str {
    match op {
        Op::Acquire { token, .. } | Op::Extend { token, .. } | Op::Release { token, .. } => {
            token.expose()
        }
    }
}

impl RedisNode {
    /// Sends `op` on `live`: at once when the connection has a free place and nothing waits,
    /// otherwise with the next batch.
    ///
    /// `fate` records whether the request left the client, for its lock's release (see
    /// [`Reach`](crate::backend::Reach)): marked sent under the outbox's lock before the
    /// request is handed over, and a request its lock's release withdrew is not sent at all.
    pub(super) fn submit(
        self: &Arc<Self>,
        live: Live,
        op: Arc<Op>,
        fate: Option<Fate>,
        again: Again,
    ) -> BoxFuture<'static, Result<Reply, NodeError>> {
        let refused = |e: NodeError| {
            if let Some(fate) = &fate {
                fate.refused();
            }
            future::ready(Err(e)).boxed()
        };
        if matches!(*op, Op::Acquire { .. })
            && let Err(e) = quarantine_check(&live)
        {
            return refused(e);
        }
        let mut state = lock(&live.outbox.state);
        if live.outbox.replaced.is_cancelled() {
            // Taken from the node before it replaced this connection (see `RedisNode::retire`).
            drop(state);
            return self.instead_of(&live, op, fate);
        }
        if state.queue.is_empty() && state.in_flight < MAX_IN_FLIGHT {
            if fate.as_ref().is_some_and(|f| !f.sending()) {
                return future::ready(Err(withdrawn())).boxed();
            }
            state.in_flight += 1;
            drop(state);
            let place = Place {
                node: Arc::clone(self),
                live: live.clone(),
            };
            let node = Arc::clone(self);
            let replaced = live.outbox.replaced.clone();
            let generation = live.generation;
            return async move {
                // Whether the request failed the first time it was polled: redis-rs hands a
                // request to the connection's driver task on that poll, so an error then is
                // one it answered without writing anything (the driver had ended).
                let answer = {
                    let mut call = std::pin::pin!(node.request(live, &op));
                    let mut first = true;
                    let call = std::future::poll_fn(|cx| {
                        let first = std::mem::replace(&mut first, false);
                        call.as_mut().poll(cx).map(|answer| (answer, first))
                    });
                    tokio::select! {
                        biased;
                        answer = call => Some(answer),
                        () = replaced.cancelled() => None,
                    }
                };
                drop(place);
                let Some((answer, unwritten)) = answer else {
                    return node.after_replacement(&[op]).await.remove(0);
                };
                // A request that found its connection broken (`failed` dropped it), and was not
                // written on it, goes out once more on a new connection. The server closes an
                // idle connection (its `timeout`, a managed service's idle limit, `CLIENT KILL`,
                // a restart) without the client noticing until it sends, and redis-rs fails the
                // request at once without writing it. Failed for good, the first release after
                // the close left the lock on every node for its TTL, and the first single attempt
                // failed everywhere (test `lifecycle::requests_after_the_servers_closed_idle_
                // connections_go_out_on_new_ones`, found in review). Only a request that was
                // never written: one that was, and whose connection broke before its answer,
                // may have run, and a copy could land after a release made meanwhile, or find
                // its own key and be read as refused (review of the first version, which sent
                // those too; test `lifecycle::a_request_whose_connection_breaks_in_flight_is_
                // not_sent_again`). Its fate says it was sent, as before.
                match again {
                    Again::May
                        if unwritten
                            && answer.is_err()
                            && !from_server(&answer)
                            && node.connection() != Some(generation) =>
                    {
                        tracing::debug!(node = %node.name, "the connection was found closed; sending the request again on a new one");
                        node.run_as(op, fate, Again::Not).await
                    }
                    _ => answer,
                }
            }
            .boxed();
        }
        // A release is never refused: the grant it undoes may be waiting in this very outbox,
        // and would be sent after it was refused (test `batch_attacks::a_release_is_sent_even_
        // when_a_hung_nodes_outbox_is_full`: the key stayed for the TTL).
        if state.queue.len() >= REQUEST_QUEUE && !matches!(*op, Op::Release { .. }) {
            // Requests nobody waits for any more make room, found by a scan of the whole
            // queue; one scan per `RESCAN_AFTER` requests that find it full. A scan for each
            // of them made refusing quadratic: under the outbox's lock, on the runtime's
            // thread, 16,384 refusals took 108 s in a debug build and the healthy nodes'
            // answers timed out (test `batch_attacks::healthy_nodes_are_served_while_a_hung_
            // nodes_outbox_is_full`).
            if state.found_full == 0 {
                state.queue.retain(|q| !q.abandoned());
            }
            state.found_full = (state.found_full + 1) % RESCAN_AFTER;
            if state.queue.len() >= REQUEST_QUEUE {
                drop(state);
                return refused(NodeError::new(
                    NodeErrorKind::Io,
                    format!("{REQUEST_QUEUE} requests are already waiting for this node"),
                ));
            }
        }
        if fate.as_ref().is_some_and(|f| !f.waiting()) {
            return future::ready(Err(withdrawn())).boxed();
        }
        let (tx, rx) = oneshot::channel();
        state.queue.push_back(Queued {
            op,
            answer: tx,
            fate,
        });
        async move { rx.await.unwrap_or_else(|_| Err(gone())) }.boxed()
    }

    /// Called once the silent-connection check replaced `live` (see `RedisNode::check_
    /// silence`). Its calls in flight stop waiting: behind a path that acknowledges what it
    /// never forwards they waited for good, each holding its place, so that everything queued
    /// behind them waited too — up to [`REQUEST_QUEUE`] requests with their keys and tokens —
    /// and kept the dead TCP session open. Their releases, and those waiting in the outbox, go
    /// to the node's next connection: left on the silent one they never reached the node, and
    /// the key a release deletes stayed for its TTL after the release returned (test
    /// `silent_connections::a_release_waiting_on_a_silent_connection_reaches_the_node_once_it_
    /// is_replaced`). Anything else in flight answers that its outcome is unknown, and
    /// anything else waiting fails unsent, as on a connection that broke.
    ///
    /// A release sent on the new connection may reach the node before a grant still on its
    /// way through the old path, if that path ever delivers it; that grant then stays until
    /// its TTL, as it would have anyway with the release stuck behind it. A release that did
    /// reach the node through the old path and runs again deletes only keys still holding its
    /// token (a lock taken with the caller's own token is released with a deadline on the
    /// node's clock, which holds for the second run too).
    pub(super) fn retire(self: &Arc<Self>, live: &Live) {
        let waiting: Vec<Queued> = {
            let mut state = lock(&live.outbox.state);
            live.outbox.replaced.cancel();
            state.queue.drain(..).collect()
        };
        // The releases are handed to the next connection here, in the order they waited.
        let mut resent = Vec::new();
        for item in waiting {
            if item.abandoned() {
                continue;
            }
            if matches!(*item.op, Op::Release { .. }) {
                resent.push((self.run(item.op, item.fate), item.answer));
            } else {
                item.fail(not_sent());
            }
        }
        if resent.is_empty() {
            return;
        }
        let answered = future::join_all(
            resent
                .into_iter()
                .map(|(call, answer)| async move { drop(answer.send(call.await)) }),
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn(answered));
        }
    }

    /// What the requests of a call cut short by the replacement of its connection answer (see
    /// [`RedisNode::retire`]).
    async fn after_replacement(self: &Arc<Self>, ops: &[Arc<Op>]) -> Vec<Result<Reply, NodeError>> {
        future::join_all(ops.iter().map(|op| {
            if matches!(**op, Op::Release { .. }) {
                self.run(Arc::clone(op), None)
            } else {
                future::ready(Err(replaced())).boxed()
            }
        }))
        .await
    }

    /// What a request for the replaced connection `live` gets instead of being sent there: a
    /// release is sent on the node's next connection, anything else fails unsent.
    fn instead_of(
        self: &Arc<Self>,
        live: &Live,
        op: Arc<Op>,
        fate: Option<Fate>,
    ) -> BoxFuture<'static, Result<Reply, NodeError>> {
        debug_assert!(live.outbox.replaced.is_cancelled());
        if matches!(*op, Op::Release { .. }) {
            return self.run(op, fate);
        }
        if let Some(fate) = &fate {
            fate.refused();
        }
        future::ready(Err(not_sent())).boxed()
    }

    /// Sends a batched renewal on `live` at once, without waiting in the outbox or taking an
    /// in-flight place. It is one script call for many locks already; the calls of one
    /// renewal round must not queue behind one another (over a 400 ms link, two places let a
    /// round of six calls take two round trips and run past its budget); and its order against
    /// other requests changes nothing: an extension is owner-checked, so one that overtakes a
    /// release finds the key still ours, and one that follows it finds the key gone. (Putting
    /// back a key a node lost is a request, and keeps its turn.)
    ///
    /// Not sent on a connection that has not answered for longer than the connect timeout (a
    /// hung server): calls that cannot be written wait in the connection, each with every key
    /// and token of its batch, and nothing drops them; sent every round, they grew the client
    /// by about 2 MB a second for as long as the node hung (test `hung_node_resources::
    /// renewals_to_a_hung_node_do_not_pile_up`). The renewal fails on that node at once
    /// instead, like one that timed out, until the connection answers again.
    pub(super) fn submit_renewal(
        self: &Arc<Self>,
        live: Live,
        batch: Arc<Batch>,
    ) -> BoxFuture<'static, Result<Vec<Renewed>, NodeError>> {
        if live.heard.silent_for(self.micros(), self.connect_timeout) {
            return future::ready(Err(NodeError::new(
                NodeErrorKind::Io,
                format!(
                    "no answer on this connection for over {:?}; renewal not sent",
                    self.connect_timeout
                ),
            )))
            .boxed();
        }
        let node = Arc::clone(self);
        async move { node.extend_many_on(live, &batch).await }.boxed()
    }

    /// A place on `live` came free: sends what waited, as many batches as there are free
    /// places. Each batch is handed to the connection while the outbox is locked (so nothing
    /// overtakes it), and its task is spawned after the lock is let go: a runtime that is
    /// shutting down drops a spawned task at once, and giving its place back must not find the
    /// lock still held.
    fn flush(self: &Arc<Self>, live: &Live) {
        let mut sent = Vec::new();
        {
            let mut state = lock(&live.outbox.state);
            state.in_flight -= 1;
            while state.in_flight < MAX_IN_FLIGHT && !state.queue.is_empty() {
                let mut items = Vec::with_capacity(state.queue.len().min(MAX_BATCH));
                while items.len() < MAX_BATCH
                    && let Some(item) = state.queue.pop_front()
                {
                    if !item.abandoned()
                        && let Some(item) = item.sending()
                    {
                        items.push(item);
                    }
                }
                if items.is_empty() {
                    continue;
                }
                if tokio::runtime::Handle::try_current().is_err() {
                    // Outside a runtime (it is shutting down) nothing can be driven any more.
                    let waiting = items.into_iter().chain(state.queue.drain(..));
                    for item in waiting {
                        item.fail(NodeError::new(
                            NodeErrorKind::Io,
                            "the runtime shut down before the request was sent",
                        ));
                    }
                    break;
                }
                state.in_flight += 1;
                sent.push(self.send_ops(live, items));
            }
        }
        for batch in sent {
            let place = Place {
                node: Arc::clone(self),
                live: live.clone(),
            };
            let task = async move {
                batch.await;
                // The place goes back once the tasks this batch answered had their turn: their
                // next requests (a release after a grant, say) then wait in the outbox and go
                // together when it comes free, instead of the first of them taking it alone
                // and the rest waiting behind it for a round trip.
                tokio::task::yield_now().await;
                drop(place);
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(task)),
                Err(_) => drop(task),
            }
        }
    }

    fn send_ops(self: &Arc<Self>, live: &Live, mut ops: Vec<Queued>) -> BoxFuture<'static, ()> {
        let (node, live) = (Arc::clone(self), live.clone());
        let replaced = live.outbox.replaced.clone();
        if ops.len() == 1
            && let Some(Queued { op, answer, .. }) = ops.pop()
        {
            let call = engine::handed_over(
                async move {
                    tokio::select! {
                        biased;
                        answer = node.request(live, &op) => return answer,
                        () = replaced.cancelled() => {}
                    }
                    node.after_replacement(&[op]).await.remove(0)
                }
                .boxed(),
            );
            return async move { drop(answer.send(call.await)) }.boxed();
        }
        let (ops, txs): (Vec<_>, Vec<_>) = ops.into_iter().map(|q| (q.op, q.answer)).unzip();
        let call = engine::handed_over(
            async move {
                tokio::select! {
                    biased;
                    answers = node.batch(live, &ops) => return answers,
                    () = replaced.cancelled() => {}
                }
                node.after_replacement(&ops).await
            }
            .boxed(),
        );
        async move {
            for (tx, answer) in txs.into_iter().zip(call.await) {
                let _ = tx.send(answer);
            }
        }
        .boxed()
    }

    /// Runs `ops` as one call of the batch script; one answer per request, in order.
    ///
    /// A node that lost its script cache (`NOSCRIPT`) ran none of them. The extensions and
    /// releases among them are sent again as one `EVAL` of the script — a later send may run
    /// after requests made after it, which is harmless for requests that never create a key —
    /// and the acquires fail for this attempt, as on their own (see `RedisNode::acquire`).
    async fn batch(self: &Arc<Self>, live: Live, ops: &[Arc<Op>]) -> Vec<Result<Reply, NodeError>> {
        let answers = self.run_batch(&live, ops, false).await;
        if !matches!(&answers, Err(e) if e.code() == Some("NOSCRIPT")) {
            return self.answers(&live, ops, answers);
        }
        self.reload_scripts(live.conn.clone());
        let not_run = NodeError::new(
            NodeErrorKind::Server,
            "NOSCRIPT: the node lost its script cache; not executed (reloading the scripts)",
        );
        let mut out: Vec<Result<Reply, NodeError>> =
            ops.iter().map(|_| Err(not_run.clone())).collect();
        let again: Vec<usize> = (0..ops.len())
            .filter(|&i| !matches!(*ops[i], Op::Acquire { .. }))
            .collect();
        if !again.is_empty() {
            let retried: Vec<Arc<Op>> = again.iter().map(|&i| Arc::clone(&ops[i])).collect();
            let answers = self.run_batch(&live, &retried, true).await;
            for (i, answer) in again
                .into_iter()
                .zip(self.answers(&live, &retried, answers))
            {
                out[i] = answer;
            }
        }
        out
    }

    /// One call of the batch script for `ops`: `EVALSHA`, or `EVAL` with its source.
    async fn run_batch(
        &self,
        live: &Live,
        ops: &[Arc<Op>],
        with_source: bool,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        let key_count = 2 + ops.iter().map(|op| keys(op).len()).sum::<usize>();
        let mut cmd = if with_source {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(scripts::BATCH.source);
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&scripts::BATCH.sha);
            cmd
        };
        cmd.arg(key_count)
            .arg(&*self.keys.identity)
            .arg(&*self.keys.stamp);
        for op in ops {
            cmd.arg(keys(op));
        }
        cmd.arg(&*live.record);
        for op in ops {
            match &**op {
                Op::Acquire {
                    stamped,
                    keys,
                    token,
                    ttl_ms,
                    ..
                } => {
                    let kind = match (*stamped, op.timed()) {
                        (true, false) => "A",
                        (true, true) => "B",
                        (false, true) => "V",
                        (false, false) if self.plain_set_nx(false, keys.len(), op.scripted()) => {
                            "S"
                        }
                        (false, false) => "U",
                    };
                    cmd.arg(kind)
                        .arg(keys.len())
                        .arg(token.expose())
                        .arg(*ttl_ms);
                }
                Op::Extend {
                    keys,
                    token,
                    ttl_ms,
                } => {
                    cmd.arg("E")
                        .arg(keys.len())
                        .arg(token.expose())
                        .arg(*ttl_ms);
                }
                Op::Release {
                    keys,
                    token,
                    channels,
                    wake,
                    before_us,
                } => {
                    cmd.arg(if before_us.is_some() { "T" } else { "R" })
                        .arg(keys.len())
                        .arg(token.expose())
                        .arg(channels.len())
                        .arg(wake.message());
                    if let Some(us) = before_us {
                        cmd.arg(*us);
                    }
                    cmd.arg(&**channels);
                }
            }
        }
        let mut conn = live.conn.clone();
        cmd.query_async(&mut conn).await
    }

    /// What the batch script's answers mean, one per request. The script answers in one flat
    /// array: one entry per request, except a release that ran, which answers two (`removed`,
    /// then `heard`). Answers that do not line up with the requests are not trusted at all:
    /// every request gets the error.
    fn answers(
        &self,
        live: &Live,
        ops: &[Arc<Op>],
        answers: redis::RedisResult<Vec<redis::Value>>,
    ) -> Vec<Result<Reply, NodeError>> {
        // Tokens of many locks are in flight here; none of them may reach an error message.
        let scrubbed = |message: &str| {
            let tokens: Vec<Option<&str>> = ops.iter().map(|op| Some(token(op))).collect();
            scrub(message, &tokens)
        };
        let every = |e: NodeError| ops.iter().map(|_| Err(e.clone())).collect();
        let entries = match answers {
            Ok(entries) => entries,
            Err(e) => {
                let e = self.failed(live, &e, "");
                return every(NodeError::new(e.kind(), scrubbed(e.message())));
            }
        };
        let total = entries.len();
        let mut entries = entries.into_iter();
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            let answer = match entries.next() {
                Some(redis::Value::Int(n)) => match **op {
                    // `B` and `V` answer the node's clock after the answer.
                    Op::Acquire { stamped, .. } if op.timed() => match entries.next() {
                        Some(redis::Value::Int(at)) => {
                            self.acquired(live, stamped, u64::try_from(at).ok(), n)
                        }
                        _ => break,
                    },
                    Op::Acquire { stamped, .. } => self.acquired(live, stamped, None, n),
                    Op::Release { .. } => match entries.next() {
                        Some(redis::Value::Int(heard)) => {
                            Reply::released_before(n, u32::try_from(heard).ok())
                        }
                        _ => break,
                    },
                    Op::Extend { .. } => Ok(Reply::counted(n)),
                },
                Some(redis::Value::BulkString(bytes)) => {
                    let text = String::from_utf8_lossy(&bytes);
                    Err(NodeError::new(
                        NodeErrorKind::Server,
                        scrubbed(text.strip_prefix('E').unwrap_or(&text)),
                    ))
                }
                Some(other) => Err(NodeError::new(
                    NodeErrorKind::Server,
                    format!(
                        "unexpected answer from the batch script: {}",
                        kind_of(&other)
                    ),
                )),
                None => break,
            };
            out.push(answer);
        }
        if out.len() < ops.len() || entries.next().is_some() {
            return every(NodeError::new(
                NodeErrorKind::Server,
                format!(
                    "the batch script's {total} answers do not line up with its {} requests",
                    ops.len()
                ),
            ));
        }
        out
    }
}

/// The type of an unexpected answer, without its content (which might carry a token).
fn kind_of(value: &redis::Value) -> &'static str {
    match value {
        redis::Value::Nil => "nil",
        redis::Value::Array(_) => "an array",
        redis::Value::SimpleString(_) => "a status",
        _ => "another type",
    }
}
