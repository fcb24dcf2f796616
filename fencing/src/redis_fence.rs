//! Admission in Redis: the check, the advance and the protected write in one Lua script.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::error::FenceError;
use crate::high_water::{Admission, HighWater};
use crate::token::TokenRef;

/// Default key prefix of [`RedisFence`]: high water at `fence:hw:<resource>` (a hash
/// node → stamp), register values at `fence:val:<name>`.
pub const DEFAULT_REDIS_PREFIX: &str = "fence:";

/// `KEYS[1]` = the resource's high-water hash; `KEYS[2]` (optional) = a key to `SET` when
/// admitted. `ARGV[1]` = number of claims n, `ARGV[2..2n+1]` = node, stamp pairs (decimal),
/// `ARGV[2n+2]` = the value for `KEYS[2]`.
///
/// Returns `{code, high_water}`: 1 advanced, 2 repeated (the same grant again; the write is
/// still done, so a retried write lands), -1 stale, -2 unrelated; `high_water` is the flat
/// `HGETALL` on a rejection and empty otherwise. A rejection writes nothing.
///
/// Stamps are compared as canonical decimal strings (length first, then bytes), not as Lua
/// numbers: those are doubles and would round stamps above 2^53.
const ADMIT_SRC: &str = r"
local function below(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local n = tonumber(ARGV[1])
local shared, same = false, true
for i = 0, n - 1 do
  local mark = redis.call('HGET', KEYS[1], ARGV[2 + 2 * i])
  if mark then
    shared = true
    local stamp = ARGV[3 + 2 * i]
    if below(stamp, mark) then return {-1, redis.call('HGETALL', KEYS[1])} end
    if stamp ~= mark then same = false end
  else
    same = false
  end
end
if not shared and redis.call('EXISTS', KEYS[1]) == 1 then
  return {-2, redis.call('HGETALL', KEYS[1])}
end
if not same then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2, 2 * n + 1))
end
if KEYS[2] then
  redis.call('SET', KEYS[2], ARGV[2 * n + 2])
end
if same then return {2, {}} end
return {1, {}}
";

static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(ADMIT_SRC));

/// Admission kept in Redis, for resources stored in Redis.
///
/// Each call is one `EVALSHA` of a script that checks the token against the resource's high
/// water, advances it, and — for [`set_if_admitted`](Self::set_if_admitted) — writes the
/// protected value, atomically on that Redis server. Use it on the server (or one of the
/// servers) that holds the protected data; it need not be a lock node.
///
/// Works with any async connection of the `redis` crate (`MultiplexedConnection`,
/// `ConnectionManager`, …). Redis Cluster is not supported: the high-water key and the value
/// key are not in one hash slot.
#[derive(Debug, Clone)]
pub struct RedisFence {
    prefix: String,
}

impl Default for RedisFence {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisFence {
    /// A fence with [`DEFAULT_REDIS_PREFIX`].
    pub fn new() -> Self {
        Self {
            prefix: DEFAULT_REDIS_PREFIX.to_owned(),
        }
    }

    /// A fence whose keys start with `prefix` instead.
    #[must_use]
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The hash holding `resource`'s high water.
    pub fn high_water_key(&self, resource: &str) -> String {
        format!("{}hw:{resource}", self.prefix)
    }

    /// The string key holding register `name`'s value.
    pub fn register_key(&self, name: &str) -> String {
        format!("{}val:{name}", self.prefix)
    }

    /// Checks `token` against `resource`'s high water and advances it when admitted. Pair it
    /// with a write in the same `MULTI`/script only if you need atomicity; otherwise prefer
    /// [`set_if_admitted`](Self::set_if_admitted), which writes in the same script.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] / [`FenceError::Unrelated`] when rejected (nothing written),
    /// [`FenceError::StampOutOfRange`], [`FenceError::Redis`] when the outcome is unknown.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the request was sent leaves the outcome unknown: the script
    /// may or may not have run. Retrying with the same token is safe (it is idempotent).
    pub async fn admit<'a, C: ConnectionLike>(
        &self,
        conn: &mut C,
        resource: &str,
        token: impl Into<TokenRef<'a>>,
    ) -> Result<Admission, FenceError> {
        self.run(conn, resource, token.into(), None).await
    }

    /// The fenced register's write: sets register `name` to `value` only if `token` is
    /// admitted on `name`, in one script. The same grant writing again is admitted and
    /// overwrites (an idempotent retry).
    ///
    /// # Errors
    ///
    /// As [`admit`](Self::admit); a rejected write changes nothing.
    ///
    /// # Cancel safety
    ///
    /// As [`admit`](Self::admit): the write may or may not have happened; retry it with the
    /// same token.
    pub async fn set_if_admitted<'a, C: ConnectionLike>(
        &self,
        conn: &mut C,
        name: &str,
        token: impl Into<TokenRef<'a>>,
        value: impl AsRef<[u8]>,
    ) -> Result<Admission, FenceError> {
        self.run(conn, name, token.into(), Some(value.as_ref()))
            .await
    }

    /// The fenced register's read: the current value of register `name`.
    ///
    /// # Errors
    ///
    /// [`FenceError::Redis`].
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn get<C: ConnectionLike>(
        &self,
        conn: &mut C,
        name: &str,
    ) -> Result<Option<Vec<u8>>, FenceError> {
        Ok(redis::cmd("GET")
            .arg(self.register_key(name))
            .query_async(conn)
            .await?)
    }

    /// `resource`'s high water as stored (empty if nothing was admitted).
    ///
    /// # Errors
    ///
    /// [`FenceError::Redis`], or [`FenceError::UnexpectedReply`] when the hash holds a
    /// non-numeric stamp.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn high_water<C: ConnectionLike>(
        &self,
        conn: &mut C,
        resource: &str,
    ) -> Result<HighWater, FenceError> {
        let flat: Vec<String> = redis::cmd("HGETALL")
            .arg(self.high_water_key(resource))
            .query_async(conn)
            .await?;
        parse_flat(flat)
    }

    async fn run<C: ConnectionLike>(
        &self,
        conn: &mut C,
        resource: &str,
        token: TokenRef<'_>,
        value: Option<&[u8]>,
    ) -> Result<Admission, FenceError> {
        token.validate()?;
        let mut call = ADMIT.prepare_invoke();
        call.key(self.high_water_key(resource));
        if value.is_some() {
            call.key(self.register_key(resource));
        }
        let pairs = token.pairs();
        call.arg(pairs.clone().count());
        for (node, stamp) in pairs {
            call.arg(node).arg(stamp);
        }
        if let Some(v) = value {
            call.arg(v);
        }
        let (code, flat): (i64, Vec<String>) = call.invoke_async(conn).await?;
        match code {
            1 => Ok(Admission::Advanced),
            2 => Ok(Admission::Repeated),
            -1 => Err(FenceError::Stale {
                offered: token.to_token(),
                high_water: parse_flat(flat)?,
            }),
            -2 => Err(FenceError::Unrelated {
                offered: token.to_token(),
                high_water: parse_flat(flat)?,
            }),
            other => Err(FenceError::UnexpectedReply {
                reason: format!("admission script returned code {other}"),
            }),
        }
    }
}

fn parse_flat(flat: Vec<String>) -> Result<HighWater, FenceError> {
    let mut entries = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(node), Some(stamp)) = (it.next(), it.next()) {
        let stamp = stamp
            .parse::<u64>()
            .map_err(|_| FenceError::UnexpectedReply {
                reason: format!("high-water stamp of node {node:?} is not a number"),
            })?;
        entries.push((node, stamp));
    }
    Ok(HighWater::from_entries(entries))
}
