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

/// Returned by the acquire scripts when the node's identity record is not the one this
/// connection was opened against (the data was lost, or another server answers).
pub(crate) const IDENTITY_CHANGED: i64 = -2;

/// An acquire script's grant that found one of its keys holding the token already (it re-armed
/// that key rather than created it) answers `−(KEPT + value)` instead of `value` (the stamp,
/// or 1 without stamps). The cleanup of an attempt made with the caller's own token goes only
/// to nodes where it created every key: a key it kept may be a lock the caller, or whoever
/// handed it the token, still holds.
pub(crate) const KEPT: i64 = 10;

/// A grant in an acquire script's answer: its value (the stamp, or 1) and whether it kept a
/// key that held the token already; `None` for a refusal or an error code.
pub(crate) fn grant(answer: i64) -> Option<(u64, bool)> {
    if answer > 0 {
        Some((answer.unsigned_abs(), false))
    } else if answer <= -(KEPT + 1) {
        Some(((-answer - KEPT).unsigned_abs(), true))
    } else {
        None
    }
}

/// `stretch(key, ttl)`: the owner-checked re-arm every script uses on a key that already holds
/// the caller's token. It sets the key's expiry to `ttl` ms from now only when that is later
/// than the expiry it has: a token can be held by more than one client (a lock handed over with
/// `try_acquire_with_token`), and a renewal of the old holder still in flight when it stopped
/// used to land after the new holder's re-arm and cut its keys back to the old, shorter TTL
/// while the new holder counted on its own (test `renewal_attacks::a_renewal_landing_after_a_
/// handoff_does_not_shorten_the_new_holders_keys`: a third client took the lock). A key that
/// lives longer than its holder thinks is safe; one that lives shorter is two holders. A key
/// without an expiry (`PTTL` −1, written so by someone else) keeps none: giving it the TTL
/// would move its expiry earlier (test `batch_attacks::a_rearm_does_not_give_a_key_without_
/// expiry_an_expiry`). (`PTTL` and a comparison rather than `PEXPIRE … GT`, which needs Redis
/// 7.0.)
const STRETCH: &str = r"
local function stretch(key, ttl)
  local left = redis.call('PTTL', key)
  if left >= 0 and left < tonumber(ttl) then redis.call('PEXPIRE', key, ttl) end
end
";

/// The first stamp a node cannot issue, and the error it answers instead. Lua's numbers are
/// doubles: from 2^53 on, `last + 1` rounds back to `last`, and every later grant on the node
/// got the stamp of the one before, which fence checks then took for the same holder (found
/// in review). The limit is 16 below 2^53: a grant that kept a key answers `−(KEPT + stamp)`,
/// which must stay exact too (at 2^53 − 9 it was rounded, and the client read a stamp the node
/// never issued: test `protocol::a_kept_grants_stamp_near_2_53_is_the_one_the_node_stored`,
/// found in review). A stamp that far ahead comes only from a clock once set centuries ahead;
/// the node grants nothing until its stamp key is reset (docs/fencing.md), and an acquire that
/// finds the limit undoes what it set.
const STAMP_LIMIT: &str = r"
local LIMIT = 9007199254740976
local EXHAUSTED = 'ERR claim stamps exhausted on this node: its stamp key is within 16 of 2^53 (a clock set centuries ahead?); nothing granted'
";

/// The identity check shared by both acquire scripts: `KEYS[1]` is the node's identity record,
/// `ARGV[3]` the value it held when the connection was opened. Nothing is written otherwise.
const IDENTITY_CHECK: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[3] then return -2 end
";

/// Read first by both acquire scripts when given a fourth argument (any value): the node's
/// clock (`TIME`, µs) before anything is granted, which a grant then answers beside its value
/// (`{value, clock}` instead of `value`; a refusal answers as without it). An attempt with the
/// caller's token bounds its cleanup by it (see [`RELEASE_BEFORE`]); a stamp is not the clock
/// (stamps go on from the last one, which a clock stepped back leaves ahead).
const GRANT_CLOCK: &str = r"
local at = nil
if ARGV[4] then
  local c = redis.call('TIME')
  at = tonumber(c[1]) * 1000000 + tonumber(c[2])
end
";

