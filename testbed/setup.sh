#!/usr/bin/env bash
# Installs what the test bed needs on a Debian 12 host, through apt only: QEMU (TCG),
# busybox-static and cpio for the image, matplotlib for the plot, and the musl Rust target
# for the static gleaner build (the glibc static build is the fallback).
set -euo pipefail
if [[ $EUID -ne 0 ]]; then
    echo "testbed/setup.sh: must run as root (apt-get install); try: sudo testbed/setup.sh" >&2
    exit 1
fi
# Waits for another apt run (a fresh VM often has one) rather than failing on its lock.
APT_WAIT=(-o DPkg::Lock::Timeout=600)
apt-get "${APT_WAIT[@]}" update -q >&2
DEBIAN_FRONTEND=noninteractive apt-get "${APT_WAIT[@]}" install -y -q --no-install-recommends \
    qemu-system-x86 busybox-static cpio binutils python3-matplotlib >&2
if command -v rustup >/dev/null; then
    rustup target add x86_64-unknown-linux-musl >&2 || echo "testbed/setup.sh: no musl target; the image build will link glibc statically" >&2
fi
# The driver runs as `python3` from PATH, which need not be the system Python the apt package
# serves (e.g. pyenv): give that one matplotlib too, or the summary has no plot.
if ! python3 -c 'import matplotlib' 2>/dev/null; then
    python3 -m pip install -q matplotlib >&2 \
        || echo "testbed/setup.sh: no matplotlib for $(command -v python3); summaries will have no plot" >&2
fi
