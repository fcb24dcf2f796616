//! The history of a run: every operation a client invoked, with its outcome, on one clock that
//! every client (thread or process) of the run shares.

use serde::{Deserialize, Serialize};

/// A clock shared by every client of a run, in nanoseconds.
///
/// Real runs read `CLOCK_MONOTONIC`, which on Linux is one system-wide clock, so readings of
/// separate processes on one machine can be compared. Simulated runs read tokio's (paused)
/// clock.
pub trait Clock: Send + Sync {
    /// Now, in nanoseconds since an arbitrary origin fixed for the run.
    fn now(&self) -> u64;
}

/// `CLOCK_MONOTONIC`, the clock `std::time::Instant` and tokio's `Instant` read on Linux.
#[derive(Clone, Copy, Debug, Default)]
pub struct Monotonic;

impl Clock for Monotonic {
    fn now(&self) -> u64 {
        // Never fails for CLOCK_MONOTONIC on Linux; 0 would only make windows look earlier.
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
            .unwrap_or(0)
    }
}

/// Tokio's clock (paused in simulations), from a fixed origin.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl TokioClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        (tokio::time::Instant::now() - self.origin).as_nanos() as u64
    }
}

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Acquire the resource's lock.
    Acquire,
    /// Read-modify-write of the resource's register (through the fence unless fencing is off).
    Write,
    /// Release the lock (or stop claiming it, when it was abandoned or lost).
    Release,
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It happened: the lock was granted, the write admitted, the release done.
    Ok,
    /// It did not happen: refused, busy, rejected by the fence.
    Fail,
    /// It may or may not have happened (a timeout, a broken connection).
    Unknown,
}

/// One operation, invoked and completed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Op {
    /// Client number (one `Redlock`, one runtime or process).
    pub client: u32,
    /// The client's task doing the operation: each task is a separate holder.
    pub task: u32,
    /// Resource number.
    pub resource: u32,
    /// The task's hold this operation belongs to (counts the task's acquisitions).
    pub hold: u64,
    /// What it does.
    pub kind: Kind,
    /// How it ended.
    pub outcome: Outcome,
    /// Invocation time, on the run's clock (ns).
    pub invoke: u64,
    /// Completion time, on the run's clock (ns).
    pub complete: u64,
    /// Acquire: end of the claimed validity. Release: the validity the client still believed it
    /// had when it stopped claiming (after renewals).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub valid_until: Option<u64>,
    /// The grant's fence token (text form) for acquire and write.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fence: Option<String>,
    /// Write: the register value read.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub read: Option<i64>,
    /// Write: the value written (read + 1).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub wrote: Option<i64>,
    /// Why it failed or is unknown (the error's kind, never a secret).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}

impl Op {
    /// A one-line description used in violation reports.
    pub fn describe(&self) -> String {
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut s = format!(
            "client {}.{} hold {} {:?} r{} {:?} [{:.3} ms → {:.3} ms]",
            self.client,
            self.task,
            self.hold,
            self.kind,
            self.resource,
            self.outcome,
            ms(self.invoke),
            ms(self.complete)
        );
        if let Some(v) = self.valid_until {
            s.push_str(&format!(" valid until {:.3} ms", ms(v)));
        }
        if let (Some(r), Some(w)) = (self.read, self.wrote) {
            s.push_str(&format!(" read {r} wrote {w}"));
        }
        if let Some(f) = &self.fence {
            s.push_str(&format!(" token {}", short_fence(f)));
        }
        if let Some(e) = &self.error {
            s.push_str(&format!(" ({e})"));
        }
        s
    }
}

/// A fence token shortened for reading: node names cut to 6 characters.
pub fn short_fence(text: &str) -> String {
    text.split(',')
        .map(|claim| match claim.split_once('=') {
            Some((node, stamp)) => format!("{}={stamp}", &node[..node.len().min(6)]),
            None => claim.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}