/// Run once per new connection: `KEYS[1]` = the node's identity record, `ARGV[1]` = a fresh
/// random id, `ARGV[2]` = the node's database. Creates the record (`<id>@<server ms>`) when the
/// server has none — a new server, or one that lost its data — and returns
/// `{record, server time in ms, server record}`. The record is the node's name in fence tokens,
/// and what an acquire checks to notice lost data.
///
/// The server record is how the client recognises one server behind two URLs: the record of
/// database 0, read (or created) there for a node in another database. Each database keeps its
/// own record, so two URLs naming one server with two databases (`…:7001/0` and
/// `alias:7001/1`) showed two servers, and one restart of it took two votes at once (test
/// `identity_races::one_server_under_two_databases_is_the_same_server`: a second client was
/// granted a held lock). The script selects database 0 only for such a node (a node URL with a
/// database other than 0 needs `+select` already); Redis restores the caller's database after
/// a script.
pub(crate) static IDENTITY: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r"
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local function record()
  local v = redis.call('GET', KEYS[1])
  if not v then
    v = ARGV[1] .. '@' .. now
    redis.call('SET', KEYS[1], v)
  end
  return v
end
local v = record()
local server = v
if ARGV[2] ~= '0' then
  redis.call('SELECT', '0')
  server = record()
  redis.call('SELECT', ARGV[2])
end
return {v, now, server}
",
    )
});

/// `KEYS[1]` = identity record, `KEYS[2]` = the node's stamp key, `KEYS[3..]` = resource keys;
/// `ARGV[1]` = token, `ARGV[2]` = TTL in ms, `ARGV[3]` = the identity record expected.
///
/// Grants when every resource key is free or already holds *our* token (an idempotent re-arm
/// after an unknown outcome), then issues the node's claim stamp
/// `max(TIME in µs, last stamp + 1)` and returns it (always ≥ 1; `−(10 + stamp)` when a key
/// held our token already, see [`KEPT`]). Returns 0 when any key is held by another token,
/// −2 when the identity record changed; nothing is written then. Answers an error when the
/// stamp would reach 2^53 ([`STAMP_LIMIT`]), having undone what it set.
///
/// Shaped for the common case, because server CPU is what limits throughput when several nodes
/// share a machine: one resource is a single `SET NX PX` (the `GET` only runs on a refusal), and
/// the stamp is written with `SET … GET`, so a clock that moves forward costs one write; only
/// a clock that did not advance past the last stamp needs the second `SET`.
/// Stamps are formatted with `%.0f` because Lua 5.1's `tostring` would print a 16-digit number
/// in exponent form and lose precision; below 2^53 (checked) they are exact.
pub(crate) static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    let source = format!(
        "{STAMP_LIMIT}{GRANT_CLOCK}{IDENTITY_CHECK}{STRETCH}{}",
        r"
local token, ttl = ARGV[1], ARGV[2]
local kept, created = false, nil
if #KEYS == 3 then
  if not redis.call('SET', KEYS[3], token, 'NX', 'PX', ttl) then
    if redis.call('GET', KEYS[3]) ~= token then return 0 end
    stretch(KEYS[3], ttl)
    kept = true
  end
else
  for i = 3, #KEYS do
    local v = redis.call('GET', KEYS[i])
    if v and v ~= token then return 0 end
  end
  created = {}
  for i = 3, #KEYS do
    if not redis.call('SET', KEYS[i], token, 'NX', 'PX', ttl) then
      stretch(KEYS[i], ttl)
      kept = true
    else
      created[#created + 1] = KEYS[i]
    end
  end
end
local t = redis.call('TIME')
local stamp = tonumber(t[1]) * 1000000 + tonumber(t[2])
local clock = stamp
local prev = redis.call('SET', KEYS[2], string.format('%.0f', stamp), 'GET')
local last = tonumber(prev or '0') or 0
if stamp <= last then stamp = last + 1 end
if stamp >= LIMIT then
  if prev then redis.call('SET', KEYS[2], prev) end
  if created then
    for _, key in ipairs(created) do redis.call('DEL', key) end
  elseif not kept then
    redis.call('DEL', KEYS[3])
  end
  return redis.error_reply(EXHAUSTED)
end
if stamp ~= clock then redis.call('SET', KEYS[2], string.format('%.0f', stamp)) end
local answer = stamp
if kept then answer = -10 - stamp end
if at then return {answer, at} end
return answer
"
    );
    LuaScript::new(source.leak())
});

