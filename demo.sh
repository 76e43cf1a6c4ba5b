#!/usr/bin/env bash
# One command on a fresh machine: build Gleaner, measure this VM's wake-up costs, then run two
# bundled workloads without and with Gleaner, side by side, with what Gleaner measured and
# why it acted or did not. Run it as root on a quiet machine (see README "Quick start").
set -euo pipefail
cd "$(dirname "$0")"

need=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
have=$(rustc --version 2>/dev/null | awk '{print $2}' || true)
if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    echo "demo.sh: Rust >= $need is needed (found: ${have:-none}); install it with rustup (https://rustup.rs): Debian's cargo package is too old for this Cargo.lock" >&2
    exit 1
fi
if [ ! -x target/release/gleaner ]; then
    echo "building the release binary (the first build compiles every dependency: several minutes on 2 vCPUs)"
fi
cargo build --release -p gleaner
G=target/release/gleaner
work=$(mktemp -d "${TMPDIR:-/tmp}/gleaner-demo.XXXXXX")
trap 'rm -rf "$work"' EXIT
load=$(cut -d' ' -f1 /proc/loadavg)
echo "machine: $(nproc) vCPUs, cpuidle driver $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo unknown), kernel $(uname -r), load $load"
if [ "$(id -u)" -ne 0 ]; then
    echo "(not root: Gleaner confines the workload by thread affinity, and cannot use PM QoS polling)"
fi

echo
echo "== 1. wake-up latency on this machine (the paper's Table 2) =="
"$G" probe --quick

# throughput WORKLOAD_OUTPUT: the workload's own throughput figure.
throughput() { sed -n 's/.*throughput=\([0-9.]*\).*/\1/p' "$1" | tail -1; }

# compare NAME UNIT ARGS...: the workload plain, then under Gleaner, then both figures.
compare() {
    local name=$1 unit=$2
    shift 2
    echo
    echo "== $name: without Gleaner =="
    "$G" workload "$@" | tee "$work/plain.out"
    echo "== $name: under Gleaner (its decisions and the reasons follow the workload's line) =="
    "$G" run --timeline "$work/$name.jsonl" -- "$G" workload "$@" | tee "$work/gleaner.out"
    local plain gl
    plain=$(throughput "$work/plain.out")
    gl=$(throughput "$work/gleaner.out")
    awk -v n="$name" -v u="$unit" -v a="$plain" -v b="$gl" \
        'BEGIN { printf "== %s: %.0f %s without, %.0f %s with Gleaner: x%.2f ==\n", n, a, u, b, u, (a > 0 ? b / a : 0) }'
}

compare pingpong "round trips/s" pingpong --duration 4s
compare pipeline "items/s" pipeline --phases fine:4s,coarse:4s
echo
echo "One run each: for figures you can rely on, repeat interleaved (python3 bench/run.py daemon)."
