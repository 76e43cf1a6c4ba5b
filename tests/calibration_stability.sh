#!/bin/sh
# Is the retention hold Gleaner derives at start-up stable? (issue 15, item 3)
#
# Runs the start-up calibration N times (default 10) exactly as `gleaner run` / the daemon
# do it with no cached value (`gleaner probe --calibrate`: repeated quick measurements,
# outliers rejected, bounded by the cost model), prints each hold and how it was obtained,
# and passes when the largest hold is at most 1.3 times the smallest (all within 30 %).
# Meaningful only on a quiet machine: other load on the vCPUs is what makes wake costs vary.
#
#   tests/calibration_stability.sh [N] [path/to/gleaner]
set -eu
n=${1:-10}
exe=${2:-target/release/gleaner}
[ -x "$exe" ] || exe=target/debug/gleaner
[ -x "$exe" ] || { echo "build gleaner first (cargo build --release -p gleaner)" >&2; exit 2; }
echo "machine: $(nproc) vCPUs, cpuidle driver $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none), load $(cut -d' ' -f1-3 /proc/loadavg)"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
i=1
while [ "$i" -le "$n" ]; do
    "$exe" probe --calibrate --json | tr -d '\n' >>"$out"
    echo >>"$out"
    i=$((i + 1))
done
python3 - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
holds = [r["timeout_ns"] / 1000 for r in runs]
for i, r in enumerate(runs, 1):
    print(f"start {i:2}: hold {r['timeout_ns'] / 1000:7.1f} us  cached={str(r['trusted']).lower():5}  {r['source']}")
lo, hi, med = min(holds), max(holds), statistics.median(holds)
ok = hi <= 1.3 * lo
print(f"holds: min {lo:.1f} us, median {med:.1f} us, max {hi:.1f} us; max/min {hi / lo:.2f} "
      f"({'within' if ok else 'NOT within'} 30 %); {sum(r['trusted'] for r in runs)}/{len(runs)} would be cached")
sys.exit(0 if ok else 1)
PY
