//! `redlock run RESOURCE -- COMMAND…`: flock(1) for a cluster. Takes the lock, runs the
//! command while a `LockGuard` renews it, forwards signals, stops the command when the lock is
//! lost, and releases the lock when the command exits (or, with `--keep`, leaves it to expire).

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redlock::{Error, LostReason, RetryPolicy};
use signal_hook::consts::{SIGALRM, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::SignalsInfo;
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::low_level::siginfo::{Cause, Origin};
use tokio::sync::mpsc;

use crate::args::RunArgs;
use crate::exit::{self, Failure};
use crate::output::{Spinner, shown};
use crate::settings::{Settings, code_of};

/// Environment variable the command gets with the lock's fence token (when it has one).
pub(crate) const FENCE_TOKEN_ENV: &str = "REDLOCK_FENCE_TOKEN";
/// Environment variable the command gets with the resource name.
pub(crate) const RESOURCE_ENV: &str = "REDLOCK_RESOURCE";
/// Signals passed on to the command: those that stop a process, and those a process is told
/// things with (reopen logs, report progress). All of them end a process by default: not
/// handled here, they ended `redlock` at once, the command was killed with it and the lock's
/// keys stayed for their TTL.
const FORWARDED: [i32; 7] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM];

/// Receives the forwarded signals on a thread of its own (signal-hook's iterator), with where
/// each came from; and the number of the last one to arrive (0 for none), set by the signal
/// handler itself, for `run` to know without a thread's delay whether one came before the
/// command started.
///
/// SIGHUP ignored when `redlock` started (`nohup`, `trap '' HUP`) is left alone: not handled,
/// not passed on, and the command inherits it ignored (see [`ignored_at_start`]). Handled, it was reset to its default for the command, and `nohup redlock run …`
/// died of the hang-up it was started to survive (test `run::a_signal_ignored_when_redlock_
/// started_stays_ignored_for_the_command`).
fn signals() -> Result<(mpsc::UnboundedReceiver<Origin>, Arc<AtomicUsize>), Failure> {
    let last = Arc::new(AtomicUsize::new(0));
    let ignored = ignored_at_start();
    let forwarded: Vec<i32> = FORWARDED
        .into_iter()
        .filter(|s| !ignored.contains(s))
        .collect();
    for &signal in &forwarded {
        signal_hook::flag::register_usize(
            signal,
            Arc::clone(&last),
            usize::try_from(signal).unwrap_or(usize::MAX),
        )
        .map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot handle signals: {e}")))?;
    }
    let mut signals = SignalsInfo::<WithOrigin>::new(&forwarded)
        .map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot handle signals: {e}")))?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for origin in signals.forever() {
                if tx.send(origin).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot start a thread: {e}")))?;
    Ok((rx, last))
}

/// The signals of [`FORWARDED`] this process ignores (its `SigIgn` mask in `/proc/self/status`,
/// read before any handler is installed) that it leaves alone: SIGHUP, which `nohup` ignores
/// for a job to outlive its session. SIGINT and SIGQUIT are ignored by every background job of
/// a non-interactive shell (a CI runner, a script with `&`), including a `redlock` started on a
/// terminal of its own from there, where Ctrl-C must still reach it: left alone, the terminal
/// tests failed in CI (`terminal::an_interrupt_while_waiting_exits_130_and_leaves_the_holders_
/// lock`). None where the mask cannot be read.
fn ignored_at_start() -> Vec<i32> {
    let mask = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(0);
    [SIGHUP]
        .into_iter()
        .filter(|&s| (1..=64).contains(&s) && mask & (1u64 << (s - 1)) != 0)
        .collect()
}

/// `argv[0]` of `redlock` started again to become the command (see [`exec_command`]).
pub(crate) const EXEC_ARG0: &str = "redlock: starting the command";

/// The command, started through `redlock` itself (Linux): [`exec_command`] asks the kernel to
/// send it SIGKILL when `redlock` dies, then executes it in its place. A `redlock` killed with
/// SIGKILL (`kill -9`, the OOM killer) can stop nothing, and the command would run on without
/// the lock, alongside the next holder once the TTL passes.
fn tied_command(argv: &[OsString]) -> tokio::process::Command {
    #[cfg(target_os = "linux")]
    {
        // The running binary even if its file was replaced or deleted since.
        let mut command = tokio::process::Command::new("/proc/self/exe");
        command
            .arg0(EXEC_ARG0)
            .arg(std::process::id().to_string())
            .args(argv);
        command
    }
    #[cfg(not(target_os = "linux"))]
    {
        direct_command(argv)
    }
}

