//! `redlock run` against real redis-server processes: environment, exit codes, contention,
//! signals, loss of the lock, and releasing.

mod common;

use std::time::Duration;

use common::{finish, nodes, output, redlock, steal, wait_for_file, wait_for_key};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redlock_testkit::Cluster;

#[tokio::test]
async fn passes_resource_and_fence_token_and_returns_the_exit_code() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("env");
    let script = format!(
        "printf '%s|%s' \"$REDLOCK_RESOURCE\" \"$REDLOCK_FENCE_TOKEN\" > {}; exit 7",
        seen.display()
    );
    let mut cmd = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "orders:42",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    // An outer lock's token must not leak into this one.
    cmd.env("REDLOCK_FENCE_TOKEN", "f1,stale=1");
    let out = output(cmd).await;
    assert_eq!(out.code, Some(7), "{out:?}");
    let env = std::fs::read_to_string(&seen).unwrap();
    let (resource, token) = env.split_once('|').unwrap();
    assert_eq!(resource, "orders:42");
    let token: fencing::FenceToken = token.parse().expect("a fence token in its text form");
    // Every node's claim, not only the deciding quorum's (`Lock::fence_settled`).
    assert_eq!(token.len(), 3, "every node's claim: {token}");
    // Released when the command exited.
    assert!(cluster.keys("redlock:lock:*").await.is_empty());
}

#[tokio::test]
async fn a_busy_lock_exits_75_after_the_wait() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let holder_script = format!("while [ ! -e {} ]; do sleep 0.02; done", stop.display());
    let holder = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script,
    ])
    .spawn()
    .unwrap();
    wait_for_key(&cluster, "redlock:lock:job", 3).await;

    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "job",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(
        out.stderr.contains("locked by another owner"),
        "{}",
        out.stderr
    );

    let started = std::time::Instant::now();
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--wait",
        "400ms",
        "job",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.code, Some(75), "{out:?}");
    // It kept trying: no attempt starts after the wait, so the last one may start up to one
    // retry delay (100 ms ± 50 ms) before the wait is over.
    assert!(started.elapsed() >= Duration::from_millis(250), "it waited");

    std::fs::write(&stop, "").unwrap();
    let held = finish(holder).await;
    assert_eq!(held.code, Some(0), "{held:?}");

    // Free again: a waiting run gets it.
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--wait",
        "2s",
        "job",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[tokio::test]
async fn sigterm_to_redlock_reaches_the_command() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let got = dir.path().join("got");
    let script = format!(
        "trap 'echo term > {}; exit 42' TERM; touch {}; while :; do sleep 0.02; done",
        got.display(),
        ready.display()
    );
    let child = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "svc",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    wait_for_file(&ready).await;
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let out = finish(child).await;
    assert_eq!(out.code, Some(42), "the command's own exit code: {out:?}");
    assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), "term");
    assert!(cluster.keys("redlock:lock:*").await.is_empty(), "released");
}

/// The signals a command is commonly told things with (SIGUSR1, SIGUSR2, SIGALRM: reopen logs,
/// report progress) and whose default action ends a process reach the command too. Without a
/// handler they ended `redlock` itself (exit 138), the command was killed with it (its parent-
/// death signal) with no grace, and the lock's keys stayed for their TTL (found in review).
#[tokio::test]
async fn sigusr1_and_sigusr2_to_redlock_reach_the_command_and_the_lock_is_released() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let got = dir.path().join("got");
    let script = format!(
        "trap 'echo usr1 >> {got}' USR1; trap 'echo usr2 >> {got}' USR2; \
         trap 'echo alrm >> {got}; exit 3' ALRM; touch {}; while :; do sleep 0.02; done",
        ready.display(),
        got = got.display(),
    );
    let child = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "usr",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    wait_for_file(&ready).await;
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    for (signal, line) in [(Signal::SIGUSR1, "usr1"), (Signal::SIGUSR2, "usr2")] {
        kill(pid, signal).unwrap();
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&got).is_ok_and(|g| g.lines().any(|l| l == line)) {
            assert!(
                tokio::time::Instant::now() < until,
                "{signal} did not reach the command"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(
        !cluster.keys("redlock:lock:*").await.is_empty(),
        "the lock is held while the command runs"
    );
    kill(pid, Signal::SIGALRM).unwrap();
    let out = finish(child).await;
    assert_eq!(out.code, Some(3), "the command's own exit code: {out:?}");
    assert_eq!(
        std::fs::read_to_string(&got).unwrap(),
        "usr1\nusr2\nalrm\n",
        "each signal reached the command once"
    );
    assert!(cluster.keys("redlock:lock:*").await.is_empty(), "released");
}

/// The command's arguments reach it byte for byte, UTF-8 or not, as with flock(1). They were
/// read as UTF-8, and a file name in Latin-1 was a usage error (and, before the passwords on
/// the command line were read as clap reads them, a panic: hardening.rs).
#[tokio::test]
async fn a_command_argument_that_is_not_utf8_reaches_the_command_unchanged() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("got");
    let arg = OsStr::from_bytes(b"caf\xe9 \xff.txt");
    let nodes = nodes(&cluster);
    let out = output(redlock([
        OsStr::new("--nodes"),
        OsStr::new(&nodes),
        OsStr::new("run"),
        OsStr::new("bytes"),
        OsStr::new("--"),
        OsStr::new("sh"),
        OsStr::new("-c"),
        OsStr::new("printf %s \"$1\" > \"$2\""),
        OsStr::new("sh"),
        arg,
        got.as_os_str(),
    ]))
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(std::fs::read(&got).unwrap(), arg.as_bytes());
}

