#!/bin/sh
# run inside the guest from the worktree: the 2.1 small-block stall probe
make -s guest-install || exit 1
( sleep 1000; echo w > /proc/sysrq-trigger; dmesg > /results/dmesg-1000.txt
  cat /proc/spl/kstat/zfs/arcstats > /results/arcstats-1000.txt
  sleep 250; echo w > /proc/sysrq-trigger; dmesg > /results/dmesg-1250.txt
  cat /proc/spl/kstat/zfs/arcstats > /results/arcstats-1250.txt ) &
python3 tests/bench/main.py --root /tmp/zfsng-root \
    --device /dev/disk/by-id/virtio-zfsng-d1 --out /results \
    --sections disk-bound --throttle 162:925668 --parts launch_runs \
    --backends tap-zvol-4k,tap-zvol-8k --runs 1
rc=$?
dmesg > /results/dmesg-end.txt
cat /proc/spl/kstat/zfs/arcstats > /results/arcstats-end.txt
exit $rc
