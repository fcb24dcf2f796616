//! The Lua scripts every node runs. Each is atomic on its node, so a multi-resource lock is
//! all-or-nothing per node.

use std::sync::LazyLock;

/// A script's source and its SHA1, for `EVALSHA` with an `EVAL` fallback on `NOSCRIPT`.
#[derive(Debug)]
pub(crate) struct LuaScript {
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

impl LuaScript {
    fn new(source: &'static str) -> Self {
        let sha = redis::Script::new(source).get_hash().to_owned();
        Self { source, sha }
    }
}

/// `KEYS[1]` = the node's stamp key, `KEYS[2..]` = resource keys; `ARGV[1]` = token,
/// `ARGV[2]` = TTL in ms.
///
/// Grants when every resource key is free or already holds *our* token (an idempotent re-arm
/// after an unknown outcome), then issues the node's claim stamp
/// `max(TIME in µs, last stamp + 1)` and returns it (always ≥ 1). Returns 0 when any key is
/// held by another token; nothing is written then.
///
/// Shaped for the common case, because server CPU is what limits throughput when several nodes
/// share a machine: one resource is a single `SET NX PX` (the `GET` only runs on a refusal), and
/// the stamp is written with `SET … GET`, so a clock that moves forward costs one write; only
/// a clock that did not advance past the last stamp needs the second `SET`.
/// Stamps are formatted with `%.0f` because Lua 5.1's `tostring` would print a 16-digit number
/// in exponent form and lose precision; values stay far below 2^53.
pub(crate) static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(ACQUIRE_SRC));

const ACQUIRE_SRC: &str = r"
local token, ttl = ARGV[1], ARGV[2]
if #KEYS == 2 then
  if not redis.call('SET', KEYS[2], token, 'NX', 'PX', ttl) then
    if redis.call('GET', KEYS[2]) ~= token then return 0 end
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
else
  for i = 2, #KEYS do
    local v = redis.call('GET', KEYS[i])
    if v and v ~= token then return 0 end
  end
  for i = 2, #KEYS do
    redis.call('SET', KEYS[i], token, 'PX', ttl)
  end
end
local t = redis.call('TIME')
local stamp = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('SET', KEYS[1], string.format('%.0f', stamp), 'GET') or '0') or 0
if stamp <= last then
  stamp = last + 1
  redis.call('SET', KEYS[1], string.format('%.0f', stamp))
end
return stamp
";

/// The acquire script without claim stamps (`claim_stamps(false)`): `KEYS` = resource keys,
/// same arguments; returns 1 on a grant or re-arm, 0 on a refusal. Used for multi-resource
/// locks and re-acquisition with a known token; a single fresh resource uses plain
/// `SET NX PX` instead.
pub(crate) static ACQUIRE_UNSTAMPED: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r"
local token = ARGV[1]
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v and v ~= token then return 0 end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], token, 'PX', ARGV[2])
end
return 1
",
    )
});

/// `KEYS` = resource keys; `ARGV[1]` = token, `ARGV[2]` = TTL in ms.
///
/// Owner-checked: re-arms the TTL of every key only when *all* of them hold our token and
/// returns 1; otherwise changes nothing and returns 0. It never deletes or creates a key, so a
/// failed extension leaves whatever is there in place.
pub(crate) static EXTEND: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r"
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then return 0 end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
",
    )
});

/// `KEYS` = resource keys; `ARGV[1]` = token.
///
/// Owner-checked delete: removes each key that still holds our token and returns how many it
/// removed (0 when the lock had already expired or belongs to someone else).
pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r"
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
",
    )
});

/// Every script, in the order they are preloaded with `SCRIPT LOAD` on a new connection.
pub(crate) fn all() -> [&'static LuaScript; 4] {
    [&ACQUIRE, &ACQUIRE_UNSTAMPED, &EXTEND, &RELEASE]
}
