//! A run's summary: the checkers' verdicts over its history, the faults, and the exit status.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use serde::Serialize;

use crate::check::{self, Availability, Leftovers, Verdict};
use crate::history::{Kind, Op, Outcome};
use crate::nemesis::{Applied, Fault, InModel, Kind as FaultKind};
use crate::options::Settings;

/// Operation counts by kind and outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counts {
    /// Every recorded operation.
    pub total: usize,
    /// `kind/outcome` → count.
    pub by_kind: BTreeMap<String, usize>,
    /// Writes refused or unknown, by reason (`Stale`, `Unrelated`, …).
    pub write_failures: BTreeMap<String, usize>,
}

/// Faults of one kind in a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FaultCount {
    /// Injected.
    pub count: usize,
    /// Of those, how many could not be injected or healed.
    pub errors: usize,
    /// The first such error.
    pub first_error: Option<String>,
    /// Whether every fault of the kind was inside the model of the mutual exclusion checker.
    pub mutex_in_model: bool,
    /// How many faults of the kind were beyond the fenced register's model (a `kill-snapshot`
    /// of a node whose clock was stepped back), in a run with fencing on.
    pub fenced_out_of_model: usize,
}

/// Everything a run found.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// `real` or `sim`.
    pub mode: &'static str,
    /// The run's settings.
    pub settings: Settings,
    /// Which checkers the faults and configuration claim.
    pub claims: InModel,
    /// The checkers this run is a negative control for (they must find a violation).
    pub controls: Vec<&'static str>,
    /// Operation counts.
    pub ops: Counts,
    /// Faults by kind.
    pub faults: BTreeMap<String, FaultCount>,
    /// Verdicts.
    pub verdicts: Vec<Verdict>,
    /// Availability and recovery.
    pub availability: Availability,
    /// What was left behind.
    pub leftovers: Leftovers,
    /// Time the checkers took (ms).
    pub check_ms: f64,
    /// Why the run failed (empty: it passed).
    pub failures: Vec<String>,
}

