//! `--processes`: every client is its own OS process (`redlock-chaos worker`), so a client
//! pause is a real `SIGSTOP` of everything the client runs.
//!
//! The parent passes the settings on the command line (the PostgreSQL password in the
//! environment), reads the worker's operations as JSON lines from its stdout, and asks for a
//! pause by writing `pause` to its stdin; the worker stops itself with `SIGSTOP` at its next
//! read→write gap, and the parent sends `SIGCONT` once the pause has lasted.

use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use nix::sys::signal::{Signal, kill, raise};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::mpsc;

use crate::check::Leftovers;
use crate::history::{Clock, Monotonic, Op};
use crate::nemesis::{self, Pauser};
use crate::options::{FenceBackend, Settings};
use crate::real::{Servers, final_values, heal_everything, node_faults, schedule};
use crate::registers::{PgRegister, RedisRegister};
use crate::report::Outcomes;
use crate::workload::{self, ClientPlan, PauseSlot, Register, Stop};

/// Environment variable carrying the PostgreSQL password to workers.
const PG_PASSWORD_ENV: &str = "REDLOCK_CHAOS_PG_PASSWORD";

/// What a worker needs, passed as one JSON argument.
#[derive(Debug, Serialize, Deserialize)]
pub struct WorkerArgs {
    /// Client number.
    pub client: u32,
    /// The run's settings.
    pub settings: WorkerSettings,
    /// Lock node URLs (no passwords: the test cluster has none).
    pub nodes: Vec<String>,
    /// The register's redis-server, for `--fence redis`.
    pub register_url: Option<String>,
    /// The PostgreSQL port and user, for `--fence pg` (password in the environment).
    pub pg: Option<(u16, String)>,
    /// When to stop starting holds, on `CLOCK_MONOTONIC` (ns).
    pub until_ns: u64,
}

/// The settings a worker uses.
#[derive(Debug, Serialize, Deserialize)]
pub struct WorkerSettings {
    seed: u64,
    tasks: u32,
    resources: u32,
    ttl_ms: u64,
    drift_factor: f64,
    quarantine: bool,
    fencing: bool,
}

/// A line a worker prints.
#[derive(Debug, Serialize, Deserialize)]
enum Line {
    Op(Op),
    Done { tasks_left: usize },
}

/// Stops the whole process; the parent continues it.
struct StopProcess;

impl Stop for StopProcess {
    fn stop(&self, _lasts: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async {
            if let Err(e) = raise(Signal::SIGSTOP) {
                tracing::error!(error = %e, "could not stop this client");
            }
        })
    }
}

/// The worker process: one client, operations to stdout.
///
/// # Errors
/// When the client cannot be built or a register cannot be reached.
pub async fn worker(args: WorkerArgs) -> Result<(), String> {
    let s = &args.settings;
    let settings = Settings {
        seed: s.seed,
        duration: Duration::ZERO,
        nodes: args.nodes.len(),
        clients: 1,
        tasks: s.tasks,
        resources: s.resources,
        nemesis: Vec::new(),
        fence: FenceBackend::Redis,
        fencing: s.fencing,
        quarantine: s.quarantine,
        drift_factor: s.drift_factor,
        ttl: Duration::from_millis(s.ttl_ms),
        jump: None,
        processes: true,
    };
    let client = crate::real::redlock(&settings, &args.nodes)?;
    let register: Arc<dyn Register> = match (&args.register_url, &args.pg) {
        (Some(url), _) => {
            let conn = redis::Client::open(url.as_str())
                .map_err(|e| e.to_string())?
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| format!("register server: {e}"))?;
            Arc::new(RedisRegister::new(conn))
        }
        (None, Some((port, user))) => {
            let password = std::env::var(PG_PASSWORD_ENV).unwrap_or_default();
            let (pg, conn) = redlock_testkit::tokio_postgres::Config::new()
                .host("127.0.0.1")
                .port(*port)
                .user(user)
                .password(password)
                .dbname("postgres")
                .connect(redlock_testkit::tokio_postgres::NoTls)
                .await
                .map_err(|e| format!("PostgreSQL: {e}"))?;
            tokio::spawn(conn);
            Arc::new(PgRegister::new(pg))
        }
        _ => return Err("a worker needs a redis or pg register".to_owned()),
    };
    let clock = Monotonic;
    let left = Duration::from_nanos(args.until_ns.saturating_sub(clock.now()));
    let plan = ClientPlan {
        id: args.client,
        resources: s.resources,
        seed: s.seed,
        until: tokio::time::Instant::now() + left,
        fencing: s.fencing,
        hold: settings.hold(),
        tasks: s.tasks,
    };
    let pause = Arc::new(PauseSlot::default());
    let requests = Arc::clone(&pause);
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim() == "pause" {
                // The parent decides how long; the worker only stops at the right point.
                requests.request(Duration::ZERO);
            }
        }
    });
    let (tx, mut rx) = mpsc::unbounded_channel::<Line>();
    let printer = tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(line) = rx.recv().await {
            let mut text = serde_json::to_string(&line).unwrap_or_default();
            text.push('\n');
            if out.write_all(text.as_bytes()).await.is_err() {
                return;
            }
        }
        let _ = out.flush().await;
    });
    let ops = tx.clone();
    workload::client(
        plan,
        client,
        register,
        Arc::new(clock),
        pause,
        Arc::new(StopProcess),
        Arc::new(move |op| {
            let _ = ops.send(Line::Op(op));
        }),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The stdin reader and the printer are this worker's own tasks.
    let tasks_left = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
        .saturating_sub(2);
    let _ = tx.send(Line::Done { tasks_left });
    drop(tx);
    let _ = printer.await;
    Ok(())
}

