"""Pool health: what ``zpool list`` and ``zpool status -x`` say, turned into
the SMAPIv3 health xapi shows for an SR (``pool_health``).

Its own room because three callers need it and only one is SR.*: SR.stat
(through ``sr.stat_of``), Plugin.diagnostics, and the alerts; none of them
should import the SR lifecycle to read a pool's state.
"""

from zfsng import errors, pools

# zpool states in which the pool still serves every block: ONLINE, and
# DEGRADED (redundancy or a log device lost, every block still readable).
# Any other (FAULTED, UNAVAIL, SUSPENDED...) means it cannot serve data.
SERVING = ("ONLINE", "DEGRADED")


# Leaf states of a device that no longer holds its share of the pool's
# data. A leaf under "cache" or "spares" holds no data: losing it loses no
# redundancy (a faulted cache device leaves the pool ONLINE, rightly).
LOST = ("FAULTED", "UNAVAIL", "REMOVED", "OFFLINE")
NO_DATA_SECTIONS = ("cache", "spares")


def _status_reason(pool):
    """(one line from ``zpool status -x``: its status sentence and bad
    devices, "" for a pool with no problem to report; whether a device
    that holds data, or a log device, is lost)."""
    try:
        text = pools.pool_status(pool, problems_only=True)
    except errors.ZfsError as exc:
        return exc.message, False
    status, bad, in_status, in_config = [], [], False, False
    section, lost = None, False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("status:"):
            in_status = True
            status.append(stripped[len("status:"):].strip())
            continue
        if in_status and line.startswith(("\t", "        ")) and stripped:
            status.append(stripped)
            continue
        in_status = False
        if stripped.startswith("config:"):
            in_config = True
        elif stripped.startswith("errors:"):
            in_config = False
        elif in_config:
            words = stripped.split()
            if len(words) == 1:     # a section: logs, cache, spares...
                section = words[0]
            if len(words) < 2:
                continue
            # a disk missing since import is shown by its guid, with
            # "was <path>" at the end of the line
            path = words[-1] if words[-2] == "was" else words[0]
            if path.startswith("/") and words[1] != "ONLINE":
                bad.append("%s %s" % (path, words[1]))
                if words[1] in LOST and section not in NO_DATA_SECTIONS:
                    lost = True
    reason = " ".join(status)
    if bad:
        reason += (" " if reason else "") + "Devices: %s." % ", ".join(bad)
    return reason, lost


def pool_health(pool):
    """(zpool state, v5 health) of pool: Healthy while it serves every
    block, with the problem as text if it has one; else Unavailable.

    Why never Recovering (nor Unreachable): since xen-api v24.29.0 SR.scan
    (``stat_with_retry`` in xapi-storage-script) fails with SR_UNHEALTHY
    for any health but Healthy, after retrying Unreachable 3 times. A
    DEGRADED mirror reported as Recovering would block scans, and every
    tool that scans (Xen Orchestra's disk views), exactly while ZFS keeps
    the data available. xapi drops Healthy's text; ``alert`` tells the
    admin (SMlog, a XenAPI message) and Plugin.diagnostics leads with it.

    An ONLINE pool with a lost data or log device is DEGRADED here: OpenZFS
    2.3 faults a mirror leg that fails every I/O ("too many errors") and
    still calls the pool and the mirror ONLINE (seen by the fault
    campaign, tests/faults/storage.py mirror-loss), though the pool has
    lost that leg's redundancy just as after ``zpool offline``. The admin
    must hear it as the DEGRADED pool it is (ZFSNG_POOL_DEGRADED, priority
    2), not as a minor problem of an ONLINE one.
    """
    row = pools.pool_by_name(pool)
    state = row["health"] if row else "UNAVAIL"
    problem, lost = _status_reason(pool)
    if state == "ONLINE" and not problem:
        return state, ["Healthy", ""]
    shown = state
    if state == "ONLINE" and lost:
        state = "DEGRADED"
        shown = "DEGRADED (zpool says ONLINE, but a device is lost)"
    text = ("pool %s is %s. %s" % (pool, shown, problem)).strip()
    if state == "SUSPENDED" and row and row.get("multihost") == "on":
        text += " " + SUSPENDED_MULTIHOST
    return state, ["Healthy" if state in SERVING else "Unavailable", text]


# zpool status tells the admin to run 'zpool clear' on a suspended pool.
# On a pool with multihost on (every pool zfs-ng creates) OpenZFS does not
# resume it: in the fault campaign's disk-loss, once the disk was back,
# 2.1 refused the clear ("invalid argument for this pool operation") and
# on 2.3 it hung in the kernel for good, and every later zpool command
# with it (openzfs/zfs issues 19033 and 19036). A reboot is the only way
# out, so the admin hears it first.
SUSPENDED_MULTIHOST = (
    "The pool has multihost on: OpenZFS does not resume it with 'zpool "
    "clear' (2.1 refuses it, later versions may hang it and every later "
    "zpool command: openzfs/zfs issues 19033, 19036). Reconnect the disks "
    "and reboot the host; plugging the SR in again imports the pool.")


def health(pool):
    return pool_health(pool)[1]
