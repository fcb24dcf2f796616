//! Faults: their kinds, which guarantees each one is inside the model of, a seeded schedule,
//! and the loop that injects and heals them.
//!
//! The same schedule drives real servers (`real_faults`) and simulated nodes (`sim`): both
//! implement [`Faults`]. Client pauses are not node faults; the workload carries them out
//! ([`Pauser`]).

use std::fmt;
use std::time::Duration;

use futures_util::future::BoxFuture;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::history::Clock;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `SIGSTOP` of some nodes, `SIGCONT` at heal.
    NodePause,
    /// `kill -9` of some nodes, restarted without data at heal.
    Kill,
    /// `kill -9` of some nodes, restarted at heal from an AOF fsynced on every write.
    KillAof,
    /// `kill -9` of some nodes, restarted at heal from an RDB snapshot taken seconds earlier.
    KillSnapshot,
    /// Client↔node delay with jitter.
    Delay,
    /// Client↔node traffic dropped (connections stay open, nothing gets through).
    Drop,
    /// Client↔node connections reset and refused.
    Partition,
    /// One client stops (its process or runtime) between reading and writing the register,
    /// for longer than the lock's TTL.
    Pause,
    /// The realtime clock of a majority of nodes steps forward.
    ClockForward,
    /// The realtime clock of some nodes steps back.
    ClockBack,
    /// `SCRIPT FLUSH` on some nodes.
    ScriptFlush,
    /// `CLIENT KILL` of every client connection of some nodes.
    ClientKill,
    /// `DEBUG SLEEP` on some nodes: hung, but still accepting connections.
    DebugSleep,
    /// Connection churn: `CLIENT KILL` on some nodes every 100 ms for the fault's duration.
    Churn,
}

impl Kind {
    /// Every kind, in a fixed order.
    pub const ALL: [Kind; 14] = [
        Kind::NodePause,
        Kind::Kill,
        Kind::KillAof,
        Kind::KillSnapshot,
        Kind::Delay,
        Kind::Drop,
        Kind::Partition,
        Kind::Pause,
        Kind::ClockForward,
        Kind::ClockBack,
        Kind::ScriptFlush,
        Kind::ClientKill,
        Kind::DebugSleep,
        Kind::Churn,
    ];

    /// The name used on the command line and in the output.
    pub fn name(self) -> &'static str {
        match self {
            Kind::NodePause => "node-pause",
            Kind::Kill => "kill",
            Kind::KillAof => "kill-aof",
            Kind::KillSnapshot => "kill-snapshot",
            Kind::Delay => "delay",
            Kind::Drop => "drop",
            Kind::Partition => "partition",
            Kind::Pause => "pause",
            Kind::ClockForward => "clock-forward",
            Kind::ClockBack => "clock-back",
            Kind::ScriptFlush => "script-flush",
            Kind::ClientKill => "client-kill",
            Kind::DebugSleep => "debug-sleep",
            Kind::Churn => "churn",
        }
    }

    /// Parses a name as printed by [`name`](Self::name).
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the fault acts on nodes (else on a client).
    pub fn on_nodes(self) -> bool {
        self != Kind::Pause
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the run's configuration promises; decides which faults are inside the model.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Model {
    /// Writes go through the fence.
    pub fencing: bool,
    /// A restarted node grants nothing until it has been up for the quarantine (≥ TTL).
    pub quarantine: bool,
    /// The lock's TTL.
    pub ttl: Duration,
    /// The client's drift allowance (TTL × drift factor + 2 ms).
    pub drift_allowance: Duration,
    /// How long a restarted node sits out (zero without the quarantine).
    pub quarantine_time: Duration,
    /// Whether `kill-snapshot` brings back the snapshot's stamp key, older than the node's last
    /// stamp (real servers); the simulated nodes keep the current one.
    pub snapshot_stamps: bool,
}

/// Which checkers' guarantees a fault leaves standing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct InModel {
    /// Mutual exclusion of claimed validity windows.
    pub mutex: bool,
    /// Fenced register: no stale write admitted, no lost update.
    pub fenced: bool,
}

