//! The raw-protocol floor, copied from `redlock/benches/acquire_release.rs` and trimmed: the
//! least work the protocol allows. `SET key token NX PX ttl` to all N nodes in parallel, a
//! quorum of `OK`, then an owner-checked `EVALSHA` delete on all N, awaiting every node.

use std::fmt::Write as _;
use std::time::Duration;

use futures_util::future::join_all;
use redlock_testkit::redis::{
    self, AsyncConnectionConfig, Client, IntoConnectionInfo, aio::MultiplexedConnection,
};

use crate::BenchError;

/// The floor's owner-checked delete.
const FLOOR_RELEASE: &str =
    "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) else return 0 end";

/// The raw-protocol floor over pre-opened multiplexed connections with `TCP_NODELAY`.
#[derive(Debug, Clone)]
pub(crate) struct Floor {
    conns: Vec<MultiplexedConnection>,
    release_sha: String,
    ttl_ms: u64,
    quorum: usize,
    /// Per-call bound; `None` awaits every node however long it takes.
    call_timeout: Option<Duration>,
}

impl Floor {
    /// Connects to every node and loads the release script.
    pub(crate) async fn connect(
        urls: &[String],
        ttl: Duration,
        call_timeout: Option<Duration>,
    ) -> Result<Self, BenchError> {
        let config = AsyncConnectionConfig::new().set_response_timeout(None);
        let mut conns = Vec::with_capacity(urls.len());
        for url in urls {
            let info = url
                .as_str()
                .into_connection_info()?
                .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
            let mut conn = Client::open(info)?
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(FLOOR_RELEASE)
                .query_async(&mut conn)
                .await?;
            conns.push(conn);
        }
        Ok(Floor {
            conns,
            release_sha: redis::Script::new(FLOOR_RELEASE).get_hash().to_owned(),
            ttl_ms: u64::try_from(ttl.as_millis())?,
            quorum: urls.len() / 2 + 1,
            call_timeout,
        })
    }

    async fn call<T: redis::FromRedisValue>(
        &self,
        conn: &MultiplexedConnection,
        cmd: redis::Cmd,
    ) -> Option<T> {
        let mut conn = conn.clone();
        let query = async move { cmd.query_async::<T>(&mut conn).await.ok() };
        match self.call_timeout {
            None => query.await,
            Some(t) => tokio::time::timeout(t, query).await.ok().flatten(),
        }
    }

    /// Sends the acquire to every node in parallel; returns how many granted.
    async fn acquire_phase(&self, key: &str, token: &str) -> usize {
        let granted = join_all(self.conns.iter().map(|c| async move {
            let mut cmd = redis::cmd("SET");
            cmd.arg(key).arg(token).arg("NX").arg("PX").arg(self.ttl_ms);
            matches!(self.call::<Option<String>>(c, cmd).await, Some(Some(ok)) if ok == "OK")
        }))
        .await;
        granted.into_iter().filter(|g| *g).count()
    }

    /// Owner-checked delete on every node in parallel, awaiting all of them.
    async fn release_phase(&self, key: &str, token: &str) {
        join_all(self.conns.iter().map(|c| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&self.release_sha).arg(1).arg(key).arg(token);
            self.call::<i64>(c, cmd)
        }))
        .await;
    }

    /// One acquire + release. `Err` when no quorum granted (the release is sent anyway).
    pub(crate) async fn cycle(&self, key: &str) -> Result<(), String> {
        let token = random_token();
        let granted = self.acquire_phase(key, &token).await;
        self.release_phase(key, &token).await;
        if granted >= self.quorum {
            Ok(())
        } else {
            Err(format!("floor: {granted}/{} granted", self.quorum))
        }
    }
}

/// 16 bytes from the OS CSPRNG, hex-encoded, like the crate's own tokens.
fn random_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("OS random source");
    bytes.iter().fold(String::with_capacity(32), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
