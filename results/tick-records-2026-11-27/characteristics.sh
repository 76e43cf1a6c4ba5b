#!/usr/bin/env bash
# The characteristics the policy reads, with the cpuidle driver and from the kernel's tick
# records (the driver hidden, hide-cpuidle.sh), for three workloads under `run --observe`:
# median over the periods after the fifth. Prints one line per run.
#   bash characteristics.sh ROUNDS
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
g=$root/target/release/gleaner
tl=$(mktemp)
trap 'rm -f "$tl"' EXIT
for w in "$g workload pipeline --work 500 --duration 3s" \
         "sysbench threads --threads=8 --thread-locks=2 --time=3 run" \
         "$g workload pingpong --duration 3"; do
    for _ in $(seq "${1:-2}"); do
        for mode in driver records; do
            prefix=()
            [ "$mode" = records ] && prefix=("$here/hide-cpuidle.sh")
            : >"$tl"
            "${prefix[@]}" "$g" run --observe --timeline "$tl" -- $w >/dev/null 2>&1
            python3 - "$tl" "$mode" "$w" <<'PY'
import json, statistics as st, sys
periods = [json.loads(l)['characteristics'] for l in open(sys.argv[1])][5:]
med = lambda k: st.median(c[k] for c in periods)
name = sys.argv[3].split()[2] if 'gleaner' in sys.argv[3].split()[0] else sys.argv[3].split()[0]
print(f"{name:9} {sys.argv[2]:8} idle periods/s {med('idle_periods_per_sec'):7.0f}  l_idle {med('l_idle_ns')/1e3:6.1f} us"
      f"  l_comp {med('l_comp_ns')/1e3:7.1f} us  utilization {med('total_util'):.2f}")
PY
        done
    done
done
