//! The processes a command started, for `run` to stop all of them when the lock is lost.
//!
//! Signalling only the command's own process leaves what it started running: a shell killed by
//! SIGTERM does not pass it on to its children, and a daemon that forked twice has no parent
//! to pass it on. On Linux, `run` therefore makes itself the *child subreaper* of its
//! descendants before it starts the command (orphans are re-parented to it, not to init), and
//! finds them by walking `/proc` from its own process id. Elsewhere only the command itself is
//! known.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Asks the kernel to re-parent the orphans of this process's descendants to it; `Ok(false)`
/// when that is not available (not Linux), an error when the kernel refused (a seccomp
/// sandbox): either way only the command itself is signalled.
pub(crate) fn adopt_orphans() -> Result<bool, nix::Error> {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_child_subreaper(true).map(|()| true)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Ok(false)
    }
}

/// One process as `/proc/<pid>/stat` shows it.
struct Entry {
    pid: i32,
    parent: i32,
}

/// Every process `/proc` lists (those that vanish while it is read are skipped).
fn processes() -> Vec<Entry> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid …`; the command name may hold spaces and parentheses.
        let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
        let _state = rest.next()?;
        let parent = rest.next()?.parse().ok()?;
        Some(Entry { pid, parent })
    })
    .collect()
}

/// The descendants of this process `/proc` shows now: its children (the command, and orphans
/// it adopted), their children, and so on. Zombies are included: a process whose main thread
/// ended while its other threads run shows as one, and signalling a real zombie does nothing.
/// A process that forks while `/proc` is read may be missed; see [`stop_all`].
pub(crate) fn descendants() -> Vec<Pid> {
    let all = processes();
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let mut found = Vec::new();
    let mut parents = vec![me];
    while let Some(parent) = parents.pop() {
        for e in all.iter().filter(|e| e.parent == parent) {
            parents.push(e.pid);
            found.push(Pid::from_raw(e.pid));
        }
    }
    found
}

/// Sends `signal` to every descendant found; how many there were.
pub(crate) fn signal_all(signal: Signal) -> usize {
    let all = descendants();
    for &pid in &all {
        let _ = kill(pid, signal);
    }
    all.len()
}

/// Scans for the descendants repeatedly, stopping (SIGSTOP) each one found, until a scan finds
/// none it had not stopped (at most [`FREEZE_SCANS`] scans), then sends SIGKILL to all of them.
/// A stopped process cannot fork, so a process tree that forks while it is being killed (a job
/// runner, a process moving to a new pid by forking and exiting) cannot outrun the scans, as it
/// could a single SIGKILL pass. The process groups the stopped processes lead or belong to,
/// except this process's own, get the signals too.
pub(crate) fn stop_all() {
    let own_group = nix::unistd::getpgrp();
    let mut stopped: std::collections::HashSet<Pid> = std::collections::HashSet::new();
    let mut groups: std::collections::HashSet<Pid> = std::collections::HashSet::new();
    for _ in 0..FREEZE_SCANS {
        let new: Vec<Pid> = descendants()
            .into_iter()
            .filter(|p| !stopped.contains(p))
            .collect();
        if new.is_empty() {
            break;
        }
        for pid in new {
            let _ = kill(pid, Signal::SIGSTOP);
            if let Ok(group) = nix::unistd::getpgid(Some(pid))
                && group != own_group
                && groups.insert(group)
            {
                let _ = kill(Pid::from_raw(-group.as_raw()), Signal::SIGSTOP);
            }
            stopped.insert(pid);
        }
    }
    for &group in &groups {
        let _ = kill(Pid::from_raw(-group.as_raw()), Signal::SIGKILL);
    }
    for &pid in &stopped {
        let _ = kill(pid, Signal::SIGKILL);
    }
}

/// Scans [`stop_all`] makes at most in one call.
const FREEZE_SCANS: usize = 64;

/// Whether this process has no child left, living or dead. As the child subreaper of its
/// descendants, it then has no descendant either: the kernel's answer, not a scan of `/proc`
/// that a forking process can slip through.
pub(crate) fn none_left() -> bool {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    matches!(waitid(Id::All, peek), Err(nix::errno::Errno::ECHILD))
}

/// Collects the exit status of adopted orphans that died, so they do not stay zombies while
/// `run` runs; `command`, whose status the runtime collects, is left alone (and while it is a
/// zombie itself, the others wait for the next call).
pub(crate) fn reap_adopted(command: Option<Pid>) {
    use nix::sys::wait::{Id, WaitPidFlag, waitid, waitpid};
    // Peek at one dead child without collecting it; collect it unless it is the command.
    let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    while let Ok(status) = waitid(Id::All, peek) {
        match status.pid() {
            Some(pid) if Some(pid) != command => {
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
            }
            _ => return,
        }
    }
}
