"""Volume.*: VDIs as zvols, snapshot VDIs as ZFS snapshots.

See ``meta`` for the layout. What is listed is always one ``zfs list`` of
the SR, whatever the number of VDIs; every change is one ``zfs`` command
where ZFS allows it, so a crash leaves either the old or the new state.
ZFS does not allow it for ``zfs create -o`` and ``zfs clone -o``: their
properties come in later transaction groups, so a power cut can leave the
dataset without them. Volume.create makes its zvol under a name of its own
first (``meta.is_unfinished_create``); a clone without properties is known
by its name and origin (``meta.is_unmarked_clone``); the collector frees
both.

Dependents. xapi destroys VDIs that ZFS cannot destroy yet: a zvol with
snapshots, a snapshot with clones. Such objects are hidden, not refused:
- a snapshot VDI with clones is destroyed *deferred* (``zfs destroy -d``):
  ZFS keeps it while its clones live and frees it with the last one;
  ``defer_destroy=on`` hides it from SR.ls;
- a zvol with snapshot VDIs or clones gets ``vdi=destroyed``: it keeps
  serving its dependents and is no longer listed. The datapath's reset of
  a non-persistent disk leaves such a zvol too, holding the snapshots
  taken during the VM's run (zfsng_datapath/reset.py).
Cloning a live volume takes an internal snapshot ``@zfsng-clone-<uuid>``,
destroyed deferred right after the clone, so it goes with the clone.
The collector (``collect``) frees hidden zvols once nothing depends on
them, and repairs what a crash between two commands left (an internal
snapshot without its clone or without its deferred mark). SR.attach runs
it, and so does Volume.destroy whenever the SR holds anything hidden or
half-done: no manual step, and no leak past the next destroy or attach.

A call that reports failure leaves nothing xapi will find. A command the
runner gave up on (``CommandTimeout``) may still finish in the kernel, and
the VDI it makes would appear at the next scan. So create, snapshot and
clone record a failure from their VDI's first visible command on
(``abandoned.making``), before it goes to xapi; SR.ls and the lookups
leave recorded VDIs out, and every call that changes the SR first frees
the ones whose command is gone (``locked``, ``collect.free_abandoned``).
"""

import contextlib

from zfsng import abandoned, attachstate, collect, contentid, errors, \
    inventory, lock, log, meta, names, ownership, values, wire, zfs, zvoldev

# The largest VDI. xapi holds sizes in OCaml's int64 and Linux a block
# device's size in a loff_t (signed 64 bits too); ZFS on a 64-bit host
# takes any whole number of blocks, and rounds a requested size up to one.
# A zvol of 2^63 bytes (2^63 - 1 rounded up) could not be reported to
# xapi: its Volume.stat and every SR.ls of its SR would fail to unmarshal.
# So a size is refused unless, rounded up, it fits in 2^63 - 1: 8 EiB
# less one volblocksize.
MAX_SIZE = wire.INT64_MAX


def _round_up(size, block):
    return (size + block - 1) // block * block


def max_size(block):
    """The largest VDI size with this volblocksize (whole blocks)."""
    return MAX_SIZE // block * block


def _checked_size(size, block):
    """size rounded up to whole blocks, or raise VolumeTooLarge."""
    rounded = _round_up(size, block)
    if rounded > max_size(block):
        raise errors.VolumeTooLarge(
            "%d bytes is more than the largest VDI, %d bytes (8 EiB less "
            "one %d-byte block: xapi and Linux hold sizes in signed 64-bit "
            "numbers)" % (size, max_size(block), block))
    return rounded


def _size(row, column):
    """A size column as xapi's int64: no value is 0, and a size beyond
    int64 (a zvol grown by hand past the limit) is clamped and said in
    SMlog, so that the VDI stays listed."""
    value = int(row[column] or 0)
    if value > MAX_SIZE:
        log.warning("%s: %s is %d bytes, beyond what xapi can hold: "
                    "reported as %d", row["name"], column, value, MAX_SIZE)
        return MAX_SIZE
    return value


