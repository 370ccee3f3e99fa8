#!/bin/bash
py36=/root/.pyenv/versions/3.6.15
[ -z "$py36" ] || { mkdir -p "$py36" &&
    mount -o ro /dev/disk/by-id/virtio-zfsng-py36 "$py36" &&
    ln -sf "$py36/bin/python3.6" /usr/local/bin/python3.6; } ||
    echo "run.sh: cannot mount the CPython 3.6 disk" >&2
# blktap: the driver, and a syslog reader (tapdisk's log and SMlog would
# otherwise go to the console) writing to the guest's /var/log/messages.
modprobe blktap || echo "run.sh: cannot load the blktap driver" >&2
busybox syslogd -O /var/log/messages ||
    echo "run.sh: cannot start syslogd" >&2
exec sh -c make\ -s\ guest-install\ \&\&\ python3\ tests/bench/main.py\ --root\ /tmp/zfsng-root\ --device\ /dev/disk/by-id/virtio-zfsng-d1\ --out\ /results\ --sections\ disk-bound\ --throttle\ 137:782818\ --parts\ launch_runs\ --backends\ tap-zvol\,tap-zvol-16k\,tap-vhd-file\,tap-vhd-ext4
