#!/bin/bash
# Ping-pong round trips/s, interleaved (order reversed every other round): `gleaner run` of
# build A, of build B, and the program pinned to one vCPU (the best fixed setting), each a
# fresh 3 s run. Usage: pingpong-ab.sh ROUNDS A-BINARY B-BINARY
set -u
R=$1; A=$2; B=$3; W=${WORKLOAD:-target/release/gleaner}
rt() { grep -o 'throughput=[0-9.]*' | head -1 | cut -d= -f2; }
echo "# $(date -u +%FT%TZ) kernel $(uname -r), cpuidle $(cat /sys/devices/system/cpu/cpuidle/current_driver), load $(cut -d' ' -f1-3 /proc/loadavg), steal so far $(awk '/^cpu /{print $9}' /proc/stat) ticks"
echo "# A=$A ($(sha1sum < "$A" | cut -c1-12)) B=$B ($(sha1sum < "$B" | cut -c1-12))"
echo "round config round_trips_per_s"
for r in $(seq 1 "$R"); do
  configs=(A B one-vcpu); (( r % 2 == 0 )) && configs=(one-vcpu B A)
  for c in "${configs[@]}"; do
    case $c in
      A) v=$($A run -- $W workload pingpong --duration 3 2>&1 | rt);;
      B) v=$($B run -- $W workload pingpong --duration 3 2>&1 | rt);;
      one-vcpu) v=$(taskset -c 0 $W workload pingpong --duration 3 2>&1 | rt);;
    esac
    echo "$r $c $v"
  done
done
