"""Warning the admin of an OpenZFS 2.1 host whose ARC floor is too low.

OpenZFS 2.1 can stop a zvol's reads for good once memory pressure has
shrunk the ARC's target to its floor: in the test guest it did with 8K
and 4K zvols at a 64 MiB target, and once at 16K, zfs-ng's default there
(ARCHITECTURE.md, "Why these defaults"). A 2 GiB dom0's floor is 64 MiB
(RAM / 32), so most XCP-ng 8.3 hosts run under that risk until their
admin raises ``zfs_arc_min``; at 256 MiB no run froze. zfs-ng does not
raise it itself: the floor is memory dom0 never gets back, the admin's
to give.

So SR.attach (every PBD plug, at every boot) warns in SMlog where the
floor is under arc.FLOOR_NEEDED on a release before 2.2, and sends a
XenAPI message on the SR (an alert in Xen Orchestra and XenCenter) once
per SR per boot: the mark of a message sent lives in /run. The check reads
arcstats first and asks ``zfs version`` only when the floor is low, so a
host with a floor high enough pays one file read per attach. Nothing is
refused: an SR in use must stay usable.
"""

import errno
import os

from zfsng import arc, errors, lock, log, names, zfs
from zfsng_volume import alert

MESSAGE = "ZFSNG_ARC_FLOOR_LOW"
PRIORITY = 3        # a warning, as XenCenter and Xen Orchestra read it
PARAM = "/sys/module/zfs/parameters/zfs_arc_min"


def check(sr, sr_uuid):
    """Warn about a floor too low for the loaded OpenZFS, for the SR
    dataset sr (XenAPI uuid sr_uuid). Never raises for what it cannot
    read or send; never waits on xapi."""
    floor = arc.floor()
    if floor is not None and floor >= arc.FLOOR_NEEDED:
        return
    try:
        version = zfs.kernel_version()
    except errors.StorageError as exc:   # the attach itself is done
        log.warning("SR %s: cannot tell the OpenZFS release: %s", sr,
                    exc)
        version = None
    if not arc.floor_too_low(version, floor):
        return
    body = text(version, floor)
    log.warning("SR %s: %s", sr, body)
    if names.is_uuid(sr_uuid) and _first_since_boot(sr):
        alert.send(sr_uuid, MESSAGE, PRIORITY, body)


def text(version, floor):
    """What the admin is told: the risk, the floor here, the way out."""
    release = "%d.%d" % version if version else "an unknown release"
    here = "%d MiB" % (floor >> 20) if floor is not None else "unknown"
    need = arc.FLOOR_NEEDED
    return ("This host runs OpenZFS %s with the ARC's floor at %s: under "
            "memory pressure 2.1 can stop a zvol's reads for good once the "
            "ARC shrinks to its floor, which freezes the VMs on it. Raise "
            "the floor to %d MiB or more, and give dom0 that memory: "
            "'echo %d > %s' now (zfs_arc_max, if set, must be larger) and "
            "'options zfs zfs_arc_min=%d' in /etc/modprobe.d/zfs.conf for "
            "the next boots. OpenZFS 2.2 and later do not need it."
            % (release, here, need >> 20, need, PARAM, need))


def _first_since_boot(sr):
    """True once per SR per boot: makes the SR's mark in RUN_DIR (a
    tmpfs), or finds it made. A mark that cannot be made sends nothing:
    SMlog has the warning."""
    try:
        os.makedirs(lock.RUN_DIR, 0o700, exist_ok=True)
        fd = os.open(lock.run_file("arcfloor-" + sr, ".sent"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except (IOError, OSError) as exc:
        if exc.errno != errno.EEXIST:
            log.warning("SR %s: cannot mark the ARC floor message sent: "
                        "%s", sr, exc)
        return False
    os.close(fd)
    return True
