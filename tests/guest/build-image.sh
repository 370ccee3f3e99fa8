#!/bin/bash
# Build (once, cached) a Debian bookworm guest image with real OpenZFS for the
# "real ZFS" test layer: no ZFS module can load on the CI host, but a QEMU TCG
# guest can run one (TESTING.md).
#
#   build-image.sh <2.1|2.3>
#
#   2.1: bookworm contrib zfs-dkms/zfsutils-linux (XCP-ng 8.3 ships 2.1.x)
#   2.3: the same from bookworm-backports contrib
#
# Prints the image directory on stdout: rootfs.img (raw ext4), vmlinuz,
# initrd.img, info. Progress goes to stderr.
#
# Environment:
#   ZFSNG_GUEST_CACHE    cache root (default /var/cache/zfs-ng-guest)
#   ZFSNG_DEBIAN_MIRROR  Debian mirror URL (default: the host's apt config;
#                        project rule: no registry host name in our files)
set -euo pipefail

ver=${1:-}
case "$ver" in
    2.1 | 2.3) ;;
    *) echo "usage: $0 <2.1|2.3>" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
start=$SECONDS
log() { echo "[build-image $ver +$((SECONDS - start))s] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=lib.sh
. "$here/lib.sh"

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot, mounts)"

# The cache key: everything that defines the image. run.sh is not part of it:
# changing how the guest is booted needs no rebuild.
hash=$( { cat "$here/build-image.sh" "$here/lib.sh" "$here/zfsng-guest-init"; echo "zfs=$ver"; } |
    sha256sum | cut -c1-12)
cache_root=${ZFSNG_GUEST_CACHE:-/var/cache/zfs-ng-guest}
final="$cache_root/zfs-$ver-$hash"

if image_complete "$final"; then
    echo "$final"
    exit 0
fi

# --- host prerequisites (CI starts on a fresh machine) ----------------------
need=()
for c in qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils \
    debootstrap:debootstrap mke2fs:e2fsprogs flock:util-linux; do
    command -v "${c%%:*}" >/dev/null 2>&1 || need+=("${c#*:}")
