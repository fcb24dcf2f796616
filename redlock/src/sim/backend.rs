//! The client side of the simulated nodes: what [`crate::node::RedisBackend`] does on real
//! connections — connections opened in the background while requests wait in order, the
//! handshake that learns the server's identity and (with the restart quarantine on) its uptime,
//! the single-key `SET NX PX` fast path, `NOSCRIPT` handling per request type — done over
//! simulated connections.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{self, BoxFuture};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::world::{Call, Conn, Inner, Req, Resp, lock};
use crate::backend::{Backend, Batch, Op, Renewed, Reply};
use crate::config::Config;
use crate::engine;
use crate::error::SubError;
use crate::error::{ConfigError, NodeError, NodeErrorKind};
use crate::node::{Identities, NodeKeys, connect_allowance, parse_record, quarantine_until};
use crate::token::Token;

/// What a connection's handshake learned.
#[derive(Clone)]
struct Live {
    conn: Arc<Conn>,
    record: Arc<str>,
    id: Arc<str>,
    quarantined_until: Option<Instant>,
}

type Deferred = Box<dyn FnOnce(Result<Live, NodeError>) + Send>;

#[derive(Default)]
struct Slot {
    live: Option<Live>,
    queue: VecDeque<Deferred>,
    opening: bool,
}

/// One client's view of one simulated node.
struct SimNode {
    index: usize,
    name: Arc<str>,
    inner: Arc<Inner>,
    connect_timeout: Duration,
    keys: NodeKeys,
    identities: Arc<Identities>,
    slot: Mutex<Slot>,
    reloading: AtomicBool,
}

/// One client's simulated nodes.
pub(crate) struct SimBackend {
    nodes: Vec<Arc<SimNode>>,
    node_timeout: Duration,
    connect_timeout: Duration,
    identities: Arc<Identities>,
}

fn unexpected(resp: &Resp) -> NodeError {
    NodeError::new(NodeErrorKind::Server, format!("unexpected reply {resp:?}"))
}

impl SimBackend {
    pub(crate) fn new(cluster: &super::SimCluster, config: &Config, keys: NodeKeys) -> Self {
        let n = cluster.len();
        let names: Vec<Arc<str>> = (0..n).map(|i| Arc::from(super::node_name(i))).collect();
        let identities = Arc::new(Identities::new(names.clone()));
        let nodes = names
            .into_iter()
            .enumerate()
            .map(|(index, name)| {
                Arc::new(SimNode {
                    index,
                    name,
                    inner: Arc::clone(&cluster.inner),
                    connect_timeout: config.connect_timeout,
                    keys: keys.clone(),
                    identities: Arc::clone(&identities),
                    slot: Mutex::default(),
                    reloading: AtomicBool::new(false),
                })
            })
            .collect();
        Self {
            nodes,
            node_timeout: config.node_timeout,
            connect_timeout: config.connect_timeout,
            identities,
        }
    }

    /// The subscription side of every node, for the hand-off waiters.
    pub(crate) fn sub_clients(&self) -> Vec<SubClient> {
        self.nodes
            .iter()
            .map(|n| SubClient {
                inner: Arc::clone(&n.inner),
                index: n.index,
            })
            .collect()
    }

    pub(crate) fn connect(&self, i: usize) -> BoxFuture<'static, Result<(), NodeError>> {
        self.nodes[i].with_live(|_| future::ready(Ok(())).boxed())
    }
}

