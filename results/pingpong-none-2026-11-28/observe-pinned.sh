#!/usr/bin/env bash
# A ping-pong pinned to vCPU 0: bare, under `gleaner run --observe` (BPF sampler), and under
# `gleaner run --observe --sampler procfs`, alternating, N rounds of 3 s (default 8). Prints the
# three throughputs and the two ratios against bare per round.
# Usage (repository root): bash results/pingpong-none-2026-11-28/observe-pinned.sh [N]
set -euo pipefail
g=target/release/gleaner
tp() { grep -o "throughput=[0-9]*" | cut -d= -f2; }
for i in $(seq 1 "${1:-8}"); do
  a=$(taskset -c 0 $g workload pingpong --duration 3s 2>/dev/null | tp)
  b=$($g run --observe -- taskset -c 0 $g workload pingpong --duration 3s 2>/dev/null | tp)
  c=$($g run --observe --sampler procfs -- taskset -c 0 $g workload pingpong --duration 3s 2>/dev/null | tp)
  echo "$a $b $c $(python3 -c "print(round($b/$a,3), round($c/$a,3))")"
done