/// The command itself, started directly: elsewhere than Linux, and where `/proc` is missing.
fn direct_command(argv: &[OsString]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(&argv[0]);
    command.args(&argv[1..]);
    command
}

/// `redlock` started by [`tied_command`]: `argv` is `EXEC_ARG0 PARENT COMMAND ARGS…`. Gets
/// SIGKILL when its parent (`run`) dies, from now on and across the `exec`; ends at once if
/// the parent is gone already; else becomes the command (same process id, environment, open
/// files). Returns only when that fails, with the shell's code (127: not found, 126: other).
#[cfg(target_os = "linux")]
pub(crate) fn exec_command() -> u8 {
    use std::os::unix::process::CommandExt;

    let mut argv = std::env::args_os().skip(1);
    let parent = argv.next().and_then(|p| p.to_str()?.parse::<i32>().ok());
    let (Some(parent), Some(program)) = (parent, argv.next()) else {
        errln!("redlock: {EXEC_ARG0}: bad arguments");
        return exit::SOFTWARE;
    };
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        errln!("redlock: warning: the command will not die with redlock ({e})");
    }
    if nix::unistd::getppid() != Pid::from_raw(parent) {
        // `run` died before the request above: nothing holds the lock.
        return exit::LOST;
    }
    let e = std::process::Command::new(&program).args(argv).exec();
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => exit::NOT_FOUND,
        _ => exit::CANNOT_EXECUTE,
    };
    let failure = Failure::new(code, format!("{}: {e}", program.to_string_lossy()));
    errln!("redlock: {failure}");
    code
}

/// The retry policy that expresses `--wait`: one attempt for zero, else attempts until the
/// wait is over (woken early by release notifications).
fn policy(wait: Duration) -> RetryPolicy {
    if wait.is_zero() {
        RetryPolicy::once()
    } else {
        RetryPolicy::deadline(wait)
    }
}

/// Waits until the client's background releases are done, for at most the time a request may
/// take (a connection being opened included): five node timeouts.
async fn settle(rl: &redlock::Redlock) {
    let _ = tokio::time::timeout(rl.config().node_timeout * 5, rl.settle()).await;
}

