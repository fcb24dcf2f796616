#!/usr/bin/env python3
"""What one batched renewal costs a node's server per key, from the server's own counters.

Usage: extend_cost.py PORT  (a scratch redis-server on 127.0.0.1:PORT; it is FLUSHALLed).
Holds 1,000 single-key locks (one token each, as the client's locks have), then calls the
renewal script of redlock/src/scripts.rs (EXTEND_MANY) for all 1,000 at once, CALLS times,
with redis-benchmark (one connection, one call at a time). Prints the server's `usec_per_call`
of EVALSHA (the script and the commands it runs, no network or parsing) and the server
process's CPU time over the run (`used_cpu_user` + `used_cpu_sys`, everything), both per key.
"""
import pathlib
import subprocess
import sys

PORT = sys.argv[1]
CALLS = 300
LOCKS = 1000
SRC = (pathlib.Path(__file__).resolve().parents[3] / "redlock/src/scripts.rs").read_text()


def cli(*args, stdin=None):
    return subprocess.run(["redis-cli", "-p", PORT, *args], capture_output=True, text=True,
                          input=stdin).stdout.strip()


def raw(name):
    at = SRC.index(name)
    start = SRC.index('r"', at) + 2
    return SRC[start:SRC.index('"', start)]


def info(section):
    out = {}
    for line in cli("INFO", section).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k] = v
    return out


script = raw("pub(crate) static EXTEND_MANY:")
cli("FLUSHALL")
sha = cli("SCRIPT", "LOAD", script)
keys = [f"redlock:lock:bench:redlock:held5:100000:{i}" for i in range(LOCKS)]
tokens = [f"{i:08x}0123456789abcdef01234567" for i in range(LOCKS)]
cli("--pipe", stdin="".join(f"SET {k} {t} PX 600000\n" for k, t in zip(keys, tokens)))
args = []
for t in tokens:
    args += [t, "1", "10000"]
command = ["EVALSHA", sha, str(LOCKS), *keys, *args]
for rnd in range(2):
    cli("CONFIG", "RESETSTAT")
    cpu0 = info("cpu")
    subprocess.run(["redis-benchmark", "-p", PORT, "-n", str(CALLS), "-c", "1", "-q", *command],
                   capture_output=True, check=True)
    cpu1 = info("cpu")
    stats = info("commandstats")
    evalsha = dict(kv.split("=") for kv in stats["cmdstat_evalsha"].split(","))
    calls = int(evalsha["calls"])
    script_us = float(evalsha["usec_per_call"]) / LOCKS
    cpu = sum(float(cpu1[k]) - float(cpu0[k]) for k in ("used_cpu_user", "used_cpu_sys"))
    total_us = cpu * 1e6 / (calls * LOCKS)
    kept = sum(1 for k in keys[:10] if cli("PTTL", k) not in ("-2", "-1"))
    print(f"pass {rnd + 1}: {calls} calls of {LOCKS} locks: script {script_us:.2f} µs per key "
          f"(EVALSHA usec_per_call / {LOCKS}), server CPU {total_us:.2f} µs per key "
          f"(used_cpu_user + used_cpu_sys over the run); sample keys still held: {kept}/10")