#[tokio::test]
async fn a_command_killed_by_a_signal_exits_128_plus_it() {
    let cluster = Cluster::start(3).await.unwrap();
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "k",
        "--",
        "sh",
        "-c",
        "kill -KILL $$",
    ]))
    .await;
    assert_eq!(out.code, Some(128 + 9), "{out:?}");
}

#[tokio::test]
async fn a_lost_lock_terminates_the_command_and_exits_79() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let got = dir.path().join("got");
    let script = format!(
        "trap 'echo term > {}; exit 0' TERM; touch {}; while :; do sleep 0.02; done",
        got.display(),
        ready.display()
    );
    let child = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--ttl",
        "600ms",
        "cron",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    wait_for_file(&ready).await;
    steal(&cluster, "redlock:lock:cron").await;
    let out = finish(child).await;
    assert_eq!(out.code, Some(79), "{out:?}");
    assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), "term");
    assert!(out.stderr.contains("was lost"), "{}", out.stderr);
}

#[tokio::test]
async fn a_command_ignoring_sigterm_is_killed_after_the_grace() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!("trap '' TERM; touch {}; exec sleep 30", ready.display());
    let started = std::time::Instant::now();
    let child = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--ttl",
        "600ms",
        "--grace",
        "300ms",
        "stubborn",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    wait_for_file(&ready).await;
    steal(&cluster, "redlock:lock:stubborn").await;
    let out = finish(child).await;
    assert_eq!(out.code, Some(79), "{out:?}");
    assert!(out.stderr.contains("SIGKILL"), "{}", out.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "not the command's 30 s"
    );
}

/// Process `pid`'s state letter and parent, from `/proc/<pid>/stat`; `None` once it is gone.
fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses.
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

/// Whether process `pid` still runs (a zombie, dead but not yet reaped, does not).
fn running(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
}

/// Runs `script` under `redlock run --ttl 600ms --grace GRACE RESOURCE -- sh -c SCRIPT`; once
/// the script wrote `pids` (one process id per file) and touched `ready`, deletes the lock's
/// keys. Returns redlock's output and those of the processes that still run after it exited
/// (killed then, so a failing test leaves nothing behind).
async fn lose_the_lock_under(
    resource: &str,
    grace: &str,
    script: &str,
    ready: &std::path::Path,
    pids: &[&std::path::Path],
) -> (common::Output, Vec<i32>) {
    let cluster = Cluster::start(3).await.unwrap();
    let child = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--ttl",
        "600ms",
        "--grace",
        grace,
        resource,
        "--",
        "sh",
        "-c",
        script,
    ])
    .spawn()
    .unwrap();
    wait_for_file(ready).await;
    let pids: Vec<i32> = pids
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap().trim().parse().unwrap())
        .collect();
    assert!(pids.iter().all(|&p| running(p)), "{pids:?} run");
    steal(&cluster, &format!("redlock:lock:{resource}")).await;
    let out = finish(child).await;
    let left: Vec<i32> = pids.into_iter().filter(|&p| running(p)).collect();
    for &p in &left {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    (out, left)
}

