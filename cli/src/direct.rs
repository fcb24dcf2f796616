//! Direct connections to each node (for `status` and `doctor`), with the same URLs, TLS CA and
//! bounds as the client; every error message is scrubbed of the node's password.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client};

use crate::settings::{Settings, node_name, scrub, secrets};

/// One node, reachable or not.
pub(crate) struct Node {
    /// `host:port` or the socket path; never a password.
    pub(crate) name: String,
    client: Result<Client, String>,
    secrets: Vec<String>,
    /// Bound on each request.
    pub(crate) timeout: Duration,
    /// Bound on opening a connection (TCP, TLS, AUTH): the settings' connect timeout.
    connect_timeout: Duration,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Whether `url` names a TLS node: its scheme is `rediss`, in any case (as the library reads it).
fn is_tls(url: &str) -> bool {
    url.trim()
        .get(..9)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"))
}

impl Node {
    /// Every configured node. The URLs must have been validated by the library's builder.
    pub(crate) fn all(settings: &Settings, timeout: Duration) -> Vec<Node> {
        settings
            .urls()
            .iter()
            .map(|url| {
                let secrets = secrets(std::slice::from_ref(url));
                let client = match &settings.tls_ca {
                    Some(ca) if is_tls(url) => {
                        let _ = rustls::crypto::ring::default_provider().install_default();
                        Client::build_with_tls(
                            url.trim(),
                            redis::TlsCertificates {
                                client_tls: None,
                                root_cert: Some(ca.clone()),
                            },
                        )
                    }
                    _ => {
                        if is_tls(url) {
                            let _ = rustls::crypto::ring::default_provider().install_default();
                        }
                        Client::open(url.trim())
                    }
                }
                .map_err(|e| scrub(&e.to_string(), &secrets));
                Node {
                    name: node_name(url),
                    client,
                    secrets,
                    timeout,
                    connect_timeout: settings.connect_timeout(),
                }
            })
            .collect()
    }

    /// Opens a connection, bounded by the connect timeout; every request on it is bounded by
    /// the node's timeout.
    pub(crate) async fn connect(&self) -> Result<MultiplexedConnection, String> {
        let client = self.client.as_ref().map_err(Clone::clone)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.timeout));
        match tokio::time::timeout(
            self.connect_timeout.saturating_add(self.timeout),
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(self.error(&e)),
            Err(_) => Err(format!("no connection within {:?}", self.connect_timeout)),
        }
    }

    /// A subscription connection, bounded by the connect timeout.
    pub(crate) async fn pubsub(&self) -> Result<redis::aio::PubSub, String> {
        let client = self.client.as_ref().map_err(Clone::clone)?;
        let bound = self.connect_timeout.saturating_add(self.timeout);
        match tokio::time::timeout(bound, client.get_async_pubsub()).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(self.error(&e)),
            Err(_) => Err(format!("no connection within {:?}", self.connect_timeout)),
        }
    }

    /// A redis error as a message without the password.
    pub(crate) fn error(&self, e: &redis::RedisError) -> String {
        self.scrub(&e.to_string())
    }

    /// `text` without the password.
    pub(crate) fn scrub(&self, text: &str) -> String {
        scrub(text, &self.secrets)
    }
}

/// The value of `field` in an `INFO` reply.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}
