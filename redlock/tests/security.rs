//! ACL users, TLS with a custom CA, and secrets kept out of errors and logs.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{NODE_TIMEOUT, eventually, lock_keys};
use redlock::{NodeErrorKind, NodeOutcome, Redlock, RetryPolicy};
use redlock_testkit::{Cluster, TlsFiles};

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

struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
}

fn make_pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "redlock test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: &str| {
        std::fs::write(dir.path().join(name), body).unwrap();
    };
    write("ca.pem", &ca_cert.pem());
    write("server.pem", &cert.pem());
    write("server.key", &key.serialize_pem());
    Pki {
        ca_pem: ca_cert.pem(),
        dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_nodes_are_reachable_with_a_custom_ca() {
    let pki = make_pki();
    let p = pki.dir.path();
    let cluster = Cluster::builder()
        .nodes(3)
        .tls(TlsFiles::new(
            p.join("server.pem"),
            p.join("server.key"),
            p.join("ca.pem"),
        ))
        .start()
        .await
        .unwrap();
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.tls_url().unwrap())
        .collect();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")));

    let rl = Redlock::builder()
        .nodes(urls.clone())
        .tls_root_ca(pki.ca_pem.as_bytes())
        .retry(RetryPolicy::once())
        .build()
        .unwrap();
    let lock = rl.try_acquire("tls").await.expect("TLS acquire");
    // The third grant may land just after the quorum decision.
    assert!(
        eventually(Duration::from_secs(2), || async {
            lock_keys(&cluster).await.len() == 3
        })
        .await
    );
    rl.release(lock).await.unwrap();
    assert!(lock_keys(&cluster).await.is_empty());

    // Without our CA the handshake is refused: an error, not a silent plaintext fallback.
    let untrusted = Redlock::builder()
        .nodes(urls)
        .retry(RetryPolicy::once())
        .connect_timeout(Duration::from_secs(2))
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
