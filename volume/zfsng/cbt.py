"""Changed block tracking: Volume.enable_cbt, disable_cbt,
list_changed_blocks and data_destroy, answered from ZFS itself.

Nothing is tracked while guests write. ZFS stamps every block with the
transaction group that wrote it, and an incremental ``zfs send`` between
two snapshots (or from a bookmark) visits exactly the blocks born between
them: that is what ZFS replication relies on to rebuild ``to`` from
``from``, so it misses nothing, and a crash loses nothing, since the
stamps are on the pool. ``sendstream`` reads the stream's record headers
(payloads skipped): the writes (data born since ``from``) and the frees
(holes in ``to``). Its cost grows with the change, not with the disk.

What changed between ``from`` and ``to``:
- every write: data born since ``from`` (zeros written over data are
  holes under compression, so they come as frees, below);
- every free where ``from`` may have held data. A free only says "``to``
  has a hole here": streams also carry frees over never-written space
  (sendstream's docstring). So zfs-ng keeps, per snapshot, an
  *allocation map*: a set of ranges that holds every byte the snapshot
  has data in (``meta.CBT_MAP``). The map of ``to`` follows from the
  stream: ``(map(from) - frees) + writes``, since a free is a hole in
  ``to`` and a write is data in it; list_changed_blocks stores it on
  ``to``. A snapshot without a map (the first of a chain) gets one from
  a full ``zfs send`` of itself (``zfs.send_data``: its data, read once,
  within the command's bound), kept on it; if that cannot be had, the
  end of its last block (``zfs.data_end``), else its size, bounds it.
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
that never got a map gets one then, while it can still be read. The order
keeps a crash safe: bookmark, then the empty zvol (while the snapshot is
still there it is the VDI: ``meta.vdi_rows``), then the snapshot goes.
Volume.destroy of such a VDI removes the bookmark and the empty zvol.
"""

from zfsng import blockmap, errors, inventory, lock, log, meta, names, \
    wire, zfs
from zfsng import volume as vol


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
        zfs.set_props(row["name"], {meta.CBT_ENABLED: meta.encode_bool(on)})
        if not on and not meta.is_snapshot(row):
            for snap in rows:
                if meta.is_snapshot(snap) and \
                        meta.parent_of(snap["name"]) == row["name"]:
                    _drop_map(snap["name"])


def _drop_map(name):
    try:
        if zfs.get_one(name, [meta.CBT_MAP]).get(meta.CBT_MAP):
            zfs.inherit(name, meta.CBT_MAP)
    except errors.DatasetNotFound:
        pass


@wire.method("Volume.data_destroy")
def data_destroy(dbg, sr, key):
    with lock.sr_lock(sr):
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
        _keep_metadata(sr, rows, row)
        log.info("destroying the data of %s", row["name"])
        zfs.destroy(row["name"], defer=bool(meta.clones_of(row)))
    return None


def _keep_metadata(sr, rows, row):
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
    # Without a map (never a list's target, as the first snapshot of a
    # chain), one is made now, while the snapshot can be read.
    props[meta.CBT_MAP] = blockmap.encode_map(_map_of(row), meta.MAX_VALUE)
    props.update({meta.CBT_ENABLED: "true", meta.CBT_BOOKMARK: mark,
                  "volmode": "none", "volblocksize": row["volblocksize"] or
                  _volblocksize(meta.parent_of(row["name"]))})
    log.info("keeping the metadata of %s in %s", row["name"], stub)
    zfs.create_volume(creating, int(row["volsize"]), props, sparse=True)
    zfs.rename(creating, stub)


def _vdi_metadata(row):
    """The properties that make the VDI what xapi knows: its uuid, name,
    description, keys, sharable."""
    return dict((k, row[k]) for k in (meta.VDI_UUID, meta.VDI_NAME,
                                      meta.VDI_DESCRIPTION, meta.VDI_KEYS,
                                      meta.VDI_SHARABLE) if row.get(k))


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
    known = _map_of(base)
    if meta.is_snapshot(target):
        writes, frees = zfs.send_changes(source, target["name"])
        _store_map(target["name"], known, writes, frees)
    else:
        writes, frees = _changes_to_live(sr, source, target["name"])
    changed = blockmap.union(writes, blockmap.intersect(frees, known))
    window = blockmap.intersect(changed, [(start, stop)])
    relative = [(a - start, b - start) for a, b in window]
    log.info("changed blocks %s -> %s: %d of %d blocks (%d bytes written, "
             "%d freed)", source, target["name"], blockmap.blocks_in(window),
             (stop - start + blockmap.GRANULARITY - 1) //
             blockmap.GRANULARITY, blockmap.total(writes),
             blockmap.total(blockmap.intersect(frees, [(0, size)])))
    return {"granularity": blockmap.GRANULARITY,
            "bitmap": wire.LongString(
                lambda: blockmap.encoded_bitmap(relative, stop - start))}


def _source(base, key):
    """What the stream starts from: the snapshot, or the bookmark that
    replaced it."""
    if meta.is_data_destroyed(base):
        return base[meta.CBT_BOOKMARK]
    if not meta.is_snapshot(base):
        raise errors.InvalidArgument(
            "VDI %s is not a snapshot: changed blocks are listed from a "
            "snapshot to a later snapshot (or the disk itself)" % key)
    return base["name"]


def _window(offset, length, size):
    """The part of the disk asked for: xapi asks for all of it (offset 0,
    length -1)."""
    stop = size if length < 0 else min(size, offset + length)
    if offset < 0 or offset % blockmap.GRANULARITY or offset > size:
        raise errors.InvalidArgument(
            "offset %d must be a multiple of %d within the disk (%d bytes)"
            % (offset, blockmap.GRANULARITY, size))
    return offset, max(offset, stop)


def _map_of(base):
    """The ranges where base may hold data: its map; else, for a
    snapshot, its data from a full send (kept as its map), or a bound."""
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
        found = zfs.send_data(name)
    except errors.StorageError as exc:
        log.warning("could not read where %s holds data (%s): bounded by "
                    "its last block", name, exc.message)
        return [(0, _data_end(base))]
    _keep_map(name, found)
    return found


def _data_end(snapshot):
    """The end of the snapshot's last block, else its size."""
    end = int(snapshot["volsize"])
    found = zfs.data_end(snapshot["name"], int(_volblocksize(
        meta.parent_of(snapshot["name"]))))
    return end if found is None else min(end, found)


def _store_map(name, known, writes, frees):
    """Keep the target's map: its data is where base's was, less what is
    a hole now, plus what was written."""
    _keep_map(name, blockmap.union(blockmap.subtract(known, frees), writes))


def _keep_map(name, ranges):
    """Set a snapshot's map. Never fails the call: without a map, the next
    list from it makes one again."""
    try:
        zfs.set_props(name, {meta.CBT_MAP: blockmap.encode_map(
            ranges, meta.MAX_VALUE)})
    except errors.StorageError as exc:
        log.warning("could not keep the allocation map of %s: %s", name,
                    exc.message)


def _changes_to_live(sr, source, zvol):
    """The changes up to now: a snapshot taken for the call, sent, then
    destroyed, all under the SR lock (the collector frees it otherwise)."""
    with lock.sr_lock(sr):
        snap = "%s@%s%s" % (zvol, meta.CBT_SNAPSHOT, names.new_uuid())
        zfs.snapshot(snap)
        try:
            return zfs.send_changes(source, snap)
        finally:
            try:
                zfs.destroy(snap)
            except errors.StorageError as exc:
                log.warning("could not destroy %s (the collector will): %s",
                            snap, exc.message)

