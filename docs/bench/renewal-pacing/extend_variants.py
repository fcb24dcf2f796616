#!/usr/bin/env python3
"""Variants of the renewal script (EXTEND_MANY), timed as extend_cost.py times the shipped one.

Usage: extend_variants.py PORT  (a scratch redis-server on 127.0.0.1:PORT; it is FLUSHALLed).
Not a benchmark of the library: a check of where the script's time per key goes (the two
commands it runs per key, or the Lua around them), and whether a variant is cheaper. Each
variant is timed twice (EVALSHA usec_per_call / 1,000 keys); the last column is its answer for
two held single-key locks (1 each, and, for the scripts that report it, the µs the call ran).
"""
import sys

from extend_cost import cli, load, raw, time_calls, KEYS, TOKENS

base = raw("pub(crate) static EXTEND_MANY:")
call_not_pcall = base.replace("redis.pcall('GET', KEYS[j])", "redis.call('GET', KEYS[j])")
one_key_path = base.replace("""for i = 1, #ARGV, 3 do
  local token, n, ttl = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]""", """for i = 1, #ARGV, 3 do
  local token, n, ttl = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  if n == 1 then
    local v = redis.pcall('GET', KEYS[k])
    local ok = 0
    if v == token then redis.call('PEXPIRE', KEYS[k], ttl) ok = 1
    elseif v == false then ok = 2
    elseif type(v) == 'table' and not string.find(v.err, 'WRONGTYPE', 1, true) then return redis.error_reply(v.err) end
    out[#out + 1] = ok
    k = k + 1
  else""").replace("""  out[#out + 1] = ok
  k = k + n
end""", """  out[#out + 1] = ok
  k = k + n
  end
end""")
with_pexpireat = base.replace(
    "local out = {}",
    "local now = tonumber(t0[1]) * 1000 + math.floor(tonumber(t0[2]) / 1000)\nlocal out = {}", 1,
).replace("redis.call('PEXPIRE', KEYS[j], ttl)", "redis.call('PEXPIREAT', KEYS[j], now + ttl)").replace(
    "local token, n, ttl = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]",
    "local token, n, ttl = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])")
get_only = """local out = {}
for i = 1, #KEYS do local v = redis.call('GET', KEYS[i]) out[i] = 1 end
return out"""
pexpire_only = """local out = {}
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[3*i]) out[i] = 1 end
return out"""
pexpireat_only = """local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do redis.call('PEXPIREAT', KEYS[i], now + tonumber(ARGV[3*i])) out[i] = 1 end
return out"""
empty_loop = """local out = {}
for i = 1, #KEYS do out[i] = 1 end
return out"""
variants = [
    ("shipped", base),
    ("call not pcall", call_not_pcall),
    ("one-key fast path", one_key_path),
    ("shipped with PEXPIREAT", with_pexpireat),
    ("GET only", get_only),
    ("PEXPIRE only", pexpire_only),
    ("PEXPIREAT only", pexpireat_only),
    ("empty loop over keys", empty_loop),
]
port = sys.argv[1]
for name, script in variants + variants:
    sha = load(port, script)
    per_key = [time_calls(port, sha)[0] for _ in range(2)]
    check = cli(port, "EVALSHA", sha, "2", KEYS[0], KEYS[1], TOKENS[0], "1", "10000", TOKENS[1], "1", "10000")
    print(f"{name:24s} script µs/key: {per_key[0]:.2f} {per_key[1]:.2f}   "
          f"answer for two held keys: {check.splitlines()[:3]}")
