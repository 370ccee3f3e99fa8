#!/bin/bash
# Run a command as root inside a QEMU TCG guest with real OpenZFS and
# XCP-ng's real blktap (tap-ctl, tapdisk, vhd-util and the blktap2 driver,
# added by blktap-image.sh).
#
#   run.sh [--zfs 2.1|2.3] [--disks N] [--disk-size SIZE] [--mem MB]
#          [--timeout SECONDS] [--results DIR] [--hostid HEX]
#          [--shared-disk FILE] [--cpus N] [--state DIR] [--throttle I:B]
#          [--link-listen SOCKET | --link-connect SOCKET]
#          [--py36 required|optional] [--xen] [--cut-on NAME] -- <command...>
#
# The guest sees the project root read-only at /src (also its cwd), a
# writable results dir at /results, and N blank virtio disks as
# /dev/disk/by-id/virtio-zfsng-d1..dN. Output streams to this terminal and to
# <results>/output.log. Exits with the command's exit code; 124 if the guest
# timed out, 125 if it stopped without reporting one (as after a power cut).
# --state DIR keeps the disks and the root overlay in DIR: a later run with
# the same DIR is the same host booting again.
#
# Defaults: --zfs 2.1, --disks 6, --disk-size 1G, --mem 3072, --timeout 2400,
# --cpus 2 (ZFSNG_GUEST_CPUS).
# --results DIR keeps the results dir (created if needed; otherwise it is a
# temp dir removed at exit, like the disks and the root overlay).
# --state DIR keeps the disks (d1.raw..dN.raw) and the root overlay
# (root.qcow2) in DIR instead of the temp dir: made on first use, used as
# they are when present (their size and number too), so that a second boot
# with the same DIR is the same host after a reboot, its root file system
# and its pool disks as the first boot left them. The guest's sysrq 'b'
# (echo b >/proc/sysrq-trigger) is a power cut: with -no-reboot qemu ends
# at once, no rc file is written, and run.sh exits 125.
# --link-listen SOCKET / --link-connect SOCKET: a byte stream between two
# guests, standing for the network between two hosts: a virtio serial port
# (/dev/virtio-ports/zfsng.link in the guest) whose host end is the unix
# socket SOCKET, made by the listening guest and joined by the other.
# --throttle IOPS:BPS limits each of the N disks on its own to IOPS requests
# and BPS bytes a second (QEMU's throttling.iops-total and bps-total), as a
# real disk's limits: the disk-bound benchmark's slow disks.
# --cut-on NAME: a power cut of the whole machine from outside: once the
# guest makes the file NAME in its results dir, this script kills QEMU with
# SIGKILL (no shutdown, no flush; the disks keep what QEMU had written, see
# the cache mode below), and exits 125. Any NAME left from an earlier run
# is removed first.
# --hostid HEX gives the guest that hostid (default: the image's own).
# --shared-disk FILE attaches an existing raw file, without image locking, as
# /dev/disk/by-id/virtio-zfsng-shared: two guests given the same file are
# two hosts seeing one LUN. The host's CPython 3.6 (ZFSNG_PY36, default the
# pyenv 3.6 tree) is attached as a read-only disk, mounted in the guest at
# the same path and linked as /usr/local/bin/python3.6, the interpreter of
# XCP-ng 8.3's dom0. --py36 optional (make demo) uses that tree when the
# host has one and never installs it: without one the guest runs as it is,
# with no /usr/local/bin/python3.6, and the command picks the guest's own
# python3 (Debian's 3.11).
# --xen boots the image's Xen layer (xen-image.sh) as a Xen host: QEMU loads
# Xen 4.17 (multiboot), Xen boots the image's kernel and initramfs as dom0
# (console hvc0, through Xen to the serial port), and the command runs in
# dom0 after tests/guest/xen/dom0-up.sh has started xenstored, xenconsoled
# and tapback. Default --mem 4096 there, 2 GiB of it dom0's.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)

