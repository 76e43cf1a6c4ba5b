#!/usr/bin/env bash
# Builds the test bed's guest image: a pinned Debian kernel plus an initramfs holding
# busybox-static, a static (musl) gleaner binary (which carries the bundled workloads)
# and the guest agent `init`.
#
# Why a script: the image must be rebuilt the same way on any Debian 12 host, fetched only
# through apt, and identified by a checksum that the experiment results then record.
# Reproducible: packages are pinned to exact versions, file times are fixed to
# SOURCE_DATE_EPOCH, owners to root, cpio entries are sorted and gzip stores no name/time.
#
# Output (testbed/build/): vmlinuz, initramfs.cpio.gz, manifest.json, SHA256SUMS.
# Usage: testbed/build-image.sh [--gleaner PATH]   (default: cargo build for musl here)
set -euo pipefail

# Pinned inputs. Debian keeps the current point release's versions in its mirror; when a
# version disappears, `apt-get download` fails naming it and these two lines are the fix.
KERNEL_ABI="6.1.0-50-amd64"
KERNEL_DEB_VERSION="6.1.176-1"
BUSYBOX_DEB_VERSION="1:1.35.0-4+deb12u1+b1"
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1700000000}"
export SOURCE_DATE_EPOCH

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
OUT="$HERE/build"
GLEANER_BIN=""

die() { echo "build-image.sh: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --gleaner) [[ $# -ge 2 ]] || die "--gleaner needs a path"; GLEANER_BIN="$2"; shift 2 ;;
        -h|--help) sed -n 2,12p "$0"; exit 0 ;;
        *) die "unknown argument '$1'; usage: build-image.sh [--gleaner PATH]" ;;
    esac
done

for tool in apt-get dpkg-deb cpio gzip sha256sum strip; do
    command -v "$tool" >/dev/null || die "'$tool' not found; run testbed/setup.sh first"
done

WORK="$(mktemp -d /tmp/gleaner-testbed-build.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM HUP  # exit, so the EXIT trap removes the work dir

# 1. Debian packages, through the package manager only.
mkdir -p "$WORK/debs"
# apt drops privileges to _apt for downloads; let it write there (else it warns and runs as root).
chmod 0755 "$WORK"
chown _apt "$WORK/debs" 2>/dev/null || true
(
    cd "$WORK/debs"
    apt-get download -q "linux-image-${KERNEL_ABI}=${KERNEL_DEB_VERSION}" \
        "busybox-static=${BUSYBOX_DEB_VERSION}" >&2
) || die "apt-get download of the pinned packages failed; run 'apt-get update', or update KERNEL_DEB_VERSION / BUSYBOX_DEB_VERSION in $0"

KERNEL_DEB="$(ls "$WORK"/debs/linux-image-*.deb)"
BUSYBOX_DEB="$(ls "$WORK"/debs/busybox-static_*.deb)"
mkdir -p "$WORK/kernel" "$WORK/busybox"
dpkg-deb --fsys-tarfile "$KERNEL_DEB" | tar -x -C "$WORK/kernel" "./boot/vmlinuz-${KERNEL_ABI}"
dpkg-deb --fsys-tarfile "$BUSYBOX_DEB" | tar -x -C "$WORK/busybox" ./bin/busybox

# 2. The static gleaner binary: musl first; if that does not compile, glibc linked statically
#    (-C target-feature=+crt-static), which needs no libraries in the guest either.
GLEANER_BUILD="given"
if [[ -z "$GLEANER_BIN" ]]; then
    if rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl \
        && (cd "$REPO" && cargo build -q --release -p gleaner --target x86_64-unknown-linux-musl) \
            > "$WORK/musl-build.log" 2>&1; then
        GLEANER_BIN="$REPO/target/x86_64-unknown-linux-musl/release/gleaner"
        GLEANER_BUILD="musl"
    else
        first_error="$(grep -m1 -A1 '^error' "$WORK/musl-build.log" 2>/dev/null | tr -s ' \n' ' ')"
        echo "build-image.sh: musl build failed (${first_error:-no musl target}); building gleaner with static glibc" >&2
        (cd "$REPO" && RUSTFLAGS="-C target-feature=+crt-static" \
            cargo build -q --release -p gleaner --target x86_64-unknown-linux-gnu) >&2 \
            || die "cargo build of a static gleaner failed (see above)"
        GLEANER_BIN="$REPO/target/x86_64-unknown-linux-gnu/release/gleaner"
        GLEANER_BUILD="glibc-crt-static"
    fi
