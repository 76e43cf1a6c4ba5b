#!/usr/bin/env bash
# The project's test command: every Rust test (unit, integration, property-based fuzzing), the
# benchmark harness's and test bed's Python tests, and a short kill test (SIGKILL of gleaner at
# random moments; 10 iterations). Every suite runs even when an earlier one fails, so one
# failure cannot hide another; the script exits non-zero if any failed. Tests that cannot run
# here (no root, no cpuset hierarchy, no cpuidle poll state) are listed at the end.
set -uo pipefail
cd "$(dirname "$0")"
failed=()
suite() {
    local name=$1
    shift
    echo "== $name: $*"
    "$@" || failed+=("$name")
}

skip_log=target/tmp/skipped-tests.log
mkdir -p target/tmp && : >"$skip_log"
suite "rustfmt" cargo fmt --all --check
suite "clippy (warnings are errors; unwrap/expect/panic denied outside tests)" cargo clippy --workspace --all-targets -- -D warnings
suite "cargo test" cargo test --workspace --no-fail-fast
# The test bed's guest runs a static musl gleaner; musl stubs some libc calls glibc has.
if rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
    suite "gleaner-sys tests for musl" tests/musl_test.sh
else
    echo "musl tests skipped: no x86_64-unknown-linux-musl target (rustup target add x86_64-unknown-linux-musl)" | tee -a "$skip_log"
fi
suite "Python tests (pytest: bench harness, test bed, kill-test self-tests)" python3 -m pytest -q bench/tests testbed/test_testbed.py tests/test_kill_test.py
if [ "$(id -u)" -eq 0 ] && [ -e /sys/fs/cgroup/cpuset/cpuset.cpus ]; then
    suite "build for the kill test" cargo build -q -p gleaner
    suite "kill test" env GLEANER_BIN="$PWD/target/debug/gleaner" tests/kill_test.sh 10
else
    echo "kill test skipped: needs root and a cgroup v1 cpuset hierarchy" | tee -a "$skip_log"
fi

echo
driver=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo unknown)
echo "machine: cpuidle driver $driver, kernel $(uname -r), $(nproc) CPUs, uid $(id -u)"
if [ -s "$skip_log" ]; then
    echo "skipped ($(sort -u "$skip_log" | wc -l)), counted as passed by cargo:"
    sort -u "$skip_log" | sed 's/^/  - /'
else
    echo "skipped: none"
fi
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED suites: ${failed[*]}"
    exit 1
fi
echo "all suites passed"
