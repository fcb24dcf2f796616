//! Single-flight cache rebuild: when an expensive cache entry is missing, one host rebuilds it
//! under a lock and every other host waits for that rebuild — `Redlock::wait_released` — and
//! then reads the fresh entry, instead of all of them rebuilding at once (a cache stampede) or
//! queueing to take the lock one after another.
//!
//! Eight "hosts" (each its own client, as separate machines would be) ask for the same entry at
//! once. The cache itself stands in for a shared one (Redis, memcached) as a map in this process.
//! Exits non-zero unless the entry was built exactly once, every host got the fresh value, and
//! the hosts that did not build it waited with `wait_released`.
//!
//! ```sh
//! REDLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//! cargo run -p redlock-quorum --example cache_rebuild
//! ```

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock::Redlock;
use tokio::sync::RwLock;

/// Hosts asking for the entry together.
const HOSTS: usize = 8;
/// What the rebuild costs.
const BUILD: Duration = Duration::from_millis(500);
/// The longest a host waits for someone else's rebuild before it gives up.
const WAIT: Duration = Duration::from_secs(10);
/// Rounds of "try to become the builder, else wait" before a host gives up.
const ROUNDS: usize = 20;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Cache = Arc<RwLock<HashMap<String, String>>>;

fn client() -> Result<Redlock, Error> {
    let nodes = std::env::var("REDLOCK_NODES").map_err(|_| "set REDLOCK_NODES")?;
    Ok(Redlock::builder()
        .nodes(nodes.split(',').map(str::trim).filter(|s| !s.is_empty()))
        .ttl(Duration::from_secs(5))
        .build()?)
}

#[derive(Default)]
struct Counts {
    builds: AtomicUsize,
    waits: AtomicUsize,
}

/// Reads `key`, rebuilding it under the lock `rebuild:<key>` if it is missing. Returns the
/// value and whether this host built it.
async fn get(
    rl: &Redlock,
    cache: &Cache,
    key: &str,
    host: usize,
    counts: &Counts,
    started: Instant,
) -> Result<(String, bool), Error> {
    let lock_name = format!("rebuild:{key}");
    for _ in 0..ROUNDS {
        if let Some(v) = cache.read().await.get(key) {
            return Ok((v.clone(), false));
        }
        // One attempt to become the builder (no waiting in the lock's queue: waiting for the
        // lock would only make every host build in turn).
        match rl.lock(&lock_name).wait(Duration::ZERO).guard().await {
            Ok(guard) => {
                // Someone may have finished a rebuild between our read and our lock.
                if let Some(v) = cache.read().await.get(key) {
                    guard.release().await?;
                    return Ok((v.clone(), false));
                }
                println!("  host {host}: building {key}");
                counts.builds.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(BUILD).await; // the expensive part
                let value = format!("report built by host {host}");
                cache.write().await.insert(key.to_owned(), value.clone());
                guard.release().await?; // wakes the waiters at once
                println!("  host {host}: built at {:?}", started.elapsed());
                return Ok((value, true));
            }
            // Busy: a builder holds it. QuorumUnreachable: hosts split the nodes' votes and
            // nobody holds it — `wait_released` then returns at once and we try again.
            Err(e) if e.is_busy() || e.is_quorum_unreachable() => {
                counts.waits.fetch_add(1, Ordering::SeqCst);
                rl.wait_released(&lock_name, WAIT).await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(format!("host {host}: no value after {ROUNDS} rounds").into())
}

async fn run() -> Result<Vec<String>, Error> {
    let cache: Cache = Arc::default();
    let counts = Arc::new(Counts::default());
    let key = format!("report:{}", std::process::id());
    let started = Instant::now();
    let mut hosts = Vec::new();
    for host in 0..HOSTS {
        let rl = client()?;
        rl.connect().await;
        let (cache, counts, key) = (Arc::clone(&cache), Arc::clone(&counts), key.clone());
        hosts.push(tokio::spawn(async move {
            let got = get(&rl, &cache, &key, host, &counts, started).await;
            if let Ok((_, false)) = &got {
                println!(
                    "  host {host}: read the fresh entry at {:?}",
                    started.elapsed()
                );
            }
            got
        }));
    }
    let mut values = Vec::new();
    for h in hosts {
        values.push(h.await??);
    }

    let builds = counts.builds.load(Ordering::SeqCst);
    let waits = counts.waits.load(Ordering::SeqCst);
    println!("=> {builds} build(s) for {HOSTS} hosts; {waits} wait(s) for a release");
    let mut failures = Vec::new();
    if builds != 1 {
        failures.push(format!("the entry was built {builds} times, expected once"));
    }
    let fresh = cache.read().await.get(&key).cloned();
    if values.iter().any(|(v, _)| Some(v) != fresh.as_ref()) {
        failures.push(format!("hosts saw different values: {values:?}"));
    }
    let readers = values.iter().filter(|(_, built)| !built).count();
    if readers > 0 && waits == 0 {
        failures.push("no host waited for the rebuild with wait_released".to_owned());
    }
    Ok(failures)
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(failures) if failures.is_empty() => {
            println!("ok: one rebuild; the other hosts waited for it and read its result");
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
