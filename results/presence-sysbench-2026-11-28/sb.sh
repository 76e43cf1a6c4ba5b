#!/bin/bash
out=$(sysbench threads --threads=8 --thread-locks=2 --time=3 --rand-seed=1 run)
n=$(echo "$out" | awk '/total number of events/ {print $5}')
t=$(echo "$out" | awk '/total time:/ {gsub("s","",$3); print $3}')
echo "throughput=$(python3 -c "print($n/$t)")"
