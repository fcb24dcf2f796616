//! A bench run stopped by a signal stops the servers it started: it used to leave its
//! redis-server processes running after it was gone.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The server processes the bench may start (the testkit honours `REDLOCK_TEST_SERVER`).
const SERVERS: [&str; 2] = ["redis-server", "valkey-server"];

/// The processes whose parent is `parent` and whose name is one of `names`, from `/proc`.
fn children(parent: u32, names: &[&str]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // `pid (comm) state ppid …`; comm may hold spaces, so split after the last ')'.
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let comm = head.split_once('(').map(|(_, c)| c).unwrap_or("");
            let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
            names.contains(&comm) && ppid == Some(parent)
        })
        .collect()
}

/// Whether `pid` still runs (a zombie waiting to be reaped does not count).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn stopped_by(signal: Signal) {
    let mut bench = Command::new(env!("CARGO_BIN_EXE_redlock-bench"))
        .args(["--quick", "--only", "latency"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start redlock-bench");
    let pid = bench.id();
    // Wait until it runs its servers.
    let started = Instant::now();
    let servers = loop {
        let servers = children(pid, &SERVERS);
        if servers.len() >= 5 {
            break servers;
        }
        if started.elapsed() > Duration::from_secs(30) || bench.try_wait().unwrap().is_some() {
            let _ = bench.kill();
            panic!(
                "redlock-bench started no servers: {:?}",
                bench.wait_with_output()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    kill(Pid::from_raw(pid as i32), signal).expect("signal the bench");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = bench.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "redlock-bench did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let left: Vec<u32> = servers.iter().copied().filter(|&s| running(s)).collect();
    // Whatever the outcome, leave no server behind.
    for &s in &left {
        let _ = kill(Pid::from_raw(s as i32), Signal::SIGKILL);
    }
    let stderr = std::io::read_to_string(bench.stderr.take().unwrap()).unwrap_or_default();
    assert!(left.is_empty(), "servers left running: {left:?}");
    assert_eq!(status.code(), Some(130), "{status:?}; stderr: {stderr}");
    assert!(
        stderr.contains(&format!("stopped by {}", signal.as_str())),
        "{stderr}"
    );
}

#[test]
fn sigterm_stops_the_servers_it_started() {
    stopped_by(Signal::SIGTERM);
}

#[test]
fn sigint_stops_the_servers_it_started() {
    stopped_by(Signal::SIGINT);
}
