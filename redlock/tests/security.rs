//! ACL users, TLS with a custom CA, and secrets kept out of errors and logs.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{NODE_TIMEOUT, eventually, lock_keys, no_lock_keys_within};
use redlock::{NodeErrorKind, NodeOutcome, Redlock, RetryPolicy};
use redlock_testkit::{Cluster, TestPki};

const PASSWORD: &str = "Corr3ct-Horse-Battery";

/// Captures everything `tracing` emits (all levels) so tests can search it for secrets.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn client(urls: Vec<String>) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .node_timeout(NODE_TIMEOUT)
        .retry(RetryPolicy::once())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_works_and_wrong_password_is_clear_and_not_echoed() {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let cluster = Cluster::start(3).await.unwrap();
    for node in cluster.nodes() {
        let mut c = node.connection().await.unwrap();
        let () = redlock_testkit::redis::cmd("ACL")
            .arg(
                &[
                    "SETUSER",
                    "locker",
                    "on",
                    &format!(">{PASSWORD}"),
                    "~redlock:*",
                    "+@all",
                ][..],
            )
            .query_async(&mut c)
            .await
            .unwrap();
        // The default user no longer works without a password.
        let () = redlock_testkit::redis::cmd("ACL")
            .arg(&["SETUSER", "default", "off"][..])
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let url =
        |i: usize, pw: &str| format!("redis://locker:{pw}@127.0.0.1:{}", cluster.node(i).port());

    let good = client((0..3).map(|i| url(i, PASSWORD)).collect());
    let lock = good.try_acquire("acl").await.expect("ACL user can lock");
    let token = lock.token().expose().to_owned();
    good.release(lock).await.unwrap();

    let wrong = "Wr0ng-Password-123";
    let bad = client((0..3).map(|i| url(i, wrong)).collect());
    let err = bad.try_acquire("acl").await.unwrap_err();
    assert!(err.is_quorum_unreachable(), "{err}");
    // The outcome is decided after two failures; the third node may still be pending.
    let mut auth_failures = 0;
    for n in err.nodes() {
        match &n.outcome {
            NodeOutcome::Failed(e) => {
                assert_eq!(e.kind(), NodeErrorKind::Auth, "{e}");
                auth_failures += 1;
            }
            NodeOutcome::Pending => {}
            other => panic!("expected an auth failure, got {other}"),
        }
    }
    assert!(auth_failures >= 2, "{err}");
    let shown = format!("{err} {err:?} {bad:?} {good:?}");
    assert!(
        shown.to_lowercase().contains("wrongpass") || shown.contains("auth"),
        "{shown}"
    );
    assert!(
        !shown.contains(wrong) && !shown.contains(PASSWORD),
        "{shown}"
    );

    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("redlock"), "the test captured no logs");
    assert!(
        !logs.contains(wrong) && !logs.contains(PASSWORD),
        "password in logs"
    );
    assert!(!logs.contains(&token), "full token in logs");
}

