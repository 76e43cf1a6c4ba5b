#!/usr/bin/env bash
# Alternates the shipped config and major_gcomp_factor = 4 on ping-pong, 12 runs each;
# prints per run: config, throughput, number of major changes, g_comp of the reactivating period.
cd /work/main
mkdir -p /tmp/gcexp; rm -f /tmp/gcexp/*
for i in $(seq 1 12); do
  for c in default gc4; do
    args=(); [ $c = gc4 ] && args=(--config results/pingpong-none-2026-11-28/factor-4.toml)
    target/release/gleaner run "${args[@]}" --timeline /tmp/gcexp/$c-$i.jsonl -- target/release/gleaner workload pingpong --duration 3s > /tmp/gcexp/$c-$i.out 2>/dev/null
  done
done
python3 - <<'PY'
import json,glob,statistics as st
res={}
for c in ['default','gc4']:
    for i in range(1,13):
        rows=[json.loads(l) for l in open(f'/tmp/gcexp/{c}-{i}.jsonl')]
        out=open(f'/tmp/gcexp/{c}-{i}.out').read()
        thr=float(out.split('throughput=')[-1].split()[0])
        mc=[r for r in rows if 'major' in json.dumps(r.get('events',[])).lower()]
        res.setdefault(c,[]).append((thr,len(mc)))
        print(c,i,round(thr/1e3),'k','major changes',len(mc),[round((r.get('characteristics') or {}).get('g_comp_ns',0)/1e3,1) for r in mc])
for c,v in res.items():
    print(c,'median k',round(st.median(x[0] for x in v)/1e3),'runs with a major change',sum(1 for x in v if x[1]))
PY
