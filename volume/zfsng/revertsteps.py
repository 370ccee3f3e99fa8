"""Volume.revert's steps on the pool, and how a crash between two of them
is finished or undone (by the revert called again, the collector, or the
datapath's next call on the VDI).

A revert gives a VDI the content of one of its snapshots and keeps the
VDI's identity: its uuid and name, its labels and keys, its CBT state, and
every other snapshot and clone. ``zfs rollback`` cannot: it only goes back
to the newest snapshot (``-r`` would destroy the newer ones, VDIs xapi
knows). So the zvol is *rotated*, as the datapath's reset of a
non-persistent disk rotates it (zfsng_datapath/reset.py), each step one
command, no data copied whatever the disk's size:

  1. ``zfs set REVERTING=<vdi>@<snapshot> <vol>``: what is being done;
  2. ``zfs rename <vol> <sr>/<new uuid>``: the zvol and all its snapshots
     are set aside as A (A keeps the VDI's uuid: its stand-in,
     ``meta.is_stand_in``);
  3. ``zfs clone -o <the VDI's properties> A@<snapshot> <vol>``: the VDI
     again, with the snapshot's content and size (``refreservation=auto``
     on a thick SR, A's dropped just before);
  4. ``zfs set vdi=destroyed aside-of=<vdi> A``: A is hidden, and known
     as the VDI's (``meta.snapshot_of``);
  5. ``zfs promote <vol>``: the snapshot and the older ones come back to
     <vol> under their names; A keeps the newer ones (and their clones)
     and is now a clone of ``<vol>@<snapshot>``, freed by the collector
     once nothing needs it; 5b: the records of the bookmarks that moved
     with A (data-destroyed snapshot VDIs') follow them (``repoint``);
  6. ``zfs inherit REVERTING A``: done.

A snapshot an earlier revert (or a reset's rotation) moved is on a zvol
B set aside then (hidden, ``aside-of`` the VDI): step 3 clones
``B@<snapshot>``, and step 5 promotes <vol> as long as its origin is on
such a zvol of the VDI's (B, then what B was cloned from, ...): each
promote brings the snapshots up to the origin back to <vol>, until <vol>
is no clone of the VDI's own set-aside zvols, which the collector frees
once nothing else needs them. The clone is the snapshot's data exactly,
wherever it is.

A crash before <vol> is back with the VDI's properties (after 1, 2, or
inside 3: a clone without them, ``meta.is_unmarked_clone``) is undone:
A gets its name back and, on a thick SR, its reservation (dropped before
3), and only then does the mark go. From 3 on the VDI is reverted: the
rest is finished forward, by the revert itself or, when one of 4 to 6
fails or a crash cuts them, by ``finish`` (the collector's, at the next
Volume.revert, Volume.destroy or SR.attach). Callers hold the SR lock.
"""

from zfsng import errors, log, meta, names, zfs

# What the new zvol takes from the one set aside: the VDI's identity, and
# whether changed blocks are tracked (the snapshots keep their own).
VDI_PROPS = [meta.VDI_UUID, meta.VDI_NAME, meta.VDI_DESCRIPTION,
             meta.VDI_KEYS, meta.VDI_SHARABLE, meta.CBT_ENABLED]


def revert(vol_row, snapshot, thick):
    """Steps 1 to 6 for the VDI whose zvol row is vol_row, to its snapshot
    named snapshot (on that zvol, or on one set aside for it). A clone
    that does not fit (OutOfSpace: a thick disk needs its reservation
    twice meanwhile) is undone and raised."""
    vol = vol_row["name"]
    key = vol_row[meta.VDI_UUID]
    snap = meta.object_uuid(snapshot)
    zfs.set_props(vol, {meta.REVERTING: "%s@%s" % (key, snap)})
    aside = meta.vdi_dataset(vol.rsplit("/", 1)[0], names.new_uuid())
    log.info("revert %s to @%s: set aside as %s", vol, snap, aside)
    try:
        zfs.rename(vol, aside)
    except errors.StorageError:
        zfs.inherit(vol, meta.REVERTING)
        raise
    props = dict((p, vol_row[p]) for p in VDI_PROPS
                 if vol_row.get(p) is not None)
    if thick:
        zfs.set_props(aside, {"refreservation": "none"})
        props["refreservation"] = "auto"
    source = "%s@%s" % (aside, snap) \
        if meta.parent_of(snapshot) == vol else snapshot
    try:
        zfs.clone(source, vol, props)
    except errors.StorageError:
        log.error("revert %s: the clone failed, putting the disk back", vol)
        _undo(aside, vol, thick)
        raise
    _forward_or_leave(aside, vol, key)


def _forward_or_leave(aside, vol, key):
    """Steps 4 to 6 once the clone is in place. The VDI is reverted then
    (its name, identity and content are the snapshot's), so a failure here
    is logged, not raised: xapi would take the revert for failed and stop
    reverting the VM's other disks. The mark stays on aside, and
    ``finish`` does what is left at the next collect."""
    try:
        _forward(aside, vol, key)
    except errors.StorageError as exc:
        log.warning("revert %s: done, but setting %s aside is not finished "
                    "(%s); the next Volume.revert, Volume.destroy or "
                    "SR.attach on this SR finishes it", vol, aside,
                    exc.message)


