#!/usr/bin/env bash
# Smoke test of the test bed (< 2 min): one 2-vCPU guest boots the image, runs
# `gleaner workload pipeline --duration 1s --json`, prints the JSON and powers off.
# Exit 0 on success. Builds the image first if testbed/build/ has none.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ ! -f "$HERE/build/manifest.json" ]]; then
    "$HERE/build-image.sh" >/dev/null
fi
exec timeout --signal=TERM --kill-after=10 110 python3 "$HERE/testbed.py" smoke
