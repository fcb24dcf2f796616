//! `redlock demo` (feature `demo`): starts a local 5-node cluster of real redis-server
//! processes with `redlock-testkit` (temp dirs, free loopback ports, a fault proxy in front of
//! each) and shows this binary's commands at work on it: a lock taken, contended, surviving a
//! faulty minority, failing fast without a quorum, renewed past its TTL, lost, and released.

use std::time::{Duration, Instant};

use redlock_testkit::Cluster;
use redlock_testkit::redis::AsyncCommands;

use crate::exit::{self, Failure};
use crate::settings::{CONFIG_ENV, NODES_ENV, PASSWORD_ENV};

fn failed(e: impl std::fmt::Display) -> Failure {
    Failure::new(exit::SOFTWARE, format!("demo: {e}"))
}

pub(crate) async fn run() -> Result<u8, Failure> {
    outln!("== starting 5 independent redis-server masters (each behind a fault proxy)");
    let cluster = Cluster::builder()
        .nodes(5)
        .proxied(true)
        .start()
        .await
        .map_err(failed)?;
    let nodes = cluster.urls().join(",");
    outln!("   export {NODES_ENV}={nodes}");
    // Every command below gets these nodes with --nodes; they are shown as this export.
    let with_nodes = |args: &[&str]| -> Vec<String> {
        let mut v = vec!["--nodes".to_owned(), nodes.clone()];
        v.extend(args.iter().map(|s| (*s).to_owned()));
        v
    };
    // What each step is expected to show; a demo that shows something else says so and
    // exits non-zero (CI runs it).
    let mut surprises: Vec<String> = Vec::new();
    let run = async |args: &[&str]| {
        let all = with_nodes(args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        redlock(&refs).await
    };

    outln!("\n== 1. is this cluster fit for Redlock?");
    let doctor = run(&["doctor", "--clock-sample", "200ms"]).await?;
    // Warnings (exit 0) are expected on a throwaway cluster; errors are not.
    expect(&mut surprises, "doctor", doctor, 0);

    outln!("\n== 2. a job under a lock: the command gets the resource and a fence token");
    let job = run(&[
        "run",
        "orders:42",
        "--",
        "sh",
        "-c",
        "echo \"holding $REDLOCK_RESOURCE, fence token $REDLOCK_FENCE_TOKEN\"",
    ])
    .await?;
    expect(&mut surprises, "a job under a lock", job, 0);

    outln!("\n== 3. a second owner is refused while the first holds it (exit 75), or waits");
    let exe = std::env::current_exe().map_err(failed)?;
    let mut first = child(&exe)
        .args(with_nodes(&["run", "orders:42", "--", "sleep", "1.5"]))
        .spawn()
        .map_err(failed)?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = run(&["status", "orders:42"]).await?;
    expect(&mut surprises, "status of a held lock", status, 0);
    let refused = run(&["run", "orders:42", "--", "echo", "never printed"]).await?;
    expect(
        &mut surprises,
        "a second owner",
        refused,
        i32::from(exit::BUSY),
    );
    let waited = run(&[
        "run",
        "--wait",
        "5s",
        "orders:42",
        "--",
        "echo",
        "ran after the first released",
    ])
    .await?;
    expect(&mut surprises, "a waiting second owner", waited, 0);
    let _ = first.wait().await;

    outln!("\n== 4. contention: 4 hosts x 3 jobs on one lock, a plain counter file under it");
    let dir = tempfile_dir()?;
    let counter = dir.join("counter");
    std::fs::write(&counter, "0").map_err(failed)?;
    let job = format!(
        "n=$(cat {c}); sleep 0.02; echo $((n + 1)) > {c}",
        c = counter.display()
    );
    let mut workers = Vec::new();
    for _ in 0..4 {
        let args = with_nodes(&[
            "run",
            "--wait",
            "20s",
            "report:daily",
            "--",
            "sh",
            "-c",
            &job,
        ]);
        let exe = exe.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..3 {
                let status = child(&exe).args(&args).status().await;
                if !status.is_ok_and(|s| s.success()) {
                    return false;
                }
            }
            true
        }));
    }
    let mut all_ok = true;
    for w in workers {
        all_ok &= w.await.unwrap_or(false);
    }
    let count = std::fs::read_to_string(&counter).map_err(failed)?;
    if !all_ok || count.trim() != "12" {
        surprises.push(format!(
            "contention: counter {}, all runs succeeded: {all_ok}",
            count.trim()
        ));
    }
    outln!(
        "   12 runs {}; counter = {} (exactly 12: no lost update)",
        if all_ok {
            "succeeded"
        } else {
            "did NOT all succeed"
        },
        count.trim()
    );

    outln!("\n== 5. a faulty minority does not stop the lock");
    cluster.node(0).pause();
    if let Some(proxy) = cluster.node(1).proxy() {
        proxy.set_delay(Duration::from_millis(300), Duration::ZERO);
    }
    outln!("   (node 0 paused, node 1 delayed by 300 ms)");
    let minority = run(&["run", "cache:rebuild", "--", "true"]).await?;
    expect(&mut surprises, "a faulty minority", minority, 0);

    outln!("\n== 6. without a quorum the answer is fast and definite (exit 69)");
    cluster.node(2).kill();
    outln!("   (node 2 killed too)");
    let no_quorum = run(&["run", "cache:rebuild", "--", "true"]).await?;
    expect(
        &mut surprises,
        "no quorum",
        no_quorum,
        i32::from(exit::UNAVAILABLE),
    );
    cluster.node(0).resume();
    if let Some(proxy) = cluster.node(1).proxy() {
        proxy.heal();
    }
    outln!("   (node 0 resumed, node 1 healed; node 2 still dead)");
    let healed = run(&["run", "--wait", "2s", "cache:rebuild", "--", "true"]).await?;
    expect(&mut surprises, "after healing", healed, 0);

    outln!("\n== 7. a job longer than the TTL: renewed while it runs, then released");
    let long = run(&[
        "run",
        "--ttl",
        "500ms",
        "nightly",
        "--",
        "sh",
        "-c",
        "sleep 1.6; echo finished a 1.6 s job under a 500 ms TTL",
    ])
    .await?;
    expect(&mut surprises, "a job longer than the TTL", long, 0);

    outln!("\n== 8. a lost lock stops the job (SIGTERM) and exits 79");
    let stealer = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        for i in [0, 1, 3, 4] {
            if let Ok(mut conn) = cluster.node(i).connection().await {
                let _: Result<i64, _> = conn.del("redlock:lock:fragile").await;
            }
        }
        outln!("   (the lock's keys deleted on every node behind its back)");
    };
    let (result, ()) = tokio::join!(
        run(&["run", "--ttl", "600ms", "fragile", "--", "sleep", "10"]),
        stealer
    );
    expect(
        &mut surprises,
        "a lost lock",
        result?,
        i32::from(exit::LOST),
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = cluster.keys("redlock:lock:*").await;
    outln!("\n== done: lock keys left on the nodes: {}", left.len());
    if !left.is_empty() {
        surprises.push(format!("{} lock keys left on the nodes", left.len()));
    }
    let _ = std::fs::remove_dir_all(&dir);
    if surprises.is_empty() {
        outln!("   every step showed what it should");
        Ok(exit::OK)
    } else {
        Err(failed(format!(
            "the demo did not show what it should: {}",
            surprises.join("; ")
        )))
    }
}