zfs=2.1 disks=6 disk_size=1G mem=3072 timeout=2400 results= hostid= shared=
state= link= throttle= py36_need=required xen= mem_given= cut_on=
cpus=${ZFSNG_GUEST_CPUS:-2}
usage() {
    sed -n '2,21s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --zfs) zfs=${2:?}; shift 2 ;;
        --disks) disks=${2:?}; shift 2 ;;
        --disk-size) disk_size=${2:?}; shift 2 ;;
        --mem) mem=${2:?} mem_given=1; shift 2 ;;
        --timeout) timeout=${2:?}; shift 2 ;;
        --results) results=${2:?}; shift 2 ;;
        --hostid) hostid=${2:?}; shift 2 ;;
        --shared-disk) shared=${2:?}; shift 2 ;;
        --cpus) cpus=${2:?}; shift 2 ;;
        --state) state=${2:?}; shift 2 ;;
        --throttle) throttle=${2:?}; shift 2 ;;
        --py36) py36_need=${2:?}; shift 2 ;;
        --xen) xen=1; shift ;;
        --cut-on) cut_on=${2:?}; shift 2 ;;
        --link-listen) link="path=${2:?},server=on,wait=off"; shift 2 ;;
        --link-connect) link="path=${2:?},reconnect=1"; shift 2 ;;
        --) shift; break ;;
        -h | --help) usage ;;
        *) echo "run.sh: unknown option $1" >&2; usage ;;
    esac
