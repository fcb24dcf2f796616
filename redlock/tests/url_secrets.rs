//! Node URLs through the public API, as a careless or hostile configuration gives them: the
//! password hidden in every encoding and in every error (a URL without host or `@` included,
//! which showed the password before), normalised spellings of one address refused as
//! duplicates, odd URLs refused without a panic, and grants released after an attempt finds one
//! server under two addresses (real redis-server processes, loopback).

mod common;

use std::time::Duration;

use redlock::{ConfigError, Error, Redlock, RetryPolicy};
use redlock_testkit::Cluster;

const L: &str = "Kq7vZ";
const R: &str = "Wm3xJ";

fn assert_hidden(what: &str, text: &str) {
    assert!(
        !text.contains(L) && !text.contains(R),
        "{what}: a piece of the password is shown: {text}"
    );
}

fn build(urls: &[&str]) -> Result<Redlock, Error> {
    Redlock::builder()
        .nodes(urls.iter().map(|u| (*u).to_owned()))
        .build()
}

fn percent_encode_all(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

/// Accepted URLs: the builder's `Debug` and the client's `Debug` never show the password, in any
/// encoding.
#[test]
fn debug_output_hides_every_form_of_the_password() {
    let pw = format!("{L}@:{R}");
    let enc = percent_encode_all(&pw);
    for url in [
        format!("redis://u:{enc}@127.0.0.1:7001"),
        format!("redis://u:{L}@{R}@127.0.0.1:7001"),
        format!("redis://:{L}:{R}@[::1]:7001/3"),
        format!("rediss://u:{enc}@localhost:7001"),
        format!("redis+unix:///tmp/r.sock?db=1&pass={enc}"),
    ] {
        let b = Redlock::builder().nodes([url.clone()]);
        assert_hidden(&url, &format!("{b:?}"));
        let rl = b.build().unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_hidden(&url, &format!("{rl:?}"));
    }
}

/// Rejected URLs: the message never shows the password.
#[test]
fn errors_never_show_the_password() {
    for url in [
        format!("redis://u:{L}{R}@127.0.0.1:99999"),
        format!("redis://u:{L}{R}@127.0.0.1:1/notadb"),
        format!("redis://u:{L}%FF{R}@127.0.0.1:1"),
        format!("redis+unix:///tmp/s?pass={L}{R}&db=x"),
        format!("redis+unix:///tmp/s?password={L}{R}"),
        format!("redis+unix:///tmp/s?PASS={L}{R}"),
        format!("redis+unix://u:{L}{R}@/tmp/s"),
        format!("redis://u:{L}{R}@127.0.0.1:1#frag"),
        format!("redis://u:{L}/{R}@127.0.0.1:1"),
        format!("redis://127.0.0.1:7001/?password={L}{R}"),
        format!("redis://127.0.0.1:7001?pass={L}{R}&user=u"),
    ] {
        let e = build(&[&url]).err().map(|e| e.to_string());
        if let Some(e) = e {
            assert_hidden(&url, &e);
        }
    }
}

/// A URL without a host after the password (`redis://:pw`, or the first half of a list split
/// at a comma inside a password) is not shown after its first ':', which may start a password
/// as well as a port (it used to be shown whole).
#[test]
fn a_password_without_a_host_is_not_shown() {
    for url in [
        format!("redis://:{L}{R}"),
        format!("redis://alice:{L}"),
        format!("redis://:{L}#{R}"),
    ] {
        let e = build(&[&url])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!e.is_empty(), "{url} accepted");
        assert_hidden(&url, &e);
    }
}

/// One `host:port/db` under two spellings the parser normalises is a `DuplicateNode`.
#[test]
fn normalised_spellings_of_one_address_are_duplicates() {
    for (a, b) in [
        ("redis://127.0.0.1:7001", "redis://127.0.0.1:7001/0"),
        ("redis://Host:7001", "redis://host:7001"),
        ("redis://[::1]:7001", "redis://[0:0:0:0:0:0:0:1]:7001"),
        ("redis://h", "redis://h:6379"),
        ("redis://u:a@h:1", "redis://v:b@h:1"),
    ] {
        let got = build(&[a, b, "redis://other:1"]);
        assert!(
            matches!(got, Err(Error::Config(ConfigError::DuplicateNode { .. }))),
            "{a} / {b}: {:?}",
            got.map(|_| ())
        );
    }
}

