#!/bin/bash
# Two hosts, one LUN: two guests with distinct hostids share one disk file.
# Guest A creates an SR there and keeps it; guest B, meanwhile, must fail
# to attach it, to force-import it and to probe it; guest C, with A's hostid
# but another host name (a cloned host), must fail to attach it. Then A
# checks its data and detaches. See tests/integration/multihost_guest.py.
#
#   multihost.sh [--zfs 2.1|2.3]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
zfs=2.3
[ "${1:-}" != --zfs ] || zfs=${2:?}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/zfsng-multihost.XXXXXX")
apid=
cleanup() {
    [ -z "$apid" ] || kill "$apid" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
mkdir "$tmp/a" "$tmp/b" "$tmp/c"
truncate -s 1G "$tmp/shared.raw"

guest() {   # guest <results dir> <hostid> <role> [hostname]
    bash "$here/run.sh" --zfs "$zfs" --disks 0 --hostid "$2" \
        --shared-disk "$tmp/shared.raw" --results "$1" --timeout 2400 -- \
        sh -c "hostname ${4:-zfsng-guest} && make -s guest-install && python3 tests/integration/multihost_guest.py $3"
}

echo "multihost: host A (hostid 0a0a0a0a) creates the SR" >&2
guest "$tmp/a" 0a0a0a0a hold >"$tmp/a.log" 2>&1 &
apid=$!
for ((i = 0; i < 900; i += 5)); do
    [ -e "$tmp/a/ready" ] && break
    kill -0 "$apid" 2>/dev/null || break
    sleep 5
done
if [ ! -e "$tmp/a/ready" ]; then
    cat "$tmp/a.log" >&2
    echo "multihost: FAILED: host A never got the SR ready" >&2
    exit 1
fi

echo "multihost: host B (hostid 0b0b0b0b) tries to take it" >&2
cp "$tmp/a/config.json" "$tmp/b/"
brc=0
guest "$tmp/b" 0b0b0b0b intrude || brc=$?

echo "multihost: host C (A's hostid, another name: a clone) tries" >&2
cp "$tmp/a/config.json" "$tmp/c/"
crc=0
guest "$tmp/c" 0a0a0a0a clone zfsng-clone || crc=$?

touch "$tmp/a/release"
arc=0
wait "$apid" || arc=$?
apid=
echo "--- host A ---" >&2
cat "$tmp/a.log" >&2
echo "multihost: host A exit $arc, host B exit $brc, host C exit $crc" >&2
[ "$arc" -eq 0 ] && [ "$brc" -eq 0 ] && [ "$crc" -eq 0 ]
