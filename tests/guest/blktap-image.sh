#!/bin/bash
# Add XCP-ng's blktap to a guest image (once, cached): tapdisk, tap-ctl and
# vhd-util of blktap v3.55.5, and the blktap2 kernel driver built for the
# guest's kernel (as DKMS builds ZFS's), so that the datapath runs against
# the real tapdisk. Also what the NBD tests need to read a VDI as Xen
# Orchestra does (tests/integration/nbd_util.py): Debian's nodejs, openssl
# (the test server's TLS certificates) and, in /opt/zfsng-nbd, XO's NBD
# client @vates/nbd-client with its dependencies, at the versions of
# tests/guest/nbd/package-lock.json. Those node_modules are installed on
# the host (`npm ci`, so npm must be there; .ci/run installs it) and copied
# in; the script that drives the client, tests/guest/nbd/read-blocks.mjs,
# is not: the tests run it from /src, so editing it rebuilds nothing.
#
#   blktap-image.sh <image dir made by build-image.sh>
#
# Prints the new image directory (same files: rootfs.img, vmlinuz,
# initrd.img, info). A layer of its own, so that changing it rebuilds in a
# minute or two instead of rebuilding OpenZFS.
#
# The sources (tests/guest/blktap/sources: file, sha256, upstream URL) come
# from ZFSNG_THIRD_PARTY (default: ../shared/third_party beside the
# project), else are fetched from their upstream into the cache; either way
# their sha256 is checked before use. The patches applied to the driver,
# in name order, are the project's own (tests/guest/blktap/*.patch, each
# explained in its header): destroy-retry.patch, device-names.patch.
set -euo pipefail

