//! Checkers over a history: fenced register, mutual exclusion of claimed validity windows,
//! availability and recovery, hygiene. Each runs in O(n log n) in the number of operations.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::history::{Kind, Op, Outcome};
use crate::nemesis::{Applied, Kind as FaultKind};

/// The verdict of one checker.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// Checker name.
    pub name: &'static str,
    /// Whether the run's faults and configuration claim this checker's property: a violation
    /// then fails the run.
    pub guaranteed: bool,
    /// Number of violations found.
    pub violations: usize,
    /// The first violation: what was wrong and the offending operations.
    pub first: Option<String>,
    /// When the property is claimed only outside the spans of the run's faults beyond its
    /// model (see [`mutual_exclusion_outside`]): what was found there. `None`: claimed for the
    /// whole run, or not at all (`guaranteed`).
    pub outside: Option<Outside>,
}

/// A property claimed outside the spans of the faults beyond its model: a fault that breaks it
/// breaks it near itself, and the rest of the run is still checked.
#[derive(Clone, Debug, Serialize)]
pub struct Outside {
    /// What the spans are around: "faults beyond its model", "faults and pause strikes, with
    /// their recovery".
    pub around: &'static str,
    /// The spans left out.
    pub spans: usize,
    /// Violations outside every span (each fails the run); [`Verdict::violations`] counts
    /// all of them.
    pub violations: usize,
    /// The first of them.
    pub first: Option<String>,
    /// The share of the run's workload inside the spans (0 to 1): two holders are excused only
    /// while both hold inside one span.
    pub covered: f64,
}

impl Verdict {
    fn new(name: &'static str, guaranteed: bool) -> Self {
        Self {
            name,
            guaranteed,
            violations: 0,
            first: None,
            outside: None,
        }
    }

    fn found(&mut self, what: impl FnOnce() -> String) {
        self.violations += 1;
        if self.first.is_none() {
            self.first = Some(what());
        }
    }

    /// Whether this verdict fails the run: a guaranteed property was violated, or a property
    /// claimed outside some spans was violated outside them.
    pub fn fails(&self) -> bool {
        (self.guaranteed && self.violations > 0)
            || self.outside.as_ref().is_some_and(|o| o.violations > 0)
    }
}

/// Fenced register: no write admitted after a newer grant's write (by the grants' per-node
/// stamps, in the register's version order), no two acknowledged writes of the same value, and
/// every register's final value equals its acknowledged writes (plus at most the unknown ones).
///
/// `finals[r]` is resource `r`'s register at the end (`None`: could not be read).
pub fn fenced_register(ops: &[Op], finals: &[Option<i64>], guaranteed: bool) -> Verdict {
    let mut v = Verdict::new("fenced register", guaranteed);
    let mut by_resource: HashMap<u32, Vec<&Op>> = HashMap::new();
    for op in ops.iter().filter(|o| o.kind == Kind::Write) {
        by_resource.entry(op.resource).or_default().push(op);
    }
    let mut resources: Vec<u32> = by_resource.keys().copied().collect();
    resources.sort_unstable();
    for r in resources {
        let writes = &by_resource[&r];
        let mut acked: Vec<&Op> = writes
            .iter()
            .copied()
            .filter(|o| o.outcome == Outcome::Ok && o.wrote.is_some())
            .collect();
        let unknown = writes
            .iter()
            .filter(|o| o.outcome == Outcome::Unknown)
            .count() as i64;
        acked.sort_by_key(|o| (o.wrote, o.complete));
        // Two acknowledged writes of one value: one of them overwrote the other (lost update).
        for pair in acked.windows(2) {
            if pair[0].wrote == pair[1].wrote {
                v.found(|| {
                    format!(
                        "lost update on r{r}: two acknowledged writes of {}:\n    {}\n    {}",
                        pair[0].wrote.unwrap_or_default(),
                        pair[0].describe(),
                        pair[1].describe()
                    )
                });
            }
        }
        // Stale admission: in version order, a write whose grant is older (on a node both
        // grants share) than an earlier admitted write's grant.
        let mut high: HashMap<String, (u64, &Op)> = HashMap::new();
        for op in &acked {
            let Some(text) = op.fence.as_deref() else {
                continue;
            };
            // Read with the fencing crate's own parser: a token this check cannot read is a
            // finding, not a write to skip (its claims used to be split out by hand, skipping
            // what did not parse, so a change to the text form would have switched the check
            // off without a word; found in review).
            let token = match text.parse::<fencing::FenceToken>() {
                Ok(token) => token,
                Err(e) => {
                    v.found(|| {
                        format!(
                            "admitted write on r{r} with a fence token the check cannot read ({e}): {}",
                            op.describe()
                        )
                    });
                    continue;
                }
            };
            if let Some((newer, node)) = token.iter().find_map(|(node, stamp)| {
                high.get(node)
                    .filter(|(hw, _)| *hw > stamp)
                    .map(|(_, by)| (*by, node))
            }) {
                v.found(|| {
                    format!(
                        "stale write admitted on r{r} (node {}): a newer grant had written first:\n    newer: {}\n    stale: {}",
                        node.get(..6).unwrap_or(node),
                        newer.describe(),
                        op.describe()
                    )
                });
            }
            for (node, stamp) in token.iter() {
                let e = high.entry(node.to_owned()).or_insert((stamp, op));
                if stamp > e.0 {
                    *e = (stamp, op);
                }
            }
        }
        // The final value counts every acknowledged write, and at most the unknown ones more.
        let count = acked.len() as i64;
        match finals.get(r as usize).copied().flatten() {
            Some(fin) if fin < count || fin > count + unknown => v.found(|| {
                format!(
                    "lost update on r{r}: the register ends at {fin} after {count} acknowledged writes ({unknown} unknown)"
                )
            }),
            _ => {}
        }
    }
    v
}