/// The lock is lost while the command's shell waits for processes it started: one in the
/// background, and one whose parent exited at once (a double fork, as daemons do). The shell
/// dies of the SIGTERM; what it started must not run on unprotected after `redlock` exits 79.
#[tokio::test]
async fn a_lost_lock_stops_what_the_command_started_too() {
    let dir = tempfile::tempdir().unwrap();
    let (ready, first, second) = (
        dir.path().join("ready"),
        dir.path().join("first"),
        dir.path().join("second"),
    );
    let script = format!(
        // (Their output goes elsewhere: the test reads redlock's until it closes.)
        "exec >/dev/null 2>&1; sleep 30 & echo $! > {first}; (sleep 30 & echo $! > {second}); \
         touch {ready}; wait",
        first = first.display(),
        second = second.display(),
        ready = ready.display()
    );
    let (out, left) = lose_the_lock_under("tree", "2s", &script, &ready, &[&first, &second]).await;
    assert_eq!(out.code, Some(79), "{out:?}");
    assert!(
        left.is_empty(),
        "processes the command started still run after redlock exited 79: {left:?}"
    );
}

/// A process the command started that ignores SIGTERM gets SIGKILL at the end of the grace,
/// after the command itself is gone, and `redlock` exits 79 only once it is gone too.
#[tokio::test]
async fn a_started_process_ignoring_sigterm_is_killed_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let (ready, stubborn) = (dir.path().join("ready"), dir.path().join("stubborn"));
    let script = format!(
        "exec >/dev/null 2>&1; (trap '' TERM; exec sleep 30) & echo $! > {stubborn}; \
         touch {ready}; wait",
        stubborn = stubborn.display(),
        ready = ready.display()
    );
    let (out, left) =
        lose_the_lock_under("stubborn-tree", "500ms", &script, &ready, &[&stubborn]).await;
    assert_eq!(out.code, Some(79), "{out:?}");
    assert!(
        left.is_empty(),
        "{left:?} ignored SIGTERM and still runs after redlock exited"
    );
    assert!(
        out.stderr.contains("outlived --grace; sending SIGKILL"),
        "{}",
        out.stderr
    );
}

/// `run` adopts the orphans of what the command starts (to stop them when the lock is lost),
/// so it must also collect their exit status: short-lived daemons must not pile up as zombies
/// under it while the command runs.
#[tokio::test]
async fn adopted_orphans_do_not_stay_zombies() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!(
        "exec >/dev/null 2>&1; for i in 1 2 3 4 5; do (sleep 0.1 &); done; touch {}; sleep 5",
        ready.display()
    );
    let child = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "orphans",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    let me = i32::try_from(child.id().unwrap()).unwrap();
    wait_for_file(&ready).await;
    // The orphans are dead after 0.1 s; `run` collects them within a second or so.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let zombies: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| proc_stat(pid) == Some(('Z', me)))
        .collect();
    let _ = kill(Pid::from_raw(me), Signal::SIGTERM);
    let out = finish(child).await;
    assert!(
        zombies.is_empty(),
        "zombies under redlock: {zombies:?}; {out:?}"
    );
}

#[tokio::test]
async fn quorum_unreachable_exits_69() {
    let cluster = Cluster::start(3).await.unwrap();
    cluster.node(0).kill();
    cluster.node(1).kill();
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "x",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.code, Some(69), "{out:?}");
    assert_eq!(
        out.stderr.trim().lines().count(),
        1,
        "one line: {}",
        out.stderr
    );
}

#[tokio::test]
async fn a_failed_attempt_releases_its_grants_before_exiting() {
    let cluster = Cluster::start(3).await.unwrap();
    // Node 0 grants; the paused pair never answers, so the attempt fails with its grant still
    // to be released in the background.
    cluster.node(1).pause();
    cluster.node(2).pause();
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "x",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.code, Some(69), "{out:?}");
    let left = cluster
        .node(0)
        .keys_with_pttl("redlock:lock:*")
        .await
        .unwrap();
    cluster.node(1).resume();
    cluster.node(2).resume();
    assert!(
        left.is_empty(),
        "no key left on the node that granted: {left:?}"
    );
}

