//! The `redlock-chaos` command: see `redlock-chaos --help` and `docs/guarantees.md`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::{Parser, Subcommand};
use redlock_chaos::options::{FenceBackend, Settings, parse_duration, parse_nemesis};
use redlock_chaos::report::{self, Outcomes, Summary};
use redlock_chaos::{procs, real, sim};

/// A Jepsen-style checker for the Redlock client: clients contend for resources and
/// read-modify-write a fenced register per resource while faults are injected, then checkers
/// go over the history. Exits 0 when every checker the run's faults claim passed (and, for a
/// negative control, when the violation it must provoke was found), 1 when not, 2 on a usage
/// or setup error.
#[derive(Debug, Parser)]
#[command(name = "redlock-chaos", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Many short seeded histories against simulated nodes on a paused clock.
    Sim(SimArgs),
    /// One client of a `--processes` run (started by the parent).
    #[command(hide = true)]
    Worker {
        /// The worker's settings as JSON.
        args: String,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Length of the workload (60s, 2m, 500ms).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Seed of the fault schedule and the clients' choices.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Lock nodes (redis-server processes started by the run).
    #[arg(long, default_value_t = 5)]
    nodes: usize,
    /// Clients, each its own `Redlock`.
    #[arg(long, default_value_t = 5)]
    clients: usize,
    /// Concurrent holders (tasks) per client.
    #[arg(long, default_value_t = 4)]
    tasks: u32,
    /// Resources the clients contend for.
    #[arg(long, default_value_t = 8)]
    resources: u32,
    /// Faults: `mixed` (every kind inside the model, drawn every 1–5 s), `all`, `none`, or a
    /// list such as `kill,pause,clock-forward`.
    #[arg(long, default_value = "mixed", value_parser = parse_nemesis)]
    nemesis: std::vec::Vec<redlock_chaos::nemesis::Kind>,
    /// Where the registers live: memory, redis (a separate redis-server) or pg (PostgreSQL).
    #[arg(long, default_value = "memory", value_parser = parse_fence)]
    fence: FenceBackend,
    /// Negative control: plain writes, no fence. The run passes only if lost updates are found.
    #[arg(long)]
    no_fencing: bool,
    /// Negative control: no restart quarantine. The run passes only if two holders are found.
    #[arg(long)]
    no_quarantine: bool,
    /// The client's drift factor; 0 is a negative control (two holders must be found).
    #[arg(long, default_value_t = redlock::DEFAULT_DRIFT_FACTOR)]
    drift_factor: f64,
    /// The lock's TTL.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    ttl: Duration,
    /// Size of forward clock steps (default: 30–60 % of the TTL, drawn per step).
    #[arg(long, value_parser = parse_duration)]
    jump: Option<Duration>,
    /// Each client in its own OS process (pauses are real SIGSTOPs); needs --fence redis or pg.
    #[arg(long)]
    processes: bool,
    /// Write the summary, the faults and the whole history as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct SimArgs {
    /// Number of seeded histories.
    #[arg(long, default_value_t = 10_000)]
    seeds: u64,
    /// First seed; history i uses seed + i. Replay a failing seed with `--seeds 1 --seed S`.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Simulated length of each history.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    duration: Duration,
    /// Faults, as for a real run.
    #[arg(long, default_value = "mixed", value_parser = parse_nemesis)]
    nemesis: std::vec::Vec<redlock_chaos::nemesis::Kind>,
    /// Lock nodes.
    #[arg(long, default_value_t = 5)]
    nodes: usize,
    /// Clients.
    #[arg(long, default_value_t = 5)]
    clients: usize,
    /// Concurrent holders (tasks) per client.
    #[arg(long, default_value_t = 1)]
    tasks: u32,
    /// Resources.
    #[arg(long, default_value_t = 3)]
    resources: u32,
    /// Negative control: plain writes.
    #[arg(long)]
    no_fencing: bool,
    /// Negative control: no restart quarantine.
    #[arg(long)]
    no_quarantine: bool,
    /// The client's drift factor.
    #[arg(long, default_value_t = redlock::DEFAULT_DRIFT_FACTOR)]
    drift_factor: f64,
    /// The lock's TTL.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    ttl: Duration,
    /// Size of forward clock steps (default: 30–60 % of the TTL, drawn per step).
    #[arg(long, value_parser = parse_duration)]
    jump: Option<Duration>,
    /// Threads running histories.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Write the summary of every failing (or, for a control, every clean) seed as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn parse_fence(s: &str) -> Result<FenceBackend, String> {
    FenceBackend::parse(s).ok_or_else(|| format!("unknown fence `{s}`: memory, redis or pg"))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        real::PANICS.fetch_add(1, Ordering::Relaxed);
        previous(info);
    }));
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Worker { args }) => worker(&args),
        Some(Command::Sim(args)) => {
            sim::main(sim_settings(&args), args.seeds, args.threads, args.json)
        }
        None => run(cli.run),
    }
}

