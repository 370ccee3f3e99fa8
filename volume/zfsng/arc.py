"""The ARC's floor, read from the loaded OpenZFS module's arcstats.

Under memory pressure the ARC's target falls to its floor (``c_min``:
dom0's RAM / 32 unless ``zfs_arc_min`` sets it). On OpenZFS 2.1 a target
that low can stop a zvol's reads for good, small blocks first
(ARCHITECTURE.md, "Why these defaults"): SR.create reads the floor before
it makes an SR with blocks under 16K there (devconfig.check_small_blocks),
and SR.attach warns the admin of a floor too low (arcfloor).
"""

import re

ARCSTATS = "/proc/spl/kstat/zfs/arcstats"
# No run froze with the ARC's target at 256 MiB; two 8K zvols froze for
# good at 64 MiB and for a minute at 128 MiB, and 16K froze once at 64.
FLOOR_NEEDED = 256 * 1024 * 1024
# OpenZFS 2.2 rewrote the ARC's eviction: no run on it froze.
SAFE_SINCE = (2, 2)


def floor_too_low(zfs_version, arc_floor):
    """Whether this OpenZFS ((major, minor), None if unknown: taken as
    old) can freeze with this floor (bytes, None if unknown: taken as
    too low)."""
    if zfs_version and zfs_version >= SAFE_SINCE:
        return False
    return (arc_floor or 0) < FLOOR_NEEDED


def floor():
    """The ARC's floor in bytes, or None when arcstats cannot be read
    (no module loaded) or has no ``c_min`` row."""
    try:
        with open(ARCSTATS) as f:
            lines = f.read().splitlines()
    except (IOError, OSError):
        return None
    for line in lines:
        fields = line.split()
        if len(fields) == 3 and fields[0] == "c_min" and \
                re.match(r"^[0-9]{1,20}\Z", fields[2]):
            return int(fields[2])
    return None
