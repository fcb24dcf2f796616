#!/usr/bin/env bash
# A throwaway PostgreSQL on loopback for the examples (the tests start their own through the
# testkit).
#
#   cluster-setup/pg.sh up [PORT=5433]   # prints postgres://fencing@127.0.0.1:PORT/postgres
#   cluster-setup/pg.sh down             # stops it and deletes its data
#
# Data, socket and log live in $RUN_DIR/pg/ (default cluster-setup/run/pg/). No durability (fsync off) and trust
# authentication on 127.0.0.1 only: for experiments, never for data you keep. Run as root, the
# server runs as the `postgres` OS user (PostgreSQL refuses to run as root), as in the tests.
# Binaries: $PG_BIN_DIR, else the newest /usr/lib/postgresql/*/bin.
set -euo pipefail

RUN_DIR="${RUN_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/run}"
dir="$RUN_DIR/pg"
READY_TIMEOUT_SECS=30

usage() {
  echo "usage: $0 up [PORT=5433] | down" >&2
  exit 2
}

bin="${PG_BIN_DIR:-}"
if [[ -z "$bin" ]]; then
  bin="$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)"
fi
if [[ -z "$bin" || ! -x "$bin/initdb" ]]; then
  echo "PostgreSQL server binaries not found: apt-get install postgresql, or set PG_BIN_DIR" >&2
  exit 1
fi

# as_pg CMD...: runs CMD as the postgres OS user when we are root.
as_pg() {
  if ((EUID == 0)); then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

case "${1:-}" in
  up)
    port="${2:-5433}"
    [[ "$port" =~ ^[1-9][0-9]*$ ]] || usage
    if [[ ! -d "$dir/data" ]]; then
      mkdir -p "$dir"
      chmod 700 "$dir"
      ((EUID != 0)) || chown postgres: "$dir"
      if ! as_pg test -w "$dir"; then
        echo "the postgres user cannot reach $dir (a parent directory is private);" \
          "set RUN_DIR to a directory it can reach, e.g. RUN_DIR=\$(mktemp -d) with chmod 755" >&2
        rm -rf "$dir"
        exit 1
      fi
      as_pg "$bin/initdb" -D "$dir/data" -U fencing -E UTF8 --no-sync --no-instructions \
        --auth-local=trust --auth-host=trust >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        exit 1
      }
    fi
    if ! as_pg "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
      as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t "$READY_TIMEOUT_SECS" \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off" \
        start >&2 || {
        tail -n 20 "$dir/postgres.log" >&2
        exit 1
      }
    fi
    echo "postgres://fencing@127.0.0.1:$port/postgres"
    ;;
  down)
    if [[ -d "$dir/data" ]]; then
      as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w -t 10 stop >&2 || true
    fi
    rm -rf "$dir"
    ;;
  *) usage ;;
esac