done
[ $# -gt 0 ] || { echo "run.sh: no command given" >&2; usage; }
[[ "$disks" =~ ^[0-9]+$ ]] || { echo "run.sh: --disks wants a number" >&2; exit 2; }
[[ "$cpus" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --cpus wants a number" >&2; exit 2; }
[ -z "$throttle" ] || [[ "$throttle" =~ ^[1-9][0-9]*:[1-9][0-9]*$ ]] ||
    { echo "run.sh: --throttle wants IOPS:BYTES_PER_SECOND" >&2; exit 2; }
[ -z "$hostid" ] || [[ "$hostid" =~ ^[0-9a-f]{8}$ ]] ||
    { echo "run.sh: --hostid wants 8 lower-case hex digits" >&2; exit 2; }
[ -z "$cut_on" ] || [[ "$cut_on" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] ||
    { echo "run.sh: --cut-on wants a file name (no directory)" >&2; exit 2; }
[[ "$py36_need" =~ ^(required|optional)$ ]] ||
    { echo "run.sh: --py36 wants required or optional" >&2; exit 2; }
[ -z "$shared" ] || [ -f "$shared" ] ||
    { echo "run.sh: --shared-disk $shared is not a file" >&2; exit 2; }
# The host's tools, installed one apt-get at a time: make check starts two
# guests side by side, and on a fresh machine two apt-gets at once fail on
# apt's lock (the image builders would each try).
need=()
for c in qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils \
    debootstrap:debootstrap mke2fs:e2fsprogs; do
    command -v "${c%%:*}" >/dev/null 2>&1 || need+=("${c#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    (
        flock -w 1800 9 || { echo "run.sh: apt lock wait" >&2; exit 1; }
        echo "run.sh: installing host packages: ${need[*]}" >&2
        apt-get update -q >&2 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2
    ) 9>/var/lock/zfs-ng-host-packages.lock ||
        { echo "run.sh: cannot install ${need[*]}" >&2; exit 1; }
fi
if [ "$py36_need" = optional ]; then
    py36=$(ZFSNG_PY36_NO_INSTALL=1 bash "$here/python36.sh" 2>/dev/null) || py36=
    [ -n "$py36" ] || echo "run.sh: no CPython 3.6 on this host: the guest" \
        "runs the plugin with its own python3" >&2
else
    py36=$(bash "$here/python36.sh")
fi
py36_img=
[ -z "$py36" ] || py36_img=$(bash "$here/python36.sh" --image)

img=$(bash "$here/build-image.sh" "$zfs")
img=$(bash "$here/blktap-image.sh" "$img")
if [ -n "$xen" ]; then
    img=$(bash "$here/xen-image.sh" "$img")
    [ -n "$mem_given" ] || mem=4096
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/zfsng-run.XXXXXX")
qemu_pid= cutter=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    [ -z "$cutter" ] || kill "$cutter" 2>/dev/null || true
    [ -z "$qemu_pid" ] || kill "$qemu_pid" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "$results" ]; then
    mkdir -p "$results"
    results=$(cd "$results" && pwd)
    rm -f "$results/rc" "$results/output.log" "$results/cmd.sh"
    [ -z "$cut_on" ] || rm -f "$results/$cut_on"
else
    results="$tmp/results"
    mkdir "$results"
fi

# The command, quoted for bash, run by the guest init with cwd /src, after
# the CPython 3.6 disk is mounted at the tree's own path (its RPATH).
{
    echo '#!/bin/bash'
    printf 'py36=%q\n' "$py36"
    cat <<'EOF'
[ -z "$py36" ] || { mkdir -p "$py36" &&
    mount -o ro /dev/disk/by-id/virtio-zfsng-py36 "$py36" &&
    ln -sf "$py36/bin/python3.6" /usr/local/bin/python3.6; } ||
    echo "run.sh: cannot mount the CPython 3.6 disk" >&2
# blktap: the driver, and a syslog reader (tapdisk's log and SMlog would
# otherwise go to the console) writing to the guest's /var/log/messages.
modprobe blktap || echo "run.sh: cannot load the blktap driver" >&2
busybox syslogd -O /var/log/messages ||
    echo "run.sh: cannot start syslogd" >&2
EOF
    [ -z "$xen" ] || cat <<'EOF'
bash /src/tests/guest/xen/dom0-up.sh ||
    { echo "run.sh: the dom0 Xen services did not start" >&2; exit 125; }
EOF
    printf 'exec'
    printf ' %q' "$@"
    echo
} >"$results/cmd.sh"

# Where the disks and the root overlay live: the temp dir, or --state's.
if [ -n "$state" ]; then
    mkdir -p "$state"
    keep=$(cd "$state" && pwd)
else
    keep=$tmp
fi

# An overlay keeps the cached root image untouched (thrown away with the
# temp dir, or kept in --state's dir and booted again as it is).
[ -f "$keep/root.qcow2" ] ||
    qemu-img create -q -f qcow2 -b "$img/rootfs.img" -F raw "$keep/root.qcow2"

# The root disk is the first virtio device so the guest names it vda
# (-device entries get PCI slots in order, ahead of any if=virtio drive).
drives=(-drive "file=$keep/root.qcow2,format=qcow2,if=none,id=root,cache=unsafe"
    -device "virtio-blk-pci,drive=root")
limits=
[ -z "$throttle" ] ||
    limits=",throttling.iops-total=${throttle%%:*},throttling.bps-total=${throttle#*:}"
for ((i = 1; i <= disks; i++)); do
    [ -f "$keep/d$i.raw" ] || truncate -s "$disk_size" "$keep/d$i.raw"
    # cache=unsafe: the disks are thrown away, so flushes need not reach the
    # host (ZFS flushes at every txg; honouring them is slow for nothing).
    # With --state too: what the guest wrote is in the host's page cache
    # when qemu ends, so a power cut of the guest loses only what the
    # guest itself had not written yet (as a disk without a write cache).
    # That holds when qemu is killed (--cut-on) too: a raw image has no
    # cache inside qemu (no format layer; qemu completes a guest's write
    # only once its pwrite to the file returned), and the host's page
    # cache outlives qemu.
    drives+=(-drive "file=$keep/d$i.raw,format=raw,if=none,id=d$i,cache=unsafe$limits"
        -device "virtio-blk-pci,drive=d$i,serial=zfsng-d$i")
done
if [ -n "$link" ]; then
    drives+=(-device virtio-serial-pci,id=vser -chardev "socket,id=link,$link"
        -device "virtserialport,bus=vser.0,chardev=link,name=zfsng.link")
fi
# The CPython 3.6 tree, read-only (see python36.sh --image).
[ -z "$py36_img" ] ||
    drives+=(-drive "file=$py36_img,format=raw,if=none,id=py36,readonly=on"
        -device "virtio-blk-pci,drive=py36,serial=zfsng-py36")
if [ -n "$shared" ]; then
    # No image locking: the other guest holds the same file open. Both
    # QEMUs go through this host's page cache, so each sees the other's
    # writes as a second host sees a shared LUN's.
    drives+=(-drive "file.filename=$shared,file.driver=file,file.locking=off,format=raw,if=none,id=shared,cache=writeback"
        -device "virtio-blk-pci,drive=shared,serial=zfsng-shared,share-rw=on")
fi

# mitigations=off: page-table isolation and friends are costly under TCG and
# protect nothing in a throwaway guest. panic=1 with -no-reboot makes a dying
# init end qemu instead of hanging until the timeout.
append="root=/dev/vda rw rootfstype=ext4 console=ttyS0 quiet loglevel=4 panic=1"
append+=" mitigations=off fsck.mode=skip init=/usr/local/sbin/zfsng-guest-init"
[ -z "$hostid" ] || append+=" zfsng.hostid=$hostid"
boot=(-kernel "$img/vmlinuz" -initrd "$img/initrd.img" -append "$append")
if [ -n "$xen" ]; then
    # Xen owns the serial port (com1) and passes dom0's hvc0 through to it.
    # QEMU's -initrd lists multiboot modules split at commas, each one's
    # command line after its first space: a comma inside dom0's line is
    # written twice. -cpu qemu64 plus SSE4, SSSE3 and POPCNT: dom0 was
    # reported to die under -cpu max (not re-checked here).
    # bootscrub=false: scrubbing the free RAM costs seconds under TCG.
    append=${append/console=ttyS0/console=hvc0}
    xen_args="console=com1 com1=115200 dom0_mem=2048M,max:2048M dom0_max_vcpus=$cpus"
    xen_args+=" bootscrub=false loglvl=all guest_loglvl=all"
    boot=(-cpu qemu64,+sse4.1,+sse4.2,+ssse3,+popcnt -kernel "$img/xen"
        -append "$xen_args" -initrd "$img/vmlinuz ${append//,/,,},$img/initrd.img")
fi

echo "run.sh: booting zfs $zfs guest${xen:+ as a Xen host} ($img), $disks x $disk_size disks${throttle:+ (each at most ${throttle%%:*} IOPS, ${throttle#*:} B/s)}, ${mem} MiB${state:+, state in $keep}" >&2
start=$SECONDS
# -display none -serial stdio rather than -nographic: with -nographic SeaBIOS
# also drives the serial port and sends terminal reset/clear/autowrap-off
# sequences that leave the user's terminal mangled.
# -nodefaults: no VGA, CD-ROM, floppy or NIC for the guest to probe at boot
# (seconds under TCG).
# stdin from /dev/null: the terminal stays in cooked mode, so Ctrl-C stops
# the run instead of going to the guest.
set +e
timeout -k 15 "$timeout" qemu-system-x86_64 -accel tcg -smp "$cpus" -m "$mem" \
    -nodefaults -display none -serial stdio -no-reboot \
    "${boot[@]}" \
    "${drives[@]}" \
    -device virtio-rng-pci \
    -virtfs "local,path=$src,mount_tag=src,security_model=none,readonly=on" \
    -virtfs "local,path=$results,mount_tag=results,security_model=none" \
    -pidfile "$tmp/qemu.pid" \
    </dev/null &
qemu_pid=$!
if [ -n "$cut_on" ]; then
    # The power cut: QEMU itself (its -pidfile, not timeout's pid) killed
    # with SIGKILL once the guest asks; bounded by timeout's life.
    (
        while kill -0 "$qemu_pid" 2>/dev/null; do
            if [ -e "$results/$cut_on" ] && [ -s "$tmp/qemu.pid" ]; then
                : >"$tmp/cut"
                kill -KILL "$(cat "$tmp/qemu.pid")"
                exit 0
            fi
            sleep 0.1
        done
    ) &
    cutter=$!
fi
wait "$qemu_pid"
qrc=$?
qemu_pid=
if [ -n "$cutter" ]; then
    kill "$cutter" 2>/dev/null || true
    wait "$cutter" 2>/dev/null || true
    cutter=
fi
set -e
echo "run.sh: guest ran $((SECONDS - start))s" >&2

if [ -e "$tmp/cut" ]; then
    echo "run.sh: power cut: qemu killed (SIGKILL) when the guest made $cut_on" >&2
    exit 125
fi

if [ "$qrc" -eq 124 ] || [ "$qrc" -eq 137 ]; then
    echo "run.sh: ERROR: guest timed out after ${timeout}s (see output above)" >&2
    exit 124
fi
if [ ! -s "$results/rc" ]; then
    echo "run.sh: ERROR: guest stopped (qemu exit $qrc) without reporting an exit code" >&2
    exit 125
fi
rc=$(cat "$results/rc")
[ "$rc" -eq 0 ] || echo "run.sh: command exited $rc" >&2
exit "$rc"
