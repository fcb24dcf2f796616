//! A short run on real servers: restarts without data under the restart quarantine. The
//! simulated nodes carry their own copy of the client's connection handling (the quarantine
//! check among it), so only a run on real servers tests the client's own.

use std::time::Duration;

use redlock_chaos::nemesis::Kind;
use redlock_chaos::options::{FenceBackend, Settings};
use redlock_chaos::{real, report};

fn settings() -> Settings {
    Settings {
        seed: 3,
        duration: Duration::from_secs(15),
        nodes: 5,
        clients: 5,
        tasks: 4,
        resources: 8,
        nemesis: vec![Kind::Kill],
        fence: FenceBackend::Memory,
        fencing: true,
        quarantine: true,
        drift_factor: redlock::DEFAULT_DRIFT_FACTOR,
        ttl: Duration::from_secs(2),
        jump: None,
        processes: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_without_data_under_the_quarantine_give_no_two_holders() {
    let s = settings();
    let out = real::run(&s).await.expect("a run on real servers");
    let summary = report::analyze("real", &s, &out);
    let kills = out.faults.iter().filter(|f| f.error.is_none()).count();
    assert!(kills > 0, "no kill was injected");
    assert!(summary.passed(), "{}", report::render(&summary));
}
