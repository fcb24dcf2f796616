# usage: cpu.sh ENV... ; runs the probe 6 s, samples client and server CPU over seconds 2-5
cd /work/main
env "$@" SECS=6 ./target/release/examples/tp_probe > /tmp/cpu.out 2>&1 &
sleep 2
P=$(pgrep -f "examples/tp_probe" | head -1); S=$(pgrep -f "redis-server" -n)
read c1 < <(awk '{print $14+$15}' /proc/$P/stat); read s1 < <(awk '{print $14+$15}' /proc/$S/stat)
sleep 3
read c2 < <(awk '{print $14+$15}' /proc/$P/stat); read s2 < <(awk '{print $14+$15}' /proc/$S/stat)
wait
echo "$* | client $(echo "scale=2; ($c2-$c1)/300" | bc) cores, server $(echo "scale=2; ($s2-$s1)/300" | bc) cores | $(grep -E "ops/s" /tmp/cpu.out) | $(grep -o "avg.*" /tmp/cpu.out) | $(grep 'per batch' /tmp/cpu.out)"
