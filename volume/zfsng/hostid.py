"""This host's ZFS hostid: what multihost protection (MMP) rests on.

Pools zfs-ng creates have ``multihost=on``: while one host has the pool
imported it writes to every disk about once a second, and another host's
``zpool import`` watches for those writes first (about 20 s with the
defaults) and refuses, even with ``-f``, while they go on. A host whose
own writes stall for about 10 s suspends the pool rather than risk two
writers. Disks that several hosts see (a shared LUN, a PBD created by hand
on a second host) are therefore never imported twice.

MMP tells hosts apart by hostid alone, so each host needs its own,
non-zero one: OpenZFS reads it from /etc/hostid (4 bytes, native byte
order; ``zgenhostid`` writes a random one) unless the spl module was given
``spl_hostid``. Without one ZFS refuses ``multihost=on``, so SR.create
refuses first, with ``HostIdMissing`` naming the fix. Hosts cloned from
one image share /etc/hostid: MMP cannot see them as two (OpenZFS before
2.3.6 skips the check when the ids are equal), so zfs-ng shows the hostid
in Plugin.diagnostics and the README asks for ``zgenhostid`` on each host.
"""

import struct
import sys

from zfsng import errors

HOSTID_FILE = "/etc/hostid"
SPL_PARAM = "/sys/module/spl/parameters/spl_hostid"


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except (IOError, OSError):
        return None


def current():
    """The hostid ZFS uses on this host (0: none)."""
    param = _read(SPL_PARAM)
    if param:
        try:
            value = int(param.strip() or b"0", 0) & 0xFFFFFFFF
        except ValueError:
            value = 0
        if value:
            return value
    raw = _read(HOSTID_FILE)
    if not raw or len(raw) < 4:
        return 0
    fmt = "<I" if sys.byteorder == "little" else ">I"
    return struct.unpack(fmt, raw[:4])[0]


def require():
    """The hostid, or raise HostIdMissing: multihost needs one."""
    value = current()
    if not value:
        raise errors.HostIdMissing(
            "this host has no ZFS hostid (%s is missing or zero), and "
            "zfs-ng creates pools with multihost protection, which needs "
            "one unique per host: run 'zgenhostid' once on each host, then "
            "retry" % HOSTID_FILE)
    return value


def text(value=None):
    return "%08x" % (current() if value is None else value)