impl SimNode {
    /// As `RedisNode::with_live`: at once on the open connection, otherwise queued in order
    /// behind the connection being opened.
    fn with_live<T, F>(self: &Arc<Self>, request: F) -> BoxFuture<'static, Result<T, NodeError>>
    where
        T: Send + 'static,
        F: FnOnce(Live) -> BoxFuture<'static, Result<T, NodeError>> + Send + 'static,
    {
        let mut slot = lock(&self.slot);
        if !slot.opening
            && slot.queue.is_empty()
            && let Some(live) = &slot.live
        {
            let live = live.clone();
            drop(slot);
            return request(live);
        }
        let (tx, rx) = oneshot::channel();
        slot.queue
            .push_back(Box::new(move |conn: Result<Live, NodeError>| {
                if tx.is_closed() {
                    return;
                }
                let call = match conn {
                    Ok(live) => engine::handed_over(request(live)),
                    Err(e) => engine::Handed::answered(Err(e)),
                };
                let _ = tx.send(call);
            }));
        let open = !std::mem::replace(&mut slot.opening, true);
        drop(slot);
        if open {
            let node = Arc::clone(self);
            tokio::spawn(async move {
                let result =
                    match tokio::time::timeout(node.connect_timeout, node.handshake()).await {
                        Ok(result) => result,
                        Err(_) => Err(NodeError::new(
                            NodeErrorKind::Connect,
                            format!(
                                "no connection within the connect timeout ({:?})",
                                node.connect_timeout
                            ),
                        )),
                    };
                lock(&node.slot).live = result.as_ref().ok().cloned();
                loop {
                    let waiting = {
                        let mut slot = lock(&node.slot);
                        if slot.queue.is_empty() {
                            slot.opening = false;
                            return;
                        }
                        std::mem::take(&mut slot.queue)
                    };
                    for request in waiting {
                        request(result.clone());
                    }
                }
            });
        }
        async move {
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

    async fn handshake(&self) -> Result<Live, NodeError> {
        let conn = self.inner.open(self.index);
        let fresh = Token::random()
            .map_err(|e| NodeError::new(NodeErrorKind::Io, format!("no randomness: {e}")))?;
        let hello = Req::Hello {
            identity: Arc::clone(&self.keys.identity),
            fresh: fresh.expose()[..16].to_owned(),
        };
        let (record, now_ms) = match self.inner.send(self.index, &conn, hello).await? {
            Resp::Hello { record, now_ms } => (record, now_ms),
            other => return Err(unexpected(&other)),
        };
        let (id, created_ms) = parse_record(&record, &self.keys.identity)?;
        let quarantined_until = match self.keys.quarantine {
            None => None,
            Some(q) => match self.inner.send(self.index, &conn, Req::Info).await? {
                Resp::Info { uptime } => quarantine_until(q, Some(&uptime), created_ms, &now_ms)?,
                other => return Err(unexpected(&other)),
            },
        };
        self.identities
            .claim(self.index, &id)
            .map_err(|e| NodeError::new(NodeErrorKind::Identity, e.to_string()))?;
        Ok(Live {
            conn,
            record: record.into(),
            id,
            quarantined_until,
        })
    }

    fn invalidate(&self, conn: &Arc<Conn>) {
        let mut slot = lock(&self.slot);
        if slot
            .live
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(&l.conn, conn))
        {
            slot.live = None;
        }
    }

    /// Sends `req` on the connection; a broken connection is forgotten so the next call
    /// reconnects.
    async fn send(&self, live: &Live, req: Req) -> Result<Resp, NodeError> {
        let sent = self.inner.send(self.index, &live.conn, req);
        let res = sent.await;
        if res.is_err() {
            self.invalidate(&live.conn);
        }
        res
    }

    /// `SCRIPT LOAD` in the background, one reload at a time.
    fn reload_scripts(self: &Arc<Self>, live: &Live) {
        if self.reloading.swap(true, Ordering::SeqCst) {
            return;
        }
        let sent = self.inner.send(self.index, &live.conn, Req::LoadScripts);
        let node = Arc::clone(self);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(node.connect_timeout, sent).await;
            node.reloading.store(false, Ordering::SeqCst);
        });
    }

    /// `EVALSHA`, and on `NOSCRIPT` an `EVAL` (for scripts that never create a key).
    async fn eval(&self, live: &Live, call: impl Fn() -> Call) -> Result<Resp, NodeError> {
        match self
            .send(
                live,
                Req::Script {
                    sha: true,
                    call: call(),
                },
            )
            .await?
        {
            Resp::NoScript => {
                self.send(
                    live,
                    Req::Script {
                        sha: false,
                        call: call(),
                    },
                )
                .await
            }
            other => Ok(other),
        }
    }

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
        if let ([key], false, false, None) = (&**keys, stamped, scripted, self.keys.quarantine) {
            let req = Req::SetNx {
                key: key.clone(),
                token: token.clone(),
                ttl_ms,
            };
            return match self.send(&live, req).await? {
                Resp::Bool(true) => Ok(Reply::Yes {
                    claim: None,
                    heard: None,
                    kept: false,
                    at_us: None,
                }),
                Resp::Bool(false) => Ok(Reply::No),
                other => Err(unexpected(&other)),
            };
        }
        let call = Call::Acquire {
            stamp: stamped.then(|| Arc::clone(&self.keys.stamp)),
            identity: Arc::clone(&self.keys.identity),
            record: Arc::clone(&live.record),
            keys: Arc::clone(keys),
            token: token.clone(),
            ttl_ms,
            timed,
        };
        let (answer, at_us) = match self.send(&live, Req::Script { sha: true, call }).await? {
            Resp::Int(n) => (n, None),
            Resp::Ints(pair) if pair.len() == 2 => (pair[0], u64::try_from(pair[1]).ok()),
            Resp::NoScript => {
                self.reload_scripts(&live);
                return Err(NodeError::new(
                    NodeErrorKind::Server,
                    "NOSCRIPT: the node lost its script cache; not executed (reloading the scripts)",
                ));
            }
            other => return Err(unexpected(&other)),
        };
        match answer {
            crate::scripts::IDENTITY_CHANGED => {
                self.invalidate(&live.conn);
                Err(NodeError::new(
                    NodeErrorKind::Identity,
                    "the server's identity record changed since the connection was opened (data loss or another server); nothing granted, reconnecting",
                ))
            }
            n => Ok(Reply::acquired(n, stamped, at_us, &live.id)),
        }
    }

    async fn request(self: &Arc<Self>, live: Live, op: &Op) -> Result<Reply, NodeError> {
        let n = match op {
            Op::Acquire { .. } => {
                return self.acquire(live, op).await;
            }
            Op::Extend {
                keys,
                token,
                ttl_ms,
            } => {
                self.eval(&live, || Call::Extend {
                    keys: Arc::clone(keys),
                    token: token.clone(),
                    ttl_ms: *ttl_ms,
                })
                .await?
            }
            Op::Release {
                keys,
                token,
                channels,
                wake,
                before_us,
            } => {
                self.eval(&live, || Call::Release {
                    keys: Arc::clone(keys),
                    token: token.clone(),
                    channels: Arc::clone(channels),
                    wake: *wake,
                    before_us: *before_us,
                })
                .await?
            }
        };
        match (n, op) {
            (Resp::Int(n), Op::Release { .. }) => Reply::released_before(n, None),
            (Resp::Int(n), _) => Ok(Reply::counted(n)),
            (other, _) => Err(unexpected(&other)),
        }
    }
}

