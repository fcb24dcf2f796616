//! Admission in Redis: the check, the advance and the protected write in one Lua script.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::error::{Backend, BackendError, FenceError, malformed_from_backend};
use crate::high_water::{Admission, HighWater};
use crate::token::{MAX_CLAIMS, MAX_NODE_NAME_LEN, TokenRef};

/// Default key prefix of [`RedisFence`]: high water at `fence:hw:<resource>` (a hash
/// node → stamp), register values at `fence:val:<name>`.
pub const DEFAULT_REDIS_PREFIX: &str = "fence:";

/// `KEYS[1]` = the resource's high-water hash; `KEYS[2]` (optional) = a key to `SET` when
/// admitted. `ARGV[1]` = number of claims n, `ARGV[2..2n+1]` = node, stamp pairs (decimal),
/// `ARGV[2n+2]` = the value for `KEYS[2]`, optionally followed by `KEEPTTL` (keep the key's
/// expiry) or by `PX` and a count of milliseconds (expire that long after the write); without
/// either the `SET` is plain and removes any expiry the key had.
///
/// Returns `{code, high_water}`: 1 advanced, 2 repeated (the same grant again; the write is
/// still done, so a retried write lands), -1 stale, -2 unrelated; `high_water` is the flat
/// `HGETALL` on a rejection and empty otherwise. A rejection writes nothing.
///
/// Malformed arguments are an error reply `FENCEMALFORMED malformed fence token: …` before
/// anything is read or written, with the checks, order and wording of the PostgreSQL function
/// (see `malformed_from_backend`): the argument count must match n, 1 ≤ n ≤ 32, names are at
/// most 128 bytes, UTF-8 without a NUL byte, and empty only in a single claim (a scalar
/// token), stamps are canonical decimals from 0 to 2^63 − 1, no node twice. (PostgreSQL text
/// cannot hold the names the script refuses for their bytes: they never reach the function.)
/// A `PX` count above 100 years ([`MAX_EXPIRY`]) is refused before anything is written, like
/// any other bad count: `SET` itself refuses counts that overflow the server's clock, which
/// would come after the high water was raised.
///
/// Stamps are compared as canonical decimal strings (length first, then bytes), not as Lua
/// numbers: those are doubles and would round stamps above 2^53. That is why non-canonical
/// stamps (`007`, `+7`, `7.0`) are rejected rather than compared.
const ADMIT_SRC: &str = r"
local MAX_STAMP = '9223372036854775807'
local MAX_PX = '3153600000000'
local function below(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local function canonical(s)
  if not string.find(s, '^[0-9]+$') then return false end
  if #s > 1 and string.byte(s, 1) == 48 then return false end
  return not below(MAX_STAMP, s)
end
local function utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c = string.byte(s, i)
    local len
    if c < 128 then len = 1
    elseif c >= 194 and c <= 223 then len = 2
    elseif c >= 224 and c <= 239 then len = 3
    elseif c >= 240 and c <= 244 then len = 4
    else return false end
    if i + len - 1 > n then return false end
    for j = i + 1, i + len - 1 do
      local d = string.byte(s, j)
      if d < 128 or d > 191 then return false end
    end
    local d = string.byte(s, i + 1)
    if (c == 224 and d < 160) or (c == 237 and d > 159)
      or (c == 240 and d < 144) or (c == 244 and d > 143) then
      return false
    end
    i = i + len
  end
  return true
end
local function malformed(reason, i)
  if i then reason = 'claim ' .. i .. ': ' .. reason end
  return redis.error_reply('FENCEMALFORMED malformed fence token: ' .. reason)
end
if #KEYS < 1 or #KEYS > 2 then
  return redis.error_reply('ERR the fence admission script takes 1 or 2 keys')
end
local lists = 'node and stamp lists are missing, not flat, or of different lengths'
if not ARGV[1] or not canonical(ARGV[1]) then return malformed(lists) end
local n = tonumber(ARGV[1])
local extra = 0
if KEYS[2] then
  extra = 1
  local option = ARGV[2 * n + 3]
  if option == 'KEEPTTL' then extra = 2 elseif option == 'PX' then extra = 3 end
end
if #ARGV ~= 2 * n + 1 + extra then return malformed(lists) end
if n == 0 then return malformed('no claims') end
if n > 32 then return malformed('more than 32 claims') end
local seen = {}
for i = 1, n do
  local node, stamp = ARGV[2 * i], ARGV[2 * i + 1]
  if node == '' and n > 1 then
    return malformed('empty node name in a token of several claims', i)
  elseif #node > 128 then
    return malformed('node name longer than 128 bytes', i)
  elseif string.find(node, '%z') then
    return malformed('node name contains a NUL byte', i)
  elseif not utf8(node) then
    return malformed('node name is not UTF-8', i)
  elseif not canonical(stamp) then
    return malformed('stamp is not an integer from 0 to 2^63 - 1', i)
  elseif seen[node] then
    return malformed('node appears twice: ' .. node, i)
  end
  seen[node] = true
end
if extra == 3 then
  local ms = ARGV[2 * n + 4]
  if not canonical(ms) or ms == '0' or below(MAX_PX, ms) then
    return redis.error_reply('ERR fence write: PX takes a whole number of milliseconds, from 1 to ' .. MAX_PX .. ' (100 years)')
  end
end

local shared, same = false, true
local raise = {}
for i = 1, n do
  local node, stamp = ARGV[2 * i], ARGV[2 * i + 1]
  local mark = redis.call('HGET', KEYS[1], node)
  if mark then
    shared = true
    if below(stamp, mark) then return {-1, redis.call('HGETALL', KEYS[1])} end
  end
  if mark ~= stamp then
    same = false
    raise[#raise + 1] = node
    raise[#raise + 1] = stamp
  end
end
if not shared and redis.call('EXISTS', KEYS[1]) == 1 then
  return {-2, redis.call('HGETALL', KEYS[1])}
end
-- Marks only rise: only nodes whose stamp is above their mark (or new) are written.
if #raise > 0 then
  redis.call('HSET', KEYS[1], unpack(raise))
end
if extra == 3 then
  redis.call('SET', KEYS[2], ARGV[2 * n + 2], 'PX', ARGV[2 * n + 4])
elseif extra == 2 then
  redis.call('SET', KEYS[2], ARGV[2 * n + 2], 'KEEPTTL')
elseif KEYS[2] then
  redis.call('SET', KEYS[2], ARGV[2 * n + 2])
end
if same then return {2, {}} end
return {1, {}}
";

// The script spells these caps out.
const _: () = assert!(MAX_CLAIMS == 32 && MAX_NODE_NAME_LEN == 128);
const _: () = assert!(MAX_EXPIRY.as_millis() == 3_153_600_000_000);

/// The error code of the script's malformed-input error reply.
const MALFORMED_CODE: &str = "FENCEMALFORMED";

/// A Redis error as a [`FenceError`]: [`FenceError::Backend`], except for the admission
/// script's `FENCEMALFORMED` error reply, which becomes the variant of the same defect
/// ([`FenceError::is_malformed`]).
fn from_redis(err: redis::RedisError) -> FenceError {
    match err.detail() {
        Some(detail) if err.code() == Some(MALFORMED_CODE) => malformed_from_backend(detail),
        _ => FenceError::Backend(BackendError::new(Backend::Redis, err)),
    }
}

static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(ADMIT_SRC));

/// Longest [`Expiry::After`]: far below what Redis can count (`PX` is a signed 64-bit number of
/// ms added to the server's clock).
const MAX_EXPIRY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What a fenced write ([`RedisFence::set_if_admitted_with`]) does with the register key's
/// expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Expiry {
    /// No expiry: a plain `SET`, which also removes an expiry the key had. What
    /// [`RedisFence::set_if_admitted`] does.
    #[default]
    Persist,
    /// Expire this long after the write (`SET … PX <ms>`, whole milliseconds, rounded down;
    /// from 1 ms to 100 years).
    After(Duration),
    /// Keep the expiry the key has (`SET … KEEPTTL`): a cache entry written with a TTL keeps
    /// counting down; a key without one (or a new key) stays without.
    Keep,
}

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
///
/// The server must not evict the high water: run it with `maxmemory-policy noeviction` or a
/// `volatile-*` policy (the high-water hash has no TTL, so those never evict it). Under an
/// `allkeys-*` policy it is evicted like any key, and a resource without a high water admits
/// the next token as its first, a stale holder's too.
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

    /// The Lua source of the admission script every call runs (with `EVALSHA`), for clients
    /// in other languages that fence the same keys: `KEYS[1]` = the resource's high-water
    /// hash ([`high_water_key`](Self::high_water_key)), optional `KEYS[2]` = the key to `SET`
    /// when admitted ([`register_key`](Self::register_key)); `ARGV[1]` = the number of
    /// claims `n`, `ARGV[2..2n+1]` = node, stamp pairs (stamps in canonical decimal), then,
    /// with `KEYS[2]`, the value to set, optionally followed by `KEEPTTL` or by `PX` and a
    /// count of milliseconds from 1 to 3,153,600,000,000 (100 years; see [`Expiry`]; a bad
    /// count is an `ERR fence write: …` reply before anything is written). Replies `{code, high_water}`: 1 advanced, 2 repeated,
    /// -1 stale, -2 unrelated; `high_water` is the flat `HGETALL` on a rejection. Malformed
    /// arguments get the error reply `FENCEMALFORMED malformed fence token: <reason>` and
    /// change nothing; `RedisFence` maps that reply to a typed error
    /// ([`FenceError::is_malformed`]).
    pub fn script_source() -> &'static str {
        ADMIT_SRC
    }

    /// The hash holding `resource`'s high water.
    pub fn high_water_key(&self, resource: &str) -> String {
        format!("{}hw:{resource}", self.prefix)
    }

    /// The string key holding register `name`'s value.
    pub fn register_key(&self, name: &str) -> String {
        format!("{}val:{name}", self.prefix)
    }

    /// Checks `token` against `resource`'s high water and advances it when admitted. The
    /// protected write must depend on the answer: make it only after `Ok` came back (and
    /// know that another holder may be admitted between the two), or let the script make it
    /// with [`set_if_admitted`](Self::set_if_admitted), which writes only when admitted. Never
    /// queue the write beside the admission in one `MULTI`/`EXEC`: a transaction runs every
    /// queued command whatever the script answered, so a stale holder's write lands.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] / [`FenceError::Unrelated`] when rejected (nothing written),
    /// [`FenceError::StampOutOfRange`], [`FenceError::Backend`] when the outcome is unknown.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the request was sent leaves the outcome unknown: the script
    /// may or may not have run. Retrying with the same token is safe against other holders; a
    /// retry sent on another connection can land before the first try, which the fence does not
    /// order (docs/fencing.md, the admission rule).
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
    /// overwrites: the fence orders grants, not one grant's writes, so a write of this grant
    /// delayed on another connection can overwrite a later one (docs/fencing.md).
    ///
    /// A plain `SET`: the key keeps no expiry, and one it had is removed
    /// ([`Expiry::Persist`]). To write a cache entry that expires, or to keep its expiry, use
    /// [`set_if_admitted_with`](Self::set_if_admitted_with).
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
        self.run(
            conn,
            name,
            token.into(),
            Some((value.as_ref(), Expiry::Persist)),
        )
        .await
    }

    /// [`set_if_admitted`](Self::set_if_admitted) with a choice of expiry for the register
    /// key: none ([`Expiry::Persist`], a plain `SET`), a TTL counted from this write
    /// ([`Expiry::After`], `SET … PX`), or the expiry the key already has ([`Expiry::Keep`],
    /// `SET … KEEPTTL`, Redis ≥ 6.0). The expiry is set in the same script as the admission:
    /// a rejected write changes neither the value nor its TTL.
    ///
    /// # Errors
    ///
    /// As [`admit`](Self::admit); [`FenceError::InvalidExpiry`] for an `Expiry::After` below
    /// 1 ms or above 100 years (nothing is sent).
    ///
    /// # Cancel safety
    ///
    /// As [`admit`](Self::admit): the write may or may not have happened; retry it with the
    /// same token.
    pub async fn set_if_admitted_with<'a, C: ConnectionLike>(
        &self,
        conn: &mut C,
        name: &str,
        token: impl Into<TokenRef<'a>>,
        value: impl AsRef<[u8]>,
        expiry: Expiry,
    ) -> Result<Admission, FenceError> {
        if let Expiry::After(ttl) = expiry
            && !(Duration::from_millis(1)..=MAX_EXPIRY).contains(&ttl)
        {
            return Err(FenceError::InvalidExpiry {
                reason: "Expiry::After must be from 1 ms to 100 years",
            });
        }
        self.run(conn, name, token.into(), Some((value.as_ref(), expiry)))
            .await
    }

    /// The fenced register's read: the current value of register `name`.
    ///
    /// # Errors
    ///
    /// [`FenceError::Backend`].
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn get<C: ConnectionLike>(
        &self,
        conn: &mut C,
        name: &str,
    ) -> Result<Option<Vec<u8>>, FenceError> {
        redis::cmd("GET")
            .arg(self.register_key(name))
            .query_async(conn)
            .await
            .map_err(from_redis)
    }

    /// `resource`'s high water as stored (empty if nothing was admitted).
    ///
    /// # Errors
    ///
    /// [`FenceError::Backend`], or [`FenceError::UnexpectedReply`] when the hash holds a
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
        let flat: Vec<Vec<u8>> = redis::cmd("HGETALL")
            .arg(self.high_water_key(resource))
            .query_async(conn)
            .await
            .map_err(from_redis)?;
        parse_flat(flat)
    }

    async fn run<C: ConnectionLike>(
        &self,
        conn: &mut C,
        resource: &str,
        token: TokenRef<'_>,
        value: Option<(&[u8], Expiry)>,
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
        if let Some((v, expiry)) = value {
            call.arg(v);
            match expiry {
                Expiry::Persist => {}
                Expiry::After(ttl) => {
                    call.arg("PX")
                        .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
                }
                Expiry::Keep => {
                    call.arg("KEEPTTL");
                }
            }
        }
        // Node names as bytes: the verdict is the code's, and a name that is not UTF-8 (kept
        // from before names were checked) is only shown. Decoded as text, it turned a `Stale`
        // into a backend error, which callers may retry (test `a_stale_token_is_stale_even_
        // beside_a_node_name_that_is_not_utf8`, found in review).
        let (code, flat): (i64, Vec<Vec<u8>>) =
            call.invoke_async(conn).await.map_err(from_redis)?;
        let verdict = match code {
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
        };
        verdict.inspect_err(|e| crate::telemetry::rejected("redis", e))
    }
}

fn parse_flat(flat: Vec<Vec<u8>>) -> Result<HighWater, FenceError> {
    let mut entries = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(node), Some(stamp)) = (it.next(), it.next()) {
        let node = String::from_utf8_lossy(&node).into_owned();
        let stamp = std::str::from_utf8(&stamp)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| FenceError::UnexpectedReply {
                reason: format!("high-water stamp of node {node:?} is not a number"),
            })?;
        entries.push((node, stamp));
    }
    Ok(HighWater::from_entries(entries))
}