/// The acquire script without claim stamps (`claim_stamps(false)`): `KEYS[1]` = identity
/// record, `KEYS[2..]` = resource keys, same arguments; returns 1 on a grant (−11 when a key
/// held our token already, see [`KEPT`]), 0 on a refusal, −2 when the identity record changed. Used for multi-resource locks, re-acquisition
/// with a known token, the restart quarantine and racing attempts that ask a first node (whose
/// ranking follows the identity records); a single fresh resource otherwise uses plain
/// `SET NX PX`. With a fourth argument, a grant also answers the node's clock (see
/// [`GRANT_CLOCK`]).
pub(crate) static ACQUIRE_UNSTAMPED: LazyLock<LuaScript> = LazyLock::new(|| {
    let source = format!(
        "{GRANT_CLOCK}{IDENTITY_CHECK}{STRETCH}{}",
        r"
local token = ARGV[1]
for i = 2, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v and v ~= token then return 0 end
end
local kept = false
for i = 2, #KEYS do
  if not redis.call('SET', KEYS[i], token, 'NX', 'PX', ARGV[2]) then
    stretch(KEYS[i], ARGV[2])
    kept = true
  end
end
local answer = 1
if kept then answer = -11 end
if at then return {answer, at} end
return answer
"
    );
    LuaScript::new(source.leak())
});

/// `KEYS` = resource keys; `ARGV[1]` = token, `ARGV[2]` = TTL in ms.
///
/// Owner-checked: re-arms the TTL of every key only when *all* of them hold our token and
/// returns 1; otherwise changes nothing and returns 0. It never deletes or creates a key, so a
/// failed extension leaves whatever is there in place, and an extension that races a release
/// cannot bring the lock back.
pub(crate) static EXTEND: LazyLock<LuaScript> = LazyLock::new(|| {
    let source = format!(
        "{STRETCH}{}",
        r"
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then return 0 end
end
for i = 1, #KEYS do
  stretch(KEYS[i], ARGV[2])
end
return 1
"
    );
    LuaScript::new(source.leak())
});

/// Batched renewal: many locks in one call. `KEYS` = the keys of every lock, concatenated;
/// `ARGV` = per lock its token, its number of keys and its own TTL in ms.
///
/// Per lock: 1 = every key held our token and was re-armed, like [`EXTEND`]; 2 = no key is held
/// by anyone else but some are *missing* (the node lost them) — the present ones were re-armed,
/// and the caller may put the missing ones back once it knows it still holds a quorum;
/// 0 = a key holds another token, nothing was changed. It never creates a key.
///
/// A key holding a value of another type (a hash written over the lock's key) is another
/// owner's: 0 for that lock alone. An error there used to fail the whole call, and with it the
/// renewal of every lock in the batch; any other error still does.
///
/// After the per-lock answers comes one more entry: how long the call ran on the server, in
/// µs (`TIME` before and after), which paces the client's next renewal calls.
pub(crate) static EXTEND_MANY: LazyLock<LuaScript> = LazyLock::new(|| {
    let source = format!(
        "{STRETCH}{}",
        r"
local t0 = redis.call('TIME')
local out = {}
local k = 1
for i = 1, #ARGV, 3 do
  local token, n, ttl = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local ok = 1
  for j = k, k + n - 1 do
    local v = redis.pcall('GET', KEYS[j])
    if type(v) == 'table' then
      if not string.find(v.err, 'WRONGTYPE', 1, true) then return redis.error_reply(v.err) end
      ok = 0
      break
    elseif v == false then
      ok = 2
    elseif v ~= token then
      ok = 0
      break
    end
  end
  if ok > 0 then
    for j = k, k + n - 1 do stretch(KEYS[j], ttl) end
  end
  out[#out + 1] = ok
  k = k + n
end
local t1 = redis.call('TIME')
out[#out + 1] = (tonumber(t1[1]) - tonumber(t0[1])) * 1000000 + tonumber(t1[2]) - tonumber(t0[2])
return out
"
    );
    LuaScript::new(source.leak())
});

/// The owner-checked delete shared by [`RELEASE`] and [`RELEASE_BEFORE`], its arguments from
/// `ARGV[o + 1]` on.
const RELEASE_BODY: &str = r"
local n, heard = 0, ARGV[o + 3] and 0 or -1
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[o + 1] then
    redis.call('DEL', KEYS[i])
    n = n + 1
    if ARGV[o + i + 2] then
      local r = redis.pcall('PUBLISH', ARGV[o + i + 2], ARGV[o + 2])
      if type(r) == 'number' and heard >= 0 then heard = heard + r else heard = -1 end
    end
  end
end
return {n, heard}
";

/// `KEYS` = resource keys; `ARGV[1]` = token, `ARGV[2]` = the release's wake-up id,
/// `ARGV[3..]` = one wake-up channel per key (none for a cleanup).
///
/// Owner-checked delete: removes each key that still holds our token, publishes the wake-up id
/// on that key's channel so waiters retry at once, and returns `{removed, heard}`: how many keys
/// it removed (0 when the lock had already expired or belongs to someone else), and how many
/// subscribers received its wake-ups (−1 when it published none, or a publish failed). Every
/// node of one release publishes the same id, so a waiter acts on the first of them and drops
/// the rest. The wake-up is best effort (`pcall`): an ACL user without permission on the
/// channel still releases.
pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    let source = format!("local o = 0{RELEASE_BODY}");
    LuaScript::new(source.leak())
});

