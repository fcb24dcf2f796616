//! Simulated histories: the same seed replays the same history, and the checkers catch the
//! violations that each left-out safeguard lets through.

use std::time::Duration;

use redlock_chaos::nemesis::Kind;
use redlock_chaos::options::{FenceBackend, Settings};
use redlock_chaos::sim;

fn settings(seed: u64, nemesis: &[Kind]) -> Settings {
    Settings {
        seed,
        duration: Duration::from_secs(15),
        nodes: 5,
        clients: 5,
        tasks: 1,
        resources: 3,
        nemesis: nemesis.to_vec(),
        fence: FenceBackend::Memory,
        fencing: true,
        quarantine: true,
        drift_factor: redlock::DEFAULT_DRIFT_FACTOR,
        ttl: Duration::from_secs(2),
        jump: None,
        processes: false,
    }
}

fn history_json(s: &Settings) -> String {
    let (_, outcomes) = sim::history(s).expect("a simulated history");
    serde_json::to_string(&outcomes.ops).expect("serialisable")
}

#[test]
fn a_seed_replays_its_history() {
    let mixed = redlock_chaos::options::parse_nemesis("mixed").expect("mixed");
    let a = history_json(&settings(11, &mixed));
    let b = history_json(&settings(11, &mixed));
    let c = history_json(&settings(12, &mixed));
    assert!(a.len() > 1000, "a history of {} bytes", a.len());
    assert_eq!(a, b, "the same seed gave two histories");
    assert_ne!(a, c);
}

/// A batch runs histories side by side on several threads: each must still be the history its
/// seed gives alone, or a failing seed of a batch would not replay. Links that drop and nodes
/// that stop leave attempts with a caller's token unsettled for a while, and the library kept
/// those of every history in one registry, judging their horizons by whichever history's
/// paused clock was asking: one history dropped another's early, and changed its run (16 of
/// 100 such histories on two threads differed from their replays).
#[test]
fn histories_side_by_side_are_the_histories_of_their_seeds() {
    let faults = [Kind::Drop, Kind::NodePause];
    let one = |seed: u64| {
        history_json(&Settings {
            tasks: 4,
            ..settings(seed, &faults)
        })
    };
    let seeds: Vec<u64> = (1..=40).collect();
    let side_by_side: Vec<(u64, String)> = std::thread::scope(|scope| {
        let halves: Vec<_> = seeds
            .chunks(2)
            .fold([Vec::new(), Vec::new()], |[mut a, mut b], pair| {
                a.push(pair[0]);
                b.extend(pair.get(1));
                [a, b]
            })
            .into_iter()
            .map(|half| {
                scope.spawn(move || half.into_iter().map(|s| (s, one(s))).collect::<Vec<_>>())
            })
            .collect();
        halves
            .into_iter()
            .flat_map(|h| h.join().expect("a thread of histories"))
            .collect()
    });
    let differ: Vec<u64> = side_by_side
        .iter()
        .filter(|(seed, history)| *history != one(*seed))
        .map(|(seed, _)| *seed)
        .collect();
    assert!(
        differ.is_empty(),
        "seeds whose history side by side differed from the same seed alone: {differ:?}"
    );
}

/// Runs seeds until the checker named `check` finds a violation; the seed that did.
fn caught(check: &'static str, s: Settings) -> Option<u64> {
    caught_by(&[check], s).map(|(seed, _)| seed)
}

