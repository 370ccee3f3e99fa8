"""Changed block tracking: Volume.enable_cbt, disable_cbt,
list_changed_blocks and data_destroy, answered from ZFS itself.

Nothing is tracked while guests write. ZFS stamps every block pointer
with the transaction group that wrote it, and a block of ``to`` born at or
before ``from``'s txg is the block ``from`` had there. So the changes are
read from ``to``'s block pointers (``blockbirth``: ``zdb -ddddd``, its
indirect blocks only, never the data): the data blocks born after
``from`` (writes), and the places where ``to`` has no data block (holes,
frees). The stamps are on the pool, so a crash loses nothing. The cost
grows with the blocks ``to`` holds, not with the bytes changed; the bound
of the read grows with the disk (``_allow``), and no SR lock is held
while it runs. When zdb cannot answer, an incremental ``zfs send`` (which
visits exactly the blocks born between the two, as replication relies on,
but reads their data) gives the same writes and frees (``sendstream``).

What changed between ``from`` and ``to``:
- every write: data born since ``from`` (zeros written over data are
  holes under compression, so they come as frees, below);
- every free where ``from`` may have held data. A free only says "``to``
  has a hole here": streams also carry frees over never-written space
  (sendstream's docstring). So zfs-ng keeps, per snapshot, an
  *allocation map*: a set of ranges that holds every byte the snapshot
  has data in (``meta.CBT_MAP``). The map of ``to`` is its data blocks
  as zdb lists them (from a stream: ``(map(from) - frees) + writes``);
  list_changed_blocks stores it on ``to``. A snapshot without a map (the
  first of a chain) gets one the same way (else from a full ``zfs send``
  of itself, its data read once), kept on it; if that cannot be had, the
  end of its last block (``zdb.data_end``), else its size, bounds it.
  Xen Orchestra data-destroys each snapshot right after its backup, so
  the base of every list is a bookmark: the map is all there is to know
  where it held data, and that first map is taken before its data goes.
The map may over-state a snapshot's data (``blockmap.encode_map`` fills
gaps to fit a property), never under-state it: over-stating only reports
more blocks, so no change is ever missed.

data_destroy frees a snapshot's data and keeps what list_changed_blocks
needs: a bookmark ``<vol>#<uuid>`` (its place in the zvol's history, a
valid send source) and an empty zvol ``<sr>/<uuid>`` (volmode=none, no
device) with the VDI's properties and map, so the VDI stays listed, its
keys settable, as xapi expects (it marks it ``cbt_metadata``). A snapshot
that never got a map gets one then, while it can still be read: outside
the SR lock (it may take as long as a list), the snapshot held with
``lock.reading`` and checked again, under the SR lock, before anything
changes. The order keeps a crash safe: bookmark, then the empty zvol
(while the snapshot is still there it is the VDI: ``meta.vdi_rows``),
then the snapshot goes.
Volume.destroy of such a VDI removes the bookmark and the empty zvol.
"""

from zfsng import blockmap, contentid, errors, inventory, lock, log, meta, \
    names, runner, values, wire, zdb, zfs
from zfsng_volume import volume as vol


def _rows_and(sr, *keys):
    """The SR's listing and the rows of keys in it."""
    inventory.sr_row(sr)
    rows = inventory.rows(sr)
    return [rows] + [vol.find_in(rows, key) for key in keys]


@wire.method("Volume.enable_cbt")
def enable_cbt(dbg, sr, key):
    _set_enabled(sr, key, True)


@wire.method("Volume.disable_cbt")
def disable_cbt(dbg, sr, key):
    """Stops tracking: the VDI's snapshots taken from now on carry no
    map. The maps of its snapshots go (they are only CBT's); the
    data-destroyed snapshot VDIs stay, they are VDIs xapi knows."""
    _set_enabled(sr, key, False)