/// Notes a step whose exit code was not the one the demo sets out to show.
fn expect(surprises: &mut Vec<String>, step: &str, (code, _took): (i32, Duration), want: i32) {
    if code != want {
        surprises.push(format!("{step}: exit {code}, expected {want}"));
    }
}

/// Runs this binary with `args`; prints the command (without the `--nodes` value, which the
/// export line stands for), its output and its exit code.
async fn redlock(args: &[&str]) -> Result<(i32, Duration), Failure> {
    let shown: Vec<&str> = match args {
        ["--nodes", _, rest @ ..] => rest.to_vec(),
        other => other.to_vec(),
    };
    let exe = std::env::current_exe().map_err(failed)?;
    outln!("   $ redlock {}", shown.join(" "));
    let started = Instant::now();
    let out = child(&exe).args(args).output().await.map_err(failed)?;
    let took = started.elapsed();
    for line in String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
    {
        outln!("     {line}");
    }
    let code = out.status.code().unwrap_or(-1);
    outln!("     -> exit {code} after {took:.0?}");
    Ok((code, took))
}

/// `redlock` run by the demo against its own cluster: whatever the user's environment and
/// config file say for their own nodes (a password, a restart quarantine, a key prefix, a node
/// timeout) is not for these (with `$REDLOCK_PASSWORD` set, or a config file with a restart
/// quarantine, every step of the demo failed).
fn child(exe: &std::path::Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.env(CONFIG_ENV, "/dev/null")
        .env_remove(PASSWORD_ENV)
        .env_remove(NODES_ENV);
    cmd
}

/// A fresh directory for the demo's counter file.
fn tempfile_dir() -> Result<std::path::PathBuf, Failure> {
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(failed)?;
    let name: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("redlock-demo-{name}"));
    std::fs::create_dir(&dir).map_err(failed)?;
    Ok(dir)
}
