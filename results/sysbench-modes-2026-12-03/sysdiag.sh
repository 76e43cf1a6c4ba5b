#!/bin/bash
# Interleaved sysbench threads: bare vs gleaner run in several modes. Usage: sysdiag.sh ROUNDS OUT
G=${GLEANER:-target/release/gleaner}  # run from the repository root
N=${1:-8}; OUT=${2:-rounds.tsv}
SB="sysbench threads --threads=8 --thread-locks=2 --time=3 run"
: > $OUT
for r in $(seq 1 $N); do
  for cfg in bare observe full consolidation retention; do
    case $cfg in
      bare) cmd="$SB";;
      observe) cmd="$G run --observe -- $SB";;
      full) cmd="$G run -- $SB";;
      consolidation) cmd="$G run --mode consolidation -- $SB";;
      retention) cmd="$G run --mode retention -- $SB";;
    esac
    ev=$($cmd 2>/dev/null | awk '/total time:/{t=$3+0} /total number of events:/{e=$5} END{printf "%.2f", e/t}')
    echo -e "$r\t$cfg\t$ev" | tee -a $OUT
  done
done
python3 - "$OUT" <<'PY'
import sys,statistics as st,collections
d=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r,c,v=l.split('\t'); d[int(r)][c]=float(v)
for c in ['observe','full','consolidation','retention']:
    rs=[d[r][c]/d[r]['bare'] for r in d if c in d[r] and 'bare' in d[r]]
    print(c, 'x%.3f [%.3f, %.3f] n=%d'%(st.median(rs),min(rs),max(rs),len(rs)))
PY