impl SimNode {
    /// `PTTL key`, as the Redis backend reads it for `wait_released`.
    async fn expiry(&self, live: Live, key: &str) -> Result<Option<Duration>, NodeError> {
        match self
            .send(
                &live,
                Req::Pttl {
                    key: key.to_owned(),
                },
            )
            .await?
        {
            Resp::Int(-2) => Ok(None),
            Resp::Int(ms) if ms < 0 => Ok(Some(Duration::MAX)),
            Resp::Int(ms) => Ok(Some(Duration::from_millis(ms.unsigned_abs()))),
            other => Err(unexpected(&other)),
        }
    }
}

impl SimNode {
    /// `GET key`, as the Redis backend reads it for [`Backend::holder`].
    async fn holder(&self, live: Live, key: &str) -> Result<Option<u64>, NodeError> {
        match self
            .send(
                &live,
                Req::Get {
                    key: key.to_owned(),
                },
            )
            .await?
        {
            Resp::Bulk(v) => Ok(v.map(|v| crate::backend::fingerprint(v.as_bytes()))),
            other => Err(unexpected(&other)),
        }
    }
}

impl Backend for SimBackend {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn name(&self, i: usize) -> &Arc<str> {
        &self.nodes[i].name
    }

    fn budget(&self, i: usize) -> Duration {
        if lock(&self.nodes[i].slot).live.is_some() {
            self.node_timeout
        } else {
            self.node_timeout + connect_allowance(self.node_timeout, self.connect_timeout)
        }
    }

