#!/usr/bin/env python3
"""Server time per call of the acquire script and of parts of it, from INFO commandstats.

Usage: script_cost.py PORT  (a scratch redis-server on 127.0.0.1:PORT; it is FLUSHALLed).
Each variant is loaded with SCRIPT LOAD and called 100,000 times by redis-benchmark (one
connection, one request at a time, a fresh random key per call); the figure is the server's
`usec_per_call` for EVALSHA, which includes the commands the script runs and excludes the
network. The acquire script's source is read from redlock/src/scripts.rs.
"""
import pathlib
import re
import subprocess
import sys

PORT = sys.argv[1]
SRC = (pathlib.Path(__file__).resolve().parents[3] / "redlock/src/scripts.rs").read_text()


def cli(*args):
    return subprocess.run(["redis-cli", "-p", PORT, *args], capture_output=True, text=True).stdout.strip()


def raw(name):
    """The raw string after `name` in scripts.rs."""
    at = SRC.index(name)
    start = SRC.index('r"', at) + 2
    return SRC[start:SRC.index('"', start)]


identity = raw("const IDENTITY_CHECK")
body = raw("pub(crate) static ACQUIRE:")
grant, stamp = body.split("local t = redis.call('TIME')")
stamp = "local t = redis.call('TIME')" + stamp
variants = {
    "empty script (return 1)": "return 1",
    "SET NX PX in a script": grant + "return 1",
    "+ identity check": identity + grant + "return 1",
    "+ claim stamp (no identity check)": grant + stamp,
    "acquire script as shipped": identity + grant + stamp,
}


def benchmark(*command):
    cli("FLUSHALL")
    cli("SET", "ident", "expected")
    cli("CONFIG", "RESETSTAT")
    subprocess.run(
        ["redis-benchmark", "-p", PORT, "-n", "100000", "-r", "100000000", "-c", "1", "-q", *command],
        capture_output=True,
        check=True,
    )
    stats = cli("INFO", "commandstats")
    name = command[0].lower()
    return float(re.search(rf"cmdstat_{name}:calls=\d+,usec=\d+,usec_per_call=([\d.]+)", stats).group(1))


print(f"redis-server {cli('INFO', 'server').split('redis_version:')[1].split()[0]}, 100,000 calls each")
for name, source in variants.items():
    sha = cli("SCRIPT", "LOAD", source)
    usec = benchmark("EVALSHA", sha, "3", "ident", "stamp", "k:__rand_int__", "token", "100000", "expected")
    print(f"{name:36s} {usec:6.2f} µs per call")
print(f"{'plain SET NX PX (not a script)':36s} {benchmark('SET', 'k:__rand_int__', 'token', 'NX', 'PX', '100000'):6.2f} µs per call")
