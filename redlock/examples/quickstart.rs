//! The README's 60-second tour: one client, one lock, work done while holding it.
//!
//! ```sh
//! export REDLOCK_NODES="$(bash cluster-setup/up.sh 3 7001 | paste -sd, -)"
//! cargo run -p redlock-quorum --example quickstart
//! bash cluster-setup/down.sh
//! ```
//!
//! Exits non-zero unless the work ran under the lock, a second taker was refused meanwhile, and
//! the lock was free again afterwards.

use std::time::Duration;

use redlock::{Error, Redlock};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = std::env::var("REDLOCK_NODES").map_err(|_| "set REDLOCK_NODES=url,url,url")?;

    // One client per process, shared (it is cheap to clone). `build` checks the settings and
    // connects lazily.
    let rl = Redlock::builder()
        .nodes(nodes.split(','))
        .ttl(Duration::from_secs(10))
        .build()?;

    // `with_lock` takes the lock (retrying per the client's policy), renews it while the work
    // runs, and releases it on every exit path. If the lock is lost meanwhile, the work is
    // cancelled and the call returns `Error::LeaseLost`.
    let report = rl
        .with_lock("reports:daily", |lease| {
            let rl = rl.clone();
            async move {
                // The fence token goes with every write to the protected resource, which
                // rejects a stale holder (see docs/fencing.md).
                let fence = lease.fence_settled().await.map(|t| t.to_string());
                // Meanwhile nobody else gets the lock.
                let rival = rl.try_acquire("reports:daily").await;
                (fence, matches!(rival, Err(Error::Busy { .. })))
            }
        })
        .await?;
    let (fence, rival_refused) = report;
    println!("work ran under the lock; fence token {fence:?}");
    println!("a second taker meanwhile was refused: {rival_refused}");

    // Released: the next taker gets it at once.
    let lock = rl.try_acquire("reports:daily").await?;
    println!(
        "taken again after the release, valid for {:?}",
        lock.remaining()
    );
    rl.release(lock).await?;

    if fence.is_none() || !rival_refused {
        return Err("the lock did not behave as described".into());
    }
    Ok(())
}