    fn call(&self, i: usize, op: Arc<Op>) -> BoxFuture<'static, Result<Reply, NodeError>> {
        let node = Arc::clone(&self.nodes[i]);
        self.nodes[i].with_live(move |live| async move { node.request(live, &op).await }.boxed())
    }

    fn expiry(
        &self,
        i: usize,
        key: Arc<str>,
    ) -> BoxFuture<'static, Result<Option<Duration>, NodeError>> {
        let node = Arc::clone(&self.nodes[i]);
        self.nodes[i].with_live(move |live| async move { node.expiry(live, &key).await }.boxed())
    }

    fn holder(
        &self,
        i: usize,
        key: Arc<str>,
    ) -> BoxFuture<'static, Result<Option<u64>, NodeError>> {
        let node = Arc::clone(&self.nodes[i]);
        self.nodes[i].with_live(move |live| async move { node.holder(live, &key).await }.boxed())
    }

    fn extend_many(
        &self,
        i: usize,
        batch: Arc<Batch>,
    ) -> BoxFuture<'static, Result<Vec<Renewed>, NodeError>> {
        let node = Arc::clone(&self.nodes[i]);
        self.nodes[i].with_live(move |live| {
            async move {
                match node
                    .eval(&live, || Call::ExtendMany(Arc::clone(&batch)))
                    .await?
                {
                    Resp::Ints(out) => Ok(out
                        .into_iter()
                        .map(|v| match v {
                            1 => Renewed::Extended,
                            2 => Renewed::Missing,
                            _ => Renewed::Refused,
                        })
                        .collect()),
                    other => Err(unexpected(&other)),
                }
            }
            .boxed()
        })
    }

    fn misconfigured(&self) -> Option<ConfigError> {
        self.identities.conflict()
    }
}

/// Opens simulated subscription connections to one node.
#[derive(Clone)]
pub(crate) struct SubClient {
    inner: Arc<Inner>,
    index: usize,
}

/// The command half of a simulated subscription connection.
#[derive(Clone)]
pub(crate) struct SubSink {
    inner: Arc<Inner>,
    index: usize,
    conn: Arc<Conn>,
}

/// The message half of a simulated subscription connection. Dropping it closes the
/// connection.
pub(crate) struct SubStream {
    inner: Arc<Inner>,
    index: usize,
    conn: Arc<Conn>,
    rx: mpsc::UnboundedReceiver<(Instant, String, String)>,
}

impl Drop for SubStream {
    fn drop(&mut self) {
        self.conn.token.cancel();
    }
}

impl SubClient {
    pub(crate) async fn open(&self) -> Result<(SubSink, SubStream), SubError> {
        let conn = self.inner.open(self.index);
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = SubStream {
            inner: Arc::clone(&self.inner),
            index: self.index,
            conn: Arc::clone(&conn),
            rx,
        };
        match self
            .inner
            .send(self.index, &conn, Req::OpenSub { tx })
            .await
        {
            Ok(Resp::Ok) => Ok((
                SubSink {
                    inner: Arc::clone(&self.inner),
                    index: self.index,
                    conn,
                },
                stream,
            )),
            _ => Err(SubError::Broken),
        }
    }
}

impl SubSink {
    async fn command(&self, req: Req) -> Result<(), SubError> {
        match self.inner.send(self.index, &self.conn, req).await {
            Ok(Resp::Ok) => Ok(()),
            _ => Err(SubError::Broken),
        }
    }

    pub(crate) async fn subscribe(&mut self, channels: &[String]) -> Result<(), SubError> {
        self.command(Req::Subscribe(channels.to_vec())).await
    }

    pub(crate) async fn unsubscribe(&mut self, channels: &[String]) -> Result<(), SubError> {
        self.command(Req::Unsubscribe(channels.to_vec())).await
    }

    pub(crate) async fn ping(&mut self) -> Result<(), SubError> {
        self.command(Req::Ping).await
    }
}

impl SubStream {
    /// The next message: its channel and payload; `None` once the connection broke.
    pub(crate) async fn next(&mut self) -> Option<(String, String)> {
        let token = self.conn.token.clone();
        let next = async {
            loop {
                let (at, channel, payload) = self.rx.recv().await?;
                if at > Instant::now() {
                    tokio::time::sleep_until(at).await;
                }
                // A message that reaches a partitioned link is lost.
                if !self.inner.world().nodes[self.index].partitioned {
                    return Some((channel, payload));
                }
            }
        };
        crate::det::select! {
            () = token.cancelled() => None,
            msg = next => msg,
        }
    }
}