/// One scheduled fault.
#[derive(Clone, Debug, Serialize)]
pub struct Fault {
    /// Position in the schedule.
    pub id: usize,
    /// What it does.
    pub kind: Kind,
    /// When it is injected, from the start of the run.
    pub at: Duration,
    /// How long it lasts before it is healed (for a pause: how long the client stops).
    pub lasts: Duration,
    /// The nodes it acts on (empty for a client pause).
    pub nodes: Vec<usize>,
    /// The client it acts on (client pauses only).
    pub client: Option<usize>,
    /// Delay, clock step or sleep length, as the kind needs.
    pub amount: Duration,
    /// Jitter of a delay.
    pub jitter: Duration,
}

impl Fault {
    /// Which guarantees hold under this fault with `model`, between the faults `before` and
    /// `after` it in its schedule.
    pub fn in_model(&self, model: &Model, before: &[Fault], after: &[Fault]) -> InModel {
        let mutex = match self.kind {
            // A restart that loses keys hands out held locks again unless quarantined.
            Kind::Kill | Kind::KillSnapshot => model.quarantine,
            // Keys expire early on the stepped nodes: safe only within the drift allowance.
            Kind::ClockForward => self.amount <= model.drift_allowance,
            _ => true,
        };
        InModel {
            mutex,
            // Fencing needs per-node stamps that never go back. A node that lost its data comes
            // back under a new identity, one that kept it counts on from its last stamp; one
            // brought back from a snapshot counts on from the snapshot's, which is older, so
            // only a clock past every stamp it issued keeps its stamps going up.
            fenced: model.fencing && !self.stamps_may_go_back(model, before, after),
        }
    }

    /// Whether a node this restart from a snapshot brings back may issue a stamp below one it
    /// issued before the kill: its first stamp after it follows its clock (the snapshot's stamp
    /// key is older than its last stamp), and clock steps — those of `before`, and those of
    /// `after` that may come before that first stamp — may leave that clock, from the end of
    /// its quarantine on, behind the furthest reading it had reached, which its stamps never
    /// ran ahead of (test `a_restart_from_a_snapshot_behind_a_clock_stepped_back_reissues_
    /// stamps`). Erring on the side of "may": the furthest reading counts every step as made,
    /// the readings after it only the steps back (a step forward may have failed), a later step
    /// back counts until a second after the node was back and reachable, and a second of slack
    /// covers faults that start late (a fault starts when the one before it ended, which a
    /// slow restart delays).
    fn stamps_may_go_back(&self, model: &Model, before: &[Fault], after: &[Fault]) -> bool {
        const SLACK: i128 = 1_000_000_000;
        if self.kind != Kind::KillSnapshot || !model.snapshot_stamps {
            return false;
        }
        let ns = |d: Duration| d.as_nanos() as i128;
        self.nodes.iter().any(|n| {
            // Schedule time + offset is the node's clock; furthest just before each step and at
            // the kill.
            let (mut offset, mut back, mut furthest) = (0i128, 0i128, 0i128);
            for f in before.iter().filter(|f| f.nodes.contains(n)) {
                let step = match f.kind {
                    Kind::ClockForward => ns(f.amount),
                    Kind::ClockBack => -ns(f.amount),
                    _ => continue,
                };
                furthest = furthest.max(ns(f.at) + offset);
                offset += step;
                back += step.min(0);
            }
            furthest = furthest.max(ns(self.at) + offset);
            // Lowest from the end of the quarantine on, until the node surely granted (every
            // grant of a stamped acquire takes a stamp, quorum or not, and clients ask all the
            // time): a second after it was back and reachable. A later fault that keeps it from
            // granting (down, stopped, cut off, slowed) moves that past its own end; a step
            // back before then lowers the clock.
            let granting = ns(self.at + self.lasts + model.quarantine_time);
            let (mut lowest, mut until) = (granting + back, granting + SLACK);
            for f in after.iter().filter(|f| f.nodes.contains(n)) {
                let at = ns(f.at);
                if at >= until {
                    break;
                }
                match f.kind {
                    Kind::ClockBack => {
                        back -= ns(f.amount);
                        lowest = lowest.min(at.max(granting) + back);
                    }
                    Kind::ClockForward | Kind::ScriptFlush => {}
                    Kind::Kill | Kind::KillAof | Kind::KillSnapshot => {
                        until = until.max(ns(f.at + f.lasts + model.quarantine_time) + SLACK);
                    }
                    _ => until = until.max(ns(f.at + f.lasts) + SLACK),
                }
            }
            lowest < furthest + SLACK
        })
    }