done
mkdir -p "$cache_root"
if [ ${#need[@]} -gt 0 ]; then
    # make check builds both versions at once on a fresh machine: one apt
    # at a time (apt refuses a second one outright), the second finding
    # the packages there
    exec 8>"$cache_root/.host-packages.lock"
    flock 8
    if ! command -v qemu-system-x86_64 >/dev/null 2>&1 ||
        ! command -v qemu-img >/dev/null 2>&1 ||
        ! command -v debootstrap >/dev/null 2>&1; then
        log "installing host packages: ${need[*]}"
        apt-get update >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-system-x86 \
            qemu-utils debootstrap e2fsprogs >&2
    fi
    exec 8>&-
fi

# --- one builder per image: concurrent callers wait, then reuse ------------
one_builder "$cache_root/zfs-$ver-$hash.lock" "$final"

# --- the Debian mirror: from the host's apt configuration ------------------
# deb822 stanzas (*.sources) whose Suites list "bookworm", or one-line
# sources.list "deb" entries for bookworm.
find_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        awk '
            function flush() { if (suite && uri != "") print uri; suite = 0; uri = "" }
            /^[[:space:]]*$/ { flush(); next }
            /^URIs:/ { uri = $2 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") suite = 1 }
            END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        # deb [options] URI suite components...
        sed -E -n 's/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+)[[:space:]]+bookworm[[:space:]].*/\2/p' "$f"
    done
}
mirror=${ZFSNG_DEBIAN_MIRROR:-$(find_mirror | head -n1)}
[ -n "$mirror" ] || die "no bookworm mirror in the host's apt config; set ZFSNG_DEBIAN_MIRROR"
mirror=${mirror%/}
log "mirror $mirror; building $final"

# --- work area, cleaned up on any exit --------------------------------------
# Built beside the cache entry (same filesystem) so the final rename is atomic.
work=$(mktemp -d "$cache_root/.build-zfs-$ver-$hash.XXXXXX")
work_area "$work"

# --- debootstrap -------------------------------------------------------------
log "debootstrap bookworm (minbase, main+contrib)"
debootstrap --variant=minbase --components=main,contrib bookworm "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

# proc/sys for dpkg scripts and dkms; devpts for apt. /dev itself keeps the
# static nodes debootstrap made: binding the host's /dev is avoidable risk.
mnt -t proc proc "$root/proc"
mnt -t sysfs sysfs "$root/sys"
mnt -t devpts -o newinstance,ptmxmode=666 devpts "$root/dev/pts"

# No daemon may start inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"

{
    echo "deb $mirror bookworm main contrib"
    [ "$ver" = 2.3 ] && echo "deb $mirror bookworm-backports main contrib"
} >"$root/etc/apt/sources.list"
# Lean install, and no resume device probing for the initramfs in a chroot.
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$root/etc/apt/apt.conf.d/90zfsng"
mkdir -p "$root/etc/initramfs-tools/conf.d"
echo RESUME=none >"$root/etc/initramfs-tools/conf.d/resume"

log "apt-get update"
in_root apt-get update -q >&2

# The kernel and its headers first, so that when zfs-dkms is configured DKMS
# finds the guest kernel's headers. mdadm: the disk-bound benchmark's Linux
# RAID, set against ZFS layouts on the same disks.
log "installing kernel, headers and tools"
in_root apt-get install -y -q linux-image-amd64 linux-headers-amd64 \
    python3 python3-pytest make udev kmod procps util-linux e2fsprogs fio \
    qemu-utils psmisc rsync mdadm >"$work/apt-base.log" 2>&1 ||
    { tail -n 40 "$work/apt-base.log" >&2; die "apt-get install (base) failed"; }

kver=$(basename "$(find "$root/lib/modules" -mindepth 1 -maxdepth 1 -type d | sort -V | tail -n1)")
[ -e "$root/boot/vmlinuz-$kver" ] || die "no guest kernel found (got '$kver')"
log "guest kernel $kver"
# mdadm's initramfs hook and scripts would assemble arrays at boot: the
# guest's root is never on md, and the small initramfs lacks their tools.
rm -f "$root"/usr/share/initramfs-tools/hooks/mdadm \
    "$root"/usr/share/initramfs-tools/scripts/local-block/mdadm \
    "$root"/usr/share/initramfs-tools/scripts/local-bottom/mdadm

# A small initramfs with only what mounts an ext4 root on virtio-blk: the
# default (MODULES=most, ~36 MB) takes seconds to unpack under TCG. Written
# after the install: /etc/initramfs-tools/modules is a conffile, and a
# pre-existing one would make dpkg stop and ask.
echo MODULES=list >"$root/etc/initramfs-tools/conf.d/zfsng-modules"
printf '%s\n' virtio_pci virtio_blk ext4 >>"$root/etc/initramfs-tools/modules"
in_root update-initramfs -u -k "$kver" >&2

log "installing OpenZFS $ver (DKMS build for $kver takes minutes)"
zfs_target=()
[ "$ver" = 2.3 ] && zfs_target=(-t bookworm-backports)
in_root apt-get install -y -q "${zfs_target[@]}" zfs-dkms zfsutils-linux \
    >"$work/apt-zfs.log" 2>&1 ||
    { tail -n 60 "$work/apt-zfs.log" >&2; die "apt-get install (zfs) failed"; }

# DKMS builds for the host's running kernel (uname -r in a chroot) and the
# newest kernel with headers; make sure the guest's one got it.
if [ -z "$(find "$root/lib/modules/$kver" -name 'zfs.ko*' -print -quit)" ]; then
    zmod=$(basename "$(find "$root/usr/src" -maxdepth 1 -name 'zfs-*' | sort -V | tail -n1)")
    log "zfs.ko missing for $kver: dkms install ${zmod/-//} -k $kver"
    in_root dkms install "${zmod/-//}" -k "$kver" >&2
fi
zko=$(find "$root/lib/modules/$kver" -name 'zfs.ko*' -print -quit)
[ -n "$zko" ] || die "no zfs.ko for $kver after dkms install"
in_root depmod "$kver"
# shellcheck disable=SC2016 # ${Version} is dpkg-query's, not ours
zfs_pkg=$(in_root dpkg-query -W -f='${Version}' zfsutils-linux)
log "zfs module ${zko#"$root"}; zfsutils-linux $zfs_pkg"

# --- guest init and tidy-up --------------------------------------------------
install -m 755 "$here/zfsng-guest-init" "$root/usr/local/sbin/zfsng-guest-init"
mkdir -p "$root/src" "$root/results"
echo zfsng-guest >"$root/etc/hostname"
# A fixed hostid, as a real host has one (zpool status shows it; multihost
# needs it); zfsutils' postinst may not have written one in a chroot.
[ -s "$root/etc/hostid" ] || in_root zgenhostid -f >&2 || true

# Shrink: the image is only booted, never updated. The compilers stay:
# purging them would take dkms, zfs-dkms and so the module with them.
rm -f "$root/usr/sbin/policy-rc.d"
in_root apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/lib/dkms/zfs/*/build \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
unmount_all

# --- the ext4 image ----------------------------------------------------------
cp "$root/boot/vmlinuz-$kver" "$work/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$work/initrd.img"
used_mb=$(du -sxm "$root" | cut -f1)
size_mb=$((used_mb + 2048))   # room for tests writing to the (overlay) root
[ "$size_mb" -ge 4096 ] || size_mb=4096
log "mke2fs -d: ${used_mb} MiB of files into a sparse ${size_mb} MiB ext4 image"
truncate -s "${size_mb}M" "$work/rootfs.img"
mke2fs -q -F -t ext4 -L zfsng-root -d "$root" "$work/rootfs.img" >&2
rm -rf "$root"

cat >"$work/info" <<EOF
zfs_series=$ver
zfsutils_linux=$zfs_pkg
kernel=$kver
recipe_hash=$hash
built=$(date -u +%Y-%m-%dT%H:%M:%SZ)
build_seconds=$((SECONDS - start))
EOF
rm -f "$work"/*.log

# Publish atomically: a reader sees either no entry or a complete one.
# (An incomplete leftover under the final name can only come from outside.)
[ ! -e "$final" ] || rm -rf "$final"
mv -T "$work" "$final"
trap - EXIT
log "done: $final ($(du -sh "$final" | cut -f1) on disk)"

# Older recipes' images of this version are dead weight (1+ GiB each). A run
# still booted from one keeps its open file; lock files are tiny and stay.
for old in "$cache_root/zfs-$ver-"*; do
    if [ ! -d "$old" ] || [ "$old" = "$final" ]; then continue; fi
    log "removing outdated $old"
    rm -rf "$old"
done
echo "$final"
