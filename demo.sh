#!/usr/bin/env bash
# One command on a fresh machine: build Gleaner, measure this VM's wake-up costs, and run a
# bundled phase-changing workload under Gleaner next to a plain run of the same workload.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v cargo >/dev/null; then
    echo "demo.sh: cargo not found: install Rust from your distribution (apt-get install cargo) or rustup" >&2
    exit 1
fi
# The BPF sampler's build (crates/gleaner-linux/build.rs) needs clang, and libbpf-sys needs
# make, pkg-config and the libelf and zlib headers.
if ! command -v clang >/dev/null || ! command -v make >/dev/null || ! command -v pkg-config >/dev/null \
    || [ ! -e /usr/include/libelf.h ] || [ ! -e /usr/include/zlib.h ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang libelf-dev zlib1g-dev pkg-config make
    else
        echo "demo.sh: the build needs clang, make, pkg-config, libelf and zlib headers: apt-get install clang libelf-dev zlib1g-dev pkg-config make" >&2
        exit 1
    fi
fi
cargo build --release -p gleaner
G=target/release/gleaner
echo "== wake-up latency on this machine (the paper's Table 2) =="
"$G" probe --quick
echo
echo "== fine-grained pipeline, then coarse, without Gleaner =="
"$G" workload pipeline --phases fine:4s,coarse:4s
echo
echo "== the same under Gleaner (timeline in /tmp/gleaner-demo.jsonl) =="
if [ "$(id -u)" -ne 0 ]; then
    echo "(not root: Gleaner uses the thread-affinity back end)"
fi
"$G" run --timeline /tmp/gleaner-demo.jsonl -- "$G" workload pipeline --phases fine:4s,coarse:4s
echo
echo "decisions made:"
grep -o '"reason":"[^"]*"' /tmp/gleaner-demo.jsonl | sed 's/"reason":/  /' | head -20 || echo "  none"
