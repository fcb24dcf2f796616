#!/usr/bin/env bash
# The main demo: a local 5-node Redis cluster started by the demo itself, locks taken,
# contended, surviving faults and released. Installs Debian's redis-server when missing.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found; installing Debian's package" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
exec cargo run --quiet --release -p redlock-quorum --example demo