/// Odd ports and sizes: an error or a client, never a panic.
#[test]
fn odd_urls_give_errors_not_panics() {
    let long_host = "h".repeat(10_000);
    for url in [
        "redis://h:0".to_owned(),
        "redis://h:65536".to_owned(),
        "redis://h:18446744073709551616".to_owned(),
        format!("redis://{long_host}:1"),
        "redis://[::1".to_owned(),
        "redis://[zz]:1".to_owned(),
        "redis://h:1/99999999999999999999".to_owned(),
        "redis+unix://".to_owned(),
        "redis+unix:///".to_owned(),
        "unix:relative".to_owned(),
        "redis:///".to_owned(),
    ] {
        let _ = build(&[&url]);
    }
}

/// A `redis://` or `rediss://` URL takes only `protocol` in its query (the database goes in
/// the path, the password in the userinfo) and no fragment; a database is 0 or more. Each of
/// these built a client that did something else than the URL says, without a word (found in
/// review): `?db=3` locked in database 0, `?password=` and `?pass=` connected without AUTH
/// (every request then failed NOAUTH), `#insecure` asked redis-rs to skip certificate checks
/// (refused at connect without its `tls-rustls-insecure` feature, honoured with it), and a
/// negative database failed every connection.
#[test]
fn tcp_urls_with_parameters_they_ignore_are_refused() {
    for url in [
        "redis://127.0.0.1:1?db=3",
        "redis://127.0.0.1:1/?password=s3cret",
        "redis://127.0.0.1:1?pass=s3cret&user=u",
        "redis://127.0.0.1:1/2?db=3",
        "rediss://127.0.0.1:1#insecure",
        "redis://127.0.0.1:1#frag",
        "redis://127.0.0.1:1/-1",
        "redis+unix:///tmp/s?db=-1",
    ] {
        match build(&[url]) {
            Err(Error::Config(ConfigError::InvalidNodeUrl { reason, .. })) => {
                println!("{url}: {reason}");
            }
            other => panic!("{url}: expected InvalidNodeUrl, got {other:?}"),
        }
    }
    for url in [
        "redis://127.0.0.1:1?protocol=resp3",
        "redis://127.0.0.1:1/3",
        "redis+unix:///tmp/s?db=2",
    ] {
        build(&[url]).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

/// One server under two spellings, found out while an attempt runs: the attempt fails with
/// `SameServer`, and its grants on the other nodes are released in the background (the runtime
/// stays up here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_server_failure_releases_its_grants() {
    let cluster = Cluster::start(2).await.unwrap();
    let p0 = cluster.node(0).port();
    let p1 = cluster.node(1).port();
    let mut refused = 0;
    for i in 0..6 {
        let rl = Redlock::builder()
            .nodes([
                format!("redis://127.0.0.1:{p0}"),
                format!("redis://127.1:{p0}"),
                format!("redis://127.0.0.1:{p1}"),
            ])
            .ttl(Duration::from_secs(60))
            .node_timeout(common::NODE_TIMEOUT)
            .retry(RetryPolicy::once())
            .build()
            .unwrap();
        let resource = format!("dup{i}");
        match rl.acquire(&resource).await {
            // Node #1 connected after #0 and #2 granted: a quorum of two distinct servers.
            Ok(lock) => {
                let _ = rl.release(lock).await;
            }
            Err(Error::Config(_)) => {
                refused += 1;
                assert!(
                    common::no_lock_keys_within(&cluster, Duration::from_secs(2)).await,
                    "keys left: {:?}",
                    common::lock_keys(&cluster).await
                );
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(refused > 0, "never refused");
}