def _keys(row):
    """The VDI's keys. Keys set by hand to no JSON object are left out, and
    so is a value that is no string; both said in SMlog: the VDI stays
    listed (Volume.set refuses until the property is fixed)."""
    try:
        keys = values.decode_keys(row[meta.VDI_KEYS], row["name"])
    except errors.MetadataUnreadable as exc:
        log.warning("%s; listed without keys", exc.message)
        return {}
    bad = sorted(k for k, v in keys.items() if not isinstance(v, str))
    if bad:
        log.warning("%s: keys %s are no strings; listed without them",
                    row["name"], bad)
    return dict((k, v) for k, v in keys.items() if isinstance(v, str))


def _with_content_id(keys, row):
    """keys with the VDI's content_id, never "" (contentid.py says why;
    one a version before this one kept in the keys is not reported)."""
    keys[contentid.KEY] = contentid.reported(row)
    return keys


def _to_volume(row):
    key = row[meta.VDI_UUID]     # its name's uuid, but for a stand-in
    if row["volsize"] is None:   # no size to tell xapi: never made up
        raise errors.MetadataUnreadable("%s has no volsize" % row["name"])
    snapshot = meta.is_snapshot(row) or meta.is_data_destroyed(row)
    if snapshot:
        used = _size(row, "used")
    else:
        used = min(_size(row, "usedds") + _size(row, "usedrefreserv"),
                   MAX_SIZE)
    return {
        "key": key, "uuid": key,
        "name": values.decode_text(row[meta.VDI_NAME]),
        "description": values.decode_text(row[meta.VDI_DESCRIPTION]),
        "read_write": not snapshot,
        "sharable": row.get(meta.VDI_SHARABLE) == "true",
        "virtual_size": _size(row, "volsize"),
        "physical_utilisation": used,
        "uri": [meta.volume_uri(meta.uri_dataset(row))],
        "keys": _with_content_id(_keys(row), row),
        "cbt_enabled": row.get(meta.CBT_ENABLED) == "true",
    }


def _read_only(row, key, what):
    """Refuse to change a snapshot VDI (or one whose data is gone)."""
    if meta.is_data_destroyed(row):
        raise errors.DataDestroyed(
            "VDI %s is a snapshot whose data was destroyed (kept for "
            "changed block tracking): it cannot be %s" % (key, what))
    if meta.is_snapshot(row):
        raise errors.InvalidArgument(
            "VDI %s is a read-only snapshot and cannot be %s" % (key, what))


LS_COLUMNS = meta.VOLUME_COLUMNS + [meta.SR_UUID, meta.SR_OWNER]


def list_volumes(sr):
    """Every visible VDI of the SR, from one zfs list: its first row, the
    SR dataset's own, proves sr is an attached zfs-ng SR."""
    try:
        names.check_dataset_name(sr)
        rows = zfs.list_datasets(sr, LS_COLUMNS,
                                 types="filesystem,volume,snapshot")
    except (errors.InvalidConfiguration, errors.DatasetNotFound,
            errors.PoolNotFound):
        raise errors.Sr_not_attached(sr)
    if not rows or rows[0]["name"] != sr:
        raise errors.Sr_not_attached(sr)
    inventory.check_sr_row(sr, rows[0])
    failed = abandoned.recorded(sr)   # made by calls that reported failure
    return _listed([r for r in meta.vdi_rows(
        [r for r in rows[1:] if r["type"] != "filesystem" and meta.in_sr(r, sr)])
        if r[meta.VDI_UUID] not in failed])


