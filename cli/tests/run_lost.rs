//! `redlock run` when the lock is lost: what the command started is stopped however it
//! behaves, `--keep` deletes nothing, and a lock that expired while the command ran is reported
//! as lost. Each test here failed on 379bd78 (found in a review). Real redis-server processes through `redlock_testkit`, loopback only, every
//! invocation bounded by `common::RUN_LIMIT`; every process a test starts is killed at its end.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{finish, nodes, output, redlock, steal, wait_for_file};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redlock_testkit::Cluster;

fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Whether any process of process group `pgid` exists (zombies included; they are reaped at
/// once by init after redlock exits).
fn group_exists(pgid: i32) -> bool {
    kill(Pid::from_raw(-pgid), None).is_ok()
}

/// Kills process group `pgid` until it is gone (bounded).
fn kill_group(pgid: i32) {
    for _ in 0..50 {
        if kill(Pid::from_raw(-pgid), Signal::SIGKILL).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many of the threads of process `pid` are not zombies (0 once it is gone).
fn live_threads(pid: i32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.ok()?.path().join("stat")).ok()?;
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state)
        })
        .filter(|s| s != "Z" && s != "X")
        .count()
}

/// docs/cli.md: "a lost lock signals every descendant it finds under its own process id in
/// `/proc`" and "`redlock` exits 79 once all of it is gone". A process whose main thread ended
/// (pthread_exit) while its other threads run shows state `Z` in `/proc/<pid>/stat`; tree.rs
/// takes it for a zombie: it is never signalled, and `run` exits 79 while it still runs.
#[tokio::test]
async fn a_started_process_whose_main_thread_exited_is_stopped_too() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ready, pidfile, prog) = (
        dir.path().join("ready"),
        dir.path().join("pid"),
        dir.path().join("zl.py"),
    );
    // Default SIGTERM handling: any signal would end it.
    std::fs::write(
        &prog,
        "import ctypes, os, sys, threading, time\n\
         threading.Thread(target=lambda: time.sleep(20)).start()\n\
         open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n\
         os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n\
         ctypes.CDLL(None).pthread_exit(None)\n",
    )
    .unwrap();
    let script = format!(
        "exec >/dev/null 2>&1; python3 {prog} {pid} & \
         while [ ! -e {pid} ]; do sleep 0.02; done; sleep 0.2; touch {ready}; wait",
        prog = prog.display(),
        pid = pidfile.display(),
        ready = ready.display()
    );
    let child = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--ttl",
        "600ms",
        "--grace",
        "1s",
        "mainthread",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    wait_for_file(&ready).await;
    let pid = read_pid(&pidfile);
    assert!(live_threads(pid) >= 1, "the python process runs");
    steal(&cluster, "redlock:lock:mainthread").await;
    let out = finish(child).await;
    let left = live_threads(pid);
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    assert_eq!(out.code, Some(79), "{out:?}");
    assert_eq!(
        left, 0,
        "process {pid} (main thread exited, {left} thread(s) running) still runs after redlock exited 79; {out:?}"
    );
}