def _set_enabled(sr, key, on):
    with lock.sr_lock(sr):
        rows, row = _rows_and(sr, key)
        if meta.is_data_destroyed(row):
            raise errors.DataDestroyed(
                "VDI %s is a data-destroyed snapshot: its tracking cannot "
                "change" % key)
        log.info("%s changed block tracking on %s",
                 "enabling" if on else "disabling", row["name"])
        zfs.set_props(row["name"], {meta.CBT_ENABLED: values.encode_bool(on)})
        if not on and not meta.is_snapshot(row):
            present = dict((r["name"], r) for r in rows)
            for snap in rows:      # a revert may have set some aside
                if meta.is_snapshot(snap) and \
                        meta.snapshot_of(snap, row, present):
                    _drop_map(snap["name"])


def _drop_map(name):
    try:
        if zfs.get_one(name, [meta.CBT_MAP]).get(meta.CBT_MAP):
            zfs.inherit(name, meta.CBT_MAP)
    except errors.DatasetNotFound:
        pass


@wire.method("Volume.data_destroy")
def data_destroy(dbg, sr, key):
    """The snapshot's map is read outside the SR lock (a full zdb read,
    up to an hour per TiB; a zfs send if zdb cannot answer), as
    list_changed_blocks reads: Xen Orchestra calls this after every
    backup, and VM starts, stops and snapshots on the SR would wait past
    lock.WAIT and fail SrBusy. lock.reading holds the snapshot meanwhile,
    as cbt's own snapshots are held (a repeated call waits for it). The
    SR lock is taken to check, and again to check that the snapshot
    mapped is still the VDI's and to change the pool; a change in between
    (a destroy, a revert) fails the call typed, with nothing changed."""
    with lock.sr_lock(sr):
        found = _destroyable(sr, key)
        if found is None:
            return None
        row = found[1]
        txg = zfs.createtxg(row["name"])
    with lock.reading(row["name"]):
        ranges = _read_map(row)
        with lock.sr_lock(sr):
            _commit(sr, key, row, txg, ranges)
    return None


def _commit(sr, key, mapped, txg, ranges):
    """data_destroy's changes, once the VDI's snapshot is still the one
    mapped (mapped: its row then; txg: its createtxg then)."""
    found = _destroyable(sr, key)
    if found is None:
        return
    rows, row = found
    _unchanged(mapped, row, txg, ranges)
    _keep_metadata(sr, rows, row, ranges)
    log.info("destroying the data of %s", row["name"])
    zfs.destroy(row["name"], defer=bool(meta.clones_of(row)))


def _destroyable(sr, key):
    """(rows, row) of the snapshot VDI key once its data can be destroyed,
    None if it is already: a typed error otherwise, nothing changed."""
    rows, row = _rows_and(sr, key)
    if meta.is_data_destroyed(row):
        log.info("%s: data already destroyed", key)
        return None
    if not meta.is_snapshot(row):
        raise errors.InvalidArgument(
            "VDI %s is not a snapshot: only a snapshot's data can be "
            "destroyed (its metadata kept for changed block tracking)"
            % key)
    if row.get(meta.CBT_ENABLED) != "true":
        raise errors.CbtNotEnabled(
            "snapshot %s was taken without changed block tracking: "
            "destroy it instead" % key)
    return rows, row


def _read_map(row):
    """The snapshot's map (made now if it has none, while it can still
    be read; not kept on it: a call that fails changes nothing), or None
    if the snapshot went meanwhile (``_unchanged`` says how)."""
    try:
        return _map_of(row, keep=False)
    except errors.DatasetNotFound:
        return None


def _unchanged(before, now, txg, ranges):
    """Raise SnapshotChanged unless the VDI's snapshot (now) is the one mapped
    (before): another call may have renamed it while it was read (a
    revert sets its zvol aside) or destroyed it and taken another by its
    name (a later createtxg). A destroyed VDI fails earlier
    (Volume_does_not_exist). A retry maps it again."""
    if ranges is None or now["name"] != before["name"] or \
            zfs.createtxg(now["name"]) != txg:
        raise errors.SnapshotChanged(
            "snapshot %s changed while its allocation map was read "
            "(another call on the SR); its data was not destroyed: try "
            "again" % before["name"])