def _listed(rows):
    """The volumes of rows. One that cannot be described to xapi anyway is
    left out and said in SMlog: one odd dataset never fails the SR's
    listing (xapi could no longer scan the SR)."""
    volumes = []
    for row in rows:
        try:
            volume = _to_volume(row)
            wire.VOLUME.check(volume, row["name"])
        except (errors.StorageError, TypeError, ValueError, KeyError) as exc:
            log.warning("SR.ls: %s left out: %s", row["name"], exc)
            continue
        volumes.append(volume)
    return volumes


def find_in(rows, key):
    for row in meta.vdi_rows(rows):
        if row[meta.VDI_UUID] == key:
            return row
    raise errors.Volume_does_not_exist(key)


def find(sr, key):
    """The listing row of the VDI called key, or raise Volume_does_not_exist.

    A live VDI is found by name in one command; a snapshot VDI needs the
    SR's listing, since its parent is not known from the key (and so does
    a stand-in: see meta.is_stand_in).
    """
    if not names.is_uuid(key) or abandoned.is_recorded(sr, key):
        raise errors.Volume_does_not_exist(key)   # (a failed call's)
    try:
        row = zfs.get_one(meta.vdi_dataset(sr, key), meta.VOLUME_COLUMNS,
                          types="volume")
        if meta.is_vdi(row) and not meta.is_data_destroyed(row):
            return row
    except errors.DatasetNotFound:
        pass
    # -r lists every snapshot below the SR: a copy deeper down (zfs send |
    # recv into a child dataset) carries the same properties, so keep to
    # the SR's own zvols, as SR.ls does. A data-destroyed VDI is looked up
    # there too: its snapshot is the VDI while it is still there.
    return find_in(inventory.rows(sr), key)


# --- the methods ---------------------------------------------------------------

@contextlib.contextmanager
def locked(sr):
    """The SR lock for a call that changes the SR; what calls that
    reported failure made anyway is freed first, once no command on it
    runs (``abandoned``)."""
    with lock.sr_lock(sr):
        collect.free_abandoned(sr)
        yield


def _vdi_props(key, name, description, sharable, content_id):
    return {
        meta.CONTENT_ID: contentid.encode(content_id, key),
        meta.VDI_UUID: key,
        meta.VDI_NAME: values.encode_text(name),
        meta.VDI_DESCRIPTION: values.encode_text(description),
        meta.VDI_KEYS: values.encode_keys({}),
        meta.VDI_SHARABLE: values.encode_bool(sharable),
    }


@wire.method("Volume.create")
def create(dbg, sr, name, description, size, sharable):
    if size <= 0:
        raise errors.InvalidArgument("size must be positive, got %d" % size)
    with locked(sr):
        row = inventory.sr_row(sr)
        block = int(row[meta.SR_VOLBLOCKSIZE])
        rounded = _checked_size(size, block)
        key = names.new_uuid()
        dataset = meta.vdi_dataset(sr, key)
        props = _vdi_props(key, name, description, sharable,
                           contentid.fresh())
        props["volblocksize"] = str(block)
        thin = row[meta.SR_PROVISIONING] != "thick"
        log.info("creating %s (%d bytes, %s)", dataset, size,
                 "thin" if thin else "thick")
        # ZFS sets the -o properties after making the zvol: made under a
        # name of zfs-ng's, it gets the VDI's name once it is whole
        # (meta.is_unfinished_create; the collector frees one a power cut
        # left half-made).
        creating = meta.creating_name(sr, key)
        zfs.create_volume(creating, rounded, props, sparse=thin)
        with abandoned.making(sr, key, [dataset, creating]):
            try:
                zfs.rename(creating, dataset)
            except errors.CommandTimeout:
                raise             # may still run: the record frees it
            except errors.StorageError:
                _discard(creating)   # a refused create leaves nothing
                raise
            return _to_volume(zfs.get_one(dataset, meta.VOLUME_COLUMNS))


@wire.method("Volume.stat")
def stat(dbg, sr, key):
    inventory.sr_row(sr)
    return _to_volume(find(sr, key))


