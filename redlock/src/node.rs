//! Real Redis nodes: lazy multiplexed connections, preloaded scripts, `EVALSHA` with an `EVAL`
//! fallback, and error messages scrubbed of secrets.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client};

use crate::backend::{Backend, Batch, Op, Reply};
use crate::error::{NodeError, NodeErrorKind};
use crate::scripts::{self, LuaScript};
use crate::url::{NodeSpec, scrub};

/// Requests that may wait in one connection's client-side queue.
const REQUEST_QUEUE: usize = 1 << 16;

/// One Redis master with a lazily created, shared multiplexed connection.
pub(crate) struct RedisNode {
    name: Arc<str>,
    client: Client,
    password: Option<String>,
    config: AsyncConnectionConfig,
    conn: Mutex<Option<MultiplexedConnection>>,
    connecting: tokio::sync::Mutex<()>,
}

impl RedisNode {
    pub(crate) fn new(
        spec: &NodeSpec,
        connect_timeout: Duration,
        tls_root_ca: Option<&[u8]>,
    ) -> Result<Self, String> {
        let password = spec.info.redis_settings().password().map(str::to_owned);
        let client = match (spec.tls, tls_root_ca) {
            #[cfg(feature = "tls")]
            (true, Some(ca)) => {
                // Without a process-wide provider rustls cannot build a client config; ignore
                // the error when the application already installed one.
                let _ = rustls::crypto::ring::default_provider().install_default();
                Client::build_with_tls(
                    spec.info.clone(),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(ca.to_vec()),
                    },
                )
            }
            _ => {
                #[cfg(feature = "tls")]
                if spec.tls {
                    let _ = rustls::crypto::ring::default_provider().install_default();
                }
                Client::open(spec.info.clone())
            }
        }
        .map_err(|e| scrub(&e.to_string(), &[password.as_deref()]))?;
        // Our own per-node timeout bounds every call; the client must not race it with a
        // response timeout of its own (which would also drop the reply we wait for).
        // The request queue must have room: a request is handed to the connection with one
        // poll in the caller's task (see `engine::handed_over`), and only a request that finds
        // room is queued at once, in program order. With the default of 50, two tasks waiting
        // for room could be let in in either order, and a release could overtake its acquire.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None)
            .set_pipeline_buffer_size(REQUEST_QUEUE);
        Ok(Self {
            name: spec.name.clone(),
            client,
            password,
            config,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The client, for the release-notification subscription.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    fn cached(&self) -> Option<MultiplexedConnection> {
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// The shared connection, opened (once, for all concurrent callers) when missing.
    pub(crate) async fn connection(&self) -> Result<MultiplexedConnection, NodeError> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| self.node_error(&e, None))?;
        let mut load = redis::pipe();
        for s in scripts::all() {
            load.cmd("SCRIPT").arg("LOAD").arg(s.source);
        }
        let _: Vec<String> = load
            .query_async(&mut conn)
            .await
            .map_err(|e| self.node_error(&e, None))?;
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
        tracing::debug!(node = %self.name, "connected");
        Ok(conn)
    }

    /// Forgets a connection that failed, so the next call reconnects.
    fn invalidate(&self) {
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    fn node_error(&self, e: &redis::RedisError, token: Option<&str>) -> NodeError {
        let kind = match e.code() {
            _ if e.kind() == redis::ErrorKind::AuthenticationFailed => NodeErrorKind::Auth,
            Some("WRONGPASS" | "NOAUTH" | "NOPERM") => NodeErrorKind::Auth,
            _ if e.is_connection_refusal() => NodeErrorKind::Connect,
            _ if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() => {
                NodeErrorKind::Io
            }
            Some(_) => NodeErrorKind::Server,
            None => NodeErrorKind::Io,
        };
        NodeError::new(
            kind,
            scrub(&e.to_string(), &[self.password.as_deref(), token]),
        )
    }

    async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&str],
        token: &str,
    ) -> Result<T, NodeError> {
        let mut conn = self.connection().await?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&script.sha).arg(keys.len()).arg(keys).arg(args);
        let res: redis::RedisResult<T> = cmd.query_async(&mut conn).await;
        let res = match res {
            Err(e) if e.code() == Some("NOSCRIPT") => {
                // The node lost its script cache (restart, SCRIPT FLUSH): EVAL also reloads it.
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(script.source).arg(keys.len()).arg(keys).arg(args);
                cmd.query_async(&mut conn).await
            }
            other => other,
        };
        res.map_err(|e| self.failed(&e, token))
    }

    async fn set_nx(&self, key: &str, token: &str, ttl_ms: u64) -> Result<Reply, NodeError> {
        let mut conn = self.connection().await?;
        let res: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut conn)
            .await;
        match res {
            Ok(Some(_)) => Ok(Reply::Yes { stamp_us: None }),
            Ok(None) => Ok(Reply::No),
            Err(e) => Err(self.failed(&e, token)),
        }
    }

    /// Converts a command error, dropping the connection when it is broken.
    fn failed(&self, e: &redis::RedisError, token: &str) -> NodeError {
        if e.is_unrecoverable_error() || e.is_connection_dropped() || e.is_io_error() {
            self.invalidate();
        }
        self.node_error(e, Some(token))
    }

    pub(crate) async fn run(&self, op: &Op) -> Result<Reply, NodeError> {
        match op {
            Op::Acquire {
                stamp_key,
                born_key,
                quarantine_ms,
                keys,
                token,
                ttl_ms,
                rearm,
            } => {
                let ttl = ttl_ms.to_string();
                let quarantine = quarantine_ms.to_string();
                let t = token.expose();
                let args = [t, ttl.as_str(), quarantine.as_str()];
                let (script, mut all) = match stamp_key {
                    Some(stamp_key) => (&*scripts::ACQUIRE, vec![&**born_key, &**stamp_key]),
                    None => {
                        if let ([key], false, 0) = (&keys[..], rearm, quarantine_ms) {
                            // A fresh random token cannot be on the node yet: plain SET NX PX.
                            return self.set_nx(key, t, *ttl_ms).await;
                        }
                        (&*scripts::ACQUIRE_UNSTAMPED, vec![&**born_key])
                    }
                };
                all.extend(keys.iter().map(String::as_str));
                let answer: i64 = self.eval(script, &all, &args, t).await?;
                match answer {
                    scripts::QUARANTINED => Err(NodeError::new(
                        NodeErrorKind::Quarantined,
                        "in restart quarantine: the node lost its data (or is new) too recently to grant",
                    )),
                    n if n > 0 => Ok(Reply::Yes {
                        stamp_us: stamp_key.as_ref().and_then(|_| u64::try_from(n).ok()),
                    }),
                    _ => Ok(Reply::No),
                }
            }
            Op::Extend {
                keys,
                token,
                ttl_ms,
            } => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let ttl = ttl_ms.to_string();
                let t = token.expose();
                let n: i64 = self.eval(&scripts::EXTEND, &keys, &[t, &ttl], t).await?;
                Ok(if n > 0 {
                    Reply::Yes { stamp_us: None }
                } else {
                    Reply::No
                })
            }
            Op::Release {
                keys,
                token,
                channels,
            } => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let t = token.expose();
                let mut args: Vec<&str> = Vec::with_capacity(channels.len() + 1);
                args.push(t);
                args.extend(channels.iter().map(String::as_str));
                let n: i64 = self.eval(&scripts::RELEASE, &keys, &args, t).await?;
                Ok(if n > 0 {
                    Reply::Yes { stamp_us: None }
                } else {
                    Reply::No
                })
            }
        }
    }

    /// One batched renewal call.
    pub(crate) async fn extend_many(&self, batch: &Batch) -> Result<Vec<bool>, NodeError> {
        let ttl = batch.ttl_ms.to_string();
        let counts: Vec<String> = batch
            .locks
            .iter()
            .map(|(k, _)| k.len().to_string())
            .collect();
        let mut keys: Vec<&str> = Vec::new();
        let mut args: Vec<&str> = Vec::with_capacity(1 + 2 * batch.locks.len());
        args.push(&ttl);
        for ((lock_keys, token), count) in batch.locks.iter().zip(&counts) {
            keys.extend(lock_keys.iter().map(String::as_str));
            args.push(token.expose());
            args.push(count);
        }
        // Tokens of many locks are in flight here; none of them may reach an error message.
        let out: Vec<i64> = self
            .eval(&scripts::EXTEND_MANY, &keys, &args, "")
            .await
            .map_err(|e| {
                let mut msg = e.message().to_owned();
                for (_, token) in &batch.locks {
                    msg = scrub(&msg, &[Some(token.expose())]);
                }
                NodeError::new(e.kind(), msg)
            })?;
        Ok(out.into_iter().map(|v| v == 1).collect())
    }
}

/// The production backend: N independent Redis masters.
pub(crate) struct RedisBackend {
    pub(crate) nodes: Vec<Arc<RedisNode>>,
    pub(crate) node_timeout: Duration,
    pub(crate) connect_timeout: Duration,
}

impl Backend for RedisBackend {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn name(&self, i: usize) -> &Arc<str> {
        self.nodes[i].name()
    }

    fn budget(&self, i: usize) -> Duration {
        if self.nodes[i].is_connected() {
            self.node_timeout
        } else {
            self.connect_timeout + self.node_timeout
        }
    }

    fn call(&self, i: usize, op: Arc<Op>) -> BoxFuture<'static, Result<Reply, NodeError>> {
        let node = Arc::clone(&self.nodes[i]);
        async move { node.run(&op).await }.boxed()
    }

    fn extend_many(
        &self,
        i: usize,
        batch: Arc<Batch>,
    ) -> BoxFuture<'static, Result<Vec<bool>, NodeError>> {
        let node = Arc::clone(&self.nodes[i]);
        async move { node.extend_many(&batch).await }.boxed()
    }
}
