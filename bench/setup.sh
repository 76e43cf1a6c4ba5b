#!/usr/bin/env bash
# Installs the third-party tools the Gleaner benchmark harness drives:
# sysbench, stress-ng, pigz, MariaDB server/client (for sysbench OLTP),
# util-linux (taskset), perf (linux-perf, exact idle-entry counts) and matplotlib for the plots.
#
# Usage: sudo bench/setup.sh        (PYTHON=/path/to/python3 to pick the interpreter
#                                    that will run bench/run.py; default: python3)
set -euo pipefail

PYTHON="${PYTHON:-python3}"

if [ "$(id -u)" -ne 0 ]; then
    echo "bench/setup.sh: must run as root (apt-get install); try: sudo bench/setup.sh" >&2
    exit 1
fi

# Debian's mariadb-server postinst starts the packaged service; the harness runs its own
# private server, so keep the system one from starting when no policy-rc.d is in place.
# A temporary policy-rc.d is removed again on every exit path.
POLICY=/usr/sbin/policy-rc.d
CREATED_POLICY=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$POLICY"
    chmod +x "$POLICY"
    CREATED_POLICY=1
fi
cleanup() {
    if [ "$CREATED_POLICY" -eq 1 ]; then rm -f "$POLICY"; fi
}
trap cleanup EXIT

echo "bench/setup.sh: apt-get update" >&2
apt-get update -q >&2
# Idle entries are counted by gleaner itself (perf_event_open on the power:cpu_idle
# tracepoint; bench/harness/idle.py), so the perf tool is not needed.
PACKAGES=(sysbench stress-ng pigz mariadb-server mariadb-client util-linux)
echo "bench/setup.sh: installing ${PACKAGES[*]}" >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >&2

if ! "$PYTHON" -c 'import matplotlib' 2>/dev/null; then
    echo "bench/setup.sh: installing matplotlib for $PYTHON" >&2
    if ! "$PYTHON" -m pip install -q matplotlib >&2; then
        # Externally managed system Python (PEP 668): fall back to the distro package.
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-matplotlib >&2
    fi
fi

"$PYTHON" -c 'import matplotlib' || {
    echo "bench/setup.sh: matplotlib still not importable by $PYTHON; install it for that interpreter" >&2
    exit 1
}
echo "bench/setup.sh: done" >&2
