#!/usr/bin/env python3
"""Server cost per lock (acquire + release) of a Lua group-commit batch against the floor's
pipelined plain commands, on one node, from INFO commandstats and INFO cpu.

Usage: batch_cost.py PORT [ROUNDS [OLD_SCRIPTS_RS]]  (a scratch redis-server on 127.0.0.1:PORT;
it is FLUSHALLed). With OLD_SCRIPTS_RS (a scripts.rs of an earlier commit), that version's batch
script is measured beside this one.

Every variant takes and releases the same number of locks (20,000 per pass, fresh keys, a
32-character token, TTL 10 s), sent 64 calls per write on one connection, so the network cost
per call is the same shape for all of them. The variants take turns, ROUNDS times (default 9),
and each figure is the median of its rounds, with the lowest and highest: one run of one
variant moves by ±20 % on this machine. Per lock it reports the server's command time
(`usec` summed over the top-level commands: EVALSHA for scripts, which includes what the
script runs) and the server's CPU (`used_cpu_user` + `used_cpu_sys`, which also counts reading,
parsing and answering). Variants:

- floor: `SET k t NX PX 10000`, then an owner-checked delete script (`GET` + `DEL`), both
  pipelined: two calls per lock.
- minimal batch: one script call per 4 or 8 requests, half acquires (`SET NX PX`), half
  releases of the locks taken in the previous call (`GET` + `DEL`): the floor's own three
  commands per lock, nothing else (no identity check, no stamp, no wake-up, no error isolation).
- batch script: this crate's group-commit script (redlock/src/scripts.rs, `BATCH`), 8
  requests per call, in three shapes: fresh single-key acquires without a stamp (`S`) and
  releases without a wake-up channel — the same work as the minimal batch inside the real
  script; the same with stamped acquires (`A`); and stamped acquires with releases that
  publish on one wake-up channel each, as the client sends them by default.
"""
import pathlib
import re
import socket
import statistics
import sys

PORT = int(sys.argv[1])
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 9
OLD = pathlib.Path(sys.argv[3]).read_text() if len(sys.argv) > 3 else None
LOCKS = 20_000
SRC = (pathlib.Path(__file__).resolve().parents[3] / "redlock/src/scripts.rs").read_text()


class Conn:
    def __init__(self):
        self.sock = socket.create_connection(("127.0.0.1", PORT))
        self.buf = b""

    @staticmethod
    def encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(1 << 20)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(1 << 20)
            value, self.buf = self.buf[:n], self.buf[n + 2:]
            return value.decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ValueError(line)

    def call(self, *args):
        self.sock.sendall(self.encode(args))
        return self.read()

    def pipeline(self, calls):
        for i in range(0, len(calls), 64):
            chunk = calls[i:i + 64]
            self.sock.sendall(b"".join(self.encode(c) for c in chunk))
            for _ in chunk:
                answer = self.read()
                assert answer is not None


def raw(name, src=SRC):
    """The raw string after `name` in a scripts.rs."""
    at = src.index(name)
    start = src.index('r"', at) + 2
    return src[start:src.index('\n"', start) + 1]


MINIMAL = """
local out = {}
local k, a = 1, 1
while a <= #ARGV do
  if ARGV[a] == 'A' then
    out[#out + 1] = redis.call('SET', KEYS[k], ARGV[a + 1], 'NX', 'PX', ARGV[a + 2]) and 1 or 0
    a = a + 3
  else
    if redis.call('GET', KEYS[k]) == ARGV[a + 1] then
      redis.call('DEL', KEYS[k])
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
    a = a + 2
  end
  k = k + 1
end
return out
"""
FLOOR_DELETE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def token(i):
    return "%032x" % (i * 2654435761 % (1 << 128))


def key(i):
    return "redlock:lock:job-%d" % i


def floor_calls(sha):
    calls = []
    for i in range(LOCKS):
        calls.append(["SET", key(i), token(i), "NX", "PX", 10000])
        calls.append(["EVALSHA", sha, 1, key(i), token(i)])
    return calls


def batch_calls(sha, per_call, shipped, kind="A", channels=1):
    calls, previous, i = [], [], 0
    while i < LOCKS or previous:
        keys, argv, taken = [], [], []
        if shipped:
            keys, argv = ["redlock:identity", "redlock:stamp"], ["identity@1"]
        for _ in range(per_call // 2):
            if i < LOCKS:
                keys.append(key(i))
                argv += [kind, 1, token(i), 10000] if shipped else ["A", token(i), 10000]
                taken.append(i)
                i += 1
        for j in previous:
            keys.append(key(j))
            if shipped:
                argv += ["R", 1, token(j), channels, "wake-0123456789"]
                argv += ["redlock:release:job-%d" % j] * channels
            else:
                argv += ["R", token(j)]
        previous = taken
        calls.append(["EVALSHA", sha, len(keys), *keys, *argv])
    return calls


def measure(conn, source, build):
    """Server CPU µs and command µs per lock of one pass."""
    conn.call("FLUSHALL")
    conn.call("SET", "redlock:identity", "identity@1")
    sha = conn.call("SCRIPT", "LOAD", source)
    calls = build(sha)
    conn.call("CONFIG", "RESETSTAT")
    cpu0 = cpu(conn)
    conn.pipeline(calls)
    cpu1 = cpu(conn)
    stats = conn.call("INFO", "commandstats")
    usec = sum(int(u) for c, u in re.findall(r"cmdstat_(set|evalsha):calls=\d+,usec=(\d+)", stats))
    return (cpu1 - cpu0) * 1e6 / LOCKS, usec / LOCKS


def cpu(conn):
    info = conn.call("INFO", "cpu")
    return sum(float(v) for v in re.findall(r"used_cpu_(?:user|sys):([\d.]+)", info))


def main():
    variants = [
        ("floor (SET NX PX + delete script)", FLOOR_DELETE, floor_calls),
        ("minimal batch, 8 per call", MINIMAL, lambda s: batch_calls(s, 8, False)),
    ]
    scripts = [("batch script", raw("pub(crate) static BATCH:"))]
    if OLD:
        scripts.insert(0, ("old batch script", raw("pub(crate) static BATCH:", OLD)))
    for name, source in scripts:
        for kind, channels, shape in [("S", 0, "S, no wake-up"), ("A", 0, "A, no wake-up"), ("A", 1, "A, wake-up")]:
            variants.append(
                (f"{name}, {shape}", source, lambda s, k=kind, c=channels: batch_calls(s, 8, True, k, c))
            )

    conn = Conn()
    version = conn.call("INFO", "server").split("redis_version:")[1].split()[0]
    print(f"redis-server {version}, {LOCKS} locks per pass, 64 calls per write, one connection,")
    print(f"{ROUNDS} rounds; median (lowest–highest) per lock")
    runs = {name: [] for name, _, _ in variants}
    for _ in range(ROUNDS):
        for name, source, build in variants:
            runs[name].append(measure(conn, source, build))
    for name, got in runs.items():
        cpus, cmds = [c for c, _ in got], [u for _, u in got]
        print(
            "%-40s CPU %6.2f µs (%.2f–%.2f), command time %6.2f µs"
            % (name, statistics.median(cpus), min(cpus), max(cpus), statistics.median(cmds))
        )


if __name__ == "__main__":
    main()
