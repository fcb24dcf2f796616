//! A run against real `redis-server` processes: the cluster, the registers, the clients
//! (threads, or OS processes), the nemesis, and the collection of the history.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redlock::{DEFAULT_KEY_PREFIX, Redlock, RedlockBuilder};
use redlock_testkit::{Cluster, Persistence, PgServer, RedisNode};

use crate::check::Leftovers;
use crate::history::{Clock, Monotonic, Op};
use crate::nemesis::{self, Kind, Schedule, Shape};
use crate::options::{FenceBackend, Settings};
use crate::real_faults::{self, RealFaults};
use crate::registers::{MemoryRegister, PgRegister, RedisRegister};
use crate::report::Outcomes;
use crate::workload::{self, BlockThread, PauseSlot, PauseSlots, Register};

/// Panics seen by the panic hook during the run.
pub static PANICS: AtomicUsize = AtomicUsize::new(0);

/// How long a client may take to finish its last hold after the run's end before it counts
/// as stuck.
const FINISH_GRACE: Duration = Duration::from_secs(30);

/// The servers of a run.
pub(crate) struct Servers {
    pub(crate) cluster: Arc<Cluster>,
    register_node: Option<Cluster>,
    pg: Option<PgServer>,
}

impl Servers {
    pub(crate) async fn start(settings: &Settings) -> Result<Servers, String> {
        let persistence = if settings.nemesis.contains(&Kind::KillAof) {
            Persistence::AofAlways
        } else {
            Persistence::None
        };
        let cluster = Cluster::builder()
            .nodes(settings.nodes)
            .proxied(true)
            .persistence(persistence)
            .fake_clock(
                settings
                    .nemesis
                    .iter()
                    .any(|k| matches!(k, Kind::ClockForward | Kind::ClockBack)),
            )
            .start()
            .await
            .map_err(|e| format!("starting {} redis-server nodes: {e}", settings.nodes))?;
        let register_node = match settings.fence {
            FenceBackend::Redis => Some(
                Cluster::start(1)
                    .await
                    .map_err(|e| format!("starting the register's redis-server: {e}"))?,
            ),
            _ => None,
        };
        let pg = match settings.fence {
            FenceBackend::Pg => {
                let pg = PgServer::start()
                    .await
                    .map_err(|e| format!("starting PostgreSQL: {e}"))?;
                let client = pg
                    .connect()
                    .await
                    .map_err(|e| format!("connecting to PostgreSQL: {e}"))?;
                PgRegister::create(&client, settings.resources).await?;
                Some(pg)
            }
            _ => None,
        };
        Ok(Servers {
            cluster: Arc::new(cluster),
            register_node,
            pg,
        })
    }

    fn register_server(&self) -> Option<&RedisNode> {
        self.register_node.as_ref().map(|c| c.node(0))
    }

    /// Once every client stopped: catches the clocks up, waits a TTL (plus the drift
    /// allowance), and records the lock keys still there and the panics seen.
    pub(crate) async fn check_leftovers(
        &self,
        settings: &Settings,
        applied: &[nemesis::Applied],
        leftovers: &mut Leftovers,
    ) {
        catch_up_clocks(&self.cluster, applied);
        tokio::time::sleep(settings.ttl + Duration::from_millis(500)).await;
        leftovers.keys = self
            .cluster
            .keys(&format!("{DEFAULT_KEY_PREFIX}lock:*"))
            .await;
        leftovers.panics += PANICS.load(Ordering::Relaxed);
    }

    /// The register server's URL (`--fence redis`).
    pub(crate) fn register_url(&self) -> Option<String> {
        self.register_server().map(RedisNode::url)
    }

    /// PostgreSQL's port, user and password (`--fence pg`).
    pub(crate) fn pg_login(&self) -> Option<(u16, String, String)> {
        self.pg
            .as_ref()
            .map(|pg| (pg.port(), pg.user().to_owned(), pg.password().to_owned()))
    }
}