fn sim_settings(a: &SimArgs) -> Settings {
    Settings {
        seed: a.seed,
        duration: a.duration,
        nodes: a.nodes,
        clients: a.clients,
        tasks: a.tasks,
        resources: a.resources,
        nemesis: a.nemesis.clone(),
        fence: FenceBackend::Memory,
        fencing: !a.no_fencing,
        quarantine: !a.no_quarantine,
        drift_factor: a.drift_factor,
        ttl: a.ttl,
        jump: a.jump,
        processes: false,
    }
}

fn worker(args: &str) -> ExitCode {
    let args: procs::WorkerArgs = match serde_json::from_str(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("redlock-chaos worker: bad arguments: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("redlock-chaos worker: {e}");
            return ExitCode::from(2);
        }
    };
    let result = rt.block_on(procs::worker(args));
    // The stdin reader sits in a blocking read; do not wait for it.
    rt.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redlock-chaos worker: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(a: RunArgs) -> ExitCode {
    let settings = Settings {
        seed: a.seed,
        duration: a.duration,
        nodes: a.nodes,
        clients: a.clients,
        tasks: a.tasks,
        resources: a.resources,
        nemesis: a.nemesis,
        fence: a.fence,
        fencing: !a.no_fencing,
        quarantine: !a.no_quarantine,
        drift_factor: a.drift_factor,
        ttl: a.ttl,
        jump: a.jump,
        processes: a.processes,
    };
    if let Err(e) = validate(&settings) {
        eprintln!("redlock-chaos: {e}");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("redlock-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let run = async {
        if settings.processes {
            procs::run(&settings).await
        } else {
            real::run(&settings).await
        }
    };
    let outcomes = match rt.block_on(run) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("redlock-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let summary = report::analyze("real", &settings, &outcomes);
    print!("{}", report::render(&summary));
    if let Some(path) = a.json
        && let Err(e) = write_json(&path, &summary, &outcomes)
    {
        eprintln!("redlock-chaos: writing {}: {e}", path.display());
        return ExitCode::from(2);
    }
    if summary.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Rejects settings that cannot make a meaningful run.
fn validate(s: &Settings) -> Result<(), String> {
    if s.nodes == 0 || s.nodes > 15 {
        return Err(format!("--nodes {} must be 1 to 15", s.nodes));
    }
    if s.clients == 0 || s.clients > 64 {
        return Err(format!("--clients {} must be 1 to 64", s.clients));
    }
    if s.tasks == 0 || s.tasks > 64 {
        return Err(format!("--tasks {} must be 1 to 64", s.tasks));
    }
    if s.resources == 0 || s.resources > 1024 {
        return Err(format!("--resources {} must be 1 to 1024", s.resources));
    }
    if s.ttl < Duration::from_millis(200) {
        return Err(format!("--ttl {:?} is too short (at least 200ms)", s.ttl));
    }
    if !(0.0..0.5).contains(&s.drift_factor) {
        return Err(format!(
            "--drift-factor {} must be in [0, 0.5)",
            s.drift_factor
        ));
    }
    if s.duration < Duration::from_secs(1) {
        return Err("--duration must be at least 1s".to_owned());
    }
    Ok(())
}

fn write_json(path: &PathBuf, summary: &Summary, out: &Outcomes) -> std::io::Result<()> {
    let doc = serde_json::json!({
        "summary": summary,
        "faults": out.faults,
        "history": out.ops,
    });
    std::fs::write(path, serde_json::to_vec(&doc)?)
}
