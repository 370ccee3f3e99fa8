#!/bin/sh
# The 2.1 small-block stall probe, one backend and one ARC cap a boot. Run
# inside the guest from the worktree, with run.sh --cut-on cut:
#   probe.sh BACKEND CAP_MIB LIMIT_S [THROTTLE]
# e.g. probe.sh tap-zvol-8k 64 1500. CAP_MIB "module": the module's own
# ARC limits, with hog.py pressing memory so the ARC's target falls to
# its floor (a dom0 short of memory; boot with run.sh --mem 2048 for a
# 64 MiB floor). THROTTLE: run.sh's --throttle, 2.1's
# 162:925668 unless given (2.3's: 137:782818). Every 20 s it appends the ARC's size,
# target, metadata and eviction skips, the pool disks' read/write
# counters, MemAvailable, the hog's size and the ARC's own room to grow
# (memory_available_bytes) to /results/trace.txt. A stall is the first hung-task report
# (a task blocked 120 s) plus 60 s: then (or at LIMIT_S, whichever is
# first, or once the host makes /results/stop) it saves the blocked tasks
# (sysrq w), dmesg and arcstats, writes /results/verdict.txt and makes
# /results/cut, on which run.sh kills the wedged guest. A run that ends on
# its own saves the same at its end. BACKENDS: main.py --backends.
backend=${1:?backends} cap=${2:?cap MiB} limit=${3:?limit s}
throttle=${4:-162:925668}
make -s guest-install || exit 1
up() { cut -d. -f1 /proc/uptime; }
t0=$(up)
snap() {  # snap TAG: blocked tasks, dmesg, arcstats
    echo w > /proc/sysrq-trigger; sleep 2
    dmesg > /results/dmesg-$1.txt
    cat /proc/spl/kstat/zfs/arcstats > /results/arcstats-$1.txt
}
# 0 for a field this release lacks (arc_meta_* are gone since 2.2)
arc() { awk -v k="$1" '$1 == k {v = $3} END {print v + 0}' \
    /proc/spl/kstat/zfs/arcstats; }
names=$(for d in /dev/disk/by-id/virtio-zfsng-d[0-9]*; do
    basename "$(readlink -f "$d")"; done | tr '\n' ' ')
disks() {  # reads and writes completed on the pool disks
    awk -v n=" $names" 'index(n, " " $3 " ") {r += $4; w += $8}
        END {print r, w}' /proc/diskstats
}
avail() { awk '$1 == "MemAvailable:" {print int($2 / 1024)}' /proc/meminfo; }
echo 0 > /tmp/hog-mib
echo "t_s size_MiB c_MiB meta_MiB meta_limit_MiB evict_skip disk_r disk_w" \
    "avail_MiB hog_MiB arc_room_MiB" > /results/trace.txt
(
    seen=
    while :; do
        t=$(( $(up) - t0 ))
        echo "$t $(( $(arc size) >> 20 )) $(( $(arc c) >> 20 ))" \
            "$(( $(arc arc_meta_used) >> 20 ))" \
            "$(( $(arc arc_meta_limit) >> 20 )) $(arc evict_skip) $(disks)" \
            "$(avail) $(cat /tmp/hog-mib)" \
            "$(( $(arc memory_available_bytes) >> 20 ))"
        if [ -z "$seen" ] && dmesg | grep -q "blocked for more than"; then
            seen=$t
        fi
        if [ -n "$seen" ] && [ $t -ge $(( seen + 60 )) ]; then
            echo "stalled: first hung-task report at ${seen}s" \
                "(blocked since about $(( seen - 120 ))s), cut at ${t}s" \
                > /results/verdict.txt
            break
        fi
        if [ $t -ge "$limit" ] || [ -e /results/stop ]; then
            echo "no stall seen by ${t}s (limit ${limit}s or stopped)" \
                > /results/verdict.txt
            break
        fi
        sleep 20
    done >> /results/trace.txt
    snap cut
    touch /results/cut
) > /dev/null 2>&1 &
monitor=$!
hog=
if [ "$cap" = module ]; then
    python3 tests/bench/archive/2.1-small-block-stall/hog.py /tmp/hog-mib &
    hog=$!
fi
ZFSNG_BENCH_ARC_MAX_MIB=$cap python3 tests/bench/main.py \
    --root /tmp/zfsng-root --device /dev/disk/by-id/virtio-zfsng-d1 \
    --out /results --sections disk-bound --throttle "$throttle" \
    --parts launch_runs --backends "$backend" --runs 1
rc=$?
kill $monitor $hog  # or the guest waits for them (they hold the console)
echo "finished: main.py exited $rc at $(( $(up) - t0 ))s, no stall" \
    > /results/verdict.txt
snap end
exit $rc