/// Runs seeds 1 to 40 until one of the checkers named in `checks` finds a violation; the seed
/// and the checker. Each history is run once, whichever checker is asked about.
fn caught_by(checks: &[&'static str], mut s: Settings) -> Option<(u64, &'static str)> {
    (1..=40).find_map(|seed| {
        s.seed = seed;
        let (summary, _) = sim::history(&s).expect("a simulated history");
        checks
            .iter()
            .find(|&&check| {
                summary
                    .verdicts
                    .iter()
                    .any(|v| v.name == check && v.violations > 0)
            })
            .map(|&check| (seed, check))
    })
}

#[test]
fn in_model_faults_leave_every_checker_clean() {
    let mixed = redlock_chaos::options::parse_nemesis("mixed").expect("mixed");
    for seed in 1..=20 {
        let (summary, _) = sim::history(&settings(seed, &mixed)).expect("a simulated history");
        assert!(summary.passed(), "seed {seed}: {:?}", summary.failures);
    }
}

#[test]
fn negative_controls_are_caught() {
    let no_fencing = Settings {
        fencing: false,
        ..settings(0, &[Kind::Pause])
    };
    assert!(
        caught("fenced register", no_fencing).is_some(),
        "plain writes under client pauses lost no update"
    );
    let no_quarantine = Settings {
        quarantine: false,
        ..settings(0, &[Kind::Kill])
    };
    assert!(
        caught("mutual exclusion", no_quarantine).is_some(),
        "restarts without data and without quarantine never gave two holders"
    );
    let no_drift = Settings {
        drift_factor: 0.0,
        ..settings(0, &[Kind::ClockForward])
    };
    assert!(
        caught("mutual exclusion", no_drift).is_some(),
        "forward clock steps never gave two holders"
    );
    // With the safeguards on, the same faults are harmless.
    for kind in [Kind::Pause, Kind::Kill] {
        assert_eq!(
            caught_by(
                &["mutual exclusion", "fenced register"],
                settings(0, &[kind])
            ),
            None,
            "{kind}"
        );
    }
}

/// The drift allowance, not the size of the steps, is what keeps forward clock steps safe:
/// steps within it leave mutual exclusion standing, and the same steps with no allowance
/// (drift factor 0) give two holders. The steps are a third of the allowance: the schedule
/// puts at least 1 s between faults, so up to three of them can fall within one 2 s TTL.
#[test]
fn the_drift_allowance_keeps_forward_steps_safe() {
    let jump = Duration::from_millis(160);
    let within = Settings {
        drift_factor: 0.25,
        jump: Some(jump),
        ..settings(0, &[Kind::ClockForward])
    };
    assert!(within.drift_allowance() >= jump * 3);
    assert_eq!(
        caught("mutual exclusion", within.clone()),
        None,
        "steps of {jump:?} within an allowance of {:?} gave two holders",
        within.drift_allowance()
    );
    let without = Settings {
        drift_factor: 0.0,
        ..within
    };
    assert!(
        caught("mutual exclusion", without).is_some(),
        "steps of {jump:?} beyond an allowance of 2 ms never gave two holders"
    );
}

/// A large drift factor shortens what a renewal leaves below the renewal interval's lead: the
/// guards' renewals used to fall due again at once, and a simulated history with drift factor
/// 0.3 or 0.45 never ended (the renewal driver renewed as fast as the simulated nodes answered,
/// and simulated time stood still). Each history must end, and pass, within a minute.
#[test]
fn histories_with_a_large_drift_factor_end_and_pass() {
    let mixed = redlock_chaos::options::parse_nemesis("mixed").expect("mixed");
    for drift_factor in [0.3, 0.45] {
        for seed in 1..=3 {
            let s = Settings {
                drift_factor,
                ..settings(seed, &mixed)
            };
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || drop(tx.send(sim::history(&s).map(|(summary, _)| summary))));
            let summary = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| {
                    panic!("drift factor {drift_factor}, seed {seed}: no end within 60 s")
                })
                .expect("a simulated history");
            assert!(
                summary.passed(),
                "drift factor {drift_factor}, seed {seed}: {:?}",
                summary.failures
            );
        }
    }
}

/// A batch fails when any of its histories checked nothing: here 6 s histories, some of which
/// end before their first fault. Counted over the whole batch, as before, the few histories
/// with a fault let every other pass.
#[test]
fn a_batch_with_histories_that_checked_nothing_fails() {
    let short = Settings {
        duration: Duration::from_secs(6),
        ..settings(1, &[Kind::Kill, Kind::Pause])
    };
    let dir = std::env::temp_dir().join(format!("sim-vacuous-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("batch.json");
    let code = sim::main(short.clone(), 20, 2, Some(json.clone()));
    let batch: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let vacuous = batch["vacuous"].as_u64().unwrap();
    let faults = batch["faults"].as_u64().unwrap();
    assert!(
        vacuous > 0 && faults > 0,
        "premise: some of the 20 histories had a fault and some none ({vacuous} without, {faults} faults)"
    );
    assert_eq!(code, std::process::ExitCode::FAILURE);
}
