#!/bin/sh
# Is ZFS's prefetch what makes the launch part's sequential reads cost 1.8
# disk bytes per byte? One zvol as zfs-ng makes them (8K blocks, lz4,
# volmode=dev) on the rig's throttled disk 1, filled with random data;
# then the launch part's sequential read (16 MiB in 4 MiB direct requests,
# at offsets 16 MiB apart, diskrig.seq_offset) from cold caches (the ARC
# capped at 64 MiB, floor 32, as diskrig.tune), alternately with
# zfs_prefetch_disable=1 and 0, ROUNDS times; the disk's bytes read per
# byte read, counted once the disk has drained. Run in the guest:
#   run.sh --zfs 2.3 --disks 1 --disk-size 4G --cpus 1 \
#       --throttle 137:782818 --results DIR -- \
#       sh tests/bench/archive/seqread-prefetch/probe.sh [ROUNDS]
set -eu
rounds=${1:-3}
p=/sys/module/zfs/parameters
dev=$(readlink -f /dev/disk/by-id/virtio-zfsng-d1)
name=$(basename "$dev")
echo $((64 << 20)) > $p/zfs_arc_max
echo $((32 << 20)) > $p/zfs_arc_min
zpool create -f -o ashift=12 -O compression=lz4 -m none pf "$dev"
zfs create -V 128M -o volblocksize=8K -o volmode=dev -o sync=disabled pf/v
udevadm settle
zvol=/dev/zvol/pf/v
dd if=/dev/urandom of=$zvol bs=4M count=32 oflag=direct status=none
zfs set sync=always pf/v
field() { awk -v n="$name" -v f="$1" '$3 == n {print $f}' /proc/diskstats; }
drain() {  # no request in flight for two polls in a row
    quiet=0
    while [ $quiet -lt 2 ]; do
        if [ "$(field 12)" = 0 ]; then quiet=$((quiet + 1)); else quiet=0; fi
        sleep 1
    done
}
k=0
{
zfs version | head -1
echo "round prefetch offset_mib disk_read_mib bytes_per_byte"
for r in $(seq 1 "$rounds"); do
    for off_flag in 1 0; do
        echo $off_flag > $p/zfs_prefetch_disable
        offset=$(( (k * 16) % 96 ))
        k=$((k + 1))
        zpool sync pf
        sync
        echo 3 > /proc/sys/vm/drop_caches
        drain
        before=$(field 6)
        dd if=$zvol of=/dev/null bs=4M iflag=direct skip=$((offset / 4)) \
            count=4 status=none
        drain
        after=$(field 6)
        awk -v r="$r" -v pf=$((1 - off_flag)) -v o="$offset" \
            -v s=$((after - before)) 'BEGIN {
            printf "%d %s %d %.1f %.2f\n", r, pf ? "on" : "off", o,
                s * 512 / 1048576, s * 512 / 16777216 }'
    done
done
} | tee /results/prefetch.txt
zpool destroy pf