/// [`RELEASE`] with a deadline on the node's clock: `ARGV[1]` = the last moment (`TIME`, µs)
/// at which it may still delete, then [`RELEASE`]'s arguments. Past it, it does nothing and
/// answers `{-1, -1}`: not "nothing to delete" (counted as such, a release after a node's clock
/// stepped forward said done while the keys stayed there, found in review).
///
/// The cleanup of an attempt with the caller's token deletes by that token, and the keys
/// holding it may meanwhile stand for the lock taken again with it. The next attempt with the
/// token in the process waits until such a cleanup answered or its grace ran out; a cleanup
/// written later than that — its connection's runtime stopped running (a current-thread
/// runtime driven only inside `block_on`), or the network held it — deleted the keys the
/// re-claim had kept, and a rival took the lock (test `reclaim_attacks::a_cleanup_queued_in_
/// an_idle_runtime_is_not_written_after_the_reclaim`). So the cleanup expires on the node
/// before that grace ends, counted from the node's clock read before the grant it undoes
/// ([`GRANT_CLOCK`]; see `engine::cleanup_deadline`).
pub(crate) static RELEASE_BEFORE: LazyLock<LuaScript> = LazyLock::new(|| {
    let source = format!(
        "{}{RELEASE_BODY}",
        r"
local t = redis.call('TIME')
if tonumber(t[1]) * 1000000 + tonumber(t[2]) > tonumber(ARGV[1]) then return {-1, -1} end
local o = 1"
    );
    LuaScript::new(source.leak())
});

