#!/bin/bash
# Two hosts, one link: a running VM's disk moves from a zfs-ng SR on host A
# to a zfs-ng SR on host B. Two guests, each with its own pool and tapdisk,
# joined by a virtio serial port pair (run.sh --link-listen/--link-connect)
# that stands for the network xapi's NBD connection crosses. This script
# relays the hand-over files between their results dirs. See
# tests/integration/twohost_guest.py.
#
# With --cut, host B's power is cut (its QEMU killed, no shutdown) once
# host A's move has reached complete and asks for it (A's results dir
# gets "cut"): A must see the move fail while its VM runs on, every write
# kept (twohost_guest.py source-cut).
#
# With --cut-source, host A's power is cut instead, once its move has
# reached complete and the VM writes through the mirror (A's results dir
# gets "cut"): host B, its link silent and never closed, must end and
# destroy the leaf as xapi's receive_cancel2 does, leaving nothing
# (twohost_guest.py destination-orphaned).
#
#   twohosts.sh [--zfs 2.1|2.3] [--cut | --cut-source]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
zfs=2.3 cut=
while [ $# -gt 0 ]; do
    case $1 in
        --zfs) zfs=${2:?}; shift 2 ;;
        --cut) cut=b; shift ;;
        --cut-source) cut=a; shift ;;
        *) echo "twohosts.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
role_a=source role_b=destination
[ "$cut" != b ] || role_a=source-cut
[ "$cut" != a ] || { role_a=source-lost; role_b=destination-orphaned; }
bound=2400      # s, each guest and the relay

tmp=$(mktemp -d "${TMPDIR:-/tmp}/zfsng-twohosts.XXXXXX")
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
mkdir "$tmp/a" "$tmp/b"

guest() {   # guest <results dir> <link option> <role>
    ZFSNG_GUEST_CPUS=1 bash "$here/run.sh" --zfs "$zfs" --disks 1 \
        "$2" "$tmp/link.sock" --results "$1" --timeout "$bound" -- \
        sh -c "make -s guest-install && PYTHONDONTWRITEBYTECODE=1 python3 tests/integration/twohost_guest.py $3; rc=\$?; cp /var/log/messages /results/; exit \$rc"
}

echo "twohosts: host B (destination) and host A (source), OpenZFS $zfs" >&2
guest "$tmp/b" --link-listen "$role_b" >"$tmp/b.log" 2>&1 &
pids+=($!)
for ((i = 0; i < 60; i++)); do [ -S "$tmp/link.sock" ] && break; sleep 1; done
guest "$tmp/a" --link-connect "$role_a" >"$tmp/a.log" 2>&1 &
pids+=($!)

relay() {   # relay <from> <to>: once, when it appears
    [ -e "$1" ] && [ ! -e "$2" ] && cp "$1" "$2.tmp" && mv "$2.tmp" "$2"
    return 0
}
for ((i = 0; i < bound; i += 2)); do
    relay "$tmp/b/ready.json" "$tmp/a/remote.json"
    relay "$tmp/a/finalize" "$tmp/b/finalize"
    relay "$tmp/b/result.json" "$tmp/a/result.json"
    if [ -n "$cut" ] && [ -e "$tmp/a/cut" ] && [ ! -e "$tmp/cut-done" ]; then
        # the power cut: QEMU itself (and its timeout) killed at once
        pkill -KILL -f "path=$tmp/$cut,mount_tag=results" || true
        touch "$tmp/cut-done"
        [ "$cut" != a ] || touch "$tmp/b/source-cut"
        echo "twohosts: host ${cut^^}'s power cut at $(date +%T)" >&2
    fi
    b_up=1 a_up=1
    kill -0 "${pids[0]}" 2>/dev/null || b_up=0
    kill -0 "${pids[1]}" 2>/dev/null || a_up=0
    [ "$a_up$b_up" != 00 ] || break
    # one host gone: the other must not wait its whole bound for it
    [ "$a_up" = 1 ] || [ -e "$tmp/b/finalize" ] || [ "$cut" = a ] ||
        touch "$tmp/b/finalize"
    [ "$b_up" = 1 ] || [ -e "$tmp/b/result.json" ] || [ "$a_up" = 0 ] ||
        [ "$cut" = b ] || kill "${pids[1]}" 2>/dev/null || true
    sleep 2
done
brc=0 arc=0
wait "${pids[0]}" || brc=$?
wait "${pids[1]}" || arc=$?
pids=()
for h in b a; do
    echo "--- host ${h^^} ---" >&2
    grep -v '^\[' "$tmp/$h.log" >&2 || true
    if [ "$arc$brc" != 00 ] && [ -f "$tmp/$h/messages" ]; then
        echo "--- host ${h^^}: the plugins' and tapdisk's last log lines ---" >&2
        grep -E 'zfs-ng|tapdisk' "$tmp/$h/messages" | tail -n 40 >&2 || true
    fi
done
echo "twohosts: host A (source) exit $arc, host B (destination) exit $brc" >&2
if [ -n "$cut" ]; then      # the host cut: its exit says nothing
    [ -e "$tmp/cut-done" ] ||
        { echo "twohosts: host ${cut^^} was never cut" >&2; exit 1; }
    if [ "$cut" = b ]; then [ "$arc" -eq 0 ]; else [ "$brc" -eq 0 ]; fi
else
    [ "$arc" -eq 0 ] && [ "$brc" -eq 0 ]
fi
