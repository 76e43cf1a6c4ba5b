#!/bin/bash
# Interleaved A/B: `gleaner run -- gleaner workload pingpong --duration 3s` under two Gleaner
# binaries, order alternating each round. Prints per run: round, binary, round trips/s, the
# period (1-based) of the first one-vCPU period (or "never"), and the active-vCPU string.
# Usage: ab.sh OLD_BINARY NEW_BINARY ROUNDS > OUT.txt
old=$1; new=$2; rounds=${3:-12}
echo "# $(date -u +%FT%TZ) cpuidle $(cat /sys/devices/system/cpu/cpuidle/current_driver) kernel $(uname -r) load $(cut -d' ' -f1-3 /proc/loadavg)"
one() {
  local tag=$1 bin=$2 r=$3 tl=/tmp/ab-$$-$tag.jsonl
  rm -f $tl
  local t=$($bin run --timeline $tl -- $bin workload pingpong --duration 3s 2>/dev/null | grep -o "throughput=[0-9]*" | cut -d= -f2)
  local s=$(python3 -c "
import json
ls=[json.loads(l) for l in open('$tl')]
s=''.join(str(l['n_active']) for l in ls)
i=s.find('1')
print((i+1) if i>=0 else 'never', s)")
  echo "$r $tag $t $s"
}
for r in $(seq 1 $rounds); do
  if [ $((r % 2)) -eq 1 ]; then one old $old $r; one new $new $r; else one new $new $r; one old $old $r; fi
done
