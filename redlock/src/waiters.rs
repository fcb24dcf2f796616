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

/// Per-channel interest: the notifier local waiters sleep on, and how many wait.
struct Channel {
    notify: Arc<Notify>,
    waiters: usize,
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

/// A waiter's registration; unsubscribes (lazily) when the last waiter of a channel leaves.
pub(crate) struct Interest {
    waiters: Arc<Waiters>,
    channel: String,
    pub(crate) notify: Arc<Notify>,
}

impl Drop for Interest {
    fn drop(&mut self) {
        let last = {
            let mut channels = lock(&self.waiters.channels);
            match channels.get_mut(&self.channel) {
                Some(c) if c.waiters <= 1 => {
                    channels.remove(&self.channel);
                    true
                }
                Some(c) => {
                    c.waiters -= 1;
                    false
                }
                None => false,
            }
        };
        if last && let Ok(rt) = tokio::runtime::Handle::try_current() {
            let waiters = Arc::clone(&self.waiters);
            let channel = std::mem::take(&mut self.channel);
            rt.spawn(async move { waiters.unsubscribe(&channel).await });
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
        let (notify, first) = {
            let mut channels = lock(&self.channels);
            let c = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    notify: Arc::new(Notify::new()),
                    waiters: 0,
                });
            c.waiters += 1;
            (Arc::clone(&c.notify), c.waiters == 1)
        };
        if first {
            join_all(
                self.nodes
                    .iter()
                    .map(|n| tokio::time::timeout(self.timeout, self.subscribe(n, channel))),
            )
            .await;
        }
        Interest {
            waiters: Arc::clone(self),
            channel: channel.to_owned(),
            notify,
        }
    }

    async fn subscribe(&self, node: &NodeSub, channel: &str) {
        let mut sink = node.sink.lock().await;
        if sink.is_none() {
            let Ok(pubsub) = node.client.get_async_pubsub().await else {
                return;
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
        if let Some(s) = sink.as_mut()
            && s.subscribe(channel).await.is_err()
        {
            // A broken subscription connection is reopened by the next waiter.
            *sink = None;
        }
    }

    async fn unsubscribe(&self, channel: &str) {
        if lock(&self.channels).contains_key(channel) {
            return; // a new waiter arrived meanwhile
        }
        join_all(self.nodes.iter().map(|n| async move {
            if let Some(s) = n.sink.lock().await.as_mut() {
                let _ = tokio::time::timeout(self.timeout, s.unsubscribe(channel)).await;
            }
        }))
        .await;
    }
}
