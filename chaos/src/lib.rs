//! `redlock-chaos`: a Jepsen-style checker for the Redlock client.
//!
//! Clients contend for a few resources and read-modify-write a register per resource through a
//! fence while a nemesis injects faults — into real `redis-server` processes, or into
//! simulated nodes on a paused clock — and checkers go over the recorded history: fenced
//! register, mutual exclusion of claimed validity windows, progress (no resource refused for
//! longer than a holder may keep it, away from faults), availability and recovery, hygiene.
//! See `docs/guarantees.md` for what each fault is claimed to leave standing and the runs that
//! show it.

#![forbid(unsafe_code)]

pub mod check;
pub mod history;
pub mod nemesis;
pub mod options;
pub mod procs;
pub mod real;
pub mod real_faults;
pub mod registers;
pub mod report;
pub mod sim;
pub mod workload;