    /// A short description for the summary: kind, targets and amount.
    pub fn describe(&self) -> String {
        let mut s = format!("{}", self.kind);
        if let Some(c) = self.client {
            s.push_str(&format!(" client {c}"));
        }
        if !self.nodes.is_empty() {
            let nodes: Vec<String> = self.nodes.iter().map(usize::to_string).collect();
            s.push_str(&format!(" nodes [{}]", nodes.join(",")));
        }
        if !self.amount.is_zero() {
            s.push_str(&format!(" by {:?}", self.amount));
        }
        s.push_str(&format!(" for {:?}", self.lasts));
        s
    }
}

/// The shape of the cluster and workload a schedule is drawn for.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Number of lock nodes.
    pub nodes: usize,
    /// Number of clients.
    pub clients: usize,
    /// The lock's TTL (pauses and downtimes are sized from it).
    pub ttl: Duration,
    /// Size of a forward clock step; `None` draws 30–60 % of the TTL.
    pub jump: Option<Duration>,
}

/// A seeded list of faults, one after another, 1–5 s apart.
#[derive(Clone, Debug, Serialize)]
pub struct Schedule {
    /// The faults in injection order; none overlaps the next.
    pub faults: Vec<Fault>,
}

impl Schedule {
    /// Draws faults of `kinds` (uniformly) for a run of `length` from `seed`: first after 1–5 s,
    /// each healed before the next is injected 1–5 s later, the last healed before the end.
    pub fn generate(seed: u64, kinds: &[Kind], length: Duration, shape: Shape) -> Schedule {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6e65_6d65_7369_7321);
        let mut faults = Vec::new();
        let mut t = Duration::ZERO;
        if kinds.is_empty() || shape.nodes == 0 {
            return Schedule { faults };
        }
        let quorum = shape.nodes / 2 + 1;
        let ms =
            |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..=hi));
        let ttl_ms = shape.ttl.as_millis() as u64;
        loop {
            t += ms(&mut rng, 1000, 5000);
            let kind = kinds[rng.random_range(0..kinds.len())];
            let some = |rng: &mut StdRng, max: usize| {
                let count = rng.random_range(1..=max.max(1));
                let mut all: Vec<usize> = (0..shape.nodes).collect();
                for i in 0..count {
                    let j = rng.random_range(i..all.len());
                    all.swap(i, j);
                }
                let mut pick = all[..count].to_vec();
                pick.sort_unstable();
                pick
            };
            let mut fault = Fault {
                id: faults.len(),
                kind,
                at: t,
                lasts: ms(&mut rng, 1000, 4000),
                nodes: Vec::new(),
                client: None,
                amount: Duration::ZERO,
                jitter: Duration::ZERO,
            };
            match kind {
                Kind::Pause => {
                    fault.client = Some(rng.random_range(0..shape.clients.max(1)));
                    fault.lasts = ms(&mut rng, ttl_ms * 3 / 2, ttl_ms * 3);
                }
                Kind::Kill | Kind::KillAof | Kind::KillSnapshot => {
                    // Up to a majority, so that a lost key can matter.
                    fault.nodes = some(&mut rng, quorum);
                    fault.lasts = ms(&mut rng, 100, 1500);
                }
                Kind::ClockForward => {
                    // A majority: a minority stepping forward cannot hand out a held lock.
                    fault.nodes = some(&mut rng, quorum);
                    while fault.nodes.len() < quorum {
                        fault.nodes = some(&mut rng, quorum);
                    }
                    fault.amount = shape
                        .jump
                        .unwrap_or_else(|| ms(&mut rng, ttl_ms * 3 / 10, ttl_ms * 6 / 10));
                    fault.lasts = Duration::ZERO;
                }
                Kind::ClockBack => {
                    fault.nodes = some(&mut rng, shape.nodes);
                    fault.amount = ms(&mut rng, ttl_ms / 2, ttl_ms * 2);
                    fault.lasts = Duration::ZERO;
                }
                Kind::Delay => {
                    fault.nodes = some(&mut rng, shape.nodes);
                    fault.amount = ms(&mut rng, 1, 60);
                    fault.jitter = ms(&mut rng, 0, 40);
                }
                Kind::DebugSleep => {
                    fault.nodes = some(&mut rng, shape.nodes);
                    fault.amount = fault.lasts;
                }
                Kind::ScriptFlush | Kind::ClientKill => {
                    fault.nodes = some(&mut rng, shape.nodes);
                    fault.lasts = Duration::ZERO;
                }
                Kind::NodePause | Kind::Drop | Kind::Partition | Kind::Churn => {
                    fault.nodes = some(&mut rng, shape.nodes);
                }
            }
            if t + fault.lasts + Duration::from_secs(1) > length {
                break;
            }
            t += fault.lasts;
            faults.push(fault);
        }
        Schedule { faults }
    }

    /// Which guarantees hold under the schedule's fault `i`, between the ones before and after.
    pub fn fault_in_model(&self, i: usize, model: &Model) -> InModel {
        self.faults[i].in_model(model, &self.faults[..i], &self.faults[i + 1..])
    }

    /// Which guarantees hold under every fault of the schedule.
    pub fn in_model(&self, model: &Model) -> InModel {
        (0..self.faults.len()).fold(
            InModel {
                mutex: true,
                fenced: model.fencing,
            },
            |acc, i| {
                let m = self.fault_in_model(i, model);
                InModel {
                    mutex: acc.mutex && m.mutex,
                    fenced: acc.fenced && m.fenced,
                }
            },
        )
    }
}

