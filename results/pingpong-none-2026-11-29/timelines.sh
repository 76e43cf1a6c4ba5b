#!/bin/bash
# Usage: bash results/pingpong-none-2026-11-29/timelines.sh N PREFIX  (N runs of a 3 s ping-pong under `gleaner run`, each timeline to PREFIX<i>.jsonl;
# prints per run: round trips/s, when it first packed, the largest runnable-wait fraction and the steal fractions of the periods before, and how many major changes)
cd "$(dirname "$0")/../.."
N=${1:-8}; P=${2:-/tmp/diag/tlx}
for i in $(seq 1 $N); do target/release/gleaner run --timeline $P$i.jsonl -- target/release/gleaner workload pingpong --duration 3s > $P$i.out 2>&1; done
for i in $(seq 1 $N); do python3 - $P $i <<'PY'
import json,sys
P,i=sys.argv[1],sys.argv[2]
rows=[json.loads(l) for l in open(f'{P}{i}.jsonl')]
first=None; rw=[]; st=[]
for r in rows:
    c=r['characteristics']
    if first is None:
        rw.append(c['runnable_wait_fraction']); st.append(c['steal_fraction'])
    if first is None and any(e['kind']=='deactivate' for e in r['events']): first=r['t_s']
mc=sum(1 for r in rows for e in r['events'] if e['kind']=='major-change')
rt=[l for l in open(f'{P}{i}.out') if 'round_trips/s' in l]
print(i, rt[0].split('throughput=')[1].split()[0] if rt else '?', 'pack', first, 'maxrw', round(max(rw),2), 'steal', [round(x,2) for x in st][:8], 'mc', mc)
PY
done
