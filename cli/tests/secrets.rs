//! A password — in a URL or in $REDLOCK_PASSWORD — never appears in any output: not on
//! success, not in errors, not in JSON.

mod common;

use common::{finish, output, redlock, wait_for_key};
use redlock_testkit::Cluster;

const PW: &str = "Sup3rSecretPw";

#[tokio::test]
async fn a_password_never_appears_in_any_output() {
    let cluster = Cluster::builder()
        .nodes(3)
        .arg("requirepass", PW)
        .start()
        .await
        .unwrap();
    let with_pw: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://:{PW}@127.0.0.1:{}", n.port()))
        .collect();
    let with_pw = with_pw.join(",");
    let bare: Vec<String> = cluster.nodes().iter().map(|n| n.url()).collect();
    let bare = bare.join(",");
    let mut outputs = Vec::new();

    // Success paths, with the password in the URL.
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let script = format!("while [ ! -e {} ]; do sleep 0.02; done", stop.display());
    let holder = redlock(["--nodes", &with_pw, "run", "r", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_for_key(&cluster, "redlock:lock:r", 3).await;
    for args in [
        vec!["--nodes", &with_pw, "status", "r"],
        vec!["--nodes", &with_pw, "status", "r", "--json"],
        vec!["--nodes", &with_pw, "doctor", "--clock-sample", "50ms"],
        vec![
            "--nodes",
            &with_pw,
            "doctor",
            "--json",
            "--clock-sample",
            "50ms",
        ],
        // Busy: the error lists every node.
        vec!["--nodes", &with_pw, "run", "r", "--", "true"],
        vec!["--nodes", &with_pw, "--bogus", "status", "r"],
        vec!["--nodes", &with_pw, "status", "r", "extra-argument"],
    ] {
        outputs.push((args.join(" "), output(redlock(&args)).await));
    }
    assert_eq!(outputs[0].1.code, Some(0), "{:?}", outputs[0]);
    assert!(
        outputs[0].1.stdout.contains("held by a quorum"),
        "{:?}",
        outputs[0]
    );
    assert_eq!(outputs[4].1.code, Some(75), "{:?}", outputs[4]);
    std::fs::write(&stop, "").unwrap();
    outputs.push(("holder".into(), finish(holder).await));

    // The password from the environment, for URLs without one.
    let mut cmd = redlock(["--nodes", &bare, "status", "r", "--json"]);
    cmd.env("REDLOCK_PASSWORD", PW);
    let env_status = output(cmd).await;
    assert_eq!(env_status.code, Some(0), "{env_status:?}");
    outputs.push(("env status".into(), env_status));
    let mut cmd = redlock(["run", "r", "--", "true"]);
    cmd.env("REDLOCK_PASSWORD", PW).env("REDLOCK_NODES", &bare);
    let env_run = output(cmd).await;
    assert_eq!(env_run.code, Some(0), "{env_run:?}");
    outputs.push(("env run".into(), env_run));

    // Errors: a wrong password, unreachable nodes, a malformed URL.
    let wrong = with_pw.replace(PW, "wrong-password");
    let out = output(redlock(["--nodes", &wrong, "status", "r"])).await;
    assert_eq!(out.code, Some(69), "{out:?}");
    outputs.push(("wrong password".into(), out));
    let dead =
        format!("redis://:{PW}@127.0.0.1:1,redis://:{PW}@127.0.0.1:2,redis://:{PW}@127.0.0.1:3");
    for args in [
        vec!["--nodes", &dead, "run", "r", "--", "true"],
        vec!["--nodes", &dead, "status", "r", "--json"],
        vec!["--nodes", &dead, "doctor", "--json"],
    ] {
        outputs.push((args.join(" "), output(redlock(&args)).await));
    }
    let bad = format!("redis://:{PW}@127.0.0.1:port");
    outputs.push((
        "bad url".into(),
        output(redlock(["--nodes", &bad, "status", "r"])).await,
    ));
    let mut cmd = redlock(["--nodes", "redis://127.0.0.1:notaport", "status", "r"]);
    cmd.env("REDLOCK_PASSWORD", PW);
    outputs.push(("bad url, env password".into(), output(cmd).await));

    for (what, out) in &outputs {
        assert!(!out.all().contains(PW), "{what}: {}", out.all());
        assert!(!out.stderr.contains("panicked"), "{what}: {}", out.stderr);
    }
}
