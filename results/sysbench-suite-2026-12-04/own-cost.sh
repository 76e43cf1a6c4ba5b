#!/bin/bash
# What Gleaner itself costs a 3 s `sysbench threads` run under `gleaner run --observe`:
# the BPF programs' run time (each program fd's fdinfo run_time_ns, with
# kernel.bpf_stats_enabled=1 for the run, restored on every exit) read 2.9 s in, and
# Gleaner's own CPU over a 3 s run (`/usr/bin/time` of `gleaner run --observe -- sleep 3`,
# whose child costs nothing). Root. Usage: GLEANER=target/release/gleaner bash own-cost.sh
set -u
G=${GLEANER:-target/release/gleaner}
old=$(cat /proc/sys/kernel/bpf_stats_enabled)
trap 'echo "$old" > /proc/sys/kernel/bpf_stats_enabled' EXIT
echo 1 > /proc/sys/kernel/bpf_stats_enabled
"$G" run --observe -- sysbench threads --threads=8 --thread-locks=2 --time=3 run > /dev/null 2>&1 &
runner=$!
sleep 2.9
total_ns=0; runs=0
for fd in /proc/$runner/fdinfo/*; do
  ns=$(awk '/^run_time_ns:/{print $2}' "$fd" 2>/dev/null)
  cnt=$(awk '/^run_cnt:/{print $2}' "$fd" 2>/dev/null)
  [ -n "$ns" ] || continue
  total_ns=$((total_ns + ns)); runs=$((runs + cnt))
done
wait $runner
echo "BPF programs over 2.9 s of sysbench threads: $runs runs, $((total_ns / 1000)) us"
for i in 1 2 3; do
  /usr/bin/time -f "gleaner run --observe -- sleep 3: %U s user, %S s system" "$G" run --observe -- sleep 3 2>&1 >/dev/null | tail -1
done