def _keep_metadata(sr, rows, row, ranges):
    """The bookmark and the empty zvol that stand for the snapshot once
    its data is gone; either may exist already (a repeated call). The zvol
    is made as Volume.create makes one, under <sr>/<uuid>.new and renamed
    once whole: ZFS sets the -o properties after making the zvol, and a
    power cut between must not leave a bare <sr>/<uuid> that a repeated
    call would take for the stub, destroying the snapshot and with it the
    VDI's metadata (meta.is_unfinished_create)."""
    mark = meta.bookmark(row["name"])
    try:
        zfs.bookmark(row["name"], mark)
    except errors.DatasetExists:
        pass
    stub = meta.vdi_dataset(sr, row[meta.VDI_UUID])
    props = _vdi_metadata(row)
    if any(r["name"] == stub for r in rows):
        # Made by a call killed before it destroyed the snapshot, which
        # stayed the VDI meanwhile (meta.vdi_rows): xapi may have set keys
        # or a name on it since. They go to the stub again.
        log.info("%s: left by an interrupted data_destroy, its metadata "
                 "copied again", stub)
        zfs.set_props(stub, props)
        return
    creating = meta.creating_name(sr, row[meta.VDI_UUID])
    if any(r["name"] == creating for r in rows):
        log.info("%s: left by an interrupted data_destroy, made again",
                 creating)
        zfs.destroy(creating)
    props[meta.CBT_MAP] = blockmap.encode_map(ranges, values.MAX_VALUE)
    props.update({meta.CBT_ENABLED: "true", meta.CBT_BOOKMARK: mark,
                  "volmode": "none", "volblocksize": row["volblocksize"] or
                  _volblocksize(meta.parent_of(row["name"]))})
    log.info("keeping the metadata of %s in %s", row["name"], stub)
    zfs.create_volume(creating, int(row["volsize"]), props, sparse=True)
    zfs.rename(creating, stub)


def _vdi_metadata(row):
    """The properties that make the VDI what xapi knows: its uuid, name,
    description, keys, sharable, and the content_id it reports."""
    props = dict((k, row[k]) for k in (meta.VDI_UUID, meta.VDI_NAME,
                                       meta.VDI_DESCRIPTION, meta.VDI_KEYS,
                                       meta.VDI_SHARABLE) if row.get(k))
    props[meta.CONTENT_ID] = contentid.encode(contentid.reported(row),
                                              row[meta.VDI_UUID])
    return props


def _volblocksize(zvol):
    return zfs.get_one(zvol, ["volblocksize"])["volblocksize"]


# --- list_changed_blocks ---------------------------------------------------------

@wire.method("Volume.list_changed_blocks")
def list_changed_blocks(dbg, sr, key, key2, offset, length):
    rows, base, target = _rows_and(sr, key, key2)
    source = _source(base, key)
    if meta.is_data_destroyed(target):
        raise errors.DataDestroyed(
            "VDI %s has no data to compare with: its data was destroyed"
            % key2)
    size = int(target["volsize"])
    start, stop = _window(offset, length, size)
    block = _block_of(target)
    known = _map_of(base)
    if meta.is_snapshot(target):
        changed, found = _changes(source, target["name"], known, size,
                                  block)
        _keep_map(target["name"], found)
    else:
        changed = _changes_to_live(sr, source, target["name"], known, size,
                                   block)
    window = blockmap.intersect(changed, [(start, stop)])
    relative = [(a - start, b - start) for a, b in window]
    log.info("changed blocks %s -> %s: %d of %d blocks (%d bytes changed)",
             source, target["name"], blockmap.blocks_in(window),
             (stop - start + blockmap.GRANULARITY - 1) //
             blockmap.GRANULARITY, blockmap.total(changed))
    return {"granularity": blockmap.GRANULARITY,
            "bitmap": wire.LongString(
                lambda: blockmap.encoded_bitmap(relative, stop - start))}


