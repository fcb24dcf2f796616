//! A throwaway certificate authority and a server certificate for `localhost` / `127.0.0.1`,
//! for tests of TLS nodes.

use std::io;
use std::path::{Path, PathBuf};

use crate::config::TlsFiles;

/// A CA and a server certificate signed by it, as PEM files in a temporary directory that is
/// removed on drop. Hand [`TestPki::tls_files`] to [`ClusterBuilder::tls`](crate::ClusterBuilder::tls)
/// and [`TestPki::ca_pem`] (or [`TestPki::ca_path`]) to the client.
#[derive(Debug)]
pub struct TestPki {
    dir: tempfile::TempDir,
    ca_pem: String,
}

impl TestPki {
    /// Generates the CA, the server key and the certificate.
    ///
    /// # Errors
    ///
    /// Fails if a key or certificate cannot be generated or the files cannot be written.
    pub fn generate() -> io::Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().map_err(io::Error::other)?;
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).map_err(io::Error::other)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "redlock test CA");
        let ca_cert = ca_params.self_signed(&ca_key).map_err(io::Error::other)?;
        let issuer = Issuer::from_params(&ca_params, &ca_key);
        let key = KeyPair::generate().map_err(io::Error::other)?;
        let params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .map_err(io::Error::other)?;
        let cert = params.signed_by(&key, &issuer).map_err(io::Error::other)?;

        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem())?;
        std::fs::write(dir.path().join("server.pem"), cert.pem())?;
        std::fs::write(dir.path().join("server.key"), key.serialize_pem())?;
        Ok(Self {
            dir,
            ca_pem: ca_cert.pem(),
        })
    }

    /// The server's certificate, key and the CA, for the nodes' TLS listener.
    pub fn tls_files(&self) -> TlsFiles {
        let p = self.dir.path();
        TlsFiles::new(p.join("server.pem"), p.join("server.key"), p.join("ca.pem"))
    }

    /// The CA certificate (PEM) a client must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA certificate's file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
