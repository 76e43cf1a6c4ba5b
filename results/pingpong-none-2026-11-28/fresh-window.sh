#!/usr/bin/env bash
# Alternates Gleaner before the fresh-window confirmation (OLD, a build of the commit before it)
# and after (target/release/gleaner) on ping-pong, N runs each (default 12), each with a
# timeline; the workload is the same binary in both. Prints per run: build, round trips/s, major
# changes, and g_comp of the periods that made them; then medians and counts.
# Usage: OLD=/tmp/gleaner-old bash fresh-window.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=/tmp/fresh-window; mkdir -p $out; rm -f $out/*
n=${1:-12}
for i in $(seq 1 "$n"); do
  for b in old new; do
    bin=target/release/gleaner; [ $b = old ] && bin=$OLD
    $bin run --timeline $out/$b-$i.jsonl -- target/release/gleaner workload pingpong --duration 3s > $out/$b-$i.out 2>/dev/null
  done
done
N=$n OUT=$out python3 - <<'PY'
import json, os, statistics as st
n, out = int(os.environ['N']), os.environ['OUT']
res = {}
for b in ['old', 'new']:
    for i in range(1, n + 1):
        rows = [json.loads(l) for l in open(f'{out}/{b}-{i}.jsonl')]
        thr = float(open(f'{out}/{b}-{i}.out').read().split('throughput=')[-1].split()[0])
        mc = [r for r in rows if any(e.get('kind') == 'major-change' for e in r.get('events', []))]
        fresh = sum(1 for r in rows if r.get('fresh_rates_wanted'))
        res.setdefault(b, []).append((thr, len(mc)))
        print(b, i, f'{thr/1e3:.0f}k', 'major changes', len(mc),
              [round((r.get('characteristics') or {}).get('g_comp_ns', 0) / 1e3, 1) for r in mc],
              'fresh windows asked', fresh)
for b, v in res.items():
    xs = sorted(x[0] for x in v)
    print(b, f'median {st.median(xs)/1e3:.0f}k (min {xs[0]/1e3:.0f}k, max {xs[-1]/1e3:.0f}k)',
          'runs with a major change', sum(1 for x in v if x[1]), 'of', len(v))
PY
