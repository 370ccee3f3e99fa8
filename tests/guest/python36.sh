#!/bin/bash
# Print the prefix of a CPython 3.6 for the guest: XCP-ng 8.3's dom0 runs
# the plugins with Python 3.6, so the real-ZFS tests run them with one.
#
#   python36.sh            the prefix
#   python36.sh --image    a cached ext4 image of the part of that tree an
#                          interpreter needs (no tests, no site-packages),
#                          for run.sh to attach as a disk: a block device
#                          reads far faster than a 9p share under emulation,
#                          and every plugin call starts an interpreter
#
# ZFSNG_PY36 if set, else pyenv's newest 3.6.x. A machine without one gets
# 3.6.15 installed by pyenv (it must be there: the project does not build
# interpreters itself), unless ZFSNG_PY36_NO_INSTALL=1 (make demo, which
# can do without). Fails with a clear message otherwise.
set -euo pipefail
if [ -n "${ZFSNG_PY36:-}" ]; then
    prefix=$ZFSNG_PY36
else
    root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    prefix=$(ls -d "$root"/versions/3.6.* 2>/dev/null | sort -V | tail -n1 || true)
    if [ -z "$prefix" ] && [ "${ZFSNG_PY36_NO_INSTALL:-}" != 1 ] &&
        command -v pyenv >/dev/null; then
        echo "python36.sh: installing CPython 3.6.15 with pyenv" >&2
        pyenv install -s 3.6.15 >&2
        prefix=$root/versions/3.6.15
    fi
fi
[ -n "$prefix" ] && [ -x "$prefix/bin/python3.6" ] || {
    echo "python36.sh: no CPython 3.6 found (set ZFSNG_PY36 to its prefix)" >&2
    exit 1
}
if [ "${1:-}" != --image ]; then
    echo "$prefix"
    exit 0
fi

cache=${ZFSNG_GUEST_CACHE:-/var/cache/zfs-ng-guest}
key=$( { echo "$prefix"; stat -c %Y "$prefix/bin/python3.6" \
    "$prefix/lib/python3.6/os.py"; } | sha256sum | cut -c1-12)
img=$cache/py36-$key.img
if [ ! -s "$img" ]; then
    mkdir -p "$cache"
    work=$(mktemp -d "$cache/.py36.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    mkdir "$work/tree"
    tar -C "$prefix" --exclude=./lib/python3.6/test \
        --exclude=./lib/python3.6/site-packages --exclude='./lib/*.a' \
        --exclude='./lib/python3.6/config-*' --exclude=./lib/python3.6/idlelib \
        --exclude=./lib/python3.6/tkinter --exclude=./lib/python3.6/ensurepip \
        --exclude=./share --exclude=./include -cf - . | tar -C "$work/tree" -xf -
    truncate -s 256M "$work/py36.img"
    mke2fs -q -F -t ext4 -L zfsng-py36 -d "$work/tree" "$work/py36.img" >&2
    mv "$work/py36.img" "$img"
fi
echo "$img"
