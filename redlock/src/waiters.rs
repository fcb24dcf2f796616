//! Fast hand-off: release publishes on the resource's channel; waiters share one subscription
//! connection per node and retry as soon as any node reports a release. Local waiters on the
//! same resources take turns in FIFO order, so none of them starves behind its neighbours.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use redis::aio::PubSubSink;
use tokio::sync::Notify;

/// A channel nobody waited on for this long is unsubscribed (by the next new waiter).
const IDLE: Duration = Duration::from_secs(30);

/// Per-channel interest: the notifier local waiters sleep on, how many wait, whether every
/// node confirmed the subscription, and since when nobody waits.
struct Channel {
    notify: Arc<Notify>,
    waiters: usize,
    subscribed: bool,
    idle_since: Option<tokio::time::Instant>,
}

/// One node's subscription connection, opened on first use.
struct NodeSub {
    client: redis::Client,
    sink: tokio::sync::Mutex<Option<PubSubSink>>,
}

/// Subscriptions and local turn-taking for one client.
pub(crate) struct Waiters {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    turns: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
    nodes: Vec<NodeSub>,
    timeout: Duration,
}

impl std::fmt::Debug for Waiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiters")
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

/// A waiter's registration. The subscription outlives it: a hot key's waiters come and go far
/// faster than a subscribe round trip, so channels are dropped only after [`IDLE`].
pub(crate) struct Interest {
    waiters: Arc<Waiters>,
    channel: String,
    pub(crate) notify: Arc<Notify>,
}

impl Drop for Interest {
    fn drop(&mut self) {
        if let Some(c) = lock(&self.waiters.channels).get_mut(&self.channel) {
            c.waiters = c.waiters.saturating_sub(1);
            if c.waiters == 0 {
                c.idle_since = Some(tokio::time::Instant::now());
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Waiters {
    pub(crate) fn new(clients: Vec<redis::Client>, timeout: Duration) -> Self {
        Self {
            channels: Arc::default(),
            turns: Mutex::default(),
            nodes: clients
                .into_iter()
                .map(|client| NodeSub {
                    client,
                    sink: tokio::sync::Mutex::new(None),
                })
                .collect(),
            timeout,
        }
    }

    /// The FIFO turn lock of a set of resources (shared by every local waiter on it).
    pub(crate) fn turn(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = lock(&self.turns);
        if let Some(t) = turns.get(key).and_then(Weak::upgrade) {
            return t;
        }
        turns.retain(|_, w| w.strong_count() > 0);
        let t = Arc::new(tokio::sync::Mutex::new(()));
        turns.insert(key.to_owned(), Arc::downgrade(&t));
        t
    }

    /// Wakes local waiters on `channel` at once (a release by this client).
    pub(crate) fn notify_local(&self, channel: &str) {
        if let Some(c) = lock(&self.channels).get(channel) {
            c.notify.notify_waiters();
        }
    }

    /// Registers interest in `channel` and makes sure every reachable node delivers it.
    /// Subscription failures are ignored: waiters then fall back to their retry delay.
    pub(crate) async fn interest(self: &Arc<Self>, channel: &str) -> Interest {
        let now = tokio::time::Instant::now();
        let (notify, subscribed, idle) = {
            let mut channels = lock(&self.channels);
            let idle: Vec<String> = channels
                .iter()
                .filter(|(_, c)| c.idle_since.is_some_and(|t| now - t > IDLE))
                .map(|(name, _)| name.clone())
                .collect();
            for name in &idle {
                channels.remove(name);
            }
            let c = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    notify: Arc::new(Notify::new()),
                    waiters: 0,
                    subscribed: false,
                    idle_since: None,
                });
            c.waiters += 1;
            c.idle_since = None;
            (Arc::clone(&c.notify), c.subscribed, idle)
        };
        for name in idle {
            let waiters = Arc::clone(self);
            tokio::spawn(async move { waiters.unsubscribe(&name).await });
        }
        if !subscribed {
            let ok = join_all(
                self.nodes
                    .iter()
                    .map(|n| tokio::time::timeout(self.timeout, self.subscribe(n, channel))),
            )
            .await
            .into_iter()
            .all(|r| r == Ok(true));
            if ok && let Some(c) = lock(&self.channels).get_mut(channel) {
                c.subscribed = true;
            }
        }
        Interest {
            waiters: Arc::clone(self),
            channel: channel.to_owned(),
            notify,
        }
    }

    /// Subscribes `channel` on one node; `true` once the node confirmed it.
    async fn subscribe(&self, node: &NodeSub, channel: &str) -> bool {
        let mut sink = node.sink.lock().await;
        if sink.is_none() {
            let Ok(pubsub) = node.client.get_async_pubsub().await else {
                return false;
            };
            let (new_sink, mut stream) = pubsub.split();
            let channels = Arc::downgrade(&self.channels);
            tokio::spawn(async move {
                while let Some(msg) = stream.next().await {
                    let Some(channels) = channels.upgrade() else {
                        return;
                    };
                    if let Some(c) = lock(&channels).get(msg.get_channel_name()) {
                        c.notify.notify_waiters();
                    }
                }
            });
            *sink = Some(new_sink);
        }
        let Some(s) = sink.as_mut() else { return false };
        if s.subscribe(channel).await.is_ok() {
            return true;
        }
        // A broken subscription connection is reopened by the next waiter; every channel is
        // subscribed again on it as its waiters come.
        *sink = None;
        for c in lock(&self.channels).values_mut() {
            c.subscribed = false;
        }
        false
    }

    async fn unsubscribe(&self, channel: &str) {
        join_all(self.nodes.iter().map(|n| async move {
            let mut sink = n.sink.lock().await;
            // Checked under the sink's lock: a waiter that re-created the channel meanwhile
            // subscribes under the same lock, so its SUBSCRIBE cannot be overtaken by this
            // UNSUBSCRIBE.
            if lock(&self.channels).contains_key(channel) {
                return;
            }
            if let Some(s) = sink.as_mut() {
                let _ = tokio::time::timeout(self.timeout, s.unsubscribe(channel)).await;
            }
        }))
        .await;
    }
}
