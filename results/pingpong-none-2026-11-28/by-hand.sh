#!/usr/bin/env bash
# 12 by-hand ping-pong runs under gleaner run, each with a timeline; prints the periods around
# every major change: t, n_active, total_util, g_comp, l_comp, idle periods/s.
cd /work/main
mkdir -p /tmp/pphand; rm -f /tmp/pphand/*
for i in $(seq 1 ${1:-12}); do
  target/release/gleaner run --timeline /tmp/pphand/tl-$i.jsonl -- target/release/gleaner workload pingpong --duration 3s > /tmp/pphand/out-$i.txt 2>/tmp/pphand/err-$i.txt
done
python3 - <<'PY'
import json,glob
for f in sorted(glob.glob('/tmp/pphand/tl-*.jsonl'), key=lambda x:int(x.split('-')[-1].split('.')[0])):
    rows=[json.loads(l) for l in open(f)]
    out=open(f.replace('tl-','out-').replace('.jsonl','.txt')).read().split('throughput=')[-1].split()[0] if True else ''
    mc=[i for i,r in enumerate(rows) if any(e.get('kind','').startswith('Major') or 'major' in json.dumps(e).lower() for e in r.get('events',[]))]
    print(f.split('/')[-1], 'throughput', out, 'major changes at rows', mc)
    for i in mc:
        for r in rows[max(0,i-3):i+2]:
            c=r.get('characteristics') or {}
            print('   t=%.2f n=%s util=%.2f g=%.1fus l=%.1fus idle/s=%.0f' % (r['t_s'], r['n_active'], c.get('total_util',0), c.get('g_comp_ns',0)/1e3, c.get('l_comp_ns',0)/1e3, c.get('idle_periods_per_sec',0)))
PY
