"""Non-persistent disks (feature NONPERSISTENT): reset on every VM start.

xapi calls Datapath.open(persistent=false) at VM start and Datapath.close at
shutdown (epoch_begin, epoch_end). open takes the reset point
``<vol>@zfsng-nonpersistent``; close rolls the zvol back to it and destroys
it: the reset is instant, with no clone and no copy. The reset point is no
VDI (its inherited ``vdi`` value is the zvol's uuid, not its own name).

A reset left pending (host crash while the VM ran, so no close) is done by
the next open(persistent=false). An open(persistent=true) that finds one
(the disk was made persistent meanwhile) drops it and keeps the data: the
admin chose to keep what the disk holds.

Snapshots taken after the reset point. A backup's VDI snapshot, or the
internal snapshot of a live clone (VM copy, ``@zfsng-clone-<uuid>``), taken
while the VM ran, is newer than the reset point: ``zfs rollback`` refuses,
and with ``-r`` it would destroy them. The reset then *rotates* instead:

  1. ``zfs rename <vol> <sr>/<new uuid>``: the zvol, with all its snapshots,
     is set aside as A (in a thick SR, A's refreservation is dropped: it
     keeps what it holds, and the reservation goes to the new zvol);
  2. ``zfs clone -o <the VDI's properties> A@zfsng-nonpersistent <vol>``:
     the VDI again, at its reset content (``refreservation=auto`` if thick);
  3. ``zfs set org.xcp-ng.zfs-ng:vdi=destroyed
     org.xcp-ng.zfs-ng:aside-of=<vdi uuid> A``: A is hidden, its
     snapshots still the VDI's (a Volume.revert to them finds them);
  4. ``zfs promote <vol>``: the snapshots up to the reset point come back
     to <vol> under their names; A keeps the newer ones (and their clones),
     and is now a clone of ``<vol>@zfsng-nonpersistent``; the records of
     the bookmarks that moved with A follow them (revertsteps.repoint);
  5. ``zfs rename`` of that reset point to ``<vol>@zfsng-clone-<A uuid>``,
     then ``zfs destroy -d``: an internal snapshot ZFS frees with A.

The snapshot VDIs and clones keep the data they captured. A snapshot VDI's
key is unchanged; its dataset (and URI) is now ``A@<snapshot uuid>``, and
xapi stats a VDI before each attach. A is freed by the volume plugin's
collector when its last snapshot VDI or clone goes (zfsng.collect),
and the internal snapshot with it: nothing leaks.

The one case not handled: a thick disk whose new reservation does not fit
in the pool next to A (about what the VM wrote since the newest snapshot).
Steps 1 and 1b are undone, the disk keeps its pending reset point, and the
call fails with NonpersistentResetBlocked; the next open or close tries
again.

Crash repair: each step is one command, and the next open, close or attach
of the VDI (``repair``, ``_pending``) finishes what it finds:
  S1 after 1: no <vol>, and a zvol A of the SR carries the VDI's uuid under
     another name, with its reset point: go on from 2. Meanwhile the volume
     plugin lists A as the VDI (zfsng_volume.volume, "stand-in"), with the VDI's
     own URI, so xapi never loses it, and can stat and start it;
  S2' inside 2: ZFS makes the clone and sets its -o properties in later
     transaction groups (zfs_ioc_clone), so a power cut can leave <vol> a
     clone of A@zfsng-nonpersistent without any of the VDI's properties.
     A still carries the VDI and stays its stand-in (zfsng.meta.is_stand_in
     and is_unmarked_clone: the volume plugin lists A, and its collector
     may destroy that clone). The repair destroys it (nothing wrote to it:
     nothing is attached before the repair) and is back at S1; it never
     hides A before <vol> carries the VDI, so the keys are never lost;
  S2 after 2, S3 after 3: <vol> is a clone of A@zfsng-nonpersistent: go on
     from 3 (hide A if not yet) and 4;
  S4 after 4: <vol>@zfsng-nonpersistent has a clone: step 5; the reset is
     done;
  S5 after the rename of 5: an internal snapshot with its clone, not yet
     marked deferred: the collector marks it (or destroys it once A is gone).
Every function here runs with the VDI's datapath lock and the SR lock held.
"""