/// Injects and heals node faults: real servers or simulated nodes.
pub trait Faults: Send + Sync {
    /// Starts `fault`. Errors are recorded, not fatal: a fault that could not be injected is
    /// reported as such.
    fn inject<'a>(&'a self, fault: &'a Fault) -> BoxFuture<'a, Result<(), String>>;
    /// Ends `fault` (restarts killed nodes, resumes paused ones, removes proxy faults). Faults
    /// that are instantaneous (clock steps, script flushes) heal to nothing.
    fn heal<'a>(&'a self, fault: &'a Fault) -> BoxFuture<'a, Result<(), String>>;
}

/// Carries out client pauses: the client stops at its next read→write gap for `lasts`.
pub trait Pauser: Send + Sync {
    /// Asks `client` to stop for `lasts` at its next read→write gap.
    fn pause(&self, client: usize, lasts: Duration);
}

/// What happened to one scheduled fault.
#[derive(Clone, Debug, Serialize)]
pub struct Applied {
    /// The fault.
    pub fault: Fault,
    /// When it was injected (shared clock, ns).
    pub injected: u64,
    /// When it was healed (shared clock, ns).
    pub healed: u64,
    /// Which guarantees it leaves standing.
    pub in_model: InModel,
    /// Why injecting or healing failed, if it did.
    pub error: Option<String>,
}

/// For each of `nodes` nodes, how far (ms) to step its clock forward after the run so that it
/// is back at the furthest point it ever reached: a key set while a clock was ahead lives on
/// after the clock is stepped back, and the hygiene check must not wait for that. Never steps a
/// clock back.
pub fn clock_catch_up(applied: &[Applied], nodes: usize) -> Vec<i64> {
    let mut now = vec![0i64; nodes];
    let mut max = vec![0i64; nodes];
    for a in applied.iter().filter(|a| a.error.is_none()) {
        let step = a.fault.amount.as_millis() as i64;
        let step = match a.fault.kind {
            Kind::ClockForward => step,
            Kind::ClockBack => -step,
            _ => continue,
        };
        for &i in a.fault.nodes.iter().filter(|&&i| i < nodes) {
            now[i] += step;
            max[i] = max[i].max(now[i]);
        }
    }
    now.iter().zip(&max).map(|(n, m)| m - n).collect()
}

