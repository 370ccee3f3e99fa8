"""A snapshot VDI reaches a guest through a read-only clone of it.

ZFS gives a snapshot a device node only with
``snapdev=visible`` on its zvol, which exposes every snapshot of that zvol
(the internal ones too), is a property of the live VDI shared by all its
snapshots (a reference count on someone else's property), and makes
``zfs destroy`` of an attached snapshot fail with "busy". zfs-ng instead
clones the snapshot: ``<sr>/<snapshot uuid>.ro``, ``readonly=on``, marked
with ``org.xcp-ng.zfs-ng:datapath-clone=<boot id>``. A clone costs no space
(read-only: it never diverges), gets its own /dev/zvol node, and keeps the
snapshot alive: Volume.destroy of an attached snapshot VDI is deferred by
ZFS (``zfs destroy -d``) until the clone goes at detach. The volume plugin
never lists it (its name is no uuid and it has no ``vdi`` property of its
own: a clone does not inherit the origin's local properties) nor collects
it. One clone serves every domain that attaches the snapshot; the last
detach destroys it. A clone no state file of this host uses (its detach
failed to destroy it, or the host crashed) is destroyed by the next attach,
detach, open or close in that SR, and the volume plugin's collector then
frees what it kept alive (a hidden parent). The clone is named after the
snapshot's uuid alone, and a state file is found by it too: a reset moves a
snapshot to another zvol (reset.py), which changes its URI, not its clone.
ZFS sets the -o properties of ``zfs clone`` after making the clone
(zfs_ioc_clone): a power cut between leaves it without ``readonly`` and
its mark, which no sweep looks for. The next attach of that snapshot marks
it and uses it; until then the volume plugin's collector may free it
(zfsng.meta.is_unmarked_clone).
"""

from zfsng import collect, errors, lock, log, meta, zfs
from zfsng_datapath import scope, state

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def _boot_id():
    try:
        with open(BOOT_ID_PATH) as f:
            return f.read().strip() or "unknown"
    except (IOError, OSError):
        return "unknown"


def name(target):
    return meta.clone_name(target.sr, target.snapshot)


def _is_our_clone(row, target):
    return meta.is_clone_of(row, target.sr, target.snapshot)


_CLONE_COLUMNS = ["name", "type", "origin", "usedds", meta.VDI_UUID,
                  meta.DATAPATH_CLONE]


def ensure(target):
    """Make (or adopt) the snapshot's clone; return (name, made_now).
    Caller holds the SR lock, and checked the snapshot is a VDI."""
    clone = name(target)
    boot = _boot_id()
    row = scope.row(clone, _CLONE_COLUMNS)
    if row is not None and meta.is_unmarked_clone(row):
        # a power cut inside our zfs clone: made, never marked nor used
        log.warning("%s: a power cut left it without its properties: "
                    "marked as this boot's clone of %s", clone,
                    target.dataset)
        zfs.set_props(clone, {"readonly": "on", meta.DATAPATH_CLONE: boot})
        return clone, True
    if row is not None:
        if not _is_our_clone(row, target):
            raise errors.DatasetExists(
                "%s exists and is not zfs-ng's clone of %s: rename or "
                "remove it" % (clone, target.dataset))
        if row[meta.DATAPATH_CLONE] != boot:
            # this boot's now
            zfs.set_props(clone, {meta.DATAPATH_CLONE: boot})
        return clone, False
    log.info("cloning %s to %s (read-only) for the datapath",
             target.dataset, clone)
    zfs.clone(target.dataset, clone,
              {"readonly": "on", meta.DATAPATH_CLONE: boot})
    return clone, True


def users(clone, but=None):
    return [s for s in state.all_states()
            if s.get("clone") == clone and
            (s.get("dataset"), s.get("domain")) != but]


def drop(target, clone, but=None):
    """Destroy the clone unless another domain still uses it. Never raises:
    what fails here is left for the next sweep."""
    if users(clone, but):
        log.info("%s still used by another domain: kept", clone)
        return
    try:
        with lock.sr_lock(target.sr):
            row = scope.row(clone, _CLONE_COLUMNS)
            dropped = False
            if row is not None:
                if not _is_our_clone(row, target):
                    log.warning("%s is not zfs-ng's clone of %s: left alone",
                                clone, target.dataset)
                else:
                    log.info("destroying the datapath clone %s", clone)
                    zfs.destroy(clone)
                    dropped = True
            sweep(target.sr, freed=dropped)
    except errors.StorageError as exc:
        log.warning("could not destroy %s (the next attach, detach, open or "
                    "close in this SR retries): %s", clone, exc.message)


def sweep(sr, keep=None, freed=False):
    """The collector's sweep of the datapath clones of sr that no state
    file of this host uses (collect.sweep_clones). Caller holds the SR
    lock; never raises."""
    used = set(st.get("clone") for st in state.all_states())
    used.add(keep)
    collect.sweep_clones(sr, used, freed=freed)
