#!/usr/bin/env bash
# Stops every node started by up.sh (each directory under cluster-setup/run/).
#
#   cluster-setup/down.sh [--clean]
#
# SHUTDOWN NOSAVE via redis-cli first; if the node does not go away (paused, hung, password
# set), SIGCONT+SIGTERM and finally SIGKILL through its pidfile. Idempotent. --clean also
# deletes run/ (data and logs).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

STOP_TIMEOUT_SECS=5

clean=false
case "${1:-}" in
  "") ;;
  --clean) clean=true ;;
  *)
    echo "usage: $0 [--clean]" >&2
    exit 2
    ;;
esac

# wait_gone PID SECS: true once PID has exited, false if it is still alive after SECS.
wait_gone() {
  local pid="$1" deadline=$((SECONDS + $2))
  while alive "$pid"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

mapfile -t ports < <(node_ports)
for port in "${ports[@]}"; do
  pid="$(node_pid "$port" || true)"
  if [[ -z "$pid" ]] && ! answers_ping "$port"; then
    echo "127.0.0.1:$port not running" >&2
    continue
  fi
  # A SIGSTOPped node would let SHUTDOWN time out; continuing it first costs nothing.
  if [[ -n "$pid" ]]; then
    kill -CONT "$pid" 2>/dev/null || true
  fi
  # redis-cli reports the closed connection as an error; success is judged below.
  cli "$port" SHUTDOWN NOSAVE >/dev/null || true
  if [[ -n "$pid" ]] && ! wait_gone "$pid" "$STOP_TIMEOUT_SECS"; then
    echo "127.0.0.1:$port ignored SHUTDOWN; signalling pid $pid" >&2
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" "$STOP_TIMEOUT_SECS"; then
      kill -KILL "$pid" 2>/dev/null || true
      wait_gone "$pid" "$STOP_TIMEOUT_SECS" || {
        echo "pid $pid survived SIGKILL" >&2
        exit 1
      }
    fi
  fi
  rm -f "$RUN_DIR/$port/redis.pid"
  echo "stopped 127.0.0.1:$port" >&2
done

if "$clean"; then
  rm -rf "$RUN_DIR"
fi
