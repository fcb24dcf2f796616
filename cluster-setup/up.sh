#!/usr/bin/env bash
# Starts N independent redis-server (or valkey-server) masters on 127.0.0.1:BASE_PORT..BASE_PORT+N-1.
#
#   cluster-setup/up.sh [N=5] [BASE_PORT=7001] [--persistence none|aof-always]
#
# Each node gets cluster-setup/run/<port>/ (data, redis.log, redis.pid), no replication and
# maxmemory-policy noeviction. A node already answering PING on its port is left alone.
# Prints one redis://127.0.0.1:PORT URL per line on stdout; progress goes to stderr.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

READY_TIMEOUT_SECS=10

usage() {
  echo "usage: $0 [N=5] [BASE_PORT=7001] [--persistence none|aof-always]" >&2
  exit 2
}

persistence=none
positional=()
while (($# > 0)); do
  case "$1" in
    --persistence)
      (($# >= 2)) || usage
      persistence="$2"
      shift 2
      ;;
    --persistence=*)
      persistence="${1#*=}"
      shift
      ;;
    -h | --help) usage ;;
    -*) usage ;;
    *)
      positional+=("$1")
      shift
      ;;
  esac
done
((${#positional[@]} <= 2)) || usage
n="${positional[0]:-5}"
base="${positional[1]:-7001}"
[[ "$n" =~ ^[1-9][0-9]*$ ]] || usage
[[ "$base" =~ ^[1-9][0-9]*$ ]] || usage
((base + n - 1 <= 65535)) || usage

persistence_args=()
case "$persistence" in
  none) persistence_args=(--appendonly no) ;;
  aof-always) persistence_args=(--appendonly yes --appendfsync always) ;;
  *) usage ;;
esac

if [[ "$REDIS_SERVER" != redis-server ]] && ! command -v "$REDIS_SERVER" >/dev/null; then
  echo "server binary $REDIS_SERVER not found (from REDLOCK_TEST_SERVER or REDIS_SERVER);" \
    "unset both to use Debian's redis-server" >&2
  exit 1
fi
if ! command -v "$REDIS_SERVER" >/dev/null || ! command -v "$REDIS_CLI" >/dev/null; then
  echo "redis-server or redis-cli not found; installing Debian's redis-server" >&2
  sudo=()
  ((EUID == 0)) || sudo=(sudo)
  "${sudo[@]}" apt-get update
  "${sudo[@]}" apt-get install -y redis-server
fi

started=()
for ((port = base; port < base + n; port++)); do
  if answers_ping "$port"; then
    echo "127.0.0.1:$port already answers PING; left alone" >&2
    continue
  fi
  dir="$RUN_DIR/$port"
  mkdir -p "$dir"
  "$REDIS_SERVER" \
    --bind 127.0.0.1 \
    --port "$port" \
    --protected-mode no \
    --dir "$dir" \
    --daemonize yes \
    --pidfile "$dir/redis.pid" \
    --logfile "$dir/redis.log" \
    --save "" \
    "${persistence_args[@]}" \
    --maxmemory-policy noeviction
  started+=("$port")
done

for port in "${started[@]}"; do
  deadline=$((SECONDS + READY_TIMEOUT_SECS))
  until answers_ping "$port"; do
    if ((SECONDS >= deadline)); then
      echo "$REDIS_SERVER on 127.0.0.1:$port not ready after ${READY_TIMEOUT_SECS}s; log tail:" >&2
      tail -n 20 "$RUN_DIR/$port/redis.log" >&2 || true
      exit 1
    fi
    sleep 0.1
  done
  echo "started 127.0.0.1:$port ($(server_version "$port"), persistence: $persistence)" >&2
done

for ((port = base; port < base + n; port++)); do
  echo "redis://127.0.0.1:$port"
done