/// Room for a TLS handshake in a debug build on a loaded machine.
const HANDSHAKE_ROOM: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_nodes_are_reachable_with_a_custom_ca() {
    let pki = TestPki::generate().unwrap();
    let cluster = Cluster::builder()
        .nodes(3)
        .tls(pki.tls_files())
        .start()
        .await
        .unwrap();
    let urls = cluster.tls_urls().expect("a TLS listener");
    assert!(urls.iter().all(|u| u.starts_with("rediss://")));

    // The connections are opened first, with room: a debug build's TLS handshake on a busy
    // machine took longer than a first request's connection budget (five node timeouts, 250 ms
    // at the default). This test is about reaching the nodes, not about speed.
    let rl = Redlock::builder()
        .nodes(urls.clone())
        .tls_root_ca(pki.ca_pem().as_bytes())
        .retry(RetryPolicy::once())
        .connect_timeout(HANDSHAKE_ROOM)
        .build()
        .unwrap();
    let reports = rl.connect().await;
    assert!(
        reports
            .iter()
            .all(|r| matches!(r.outcome, NodeOutcome::Confirmed)),
        "{reports:?}"
    );
    let lock = rl.try_acquire("tls").await.expect("TLS acquire");
    // The third grant may land just after the quorum decision.
    assert!(
        eventually(Duration::from_secs(2), || async {
            lock_keys(&cluster).await.len() == 3
        })
        .await
    );
    rl.release(lock).await.unwrap();
    // A release returns at a quorum of deletes; the last node's may still be on its way.
    assert!(no_lock_keys_within(&cluster, Duration::from_secs(2)).await);

    // Without our CA the handshake is refused: an error, not a silent plaintext fallback.
    // A node timeout of a second gives the failing handshake the same room, so it is
    // reported as refused rather than timed out.
    let untrusted = Redlock::builder()
        .nodes(urls)
        .retry(RetryPolicy::once())
        .node_timeout(Duration::from_secs(1))
        .connect_timeout(HANDSHAKE_ROOM)
        .build()
        .unwrap();
    let err = untrusted.try_acquire("tls").await.unwrap_err();
    assert!(err.is_quorum_unreachable(), "{err}");
    let failed = err
        .nodes()
        .iter()
        .filter(|n| matches!(n.outcome, NodeOutcome::Failed(_)))
        .count();
    assert!(failed >= 2, "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
}

// ---- Passwords with reserved characters (audit finding 9) ----

/// Halves of every test password. Alphanumeric, so they read the same raw, percent-encoded and
/// percent-decoded: any piece of a password that leaks shows at least one of them.
const PW_LEFT: &str = "Kq7vZ";
const PW_RIGHT: &str = "Wm3xJ";

/// Every RFC 3986 reserved character (gen-delims, then sub-delims), `%`, space and non-ASCII.
const AWKWARD: &[&str] = &[
    ":", "/", "?", "#", "[", "]", "@", "!", "$", "&", "'", "(", ")", "*", "+", ",", ";", "=", "%",
    " ", "é", "€", "🔒",
];

/// `s` with every byte except ASCII letters and digits percent-encoded.
fn percent_encode_all(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Which forms of `password` appear in `text`.
fn leaked_forms(text: &str, password: &str) -> Vec<&'static str> {
    let encoded = percent_encode_all(password);
    let forms = [
        ("raw", password),
        ("percent-encoded", encoded.as_str()),
        ("left half", PW_LEFT),
        ("right half", PW_RIGHT),
    ];
    forms
        .into_iter()
        .filter(|(_, form)| text.contains(form))
        .map(|(name, _)| name)
        .collect()
}

/// Builds a client on `url` (plus one plain node, so `build()` logs its even-count warning and
/// the capture is known to work) with every `tracing` level captured, and returns everything
/// the caller can see: the builder's `Debug`, then the client's `Debug` or the error's
/// `Display` and `Debug`, then the logs.
fn everything_shown_by_build(
    url: &str,
) -> (
    Result<(), redlock::ConfigError>,
    Vec<(&'static str, String)>,
) {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    tracing::trace!("capture check");

    let builder = Redlock::builder().nodes([url, "redis://127.0.0.1:2"]);
    let mut shown = vec![("RedlockBuilder Debug", format!("{builder:?}"))];
    let outcome = match builder.build() {
        Ok(rl) => {
            shown.push(("Redlock Debug", format!("{rl:?}")));
            shown.push(("Redlock::node_names", format!("{:?}", rl.node_names())));
            let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
            assert!(logs.contains("even number"), "build() logged nothing");
            Ok(())
        }
        Err(e) => {
            shown.push(("build() error Display", e.to_string()));
            shown.push(("build() error Debug", format!("{e:?}")));
            match e {
                redlock::Error::Config(c) => Err(c),
                other => panic!("build() failed with a non-config error: {other:?}"),
            }
        }
    };
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("capture check"), "the test captured no logs");
    shown.push(("TRACE logs", logs));
    (outcome, shown)
}

#[test]
fn passwords_with_reserved_characters_never_leak() {
    let mut findings = Vec::new();
    for c in AWKWARD {
        let password = format!("{PW_LEFT}{c}{PW_RIGHT}");
        let encoded = percent_encode_all(&password);
        let cases = [
            ("raw", format!("redis://alice:{password}@127.0.0.1:1")),
            ("raw, no user", format!("redis://:{password}@127.0.0.1:1/0")),
            ("raw, TLS", format!("rediss://alice:{password}@127.0.0.1:1")),
            (
                "raw, bad port",
                format!("redis://alice:{password}@127.0.0.1:notaport"),
            ),
            ("encoded", format!("redis://alice:{encoded}@127.0.0.1:1")),
            (
                "encoded, no user",
                format!("redis://:{encoded}@127.0.0.1:1/0"),
            ),
            (
                "encoded, bad port",
                format!("redis://alice:{encoded}@127.0.0.1:notaport"),
            ),
            (
                "encoded, bad db",
                format!("redis://alice:{encoded}@127.0.0.1:1/x"),
            ),
            (
                "unix, raw",
                format!("redis+unix:///tmp/redlock-test.sock?pass={password}"),
            ),
            (
                "unix, encoded",
                format!("redis+unix:///tmp/redlock-test.sock?db=1&pass={encoded}"),
            ),
        ];
        for (form, url) in cases {
            let (outcome, shown) = everything_shown_by_build(&url);
            for (place, text) in &shown {
                let leaked = leaked_forms(text, &password);
                if !leaked.is_empty() {
                    findings.push(format!(
                        "{c:?} {form}: {place} shows the password ({})",
                        leaked.join(", ")
                    ));
                }
            }
            let must_parse = form.contains("encoded") && !form.contains("bad");
            match outcome {
                Ok(()) if form.contains("bad") => {
                    findings.push(format!("{c:?} {form}: accepted"));
                }
                Err(e) if must_parse => {
                    findings.push(format!("{c:?} {form}: rejected: {e}"));
                }
                Err(redlock::ConfigError::InvalidNodeUrl { index: 0, .. }) | Ok(()) => {}
                Err(e) => findings.push(format!("{c:?} {form}: wrong error {e:?}")),
            }
        }
    }
    assert!(
        findings.is_empty(),
        "{} problems:\n{}",
        findings.len(),
        findings.join("\n")
    );
}

/// A password made of the characters that end or split a URL's userinfo (and a space).
const URL_HOSTILE_PASSWORD: &str = "Sl4sh/Qu3ry?H4sh#X7t@C0lon:Pct%Sp4ce Nd1";

/// The alphanumeric runs of `password`: whatever part of it leaks, in whichever encoding,
/// shows one of them.
fn pieces(password: &str) -> Vec<&str> {
    password
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|p| p.len() >= 3)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn percent_encoded_password_with_reserved_characters_authenticates() {
    let cluster = Cluster::builder()
        .nodes(3)
        .arg("requirepass", URL_HOSTILE_PASSWORD)
        .start()
        .await
        .unwrap();
    // The server took the password as given: the testkit authenticates with it verbatim.
    let mut direct = cluster.node(0).connection().await.unwrap();
    let pong: String = redlock_testkit::redis::cmd("PING")
        .query_async(&mut direct)
        .await
        .unwrap();
    assert_eq!(pong, "PONG");

    let url = |password: &str| -> Vec<String> {
        cluster
            .nodes()
            .iter()
            .map(|n| format!("redis://:{password}@127.0.0.1:{}", n.port()))
            .collect()
    };
    let encoded = percent_encode_all(URL_HOSTILE_PASSWORD);
    let rl = client(url(&encoded));
    let lock = rl
        .try_acquire("hostile-password")
        .await
        .expect("the percent-decoded password authenticates");
    assert!(
        eventually(Duration::from_secs(2), || async {
            lock_keys(&cluster).await.len() == 3
        })
        .await
    );
    rl.release(lock).await.unwrap();

    // Encoding twice hands the server the once-encoded text, which is the wrong password: so
    // the success above really depended on decoding.
    let wrong = client(url(&percent_encode_all(&encoded)));
    let err = wrong.try_acquire("hostile-password").await.unwrap_err();
    assert!(err.is_quorum_unreachable(), "{err}");
    let auth_failures = err
        .nodes()
        .iter()
        .filter(|n| matches!(&n.outcome, NodeOutcome::Failed(e) if e.kind() == NodeErrorKind::Auth))
        .count();
    assert!(auth_failures >= 2, "{err}");
    let shown = format!("{err} {err:?} {wrong:?}");
    for piece in pieces(URL_HOSTILE_PASSWORD) {
        assert!(!shown.contains(piece), "{piece:?} in {shown}");
    }

    // Raw, the password's `/`, `?` and `#` end the host part: rejected, not misread.
    let e = Redlock::builder()
        .nodes(url(URL_HOSTILE_PASSWORD))
        .build()
        .unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(text.contains("percent-encode"), "{text}");
    for piece in pieces(URL_HOSTILE_PASSWORD) {
        assert!(!text.contains(piece), "{piece:?} in {text}");
    }
}

/// A restart quarantine shorter than the client's TTL lets a node that restarted without its
/// data vote again while a lock's key may still be live elsewhere: the protection it exists for
/// is gone, and `build()` accepted it without a word (found in review). It still builds (tests
/// and short-lived locks use short quarantines on purpose) but says so, once, at build.
#[test]
fn a_restart_quarantine_shorter_than_the_ttl_is_warned_about() {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let build = |quarantine: Duration| {
        Redlock::builder()
            .nodes(["redis://127.0.0.1:1"])
            .ttl(Duration::from_secs(10))
            .restart_quarantine(quarantine)
            .build()
            .unwrap();
        let shown = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        logs.0.lock().unwrap().clear();
        shown
    };
    let short = build(Duration::from_secs(1));
    assert!(
        short.contains("restart_quarantine") && short.contains("shorter than the ttl"),
        "a 1 s quarantine with a 10 s TTL: {short:?}"
    );
    let long = build(Duration::from_secs(10));
    assert!(
        !long.contains("restart_quarantine"),
        "a quarantine as long as the TTL: {long:?}"
    );
}
