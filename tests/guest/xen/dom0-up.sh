#!/bin/bash
# Bring up a Xen dom0's services in the test guest booted as Xen
# (tests/guest/run.sh --xen runs this before the command). The guest has no
# systemd (zfsng-guest-init), so this does what XCP-ng's units and Debian's
# /etc/init.d/xen do at boot, in their order:
#   the dom0 modules, xenfs on /proc/xen, xenstored (oxenstored, XCP-ng's),
#   xen-init-dom0 (dom0's name and domid in xenstore), xenconsoled (guest
#   consoles logged under /var/log/xen/console), then tapback, blktap's
#   vbd3 backend daemon (tapback.service: -p pidfile, after xenstored; it
#   wants /dev/xen/gntdev and the blktap driver's tapdev major, so the
#   blktap module, loaded by run.sh's command, comes first).
# Every wait is bounded. Exits non-zero, saying what is missing, if any
# service does not come up.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
X=/usr/lib/xen-4.17/bin
start=$(cut -d' ' -f1 /proc/uptime)
say() { echo "xen-dom0: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

[ "$(cat /sys/hypervisor/type 2>/dev/null)" = xen ] || die "not running under Xen"
modprobe -a xen-evtchn xen-gntdev xen-gntalloc xen-privcmd xenfs blktap ||
    die "cannot load the dom0 modules"
mountpoint -q /proc/xen || mount -t xenfs xenfs /proc/xen || die "cannot mount xenfs"
grep -q control_d /proc/xen/capabilities || die "this domain is not dom0"
[ -c /dev/xen/gntdev ] && [ -c /dev/xen/evtchn ] && [ -c /dev/xen/privcmd ] ||
    die "no /dev/xen/{gntdev,evtchn,privcmd}"
mkdir -p -m 700 /run/xen
# /var/lock (/run/lock): xl's lock file; the init mounts /run empty.
mkdir -p /run/xenstored /var/lib/xenstored /var/lib/xen /var/log/xen/console /run/lock

XENSTORED_ROOTDIR=/run/xenstored "$X/oxenstored" --pid-file /run/xenstore.pid ||
    die "oxenstored did not start"
for _ in $(seq 60); do
    xenstore-read -s / >/dev/null 2>&1 && break
    sleep 0.5
done
xenstore-read -s / >/dev/null 2>&1 || die "xenstored does not answer after 30 s"
"$X/xen-init-dom0" >/dev/null || die "xen-init-dom0 failed"
"$X/xenconsoled" --pid-file=/run/xenconsoled.pid --log=guest \
    --log-dir=/var/log/xen/console || die "xenconsoled did not start"
tapback -p /var/run/tapback.pid || die "tapback did not start"
for _ in $(seq 20); do
    [ -s /var/run/tapback.pid ] && kill -0 "$(cat /var/run/tapback.pid)" 2>/dev/null && break
    sleep 0.5
done
kill -0 "$(cat /var/run/tapback.pid 2>/dev/null)" 2>/dev/null || die "tapback is not running"
say "xenstored, xenconsoled and tapback up in $(awk -v s="$start" '{ printf "%.1f", $1 - s }' /proc/uptime)s" \
    "($(xenstore-read /local/domain/0/name) domid $(xenstore-read /local/domain/0/domid))"