fi
[[ -x "$GLEANER_BIN" ]] || die "gleaner binary '$GLEANER_BIN' is missing or not executable"
if ldd "$GLEANER_BIN" 2>&1 | grep -q '=>'; then
    die "'$GLEANER_BIN' is dynamically linked; the guest has no libc, pass a static build"
fi

# 3. The initramfs tree.
ROOT="$WORK/root"
mkdir -p "$ROOT"/{bin,sbin,dev,proc,sys,run,tmp,etc,usr/bin,usr/sbin}
cp "$WORK/busybox/bin/busybox" "$ROOT/bin/busybox"
strip -o "$ROOT/bin/gleaner" "$GLEANER_BIN"
install -m 0755 "$HERE/guest/init" "$ROOT/init"
# Applet links made at build time so the tree (and its checksum) does not depend on boot.
for applet in $("$ROOT/bin/busybox" --list-full); do
    [[ -e "$ROOT/$applet" ]] || ln -s /bin/busybox "$ROOT/$applet"
done
find "$ROOT" -exec touch -h -d "@${SOURCE_DATE_EPOCH}" {} +

mkdir -p "$OUT"
(cd "$ROOT" && find . -mindepth 1 | LC_ALL=C sort \
    | cpio --quiet -o -H newc -R 0:0 --reproducible) | gzip -9 -n > "$WORK/initramfs.cpio.gz"
cp "$WORK/kernel/boot/vmlinuz-${KERNEL_ABI}" "$WORK/vmlinuz"

# 4. Publish atomically-ish: everything is written in $WORK first, then moved.
mv "$WORK/vmlinuz" "$OUT/vmlinuz"
mv "$WORK/initramfs.cpio.gz" "$OUT/initramfs.cpio.gz"
(cd "$OUT" && sha256sum vmlinuz initramfs.cpio.gz > SHA256SUMS)
IMAGE_SHA="$(cd "$OUT" && sha256sum SHA256SUMS | cut -d' ' -f1)"
GIT_COMMIT="$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)"
# Uncommitted changes to the sources that go into gleaner make the commit an incomplete name.
if [[ -n "$(git -C "$REPO" status --porcelain -- crates Cargo.toml Cargo.lock 2>/dev/null)" ]]; then
    GIT_DIRTY=true
else
    GIT_DIRTY=false
fi
GLEANER_SHA="$(sha256sum "$ROOT/bin/gleaner" | cut -d' ' -f1)"
cat > "$OUT/manifest.json" <<EOF
{
  "image_sha256": "$IMAGE_SHA",
  "kernel_package": "linux-image-${KERNEL_ABI}=${KERNEL_DEB_VERSION}",
  "busybox_package": "busybox-static=${BUSYBOX_DEB_VERSION}",
  "gleaner_sha256": "$GLEANER_SHA",
  "gleaner_build": "$GLEANER_BUILD",
  "git_commit": "$GIT_COMMIT",
  "git_dirty": $GIT_DIRTY,
  "source_date_epoch": $SOURCE_DATE_EPOCH,
  "files": {
$(cd "$OUT" && awk '{printf "    \"%s\": \"%s\"%s\n", $2, $1, (NR==2 ? "" : ",")}' SHA256SUMS)
  }
}
EOF
echo "build-image.sh: image $IMAGE_SHA ($(du -h "$OUT/initramfs.cpio.gz" | cut -f1) initramfs) in $OUT" >&2
echo "$IMAGE_SHA"
