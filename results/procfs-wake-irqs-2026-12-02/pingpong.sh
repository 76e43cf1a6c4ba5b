#!/bin/bash
# Ping-pong round trips/s, interleaved: bare, pinned to one vCPU, `gleaner run` with the
# procfs sampler, `gleaner run` with the default (BPF) sampler. Usage: pingpong.sh ROUNDS SECONDS
set -u
G=${GLEANER:-target/release/gleaner}
R=${1:-6}; S=${2:-4}
rt() { grep -o 'throughput=[0-9.]*' | head -1 | cut -d= -f2; }
echo "# commit $(git rev-parse --short HEAD), kernel $(uname -r), cpuidle $(cat /sys/devices/system/cpu/cpuidle/current_driver), load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
echo "round config round_trips_per_s"
for r in $(seq 1 "$R"); do
  configs=(bare one-vcpu procfs bpf)
  (( r % 2 == 0 )) && configs=(bpf procfs one-vcpu bare)
  for c in "${configs[@]}"; do
    case $c in
      bare) v=$($G workload pingpong --duration "$S" 2>&1 | rt);;
      one-vcpu) v=$(taskset -c 0 $G workload pingpong --duration "$S" 2>&1 | rt);;
      procfs) v=$($G run --sampler procfs -- $G workload pingpong --duration "$S" 2>&1 | rt);;
      bpf) v=$($G run -- $G workload pingpong --duration "$S" 2>&1 | rt);;
    esac
    echo "$r $c $v"
  done
done
