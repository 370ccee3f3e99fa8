"""The space a mirrored zvol is guaranteed while tapdisk mirrors it.

Why. In mirror mode tapdisk marks the zvol's image TD_IGNORE_ENOSPC: on
ENOSPC it retires the zvol and goes on with the secondary alone
(tapdisk-vbd.c), whose reads it forwards to the next image, and there is
none: every guest read then returns zeros, and the guest's writes exist
only on the destination (measured on OpenZFS 2.3 through the real
tapdisk: a pool filled during a mirror). So a zvol must never run out of
space while mirrored. ``hold`` sets ``refreservation=auto`` (room to
write the whole disk anew, snapshots or not), after recording what it
was in ``meta.MIRROR_GUARD``; ``release`` puts it back. A pool without
that room refuses the hold (OutOfSpace), before tapdisk ever mirrors.

Crash safety: the record comes first and goes last, each one command.
The mirror job holds ``lock.reading(lock_name(zvol))`` while the guard
stands; the collector releases a guard no live job holds (a dom0 crash
mid-move), so a thin disk does not stay thick.
"""

from zfsng import errors, log, meta, zfs

LOCK_SUFFIX = "@zfsng-mirror-guard"


def lock_name(zvol):
    """The name the mirror job holds with lock.reading."""
    return zvol + LOCK_SUFFIX


def hold(zvol):
    """Guarantee the zvol room to be written whole; OutOfSpace (nothing
    changed) when its pool lacks it. Under the SR lock."""
    row = zfs.get_one(zvol, ["refreservation", meta.MIRROR_GUARD])
    if not row.get(meta.MIRROR_GUARD):
        zfs.set_props(zvol, {meta.MIRROR_GUARD:
                             row.get("refreservation") or "0"})
    try:
        zfs.set_props(zvol, {"refreservation": "auto"})
    except errors.OutOfSpace as exc:
        release(zvol)
        raise errors.OutOfSpace(
            "%s cannot be moved while its VM runs: its pool lacks the free "
            "space to guarantee the disk's writes while they are mirrored "
            "(room to write it whole: refreservation=auto). On a full pool "
            "tapdisk's mirror would serve the guest zeros. Free space on "
            "the pool, or move the VM halted (%s)" % (zvol, exc.message))
    log.info("%s: its writes guaranteed room while mirrored", zvol)


def release(zvol):
    """Put back the refreservation the guard replaced; nothing if there
    is no guard. Under the SR lock."""
    try:
        row = zfs.get_one(zvol, [meta.MIRROR_GUARD])
    except errors.DatasetNotFound:
        return
    before = row.get(meta.MIRROR_GUARD)
    if not before:
        return
    zfs.set_props(zvol, {"refreservation": before})
    zfs.inherit(zvol, meta.MIRROR_GUARD)
    log.info("%s: refreservation back to %s", zvol, before)
