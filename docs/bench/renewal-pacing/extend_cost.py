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

CALLS = 300
LOCKS = 1000
SRC = (pathlib.Path(__file__).resolve().parents[3] / "redlock/src/scripts.rs").read_text()
KEYS = [f"redlock:lock:bench:redlock:held5:100000:{i}" for i in range(LOCKS)]
TOKENS = [f"{i:08x}0123456789abcdef01234567" for i in range(LOCKS)]
# Per lock: its token, its number of keys, its TTL in ms.
ARGS = [a for t in TOKENS for a in (t, "1", "10000")]


def cli(port, *args, stdin=None):
    return subprocess.run(["redis-cli", "-p", port, *args], capture_output=True, text=True,
                          input=stdin).stdout.strip()


def raw(name):
    """The raw string after `name` in scripts.rs."""
    at = SRC.index(name)
    start = SRC.index('r"', at) + 2
    return SRC[start:SRC.index('"', start)]


def info(port, section):
    out = {}
    for line in cli(port, "INFO", section).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k] = v
    return out


def load(port, script):
    """Empties the node, loads `script` and takes the LOCKS locks; returns the script's sha."""
    cli(port, "FLUSHALL")
    sha = cli(port, "SCRIPT", "LOAD", script)
    cli(port, "--pipe", stdin="".join(f"SET {k} {t} PX 600000\n" for k, t in zip(KEYS, TOKENS)))
    return sha


def time_calls(port, sha):
    """CALLS calls renewing every lock; µs per key of the script and of the server's CPU."""
    cli(port, "CONFIG", "RESETSTAT")
    cpu0 = info(port, "cpu")
    subprocess.run(["redis-benchmark", "-p", port, "-n", str(CALLS), "-c", "1", "-q",
                    "EVALSHA", sha, str(LOCKS), *KEYS, *ARGS], capture_output=True, check=True)
    cpu1 = info(port, "cpu")
    stats = info(port, "commandstats")
    evalsha = dict(kv.split("=") for kv in stats["cmdstat_evalsha"].split(","))
    calls = int(evalsha["calls"])
    cpu = sum(float(cpu1[k]) - float(cpu0[k]) for k in ("used_cpu_user", "used_cpu_sys"))
    return float(evalsha["usec_per_call"]) / LOCKS, cpu * 1e6 / (calls * LOCKS)


if __name__ == "__main__":
    port = sys.argv[1]
    sha = load(port, raw("pub(crate) static EXTEND_MANY:"))
    for rnd in range(2):
        script_us, total_us = time_calls(port, sha)
        kept = sum(1 for k in KEYS[:10] if cli(port, "PTTL", k) not in ("-2", "-1"))
        print(f"pass {rnd + 1}: {CALLS} calls of {LOCKS} locks: script {script_us:.2f} µs per key "
              f"(EVALSHA usec_per_call / {LOCKS}), server CPU {total_us:.2f} µs per key "
              f"(used_cpu_user + used_cpu_sys over the run); sample keys still held: {kept}/10")