impl Summary {
    /// Whether the run passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// What a finished run hands to [`analyze`].
#[derive(Debug)]
pub struct Outcomes {
    /// Every operation.
    pub ops: Vec<Op>,
    /// Every fault.
    pub faults: Vec<Applied>,
    /// Final register values, per resource.
    pub finals: Vec<Option<i64>>,
    /// Leftovers.
    pub leftovers: Leftovers,
    /// Start and end of the workload, shared clock (ns).
    pub span: (u64, u64),
    /// Start and end (shared clock, ns) of each client pause that struck (`None` where the run
    /// cannot tell: clients in processes of their own).
    pub pause_strikes: Option<Vec<(u64, u64)>>,
}

/// Runs every checker over a run's outcomes and decides whether it passed.
pub fn analyze(mode: &'static str, settings: &Settings, out: &Outcomes) -> Summary {
    let started = Instant::now();
    let model = settings.model();
    let claims = out.faults.iter().fold(
        InModel {
            mutex: true,
            fenced: model.fencing,
        },
        |acc, f| InModel {
            mutex: acc.mutex && f.in_model.mutex,
            fenced: acc.fenced && f.in_model.fenced,
        },
    );
    let controls = settings.controls();
    // A fault beyond mutual exclusion's model (a clock step past the drift allowance, a
    // restart that lost its keys without the quarantine) can make two holders only near
    // itself: the rest of the run is still checked (not in a negative control, whose
    // violations are the point).
    let mutex = if claims.mutex || controls.contains(&"mutual exclusion") {
        check::mutual_exclusion(&out.ops, claims.mutex)
    } else {
        let reach = nanos(out_of_model_reach(settings.ttl));
        let spans: Vec<(u64, u64)> = out
            .faults
            .iter()
            .filter(|f| !f.in_model.mutex)
            .map(|f| (f.injected, f.healed.max(f.injected).saturating_add(reach)))
            .collect();
        check::mutual_exclusion_outside(&out.ops, &spans, out.span)
    };
    let excused = progress_excused(settings, out);
    let verdicts = vec![
        check::fenced_register(&out.ops, &out.finals, claims.fenced),
        mutex,
        check::progress(&out.ops, &excused, nanos(patience(settings)), out.span),
        check::hygiene(&out.leftovers),
    ];
    let availability = check::availability(&out.ops, &out.faults, out.span.0, out.span.1);
    let check_ms = started.elapsed().as_secs_f64() * 1e3;

    let mut ops = Counts {
        total: out.ops.len(),
        ..Counts::default()
    };
    for op in &out.ops {
        let key = format!("{}/{}", kind_name(op.kind), outcome_name(op.outcome));
        *ops.by_kind.entry(key).or_default() += 1;
        if op.kind == Kind::Write
            && let Some(e) = &op.error
        {
            *ops.write_failures.entry(e.clone()).or_default() += 1;
        }
    }
    let mut faults: BTreeMap<String, FaultCount> = BTreeMap::new();
    for f in &out.faults {
        let e = faults
            .entry(f.fault.kind.name().to_owned())
            .or_insert(FaultCount {
                mutex_in_model: true,
                ..FaultCount::default()
            });
        e.count += 1;
        e.mutex_in_model &= f.in_model.mutex;
        if model.fencing && !f.in_model.fenced {
            e.fenced_out_of_model += 1;
        }
        if let Some(err) = &f.error {
            e.errors += 1;
            e.first_error.get_or_insert_with(|| err.clone());
        }
    }

    let mut failures = Vec::new();
    for v in &verdicts {
        if controls.contains(&v.name) {
            if v.violations == 0 {
                failures.push(format!(
                    "negative control: {} found no violation although the run left out its safeguard",
                    v.name
                ));
            }
        } else if let Some(o) = v.outside.as_ref().filter(|o| o.violations > 0) {
            failures.push(format!(
                "{}: {} violations away from the {}",
                v.name, o.violations, o.around
            ));
        } else if v.fails() {
            failures.push(format!("{}: {} violations", v.name, v.violations));
        }
    }
    for (kind, f) in &faults {
        if f.errors == f.count && f.count > 0 {
            failures.push(format!(
                "no {kind} fault could be injected: {}",
                f.first_error.as_deref().unwrap_or("?")
            ));
        }
    }
    failures.extend(vacuous(settings, out));
    Summary {
        mode,
        settings: settings.clone(),
        claims,
        controls,
        ops,
        faults,
        verdicts,
        availability,
        leftovers: out.leftovers.clone(),
        check_ms,
        failures,
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How long a resource may go without a grant while clients ask for it, away from faults: a
/// guarded holder keeps it for the run's hold, and keys a holder could not delete (a failed
/// release, an abandoned lock) live one TTL after its last grant or renewal; a second more for
/// the clients' retries and back-off.
pub(crate) fn patience(settings: &Settings) -> std::time::Duration {
    settings.hold() + settings.ttl + std::time::Duration::from_secs(1)
}

/// How long after its heal a fault is left out of the progress check: a TTL and a second, as
/// a request the fault held up (a delayed or stopped link, a paused node) may set a key after
/// its attempt gave up, and the clean-up the fault kept from the node leaves it there for a
/// TTL; for a restart also the quarantine, in which the node grants nothing; for a paused
/// client the whole patience, as it may resume a hold (see [`progress_excused`]).
pub(crate) fn recovery_allowance(settings: &Settings, fault: &Fault) -> std::time::Duration {
    if fault.kind == FaultKind::Pause {
        return patience(settings);
    }
    let mut a = settings.ttl + std::time::Duration::from_secs(1);
    if matches!(
        fault.kind,
        FaultKind::Kill | FaultKind::KillAof | FaultKind::KillSnapshot
    ) {
        a += settings.quarantine_time().unwrap_or_default();
    }
    a
}

/// The intervals the progress check leaves out: each fault from its injection to the end of
/// its [`recovery_allowance`] after its heal, and further where clocks went back:
///
/// * A step back makes every key set before it on its nodes outlive its TTL by the step, and
///   steps add up: a key set before several outlives it by their sum. So a step's interval
///   reaches a second past the latest such key could live (per node: the later of the last
///   step's reach and the step's own time plus a TTL, plus the step).
/// * A node's restart quarantine reads the server's uptime and its identity record's age on
///   the node's clock, so after a step back a reconnect (a fault on that node that breaks
///   connections) may quarantine a node that never restarted: once a node's clock went back,
///   every fault on it is a quarantine longer.
/// * A client pause that struck (at a read→write gap, maybe well after the nemesis asked for
///   it) is left out from its start to its end plus the patience: a simulated pause stops the
///   holding task, not its renewals, and the holder resumes a hold it still has.
fn progress_excused(settings: &Settings, out: &Outcomes) -> Vec<(u64, u64)> {
    let ttl = nanos(settings.ttl);
    let second = nanos(std::time::Duration::from_secs(1));
    let quarantine = nanos(settings.quarantine_time().unwrap_or_default());
    let patience = nanos(patience(settings));
    let mut outlived: BTreeMap<usize, u64> = BTreeMap::new();
    let mut excused: Vec<(u64, u64)> = out
        .faults
        .iter()
        .map(|f| {
            let healed = f.healed.max(f.injected);
            let mut end = healed.saturating_add(nanos(recovery_allowance(settings, &f.fault)));
            if f.fault.kind == FaultKind::ClockBack {
                for &n in &f.fault.nodes {
                    let reach = outlived.entry(n).or_default();
                    *reach = (*reach)
                        .max(f.injected.saturating_add(ttl))
                        .saturating_add(nanos(f.fault.amount));
                    end = end.max(reach.saturating_add(second));
                }
            }
            if f.fault.nodes.iter().any(|n| outlived.contains_key(n)) {
                end = end.saturating_add(quarantine);
            }
            (f.injected, end)
        })
        .collect();
    excused.extend(
        out.pause_strikes
            .iter()
            .flatten()
            .map(|&(start, end)| (start, end.saturating_add(patience))),
    );
    excused
}

/// How long after its heal a fault beyond mutual exclusion's model is left out of that check.
/// Two holders need a holder's window that the fault cut short on the nodes: one whose last
/// grant or renewal was sent before the fault took effect (at its injection, or at its heal
/// for a restart), since a renewal after it that reached a quorum still holding the lock's
/// keys leaves no quorum for another client. Such a window ends within a TTL of that request
/// (a claimed validity is the TTL less the time the request took and the drift), so within a
/// TTL of the heal; a quarter more leaves room for the history's clock. A new fault has a
/// span of its own.
pub(crate) fn out_of_model_reach(ttl: std::time::Duration) -> std::time::Duration {
    ttl + ttl / 4
}

/// What makes a run's checks vacuous: a run that granted no lock, admitted no write, injected
/// none of the faults it was asked for, or could not read a register's final value checked
/// nothing of what it reports, and passed as if it had (found in review: an empty history, or
/// `--duration 5s`, which schedules no fault, passed).
pub(crate) fn vacuous(settings: &Settings, out: &Outcomes) -> Vec<String> {
    let done = |kind: Kind| {
        out.ops
            .iter()
            .filter(|o| o.kind == kind && o.outcome == Outcome::Ok)
            .count()
    };
    let mut failures = Vec::new();
    if done(Kind::Acquire) == 0 {
        failures.push("no lock was granted in the whole run: nothing was checked".to_owned());
    }
    if done(Kind::Write) == 0 {
        failures.push(
            "no write was done in the whole run: the register checks had nothing to check"
                .to_owned(),
        );
    }
    // A client pause strikes only at a gap between a read and its write; asked for while the
    // client holds nothing, it waits for the next one, and one asked for later replaces it.
    // Recorded as a fault when asked for, a run of pauses that never struck passed as if it
    // had tested them (found in review). Only a run whose faults were all pauses is held to
    // it: in a mixed run, the other faults were tested (5,000 mixed simulated histories had one
    // whose single pause came too late to strike).
    let pauses = out
        .faults
        .iter()
        .filter(|f| f.fault.kind == crate::nemesis::Kind::Pause)
        .count();
    if pauses > 0
        && pauses == out.faults.len()
        && out.pause_strikes.as_ref().is_some_and(Vec::is_empty)
    {
        failures.push(format!(
            "{pauses} client pauses were asked for and none struck: a pause strikes between a \
             read and its write"
        ));
    }
    if !settings.nemesis.is_empty() && out.faults.is_empty() {
        let asked: Vec<&str> = settings.nemesis.iter().map(|k| k.name()).collect();
        failures.push(format!(
            "no fault was injected in {:?} (nemesis {}): the run tested none; faults start 1-5 s \
             into a run and last 1-4 s",
            settings.duration,
            asked.join(",")
        ));
    }
    let unread: Vec<String> = (0..out.finals.len())
        .filter(|&r| out.finals[r].is_none())
        .map(|r| format!("r{r}"))
        .collect();
    if !unread.is_empty() {
        failures.push(format!(
            "the final value of {} could not be read: the lost-update check did not run there",
            unread.join(", ")
        ));
    }
    failures
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Acquire => "acquire",
        Kind::Write => "write",
        Kind::Release => "release",
    }
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Ok => "ok",
        Outcome::Fail => "fail",
        Outcome::Unknown => "unknown",
    }
}

/// The one-screen text summary.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let st = &s.settings;
    let nemesis: Vec<&str> = st.nemesis.iter().map(|k| k.name()).collect();
    let _ = writeln!(
        out,
        "redlock-chaos ({}) seed {} for {:?}: {} nodes, {} clients{}, {} resources, TTL {:?}, fence {}{}, quarantine {}, drift factor {}",
        s.mode,
        st.seed,
        st.duration,
        st.nodes,
        st.clients,
        if st.processes { " (processes)" } else { "" },
        st.resources,
        st.ttl,
        st.fence,
        if st.fencing {
            ""
        } else {
            " (OFF: plain writes)"
        },
        if st.quarantine { "on" } else { "OFF" },
        st.drift_factor,
    );
    let _ = writeln!(
        out,
        "nemesis: {}",
        if nemesis.is_empty() {
            "none".to_owned()
        } else {
            nemesis.join(",")
        }
    );
    let _ = writeln!(out, "\noperations: {}", s.ops.total);
    let by: Vec<String> = s
        .ops
        .by_kind
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let _ = writeln!(out, "  {}", by.join(", "));
    if !s.ops.write_failures.is_empty() {
        let why: Vec<String> = s
            .ops
            .write_failures
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(out, "  writes not done: {}", why.join(", "));
    }
    let _ = writeln!(
        out,
        "\nfaults injected: {}",
        s.faults.values().map(|f| f.count).sum::<usize>()
    );
    for (kind, f) in &s.faults {
        let _ = write!(
            out,
            "  {kind:<14} {:>4}  {}",
            f.count,
            match (f.mutex_in_model, f.fenced_out_of_model) {
                (true, 0) => "in model".to_owned(),
                (false, 0) => "OUT OF MODEL (mutual exclusion)".to_owned(),
                (mutex, n) => format!(
                    "OUT OF MODEL ({}fenced register: {n} after clock steps)",
                    if mutex { "" } else { "mutual exclusion, " }
                ),
            }
        );
        if f.errors > 0 {
            let _ = write!(
                out,
                "  {} failed: {}",
                f.errors,
                f.first_error.as_deref().unwrap_or("")
            );
        }
        out.push('\n');
    }
    let _ = writeln!(out, "\ncheckers ({:.1} ms):", s.check_ms);
    for v in &s.verdicts {
        let role = if s.controls.contains(&v.name) {
            "negative control: must find violations".to_owned()
        } else if v.guaranteed {
            "guaranteed".to_owned()
        } else if let Some(o) = &v.outside {
            format!(
                "guaranteed outside the spans of the {} {}, {:.0} % of the run: {} violations \
                 not within one",
                o.spans,
                o.around,
                o.covered * 100.0,
                o.violations
            )
        } else {
            "not guaranteed under these faults".to_owned()
        };
        let _ = writeln!(
            out,
            "  {:<17} {:>6} violations  ({role})",
            v.name, v.violations
        );
        match (v.outside.as_ref().and_then(|o| o.first.as_ref()), &v.first) {
            (Some(first), _) => {
                let _ = writeln!(out, "    first outside the spans: {first}");
            }
            (None, Some(first)) if v.outside.is_some() => {
                let _ = writeln!(out, "    first (within a span): {first}");
            }
            (None, Some(first)) => {
                let _ = writeln!(out, "    first: {first}");
            }
            (None, None) => {}
        }
    }
    let a = &s.availability;
    let _ = writeln!(
        out,
        "\navailability: {:.1} grants/s outside faults",
        a.rate_calm
    );
    for k in &a.kinds {
        let during = k
            .rate_during
            .map_or("-".to_owned(), |r| format!("{r:.1}/s"));
        let rec = k.recovery_ms.map_or("-".to_owned(), |[p50, p99, max]| {
            format!("p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms")
        });
        let _ = writeln!(
            out,
            "  {:<14} during {:>8}  recovery {rec}{}",
            k.kind.name(),
            during,
            if k.never_recovered > 0 {
                format!(
                    " ({} without a grant before the next fault)",
                    k.never_recovered
                )
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(
        out,
        "\nresult: {}",
        if s.passed() {
            "PASS".to_owned()
        } else {
            format!("FAIL — {}", s.failures.join("; "))
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::nemesis::{Fault, Kind as FaultKind};
    use crate::options::FenceBackend;

    fn settings(nemesis: Vec<FaultKind>) -> Settings {
        Settings {
            seed: 1,
            duration: Duration::from_secs(30),
            nodes: 3,
            clients: 2,
            tasks: 1,
            resources: 1,
            nemesis,
            fence: FenceBackend::Memory,
            fencing: true,
            quarantine: true,
            drift_factor: 0.01,
            ttl: Duration::from_secs(1),
            jump: None,
            processes: false,
        }
    }

    fn op(kind: Kind, outcome: Outcome, at: u64) -> Op {
        Op {
            client: 0,
            task: 0,
            resource: 0,
            hold: 1,
            kind,
            outcome,
            invoke: at,
            complete: at + 1,
            valid_until: (kind == Kind::Acquire).then_some(at + 1_000_000),
            fence: Some("f1,n1=10".to_owned()),
            read: (kind == Kind::Write).then_some(0),
            wrote: (kind == Kind::Write).then_some(1),
            error: None,
        }
    }

    fn pause_applied() -> Applied {
        Applied {
            fault: Fault {
                id: 0,
                kind: FaultKind::Pause,
                at: Duration::from_secs(2),
                lasts: Duration::from_secs(2),
                nodes: Vec::new(),
                client: Some(0),
                amount: Duration::ZERO,
                jitter: Duration::ZERO,
            },
            injected: 2_000_000_000,
            healed: 4_000_000_000,
            in_model: InModel {
                mutex: true,
                fenced: true,
            },
            error: None,
        }
    }

    fn outcomes(ops: Vec<Op>, faults: Vec<Applied>, finals: Vec<Option<i64>>) -> Outcomes {
        Outcomes {
            ops,
            faults,
            finals,
            leftovers: Leftovers::default(),
            span: (0, 30_000_000_000),
            pause_strikes: None,
        }
    }

    /// A fault of `kind` on `nodes` (4 s of it, for a clock step) injected and healed at `at`.
    fn instant_fault(kind: FaultKind, nodes: Vec<usize>, at: u64) -> Applied {
        Applied {
            fault: Fault {
                kind,
                nodes,
                client: None,
                amount: Duration::from_secs(4),
                lasts: Duration::ZERO,
                ..pause_applied().fault
            },
            injected: at,
            healed: at,
            ..pause_applied()
        }
    }

    /// Client 1's acquire at `at`, refused as busy.
    fn refused(at: u64) -> Op {
        let mut refused = op(Kind::Acquire, Outcome::Fail, at);
        refused.client = 1;
        refused.error = Some("Busy".to_owned());
        refused
    }

    fn a_hold() -> Vec<Op> {
        vec![
            op(Kind::Acquire, Outcome::Ok, 10),
            op(Kind::Write, Outcome::Ok, 20),
            op(Kind::Release, Outcome::Ok, 30),
        ]
    }

    /// A run with one granted hold, one write that the final value shows, and the fault it
    /// asked for passes; take any of them away and it must not.
    #[test]
    fn a_run_whose_client_pauses_never_struck_does_not_pass() {
        let asked = settings(vec![FaultKind::Pause]);
        let run = |struck: Option<usize>| {
            let mut out = outcomes(a_hold(), vec![pause_applied()], vec![Some(1)]);
            out.pause_strikes = struck.map(|n| vec![(2_000_000_000, 4_000_000_000); n]);
            analyze("real", &asked, &out)
        };
        let never = run(Some(0));
        assert!(!never.passed(), "a run whose pause never struck passed");
        assert!(never.failures.iter().any(|f| f.contains("none struck")));
        assert!(run(Some(1)).passed());
        // Clients in processes of their own: not known, not held against the run.
        assert!(run(None).passed());
    }

    #[test]
    fn a_run_that_checked_nothing_does_not_pass() {
        let asked = settings(vec![FaultKind::Pause]);
        let full = analyze(
            "real",
            &asked,
            &outcomes(a_hold(), vec![pause_applied()], vec![Some(1)]),
        );
        assert!(full.passed(), "{:?}", full.failures);

        let empty = analyze(
            "real",
            &asked,
            &outcomes(vec![], vec![pause_applied()], vec![Some(0)]),
        );
        assert!(!empty.passed(), "an empty history passed");

        let refused: Vec<Op> = a_hold()
            .into_iter()
            .map(|mut o| {
                if o.kind == Kind::Write {
                    o.outcome = Outcome::Fail;
                }
                o
            })
            .collect();
        let unwritten = analyze(
            "real",
            &asked,
            &outcomes(refused, vec![pause_applied()], vec![Some(0)]),
        );
        assert!(!unwritten.passed(), "a run without one write passed");

        let faultless = analyze("real", &asked, &outcomes(a_hold(), vec![], vec![Some(1)]));
        assert!(
            !faultless.passed(),
            "a run that injected none of its faults passed"
        );
        let calm = analyze(
            "real",
            &settings(vec![]),
            &outcomes(a_hold(), vec![], vec![Some(1)]),
        );
        assert!(
            calm.passed(),
            "a run asked for no faults: {:?}",
            calm.failures
        );

        let unread = analyze(
            "real",
            &asked,
            &outcomes(a_hold(), vec![pause_applied()], vec![None]),
        );
        assert!(
            !unread.passed(),
            "a run whose register could not be read passed"
        );
    }

    /// A resource refused for longer than a holder may keep it (patience: hold 1.2 s + TTL
    /// 1 s + 1 s) fails the run, unless the attempt came within a fault's recovery allowance
    /// after its heal: TTL + 1 s after a partition, the whole patience after a client pause.
    #[test]
    fn a_resource_refused_long_after_a_fault_healed_fails_the_run() {
        let partition = Applied {
            fault: Fault {
                kind: FaultKind::Partition,
                nodes: vec![0, 1],
                client: None,
                ..pause_applied().fault
            },
            ..pause_applied()
        };
        let run = |fault: &Applied, at: u64| {
            let mut ops = a_hold();
            ops.push(refused(at));
            analyze(
                "sim",
                &settings(vec![fault.fault.kind]),
                &outcomes(ops, vec![fault.clone()], vec![Some(1)]),
            )
        };
        // Healed at 4 s: a refusal at 5.5 s is within the partition's allowance, one at
        // 6.5 s is not (the last grant, at 11 ns, is far more than the patience before it).
        assert!(run(&partition, 5_500_000_000).passed());
        let late = run(&partition, 6_500_000_000);
        assert!(!late.passed());
        assert!(
            late.failures.iter().any(|f| f.starts_with("progress")),
            "{:?}",
            late.failures
        );
        // A paused client may resume a hold: the patience after the pause (to 7.2 s).
        assert!(run(&pause_applied(), 6_500_000_000).passed());
        assert!(!run(&pause_applied(), 7_500_000_000).passed());
    }

    /// Steps back add up: a key set before two steps of 4 s (TTL 1 s) outlives its TTL by
    /// 8 s, and after a step back a reconnect may quarantine a node (2 s here) — a refusal
    /// until then is excused (each step excused only by its own size failed the run at 9 s).
    /// A client pause is excused from when it struck, however late, to its end plus the
    /// patience.
    #[test]
    fn progress_leaves_out_what_steps_back_and_late_pauses_hold_up() {
        let step = |at: u64| instant_fault(FaultKind::ClockBack, vec![0, 1], at);
        let run = |faults: Vec<Applied>, at: u64, strikes: Vec<(u64, u64)>| {
            let mut ops = a_hold();
            ops.push(refused(at));
            let kinds = faults.iter().map(|f| f.fault.kind).collect();
            let mut out = outcomes(ops, faults, vec![Some(1)]);
            out.pause_strikes = Some(strikes);
            analyze("sim", &settings(kinds), &out)
        };
        // Steps at 0.5 s and 1.5 s: a key set before them lives to 0.5 + 1 + 4 + 4 = 9.5 s;
        // a second more and the quarantine: excused to 12.5 s.
        let steps = || vec![step(500_000_000), step(1_500_000_000)];
        let within = run(steps(), 12_000_000_000, Vec::new());
        assert!(within.passed(), "{:?}", within.failures);
        assert!(!run(steps(), 13_000_000_000, Vec::new()).passed());
        // A pause asked for at 2 s (healed at 4 s) that struck at 10 s for 2 s: excused to
        // 12 + 3.2 s, not only to 4 + 3.2 s.
        let late = |strikes| run(vec![pause_applied()], 14_000_000_000, strikes);
        assert!(!late(Vec::new()).passed());
        let struck = late(vec![(10_000_000_000, 12_000_000_000)]);
        assert!(struck.passed(), "{:?}", struck.failures);
    }

    /// After a step back only a fault on a node whose clock went back may quarantine it on a
    /// reconnect: a later fault on another node is excused for its own recovery alone (every
    /// fault after any step back was a quarantine longer, on any node).
    #[test]
    fn a_step_back_lengthens_only_the_faults_on_its_nodes() {
        let run = |later_on: usize| {
            let faults = vec![
                instant_fault(FaultKind::ClockBack, vec![0], 500_000_000),
                instant_fault(FaultKind::Delay, vec![later_on], 20_000_000_000),
            ];
            let mut ops = a_hold();
            ops.push(refused(23_000_000_000));
            let kinds = faults.iter().map(|f| f.fault.kind).collect();
            analyze(
                "sim",
                &settings(kinds),
                &outcomes(ops, faults, vec![Some(1)]),
            )
        };
        // A delay on node 0 at 20 s: its TTL and a second (to 22 s), and the quarantine (2 s).
        let same = run(0);
        assert!(same.passed(), "{:?}", same.failures);
        // On node 2: to 22 s only, and the refusal at 23 s is a stall.
        let other = run(2);
        assert!(
            other.failures.iter().any(|f| f.contains("progress")),
            "{:?}",
            other.failures
        );
    }

    /// A clock step beyond the drift allowance at 2 s excuses two holders within its reach
    /// (1.25 TTL: 1.25 s here), not two holders 20 s later: those fail the run, which passed
    /// before whatever they were (mutual exclusion was not claimed for the whole run).
    #[test]
    fn two_holders_far_from_a_fault_beyond_the_model_fail_the_run() {
        let asked = settings(vec![FaultKind::ClockForward]);
        let step = Applied {
            fault: Fault {
                kind: FaultKind::ClockForward,
                nodes: vec![0, 1],
                client: None,
                amount: Duration::from_millis(500),
                lasts: Duration::ZERO,
                ..pause_applied().fault
            },
            injected: 2_000_000_000,
            healed: 2_000_000_000,
            in_model: InModel {
                mutex: false,
                fenced: true,
            },
            error: None,
        };
        // Client 1 granted half a millisecond into client 0's hold, which claims 1 ms.
        let two_holders = |at: u64| {
            let mut ops = vec![op(Kind::Acquire, Outcome::Ok, at)];
            let mut other = op(Kind::Acquire, Outcome::Ok, at + 500_000);
            other.client = 1;
            ops.push(other);
            ops
        };
        let run = |at: u64| {
            let mut ops = a_hold();
            ops.extend(two_holders(at));
            analyze(
                "sim",
                &asked,
                &outcomes(ops, vec![step.clone()], vec![Some(1)]),
            )
        };
        let near = run(2_500_000_000);
        assert!(near.passed(), "{:?}", near.failures);
        assert_eq!(near.verdicts[1].violations, 1);
        let far = run(22_000_000_000);
        assert!(!far.passed());
        assert!(
            far.failures[0].contains("away from the faults beyond its model"),
            "{:?}",
            far.failures
        );
        let o = far.verdicts[1]
            .outside
            .as_ref()
            .expect("claimed outside the span");
        assert_eq!(o.violations, 1);
        assert!((o.covered - 1.25 / 30.0).abs() < 1e-9, "{}", o.covered);
    }
}
