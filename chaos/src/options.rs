//! The settings of one run, shared by real and simulated runs.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::nemesis::{Kind, Model};

/// Where the registers live and which fence guards them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FenceBackend {
    /// In the process (`MemoryFence`); in-process clients only.
    Memory,
    /// On a separate redis-server (`RedisFence`).
    Redis,
    /// In a PostgreSQL table (`PgFence`).
    Pg,
}

impl FenceBackend {
    /// Parses `memory`, `redis` or `pg`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "memory" => Some(Self::Memory),
            "redis" => Some(Self::Redis),
            "pg" | "postgres" => Some(Self::Pg),
            _ => None,
        }
    }
}

impl fmt::Display for FenceBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Memory => "memory",
            Self::Redis => "redis",
            Self::Pg => "pg",
        })
    }
}

/// Every setting of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    /// Seed of the fault schedule and of the clients' choices.
    pub seed: u64,
    /// Length of the workload.
    pub duration: Duration,
    /// Lock nodes.
    pub nodes: usize,
    /// Clients (each its own `Redlock`).
    pub clients: usize,
    /// Concurrent holders per client.
    pub tasks: u32,
    /// Resources contended for.
    pub resources: u32,
    /// Fault kinds drawn by the schedule (empty: no faults).
    pub nemesis: Vec<Kind>,
    /// Where the registers live.
    pub fence: FenceBackend,
    /// Writes go through the fence.
    pub fencing: bool,
    /// Restart quarantine on (TTL + 1 s).
    pub quarantine: bool,
    /// The client's drift factor.
    pub drift_factor: f64,
    /// The lock's TTL.
    pub ttl: Duration,
    /// Size of forward clock steps (`None`: 30–60 % of the TTL).
    pub jump: Option<Duration>,
    /// Each client in its own OS process.
    pub processes: bool,
}

impl Settings {
    /// The drift allowance the client applies: TTL × drift factor + 2 ms.
    pub fn drift_allowance(&self) -> Duration {
        self.ttl.mul_f64(self.drift_factor) + Duration::from_millis(2)
    }

    /// The restart quarantine, when on: the TTL plus a second (Redis reports uptime in whole
    /// seconds).
    pub fn quarantine_time(&self) -> Option<Duration> {
        self.quarantine.then(|| self.ttl + Duration::from_secs(1))
    }

    /// What the configuration promises.
    pub fn model(&self) -> Model {
        Model {
            fencing: self.fencing,
            quarantine: self.quarantine,
            ttl: self.ttl,
            drift_allowance: self.drift_allowance(),
            quarantine_time: self.quarantine_time().unwrap_or_default(),
            snapshot_stamps: true,
        }
    }

    /// Client `id`'s part of the workload, until `until`.
    pub fn plan(&self, id: usize, until: tokio::time::Instant) -> crate::workload::ClientPlan {
        crate::workload::ClientPlan {
            id: id as u32,
            resources: self.resources,
            seed: self.seed,
            until,
            fencing: self.fencing,
            hold: self.hold(),
            tasks: self.tasks,
        }
    }

    /// How long a guarded hold lasts: past three renewals.
    pub fn hold(&self) -> Duration {
        self.ttl.mul_f64(1.2)
    }

    /// The checkers this run is a negative control for: configurations that leave out a
    /// safeguard, whose violation the run must find.
    pub fn controls(&self) -> Vec<&'static str> {
        let mut c = Vec::new();
        if !self.fencing {
            c.push("fenced register");
        }
        if !self.quarantine || self.drift_factor == 0.0 {
            c.push("mutual exclusion");
        }
        c
    }
}

/// Parses `90s`, `2m`, `500ms`, `1h` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or((s, "s"), |i| (&s[..i], &s[i..]));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (like 60s, 2m, 500ms)"))?;
    let secs = match unit {
        "ms" => n / 1e3,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (ms, s, m, h)")),
    };
    if !secs.is_finite() || !(0.0..=86_400.0 * 7.0).contains(&secs) {
        return Err(format!("`{s}` is out of range (0 to 7 days)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `mixed` (every in-model kind), `all`, `none` or a comma-separated list of kinds.
pub fn parse_nemesis(s: &str) -> Result<Vec<Kind>, String> {
    match s {
        "none" => Ok(Vec::new()),
        "all" => Ok(Kind::ALL.to_vec()),
        "mixed" => Ok(Kind::ALL
            .into_iter()
            .filter(|k| *k != Kind::ClockForward)
            .collect()),
        list => list
            .split(',')
            .map(|name| {
                Kind::parse(name.trim()).ok_or_else(|| {
                    let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "unknown nemesis `{name}`; one of: mixed, all, none, {}",
                        names.join(", ")
                    )
                })
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_nemeses_parse_or_say_why_not() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(
            parse_duration("3 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("99999999h").is_err());
        assert_eq!(parse_nemesis("pause").unwrap(), vec![Kind::Pause]);
        assert_eq!(
            parse_nemesis("kill,delay").unwrap(),
            vec![Kind::Kill, Kind::Delay]
        );
        assert!(
            !parse_nemesis("mixed")
                .unwrap()
                .contains(&Kind::ClockForward)
        );
        assert!(
            parse_nemesis("meteor")
                .unwrap_err()
                .contains("one of: mixed")
        );
    }
}