pub(crate) async fn run(settings: &Settings, args: &RunArgs) -> Result<u8, Failure> {
    let rl = settings.build(
        settings
            .builder()
            .ttl(args.ttl)
            .max_hold(args.max_hold)
            .retry(policy(args.wait)),
    )?;
    // The library logs this through `tracing`, which the CLI does not print: a TTL longer than
    // the quarantine went by without a word, though the restart safety the quarantine gives
    // holds only for locks no longer than it (found in review).
    if let Some((quarantine, _)) = settings.restart_quarantine
        && quarantine < args.ttl
    {
        errln!(
            "redlock: warning: --ttl {} is longer than the restart quarantine ({}): a node that \
             restarted without its data can vote again while this lock's key is still live on \
             the others; set the quarantine to at least the longest TTL",
            humantime::format_duration(args.ttl),
            humantime::format_duration(quarantine)
        );
    }
    let (mut signals, last_signal) = signals()?;
    let resource = args.resource.as_str();
    // The name as messages show it: on one line, whatever it holds.
    let named = shown(resource);

    let spinner = Spinner::start(format!("waiting for the lock on {named}"), args.wait);
    let acquired = tokio::select! {
        acquired = rl.acquire(resource) => acquired,
        Some(origin) = signals.recv() => {
            spinner.stop();
            // The abandoned attempt releases its grants in the background: wait until that is
            // done (else the keys expire with their TTL), for at most the time a request may
            // take. A second signal ends the wait at once (it was swallowed: with a node
            // timeout of 2 s, ten seconds passed before a repeated Ctrl-C had any effect).
            tokio::select! {
                () = settle(&rl) => {}
                Some(_) = signals.recv() => {}
            }
            errln!("redlock: interrupted while waiting for the lock on {named}");
            return Ok(signal_exit(origin.signal));
        }
    };
    spinner.stop();
    let lock = match acquired {
        Ok(lock) => lock,
        Err(e) => {
            // A configuration error found while acquiring (one server reached under two
            // addresses) comes after the attempt was sent, and tells no node reports.
            if e.nodes().iter().any(|n| n.outcome.may_hold())
                || matches!(e, redlock::Error::Config(_))
            {
                // Nodes that granted (or whose answer is unknown) are released by a background
                // task of the client; wait for it before the process ends, or those keys live
                // out their TTL.
                settle(&rl).await;
            }
            return Err(acquire_failure(settings, resource, args.wait, &e));
        }
    };
    // Every node's grant, not only the deciding quorum's (see `Lock::fence_settled`).
    let fence = lock.fence_settled().await.map(|t| t.to_string());
    let guard = rl
        .guard(lock)
        .map_err(|e| Failure::new(exit::SOFTWARE, e.to_string()))?;
    let lease = guard.lease();

    let with_env = |mut command: tokio::process::Command| {
        command.env(RESOURCE_ENV, resource);
        match &fence {
            Some(token) => command.env(FENCE_TOKEN_ENV, token),
            // A token inherited from an outer lock must not pass for this one.
            None => command.env_remove(FENCE_TOKEN_ENV),
        };
        command
    };
    if lease.is_lost() {
        let _ = guard.release().await;
        errln!("redlock: the lock on {named} was lost before the command started");
        return Ok(exit::LOST);
    }
    // Orphans of what the command starts become this process's children, so that a lost lock
    // stops them too (Linux; elsewhere only the command itself is known).
    let adopted = crate::tree::adopt_orphans().unwrap_or_else(|e| {
        // On Linux the user counts on a lost lock stopping all of the job: say it will not.
        errln!(
            "redlock: warning: cannot adopt the orphans of the command's processes ({e}); \
             a lost lock stops only the command itself"
        );
        false
    });
    // A signal that came after the lock was taken reached no command: one from the terminal
    // (Ctrl-C) is not passed on later (see below), and the command would run to its end as if
    // it had not been sent. The command is not started at all; the lock is released.
    let signal = last_signal.load(Ordering::SeqCst);
    if signal != 0 {
        let _ = guard.release().await;
        errln!("redlock: interrupted before the command started; released the lock on {named}");
        return Ok(signal_exit(i32::try_from(signal).unwrap_or(0)));
    }
    // Without /proc (see `tied_command`), the command is started directly.
    let spawned = with_env(tied_command(&args.command))
        .spawn()
        .or_else(|_| with_env(direct_command(&args.command)).spawn());
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            let program = args.command[0].to_string_lossy();
            return Err(Failure::new(code, format!("{program}: {e}")));
        }
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let send = |signal: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, signal);
        }
    };
    // SIGKILL to the command and every process it started.
    let kill_all = || {
        send(Signal::SIGKILL);
        if adopted {
            crate::tree::stop_all();
        }
    };
    let mut reap = tokio::time::interval(REAP_EVERY);

    let mut lost = false;
    let mut grace_ends = later(args.grace);
    let kill_at = tokio::time::sleep(Duration::MAX);
    tokio::pin!(kill_at);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            Some(origin) = signals.recv() => {
                // A terminal's signal (from the kernel, one a terminal generates) went to the
                // whole foreground process group: the command has it already. Any other
                // kernel-sent one is passed on: SIGALRM of an `alarm()` set before `redlock`
                // started counted as the terminal's, and the command ran past its time limit
                // (test `run::an_alarm_set_before_redlock_started_reaches_the_command`).
                let from_terminal = origin.cause == Cause::Kernel
                    && [SIGINT, SIGQUIT, SIGHUP].contains(&origin.signal);
                if !from_terminal
                    && let Ok(signal) = Signal::try_from(origin.signal)
                {
                    send(signal);
                }
            }
            reason = lease.lost(), if !lost => {
                lost = true;
                // The command is told first: nothing after this may keep it from stopping.
                // Only the command: it may stop what it started in an order of its own (what
                // still runs when it exits is told then).
                send(Signal::SIGTERM);
                grace_ends = later(args.grace);
                kill_at.as_mut().reset(grace_ends);
                errln!(
                    "redlock: the lock on {named} was lost ({reason}); sent SIGTERM to the command, SIGKILL in {}",
                    humantime::format_duration(args.grace)
                );
            }
            () = &mut kill_at, if lost => {
                errln!("redlock: the command outlived --grace; sending SIGKILL");
                kill_all();
                kill_at.as_mut().reset(later(Duration::from_secs(3600)));
            }
            _ = reap.tick(), if adopted => crate::tree::reap_adopted(pid),
        }
    };
    let status = status
        .map_err(|e| Failure::new(exit::OS_ERROR, format!("waiting for the command: {e}")))?;
    // The command's exit and the loss may be ready together, and the loss is also found by the
    // lease's own clock (a process stalled past the validity): a lock lost by now was lost
    // while the command ran, whichever the wait saw first.
    if !lost && lease.is_lost() {
        lost = true;
        // What the command started gets its grace from now, not from when `run` began.
        grace_ends = later(args.grace);
        let reason = lease.reason().unwrap_or(LostReason::Expired);
        errln!("redlock: the lock on {named} was lost ({reason}) before the command exited");
    }
    if lost {
        if adopted {
            // What the command started may outlive it: it gets SIGTERM now, and SIGKILL if it
            // still runs at the end of the grace. Exit only once all of it is gone.
            stop_the_rest(grace_ends, pid).await;
        }
        if args.keep {
            // Lost through --max-hold, our keys are still there: --keep deletes nothing.
            drop(guard.stop_renewal());
        } else {
            // Owner-checked: deletes our key only where it is still ours.
            let _ = guard.release().await;
        }
        return Ok(exit::LOST);
    }
    if adopted {
        crate::tree::reap_adopted(pid);
    }
    if args.keep {
        // Renewal stops and nothing is deleted: the keys live out their TTL (counted from the
        // last renewal) on every node, whatever the command's exit code.
        let kept = guard.stop_renewal();
        drop(kept);
    } else if let Err(e) = guard.release().await {
        errln!(
            "redlock: warning: releasing the lock on {named} failed ({e}); it expires with its TTL"
        );
    }
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(exit::SOFTWARE),
        (None, Some(signal)) => signal_exit(signal),
        (None, None) => exit::SOFTWARE,
    })
}

