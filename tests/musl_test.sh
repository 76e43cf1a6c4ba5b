#!/bin/sh
# gleaner-sys's unit tests built for musl (issue 17, item 14): the test
# bed's guest runs a static musl gleaner, and musl stubs some libc wrappers that glibc has (e.g.
# sched_setscheduler always fails with ENOSYS), so code that passes on glibc can fail there.
# Needs the musl Rust target (`rustup target add x86_64-unknown-linux-musl`); without it this
# says so and exits 0, so that a green run shows the skip.
set -e
cd "$(dirname "$0")/.."
if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
    echo "musl test skipped: no x86_64-unknown-linux-musl target (rustup target add x86_64-unknown-linux-musl)"
    exit 0
fi
# gleaner-sys only: it holds every system-call wrapper (the sched-policy one musl broke), and
# gleaner-linux now links libbpf, whose C sources would need a musl C toolchain and a musl
# libelf to build for this target.
exec cargo test -q -p gleaner-sys --lib --target x86_64-unknown-linux-musl
