#!/usr/bin/env bash
# Traces every BPF measurement window of N pinned ping-pong runs under `gleaner run --observe`
# (nothing is changed; the window's trace lines are at level trace), and prints one line per
# window: run, seconds since the run's first window, how long opening the window took (attaching
# the programs), covered ns, events, switches, the workload's run time in it, and its g_comp.
# Usage: bash trace-windows.sh [N] > windows.tsv
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-20}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq 1 "$n"); do
  GLEANER_LOG=info,gleaner_linux=trace target/release/gleaner run --observe -- \
    taskset -c 0 target/release/gleaner workload pingpong --duration 3s 2> "$out/$i.log" > /dev/null
done
OUT=$out N=$n python3 - <<'PY'
import os, re
from datetime import datetime
out, n = os.environ['OUT'], int(os.environ['N'])
print('run\tt_s\topening_ns\tcovered_ns\tevents\tswitches\twork_ns\tg_comp_us')
for i in range(1, n + 1):
    t0, opening = None, None
    for line in open(f'{out}/{i}.log'):
        kv = dict(re.findall(r'(\w+)=(\S+)', line))
        if 'window opened' in line:
            opening = int(kv['opening_ns'])
        elif 'covered_ns' in kv:
            t = datetime.fromisoformat(line.split()[0].replace('Z', '+00:00')).timestamp()
            t0 = t if t0 is None else t0
            sw, work = int(kv['switches']), int(kv['work_ns'])
            g = work / sw / 1e3 if sw else float('nan')
            print(f'{i}\t{t - t0:.3f}\t{opening if opening is not None else ""}\t{kv["covered_ns"]}\t{kv["events"]}\t{sw}\t{work}\t{g:.1f}')
            opening = None
PY
