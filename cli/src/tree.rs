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

/// Asks the kernel to re-parent the orphans of this process's descendants to it; `false` when
/// that is not available (not Linux, or refused): then only the command itself is signalled.
pub(crate) fn adopt_orphans() -> bool {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_child_subreaper(true).is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// One process as `/proc/<pid>/stat` shows it.
struct Entry {
    pid: i32,
    parent: i32,
    zombie: bool,
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
        let state = rest.next()?;
        let parent = rest.next()?.parse().ok()?;
        Some(Entry {
            pid,
            parent,
            zombie: matches!(state, "Z" | "X"),
        })
    })
    .collect()
}

/// The live descendants of this process: its children (the command, and orphans it adopted),
/// their children, and so on.
pub(crate) fn descendants() -> Vec<Pid> {
    let all = processes();
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let mut found = Vec::new();
    let mut parents = vec![me];
    while let Some(parent) = parents.pop() {
        for e in all.iter().filter(|e| e.parent == parent) {
            parents.push(e.pid);
            if !e.zombie {
                found.push(Pid::from_raw(e.pid));
            }
        }
    }
    found
}

/// Sends `signal` to every live descendant; how many there were.
pub(crate) fn signal_all(signal: Signal) -> usize {
    let all = descendants();
    for &pid in &all {
        let _ = kill(pid, signal);
    }
    all.len()
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
