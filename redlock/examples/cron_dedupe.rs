//! A scheduled job that must run once per slot, however many hosts fire it.
//!
//! Five "hosts" (each its own client, as separate machines would be) fire the same job at the
//! same slot. Each tries to lock `cron:<job>:<slot>`; the winner runs the job and then **keeps**
//! the lock: `LockGuard::stop_renewal` stops renewing and deletes nothing, so the key lives on
//! until its TTL — the end of the slot. A host that fires late (clock skew, a slow start, a
//! retry) finds the slot still locked and skips it.
//!
//! The second half shows why the lock is kept: the same slot with the winner *releasing* after
//! its run lets the late host (and any host still trying) run the job again.
//!
//! Exits non-zero unless the kept slot ran exactly once and the released slot more than once.
//!
//! ```sh
//! REDLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//! cargo run -p redlock-quorum --example cron_dedupe
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redlock::Redlock;

/// How long one slot lasts; the lock is kept this long after it was taken. A real minutely job
/// would use 60 s (or the time to the next slot).
const SLOT: Duration = Duration::from_secs(5);
/// The job's run time.
const JOB: Duration = Duration::from_millis(200);
/// How long a host keeps trying at its start: long enough to ride out split votes, far shorter
/// than the slot.
const WAIT: Duration = Duration::from_millis(500);
/// Hosts firing together at the start of the slot.
const HOSTS: usize = 5;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn client() -> Result<Redlock, Error> {
    let nodes = std::env::var("REDLOCK_NODES").map_err(|_| "set REDLOCK_NODES")?;
    Ok(Redlock::builder()
        .nodes(nodes.split(',').map(str::trim).filter(|s| !s.is_empty()))
        .build()?)
}

/// What a host does when the schedule fires for `slot`. Returns whether it ran the job.
async fn fire(
    rl: &Redlock,
    host: usize,
    slot: &str,
    keep: bool,
    runs: &AtomicUsize,
) -> Result<bool, Error> {
    // A short wait rides out split votes (hosts that fire together can split the nodes so that
    // nobody wins the first attempt); a lock held by the winner answers Busy when it ends.
    let guard = match rl.lock(slot).ttl(SLOT).wait(WAIT).guard().await {
        Ok(guard) => guard,
        Err(e) if e.is_busy() => {
            println!("  host {host}: {slot} already taken, skipping");
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    println!("  host {host}: running the job for {slot}");
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(JOB).await;
    if keep {
        // Keep the slot: no renewal, no delete; the keys expire with the slot.
        let lock = guard.stop_renewal();
        println!(
            "  host {host}: done; the slot stays locked for another {:?}",
            lock.remaining()
        );
    } else {
        guard.release().await?;
        println!("  host {host}: done; released the lock");
    }
    Ok(true)
}

/// Fires `HOSTS` hosts together, then one late host after they are all done; returns how many
/// times the job ran.
async fn slot(name: &str, keep: bool) -> Result<usize, Error> {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut hosts = Vec::new();
    for host in 0..HOSTS {
        let rl = client()?;
        let runs = Arc::clone(&runs);
        let name = name.to_owned();
        hosts.push(tokio::spawn(async move {
            fire(&rl, host, &name, keep, &runs).await
        }));
    }
    for h in hosts {
        h.await??;
    }
    println!("  (a late host fires for the same slot)");
    fire(&client()?, HOSTS, name, keep, &runs).await?;
    Ok(runs.load(Ordering::SeqCst))
}

async fn run() -> Result<Vec<String>, Error> {
    // Slot names carry the process id, so reruns within one slot length do not collide.
    let id = std::process::id();
    let mut failures = Vec::new();

    println!("slot 1: the winner keeps the lock until the slot ends");
    let kept = slot(&format!("cron:report:{id}:slot-1"), true).await?;
    println!("=> the job ran {kept} time(s)\n");
    if kept != 1 {
        failures.push(format!(
            "kept lock: the job ran {kept} times, expected once"
        ));
    }

    println!("slot 2 (for contrast): the winner releases the lock after its run");
    let released = slot(&format!("cron:report:{id}:slot-2"), false).await?;
    println!("=> the job ran {released} time(s)\n");
    if released < 2 {
        failures.push(format!(
            "released lock: the job ran {released} time(s); the late host should have run it again"
        ));
    }
    Ok(failures)
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(failures) if failures.is_empty() => {
            println!("ok: once per slot with the lock kept; more than once when it was released");
            ExitCode::SUCCESS
        }
        Ok(failures) => {
            for f in failures {
                eprintln!("FAILED: {f}");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
