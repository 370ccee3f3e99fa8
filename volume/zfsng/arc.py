"""The ARC's floor, read from the loaded OpenZFS module's arcstats.

Under memory pressure the ARC's target falls to its floor (``c_min``:
dom0's RAM / 32 unless ``zfs_arc_min`` sets it). On OpenZFS 2.1 a target
that low can stop a small-block zvol's reads for good (ARCHITECTURE.md,
"Why these defaults"), so SR.create reads the floor before it makes an SR
with blocks under 16K there (devconfig.check_small_blocks).
"""

import re

ARCSTATS = "/proc/spl/kstat/zfs/arcstats"


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