@wire.method("Volume.snapshot")
def snapshot(dbg, sr, key):
    with locked(sr):
        inventory.sr_row(sr)
        row = find(sr, key)
        if meta.is_snapshot(row) or meta.is_data_destroyed(row):
            raise errors.InvalidArgument(
                "VDI %s is a snapshot; snapshot its parent, or clone it "
                "first" % key)
        new = names.new_uuid()
        name = "%s@%s" % (row["name"], new)
        log.info("snapshot %s", name)
        props = _vdi_props(
            new, values.decode_text(row[meta.VDI_NAME]),
            values.decode_text(row[meta.VDI_DESCRIPTION]),
            row.get(meta.VDI_SHARABLE) == "true", contentid.fresh())
        # set on the snapshot itself: a later disable_cbt on the zvol
        # does not change what the snapshot was taken with
        props[meta.CBT_ENABLED] = values.encode_bool(
            row.get(meta.CBT_ENABLED) == "true")
        with abandoned.making(sr, new, [name]):
            zfs.snapshot(name, props)
            return _to_volume(zfs.get_one(name, meta.VOLUME_COLUMNS))


@wire.method("Volume.clone")
def clone(dbg, sr, key):
    with locked(sr):
        row = inventory.sr_row(sr)
        thick = row[meta.SR_PROVISIONING] == "thick"
        source = find(sr, key)
        if meta.is_data_destroyed(source):
            _read_only(source, key, "cloned")
        new = names.new_uuid()
        dataset = meta.vdi_dataset(sr, new)
        props = _vdi_props(new, values.decode_text(source[meta.VDI_NAME]),
                           values.decode_text(source[meta.VDI_DESCRIPTION]),
                           source.get(meta.VDI_SHARABLE) == "true",
                           _clone_content_id(source))
        if thick:
            props["refreservation"] = "auto"
        if meta.is_snapshot(source):
            log.info("clone %s -> %s", source["name"], dataset)
            with abandoned.making(sr, new, [dataset]):
                zfs.clone(source["name"], dataset, props)
                return _to_volume(zfs.get_one(dataset, meta.VOLUME_COLUMNS))
        internal = meta.internal_snapshot(source["name"], new)
        log.info("clone live %s via %s -> %s", source["name"], internal,
                 dataset)
        zfs.snapshot(internal)
        with abandoned.making(sr, new, [dataset]):
            try:
                zfs.clone(internal, dataset, props)
            except errors.CommandTimeout:
                raise   # may still run: the collector frees internal
            except errors.StorageError:
                _discard(internal)  # a refused clone leaves nothing behind
                raise
            zfs.destroy(internal, defer=True)  # goes with the clone
            return _to_volume(zfs.get_one(dataset, meta.VOLUME_COLUMNS))


def _clone_content_id(source):
    """A clone's content_id: its source's, which holds the same data (xapi
    needs it: contentid.py), unless the source is a live VDI in use (a VM
    writing it: its data is no longer what its id says); then a fresh
    one. In use: something holds its zvol open, or this host activated
    it read-write (its tapdisk may be dead and not yet replaced)."""
    name = source["name"]
    if not meta.is_snapshot(source) and (zvoldev.openers(name) or
                                         attachstate.writers(name)):
        return contentid.fresh()
    return contentid.reported(source)


def _discard(name):
    """Destroy a snapshot or zvol nothing uses yet; if that fails too,
    collect removes it later."""
    try:
        zfs.destroy(name)
    except errors.ZfsError as exc:
        log.warning("could not remove %s: %s", name, exc.message)


