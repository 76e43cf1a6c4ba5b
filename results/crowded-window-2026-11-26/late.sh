#!/bin/bash
# N runs of `gleaner run --timeline` on a 3 s ping-pong; keeps each timeline in ${TL:-/tmp/late-tl}/
G=${GLEANER:-target/release/gleaner}; n=${1:-20}; mkdir -p ${TL:-/tmp/late-tl}; rm -f ${TL:-/tmp/late-tl}/*
for r in $(seq 1 $n); do
  t=$($G run --timeline ${TL:-/tmp/late-tl}/$r.jsonl -- $G workload pingpong --duration 3s 2>/dev/null | grep -o "throughput=[0-9]*" | cut -d= -f2)
  s=$(python3 -c "
import json
ls=[json.loads(l) for l in open('${TL:-/tmp/late-tl}/$r.jsonl')]
s=''.join(str(l['n_active']) for l in ls)
i=s.find('1')
print((i+1) if i>=0 else 'never', s)")
  echo "$r $t $s"
done
