#!/bin/bash
# ping-pong under gleaner run, Gleaner stopped for 0.2 s right after its start (a host stall)
G=$1; T=/tmp/stall-tl.jsonl; rm -f $T
$G run --timeline $T -- target/release/gleaner workload pingpong --duration 3s > /tmp/stall-out.txt 2>/dev/null &
pid=$!
sleep ${2:-0.06}; kill -STOP $pid; sleep 0.2; kill -CONT $pid
wait $pid
python3 -c "
import json
L=[json.loads(l) for l in open('$T')]
print('packed', next((round(p['t_s'],2) for p in L if p.get('active') in ('0','1')), None), 'periods', [round(p['t_s'],2) for p in L[:7]])
"
