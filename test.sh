#!/usr/bin/env bash
# The project's test command: every Rust test (unit, integration, property-based fuzzing) and
# the benchmark harness's Python tests. Tests that need root or a cgroup cpuset hierarchy
# print why they skip when those are missing.
set -euo pipefail
cd "$(dirname "$0")"
cargo test --workspace
python3 -m pytest -q bench/tests
