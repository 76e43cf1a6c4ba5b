#!/usr/bin/env bash
# Smoke test of the test bed (< 3 min): one 2-vCPU guest boots the image, runs
# `gleaner run --mode retention -- gleaner workload pipeline --duration 1s --json`, prints the
# JSON and powers off. Under gleaner run, not bare, so that an image whose gleaner cannot
# manage a workload (e.g. cannot start its retention threads) fails here.
# Exit 0 on success. Builds the image first if testbed/build/ has none.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ ! -f "$HERE/build/manifest.json" ]]; then
    "$HERE/build-image.sh" >/dev/null
fi
exec timeout --signal=TERM --kill-after=10 170 python3 "$HERE/testbed.py" smoke
