//! `redlock run` on a terminal: a spinner on stderr while `--wait` waits (cleared afterwards),
//! nothing for a single attempt or when stderr is not a terminal; and an interrupt while
//! waiting ends the wait at once. stderr is a real pseudo-terminal here, not a pipe.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{RUN_LIMIT, nodes, output, redlock};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redlock::Redlock;
use redlock_testkit::Cluster;

/// A client of the test cluster that holds locks for the tests to wait on.
fn holder(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Runs `redlock ARGS…` with stderr on a new pseudo-terminal; returns the exit code and every
/// byte the terminal received.
async fn on_a_terminal(args: &[&str]) -> (Option<i32>, String) {
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let mut cmd = redlock(args);
    cmd.stderr(Stdio::from(pty.slave));
    let mut child = cmd.spawn().expect("redlock ran");
    // Only the child keeps the terminal's slave side open now, so reading the master ends
    // (EIO) when the child exits.
    drop(cmd);
    let master = std::fs::File::from(pty.master);
    let reader = tokio::task::spawn_blocking(move || {
        let mut master = master;
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    });
    let status = tokio::time::timeout(RUN_LIMIT, child.wait())
        .await
        .expect("redlock finished within the limit")
        .expect("redlock ran");
    let seen = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the terminal closed")
        .unwrap();
    (status.code(), String::from_utf8_lossy(&seen).into_owned())
}

#[tokio::test]
async fn a_spinner_shows_while_waiting_on_a_terminal_and_is_cleared() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = holder(&cluster);
    let lock = rl.acquire("spin").await.unwrap();

    let urls = nodes(&cluster);
    let (code, seen) = on_a_terminal(&[
        "--nodes", &urls, "run", "--wait", "700ms", "spin", "--", "true",
    ])
    .await;
    assert_eq!(code, Some(75), "{seen:?}");
    let frames = seen.matches("waiting for the lock on spin").count();
    // One frame per 100 ms of a 700 ms wait (the first at once); allow a loaded machine to
    // skip some, but not to show none.
    assert!(frames >= 3, "{frames} spinner frames: {seen:?}");
    assert!(
        seen.contains("of 0.7s)"),
        "the wait's limit is shown: {seen:?}"
    );
    // The line is cleared after the last frame, before the failure is reported.
    let last_frame = seen.rfind("waiting for the lock on spin").unwrap();
    let report = seen.find("redlock:").expect("a failure message");
    assert!(report > last_frame, "{seen:?}");
    assert!(
        seen[last_frame..report].contains("\r\x1b[2K"),
        "the spinner's line is cleared before the message: {seen:?}"
    );
    rl.release(lock).await.unwrap();
}

#[tokio::test]
async fn no_spinner_for_a_single_attempt_or_off_a_terminal() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = holder(&cluster);
    let lock = rl.acquire("quiet").await.unwrap();
    let urls = nodes(&cluster);

    // A single attempt on a terminal: no progress shown.
    let (code, seen) = on_a_terminal(&["--nodes", &urls, "run", "quiet", "--", "true"]).await;
    assert_eq!(code, Some(75), "{seen:?}");
    assert!(!seen.contains("waiting for the lock"), "{seen:?}");
    assert!(!seen.contains('\x1b'), "no control sequences: {seen:?}");

    // A wait with stderr on a pipe (a log file, a cron mail): no spinner, no control sequences.
    let out = output(redlock([
        "--nodes", &urls, "run", "--wait", "400ms", "quiet", "--", "true",
    ]))
    .await;
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(!out.stderr.contains("waiting for the lock"), "{out:?}");
    assert!(!out.stderr.contains('\x1b'), "{out:?}");

    // Free: a waiting run on a terminal takes it at once and shows no leftover line.
    rl.release(lock).await.unwrap();
    let (code, seen) = on_a_terminal(&[
        "--nodes", &urls, "run", "--wait", "5s", "quiet", "--", "true",
    ])
    .await;
    assert_eq!(code, Some(0), "{seen:?}");
    assert!(
        seen.matches("waiting for the lock").count() <= 1,
        "{seen:?}"
    );
}

/// Ctrl-C (SIGINT) while `--wait` waits ends the wait promptly with 128 + 2, and leaves the
/// holder's lock alone.
#[tokio::test]
async fn an_interrupt_while_waiting_exits_130_and_leaves_the_holders_lock() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = holder(&cluster);
    let lock = rl.acquire("cron:0900").await.unwrap();
    let urls = nodes(&cluster);

    let mut cmd = redlock([
        "--nodes",
        &urls,
        "run",
        "--wait",
        "10s",
        "cron:0900",
        "--",
        "true",
    ]);
    let child = cmd.spawn().unwrap();
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    // Let it reach the wait (several attempts refused).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = Instant::now();
    kill(pid, Signal::SIGINT).unwrap();
    let out = common::finish(child).await;
    assert_eq!(out.code, Some(130), "{out:?}");
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "ended within the release allowance, not at the 10 s wait: {:?}",
        sent.elapsed()
    );
    assert!(out.stderr.contains("interrupted while waiting"), "{out:?}");
    // The holder still holds it, on every node.
    let mut lock = lock;
    rl.extend(&mut lock).await.expect("still ours");
    rl.release(lock).await.unwrap();
}