/// A process that keeps moving to a new process id (fork, parent exits, as a daemonising
/// double fork does, repeated) and ignores SIGTERM. docs/cli.md: "Whatever still runs `--grace`
/// after the loss — the command or what it started — gets SIGKILL, and `redlock` exits 79 once
/// all of it is gone". tree.rs lists /proc once and reads each entry after that; the process
/// has moved to a pid the listing does not hold by then, so `run` finds nothing and exits 79
/// at once (before the grace, without any SIGKILL) while it runs on.
#[tokio::test]
async fn a_process_that_keeps_forking_away_is_stopped_before_exit_79() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ready, pgfile) = (dir.path().join("ready"), dir.path().join("pgid"));
    // Own process group, for this test to find (and kill) it; ends by itself after 12 s.
    let hopper = format!(
        "$SIG{{TERM}}='IGNORE'; setpgrp(0,0); \
         open(my $f,'>','{pg}.tmp') or die; print $f getpgrp(0); close $f; rename('{pg}.tmp','{pg}'); \
         my $end=time+12; while (time < $end) {{ exit 0 if fork(); select(undef,undef,undef,0.001); }}",
        pg = pgfile.display()
    );
    let script = format!(
        "exec >/dev/null 2>&1; perl -e \"$HOPPER\" & \
         while [ ! -e {pg} ]; do sleep 0.02; done; touch {ready}; sleep 20",
        pg = pgfile.display(),
        ready = ready.display()
    );
    let started = std::time::Instant::now();
    let mut cmd = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--ttl",
        "600ms",
        "--grace",
        "2s",
        "hopper",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    cmd.env("HOPPER", &hopper);
    let child = cmd.spawn().unwrap();
    wait_for_file(&ready).await;
    let pgid = read_pid(&pgfile);
    assert!(group_exists(pgid), "the hopper runs");
    steal(&cluster, "redlock:lock:hopper").await;
    let out = finish(child).await;
    let elapsed = started.elapsed();
    // Zombies left by the last hop are reaped by init at once; give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left = group_exists(pgid);
    kill_group(pgid);
    assert_eq!(out.code, Some(79), "{out:?}");
    assert!(
        !left,
        "the process the command started still runs after redlock exited 79 ({elapsed:?} after start, --grace 2s); {out:?}"
    );
}

/// A process the command started that ignores SIGTERM and starts long-running processes in a
/// loop (a job runner, `xargs -P`, `make -j`). docs/cli.md: whatever still runs at the end of
/// `--grace` "gets SIGKILL, and `redlock` exits 79 once all of it is gone". SIGKILL is sent in
/// one pass over one listing of /proc: children forked between the listing and the runner's
/// own SIGKILL are not in it, are never signalled, and run on after `run` gives up waiting
/// (5 s) and exits 79.
#[tokio::test]
async fn processes_forked_during_the_sigkill_pass_are_stopped_before_exit_79() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ready, pgfile) = (dir.path().join("ready"), dir.path().join("pgid"));
    // The runner is in a session and process group of its own (setsid), which its children
    // share: the test finds (and kills) them by it. At most 1200 children, each `sleep 19`.
    let script = format!(
        "exec >/dev/null 2>&1; \
         setsid sh -c 'trap \"\" TERM; echo $$ > {pg}.tmp; mv {pg}.tmp {pg}; \
           i=0; while [ $i -lt 1200 ]; do sleep 19 & i=$((i+1)); done; sleep 19' & \
         while [ ! -e {pg} ]; do sleep 0.01; done; touch {ready}; sleep 20",
        pg = pgfile.display(),
        ready = ready.display()
    );
    let child = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--ttl",
        "600ms",
        "--grace",
        "300ms",
        "runner",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    wait_for_file(&ready).await;
    let pgid = read_pid(&pgfile);
    steal(&cluster, "redlock:lock:runner").await;
    let out = tokio::time::timeout(Duration::from_secs(30), finish(child)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left = group_exists(pgid);
    // How many still run (for the message), then kill them all.
    let mut running = 0;
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                && let Some((_, rest)) = stat.rsplit_once(')')
            {
                let f: Vec<&str> = rest.split_whitespace().collect();
                if f.len() > 3 && f[3] == pgid.to_string() && f[0] != "Z" {
                    running += 1;
                }
            }
        }
    }
    kill_group(pgid);
    let out = out.expect("redlock finished");
    assert_eq!(out.code, Some(79), "{out:?}");
    assert!(
        !left,
        "{running} process(es) the command started still run after redlock exited 79; {out:?}"
    );
}

