//! One redis-server child process.

use std::fs::{self, File};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{Signal, kill as send_signal};
use nix::unistd::Pid;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo, RedisResult};
use tempfile::TempDir;
use tokio::time::{Instant, sleep};

use crate::config::{DataOnRestart, NodeConfig, Persistence};
use crate::proxy::FaultProxy;

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
/// `SAVE` before a `Keep` restart; generous because tests may hold many keys.
const SAVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines of the node's logs quoted in startup errors.
const LOG_TAIL_LINES: usize = 20;

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
            let mut node = RedisNode {
                config: Arc::clone(&config),
                port,
                tls_port,
                child: Mutex::new(None),
                proxy: None,
                dir: tempfile::Builder::new()
                    .prefix("redlock-testkit-")
                    .tempdir()?,
            };
            match node.spawn_and_wait().await {
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
        Err(last_err.unwrap_or_else(|| io::Error::other("no attempt to start redis-server")))
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
    /// * [`DataOnRestart::Keep`]: if the process is running it is resumed and, unless the
    ///   node uses [`Persistence::AofAlways`] (whose AOF is already fsynced), told to `SAVE`
    ///   before being killed, so its keys survive. A node that was already killed restarts
    ///   with whatever its data files hold.
    /// * [`DataOnRestart::Wipe`]: the process is killed and its data files deleted, so it
    ///   restarts empty — the "lost its data" case of Redlock's safety argument.
    ///
    /// # Errors
    ///
    /// Fails if `SAVE` fails, or if the server does not come back within 10 s (the error
    /// quotes the end of its log).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancelled after the kill, the node stays down (or starts without
    /// being awaited); call `restart` again.
    pub async fn restart(&self, data: DataOnRestart) -> io::Result<()> {
        if data == DataOnRestart::Keep
            && self.is_running()
            && self.config.persistence != Persistence::AofAlways
        {
            self.resume();
            self.save().await?;
        }
        self.kill();
        if data == DataOnRestart::Wipe {
            self.wipe_data()?;
        }
        let mut last_err = None;
        for _ in 0..RESTART_ATTEMPTS {
            match self.spawn_and_wait().await {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    self.kill();
                    last_err = Some(e);
                    sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("no attempt to restart redis-server")))
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

    fn wipe_data(&self) -> io::Result<()> {
        for name in ["dump.rdb", "appendonly.aof"] {
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

    fn command(&self) -> io::Result<Command> {
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
            .arg("--maxmemory-policy")
            .arg("noeviction")
            .arg("--daemonize")
            .arg("no")
            .arg("--protected-mode")
            .arg("no")
            .arg("--logfile")
            .arg(dir.join("redis.log"));
        match self.config.persistence {
            Persistence::None => {
                cmd.arg("--appendonly").arg("no");
            }
            Persistence::AofAlways => {
                cmd.arg("--appendonly")
                    .arg("yes")
                    .arg("--appendfsync")
                    .arg("always");
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
        cmd.stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output);
        Ok(cmd)
    }

    /// Spawns the process and waits until it answers `PING` as itself.
    ///
    /// Errors with `AddrInUse` when the port turned out to be taken, so callers can retry.
    async fn spawn_and_wait(&self) -> io::Result<()> {
        let child = self.command()?.spawn()?;
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
                    return Err(io::Error::new(
                        kind,
                        format!(
                            "redis-server on port {} exited during startup ({status}); log tail:\n{log}",
                            self.port
                        ),
                    ));
                }
                Some(Err(e)) => return Err(e),
                None => return Err(io::Error::other("redis-server was killed during startup")),
            }
            match self.probe().await {
                Ok(Some(server_pid)) if server_pid == pid => return Ok(()),
                Ok(Some(other)) => {
                    self.kill();
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!(
                            "port {} is served by another redis-server (pid {other})",
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
                        "redis-server on port {} not ready within {READY_TIMEOUT:?}; log tail:\n{}",
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

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Locates `redis-server`: `$REDIS_SERVER`, else the first match on `$PATH`.
pub(crate) fn find_redis_server() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os("REDIS_SERVER").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "redis-server not found (set REDIS_SERVER or put it on PATH): \
                 run `bash .ci/run` or `apt-get install redis-server`",
            )
        })
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