base=${1:?usage: blktap-image.sh <image dir>}
base=$(cd "$base" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
recipe=$here/blktap
third_party=${ZFSNG_THIRD_PARTY:-$src/../shared/third_party}
start=$SECONDS
log() { echo "[blktap-image +$((SECONDS - start))s] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=lib.sh
. "$here/lib.sh"

[ "$(id -u)" -eq 0 ] || die "must run as root (loop mount, chroot)"

nbd=$here/nbd
hash=$(cat "${BASH_SOURCE[0]}" "$here/lib.sh" "$recipe/sources" "$recipe"/*.patch \
    "$nbd/package.json" "$nbd/package-lock.json" | sha256sum | cut -c1-12)
cache_root=$(dirname "$base")
final="$base-blktap-$hash"

if image_complete "$final"; then
    echo "$final"
    exit 0
fi
one_builder "$final.lock" "$final"

# --- the sources, checked ----------------------------------------------------
downloads=$cache_root/sources
mkdir -p "$downloads"
fetch() {   # url dest
    if command -v curl >/dev/null; then
        curl -fsSL --max-time 600 -o "$2" "$1"
    else
        timeout 600 python3 -c 'import sys, urllib.request
urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$1" "$2"
    fi
}
archives=()
while read -r file sum url; do
    case "$file" in '' | '#'*) continue ;; esac
    path=$third_party/$file
    if [ ! -f "$path" ]; then
        path=$downloads/$file
        if [ ! -f "$path" ]; then
            log "fetching $url"
            fetch "$url" "$path.part" || die "cannot fetch $url"
            mv "$path.part" "$path"
        fi
    fi
    echo "$sum  $path" | sha256sum -c --quiet - >&2 ||
        die "$path: sha256 is not $sum"
    archives+=("$path")
done <"$recipe/sources"
[ ${#archives[@]} -eq 2 ] || die "expected two archives in $recipe/sources"

# --- XO's NBD client: node_modules from the lock file, on the host -----------
# No install scripts: the packages are plain JavaScript, none needs building.
command -v npm >/dev/null || die "npm is needed on the host (apt-get install npm)"
nbd_build=$(mktemp -d "$cache_root/.build-nbd.XXXXXX")
trap 'rm -rf "$nbd_build"' EXIT
cp "$nbd/package.json" "$nbd/package-lock.json" "$nbd_build/"
log "installing @vates/nbd-client (npm ci)"
(cd "$nbd_build" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund) \
    >"$nbd_build/npm.log" 2>&1 || { tail -n 40 "$nbd_build/npm.log" >&2; die "npm ci failed"; }
rm -f "$nbd_build/npm.log"

# --- a copy of the base image, mounted --------------------------------------
work=$(mktemp -d "$cache_root/.build-blktap.XXXXXX")
work_area "$work"
# (work_area's EXIT trap replaces the one above: the client moves under $work)
mv "$nbd_build" "$work/nbd"

log "copying $base"
cp --sparse=always "$base/rootfs.img" "$work/rootfs.img"
cp "$base/vmlinuz" "$base/initrd.img" "$work/"
mkdir "$root"
mnt -o loop "$work/rootfs.img" "$root"
mnt -t proc proc "$root/proc"
mnt -t sysfs sysfs "$root/sys"
mnt -t devpts -o newinstance,ptmxmode=666 devpts "$root/dev/pts"
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
kver=$(sed -n 's/^kernel=//p' "$base/info")
in_root test -d "/lib/modules/$kver/build/" || die "no kernel headers for $kver in $base"

# --- build and install ------------------------------------------------------
log "installing build and run-time dependencies"
in_root apt-get update -q >&2
# nodejs and openssl: the NBD tests (XO's client, the server's certificates).
in_root apt-get install -y -q build-essential autoconf automake libtool pkg-config patch \
    libaio-dev uuid-dev libxen-dev zlib1g-dev libssl-dev libcmocka-dev \
    busybox nodejs openssl >"$work/apt.log" 2>&1 ||
    { tail -n 40 "$work/apt.log" >&2; die "apt-get install failed"; }

mkdir -p "$root/usr/src/blktap" "$root/usr/src/blktap-module"
tar -C "$root/usr/src/blktap" --strip-components=1 -xzf "${archives[0]}"
tar -C "$root/usr/src/blktap-module" --strip-components=1 -xzf "${archives[1]}"
mkdir -p "$root/usr/src/blktap-patches"
cp "$recipe"/*.patch "$root/usr/src/blktap-patches/"

# From the tag archive: version.m4 reads a VERSION file the archive lacks;
# the tree's -Werror trips on gcc 12 warnings (stringop-truncation).
log "building blktap (tapdisk, tap-ctl, vhd-util)"
in_root sh -euc '
    cd /usr/src/blktap
    printf 3.55.5 >VERSION
    sh autogen.sh
    ./configure --prefix=/usr --sysconfdir=/etc --libexecdir=/usr/libexec \
        CFLAGS="-g -O2 -Wno-error"
    make -j"$(nproc)"
    make install
    ldconfig' >"$work/blktap.log" 2>&1 ||
    { tail -n 40 "$work/blktap.log" >&2; die "blktap build failed"; }

log "building the blktap2 driver for $kver"
in_root sh -euc '
    cd /usr/src/blktap-module
    for p in /usr/src/blktap-patches/*.patch; do patch -p1 <"$p"; done
    dir=/usr/src/blktap-module/drivers/block/blktap
    make -C "/lib/modules/$1/build" M="$dir" CONFIG_BLK_DEV_TAP=m \
        ccflags-y=-I/usr/src/blktap-module/include modules
    install -D -m 644 "$dir/blktap.ko" "/lib/modules/$1/extra/blktap.ko"
    depmod "$1"' sh "$kver" >"$work/module.log" 2>&1 ||
    { tail -n 40 "$work/module.log" >&2; die "driver build failed"; }

for f in /usr/sbin/tap-ctl /usr/libexec/tapdisk /usr/bin/vhd-util \
    "/lib/modules/$kver/extra/blktap.ko"; do
    [ -e "$root$f" ] || die "$f was not installed"
done

log "installing @vates/nbd-client in /opt/zfsng-nbd"
mkdir -p "$root/opt/zfsng-nbd"
cp -R "$work/nbd/package.json" "$work/nbd/package-lock.json" "$work/nbd/node_modules" \
    "$root/opt/zfsng-nbd/"
chown -R 0:0 "$root/opt/zfsng-nbd"
# The guest's node must load the client (Debian's node is older than the host's).
in_root sh -c 'cd /opt/zfsng-nbd && node --input-type=module \
    -e "import { NbdTcpClient } from \"@vates/nbd-client\"; new NbdTcpClient({ address: \"::1\" })"' \
    >&2 || die "the guest's node cannot load @vates/nbd-client"
node_version=$(in_root node --version)
nbd_client=$(sed -n 's/^ *"@vates\/nbd-client": "\(.*\)"$/\1/p' "$nbd/package.json")

rm -rf "$root/usr/src/blktap" "$root/usr/src/blktap-module" \
    "$root/usr/src/blktap-patches" "$root/usr/sbin/policy-rc.d"
in_root apt-get clean
rm -rf "$root"/var/lib/apt/lists/*
unmount_all

{
    cat "$base/info"
    echo "blktap=3.55.5 blktap_module=7cbdcb0 blktap_recipe=$hash"
    echo "node=$node_version nbd_client=$nbd_client"
    echo "blktap_seconds=$((SECONDS - start))"
} >"$work/info"
rm -f "$work"/*.log
rmdir "$root"
[ ! -e "$final" ] || rm -rf "$final"
mv -T "$work" "$final"
trap - EXIT
log "done: $final"

# Older blktap layers of this base are dead weight.
for old in "$base-blktap-"*; do
    if [ ! -d "$old" ] || [ "$old" = "$final" ]; then continue; fi
    log "removing outdated $old"
    rm -rf "$old"
done
echo "$final"