/// docs/cli.md, `--keep`: "When the command exits, stop renewing but delete nothing: the key
/// lives out its TTL (counted from the last renewal), whatever the command's exit code. For
/// jobs that must run at most once per slot". When the lock counts as lost through
/// `--max-hold` (our keys still on every node), `run --keep` deletes them on the way out, and a
/// second host in the same slot runs the job again.
#[tokio::test]
async fn keep_deletes_nothing_when_the_lock_is_lost() {
    let cluster = Cluster::start(3).await.unwrap();
    let out = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--keep",
        "--ttl",
        "20s",
        "--max-hold",
        "1s",
        "--grace",
        "1s",
        "slot:1000",
        "--",
        "sleep",
        "5",
    ]))
    .await;
    assert_eq!(out.code, Some(79), "{out:?}");
    let holding = cluster.keys("redlock:lock:slot:1000").await.len();
    let again = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "slot:1000",
        "--",
        "true",
    ]))
    .await;
    assert!(
        holding >= 2,
        "--keep: the keys must live out their TTL, but {holding} of 3 nodes hold one; \
         a second host in the same slot then exits {:?}",
        again.code
    );
    assert_eq!(again.code, Some(75), "{again:?}");
}

/// docs/cli.md: "79 — The lock was lost while the command ran". `redlock` is not scheduled
/// (SIGSTOP here; a long stall does the same) for longer than the TTL while the command runs,
/// so the lock's validity passes while the command still runs; the command exits while
/// `redlock` is stopped. On resume both the command's exit and the lost lease are ready, and
/// `run` reports one or the other at random (tokio::select!): the command's 0 about half of
/// the time, although the lease says lost (`Lease::is_lost` checks the deadline). Four trials.
#[tokio::test]
async fn a_lock_that_expired_while_the_command_ran_is_reported_as_lost() {
    let cluster = Cluster::start(3).await.unwrap();
    let mut codes = Vec::new();
    for trial in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let (ready, go) = (dir.path().join("ready"), dir.path().join("go"));
        let script = format!(
            "touch {ready}; while [ ! -e {go} ]; do sleep 0.01; done; exit 0",
            ready = ready.display(),
            go = go.display()
        );
        let resource = format!("stall{trial}");
        let child = redlock([
            "--nodes",
            &nodes(&cluster),
            "run",
            "--ttl",
            "1s",
            &resource,
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .unwrap();
        let me = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
        wait_for_file(&ready).await;
        kill(me, Signal::SIGSTOP).unwrap();
        // The validity (under 1 s) passes while the command still runs, unprotected...
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // ...then the command exits, and redlock resumes.
        std::fs::write(&go, "").unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        kill(me, Signal::SIGCONT).unwrap();
        let out = finish(child).await;
        codes.push((out.code, out.stderr));
    }
    assert!(
        codes.iter().all(|(code, _)| *code == Some(79)),
        "each trial: the lock expired while the command ran; exit codes and stderr: {codes:?}"
    );
}

/// docs/cli.md: whatever still runs at the end of `--grace` "gets SIGKILL, and `redlock` exits
/// 79 once all of it is gone (giving up 5 s after the first SIGKILL)". A process the command
/// started that `redlock` may not signal (another user's, as under `sudo -u`) is still running
/// when `run` gives up: it exited 79 without a word about it, and the user took the job for
/// stopped. Here `redlock` runs without CAP_KILL (root-only setup: `setpriv`), and the command
/// starts `sleep` as user 65534.
#[tokio::test]
async fn a_started_process_that_outlives_sigkill_is_reported() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (setpriv to another user)");
        return;
    }
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ready, pidfile) = (dir.path().join("ready"), dir.path().join("pid"));
    let script = format!(
        "exec >/dev/null 2>&1; setpriv --reuid=65534 --regid=65534 --clear-groups sleep 30 & \
         echo $! > {pid}.tmp; mv {pid}.tmp {pid}; touch {ready}; wait",
        pid = pidfile.display(),
        ready = ready.display()
    );
    let mut cmd = common::isolated("setpriv");
    cmd.args([
        "--bounding-set",
        "-kill",
        env!("CARGO_BIN_EXE_redlock"),
        "--nodes",
        &nodes(&cluster),
        "run",
        "--ttl",
        "600ms",
        "--grace",
        "300ms",
        "unkillable",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let child = cmd.spawn().unwrap();
    wait_for_file(&ready).await;
    let pid = read_pid(&pidfile);
    steal(&cluster, "redlock:lock:unkillable").await;
    let out = finish(child).await;
    let running = kill(Pid::from_raw(pid), None).is_ok();
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    assert!(
        running,
        "the setup: process {pid} could not be killed by redlock; {out:?}"
    );
    assert_eq!(out.code, Some(79), "{out:?}");
    assert!(
        out.stderr.contains("still run") && out.stderr.contains(&pid.to_string()),
        "process {pid} still runs after exit 79, and stderr does not say so: {out:?}"
    );
}

/// docs/cli.md: on Linux "a lost lock signals every descendant" because `redlock` makes itself
/// the child subreaper first. When `prctl(PR_SET_CHILD_SUBREAPER)` is refused (a seccomp
/// sandbox; here strace(1) makes it fail with EPERM), a background job of the command runs on
/// after exit 79, and `run` said nothing: the user took the job for stopped. It must warn.
#[tokio::test]
async fn a_refused_subreaper_is_reported() {
    if !common::has_strace() {
        eprintln!("skipped: needs strace(1)");
        return;
    }
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ready, pidfile) = (dir.path().join("ready"), dir.path().join("pid"));
    let script = format!(
        "exec >/dev/null 2>&1; sleep 30 & echo $! > {pid}.tmp; mv {pid}.tmp {pid}; \
         touch {ready}; wait",
        pid = pidfile.display(),
        ready = ready.display()
    );
    let mut cmd = common::isolated("strace");
    // Not `-f`: strace would wait for the orphaned `sleep`. `prctl` comes from the main thread.
    cmd.args([
        "-o",
        "/dev/null",
        "-e",
        "trace=prctl",
        "-e",
        "inject=prctl:error=EPERM",
        env!("CARGO_BIN_EXE_redlock"),
        "--nodes",
        &nodes(&cluster),
        "run",
        "--ttl",
        "600ms",
        "--grace",
        "300ms",
        "noreaper",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let child = cmd.spawn().unwrap();
    wait_for_file(&ready).await;
    let pid = read_pid(&pidfile);
    steal(&cluster, "redlock:lock:noreaper").await;
    let out = finish(child).await;
    let running = kill(Pid::from_raw(pid), None).is_ok();
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    assert_eq!(out.code, Some(79), "{out:?}");
    assert!(
        !running || out.stderr.contains("only the command"),
        "process {pid} the command started runs on after exit 79, and stderr does not warn: {out:?}"
    );
}

/// docs/cli.md, `--ttl`: "A crashed `redlock` leaves the lock to expire after at most this
/// long." `redlock` killed with SIGKILL (`kill -9`, the OOM killer) cannot stop its command,
/// which ran on without the lock: once the TTL passed, a second `redlock run` took the lock
/// and the two ran at once. The command must die with `redlock`.
#[tokio::test]
async fn the_command_dies_with_a_killed_redlock() {
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!(
        "echo $$ > {pid}.tmp; mv {pid}.tmp {pid}; exec sleep 20",
        pid = pidfile.display()
    );
    let mut child = redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "--ttl",
        "1s",
        "crash",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    wait_for_file(&pidfile).await;
    let pid = read_pid(&pidfile);
    let me = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(me, Signal::SIGKILL).unwrap();
    // Not `finish`: the command, if it runs on, holds the output pipes open.
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    // The TTL passes: the lock is free for another holder.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let left = live_threads(pid);
    let second = output(redlock([
        "--nodes",
        &nodes(&cluster),
        "run",
        "crash",
        "--",
        "true",
    ]))
    .await;
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    assert_eq!(second.code, Some(0), "the lock expired: {second:?}");
    assert_eq!(
        left, 0,
        "the command (pid {pid}) runs on after redlock was killed, while a second holder takes the lock"
    );
}
