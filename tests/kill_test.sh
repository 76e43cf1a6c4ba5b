#!/bin/sh
# Kill test (issue 5, item 1): `tests/kill_test.sh [ITERATIONS] [--seed N] [--kind run|attach|both]`.
# CI runs `tests/kill_test.sh 10`; the acceptance run is `tests/kill_test.sh 100`. See kill_test.py.
set -e
cd "$(dirname "$0")/.."
[ -n "$GLEANER_BIN" ] || cargo build -q -p gleaner
exec python3 tests/kill_test.py "$@"
