#!/bin/sh
# Soak test (issue 5, item 5): `tests/soak.sh MINUTES [--out FILE]`; the acceptance run is
# `tests/soak.sh 30`. Not for CI. See soak.py for what is measured.
set -e
cd "$(dirname "$0")/.."
[ -n "$GLEANER_BIN" ] || cargo build -q -p gleaner
exec python3 tests/soak.py "$@"