/// One script call for many independent requests to one node (group commit): while a request
/// to a node is in flight, the requests made meanwhile are sent together as one call of this
/// script, which runs each of them with the same semantics as its own script and answers each
/// one separately. Atomic per node for the whole batch; a request that raises an error (say, a
/// key of the wrong type) answers that error and does not stop the others.
///
/// `KEYS[1]` = the identity record, `KEYS[2]` = the stamp key, then every request's keys in
/// order. `ARGV[1]` = the identity record the connection expects; then per request: its kind,
/// its number of keys, its token, and
/// - `S` (a fresh token on one key, no stamp: plain `SET NX PX`), `A` (stamped acquire,
///   as [`ACQUIRE`]), `U` (unstamped acquire, as [`ACQUIRE_UNSTAMPED`]), `B` and `V` (the
///   same as `A` and `U`, answering the node's clock as well, see [`GRANT_CLOCK`]), `E`
///   (extend, as [`EXTEND`]): its TTL in ms;
/// - `R` (release, as [`RELEASE`]): the number of wake-up channels (0 or its number of keys),
///   the wake-up id, then the channels; `T` (release with a deadline, as [`RELEASE_BEFORE`]):
///   the same with the deadline (µs) after the wake-up id.
///
/// Answers, in one flat array, per request: what its own script answers (the stamp for `A`,
/// `−(10 + value)` for a grant that kept a key holding its token already (see [`KEPT`]), −2
/// for an acquire when the identity record changed) — for `R` and `T` two entries, `removed` then
/// `heard`, written once the release has run (`removed` −1 for a `T` past its deadline); for `B` and `V` two entries, the answer then the
/// clock read before the grant — or, for a request that raised an error, one string starting
/// with `E` instead.
/// Stamps issued in one batch are strictly increasing, continuing from the node's last stamp.
///
/// Written for the server's CPU, which is what limits throughput when several nodes share a
/// machine: the identity record is read once, and only when the batch holds an acquire other
/// than `S`; the clock is read at most once;
/// counts are compared as strings before falling back to `tonumber` (a C `strtod` per call);
/// answers go into one flat array (a nested one per release cost about 1 µs per lock on
/// Redis 7.0). Measured in `docs/bench/bounds/batch_cost.py`.
pub(crate) static BATCH: LazyLock<LuaScript> = LazyLock::new(|| {
    let source = format!(
        "{STAMP_LIMIT}{STRETCH}{}",
        r"
local out, m = {}, 0
local same, stamp, now = nil, nil, nil
local function count(s)
  if s == '1' then return 1 elseif s == '0' then return 0 end
  return tonumber(s)
end
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end
local function next_stamp()
  if stamp then
    stamp = stamp + 1
  else
    local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
    stamp = math.max(clock(), last + 1)
  end
  return stamp
end
-- Answers 0 (refused), 1 (every key set) or 2 (some key held our token already), and the keys
-- it set when there are several.
local function acquire(k, n, token, ttl)
  if n == 1 then
    if not redis.call('SET', KEYS[k], token, 'NX', 'PX', ttl) then
      if redis.call('GET', KEYS[k]) ~= token then return 0 end
      stretch(KEYS[k], ttl)
      return 2
    end
    return 1
  end
  for i = k, k + n - 1 do
    local v = redis.call('GET', KEYS[i])
    if v and v ~= token then return 0 end
  end
  local got, created = 1, {}
  for i = k, k + n - 1 do
    if not redis.call('SET', KEYS[i], token, 'NX', 'PX', ttl) then
      stretch(KEYS[i], ttl)
      got = 2
    else
      created[#created + 1] = KEYS[i]
    end
  end
  return got, created
end
local function run(kind, k, n, a)
  local token = ARGV[a + 2]
  if kind == 'S' then
    if redis.call('SET', KEYS[k], token, 'NX', 'PX', ARGV[a + 3]) then return 1 end
    return 0
  elseif kind == 'A' or kind == 'U' or kind == 'B' or kind == 'V' then
    local stamped = kind == 'A' or kind == 'B'
    if kind == 'B' or kind == 'V' then clock() end
    if same == nil then same = redis.call('GET', KEYS[1]) == ARGV[1] end
    if not same then return -2 end
    local got, created = acquire(k, n, token, ARGV[a + 3])
    if got == 0 then return 0 end
    local value = 1
    if stamped then
      value = next_stamp()
      if value >= LIMIT then
        if created then
          for _, key in ipairs(created) do redis.call('DEL', key) end
        elseif got == 1 then
          redis.call('DEL', KEYS[k])
        end
        error(redis.error_reply(EXHAUSTED))
      end
    end
    if got == 2 then return -10 - value end
    return value
  elseif kind == 'E' then
    for i = k, k + n - 1 do
      if redis.call('GET', KEYS[i]) ~= token then return 0 end
    end
    for i = k, k + n - 1 do
      stretch(KEYS[i], ARGV[a + 3])
    end
    return 1
  elseif kind == 'R' or kind == 'T' then
    local c = count(ARGV[a + 3])
    local done, heard = 0, c > 0 and 0 or -1
    local o = 0
    if kind == 'T' then
      o = 1
      if clock() > tonumber(ARGV[a + 5]) then n = 0; heard = -1; done = -1 end
    end
    for i = 0, n - 1 do
      if redis.call('GET', KEYS[k + i]) == token then
        redis.call('DEL', KEYS[k + i])
        done = done + 1
        if i < c then
          local r = redis.pcall('PUBLISH', ARGV[a + 5 + o + i], ARGV[a + 4])
          if type(r) == 'number' and heard >= 0 then heard = heard + r else heard = -1 end
        end
      end
    end
    -- Written only now, once every key was handled: nothing below may raise, so a release
    -- that fails part-way answers one error entry and no partial pair.
    m = m + 1
    out[m] = done
    return heard
  end
  return 'Eunknown request kind'
end
local k, a, last = 3, 2, #ARGV
while a <= last do
  local kind, n = ARGV[a], count(ARGV[a + 1])
  local ok, r = pcall(run, kind, k, n, a)
  if not ok then
    if type(r) == 'table' and r.err then r = 'E' .. r.err else r = 'E' .. tostring(r) end
  end
  m = m + 1
  out[m] = r
  if ok and (kind == 'B' or kind == 'V') then
    m = m + 1
    out[m] = clock()
  end
  k = k + n
  if kind == 'R' then
    a = a + 5 + count(ARGV[a + 3])
  elseif kind == 'T' then
    a = a + 6 + count(ARGV[a + 3])
  else
    a = a + 4
  end
end
if stamp then redis.call('SET', KEYS[2], string.format('%.0f', stamp)) end
return out
"
    );
    LuaScript::new(source.leak())
});

/// Every script, in the order they are preloaded with `SCRIPT LOAD` on a new connection.
pub(crate) fn all() -> [&'static LuaScript; 8] {
    [
        &IDENTITY,
        &ACQUIRE,
        &ACQUIRE_UNSTAMPED,
        &EXTEND,
        &EXTEND_MANY,
        &RELEASE,
        &RELEASE_BEFORE,
        &BATCH,
    ]
}