/// A client configured for the run (nodes still to be set).
pub(crate) fn builder(settings: &Settings) -> RedlockBuilder {
    let b = Redlock::builder()
        .ttl(settings.ttl)
        .drift_factor(settings.drift_factor)
        .max_hold(Duration::from_secs(3600));
    match settings.quarantine_time() {
        Some(q) => b.restart_quarantine(q),
        None => b,
    }
}

/// Builds one client's `Redlock` on the lock nodes (through their fault proxies).
pub(crate) fn redlock(settings: &Settings, urls: &[String]) -> Result<Redlock, String> {
    builder(settings)
        .nodes(urls.iter().cloned())
        .build()
        .map_err(|e| format!("building the client: {e}"))
}

/// Creates the nodes' identity records and waits out the restart quarantine of the freshly
/// started nodes, so the run starts on a cluster that grants.
pub(crate) async fn warm_up(settings: &Settings, urls: &[String]) -> Result<(), String> {
    let client = redlock(settings, urls)?;
    client.connect().await;
    if let Some(q) = settings.quarantine_time() {
        tokio::time::sleep(q).await;
    }
    Ok(())
}

/// What one in-process client hands back.
struct ClientRun {
    ops: Vec<Op>,
    tasks_left: usize,
}

/// Runs the workload with in-process clients (each on its own thread and current-thread
/// runtime) under the schedule, and collects everything the checkers need. (With
/// `--processes`, `procs::run` runs it instead, with a process per client.)
pub async fn run(settings: &Settings) -> Result<Outcomes, String> {
    let servers = Servers::start(settings).await?;
    let urls = servers.cluster.urls();
    warm_up(settings, &urls).await?;
    let clock: Arc<dyn Clock> = Arc::new(Monotonic);
    let memory: Option<Arc<dyn Register>> = (settings.fence == FenceBackend::Memory)
        .then(|| Arc::new(MemoryRegister::new(settings.resources)) as Arc<dyn Register>);
    let slots = PauseSlots(
        (0..settings.clients)
            .map(|_| Arc::new(PauseSlot::default()))
            .collect(),
    );
    let start = tokio::time::Instant::now();
    let start_ns = clock.now();
    let until = start + settings.duration;
    let mut threads = Vec::new();
    for id in 0..settings.clients {
        let client = redlock(settings, &urls)?;
        let plan = settings.plan(id, until);
        let register = memory.clone();
        let redis_url = servers.register_server().map(RedisNode::url);
        let pg = servers.pg.as_ref().map(PgServer::config);
        let clock = Arc::clone(&clock);
        let pause = Arc::clone(&slots.0[id]);
        let thread = std::thread::Builder::new()
            .name(format!("chaos-client-{id}"))
            .spawn(move || -> Result<ClientRun, String> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async move {
                    let register: Arc<dyn Register> = match (register, redis_url, pg) {
                        (Some(r), _, _) => r,
                        (None, Some(url), _) => {
                            let conn = redis::Client::open(url)
                                .map_err(|e| e.to_string())?
                                .get_multiplexed_async_connection()
                                .await
                                .map_err(|e| format!("register server: {e}"))?;
                            Arc::new(RedisRegister::new(conn))
                        }
                        (None, None, Some(config)) => {
                            let (client, conn) = config
                                .connect(redlock_testkit::tokio_postgres::NoTls)
                                .await
                                .map_err(|e| format!("PostgreSQL: {e}"))?;
                            tokio::spawn(conn);
                            Arc::new(PgRegister::new(client))
                        }
                        _ => return Err("no register backend".to_owned()),
                    };
                    let ops: Arc<Mutex<Vec<Op>>> = Arc::default();
                    let sink = Arc::clone(&ops);
                    workload::client(
                        plan,
                        client,
                        register,
                        clock,
                        pause,
                        Arc::new(BlockThread),
                        Arc::new(move |op| {
                            sink.lock().unwrap_or_else(PoisonError::into_inner).push(op);
                        }),
                    )
                    .await;
                    // Everything of the client was dropped; give its background tasks (a
                    // dropped guard's release, connection drivers) time to end.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let tasks_left = tokio::runtime::Handle::current()
                        .metrics()
                        .num_alive_tasks();
                    let ops =
                        std::mem::take(&mut *ops.lock().unwrap_or_else(PoisonError::into_inner));
                    Ok(ClientRun { ops, tasks_left })
                })
            })
            .map_err(|e| format!("spawning a client thread: {e}"))?;
        threads.push(thread);
    }

    let model = settings.model();
    let schedule = schedule(settings);
    let faults = node_faults(settings, &servers);
    let applied = nemesis::run(&schedule, &model, &faults, &slots, &*clock, start).await;
    heal_everything(&servers.cluster);

    // Collect the clients; a client still running long after the end is stuck.
    let mut ops = Vec::new();
    let mut leftovers = Leftovers::default();
    let deadline = until + FINISH_GRACE;
    for thread in threads {
        while !thread.is_finished() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !thread.is_finished() {
            leftovers.stuck += 1;
            continue;
        }
        match thread.join() {
            Ok(Ok(run)) => {
                ops.extend(run.ops);
                leftovers.tasks += run.tasks_left;
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => leftovers.panics += 1,
        }
    }
    let end_ns = clock.now();
    servers
        .check_leftovers(settings, &applied, &mut leftovers)
        .await;

    let finals = final_values(settings, &servers, memory).await;
    Ok(Outcomes {
        ops,
        faults: applied,
        finals,
        leftovers,
        span: (start_ns, end_ns),
        pause_strikes: Some(slots.strikes()),
    })
}

