//! A checkpointed job under a lock, with its writes fenced in PostgreSQL.
//!
//! Worker A (a child process) takes the job's lock and works through its steps, committing each
//! step's output and the checkpoint in one transaction that first admits the lock's fence token
//! (`PgFence`). Mid-step, this process freezes A with `SIGSTOP` — what a GC pause, a VM
//! migration or a swap storm does to a holder. A stops renewing; once its keys expire, worker B
//! (here, in this process) gets the lock, resumes from A's checkpoint and finishes the job.
//! Then A is woken with `SIGCONT`: it finishes the step it was on and tries to commit it, and
//! the fence rejects the write, because B's grant is newer. The run prints how long the job was
//! without a holder (the recovery time) and exits non-zero unless B resumed at the checkpoint,
//! A's late write was rejected and every step was committed exactly once.
//!
//! ```sh
//! REDLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//! REDLOCK_PG_URL=postgres://user:password@127.0.0.1:5432/postgres \
//! cargo run -p redlock-quorum --example job_runner
//! ```
//!
//! (`bash cluster-setup/up.sh 3 7001` starts such nodes.)

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fencing::PgFence;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redlock::Redlock;
use tokio_postgres::NoTls;

/// Steps of the job; each commits its output and advances the checkpoint.
const STEPS: i32 = 8;
/// The step during which worker A is frozen.
const FREEZE_AT: i32 = 3;
/// The job's lock TTL: a frozen holder's keys expire at most this long after its last renewal.
const TTL: Duration = Duration::from_secs(2);
/// The work of one step (before its commit).
const STEP_WORK: Duration = Duration::from_millis(200);
/// Exit code of a worker whose write the fence rejected.
const REJECTED: i32 = 3;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn env(name: &str) -> Result<String, Error> {
    std::env::var(name).map_err(|_| format!("set {name} (see the example's header)").into())
}

fn client() -> Result<Redlock, Error> {
    let nodes = env("REDLOCK_NODES")?;
    Ok(Redlock::builder()
        .nodes(nodes.split(',').map(str::trim).filter(|s| !s.is_empty()))
        .ttl(TTL)
        .build()?)
}

