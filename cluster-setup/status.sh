#!/usr/bin/env bash
# One line per node started by up.sh (each directory under cluster-setup/run/):
# port, pid, reachable, role, uptime_in_seconds, aof (appendonly/appendfsync), save config,
# maxmemory-policy, server (redis 7.0.15, valkey 9.1.2).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

# info_field PORT SECTION FIELD: one field of INFO SECTION, or "-".
info_field() {
  local value
  value="$(cli "$1" INFO "$2" | tr -d '\r' | sed -n "s/^$3://p")"
  echo "${value:--}"
}

# config_value PORT NAME: CONFIG GET NAME's value, "\"\"" when empty.
config_value() {
  local value
  value="$(cli "$1" CONFIG GET "$2" | sed -n 2p)"
  echo "${value:-\"\"}"
}

# aof PORT: "no", or "yes/<appendfsync>".
aof() {
  if [[ "$(config_value "$1" appendonly)" == yes ]]; then
    echo "yes/$(config_value "$1" appendfsync)"
  else
    echo no
  fi
}

mapfile -t ports < <(node_ports)
if ((${#ports[@]} == 0)); then
  echo "no nodes under $RUN_DIR (start some with up.sh)" >&2
  exit 0
fi

format="%-6s %-8s %-9s %-7s %-8s %-10s %-12s %-17s %s\n"
# shellcheck disable=SC2059 # the format is ours
printf "$format" PORT PID REACHABLE ROLE UPTIME AOF SAVE MAXMEMORY-POLICY SERVER
for port in "${ports[@]}"; do
  pid="$(node_pid "$port" || echo -)"
  if answers_ping "$port"; then
    # shellcheck disable=SC2059
    printf "$format" "$port" "$pid" yes \
      "$(info_field "$port" replication role)" \
      "$(info_field "$port" server uptime_in_seconds)" \
      "$(aof "$port")" \
      "$(config_value "$port" save)" \
      "$(config_value "$port" maxmemory-policy)" \
      "$(server_version "$port")"
  else
    # shellcheck disable=SC2059
    printf "$format" "$port" "$pid" no - - - - - -
  fi
done
