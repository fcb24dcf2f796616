//! A fault-injecting TCP proxy placed in front of one redis-server.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout};

/// How long the proxy waits for the upstream server to accept a connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Size of one read from either side; each read is forwarded as one chunk.
const CHUNK_SIZE: usize = 16 * 1024;

/// The fault currently injected, on top of the configured delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum Fault {
    #[default]
    None,
    Blackhole,
    Partition,
}

/// Live proxy settings, shared by the accept loop and every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct State {
    delay: Duration,
    jitter: Duration,
    fault: Fault,
    /// Added to every chunk of the connections accepted while it is set, for their whole life.
    new_delay: Duration,
    /// Bumped by [`FaultProxy::reset_open`]: connections accepted before are reset.
    resets: u64,
}

/// A TCP proxy in front of one server, with live fault controls.
///
/// Every control takes `&self` and applies at once to existing *and* new connections, but for
/// the new-connection delay:
///
/// * [`set_delay`](Self::set_delay): each chunk, in each direction, is delivered
///   `delay ± jitter` after it was read; order within a direction is preserved.
/// * [`blackhole`](Self::blackhole): connections are accepted and read, but nothing is
///   forwarded in either direction. Bytes read meanwhile are *held*, not discarded, and are
///   delivered after [`heal`](Self::heal) — like TCP retransmission over a link that came back.
///   Discarding them would corrupt the byte stream and desynchronise pipelined clients.
/// * [`partition`](Self::partition): existing connections are reset (RST) and new ones are
///   reset right after `accept`.
/// * [`reset_open`](Self::reset_open): the connections open now are reset (RST), new ones
///   are accepted as usual — a server that dropped its clients, or a link that broke once.
/// * [`set_new_connection_delay`](Self::set_new_connection_delay): connections accepted from
///   then on are slowed for their whole life, the ones already open are not — one connection
///   of a client slow while its others are not.
/// * [`heal`](Self::heal): back to a transparent proxy with no delay (connections accepted
///   under a new-connection delay keep theirs).
///
/// Dropping the `FaultProxy` stops the accept loop and closes every proxied connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    target: SocketAddr,
    state: watch::Sender<State>,
    accept_task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port, forwarding to `target`.
    ///
    /// Must be called from within a tokio runtime; the proxy's tasks run on it.
    ///
    /// # Errors
    ///
    /// Fails if no loopback port can be bound.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is spawned until the listener is bound, and the only await is
    /// that bind.
    pub async fn start(target: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (state, state_rx) = watch::channel(State::default());
        let accept_task = tokio::spawn(accept_loop(listener, target, state_rx));
        Ok(FaultProxy {
            addr,
            target,
            state,
            accept_task,
        })
    }

    /// The proxy's listening address (loopback).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the proxy forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Delays every chunk, in each direction, by `delay ± uniform(jitter)` (never below zero).
    ///
    /// Chunks already queued keep their delivery times. Does not clear a blackhole or
    /// partition; [`heal`](Self::heal) does.
    pub fn set_delay(&self, delay: Duration, jitter: Duration) {
        self.state.send_modify(|s| {
            s.delay = delay;
            s.jitter = jitter;
        });
    }

    /// Delays every chunk, in each direction, of the connections accepted from now on by
    /// `delay` (on top of [`set_delay`](Self::set_delay)'s), for as long as they stay open;
    /// connections already open are not affected, nor are these by a later change.
    pub fn set_new_connection_delay(&self, delay: Duration) {
        self.state.send_modify(|s| s.new_delay = delay);
    }

    /// Stops forwarding in both directions while still accepting and reading.
    pub fn blackhole(&self) {
        self.state.send_modify(|s| s.fault = Fault::Blackhole);
    }

    /// Resets every existing connection and every new one.
    pub fn partition(&self) {
        self.state.send_modify(|s| s.fault = Fault::Partition);
    }

    /// Resets (RST) every connection open now, in both directions, whatever it is carrying;
    /// connections accepted from now on are not affected.
    pub fn reset_open(&self) {
        self.state.send_modify(|s| s.resets += 1);
    }

    /// Removes every fault and delay (connections accepted under a
    /// [new-connection delay](Self::set_new_connection_delay) keep theirs).
    pub fn heal(&self) {
        self.state.send_modify(|s| {
            *s = State {
                resets: s.resets,
                ..State::default()
            };
        });
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Connection tasks notice the dropped `watch::Sender` and close on their own.
        self.accept_task.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, state: watch::Receiver<State>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                // Transient (e.g. EMFILE): back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if state.borrow().fault == Fault::Partition {
            reset(client);
            continue;
        }
        let (own_delay, resets) = {
            let now = state.borrow();
            (now.new_delay, now.resets)
        };
        tokio::spawn(serve(client, target, state.clone(), own_delay, resets));
    }
}