/// How often orphans adopted from the command's processes are reaped while it runs.
const REAP_EVERY: Duration = Duration::from_secs(1);
/// How often `run` looks whether the processes the command started are gone, after the lock
/// was lost and the command exited.
const POLL_REST: Duration = Duration::from_millis(20);
/// How long processes killed with SIGKILL may take to be gone before `run` exits anyway.
const KILLED_WITHIN: Duration = Duration::from_secs(5);

/// After a lost lock and the command's exit: sends SIGTERM to the processes it started that
/// still run, and waits until this process has no child left (see `tree::none_left`), killing
/// what is left when the grace ends (again on every look, see `tree::stop_all`) and waiting at
/// most [`KILLED_WITHIN`] after that.
async fn stop_the_rest(grace_ends: tokio::time::Instant, command: Option<Pid>) {
    let mut killed_at: Option<tokio::time::Instant> = None;
    crate::tree::signal_all(Signal::SIGTERM);
    loop {
        crate::tree::reap_adopted(command);
        if crate::tree::none_left() {
            return;
        }
        let now = tokio::time::Instant::now();
        if now >= grace_ends {
            if killed_at.is_none() {
                errln!(
                    "redlock: {} process(es) the command started outlived --grace; sending SIGKILL",
                    crate::tree::descendants().len()
                );
                killed_at = Some(now);
            }
            crate::tree::stop_all();
        }
        if killed_at.is_some_and(|at| now - at >= KILLED_WITHIN) {
            // Not ours to signal (another user's, as under `sudo -u`) or stuck in the kernel:
            // the user must know that part of the job may still run, unprotected, and where.
            report_survivors();
            return;
        }
        tokio::time::sleep(POLL_REST).await;
    }
}

/// How many survivors' pids [`report_survivors`] names at most.
const SURVIVORS_SHOWN: usize = 10;

/// Says on stderr which processes the command started still run when `run` stops waiting for
/// them (none said nothing: `run` exited 79 as if the job were stopped).
fn report_survivors() {
    let left = crate::tree::descendants();
    if left.is_empty() {
        return;
    }
    let mut pids: Vec<String> = left
        .iter()
        .take(SURVIVORS_SHOWN)
        .map(|p| p.to_string())
        .collect();
    if left.len() > SURVIVORS_SHOWN {
        pids.push("…".into());
    }
    errln!(
        "redlock: {} process(es) the command started still run {} after SIGKILL (pid {}); \
         they run without the lock",
        left.len(),
        humantime::format_duration(KILLED_WITHIN),
        pids.join(", ")
    );
}

/// The shell's exit code for death by `signal`: 128 + its number.
fn signal_exit(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(exit::SOFTWARE)
}

fn acquire_failure(settings: &Settings, resource: &str, wait: Duration, e: &Error) -> Failure {
    let resource = shown(resource);
    match e {
        Error::Busy { .. } if wait.is_zero() => Failure::new(
            exit::BUSY,
            format!("{resource} is locked by another owner ({e})"),
        ),
        Error::Busy { .. } => Failure::new(
            exit::BUSY,
            format!(
                "{resource} is still locked by another owner after waiting {} ({e})",
                humantime::format_duration(wait)
            ),
        ),
        Error::Config(_) => settings.config_failure(e),
        _ => Failure::new(code_of(e), format!("{resource}: {e}")),
    }
}

/// `d` from now, or a century from now when that does not fit (`--grace` takes any duration).
fn later(d: Duration) -> tokio::time::Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    tokio::time::Instant::now() + d.min(CENTURY)
}
