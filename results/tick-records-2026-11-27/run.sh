#!/usr/bin/env bash
# The BPF sampler's cost on a two-vCPU ping-pong where no cpuidle driver counts idle, before
# and after idle came from the kernel's tick records (edd42a2), against the bare run.
# This guest has a driver (haltpoll); hide-cpuidle.sh runs each command in a private mount
# namespace where no CPU has a cpuidle directory, so Gleaner takes the path of a guest
# without one (the kernel, and the cpu_idle tracepoint's firing, are this guest's).
#   OLD=/path/to/gleaner-built-at-944e387 bash run.sh ROUNDS OUT.json
# Builds nothing: target/release/gleaner is the commit under test (`cargo build --release`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rounds=${1:-16}
out=${2:-$here/pingpong.json}
old=${OLD:?OLD=path of a gleaner built at 944e387}
hide=$here/hide-cpuidle.sh
new=$root/target/release/gleaner
echo "commit $(git -C "$root" rev-parse --short HEAD); old $old; driver $(cat /sys/devices/system/cpu/cpuidle/current_driver); kernel $(uname -r); load before $(cut -d' ' -f1-3 /proc/loadavg)"
OUT=$out python3 "$root/results/presence-fine-pipeline-2026-11-27/tp.py" "$rounds" \
    "$new workload pingpong --duration 3" \
    "bare=CMD:$hide" \
    "old=CMD:$hide $old run --observe --" \
    "new=CMD:$hide $new run --observe --" \
    "ctl=CMD:$hide" \
    "old-driver=CMD:$old run --observe --" \
    "new-driver=CMD:$new run --observe --"