/// One client's claimed hold of a resource: from the grant's arrival to the earlier of the
/// release's invocation and the validity it still believed it had.
#[derive(Clone, Copy, Debug)]
struct Window<'a> {
    start: u64,
    end: u64,
    acquire: &'a Op,
}

/// Who holds a window: one hold of one client task. A task that abandoned a lock (a crashed
/// holder) and acquires it again before the old validity ran out is two holders at once.
fn holder(op: &Op) -> (u32, u32, u64) {
    (op.client, op.task, op.hold)
}

/// Mutual exclusion: no two holders' (holds') claimed validity windows on one resource
/// overlap.
pub fn mutual_exclusion(ops: &[Op], guaranteed: bool) -> Verdict {
    mutex(ops, guaranteed, None)
}

/// [`mutual_exclusion`] claimed outside `spans` (shared clock, ns): each is a fault beyond the
/// property's model, from its injection until it can no longer matter (see
/// `report::out_of_model_reach`). An overlap of two holders' windows that lies in no span fails
/// the run; those that lie in one are counted in [`Verdict::violations`] only. Before, one such
/// fault (a clock step beyond the drift allowance, say) left mutual exclusion unchecked for the
/// whole run.
/// `run`: the workload's start and end, for [`Outside::covered`].
pub fn mutual_exclusion_outside(ops: &[Op], spans: &[(u64, u64)], run: (u64, u64)) -> Verdict {
    let mut v = mutex(ops, false, Some(spans));
    if let Some(o) = v.outside.as_mut() {
        o.covered = covered(spans, run);
    }
    v
}