def finish(row, present, thick):
    """Finish or undo the revert the zvol row carries REVERTING for (a
    crash's). present: the SR's rows by name. Whether it changed
    anything."""
    key, snap = meta.reverting(row)
    vol = meta.vdi_dataset(row["name"].rsplit("/", 1)[0], key)
    named = present.get(vol)
    if row["name"] == vol:                    # after 1, or inside _undo
        log.warning("revert %s: cut before it began, undone", vol)
        _restore_reservation(row, thick)
        zfs.inherit(vol, meta.REVERTING)
    elif named is None:                       # after 2
        if row.get(meta.VDI_UUID) == key:
            log.warning("revert %s: cut after the disk was set aside as "
                        "%s, undone", vol, row["name"])
            _undo(row["name"], vol, thick)
        else:                                 # destroyed meanwhile
            zfs.inherit(row["name"], meta.REVERTING)
    elif meta.is_unmarked_clone(named):       # inside 3: the collector's
        return False
    else:                                     # after 3, 4 or 5
        log.warning("revert %s: cut after the clone, finished", vol)
        _forward(row["name"], vol, key, row)
    return True


def repair(sr, key, thick):
    """For the datapath, before it serves VDI key: undo a revert a crash
    left before the VDI's zvol was back under its name (its name free, or
    on a clone without the VDI's properties), or cut with the zvol under
    its name still marked (before the revert began, or inside its undo:
    a thick disk may then lack its reservation, which the VM must not
    run without until the next collect). Whether it did."""
    rows = zfs.list_datasets(sr, meta.VOLUME_COLUMNS, types="volume",
                             depth=1)
    present = dict((r["name"], r) for r in rows)
    vol = meta.vdi_dataset(sr, key)
    for row in rows:
        found = meta.reverting(row)
        if not found or found[0] != key:
            continue
        if row["name"] == vol:
            return finish(row, present, thick)
        named = present.get(vol)
        if named is not None and meta.is_unmarked_clone(named) and \
                named.get("origin") == meta.revert_source(
                    row["name"], found[1], present):
            log.warning("revert %s: a clone cut before its properties, "
                        "destroyed", vol)
            zfs.destroy(vol)
            del present[vol]
        if vol not in present:
            return finish(row, present, thick)
    return False


def _undo(aside, vol, thick):
    """The zvol set aside back under its name, its reservation back, then
    the mark gone: a crash or a failure before the last step leaves the
    mark, and ``finish`` restores the reservation."""
    zfs.rename(aside, vol)
    if thick:
        zfs.set_props(vol, {"refreservation": "auto"})
    zfs.inherit(vol, meta.REVERTING)


def _restore_reservation(row, thick):
    """A thick SR's VDI whose revert was undone after its reservation was
    dropped (step 3's room) and before it was set again: set again, or the
    disk would stay thin for good. One the admin changed by hand (not
    none) is left as it is. OutOfSpace is raised, the mark kept: the next
    call tries again."""
    if thick and row.get("refreservation") in (None, "0", "none"):
        log.warning("revert %s: undone; its reservation is set again",
                    row["name"])
        zfs.set_props(row["name"], {"refreservation": "auto"})


def _forward(aside, vol, key, row=None):
    """Steps 4 to 6; row, the row of aside when a crash's (else it is as
    revert left it)."""
    if row is None or row.get(meta.VDI_UUID) != meta.HIDDEN or \
            row.get(meta.ASIDE_OF) != key:
        zfs.set_props(aside, {meta.VDI_UUID: meta.HIDDEN,
                              meta.ASIDE_OF: key})
    _promote(vol, key)
    repoint(vol.rsplit("/", 1)[0])
    zfs.inherit(aside, meta.REVERTING)


def repoint(sr):
    """Step 5b. A data-destroyed snapshot VDI's bookmark lives in its
    zvol: the rename of step 2 takes it to the zvol set aside (a promote
    brings those up to its origin back). Its record (CBT_BOOKMARK, on
    the VDI's empty zvol) is set to where it is now, found by its name
    (the snapshot's uuid, unique in the SR): list_changed_blocks reads
    from it, and the collector keeps the zvol it is on. One listing of
    each kind, a ``zfs set`` per record moved; done again after a crash
    (before step 6)."""
    where = {}
    for row in zfs.list_datasets(sr, ["name"], types="bookmark"):
        where[row["name"].partition("#")[2]] = row["name"]
    for row in zfs.list_datasets(sr, ["name", meta.CBT_BOOKMARK],
                                 types="volume", depth=1):
        mark = row.get(meta.CBT_BOOKMARK) or ""
        now = where.get(mark.partition("#")[2])
        if "#" in mark and now and now != mark:
            log.info("%s: its bookmark is now %s", row["name"], now)
            zfs.set_props(row["name"], {meta.CBT_BOOKMARK: now})


def _promote(vol, key):
    """Step 5: promote vol while it is a clone of a snapshot on a zvol set
    aside for the VDI key (hidden, ASIDE_OF key): the snapshots up to its
    origin come back to it each time. A promote done before a crash is
    not done twice: its origin is then elsewhere, or none."""
    for _ in range(ROUNDS):
        origin = zfs.get_one(vol, ["origin"]).get("origin") or ""
        if "@" not in origin:
            return
        head = zfs.get_one(meta.parent_of(origin), [meta.VDI_UUID,
                                                    meta.ASIDE_OF])
        if head.get(meta.VDI_UUID) != meta.HIDDEN or \
                head.get(meta.ASIDE_OF) != key:
            return
        zfs.promote(vol)
    raise errors.ZfsError("revert %s: still a clone of a zvol set aside "
                          "after %d promotes" % (vol, ROUNDS))


ROUNDS = 64   # bound on a chain of zvols set aside