#[tokio::test]
async fn keep_leaves_the_lock_to_expire_at_its_ttl() {
    let cluster = Cluster::start(3).await.unwrap();
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--keep",
        "--ttl",
        "20s",
        "slot:0900",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    // A quorum holds it (a node that answered late may have been cleaned up).
    let mut holding = 0;
    for node in cluster.nodes() {
        let keys = node.keys_with_pttl("redlock:lock:*").await.unwrap();
        for (key, pttl) in keys {
            assert_eq!(key, "redlock:lock:slot:0900");
            assert!(pttl > 0 && pttl <= 20_000, "expires at its TTL: {pttl}");
            holding += 1;
        }
    }
    assert!(holding >= 2, "held on {holding} of 3 nodes");
    // A second host in the same slot does not run.
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "slot:0900",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.code, Some(75), "{out:?}");
}

/// A lock's TTL longer than the restart quarantine: the restart safety the quarantine gives
/// holds only for locks no longer than it. The library's warning goes to `tracing`, which the
/// CLI does not print, so `redlock run` said nothing (found in review); it warns on stderr.
#[tokio::test]
async fn a_ttl_longer_than_the_restart_quarantine_is_warned_about() {
    let cluster = Cluster::start(3).await.unwrap();
    let run = |ttl: &str| {
        redlock([
            "--nodes",
            &nodes(&cluster),
            "--restart-quarantine",
            "2s",
            "run",
            "quarantined",
            "--ttl",
            ttl,
            "--wait",
            "10s",
            "--",
            "true",
        ])
    };
    let longer = output(run("30s")).await;
    assert_eq!(longer.code, Some(0), "{longer:?}");
    assert!(
        longer.stderr.contains("longer than the restart quarantine"),
        "{longer:?}"
    );
    let shorter = output(run("2s")).await;
    assert_eq!(shorter.code, Some(0), "{shorter:?}");
    assert!(!shorter.stderr.contains("quarantine"), "{shorter:?}");
}

/// A signal ignored when `redlock` started stays ignored for the command: `nohup redlock run
/// … &` must survive the hang-up that ends the session (the shell sends SIGHUP to the job's
/// whole process group). `redlock` handled every signal it passes on whatever its state, and
/// the command started with SIGHUP at its default again, died of it, and `redlock` forwarded it
/// too (found in review).
#[tokio::test]
async fn a_signal_ignored_when_redlock_started_stays_ignored_for_the_command() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = "import signal, sys, time, pathlib\n\
                  print('ignored' if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else 'default', flush=True)\n\
                  pathlib.Path(sys.argv[1]).touch()\n\
                  time.sleep(1)\n\
                  print('survived', flush=True)";
    let mut cmd = common::isolated("nohup");
    cmd.args([
        env!("CARGO_BIN_EXE_redlock"),
        "--nodes",
        &nodes(&cluster),
        "run",
        "hup",
        "--",
        "python3",
        "-c",
        script,
        ready.to_str().unwrap(),
    ])
    .process_group(0);
    let child = cmd.spawn().unwrap();
    let group = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    wait_for_file(&ready).await;
    // What a shell does to a background job when its session hangs up.
    nix::sys::signal::killpg(group, Signal::SIGHUP).unwrap();
    let out = finish(child).await;
    assert!(out.stdout.contains("ignored"), "{out:?}");
    assert!(out.stdout.contains("survived"), "{out:?}");
    assert_eq!(out.code, Some(0), "{out:?}");
}

/// SIGALRM from the kernel (an `alarm()` set before `redlock` was started, as the
/// `perl -e 'alarm 3600; exec @ARGV'` timeout idiom does) is passed on like one sent with
/// `kill`: only SIGINT, SIGQUIT and SIGHUP come from a terminal to the whole process group.
/// Every kernel-sent signal counted as the terminal's, and this one was neither passed on nor
/// acted on: the command ran on past its time limit (found in review).
#[tokio::test]
async fn an_alarm_set_before_redlock_started_reaches_the_command() {
    let cluster = Cluster::start(3).await.unwrap();
    let mut cmd = common::isolated("python3");
    cmd.args([
        "-c",
        "import os, signal, sys\nsignal.alarm(1)\nos.execvp(sys.argv[1], sys.argv[1:])",
        env!("CARGO_BIN_EXE_redlock"),
        "--nodes",
        &nodes(&cluster),
        "run",
        "alarm",
        "--",
        "sh",
        "-c",
        "sleep 3; echo ran",
    ]);
    let out = output(cmd).await;
    assert!(!out.stdout.contains("ran"), "{out:?}");
    assert_eq!(out.code, Some(128 + 14), "{out:?}");
}