@wire.method("Volume.destroy")
def destroy(dbg, sr, key):
    with locked(sr):
        inventory.sr_row(sr)
        rows = inventory.rows(sr)
        pending = collect.needed(rows)
        try:
            row = find_in(rows, key) if names.is_uuid(key) else None
        except errors.Volume_does_not_exist:
            row = None
        if row is None:
            log.info("%s is already gone", key)  # xapi repeats destroys
        elif meta.is_data_destroyed(row):
            _destroy_kept_metadata(row)
            pending = True   # its zvol may be a hidden parent it kept
        elif meta.is_snapshot(row):
            _destroy_kept_metadata(_stand_in_for(rows, row))
            deferred = bool(meta.clones_of(row))
            log.info("destroying snapshot %s%s", row["name"],
                     " (deferred: it has clones)" if deferred else "")
            zfs.destroy(row["name"], defer=deferred)
        elif ownership.has_dependents(row["name"], rows):
            log.info("hiding %s: snapshots or clones still need it",
                     row["name"])
            zfs.set_props(row["name"], {meta.VDI_UUID: meta.HIDDEN})
        else:
            log.info("destroying %s", row["name"])
            zfs.destroy(row["name"], recursive=True)
        if row is not None and not meta.is_snapshot(row):
            pending = _hide_set_aside(rows, key, row["name"]) or pending
        if pending:  # a hidden parent may be free now, or a crash left work
            collect.collect(sr)
    return None


def _stand_in_for(rows, snapshot):
    """The empty zvol of a data_destroy of snapshot that did not finish
    (it failed between its commands), or None."""
    for row in rows:
        if meta.is_data_destroyed(row) and \
                meta.bookmarked_snapshot(row) == snapshot["name"]:
            return row
    return None


def _destroy_kept_metadata(row):
    """Destroy what data_destroy kept of a snapshot VDI: its bookmark,
    then its empty zvol (gone last: until then the VDI is listed, and a
    repeated destroy finishes)."""
    if row is None:
        return
    mark = row[meta.CBT_BOOKMARK]
    log.info("destroying %s and %s", mark, row["name"])
    try:
        zfs.destroy(mark)
    except errors.DatasetNotFound:
        pass
    zfs.destroy(row["name"])


def _hide_set_aside(rows, key, name):
    """Hide the zvol a reset set aside and a crash left still carrying the
    destroyed VDI's uuid (zfsng_datapath/reset.py, state S2): no datapath
    call will finish that reset now. Whether there was one."""
    found = [r["name"] for r in rows if not meta.is_snapshot(r) and
             r["name"] != name and r.get(meta.VDI_UUID) == key]
    for other in found:
        log.info("hiding %s, set aside by an interrupted reset of %s",
                 other, key)
        zfs.set_props(other, {meta.VDI_UUID: meta.HIDDEN})
    return bool(found)


@wire.method("Volume.resize")
def resize(dbg, sr, key, new_size):
    with locked(sr):
        inventory.sr_row(sr)
        row = find(sr, key)
        _read_only(row, key, "resized")
        size = _checked_size(new_size, int(row["volblocksize"]))
        current = int(row["volsize"])
        if new_size < current:
            raise errors.VdiShrinkNotAllowed(
                "VDI %s is %d bytes; shrinking it to %d would lose data"
                % (key, current, new_size))
        if size == current:
            return None
        props = {"volsize": str(size)}
        if row.get("refreservation") not in (None, "0", "none"):
            props["refreservation"] = "auto"  # thick stays thick
        log.info("resize %s: %d -> %d", row["name"], current, size)
        try:
            zfs.set_props(row["name"], props)
        except errors.ZfsError:
            # ZFS sets volsize and refreservation one after the other
            # (zfs_set_prop_nvlist): a thick volume may have grown though
            # its reservation could not. A refused resize changes nothing.
            _restore_size(row["name"], current)
            raise
    return None


def _restore_size(name, size):
    try:
        if int(zfs.get_one(name, ["volsize"])["volsize"]) != size:
            log.warning("resize of %s refused: back to %d bytes", name, size)
            zfs.set_props(name, {"volsize": str(size)})
    except errors.ZfsError as exc:
        log.error("could not put %s back to %d bytes: %s", name, size,
                  exc.message)
