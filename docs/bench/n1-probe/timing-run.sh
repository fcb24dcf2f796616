#!/bin/bash
# Three rounds: this crate with 2 places (shipped) and 4, then the floor; vmstat over each run.
cd /work/main
date -u +"start %F %T UTC"
for r in 1 2 3; do
  for v in "PLACES=2 MODE=redlock ONCE=1" "PLACES=4 MODE=redlock ONCE=1" "MODE=floor"; do
    echo "== round $r: $v"
    vmstat 1 7 > /tmp/vm.txt &
    env $v SECS=6 ./target/release/examples/tp_probe 2>&1 | grep -E "ops/s|per batch|avg|evalsha|used_cpu"
    wait
    awk 'NR>3 {us+=$13; sy+=$14; id+=$15; n++} END {printf "vmstat (1 s samples 2-6): us %.0f sy %.0f id %.0f\n", us/n, sy/n, id/n}' /tmp/vm.txt
  done
done
date -u +"end %F %T UTC"