def _block_of(row):
    """The volblocksize of a zvol or of a snapshot's zvol."""
    return int(row.get("volblocksize") or
               _volblocksize(meta.parent_of(row["name"])))


# Bounds of the commands that list, from what they must read. zdb reads
# the block pointers of the snapshot's data (128 bytes each, in indirect
# blocks: _pointers); a host does millions a second, 20000 a second is a
# pool many times slower than any healthy one. zfs send (when zdb cannot
# answer) reads the changed data itself: 20 MiB/s of scattered reads is a
# slow disk. Past the call's deadline, the call's is raised to fit (xapi waits
# without limit; no SR lock is held meanwhile).
ZDB_RATE = 20000        # block pointers a second
SEND_RATE = 20 << 20    # bytes a second
AFTER_READ = 60.0       # seconds kept for what follows the read


def _changes(source, snapshot, known, size, block):
    """(changed, map): the ranges that differ between source (a snapshot
    or bookmark, where known says it may hold data) and snapshot, and the
    snapshot's allocation map. From the birth times of snapshot's block
    pointers (blockbirth: metadata only); from an incremental zfs send
    (which reads the changed data) if zdb cannot answer."""
    txg, common = _history(source, snapshot)
    if common is not None:
        found = _across(source, snapshot, known, common, size, block)
        if found is not None:
            return found
    try:
        born, data = zdb.born_since(txg or 0, snapshot, block, _allow(
            ZDB_RATE, _pointers(snapshot, size, block)))
        if txg is None:
            return blockmap.union(known, data), data
        return blockmap.union(born, blockmap.subtract(known, data)), data
    except errors.CommandTimeout:
        raise
    except errors.StorageError as exc:
        log.warning("zdb could not list the changes of %s (%s): sending "
                    "them instead", snapshot, exc.message)
    if txg is None:
        return [(0, size)], [(0, size)]
    writes, frees = zfs.send_changes(source, snapshot,
                                     bound=_allow(SEND_RATE, size))
    return (blockmap.union(writes, blockmap.intersect(frees, known)),
            blockmap.union(blockmap.subtract(known, frees), writes))


