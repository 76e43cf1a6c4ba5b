#!/usr/bin/env bash
# Gleaner's own CPU while it acts (consolidates) on a 10 s ping-pong: the fresh windows the
# policy asks for while a consolidation stands are extra measurement (bench/overhead.py
# measures `run --observe`, where none are asked for). Alternates OLD and the current build,
# N runs each (default 5); own CPU = the gleaner process's threads' schedstat run time between
# 1 s and 9.5 s after the start, over the 8.5 s between.
# Usage: OLD=/path/to/old/gleaner bash own-cpu-acting.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
# One state directory per build, its start-up calibration (wake costs, once per boot) done
# before the measured runs, as bench/overhead.py does.
declare -A state
for b in old new; do
  state[$b]=$(mktemp -d)
  bin=target/release/gleaner; [ $b = old ] && bin=$OLD
  $bin run --state-dir "${state[$b]}" -- sleep 0.5 > /dev/null 2>&1
done
trap 'rm -rf "${state[old]}" "${state[new]}"' EXIT
own_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s+=$1} END {print s+0}'; }
for i in $(seq 1 "${1:-5}"); do
  for b in old new; do
    bin=target/release/gleaner; [ $b = old ] && bin=$OLD
    $bin run --state-dir "${state[$b]}" -- target/release/gleaner workload pingpong --duration 10s > /dev/null 2>&1 &
    pid=$!
    sleep 1; a=$(own_ns $pid); sleep 8.5; z=$(own_ns $pid)
    wait $pid || true
    python3 -c "print('$b', $i, 'own CPU %.3f %% of one CPU' % (($z - $a) / 8.5e9 * 100))"
  done
done