/// The node faults of a run (with rolling snapshots when `kill-snapshot` may strike).
pub(crate) fn node_faults(settings: &Settings, servers: &Servers) -> RealFaults {
    let faults = RealFaults::new(Arc::clone(&servers.cluster));
    if settings.nemesis.contains(&Kind::KillSnapshot) {
        faults.with_rolling_snapshots(real_faults::SNAPSHOT_EVERY, real_faults::SNAPSHOT_AGE)
    } else {
        faults
    }
}

/// The schedule of a run.
pub(crate) fn schedule(settings: &Settings) -> Schedule {
    Schedule::generate(
        settings.seed,
        &settings.nemesis,
        settings.duration,
        Shape {
            nodes: settings.nodes,
            clients: settings.clients,
            ttl: settings.ttl,
            jump: settings.jump,
        },
    )
}

/// Resumes every node and clears every proxy fault (a fault that failed to heal must not leak
/// into the hygiene check).
pub(crate) fn heal_everything(cluster: &Cluster) {
    for node in cluster.nodes() {
        node.resume();
        if let Some(p) = node.proxy() {
            p.heal();
        }
    }
}

/// Once every client has stopped, steps every node's clock forward to the furthest point it
/// reached: a key set while a node's clock was ahead outlives the TTL once that clock is stepped
/// back, and the hygiene check must not wait for that. (Done while clients still hold locks,
/// the step would be a forward clock jump — outside the model.)
pub(crate) fn catch_up_clocks(cluster: &Cluster, applied: &[nemesis::Applied]) {
    let catch_up = nemesis::clock_catch_up(applied, cluster.len());
    for (node, ahead) in cluster.nodes().iter().zip(catch_up) {
        if ahead > 0
            && let Err(e) = node.jump_clock(ahead)
        {
            tracing::warn!(error = %e, "could not step a node's clock forward");
        }
    }
}

/// Reads every register after the run.
pub(crate) async fn final_values(
    settings: &Settings,
    servers: &Servers,
    memory: Option<Arc<dyn Register>>,
) -> Vec<Option<i64>> {
    let register: Option<Arc<dyn Register>> = match (memory, servers.register_server(), &servers.pg)
    {
        (Some(m), _, _) => Some(m),
        (None, Some(node), _) => match node.connection().await {
            Ok(conn) => Some(Arc::new(RedisRegister::new(conn))),
            Err(_) => None,
        },
        (None, None, Some(pg)) => match pg.connect().await {
            Ok(client) => Some(Arc::new(PgRegister::new(client))),
            Err(_) => None,
        },
        _ => None,
    };
    let mut finals = Vec::new();
    for r in 0..settings.resources {
        finals.push(match &register {
            Some(reg) => reg.value(r).await.ok(),
            None => None,
        });
    }
    finals
}
