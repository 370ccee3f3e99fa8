"""Volume.revert: a VDI back to one of its snapshots, keeping its identity.

xapi (VDI.revert, from xen-api v26.1.14 and v26.16.0; the SMAPIv3
interface's ``Volume.revert(dbg, sr, snapshot, key)``, result unit) calls
it for each disk of a VM reverted to a snapshot, once the VM is halted
(VM.revert hard-shuts a running VM down first, and refuses a VDI with a
VBD attached): ``snapshot`` is the snapshot VDI's key, ``key`` the VDI's
uuid, which is its key here. xapi calls nothing after it; the VDI keeps
its record. A xapi without VDI.revert (XCP-ng 8.3's v26.1.4) reverts a VM
the old way, a clone of the snapshot and the disk destroyed, which keeps
working.

The snapshot may be on the VDI's zvol, or on a zvol an earlier revert or
a reset of a non-persistent disk set aside, with the snapshots newer than
the one it went back to (``meta.snapshot_of``): xapi still lists those as
the VDI's snapshots, and reverts to them like to any other.

Instant whatever the disk's size, and kept: the VDI's uuid, name,
description, keys and CBT state, every other snapshot (newer ones too)
and every clone. The steps and their crash repair are
``zfsng/revertsteps.py``'s. The disk's size becomes the snapshot's.

Once the clone is in place the VDI is reverted, and the call answers
success whatever fails after it (steps 4 to 6, the collector): xapi takes
a failed revert for a reason to stop reverting the VM's other disks. What
is left is finished by the next collect (revertsteps.finish, collect).
"""

from zfsng import collect, errors, inventory, log, meta, revertsteps, \
    wire, zvoldev
from zfsng_volume import volume as vol


@wire.method("Volume.revert")
def revert(dbg, sr, snapshot, key):
    with vol.locked(sr):
        sr_row = inventory.sr_row(sr)
        rows = inventory.rows(sr)
        if collect.needed(rows):      # a revert a crash cut short first
            rows = _collect_before(sr, key, rows)
        row, snap = _pair(sr, rows, snapshot, key)
        users = zvoldev.openers(row["name"])
        if users:
            raise errors.VdiInUse(
                "Volume.revert: %s is in use (processes %s hold it open): "
                "shut its VM down first" % (key, ", ".join(
                    str(p) for p in users)))
        revertsteps.revert(row, snap["name"],
                           sr_row.get(meta.SR_PROVISIONING) == "thick")
        _collect_after(sr, key)
    return None


def _collect_before(sr, key, rows):
    """Finish what a crash cut short before reverting: the SR's rows
    after it. Another dataset's garbage that cannot be freed now (busy,
    say) is logged and left, since xapi fails the VM's whole revert on
    any error, leaving a VM with several disks half reverted; only a
    revert of this very VDI still cut short refuses the call, nothing
    changed."""
    try:
        collect.collect(sr, rows)
    except errors.StorageError as exc:
        rows = inventory.rows(sr)
        if any((meta.reverting(r) or ("",))[0] == key for r in rows):
            raise
        log.warning("Volume.revert %s: the collector failed on other "
                    "datasets (%s); reverting anyway", key, exc.message)
        return rows
    return inventory.rows(sr)


def _collect_after(sr, key):
    """Free the zvol set aside if nothing needs it. The VDI is reverted
    already: a failure (of any garbage's, not only this revert's) is
    logged, and the next collect frees what is left."""
    try:
        collect.collect(sr)
    except errors.StorageError as exc:
        log.warning("Volume.revert %s: reverted, but freeing what it set "
                    "aside failed (%s); the next collect on %s frees it",
                    key, exc.message, sr)


def _pair(sr, rows, snapshot, key):
    """The VDI's and the snapshot's rows, once the one can be reverted to
    the other: a typed error, and nothing changed, otherwise."""
    row, snap = vol.find_in(rows, key), vol.find_in(rows, snapshot)
    if meta.is_snapshot(row) or meta.is_data_destroyed(row) or \
            row["name"] != meta.vdi_dataset(sr, key):
        raise errors.InvalidArgument(
            "Volume.revert: %s is not a disk (a snapshot, or a disk being "
            "reset or composed)" % key)
    if meta.is_data_destroyed(snap):
        raise errors.DataDestroyed(
            "Volume.revert: the data of snapshot %s was destroyed (kept "
            "for changed block tracking only)" % snapshot)
    present = dict((r["name"], r) for r in rows)
    if not meta.is_snapshot(snap) or \
            not meta.snapshot_of(snap, row, present):
        raise errors.InvalidArgument(
            "Volume.revert: %s is not a snapshot of %s" % (snapshot, key))
    if any(r["name"] == meta.reset_point(row["name"]) for r in rows):
        raise errors.InvalidArgument(
            "Volume.revert: %s is a non-persistent disk whose reset is "
            "pending (its VM did not shut down cleanly): start and shut "
            "down the VM, or make the disk persistent, first" % key)
    return row, snap