from zfsng import errors, log, meta, names, revertsteps, zfs

from zfsng_datapath import scope
from zfsng_datapath.errors import NonpersistentResetBlocked

# what the rotation's new zvol takes from the one set aside: the VDI's
# identity, and its CBT state (xapi still has CBT on for it)
_VDI_PROPS = [meta.VDI_UUID, meta.VDI_NAME, meta.VDI_DESCRIPTION,
              meta.VDI_KEYS, meta.VDI_SHARABLE, meta.CBT_ENABLED]
# what meta.is_unmarked_clone reads beyond scope.COLUMNS
_UNMARKED_COLUMNS = ["usedds", meta.DATAPATH_CLONE]


def _key(target):
    return target.head.rsplit("/", 1)[1]


def _thick(sr_row):
    return sr_row.get(meta.SR_PROVISIONING) == "thick"


# --- open and close ----------------------------------------------------------

def open_(target, sr_row, persistent):
    """Datapath.open of a live VDI (repaired and checked by prepare)."""
    snap = meta.reset_point(target.head)
    pending = _pending(target)
    if persistent:
        if pending:
            log.info("%s: the disk is persistent now: dropping the reset "
                     "point a host crash left, keeping the data", snap)
            zfs.destroy(snap)
        return
    if pending and _reset(target, sr_row):
        log.info("%s: back to the reset point before a new run", snap)
        return
    log.info("%s: reset point for a non-persistent run", snap)
    zfs.snapshot(snap)


def close(target, sr_row):
    """Datapath.close of a live VDI: the reset, if a reset point is set."""
    if not _pending(target):
        return   # persistent, or already closed
    log.info("%s: resetting the non-persistent disk", target.head)
    if _reset(target, sr_row):
        zfs.destroy(meta.reset_point(target.head))


def prepare(target):
    """Check the SR, finish a rotation a crash interrupted, then check the
    VDI; return the SR's row."""
    sr_row = scope.check_sr(target)
    repair(target, sr_row)
    scope.check_vdi(target)
    return sr_row


def _pending(target):
    """Whether a reset point is set. One with a clone is the end of a
    rotation a crash interrupted (S4): finished here, no longer pending."""
    found = scope.row(meta.reset_point(target.head), ["name", "clones"])
    if found is None:
        return False
    clones = [c for c in (found.get("clones") or "").split(",") if c]
    if clones:
        _retire(target, clones[0])
        return False
    return True


def _reset(target, sr_row):
    """Back to the reset point: True if by rollback (the reset point is
    still there), False if by rotation (it is gone)."""
    try:
        zfs.rollback(meta.reset_point(target.head))
        return True
    except errors.RollbackBlocked as exc:
        log.info("%s: snapshots were taken after the reset point; they "
                 "move to a hidden zvol (%s)", target.head,
                 exc.message.replace("\n", " "))
    _rotate(target, sr_row)
    return False


# --- the rotation ----------------------------------------------------------

def _rotate(target, sr_row):
    aside = meta.vdi_dataset(target.sr, names.new_uuid())
    log.info("%s: set aside as %s, reset from its reset point", target.head,
             aside)
    zfs.rename(target.head, aside)
    _recreate(target, aside, sr_row)
    _hide_and_promote(target, aside)
    _retire(target, aside)