/// Runs `schedule` from `start` (a reading of `clock`): injects each fault at its time, heals
/// it when it has lasted, and returns what was done.
pub async fn run(
    schedule: &Schedule,
    model: &Model,
    nodes: &dyn Faults,
    clients: &dyn Pauser,
    clock: &dyn Clock,
    start: tokio::time::Instant,
) -> Vec<Applied> {
    let mut applied = Vec::with_capacity(schedule.faults.len());
    for (i, fault) in schedule.faults.iter().enumerate() {
        tokio::time::sleep_until(start + fault.at).await;
        let injected = clock.now();
        let mut error = None;
        if fault.kind.on_nodes() {
            if let Err(e) = nodes.inject(fault).await {
                error = Some(format!("inject: {e}"));
            }
            tokio::time::sleep(fault.lasts).await;
            if let Err(e) = nodes.heal(fault).await {
                error.get_or_insert(format!("heal: {e}"));
            }
        } else if let Some(client) = fault.client {
            clients.pause(client, fault.lasts);
            tokio::time::sleep(fault.lasts).await;
        }
        applied.push(Applied {
            fault: fault.clone(),
            injected,
            healed: clock.now(),
            in_model: schedule.fault_in_model(i, model),
            error,
        });
    }
    applied
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            nodes: 5,
            clients: 5,
            ttl: Duration::from_secs(2),
            jump: None,
        }
    }

    #[test]
    fn a_seed_reproduces_its_schedule_and_faults_do_not_overlap() {
        let a = Schedule::generate(7, &Kind::ALL, Duration::from_secs(120), shape());
        let b = Schedule::generate(7, &Kind::ALL, Duration::from_secs(120), shape());
        let c = Schedule::generate(8, &Kind::ALL, Duration::from_secs(120), shape());
        let key = |s: &Schedule| format!("{:?}", s.faults);
        assert_eq!(key(&a), key(&b));
        assert_ne!(key(&a), key(&c));
        assert!(a.faults.len() >= 10, "{} faults in 120 s", a.faults.len());
        for w in a.faults.windows(2) {
            assert!(
                w[0].at + w[0].lasts + Duration::from_secs(1) <= w[1].at,
                "{w:?}"
            );
        }
        let last = a.faults.last().unwrap();
        assert!(last.at + last.lasts < Duration::from_secs(120));
        for f in &a.faults {
            assert!(f.nodes.iter().all(|&n| n < 5), "{f:?}");
            assert_eq!(f.kind.on_nodes(), f.client.is_none(), "{f:?}");
        }
    }

    #[test]
    fn clocks_catch_up_to_the_furthest_point_they_reached() {
        let step = |kind, nodes: Vec<usize>, ms: u64, error: Option<String>| Applied {
            fault: Fault {
                id: 0,
                kind,
                at: Duration::ZERO,
                lasts: Duration::ZERO,
                nodes,
                client: None,
                amount: Duration::from_millis(ms),
                jitter: Duration::ZERO,
            },
            injected: 0,
            healed: 0,
            in_model: InModel {
                mutex: true,
                fenced: true,
            },
            error,
        };
        let applied = [
            step(Kind::ClockForward, vec![1, 2], 700, None),
            step(Kind::ClockBack, vec![0, 1, 2], 2400, None),
            step(Kind::ClockForward, vec![2], 1000, None),
            step(Kind::ClockBack, vec![2], 3600, None),
            step(
                Kind::ClockBack,
                vec![0],
                5000,
                Some("inject: refused".into()),
            ),
        ];
        // Node 0: back 2400 (the failed step does not count); node 1: +700 then back to -1700;
        // node 2: +700, -1700, -700, -4300: its furthest point was +700.
        assert_eq!(clock_catch_up(&applied, 4), vec![2400, 2400, 5000, 0]);
    }

    /// A run on real servers with fencing and the quarantine, TTL 2 s.
    fn real_model() -> Model {
        Model {
            fencing: true,
            quarantine: true,
            ttl: Duration::from_secs(2),
            drift_allowance: Duration::from_millis(22),
            quarantine_time: Duration::from_secs(3),
            snapshot_stamps: true,
        }
    }

    #[test]
    fn the_model_decides_which_checks_a_fault_leaves_standing() {
        let model = real_model();
        let mut f = Schedule::generate(1, &[Kind::ClockForward], Duration::from_secs(30), shape())
            .faults
            .remove(0);
        assert!(f.nodes.len() >= 3);
        assert!(
            !f.in_model(&model, &[], &[]).mutex,
            "a step of {:?}",
            f.amount
        );
        f.amount = Duration::from_millis(20);
        assert!(f.in_model(&model, &[], &[]).mutex);
        let kill = Schedule::generate(1, &[Kind::Kill], Duration::from_secs(30), shape())
            .faults
            .remove(0);
        assert!(kill.in_model(&model, &[], &[]).mutex);
        let off = Model {
            quarantine: false,
            fencing: false,
            ..model
        };
        assert_eq!(
            kill.in_model(&off, &[], &[]),
            InModel {
                mutex: false,
                fenced: false
            }
        );
    }

    /// A restart from a snapshot is beyond the fenced register's model when clock steps (before
    /// it, or after it but maybe before the node's first grant) may leave the node's clock,
    /// from the end of its quarantine on, behind the furthest reading it reached plus a second;
    /// not for another node, not when the time since makes up for the steps, and not on
    /// simulated nodes (which keep their stamp key).
    #[test]
    fn a_snapshot_restart_behind_a_clock_stepped_back_is_beyond_the_fence_model() {
        let model = real_model();
        let at = |kind: Kind, node: usize, secs: f64, amount_ms: u64, lasts_ms: u64| Fault {
            id: 0,
            kind,
            at: Duration::from_secs_f64(secs),
            lasts: Duration::from_millis(lasts_ms),
            nodes: vec![node],
            client: None,
            amount: Duration::from_millis(amount_ms),
            jitter: Duration::ZERO,
        };
        let fenced =
            |f: &Fault, before: &[Fault], after: &[Fault]| f.in_model(&model, before, after).fenced;
        // Node 0 stepped back 4 s at 10 s and again at 11 s: furthest reading 10 s; the kill
        // at 12 s for 0.2 s, quarantined 3 s, grants again at 15.2 - 8 = 7.2 s on its clock.
        let before = [
            at(Kind::ClockBack, 0, 10.0, 4000, 0),
            at(Kind::ClockBack, 0, 11.0, 4000, 0),
        ];
        let kill = |node: usize, secs: f64| at(Kind::KillSnapshot, node, secs, 0, 200);
        assert!(!fenced(&kill(0, 12.0), &before, &[]));
        assert!(fenced(&kill(1, 12.0), &before, &[]), "another node");
        // By 17.9 s the node is back at 21.1 - 8 = 13.1 s on its clock, past 10 + 1 s.
        assert!(fenced(&kill(0, 17.9), &before, &[]));
        // One step of 4 s: a kill at 11.2 s is back at 11.2 + 0.2 + 3 - 4 = 10.4 s on its
        // clock, within the second of slack; one at 12 s at 11.2 s, past it.
        assert!(!fenced(&kill(0, 11.2), &before[..1], &[]));
        assert!(fenced(&kill(0, 12.0), &before[..1], &[]));
        // A step forward first: furthest 11 + 1 = 12 s before the step back; the readings
        // after the kill count only the step back (the forward one may have failed): a kill
        // at 13 s is back at 13 + 3.2 - 4 = 12.2 s, within the slack; one at 14 s at 13.2 s.
        let forward = [
            at(Kind::ClockForward, 0, 10.0, 1000, 0),
            at(Kind::ClockBack, 0, 11.0, 4000, 0),
        ];
        assert!(!fenced(&kill(0, 13.0), &forward, &[]));
        assert!(fenced(&kill(0, 14.0), &forward, &[]));
        // Steps after the kill: furthest 20 s at the kill; back from quarantine at 23.2 s,
        // surely granted by 24.2 s. A step back of 3.9 s during the quarantine (at 21.2 s)
        // leaves it at 19.3 s; one at 23.5 s takes it to 19.6 s; one at 24.5 s comes after
        // the node granted (its stamps then count on from one past 20 s).
        let back_at = |secs: f64| at(Kind::ClockBack, 0, secs, 3900, 0);
        assert!(!fenced(&kill(0, 20.0), &[], &[back_at(21.2)]));
        assert!(!fenced(&kill(0, 20.0), &[], &[back_at(23.5)]));
        assert!(fenced(&kill(0, 20.0), &[], &[back_at(24.5)]));
        assert!(fenced(&kill(0, 20.0), &[], &[]));
        // Cut off from 24 s to 26 s, it may not have granted until 27 s: a step back of 6 s
        // at 26.5 s counts (20.5 s on its clock); the same partition on another node does not
        // hold it up.
        let cut = |node: usize| at(Kind::Partition, node, 24.0, 0, 2000);
        let far_back = at(Kind::ClockBack, 0, 26.5, 6000, 0);
        assert!(!fenced(&kill(0, 20.0), &[], &[cut(0), far_back.clone()]));
        assert!(fenced(&kill(0, 20.0), &[], &[cut(1), far_back]));
        let simulated = Model {
            snapshot_stamps: false,
            ..model
        };
        assert!(kill(0, 12.0).in_model(&simulated, &before, &[]).fenced);
        // A kill that loses everything comes back under a new identity.
        assert!(fenced(&at(Kind::Kill, 0, 12.0, 0, 200), &before, &[]));
    }
}
