#!/usr/bin/env bash
# The project's test command: every Rust test (unit, integration, property-based fuzzing), the
# benchmark harness's and test bed's Python tests, and a short kill test (SIGKILL of gleaner at
# random moments; 10 iterations). Tests that need root or a cgroup cpuset hierarchy print why
# they skip when those are missing.
set -euo pipefail
cd "$(dirname "$0")"
cargo test --workspace
python3 -m pytest -q bench/tests
python3 -m unittest -q testbed/test_testbed.py
cargo build -q -p gleaner
if [ "$(id -u)" -eq 0 ] && [ -e /sys/fs/cgroup/cpuset/cpuset.cpus ]; then
    GLEANER_BIN="$PWD/target/debug/gleaner" tests/kill_test.sh 10
else
    echo "kill test skipped: needs root and a cgroup v1 cpuset hierarchy"
fi