async fn postgres() -> Result<tokio_postgres::Client, Error> {
    let (client, connection) = tokio_postgres::connect(&env("REDLOCK_PG_URL")?, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// How one worker's run ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Every step is committed.
    Finished,
    /// The fence refused a write: a newer holder exists; this worker stops without writing.
    Rejected { step: i32 },
}

/// Takes the job's lock (waiting up to 30 s for another holder) and runs the steps from the
/// checkpoint on. `on_locked` is told the lock was taken, `on_step` when a step's work starts.
async fn run_worker(
    rl: &Redlock,
    pg: &mut tokio_postgres::Client,
    job: &str,
    name: &str,
    on_locked: impl FnOnce(),
    mut on_step: impl FnMut(i32),
) -> Result<Outcome, Error> {
    let fence = PgFence::new();
    let guard = rl
        .lock(job)
        .ttl(TTL)
        .wait(Duration::from_secs(30))
        .guard()
        .await?;
    on_locked();
    let lease = guard.lease();
    let token = lease
        .fence_settled()
        .await
        .ok_or("claim stamps are on by default")?;
    loop {
        // A careful worker checks its lease before each step…
        if lease.is_lost() {
            return Err(format!("{name}: lease lost: {:?}", lease.reason()).into());
        }
        let row = pg
            .query_one(
                "SELECT next_step FROM job_checkpoint WHERE job = $1",
                &[&job],
            )
            .await?;
        let step: i32 = row.get(0);
        if step >= STEPS {
            break;
        }
        on_step(step);
        // …but nothing stops it from pausing between that check and its write.
        tokio::time::sleep(STEP_WORK).await;

        // The write: admit the token, check the checkpoint, write the output, advance — one
        // transaction. A stale token is refused before anything is written.
        let tx = pg.transaction().await?;
        match fence.admit(&tx, job, &token).await {
            Ok(_) => {}
            Err(e) if e.is_rejection() => {
                println!("{name}: step {step} REJECTED by the fence: {e}");
                // Rolls back; the lock is someone else's, so nothing is released either.
                drop(tx);
                drop(guard.stop_renewal());
                return Ok(Outcome::Rejected { step });
            }
            Err(e) => return Err(e.into()),
        }
        let advanced = tx
            .execute(
                "UPDATE job_checkpoint SET next_step = next_step + 1 WHERE job = $1 AND next_step = $2",
                &[&job, &step],
            )
            .await?;
        if advanced != 1 {
            return Err(format!("{name}: checkpoint moved under an admitted token").into());
        }
        tx.execute(
            "INSERT INTO job_output (job, step, worker) VALUES ($1, $2, $3)",
            &[&job, &step, &name],
        )
        .await?;
        tx.commit().await?;
        println!("{name}: step {step} committed");
    }
    guard.release().await?;
    Ok(Outcome::Finished)
}

/// Worker A, in its own process: prints each step it starts (its parent reads them) and exits
/// with [`REJECTED`] when the fence refuses its write.
async fn worker_process(job: &str) -> Result<ExitCode, Error> {
    let rl = client()?;
    let mut pg = postgres().await?;
    let outcome = run_worker(
        &rl,
        &mut pg,
        job,
        "A",
        || println!("A: holds the lock"),
        |step| println!("A: working on step {step}"),
    )
    .await?;
    Ok(match outcome {
        Outcome::Finished => ExitCode::SUCCESS,
        Outcome::Rejected { .. } => ExitCode::from(REJECTED as u8),
    })
}

/// Kills the child if the run ends early, so no frozen process is left behind.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Reaper {
    fn signal(&self, signal: Signal) -> Result<(), Error> {
        let pid = Pid::from_raw(i32::try_from(self.0.id())?);
        kill(pid, signal)?;
        Ok(())
    }

    /// Waits (bounded) for the child to exit.
    fn wait(&mut self, limit: Duration) -> Result<i32, Error> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait()? {
                return Ok(status.code().unwrap_or(-1));
            }
            if Instant::now() > deadline {
                return Err("worker A did not exit in time".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

async fn supervisor() -> Result<Vec<String>, Error> {
    let rl = client()?;
    for report in rl.connect().await {
        if report.outcome != redlock::NodeOutcome::Confirmed {
            return Err(format!("node {}: {}", report.node, report.outcome).into());
        }
    }
    let mut pg = postgres().await?;
    PgFence::new().create_schema(&pg).await?;
    pg.batch_execute(
        "CREATE TABLE IF NOT EXISTS job_checkpoint (job text PRIMARY KEY, next_step int NOT NULL);
         CREATE TABLE IF NOT EXISTS job_output (job text, step int, worker text NOT NULL,
                                                PRIMARY KEY (job, step));",
    )
    .await?;
    // A job name of its own per run, so runs never see each other's rows.
    let job = format!("job:report:{}", std::process::id());
    pg.execute(
        "INSERT INTO job_checkpoint (job, next_step) VALUES ($1, 0)",
        &[&job],
    )
    .await?;

    // Worker A: this same program, in worker mode. Its lines come through a thread.
    let child = Command::new(std::env::current_exe()?)
        .args(["worker", &job])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut a = Reaper(child);
    let stdout = a.0.stdout.take().ok_or("no stdout")?;
    let (lines_tx, lines) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("   [{line}]");
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let frozen_at = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| "worker A did not reach the step to freeze at")?;
        if line == format!("A: working on step {FREEZE_AT}") {
            a.signal(Signal::SIGSTOP)?;
            break Instant::now();
        }
    };
    println!("froze worker A (SIGSTOP) during step {FREEZE_AT}");

    // Worker B: waits for the lock; A's keys expire within a TTL of its last renewal.
    let mut acquired_after = None;
    let mut first_step = None;
    let b = run_worker(
        &rl,
        &mut pg,
        &job,
        "B",
        || {
            let after = frozen_at.elapsed();
            println!("B: holds the lock {after:?} after A froze");
            acquired_after = Some(after);
        },
        |step| {
            if first_step.is_none() {
                println!("B: resumes at checkpoint {step}");
                first_step = Some(step);
            }
        },
    )
    .await?;

    println!("waking worker A (SIGCONT)");
    a.signal(Signal::SIGCONT)?;
    let code = a.wait(Duration::from_secs(20))?;
    let a_lines: Vec<String> = lines.try_iter().collect();

    // What the database says.
    let rows = pg
        .query(
            "SELECT step, worker FROM job_output WHERE job = $1 ORDER BY step",
            &[&job],
        )
        .await?;
    let written: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let expected: Vec<(i32, String)> = (0..STEPS)
        .map(|s| (s, if s < FREEZE_AT { "A" } else { "B" }.to_owned()))
        .collect();

    let mut failures = Vec::new();
    if b != Outcome::Finished {
        failures.push(format!("worker B did not finish: {b:?}"));
    }
    if first_step != Some(FREEZE_AT) {
        failures.push(format!(
            "worker B resumed at {first_step:?}, not at A's checkpoint {FREEZE_AT}"
        ));
    }
    if code != REJECTED || !a_lines.iter().any(|l| l.contains("REJECTED")) {
        failures.push(format!(
            "worker A's late write was not rejected (exit code {code}, output {a_lines:?})"
        ));
    }
    if written != expected {
        failures.push(format!("steps written {written:?}, expected {expected:?}"));
    }
    if let Some(after) = acquired_after {
        println!(
            "recovery: the job had no holder for {} ms (TTL {} ms, renewed every {} ms)",
            after.as_millis(),
            TTL.as_millis(),
            (TTL / 3).as_millis()
        );
    }
    Ok(failures)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("worker") => match args.get(2) {
            Some(job) => worker_process(job).await,
            None => Err("usage: job_runner worker <job>".into()),
        },
        _ => supervisor().await.map(|failures| {
            for f in &failures {
                eprintln!("FAILED: {f}");
            }
            if failures.is_empty() {
                println!(
                    "ok: B resumed at the checkpoint, A's stale write was rejected, every step committed once"
                );
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }),
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        ExitCode::FAILURE
    })
}
