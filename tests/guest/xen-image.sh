#!/bin/bash
# Add Xen to a blktap guest image (once, cached), so that the test guest can
# boot as a Xen host: the hypervisor, its dom0 tools and a PV domU.
#
#   xen-image.sh <image dir made by blktap-image.sh>
#
# Installs Debian bookworm's Xen 4.17 (xen-hypervisor-4.17-amd64,
# xen-utils-4.17: xl, xenstored, xenconsoled, xen-init-dom0, and the
# xenstore-* tools) at exactly the version of the libxen the blktap layer
# built tapdisk and tapback against. Prints the new image directory: the
# blktap layer's files (rootfs.img, vmlinuz, initrd.img, info) plus `xen`,
# the hypervisor gunzipped (QEMU's -kernel loads a multiboot ELF, not a
# gzip). Inside the root file system, /opt/zfsng-xen/domu-initrd.gz is the
# PV domU's initramfs: busybox with its libraries, xen-blkfront.ko of the
# image's kernel (which boots as the domU too) and tests/guest/xen/domu-init
# as /init. tapback needs nothing here: blktap 3.55.5 always builds it, and
# the blktap layer installed it.
#
# A layer of its own (tests/guest/run.sh --xen), so that the other guest
# tests boot exactly the image they booted before.
set -euo pipefail

base=${1:?usage: xen-image.sh <image dir>}
base=$(cd "$base" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
start=$SECONDS
log() { echo "[xen-image +$((SECONDS - start))s] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=lib.sh
. "$here/lib.sh"

[ "$(id -u)" -eq 0 ] || die "must run as root (loop mount, chroot)"

hash=$(cat "${BASH_SOURCE[0]}" "$here/lib.sh" "$here/xen/domu-init" | sha256sum | cut -c1-12)
final="$base-xen-$hash"
image_complete() {   # lib.sh's four files, and the hypervisor
    [ -s "$1/rootfs.img" ] && [ -s "$1/vmlinuz" ] && [ -s "$1/initrd.img" ] &&
        [ -s "$1/info" ] && [ -s "$1/xen" ]
}
if image_complete "$final"; then
    echo "$final"
    exit 0
fi
one_builder "$final.lock" "$final"

work=$(mktemp -d "$(dirname "$base")/.build-xen.XXXXXX")
work_area "$work"
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

# --- Xen, at the version of the libxen tapdisk and tapback were built with --
# shellcheck disable=SC2016 # ${Version} is dpkg-query's
xver=$(in_root dpkg-query -W -f='${Version}' libxenstore4) ||
    die "no libxenstore4 in $base (not a blktap layer?)"
log "installing Xen $xver"
in_root apt-get update -q >&2
in_root apt-get install -y -q "xen-hypervisor-4.17-amd64=$xver" "xen-utils-4.17=$xver" \
    xenstore-utils >"$work/apt.log" 2>&1 ||
    { tail -n 40 "$work/apt.log" >&2; die "apt-get install failed"; }
xgz=$(find "$root/boot" -maxdepth 1 -name 'xen-4.17*.gz' | sort | tail -n1)
[ -n "$xgz" ] || die "no /boot/xen-4.17*.gz after the install"
gunzip -c "$xgz" >"$work/xen"
for f in xl xenstored xenconsoled xen-init-dom0; do
    [ -n "$(find "$root/usr/lib/xen-4.17/bin" "$root/usr/sbin" -name "$f" 2>/dev/null)" ] ||
        die "no $f installed"
done
# What the packages would do on their own at a uevent: the test plugs the
# vbd3 device by hand and plays xapi's block script, so no rule may act
# on xen-backend devices behind its back (logged, and removed if any).
rules=$(grep -l -s -E 'xen-backend|vbd' "$root"/lib/udev/rules.d/* "$root"/usr/lib/udev/rules.d/* \
    "$root"/etc/udev/rules.d/* || true)
for r in $rules; do
    log "removing udev rule ${r#"$root"} (acts on xen-backend devices)"
    rm -f "$r"
done

# --- the PV domU's initramfs ---------------------------------------------
log "making the domU initramfs"
d=$root/tmp/domu
rm -rf "$d"
mkdir -p "$d/bin" "$d/lib" "$d/proc" "$d/sys" "$d/dev"
# busybox and the libraries it links, copied inside the chroot (the image's
# own files, whatever its absolute symlinks point to).
in_root sh -euc 'cp /usr/bin/busybox /tmp/domu/bin/busybox
    for l in $(ldd /usr/bin/busybox | awk "{ for (i = 1; i <= NF; i++) if (\$i ~ /^\//) print \$i }"); do
        mkdir -p "/tmp/domu$(dirname "$l")"
        cp -L "$l" "/tmp/domu$l"
    done' || die "cannot copy busybox into the domU initramfs"
for a in sh mount insmod sleep cat cut wc dd sha256sum sync poweroff uname echo; do
    ln -s busybox "$d/bin/$a"
done
blkfront=$(find "$root/lib/modules/$kver" -name 'xen-blkfront.ko*' | head -n1)
[ -n "$blkfront" ] || die "no xen-blkfront module for $kver"
case "$blkfront" in
    *.ko) cp "$blkfront" "$d/lib/xen-blkfront.ko" ;;
    *.ko.xz) xz -dc "$blkfront" >"$d/lib/xen-blkfront.ko" ;;
    *) die "unexpected module file $blkfront" ;;
esac
install -m 755 "$here/xen/domu-init" "$d/init"
mkdir -p "$root/opt/zfsng-xen"
(cd "$d" && find . | sort | cpio -o -H newc -R 0:0 --quiet) | gzip -9 \
    >"$root/opt/zfsng-xen/domu-initrd.gz"
log "domU initramfs: $(find "$d" -type f | wc -l) files, $(du -sh "$root/opt/zfsng-xen/domu-initrd.gz" | cut -f1) compressed"
rm -rf "$d"

rm -f "$root/usr/sbin/policy-rc.d"
in_root apt-get clean
rm -rf "$root"/var/lib/apt/lists/*
xen_pkgs=$(in_root dpkg-query -W -f='${Package}=${Version} ' 'xen-hypervisor-4.17-amd64' 'xen-utils-4.17')
unmount_all

{
    cat "$base/info"
    echo "xen=$xen_pkgs xen_recipe=$hash"
    echo "xen_seconds=$((SECONDS - start))"
} >"$work/info"
rm -f "$work"/*.log
rmdir "$root"
[ ! -e "$final" ] || rm -rf "$final"
mv -T "$work" "$final"
trap - EXIT
log "done: $final"

for old in "$base-xen-"*; do
    if [ ! -d "$old" ] || [ "$old" = "$final" ]; then continue; fi
    log "removing outdated $old"
    rm -rf "$old"
done
echo "$final"