/// `spans` as sorted, disjoint intervals (overlapping or touching ones joined; empty ones
/// dropped).
fn merge(spans: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut sorted: Vec<(u64, u64)> = spans.iter().copied().filter(|(a, b)| a < b).collect();
    sorted.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
    for (a, b) in sorted {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// The share of `run` (start, end) inside the union of `spans`.
fn covered(spans: &[(u64, u64)], run: (u64, u64)) -> f64 {
    let (start, end) = run;
    if end <= start {
        return 0.0;
    }
    let clipped: Vec<(u64, u64)> = spans
        .iter()
        .map(|&(a, b)| (a.max(start), b.min(end)))
        .collect();
    let inside: u64 = merge(&clipped).iter().map(|(a, b)| b - a).sum();
    inside as f64 / (end - start) as f64
}

fn mutex(ops: &[Op], guaranteed: bool, spans: Option<&[(u64, u64)]>) -> Verdict {
    let mut v = Verdict::new("mutual exclusion", guaranteed);
    v.outside = spans.map(|s| Outside {
        around: "faults beyond its model",
        spans: s.len(),
        violations: 0,
        first: None,
        covered: 0.0,
    });
    // A hold can have several grants: re-claimed with its token after a crash (one release,
    // at the end), or after a failed release (a release between them). Each grant's window
    // ends at the first release of the hold invoked after it; a release extends (by the
    // renewals it counts) only the window of the last grant before it, and the others end at
    // their own claimed validity at the latest.
    type Hold = (u32, u32, u32, u64);
    let mut releases: HashMap<Hold, Vec<&Op>> = HashMap::new();
    for op in ops.iter().filter(|o| o.kind == Kind::Release) {
        releases
            .entry((op.client, op.task, op.resource, op.hold))
            .or_default()
            .push(op);
    }
    let mut grants: HashMap<Hold, Vec<u64>> = HashMap::new();
    for op in ops
        .iter()
        .filter(|o| o.kind == Kind::Acquire && o.outcome == Outcome::Ok)
    {
        grants
            .entry((op.client, op.task, op.resource, op.hold))
            .or_default()
            .push(op.complete);
    }
    for list in releases.values_mut() {
        list.sort_by_key(|r| r.invoke);
    }
    let mut windows: HashMap<u32, Vec<Window<'_>>> = HashMap::new();
    for op in ops
        .iter()
        .filter(|o| o.kind == Kind::Acquire && o.outcome == Outcome::Ok)
    {
        let Some(valid) = op.valid_until else {
            continue;
        };
        let hold = (op.client, op.task, op.resource, op.hold);
        let release = releases
            .get(&hold)
            .and_then(|list| list.iter().find(|r| r.invoke >= op.complete));
        let end = match release {
            Some(rel) => {
                // The last grant of the hold before this release: the one it releases.
                let latest = grants
                    .get(&hold)
                    .is_some_and(|g| !g.iter().any(|&at| at > op.complete && at <= rel.invoke));
                if latest {
                    rel.invoke.min(rel.valid_until.unwrap_or(valid))
                } else {
                    rel.invoke.min(valid)
                }
            }
            None => valid,
        };
        if end > op.complete {
            windows.entry(op.resource).or_default().push(Window {
                start: op.complete,
                end,
                acquire: op,
            });
        }
    }
    let mut resources: Vec<u32> = windows.keys().copied().collect();
    resources.sort_unstable();
    for r in resources {
        let ws = windows.get_mut(&r).expect("listed");
        ws.sort_by_key(|w| (w.start, w.end));
        let mut latest: Option<Window<'_>> = None;
        for w in ws.iter() {
            if let Some(l) = latest
                && w.start < l.end
                && holder(w.acquire) != holder(l.acquire)
            {
                let what = || {
                    format!(
                        "two holders of r{r} for {:.3} ms:\n    {} (claimed until {:.3} ms)\n    {} (claimed until {:.3} ms)",
                        (l.end.min(w.end) - w.start) as f64 / 1e6,
                        l.acquire.describe(),
                        l.end as f64 / 1e6,
                        w.acquire.describe(),
                        w.end as f64 / 1e6,
                    )
                };
                // A pair the fault caused lies inside its span: the later grant came after the
                // fault took effect, and the window the fault cut short ends within the span's
                // reach. One that only ran into a span began before the fault (review of the
                // first version); one that runs on past it outlived what the fault explains
                // (review of the second).
                let (from, to) = (w.start, l.end.min(w.end));
                if let (Some(o), Some(spans)) = (v.outside.as_mut(), spans)
                    && !spans.iter().any(|&(a, b)| a <= from && to <= b)
                {
                    o.violations += 1;
                    if o.first.is_none() {
                        o.first = Some(what());
                    }
                }
                v.found(what);
            }
            if latest.is_none_or(|l| w.end > l.end) {
                latest = Some(*w);
            }
        }
    }
    v
}

/// Progress: a resource that clients ask for is granted again within `patience` of its last
/// grant, away from faults. A failed acquire of a resource counts against it when no grant of
/// that resource completed from `patience` before the attempt began to its end, and the
/// attempt overlaps none of the `excused` intervals (each fault from its injection to the end
/// of its recovery allowance). Every such attempt after the same last grant is one stall, one
/// violation: the resource sat refused for longer than a holder may keep it. `run` is the
/// run's start and end; the start counts as a grant of every resource.
pub fn progress(ops: &[Op], excused: &[(u64, u64)], patience: u64, run: (u64, u64)) -> Verdict {
    let mut v = Verdict::new("progress", false);
    let start = run.0;
    let mut grants: HashMap<u32, Vec<u64>> = HashMap::new();
    for op in ops
        .iter()
        .filter(|o| o.kind == Kind::Acquire && o.outcome == Outcome::Ok)
    {
        grants.entry(op.resource).or_default().push(op.complete);
    }
    for list in grants.values_mut() {
        list.sort_unstable();
    }
    let merged = merge(excused);
    // Whether [from, to] overlaps an excused interval: the first one ending after `from`
    // must begin before `to`.
    let overlaps = |from: u64, to: u64| {
        merged
            .get(merged.partition_point(|&(_, b)| b <= from))
            .is_some_and(|&(a, _)| a < to)
    };
    let mut refused: Vec<&Op> = ops
        .iter()
        .filter(|o| o.kind == Kind::Acquire && o.outcome == Outcome::Fail)
        .filter(|o| !overlaps(o.invoke, o.complete))
        .collect();
    refused.sort_by_key(|o| (o.invoke, o.resource));
    // (resource, the last grant before the stall): one violation each.
    let mut stalls: std::collections::HashSet<(u32, Option<u64>)> = Default::default();
    for op in refused {
        let list = grants.get(&op.resource).map_or(&[][..], Vec::as_slice);
        let last = list[..list.partition_point(|&t| t <= op.complete)]
            .last()
            .copied();
        if last.unwrap_or(start).saturating_add(patience) >= op.invoke {
            continue;
        }
        if !stalls.insert((op.resource, last)) {
            continue;
        }
        v.found(|| {
            let since = last.map_or("since the run began".to_owned(), |t| {
                format!("for {:.3} ms", op.complete.saturating_sub(t) as f64 / 1e6)
            });
            format!(
                "r{} refused with no grant {since} (a holder may keep it {:.3} ms):\n    {}",
                op.resource,
                patience as f64 / 1e6,
                op.describe(),
            )
        });
    }
    // Every stall found lies outside the spans: only attempts that overlap none are judged.
    v.outside = Some(Outside {
        around: "faults and pause strikes, with their recovery",
        spans: excused.len(),
        violations: v.violations,
        first: v.first.clone(),
        covered: covered(excused, run),
    });
    v
}

/// Availability figures of one fault kind.
#[derive(Clone, Debug, Serialize)]
pub struct KindFigures {
    /// The fault kind.
    pub kind: FaultKind,
    /// How many were injected.
    pub count: usize,
    /// Successful acquisitions per second while faults of this kind lasted (`None` for
    /// instantaneous faults).
    pub rate_during: Option<f64>,
    /// Time from heal to the first successful acquisition after it: p50, p99 and max (ms);
    /// `None` when no acquisition followed any of them.
    pub recovery_ms: Option<[f64; 3]>,
    /// Faults after which no acquisition succeeded before the next fault or the end.
    pub never_recovered: usize,
}

/// Availability: acquisitions per second outside faults and during each kind, and recovery
/// time after heal.
#[derive(Clone, Debug, Serialize)]
pub struct Availability {
    /// Successful acquisitions per second outside every fault.
    pub rate_calm: f64,
    /// Per fault kind.
    pub kinds: Vec<KindFigures>,
}

/// Computes [`Availability`] for a run from `start` to `end` (shared clock, ns).
pub fn availability(ops: &[Op], faults: &[Applied], start: u64, end: u64) -> Availability {
    let mut grants: Vec<u64> = ops
        .iter()
        .filter(|o| o.kind == Kind::Acquire && o.outcome == Outcome::Ok)
        .map(|o| o.complete)
        .collect();
    grants.sort_unstable();
    let count_in =
        |a: u64, b: u64| grants.partition_point(|&t| t < b) - grants.partition_point(|&t| t < a);
    let secs = |ns: u64| ns as f64 / 1e9;
    let mut fault_time = 0;
    let mut in_faults = 0;
    let mut per: HashMap<FaultKind, (usize, u64, usize, Vec<f64>, usize)> = HashMap::new();
    for (i, f) in faults.iter().enumerate() {
        // An instantaneous fault (a clock step, a script flush) has no "during".
        let during = if f.fault.lasts.is_zero() {
            0
        } else {
            f.healed.saturating_sub(f.injected)
        };
        fault_time += during;
        let n = if during == 0 {
            0
        } else {
            count_in(f.injected, f.healed)
        };
        in_faults += n;
        let e = per.entry(f.fault.kind).or_default();
        e.0 += 1;
        e.1 += during;
        e.2 += n;
        let until = faults.get(i + 1).map_or(end, |g| g.injected);
        let first = grants.partition_point(|&t| t < f.healed);
        match grants.get(first) {
            Some(&t) if t < until => e.3.push((t - f.healed) as f64 / 1e6),
            _ => e.4 += 1,
        }
    }
    let calm = end.saturating_sub(start).saturating_sub(fault_time);
    let mut kinds: Vec<KindFigures> = per
        .into_iter()
        .map(|(kind, (count, time, n, mut rec, never))| {
            rec.sort_by(f64::total_cmp);
            KindFigures {
                kind,
                count,
                rate_during: (time > 0).then(|| n as f64 / secs(time)),
                recovery_ms: (!rec.is_empty())
                    .then(|| [pct(&rec, 0.5), pct(&rec, 0.99), rec[rec.len() - 1]]),
                never_recovered: never,
            }
        })
        .collect();
    kinds.sort_by_key(|k| k.kind);
    Availability {
        rate_calm: if calm > 0 {
            (grants.len() - in_faults) as f64 / secs(calm)
        } else {
            0.0
        },
        kinds,
    }
}

/// The `p` quantile of sorted `xs` (nearest rank).
fn pct(xs: &[f64], p: f64) -> f64 {
    let rank = ((p * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[rank - 1]
}

/// What was left behind by a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Leftovers {
    /// Lock keys still on a node a TTL after every client stopped (by node).
    pub keys: Vec<(usize, String)>,
    /// Panics caught during the run.
    pub panics: usize,
    /// Tokio tasks still alive after every client was dropped.
    pub tasks: usize,
    /// Operations that never completed (a client stuck at the end of the run).
    pub stuck: usize,
}

/// Hygiene: no lock key left, no panic, no task leaked, no operation stuck.
pub fn hygiene(left: &Leftovers) -> Verdict {
    let mut v = Verdict::new("hygiene", true);
    if !left.keys.is_empty() {
        v.found(|| {
            let keys: Vec<String> = left
                .keys
                .iter()
                .take(5)
                .map(|(n, k)| format!("node {n}: {k}"))
                .collect();
            format!(
                "{} lock keys left after the run: {}",
                left.keys.len(),
                keys.join(", ")
            )
        });
    }
    if left.panics > 0 {
        v.found(|| format!("{} panics", left.panics));
    }
    if left.tasks > 0 {
        v.found(|| {
            format!(
                "{} tokio tasks still alive after the clients were dropped",
                left.tasks
            )
        });
    }
    if left.stuck > 0 {
        v.found(|| format!("{} operations never completed", left.stuck));
    }
    v
}

/// Duration in milliseconds, for figures.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: u32, hold: u64, kind: Kind, outcome: Outcome, invoke: u64, complete: u64) -> Op {
        Op {
            client,
            task: 0,
            resource: 0,
            hold,
            kind,
            outcome,
            invoke,
            complete,
            valid_until: None,
            fence: None,
            read: None,
            wrote: None,
            error: None,
        }
    }

    fn hold(client: u32, hold_no: u64, from: u64, valid: u64, release: Option<u64>) -> Vec<Op> {
        let mut a = op(client, hold_no, Kind::Acquire, Outcome::Ok, from - 1, from);
        a.valid_until = Some(valid);
        let mut ops = vec![a];
        if let Some(at) = release {
            let mut r = op(client, hold_no, Kind::Release, Outcome::Ok, at, at + 1);
            r.valid_until = Some(valid);
            ops.push(r);
        }
        ops
    }

    fn write(client: u32, fence: &str, read: i64, outcome: Outcome, at: u64) -> Op {
        let mut w = op(client, 0, Kind::Write, outcome, at, at + 1);
        w.fence = Some(fence.to_owned());
        w.read = Some(read);
        w.wrote = Some(read + 1);
        w
    }

    #[test]
    fn overlapping_windows_of_two_clients_are_found() {
        // Client 0 claims 10..100 (released at 100); client 1 is granted at 90.
        let mut ops = hold(0, 1, 10, 200, Some(100));
        ops.extend(hold(1, 1, 90, 300, Some(150)));
        let v = mutual_exclusion(&ops, true);
        assert_eq!(v.violations, 1, "{v:?}");
        assert!(v.fails());
        assert!(v.first.unwrap().contains("two holders of r0"));
    }

    #[test]
    fn windows_end_at_the_release_or_the_validity_whichever_is_first() {
        // Released at 100: the next grant at 100 is fine.
        let mut ops = hold(0, 1, 10, 200, Some(100));
        ops.extend(hold(1, 1, 100, 300, Some(150)));
        // Abandoned (no release): its window ends at its validity, 400.
        ops.extend(hold(2, 1, 160, 400, None));
        ops.extend(hold(0, 2, 400, 500, Some(450)));
        assert_eq!(mutual_exclusion(&ops, true).violations, 0);
        // A grant before the abandoned validity ran out is a violation.
        ops.extend(hold(1, 2, 399, 600, Some(420)));
        assert_eq!(mutual_exclusion(&ops, true).violations, 2);
        // A task that walked away from its lock (no release) and is granted it again while
        // the old validity runs is two holders, though one task.
        let mut again = hold(2, 1, 10, 200, None);
        again.extend(hold(2, 2, 150, 300, Some(250)));
        assert_eq!(mutual_exclusion(&again, true).violations, 1);
        // Failed or unknown acquisitions claim nothing.
        let mut ops = hold(0, 1, 10, 200, Some(100));
        let mut a = op(1, 1, Kind::Acquire, Outcome::Unknown, 40, 50);
        a.valid_until = Some(300);
        ops.push(a);
        assert_eq!(mutual_exclusion(&ops, true).violations, 0);
    }

    /// The workload's start and end in the span tests.
    const RUN: (u64, u64) = (0, 2_000);

    #[test]
    fn the_share_of_a_run_inside_spans_counts_overlaps_once() {
        assert_eq!(covered(&[], (0, 100)), 0.0);
        assert_eq!(covered(&[(10, 20), (15, 30), (90, 200)], (0, 100)), 0.3);
        assert_eq!(covered(&[(0, 1_000)], (100, 200)), 1.0);
        assert_eq!(covered(&[(10, 20)], (50, 50)), 0.0);
    }

    #[test]
    fn two_holders_outside_every_out_of_model_span_fail_the_run() {
        // Two overlaps: client 1 inside client 0's window at 90..100, client 3 inside client
        // 2's at 1,050..1,100.
        let mut ops = hold(0, 1, 10, 200, Some(100));
        ops.extend(hold(1, 1, 90, 300, Some(150)));
        ops.extend(hold(2, 1, 1_000, 1_200, Some(1_100)));
        ops.extend(hold(3, 1, 1_050, 1_300, Some(1_150)));
        // Not claimed at all (the old rule for a run with such a fault): found, fails nothing.
        let v = mutual_exclusion(&ops, false);
        assert_eq!(v.violations, 2);
        assert!(!v.fails());
        // A span over the first overlap only: the second fails the run.
        let v = mutual_exclusion_outside(&ops, &[(0, 100)], RUN);
        assert_eq!(v.violations, 2, "{v:?}");
        let o = v.outside.as_ref().expect("claimed outside the span");
        assert_eq!((o.spans, o.violations), (1, 1));
        assert!(o.first.as_deref().unwrap().contains("client 3"), "{o:?}");
        assert!(v.fails());
        // Spans in which both overlaps begin: nothing fails.
        let v = mutual_exclusion_outside(&ops, &[(0, 100), (1_050, 2_000)], RUN);
        assert_eq!(v.outside.as_ref().map(|o| o.violations), Some(0));
        assert!(!v.fails());
        // A span the second overlap (1,050..1,100) only runs into: that pair began before the
        // fault, which cannot explain it (review: a span touching the overlap excused it).
        let v = mutual_exclusion_outside(&ops, &[(0, 100), (1_060, 2_000)], RUN);
        assert_eq!(v.outside.as_ref().map(|o| o.violations), Some(1));
        assert!(v.fails());
        // A span the overlap begins in but outlasts: the pair held on past what the fault
        // explains (review: only the beginning was looked at).
        let v = mutual_exclusion_outside(&ops, &[(0, 100), (1_000, 1_080)], RUN);
        assert_eq!(v.outside.as_ref().map(|o| o.violations), Some(1));
        assert!(v.fails());
    }

    #[test]
    fn a_hold_reclaimed_after_a_failed_release_ends_its_first_window_there() {
        // Client 0's hold 1 is granted at 10 (valid until 500); its release, invoked at 100,
        // fails; it re-claims at 300 (valid until 600) and releases at 400.
        let mut hold1 = hold(0, 1, 10, 500, Some(100));
        hold1.extend(hold(0, 1, 300, 600, Some(400)));
        // Another client granted between the failed release and the re-claim: one holder at
        // a time (the first holder gave the lock up at 100).
        let mut ops = hold1.clone();
        ops.extend(hold(1, 1, 150, 250, Some(200)));
        assert_eq!(mutual_exclusion(&ops, true).violations, 0);
        // Granted inside the re-claim's window: found.
        let mut ops = hold1;
        ops.extend(hold(1, 1, 350, 700, Some(380)));
        assert_eq!(mutual_exclusion(&ops, true).violations, 1);
    }

    #[test]
    fn a_reclaimed_hold_ends_its_first_window_at_its_own_validity() {
        // Client 0's hold 1 is granted at 10 (valid until 100), its holder crashes, and its
        // successor re-claims it at 300 with the token (valid until 600), releasing at 400.
        let mut ops = hold(0, 1, 10, 100, None);
        ops.extend(hold(0, 1, 300, 600, Some(400)));
        // Client 1 held the lock between the two: no overlap with either window.
        ops.extend(hold(1, 1, 150, 250, Some(200)));
        assert_eq!(mutual_exclusion(&ops, true).violations, 0);
        // The re-claim overlapping its own first grant is one holder, and its release ends
        // the first grant's window too.
        let mut same = hold(0, 1, 10, 900, None);
        same.extend(hold(0, 1, 150, 600, Some(400)));
        same.extend(hold(1, 1, 450, 800, Some(500)));
        assert_eq!(mutual_exclusion(&same, true).violations, 0);
        // Another client granted inside the first window, or inside the re-claim's: found.
        let mut ops = hold(0, 1, 10, 100, None);
        ops.extend(hold(0, 1, 300, 600, Some(400)));
        ops.extend(hold(1, 1, 90, 250, Some(200)));
        ops.extend(hold(2, 1, 350, 700, Some(500)));
        assert_eq!(mutual_exclusion(&ops, true).violations, 2);
    }

    #[test]
    fn a_paused_holder_whose_stale_write_was_admitted_is_found() {
        // Grant A (n1=10,n2=10) reads 0, pauses; grant B (n1=20,n2=20) reads 0 and writes 1;
        // A's write of 1 is admitted after B's.
        let ops = vec![
            write(1, "f1,n1=20,n2=20", 0, Outcome::Ok, 100),
            write(0, "f1,n1=10,n2=10", 0, Outcome::Ok, 200),
        ];
        let v = fenced_register(&ops, &[Some(1)], true);
        // A lost update (two writes of 1, one fewer in the register) and a stale admission.
        assert_eq!(v.violations, 3, "{v:?}");
        assert!(v.first.unwrap().contains("lost update"));
        // Ordered writes of increasing grants: clean.
        let ops = vec![
            write(0, "f1,n1=10,n2=10", 0, Outcome::Ok, 100),
            write(1, "f1,n1=20,n3=5", 1, Outcome::Ok, 200),
            write(0, "f1,n1=10,n2=10", 1, Outcome::Fail, 300),
            write(2, "f1,n2=30,n3=6", 2, Outcome::Unknown, 400),
        ];
        assert_eq!(fenced_register(&ops, &[Some(2)], true).violations, 0);
        assert_eq!(fenced_register(&ops, &[Some(3)], true).violations, 0);
        assert_eq!(fenced_register(&ops, &[Some(4)], true).violations, 1);
        assert_eq!(fenced_register(&ops, &[Some(1)], true).violations, 1);
        // A stale grant admitted with a fresh value is still found.
        let ops = vec![
            write(1, "f1,n1=20,n2=20", 0, Outcome::Ok, 100),
            write(0, "f1,n1=10,n2=30", 1, Outcome::Ok, 200),
        ];
        let v = fenced_register(&ops, &[Some(2)], true);
        assert_eq!(v.violations, 1);
        assert!(v.first.unwrap().contains("stale write admitted"));
    }

    #[test]
    fn an_admitted_write_whose_token_cannot_be_read_is_found() {
        // A stale grant whose token is not in the text form (here a future version) would
        // have been skipped by a check that drops what it cannot parse.
        let ops = vec![
            write(1, "f1,n1=20,n2=20", 0, Outcome::Ok, 100),
            write(0, "f2,n1=10,n2=30", 1, Outcome::Ok, 200),
        ];
        let v = fenced_register(&ops, &[Some(2)], true);
        assert_eq!(v.violations, 1, "{v:?}");
        assert!(v.first.unwrap().contains("cannot read"));
    }

    #[test]
    fn recovery_is_the_time_from_heal_to_the_next_grant() {
        use crate::nemesis::{Fault, InModel};
        let grant = |t: u64| {
            let mut o = op(0, t, Kind::Acquire, Outcome::Ok, t - 1, t);
            o.valid_until = Some(t + 10);
            o
        };
        let ops: Vec<Op> = [1, 2, 3, 50_000_000, 2_030_000_000, 2_040_000_000]
            .into_iter()
            .map(grant)
            .collect();
        let fault = |injected: u64, healed: u64| Applied {
            fault: Fault {
                id: 0,
                kind: FaultKind::Partition,
                at: Duration::ZERO,
                lasts: Duration::from_secs(1),
                nodes: vec![0],
                client: None,
                amount: Duration::ZERO,
                jitter: Duration::ZERO,
            },
            injected,
            healed,
            in_model: InModel {
                mutex: true,
                fenced: true,
            },
            error: None,
        };
        let faults = [
            fault(1_000_000_000, 2_000_000_000),
            fault(3_000_000_000, 4_000_000_000),
        ];
        let a = availability(&ops, &faults, 0, 5_000_000_000);
        let k = &a.kinds[0];
        assert_eq!(k.count, 2);
        assert_eq!(k.never_recovered, 1);
        assert_eq!(k.recovery_ms, Some([30.0, 30.0, 30.0]));
        assert_eq!(k.rate_during, Some(0.0));
        assert!((a.rate_calm - 6.0 / 3.0).abs() < 1e-9, "{}", a.rate_calm);
    }

    /// A resource refused for longer than a holder may keep it, away from faults, is a stall:
    /// one per last grant however many attempts it refused; not within the patience of a
    /// grant of that resource or of the run's start, nor for an attempt that overlaps a
    /// fault's interval.
    #[test]
    fn a_resource_refused_past_the_patience_away_from_faults_is_a_stall() {
        let refused = |resource: u32, at: u64| {
            let mut o = op(1, at, Kind::Acquire, Outcome::Fail, at, at + 100);
            o.resource = resource;
            o.error = Some("Busy".into());
            o
        };
        let grant = |resource: u32, at: u64| {
            let mut o = op(0, at, Kind::Acquire, Outcome::Ok, at - 1, at);
            o.resource = resource;
            o
        };
        // Patience 1,000: r0 granted at 500 may be refused until 1,500.
        let mut ops = vec![
            grant(0, 500),
            refused(0, 1_200),
            refused(0, 1_600),
            refused(0, 2_000),
        ];
        let v = progress(&ops, &[], 1_000, (0, 10_000));
        assert_eq!(v.violations, 1, "{v:?}");
        assert!(v.fails());
        let first = v.first.expect("a stall is described");
        assert!(
            first.contains("r0 refused with no grant for 0.001 ms"),
            "{first}"
        );
        // Both late attempts overlap a fault's interval: nothing judged against them.
        let v = progress(&ops, &[(1_650, 1_700), (1_900, 2_050)], 1_000, (0, 10_000));
        assert_eq!(v.violations, 0, "{v:?}");
        let o = v.outside.expect("claimed away from the faults");
        assert_eq!((o.spans, o.violations), (2, 0));
        assert!(
            (o.covered - 200.0 / 10_000.0).abs() < 1e-12,
            "{}",
            o.covered
        );
        // A grant of another resource does not count; a new grant of r0 starts a new wait,
        // and a second stall after it is a second violation.
        ops.extend([grant(1, 1_550), grant(0, 2_500), refused(0, 3_000)]);
        assert_eq!(progress(&ops, &[], 1_000, (0, 10_000)).violations, 1);
        ops.push(refused(0, 3_600));
        assert_eq!(progress(&ops, &[], 1_000, (0, 10_000)).violations, 2);
        // The run's start counts as a grant of every resource.
        assert_eq!(
            progress(&[refused(2, 800)], &[], 1_000, (0, 10_000)).violations,
            0
        );
        let v = progress(&[refused(2, 1_200)], &[], 1_000, (0, 10_000));
        assert_eq!(v.violations, 1);
        assert!(v.first.unwrap().contains("since the run began"));
        assert_eq!(
            progress(&[refused(2, 1_200)], &[], 1_000, (300, 10_000)).violations,
            0
        );
    }

    #[test]
    fn leftovers_fail_hygiene() {
        assert_eq!(hygiene(&Leftovers::default()).violations, 0);
        let left = Leftovers {
            keys: vec![(1, "redlock:lock:r0".into())],
            panics: 1,
            ..Leftovers::default()
        };
        let v = hygiene(&left);
        assert_eq!(v.violations, 2);
        assert!(v.fails());
    }
}
