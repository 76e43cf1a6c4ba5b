#!/bin/bash
# Usage: bash cpuset-vs-taskset.sh [N] (root; run from the repository root). Prints cpuset, taskset, ratio per pair.
# ping-pong pinned by a v1 cpuset cgroup (cpus=0) vs by taskset -c 0, interleaved.
set -u
cg=/sys/fs/cgroup/cpuset/gleaner-diag-$$
mkdir $cg || exit 1
trap 'rmdir $cg' EXIT
echo 0 > $cg/cpuset.cpus; echo 0 > $cg/cpuset.mems
for i in $(seq 1 ${1:-8}); do
  a=$(sh -c "echo \$\$ > $cg/tasks; exec target/release/gleaner workload pingpong --duration 3s" 2>/dev/null | grep -o "throughput=[0-9]*" | cut -d= -f2)
  b=$(taskset -c 0 target/release/gleaner workload pingpong --duration 3s 2>/dev/null | grep -o "throughput=[0-9]*" | cut -d= -f2)
  echo "$a $b $(python3 -c "print(round($a/$b,3))")"
done
