#!/usr/bin/env bash
# Shared helpers of up.sh, down.sh and status.sh. Sourced, not run.

# Every node started by up.sh lives in "$RUN_DIR/<port>/" (data, log, pidfile).
RUN_DIR="${RUN_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/run}"
# The server binary: $REDLOCK_TEST_SERVER (as for the testkit), else $REDIS_SERVER, else
# redis-server on PATH. valkey-server works too; redis-cli talks to both.
REDIS_SERVER="${REDLOCK_TEST_SERVER:-${REDIS_SERVER:-redis-server}}"
REDIS_CLI="${REDIS_CLI:-redis-cli}"
# Upper bound of every single redis-cli call, so a paused (SIGSTOPped) node cannot hang us.
CLI_TIMEOUT="${CLI_TIMEOUT:-2}"

# cli PORT ARGS...: one bounded redis-cli call against 127.0.0.1:PORT, raw output.
cli() {
  local port="$1"
  shift
  timeout "$CLI_TIMEOUT" "$REDIS_CLI" -h 127.0.0.1 -p "$port" --raw "$@" 2>/dev/null
}

# answers_ping PORT: true if something on 127.0.0.1:PORT answers PING with PONG.
answers_ping() {
  [[ "$(cli "$1" PING)" == "PONG" ]]
}

# alive PID: true while PID runs. A zombie counts as gone: where PID 1 does not reap orphans
# (containers), an exited daemon stays a zombie and `kill -0` keeps succeeding.
alive() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  # The state follows "(comm) ", and comm itself may contain spaces or parentheses.
  stat="${stat##*) }"
  [[ "${stat:0:1}" != Z ]]
}

# node_pid PORT: the pid in the node's pidfile if that process is a live redis-server or
# valkey-server.
node_pid() {
  local pidfile="$RUN_DIR/$1/redis.pid" pid
  [[ -r "$pidfile" ]] || return 1
  pid="$(<"$pidfile")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  # Guards against a recycled pid belonging to an unrelated process.
  grep -Eq 'redis|valkey' "/proc/$pid/comm" 2>/dev/null || return 1
  alive "$pid" || return 1
  echo "$pid"
}

# node_ports: ports of every node directory under RUN_DIR, ascending.
node_ports() {
  local dir
  [[ -d "$RUN_DIR" ]] || return 0
  for dir in "$RUN_DIR"/*/; do
    [[ -d "$dir" ]] || continue
    dir="${dir%/}"
    dir="${dir##*/}"
    [[ "$dir" =~ ^[0-9]+$ ]] && echo "$dir"
  done | sort -n
}

# server_version PORT: "redis 7.0.15", "valkey 9.1.2" (Valkey reports server_name and
# valkey_version, plus a redis_version for compatibility), or "-".
server_version() {
  local info name version
  info="$(cli "$1" INFO server | tr -d '\r')"
  name="$(sed -n 's/^server_name://p' <<<"$info")"
  name="${name:-redis}"
  version="$(sed -n "s/^${name}_version://p" <<<"$info")"
  version="${version:-$(sed -n 's/^redis_version://p' <<<"$info")}"
  if [[ -n "$version" ]]; then
    echo "$name $version"
  else
    echo -
  fi
}
