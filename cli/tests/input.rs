//! Bad input: a clear message and the usage (64) or config (78) exit code, never a panic. No
//! server is needed for these: nothing is sent before the input is checked.

mod common;

use common::{assert_clean_failure, output, redlock};

const NODES: &str = "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3";

#[tokio::test]
async fn an_unknown_flag_is_a_usage_error() {
    let out = output(redlock([
        "--nodes", NODES, "run", "--bogus", "r", "--", "true",
    ]))
    .await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert_clean_failure(&out);
    assert!(out.stderr.contains("--bogus"), "{}", out.stderr);
}

#[tokio::test]
async fn a_bad_duration_is_a_usage_error() {
    let out = output(redlock([
        "--nodes",
        NODES,
        "run",
        "--ttl",
        "3 parsecs",
        "r",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert_clean_failure(&out);
    assert!(out.stderr.contains("duration"), "{}", out.stderr);
}

#[tokio::test]
async fn an_empty_node_list_is_a_usage_error() {
    for nodes in ["", ",", " , "] {
        let out = output(redlock(["--nodes", nodes, "status", "r"])).await;
        assert_eq!(out.code, Some(64), "{nodes:?}: {out:?}");
        assert_clean_failure(&out);
        assert!(out.stderr.contains("empty"), "{}", out.stderr);
    }
    // No nodes anywhere.
    let out = output(redlock(["status", "r"])).await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("no nodes"), "{}", out.stderr);
}

#[tokio::test]
async fn a_bad_url_is_a_usage_error_without_its_password() {
    for url in [
        "http://127.0.0.1:1",
        "redis://:hunter2pw@127.0.0.1:notaport",
        "redis://127.0.0.1:1/x?y#z@",
    ] {
        let out = output(redlock(["--nodes", url, "run", "r", "--", "true"])).await;
        assert_eq!(out.code, Some(64), "{url}: {out:?}");
        assert_clean_failure(&out);
        assert!(!out.all().contains("hunter2pw"), "{}", out.all());
    }
}

#[tokio::test]
async fn a_missing_command_or_resource_is_a_usage_error() {
    let out = output(redlock(["--nodes", NODES, "run", "r"])).await;
    assert_eq!(out.code, Some(64), "{out:?}");
    let out = output(redlock(["--nodes", NODES, "run", "", "--", "true"])).await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert_clean_failure(&out);
    let out = output(redlock(["--nodes", NODES, "status", ""])).await;
    assert_eq!(out.code, Some(64), "{out:?}");
}

#[tokio::test]
async fn a_bad_config_file_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        "nodes = [\"redis://:tomlsecret@127.0.0.1:1\"\nkey_prefix = 3\n",
    )
    .unwrap();
    let out = output(redlock(["--config", path.to_str().unwrap(), "status", "r"])).await;
    assert_eq!(out.code, Some(78), "{out:?}");
    assert_clean_failure(&out);
    assert!(!out.all().contains("tomlsecret"), "{}", out.all());

    std::fs::write(&path, "nodes = [\"ftp://127.0.0.1:1\"]\n").unwrap();
    let out = output(redlock(["--config", path.to_str().unwrap(), "status", "r"])).await;
    assert_eq!(out.code, Some(78), "{out:?}");

    std::fs::write(&path, "nodez = []\n").unwrap();
    let out = output(redlock(["--config", path.to_str().unwrap(), "status", "r"])).await;
    assert_eq!(out.code, Some(78), "{out:?}");
    assert!(out.stderr.contains("nodez"), "{}", out.stderr);

    let out = output(redlock([
        "--config",
        "/nonexistent/redlock.toml",
        "status",
        "r",
    ]))
    .await;
    assert_eq!(out.code, Some(78), "{out:?}");
}

/// A connect timeout of zero would time every connection out at once: refused before anything
/// is sent, with the exit code of where it was set.
#[tokio::test]
async fn a_zero_connect_timeout_is_refused_where_it_was_set() {
    for command in [
        &["run", "r", "--", "true"][..],
        &["status", "r"],
        &["doctor"],
    ] {
        let mut args = vec!["--nodes", NODES, "--connect-timeout", "0s"];
        args.extend(command);
        let out = output(redlock(&args)).await;
        assert_eq!(out.code, Some(64), "{command:?}: {out:?}");
        assert_clean_failure(&out);
        assert!(out.stderr.contains("connect timeout"), "{}", out.stderr);
    }

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        "nodes = [\"redis://127.0.0.1:1\"]\nconnect_timeout = \"0s\"\n",
    )
    .unwrap();
    let out = output(redlock(["--config", path.to_str().unwrap(), "status", "r"])).await;
    assert_eq!(out.code, Some(78), "{out:?}");
    assert!(out.stderr.contains("connect timeout"), "{}", out.stderr);
    // The flag wins over the file.
    let out = output(redlock([
        "--config",
        path.to_str().unwrap(),
        "--connect-timeout",
        "1s",
        "status",
        "r",
    ]))
    .await;
    assert_eq!(out.code, Some(69), "the nodes are unreachable: {out:?}");
}

/// The longest durations the flags parse are not a crash: `status` and `doctor` added the
/// connect timeout to the node timeout and panicked on the overflow (found in review).
#[tokio::test]
async fn the_longest_connect_timeout_is_not_a_crash() {
    let longest = format!("{}s", u64::MAX);
    // `status` cannot tell (69); `doctor` reports errors (1).
    for (command, code) in [
        (&["status", "r"][..], 69),
        (&["doctor", "--clock-sample", "100ms"], 1),
    ] {
        let mut args = vec![
            "--nodes",
            NODES,
            "--node-timeout",
            "1s",
            "--connect-timeout",
            &longest,
        ];
        args.extend(command);
        let out = output(redlock(&args)).await;
        assert!(
            !out.stderr.contains("panicked"),
            "{command:?}: {}",
            out.stderr
        );
        assert_eq!(
            out.code,
            Some(code),
            "{command:?}: unreachable nodes, not a crash: {out:?}"
        );
    }
}

#[tokio::test]
async fn help_exits_0_and_shows_no_password_from_the_environment() {
    let mut cmd = redlock(["run", "--help"]);
    cmd.env("REDLOCK_PASSWORD", "envsecretpw")
        .env("REDLOCK_NODES", "redis://:urlsecretpw@127.0.0.1:1");
    let out = output(cmd).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("--wait"), "{}", out.stdout);
    assert!(!out.all().contains("envsecretpw") && !out.all().contains("urlsecretpw"));
}