def _pointers(snapshot, size, block):
    """At most how many block pointers zdb prints for snapshot: one per
    block of the disk, and at most one indirect block's worth (1024) per
    data block it holds (only the indirect blocks over data are read, a
    hole's children are not)."""
    held = int(zfs.get_one(snapshot, ["logicalreferenced"])[
        "logicalreferenced"] or 0)
    return min(size // block, 1024 * (held // block + 1))


def _allow(rate, work):
    return runner.allow(rate, work, AFTER_READ)


def _history(source, snapshot):
    """(txg, common). txg: source's txg, once sure that source is in
    snapshot's history (an earlier snapshot or bookmark of its zvol, or of
    the zvols it was cloned from, before the clone): the birth times
    answer from it alone. ZFS's own check of an incremental send, done
    here.

    Else common: the last txg both histories share. A snapshot taken
    before a Volume.revert to an older one is on the zvol set aside (and
    its bookmark may be), out of the disk's history since; both go back
    to the snapshot the revert cloned from, where their histories meet
    (``_across``). (None, None) when source is gone (history lost):
    ``_changes`` then lists every range either may hold, more than
    changed, never less. A source of another disk is refused."""
    try:
        txg = zfs.createtxg(source)
    except errors.DatasetNotFound:
        log.info("%s is gone (moved by a revert): listing every range "
                 "either may hold", source)
        return None, None
    mine = source.split("@", 1)[0].split("#", 1)[0]
    theirs = {}
    for zvol, limit, strict in _lineage(meta.parent_of(snapshot),
                                        zfs.createtxg(snapshot)):
        theirs.setdefault(zvol, limit)
        if mine == zvol:
            if txg < limit or (txg == limit and not strict):
                return txg, None
            break
    for zvol, limit, _ in _lineage(mine, txg):
        if zvol in theirs:
            common = min(limit, theirs[zvol])
            log.info("%s is not in the history of %s (a revert in "
                     "between): both go back to %s at txg %d", source,
                     snapshot, zvol, common)
            return None, common
    raise errors.ZfsError("cannot list the changes from %s to %s: %s is "
                          "not an earlier snapshot of its disk"
                          % (source, snapshot, source))


def _across(source, snapshot, known, common, size, block):
    """(changed, map) between source and snapshot whose histories part
    after txg common (a revert between them), or None when it cannot be
    read (the caller lists every range either may hold).

    A block born at or before common, in either, is the block the shared
    history had there. So a place is unchanged where both hold such a
    block, or where neither holds data; every other place may differ.
    source's blocks are read from source itself; a bookmark's (its data
    destroyed) from the zvol it is on when that is hidden (set aside by
    the revert: nothing writes to it, and no rollback went past the
    bookmark, which ZFS refuses): a block of the zvol born at or before
    common was source's too. Where source held data is then its map
    (known), which holds every byte it had."""
    reference = _reference(source)
    if reference is None:
        log.info("%s: its zvol is in use, listing every range either may "
                 "hold", source)
        return None
    try:
        born, data = zdb.born_since(common, snapshot, block, _allow(
            ZDB_RATE, _pointers(snapshot, size, block)))
        their_born, theirs = zdb.born_since(common, reference, block, _allow(
            ZDB_RATE, _pointers(reference, size, block)))
    except errors.CommandTimeout:
        raise
    except errors.StorageError as exc:
        log.warning("zdb could not list the blocks of %s and %s since txg "
                    "%d (%s)", reference, snapshot, common, exc.message)
        return None
    held = theirs if reference == source else known
    shared = blockmap.intersect(blockmap.subtract(data, born),
                                blockmap.subtract(theirs, their_born))
    return blockmap.subtract(blockmap.union(held, data), shared), data


def _reference(source):
    """What source's blocks are read from: itself (a snapshot); for a
    bookmark, the zvol it is on if that zvol is hidden, else None."""
    if "#" not in source:
        return source
    zvol = source.split("#", 1)[0]
    try:
        row = zfs.get_one(zvol, [meta.VDI_UUID])
    except errors.DatasetNotFound:
        return None
    return zvol if row.get(meta.VDI_UUID) == meta.HIDDEN else None


def _lineage(zvol, txg):
    """Yield (zvol, txg, strict): zvol up to txg, then each zvol it was
    cloned from, up to its origin snapshot (included: not strict)."""
    strict = True
    for _ in range(ROUNDS):
        yield zvol, txg, strict
        origin = zfs.get_one(zvol, ["origin"]).get("origin")
        if not origin:
            return
        zvol, txg, strict = meta.parent_of(origin), zfs.createtxg(origin), \
            False


ROUNDS = 64   # bound on a chain of clones


def _source(base, key):
    """What the stream starts from: the snapshot, or the bookmark that
    replaced it."""
    if meta.is_data_destroyed(base):
        return _bookmark_now(base[meta.CBT_BOOKMARK])
    if not meta.is_snapshot(base):
        raise errors.InvalidArgument(
            "VDI %s is not a snapshot: changed blocks are listed from a "
            "snapshot to a later snapshot (or the disk itself)" % key)
    return base["name"]


def _bookmark_now(mark):
    """Where a data-destroyed VDI's bookmark is: its record, or, if a
    revert or reset moved it with its zvol and the record is not yet
    updated (revertsteps.repoint), the bookmark of the same name in the
    SR. The record if neither is there (its history is gone)."""
    try:
        zfs.createtxg(mark)
        return mark
    except errors.DatasetNotFound:
        pass
    sr = mark.rsplit("/", 1)[0]
    for row in zfs.list_datasets(sr, ["name"], types="bookmark"):
        if row["name"].partition("#")[2] == mark.partition("#")[2]:
            return row["name"]
    return mark


def _window(offset, length, size):
    """The part of the disk asked for: xapi asks for all of it (offset 0,
    length -1)."""
    stop = size if length < 0 else min(size, offset + length)
    if offset < 0 or offset % blockmap.GRANULARITY or offset > size:
        raise errors.InvalidArgument(
            "offset %d must be a multiple of %d within the disk (%d bytes)"
            % (offset, blockmap.GRANULARITY, size))
    return offset, max(offset, stop)


def _map_of(base, keep=True):
    """The ranges where base may hold data: its map; else, for a
    snapshot, its data from a full send (kept as its map if keep), or a
    bound."""
    name = base["name"]
    text = zfs.get_one(name, [meta.CBT_MAP]).get(meta.CBT_MAP)
    if text:
        try:
            return blockmap.decode_map(text)
        except errors.MetadataUnreadable as exc:
            log.warning("%s: %s; made again", name, exc.message)
    if not meta.is_snapshot(base):
        return [(0, int(base["volsize"]))]
    try:
        found = _data_of(base)
    except errors.StorageError as exc:
        log.warning("could not read where %s holds data (%s): bounded by "
                    "its last block", name, exc.message)
        return [(0, _data_end(base))]
    if keep:
        _keep_map(name, found)
    return found


def _data_of(snapshot):
    """The range set of a snapshot's data: its L0 blocks (zdb: metadata
    only), else the writes of a full send of it (its data read once)."""
    size, block = int(snapshot["volsize"]), _block_of(snapshot)
    try:
        return zdb.born_since(0, snapshot["name"], block, _allow(
            ZDB_RATE, _pointers(snapshot["name"], size, block)))[1]
    except errors.CommandTimeout:
        raise
    except errors.StorageError as exc:
        log.warning("zdb could not list the blocks of %s (%s): sending "
                    "it whole instead", snapshot["name"], exc.message)
    return zfs.send_data(snapshot["name"], bound=_allow(SEND_RATE, size))


def _data_end(snapshot):
    """The end of the snapshot's last block, else its size."""
    end = int(snapshot["volsize"])
    found = zdb.data_end(snapshot["name"], int(_volblocksize(
        meta.parent_of(snapshot["name"]))))
    return end if found is None else min(end, found)


def _keep_map(name, ranges):
    """Set a snapshot's map. Never fails the call: without a map, the next
    list from it makes one again."""
    try:
        zfs.set_props(name, {meta.CBT_MAP: blockmap.encode_map(
            ranges, values.MAX_VALUE)})
    except errors.StorageError as exc:
        log.warning("could not keep the allocation map of %s: %s", name,
                    exc.message)


def _changes_to_live(sr, source, zvol, known, size, block):
    """The changes up to now, from a snapshot taken for the call. The SR
    lock is held only to take it and to destroy it, not while it is read
    (that may take minutes, and VM starts on the SR would wait); meanwhile
    lock.reading keeps the collector from destroying it."""
    snap = "%s@%s%s" % (zvol, meta.CBT_SNAPSHOT, names.new_uuid())
    with lock.reading(snap):
        with lock.sr_lock(sr):
            zfs.snapshot(snap)
        try:
            return _changes(source, snap, known, size, block)[0]
        finally:
            try:
                with lock.sr_lock(sr):
                    zfs.destroy(snap)
            except errors.StorageError as exc:
                log.warning("could not destroy %s (the collector will): %s",
                            snap, exc.message)