/// Pauses worker processes: `pause` on stdin, then `SIGCONT` once stopped for `lasts`.
struct ProcessPauser {
    workers: Vec<(Option<u32>, mpsc::UnboundedSender<()>)>,
}

impl Pauser for ProcessPauser {
    fn pause(&self, client: usize, lasts: Duration) {
        let Some((Some(pid), ask)) = self.workers.get(client) else {
            return;
        };
        if ask.send(()).is_err() {
            return;
        }
        let pid = Pid::from_raw(*pid as i32);
        tokio::spawn(async move {
            // Wait (bounded) until the worker stopped itself, then let the pause last.
            for _ in 0..2000 {
                if stopped(pid) {
                    tokio::time::sleep(lasts).await;
                    let _ = kill(pid, Signal::SIGCONT);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
}

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn stopped(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|st| st == "T")
        })
        .unwrap_or(false)
}

async fn feed(mut stdin: ChildStdin, mut asks: mpsc::UnboundedReceiver<()>) {
    while asks.recv().await.is_some() {
        if stdin.write_all(b"pause\n").await.is_err() {
            return;
        }
        let _ = stdin.flush().await;
    }
}

/// Runs the workload with one worker process per client.
pub async fn run(settings: &Settings) -> Result<Outcomes, String> {
    if settings.fence == FenceBackend::Memory {
        return Err(
            "--processes needs a register every process can reach: --fence redis or --fence pg"
                .to_owned(),
        );
    }
    let servers = Servers::start(settings).await?;
    let urls = servers.cluster.urls();
    crate::real::warm_up(settings, &urls).await?;
    let clock = Monotonic;
    let start = tokio::time::Instant::now();
    let start_ns = clock.now();
    let until_ns = start_ns + settings.duration.as_nanos() as u64;
    let exe = std::env::current_exe().map_err(|e| format!("locating redlock-chaos: {e}"))?;
    let register_url = servers.register_url();
    let pg = servers.pg_login();
    let mut children = Vec::new();
    let mut pausers = Vec::new();
    let collected: Arc<Mutex<(Vec<Op>, usize)>> = Arc::default();
    let mut readers = Vec::new();
    for id in 0..settings.clients {
        let args = WorkerArgs {
            client: id as u32,
            settings: WorkerSettings {
                seed: settings.seed,
                tasks: settings.tasks,
                resources: settings.resources,
                ttl_ms: settings.ttl.as_millis() as u64,
                drift_factor: settings.drift_factor,
                quarantine: settings.quarantine,
                fencing: settings.fencing,
            },
            nodes: urls.clone(),
            register_url: register_url.clone(),
            pg: pg.as_ref().map(|(port, user, _)| (*port, user.clone())),
            until_ns,
        };
        let mut cmd = Command::new(&exe);
        cmd.arg("worker")
            .arg(serde_json::to_string(&args).map_err(|e| e.to_string())?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some((_, _, password)) = &pg {
            cmd.env(PG_PASSWORD_ENV, password);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting worker {id}: {e}"))?;
        let (ask, asks) = mpsc::unbounded_channel();
        if let Some(stdin) = child.stdin.take() {
            tokio::spawn(feed(stdin, asks));
        }
        pausers.push((child.id(), ask));
        if let Some(stdout) = child.stdout.take() {
            let collected = Arc::clone(&collected);
            readers.push(tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                let mut finished = false;
                while let Ok(Some(line)) = lines.next_line().await {
                    match serde_json::from_str::<Line>(&line) {
                        Ok(Line::Op(op)) => lock(&collected).0.push(op),
                        Ok(Line::Done { tasks_left }) => {
                            lock(&collected).1 += tasks_left;
                            finished = true;
                        }
                        Err(e) => tracing::warn!(error = %e, "unreadable worker line"),
                    }
                }
                finished
            }));
        }
        children.push(child);
    }

    let model = settings.model();
    let faults = node_faults(settings, &servers);
    let pauser = ProcessPauser { workers: pausers };
    let applied = nemesis::run(&schedule(settings), &model, &faults, &pauser, &clock, start).await;
    heal_everything(&servers.cluster);
    // Closes the workers' stdin.
    drop(pauser);

    let mut leftovers = Leftovers::default();
    let deadline = start + settings.duration + Duration::from_secs(30);
    for (mut child, reader) in children.into_iter().zip(readers) {
        if let Some(pid) = child.id() {
            // A worker stopped by a pause request that came too late must not hang the run.
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
        }
        match tokio::time::timeout_at(deadline, child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(_)) => leftovers.panics += 1,
            Ok(Err(e)) => return Err(format!("waiting for a worker: {e}")),
            Err(_) => {
                leftovers.stuck += 1;
                let _ = child.kill().await;
            }
        }
        if !matches!(reader.await, Ok(true)) {
            leftovers.stuck += 1;
        }
    }
    let end_ns = clock.now();
    servers
        .check_leftovers(settings, &applied, &mut leftovers)
        .await;
    let (ops, tasks) = std::mem::take(&mut *lock(&collected));
    leftovers.tasks += tasks;
    let finals = final_values(settings, &servers, None).await;
    Ok(Outcomes {
        ops,
        faults: applied,
        finals,
        leftovers,
        span: (start_ns, end_ns),
        pause_strikes: None,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
