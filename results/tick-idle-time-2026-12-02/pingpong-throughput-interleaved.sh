#!/bin/bash
for r in $(seq 1 12); do
  for c in bare 0b82bc2 0ee745e; do
    G=/tmp/gleaner-0ee745e
    case $c in
      bare) out=$($G workload pingpong --duration 5 2>&1);;
      *) out=$(/tmp/gleaner-$c run --observe --sampler bpf -- $G workload pingpong --duration 5 2>&1);;
    esac
    echo "$r $c $(echo "$out" | grep -o 'throughput=[0-9.]*')"
  done
done