/// After an interrupted wait, `redlock` waits for the abandoned attempt's releases (at most
/// five node timeouts); a second signal ends that wait at once. It was swallowed: with a node
/// timeout of 2 s, a second Ctrl-C still left ten seconds to wait (found in review). Node 2
/// hangs, so the releases take a while: about 3 s with one signal.
#[tokio::test]
async fn a_second_interrupt_ends_the_pause_after_an_interrupted_wait() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = holder(&cluster);
    let lock = rl.acquire("cron:1000").await.unwrap();
    let urls = nodes(&cluster);
    let child = redlock([
        "--nodes",
        &urls,
        "--node-timeout",
        "2s",
        "run",
        "--wait",
        "20s",
        "cron:1000",
        "--",
        "true",
    ])
    .spawn()
    .unwrap();
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.node(2).pause();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    kill(pid, Signal::SIGINT).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill(pid, Signal::SIGINT).unwrap();
    let out = common::finish(child).await;
    cluster.node(2).resume();
    assert_eq!(out.code, Some(130), "{out:?}");
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "a second SIGINT 0.3 s after the first: ended after {:?} (the cleanup's wait for the \
         hung node 2: about 3 s)",
        sent.elapsed()
    );
    let mut lock = lock;
    rl.extend(&mut lock).await.expect("still ours");
    rl.release(lock).await.unwrap();
}

/// Ctrl-C typed on the terminal reaches the command once: the terminal sends SIGINT to the
/// whole foreground process group (redlock and the command), so redlock must not pass it on
/// as well (a second SIGINT means "force quit" to many programs). `script(1)` gives the command
/// line a real terminal and the test types Ctrl-C into it. The command (python3) logs the
/// origin of every SIGINT it receives: `si_code` 128 (`SI_KERNEL`) from the terminal, 0
/// (`SI_USER`) from a `kill` — which would be redlock forwarding it.
#[tokio::test]
async fn ctrl_c_on_the_terminal_reaches_the_command_once() {
    use tokio::io::AsyncWriteExt;

    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ready, got, stop) = (
        dir.path().join("ready"),
        dir.path().join("got"),
        dir.path().join("stop"),
    );
    let job = dir.path().join("job.py");
    std::fs::write(
        &job,
        "import os, signal, sys\n\
         log = open(sys.argv[1], 'a', buffering=1)\n\
         signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n\
         open(sys.argv[2], 'w').close()\n\
         while not os.path.exists(sys.argv[3]):\n\
         \x20   info = signal.sigtimedwait({signal.SIGINT}, 0.01)\n\
         \x20   if info is not None:\n\
         \x20       log.write(f'{info.si_code} {info.si_pid}\\n')\n",
    )
    .unwrap();
    let line = format!(
        "exec {} --nodes {} run term:job -- python3 {} {} {} {}",
        env!("CARGO_BIN_EXE_redlock"),
        nodes(&cluster),
        job.display(),
        got.display(),
        ready.display(),
        stop.display()
    );
    let mut child = common::isolated("script")
        .args(["-q", "-f", "-e", "-c", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux");
    common::wait_for_file(&ready).await;
    let mut keys = child.stdin.take().unwrap();
    keys.write_all(b"\x03").await.unwrap();
    keys.flush().await.unwrap();
    // Give a forwarded copy time to arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::fs::write(&stop, "").unwrap();
    let out = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .expect("finished within the limit")
        .unwrap();
    drop(keys);
    let seen = std::fs::read_to_string(&got).unwrap_or_default();
    let codes: Vec<&str> = seen
        .lines()
        .map(|l| l.split(' ').next().unwrap_or_default())
        .collect();
    assert_eq!(
        codes,
        ["128"],
        "one SIGINT, from the terminal (si_code, si_pid per line): {seen:?} {out:?}"
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(cluster.keys("redlock:lock:*").await.is_empty(), "released");
}

/// Ctrl-C typed after the lock was taken but before the command started. The terminal sends
/// SIGINT to the foreground process group, which the command is not in yet; `redlock` does
/// not pass on a signal from the terminal ("the command has it already"), so the command
/// started afterwards never got it and ran to the end, exit 0, as if no one had pressed
/// Ctrl-C. The window (microseconds) is widened with strace(1), which delays the `prctl` calls
/// `redlock` makes (the last, `PR_SET_CHILD_SUBREAPER`, comes just before the command starts).
#[tokio::test]
async fn ctrl_c_before_the_command_started_stops_it() {
    use tokio::io::AsyncWriteExt;

    if !common::has_strace() {
        eprintln!("skipped: needs strace(1)");
        return;
    }
    let cluster = Cluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let finished = dir.path().join("finished");
    let job = format!("sleep 2; touch {}", finished.display());
    // `-o FILE`: strace itself blocks SIGINT, and passes redlock's on with its origin;
    // `--seccomp-bpf`: only `prctl` stops redlock, which keeps its node timeout.
    let line = format!(
        "exec strace -f --seccomp-bpf -o /dev/null -e trace=prctl -e inject=prctl:delay_exit=1500000 \
         {} --nodes {} run term:pre -- sh -c '{job}'",
        env!("CARGO_BIN_EXE_redlock"),
        nodes(&cluster),
    );
    let mut child = common::isolated("script")
        .args(["-q", "-f", "-e", "-c", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux");
    // The lock is taken (a quorum), and redlock is in the delay before the command starts.
    common::wait_for_key(&cluster, "redlock:lock:term:pre", 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut keys = child.stdin.take().unwrap();
    keys.write_all(b"\x03").await.unwrap();
    keys.flush().await.unwrap();
    let out = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .expect("finished within the limit")
        .unwrap();
    drop(keys);
    let ran = finished.exists();
    assert!(
        !ran,
        "the command ran to the end after Ctrl-C: {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert!(cluster.keys("redlock:lock:*").await.is_empty(), "released");
}