def _recreate(target, aside, sr_row):
    """Steps 1b and 2: the VDI again, a clone of the reset point with the
    VDI's own properties; undone when a thick VDI's reservation does not
    fit (OutOfSpace)."""
    found = scope.row(aside, ["name"] + _VDI_PROPS)
    props = dict((p, found[p]) for p in _VDI_PROPS
                 if found.get(p) is not None)
    if _thick(sr_row):
        zfs.set_props(aside, {"refreservation": "none"})
        props["refreservation"] = "auto"
    try:
        zfs.clone(meta.reset_point(aside), target.head, props)
    except errors.OutOfSpace as exc:
        log.error("%s: no space to reset it next to its newer snapshots: "
                  "putting it back", target.head)
        if _thick(sr_row):
            zfs.set_props(aside, {"refreservation": "auto"})
        zfs.rename(aside, target.head)
        raise NonpersistentResetBlocked(
            "cannot reset the non-persistent disk %s now: the snapshots "
            "taken since its reset point are kept, and next to them the "
            "pool has too little free space for the reset disk (a thick "
            "disk needs its full reservation again): %s. Free some space, "
            "or destroy those snapshots; the next start or shutdown of the "
            "VM resets it" % (target.head, exc.message))


def _hide_and_promote(target, aside):
    """Steps 3 and 4."""
    found = scope.row(aside, ["name", meta.VDI_UUID])
    if found is not None and found.get(meta.VDI_UUID) == _key(target):
        zfs.set_props(aside, {meta.VDI_UUID: meta.HIDDEN,
                              meta.ASIDE_OF: _key(target)})
    zfs.promote(target.head)
    revertsteps.repoint(target.sr)


def _retire(target, clone):
    """Step 5: the reset point, which the hidden zvol now depends on,
    becomes an internal snapshot named after it, destroyed deferred."""
    internal = meta.internal_snapshot(target.head, meta.object_uuid(clone))
    log.info("%s: the reset point is now %s, freed with %s",
             target.head, internal, clone)
    zfs.rename(meta.reset_point(target.head), internal)
    zfs.destroy(internal, defer=True)


# --- crash repair ----------------------------------------------------------

def repair(target, sr_row):
    """Finish a rotation a crash left at S1, S2', S2 or S3 (S4 is
    _pending's). A revert's (zfsng/revertsteps.py) cut while the VDI's
    zvol was not back under its name is undone first."""
    found = scope.row(target.head, scope.COLUMNS + _UNMARKED_COLUMNS +
                      [meta.REVERTING])
    if (found is None or meta.is_unmarked_clone(found) or
            meta.reverting(found)) and \
            revertsteps.repair(target.sr, _key(target), _thick(sr_row)):
        found = scope.row(target.head, scope.COLUMNS + _UNMARKED_COLUMNS)
    if found is not None and meta.is_unmarked_clone(found) and \
            found["origin"].endswith("@" + meta.NONPERSISTENT_SNAPSHOT):
        log.warning("%s: a power cut left it a clone of %s without the "
                    "VDI's properties: made again", target.head,
                    found["origin"])
        zfs.destroy(target.head)
        found = None
    if found is None:
        aside = _set_aside(target)
        if aside is None:
            return   # no such VDI: the caller's check says so
        log.warning("%s: finishing a reset a crash interrupted (the disk is "
                    "at %s)", target.head, aside)
        _recreate(target, aside, sr_row)
        origin = meta.reset_point(aside)
    else:
        origin = found.get("origin") or ""
    if origin.endswith("@" + meta.NONPERSISTENT_SNAPSHOT):
        log.warning("%s: finishing a reset a crash interrupted (a clone of "
                    "%s)", target.head, origin)
        _hide_and_promote(target, origin.split("@", 1)[0])


def _set_aside(target):
    """The zvol a crash left set aside (S1): in the SR, carrying the VDI's
    uuid under another name, with its reset point."""
    for found in zfs.list_datasets(target.sr, ["name", meta.VDI_UUID],
                                   types="volume", depth=1):
        if found.get(meta.VDI_UUID) == _key(target) and \
                found["name"] != target.head and \
                scope.row(meta.reset_point(found["name"]), ["name"]) is not None:
            return found["name"]
    return None
