//! A throwaway PostgreSQL server for tests and benches.

use std::fmt;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::{PermissionsExt, chown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{Signal, kill as send_signal};
use nix::unistd::{Pid, User, geteuid};
use tempfile::TempDir;
use tokio::time::{Instant, sleep};
/// The `tokio-postgres` crate the testkit uses, so tests share its version.
pub use tokio_postgres;

/// How long `initdb` may take.
const INITDB_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a fresh server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to exit after `SIGQUIT` before it gets `SIGKILL`.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts with fresh ports when a port is taken between choosing and binding it.
const PORT_ATTEMPTS: usize = 5;
/// The superuser `initdb` creates.
const SUPERUSER: &str = "fencing";
/// The OS account PostgreSQL runs as when the tests run as root (it refuses to run as root).
const OS_USER: &str = "postgres";

/// One PostgreSQL server owned by the test: `initdb` into a temporary directory, listening on a
/// random free loopback port (password auth, scram-sha-256) and on a unix socket inside that
/// directory (trust). Killed and deleted on `Drop`.
///
/// When the process runs as root, the server runs as the `postgres` OS user. Binaries are
/// taken from `$PG_BIN_DIR`, else the newest `/usr/lib/postgresql/*/bin`, else `pg_config
/// --bindir`, else `$PATH`. A missing installation is an error with a clear message, never a
/// silent skip.
pub struct PgServer {
    port: u16,
    password: String,
    child: Mutex<Option<Child>>,
    // Declared last so it is deleted after the process is gone (see `Drop`).
    dir: TempDir,
}

impl fmt::Debug for PgServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgServer")
            .field("port", &self.port)
            .field("user", &SUPERUSER)
            .field("password", &"***")
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl PgServer {
    /// Initialises and starts a server, waiting (bounded) until it accepts connections.
    ///
    /// # Errors
    ///
    /// When PostgreSQL is not installed, `initdb` fails, or the server does not come up in
    /// time (the error quotes the server log).
    pub async fn start() -> io::Result<PgServer> {
        let bin = bin_dir()?;
        let run_as = run_as()?;
        let dir = tempfile::Builder::new()
            .prefix("redlock-testkit-pg-")
            .tempdir()?;
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700))?;
        let password = random_password();
        let pwfile = dir.path().join("pwfile");
        fs::write(&pwfile, &password)?;
        if let Some((uid, gid)) = run_as {
            chown(dir.path(), Some(uid), Some(gid))?;
            chown(&pwfile, Some(uid), Some(gid))?;
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(dir.path().join("data"))
            .args([
                "-U",
                SUPERUSER,
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .stdin(Stdio::null());
        as_user(&mut initdb, run_as);
        let out = tokio::time::timeout(
            INITDB_TIMEOUT,
            tokio::task::spawn_blocking(move || initdb.output()),
        )
        .await
        .map_err(|_| io::Error::other("initdb did not finish in time"))?
        .map_err(io::Error::other)??;
        fs::remove_file(&pwfile)?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "initdb failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let mut server = PgServer {
            port: 0,
            password,
            child: Mutex::new(None),
            dir,
        };
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port()?;
            match server.spawn_and_wait(&bin, run_as).await {
                Ok(()) => return Ok(server),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    server.stop();
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("no attempt to start postgres")))
    }

    async fn spawn_and_wait(&self, bin: &Path, run_as: Option<(u32, u32)>) -> io::Result<()> {
        let log = fs::File::create(self.log_path())?;
        if let Some((uid, gid)) = run_as {
            chown(self.log_path(), Some(uid), Some(gid))?;
        }
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            // A throwaway server: durability buys nothing here.
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=64", "-c", "shared_buffers=32MB"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        as_user(&mut cmd, run_as);
        *self.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(cmd.spawn()?);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.exited() {
                let log = self.log_tail();
                let kind = if log.contains("Address already in use") {
                    io::ErrorKind::AddrInUse
                } else {
                    io::ErrorKind::Other
                };
                return Err(io::Error::new(
                    kind,
                    format!("postgres exited ({status}) during startup; log:\n{log}"),
                ));
            }
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), self.connect()).await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "postgres did not accept connections within {READY_TIMEOUT:?}; log:\n{}",
                        self.log_tail()
                    ),
                ));
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// The loopback TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The superuser's name.
    pub fn user(&self) -> &str {
        SUPERUSER
    }

    /// The superuser's password (random per server). A secret: `Debug` never shows it.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The directory holding the data directory, the unix socket and `postgres.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Connection settings for the `postgres` database over loopback TCP (its `Debug`
    /// redacts the password).
    pub fn config(&self) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user(SUPERUSER)
            .password(&self.password)
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(5));
        config
    }

    /// Opens a connection and drives it on a spawned task.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or refuses the login.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, connection) = self.config().connect(tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            // The connection ends when the client is dropped or the server goes away.
            let _ = connection.await;
        });
        Ok(client)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn exited(&self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// `SIGQUIT` (immediate shutdown: the postmaster takes its backends down), then `SIGKILL`
    /// after [`STOP_TIMEOUT`]; reaps the process.
    fn stop(&self) {
        let mut guard = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mut child) = guard.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = send_signal(Pid::from_raw(pid), Signal::SIGQUIT);
        }
        let deadline = std::time::Instant::now() + STOP_TIMEOUT;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `(uid, gid)` of the `postgres` account when running as root; `None` otherwise.
fn run_as() -> io::Result<Option<(u32, u32)>> {
    if !geteuid().is_root() {
        return Ok(None);
    }
    match User::from_name(OS_USER) {
        Ok(Some(user)) => Ok(Some((user.uid.as_raw(), user.gid.as_raw()))),
        Ok(None) => Err(io::Error::other(format!(
            "running as root, but there is no {OS_USER:?} OS user to run PostgreSQL as \
             (PostgreSQL refuses to run as root); install the postgresql package"
        ))),
        Err(e) => Err(io::Error::other(format!(
            "looking up user {OS_USER:?}: {e}"
        ))),
    }
}

fn as_user(cmd: &mut Command, run_as: Option<(u32, u32)>) {
    if let Some((uid, gid)) = run_as {
        // std drops supplementary groups when a root parent sets the uid.
        cmd.uid(uid).gid(gid).env("HOME", "/tmp").current_dir("/");
    }
}

fn bin_dir() -> io::Result<PathBuf> {
    let has_initdb = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Some(dir) = std::env::var_os("PG_BIN_DIR").map(PathBuf::from) {
        return if has_initdb(&dir) {
            Ok(dir)
        } else {
            Err(io::Error::other(format!(
                "PG_BIN_DIR={} has no initdb/postgres",
                dir.display()
            )))
        };
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, d)| has_initdb(d))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Ok(dir);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_initdb(&dir) {
            return Ok(dir);
        }
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|d| has_initdb(d))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "PostgreSQL server binaries (initdb, postgres) not found: install PostgreSQL \
                 (Debian: apt-get install postgresql) or set PG_BIN_DIR",
            )
        })
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn random_password() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..24)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)]))
        .collect()
}
