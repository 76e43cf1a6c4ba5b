#!/bin/sh
# Installs the Debian package on this machine, checks what an operator gets, purges it, and
# checks that nothing is left (issue 15: "installing the .deb" as an operator would).
# Needs root, cargo-deb (`cargo install cargo-deb`) and a machine where no gleaner package is
# installed; the textfile directory that postinst creates is removed again if it was not there.
#
#   tests/deb_install.sh
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "deb_install: needs root (dpkg -i)" >&2; exit 2; }
command -v cargo-deb >/dev/null || { echo "deb_install: needs cargo-deb: cargo install cargo-deb" >&2; exit 2; }
if dpkg -s gleaner >/dev/null 2>&1; then
    echo "deb_install: a gleaner package is installed already; remove it first (dpkg --purge gleaner)" >&2
    exit 2
fi
textfile_dir=/var/lib/prometheus/node-exporter
had_textfile_dir=0
[ -d "$textfile_dir" ] && had_textfile_dir=1
cleanup() {
    dpkg --purge gleaner >/dev/null 2>&1 || true
    if [ "$had_textfile_dir" -eq 0 ] && [ -d "$textfile_dir" ]; then rmdir "$textfile_dir" 2>/dev/null || true; fi
}
trap cleanup EXIT INT TERM
fail() { echo "FAIL: $*"; exit 1; }

make -s -C packaging deb >/dev/null
deb=$(ls -t target/debian/gleaner_*.deb | head -1)
echo "package: $deb"
dpkg -i "$deb" >/dev/null
echo "installed: $(gleaner --version)"
for f in /usr/bin/gleaner /usr/lib/systemd/system/gleaner.service /etc/gleaner/gleaner.toml \
         /usr/share/doc/gleaner/OPERATING.md /usr/share/doc/gleaner/grafana-dashboard.json "$textfile_dir"; do
    [ -e "$f" ] || fail "$f is missing after install"
done
man -w gleaner-daemon >/dev/null 2>&1 || fail "man gleaner-daemon is missing"
if command -v systemd-analyze >/dev/null; then
    out=$(systemd-analyze verify /usr/lib/systemd/system/gleaner.service 2>&1) || fail "systemd-analyze verify: $out"
    [ -z "$out" ] || fail "systemd-analyze verify: $out"
    echo "unit: systemd-analyze verify clean"
fi
gleaner daemon --check --config /etc/gleaner/gleaner.toml >/dev/null || fail "the shipped config does not pass daemon --check"
echo "config: the shipped /etc/gleaner/gleaner.toml passes daemon --check"
dpkg --purge gleaner >/dev/null
for f in /usr/bin/gleaner /usr/lib/systemd/system/gleaner.service /etc/gleaner /usr/share/doc/gleaner; do
    [ ! -e "$f" ] || fail "$f is left after purge"
done
echo "purged: binary, unit, config and docs are gone"
echo "1 passed, 0 failed"
