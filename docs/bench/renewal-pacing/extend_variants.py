#!/usr/bin/env python3
"""Variants of the renewal script (EXTEND_MANY), timed as extend_cost.py times the shipped one.

Usage: extend_variants.py PORT  (a scratch redis-server on 127.0.0.1:PORT; it is FLUSHALLed).
Not a benchmark of the library: a check of where the script's time per key goes (the two
commands it runs per key, or the Lua around them), and whether a variant is cheaper. Each
variant is timed twice (EVALSHA usec_per_call / 1,000 keys); the last column is its answer for
one held key (a renewal and, for the scripts that report it, the µs the call ran).
"""
import pathlib
import subprocess
import sys

src = (pathlib.Path(__file__).resolve().parent / "extend_cost.py").read_text()
# reuse helpers by exec'ing up to the script definition
head = src[:src.index("script = raw(")].replace(
    "pathlib.Path(__file__).resolve()", f"pathlib.Path({str(pathlib.Path(__file__).resolve())!r})")
exec(head)
base = raw("pub(crate) static EXTEND_MANY:")
v1 = base.replace("redis.pcall('GET', KEYS[j])", "redis.call('GET', KEYS[j])")
v2 = base.replace("""for i = 1, #ARGV, 3 do
  local token, n, ttl = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]""", """for i = 1, #ARGV, 3 do
  local token, n, ttl = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  if n == 1 then
    local v = redis.pcall('GET', KEYS[k])
    local ok = 0
    if v == token then redis.call('PEXPIRE', KEYS[k], ttl) ok = 1
    elseif v == false then ok = 2
    elseif type(v) == 'table' and not string.find(v.err, 'WRONGTYPE', 1, true) then return redis.error_reply(v.err) end
    out[i] = ok
    k = k + 1
  else""").replace("""  out[#out + 1] = ok
  k = k + n
end""", """  out[#out + 1] = ok
  k = k + n
  end
end""")
only_get = """local out = {}
for i = 1, #KEYS do local v = redis.call('GET', KEYS[i]) out[i] = 1 end
return out"""
only_pexpire = """local out = {}
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[3*i]) out[i] = 1 end
return out"""
empty_loop = """local out = {}
for i = 1, #KEYS do out[i] = 1 end
return out"""
keys = [f"redlock:lock:bench:redlock:held5:100000:{i}" for i in range(LOCKS)]
tokens = [f"{i:08x}0123456789abcdef01234567" for i in range(LOCKS)]
args = []
for t in tokens:
    args += [t, "1", "10000"]
pexpireat_only = """local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do redis.call('PEXPIREAT', KEYS[i], now + tonumber(ARGV[3*i])) out[i] = 1 end
return out"""
v3 = base.replace("local out = {}", "local now = tonumber(t0[1]) * 1000 + math.floor(tonumber(t0[2]) / 1000)\nlocal out = {}", 1).replace("redis.call('PEXPIRE', KEYS[j], ttl)", "redis.call('PEXPIREAT', KEYS[j], now + ttl)").replace("local token, n, ttl = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]", "local token, n, ttl = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])")
variants = [("shipped", base), ("call not pcall", v1), ("one-key fast path", v2), ("shipped with PEXPIREAT", v3), ("GET only", only_get), ("PEXPIRE only", only_pexpire), ("PEXPIREAT only", pexpireat_only), ("empty loop over keys", empty_loop)]
for name, script in variants + variants:
    cli("FLUSHALL")
    sha = cli("SCRIPT", "LOAD", script)
    cli("--pipe", stdin="".join(f"SET {k} {t} PX 600000\n" for k, t in zip(keys, tokens)))
    res = []
    for rnd in range(2):
        cli("CONFIG", "RESETSTAT")
        subprocess.run(["redis-benchmark", "-p", PORT, "-n", "300", "-c", "1", "-q", "EVALSHA", sha, str(LOCKS), *keys, *args], capture_output=True, check=True)
        stats = info("commandstats")
        ev = dict(kv.split("=") for kv in stats["cmdstat_evalsha"].split(","))
        res.append(float(ev["usec_per_call"]) / LOCKS)
    check = cli("EVALSHA", sha, "1", keys[0], tokens[0], "1", "10000")
    print(f"{name:24s} script µs/key: {res[0]:.2f} {res[1]:.2f}   answer for one held key: {check.splitlines()[:2]}")