/// Closes `stream` with an RST rather than a FIN, like a network that lost the connection.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Resolves with `true` when a partition starts or the connections open are reset (the
/// reset count is no longer `resets`), `false` when the proxy is dropped.
async fn partitioned(state: &mut watch::Receiver<State>, resets: u64) -> bool {
    loop {
        let now = *state.borrow_and_update();
        if now.fault == Fault::Partition || now.resets != resets {
            return true;
        }
        if state.changed().await.is_err() {
            return false;
        }
    }
}

/// Forwards one accepted connection, each chunk `own_delay` later than the shared delay says,
/// until a partition or a reset of the connections open (counted from `resets`, the count
/// when it was accepted).
async fn serve(
    mut client: TcpStream,
    target: SocketAddr,
    mut state: watch::Receiver<State>,
    own_delay: Duration,
    resets: u64,
) {
    let upstream = tokio::select! {
        upstream = timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(target)) => upstream,
        _ = partitioned(&mut state, resets) => {
            reset(client);
            return;
        }
    };
    let Ok(Ok(mut upstream)) = upstream else {
        reset(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);

    let (up_state, down_state) = (state.clone(), state.clone());
    let partition = {
        let (client_rd, client_wr) = client.split();
        let (upstream_rd, upstream_wr) = upstream.split();
        let forward = async {
            tokio::try_join!(
                pump(client_rd, upstream_wr, up_state, own_delay),
                pump(upstream_rd, client_wr, down_state, own_delay),
            )
        };
        tokio::select! {
            _ = forward => false,
            partition = partitioned(&mut state, resets) => partition,
        }
    };
    if partition {
        reset(client);
        reset(upstream);
    }
}

/// Copies `rd` to `wr`, delivering each chunk at its due time (`own_delay` later than the
/// shared delay says).
///
/// Reading and writing are decoupled by a queue so that a delay never slows down reading and
/// chunks are delivered in order, each at `max(its own due time, previous due time)`.
async fn pump<R, W>(
    mut rd: R,
    mut wr: W,
    state: watch::Receiver<State>,
    own_delay: Duration,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (queue_tx, mut queue_rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read_state = state.clone();
    let reader = async move {
        let mut buf = vec![0u8; CHUNK_SIZE];
        let mut last_due = Instant::now();
        loop {
            let n = rd.read(&mut buf).await?;
            if n == 0 {
                // Dropping `queue_tx` lets the writer drain and then shut down its side.
                return Ok::<(), io::Error>(());
            }
            let now = Instant::now();
            let current = *read_state.borrow();
            let due = (now + own_delay + jittered(current.delay, current.jitter)).max(last_due);
            last_due = due;
            if queue_tx.send((due, buf[..n].to_vec())).is_err() {
                return Ok(());
            }
        }
    };
    let writer = async move {
        let mut state = state;
        while let Some((due, chunk)) = queue_rx.recv().await {
            if due > Instant::now() {
                sleep_until(due).await;
            }
            while state.borrow_and_update().fault == Fault::Blackhole {
                if state.changed().await.is_err() {
                    return Ok(());
                }
            }
            wr.write_all(&chunk).await?;
        }
        wr.shutdown().await
    };
    tokio::try_join!(reader, writer).map(|_| ())
}

/// `delay` plus a uniform offset in `[-jitter, +jitter]`, clamped at zero.
fn jittered(delay: Duration, jitter: Duration) -> Duration {
    if jitter.is_zero() {
        return delay;
    }
    let offset = rand::rng().random_range(-1.0..=1.0) * jitter.as_secs_f64();
    Duration::from_secs_f64((delay.as_secs_f64() + offset).max(0.0))
}
