"""Volume.*: VDIs as zvols (and snapshot VDIs as ZFS snapshots).

See ``meta`` for the layout. Every listing is one ``zfs list`` whatever the
number of VDIs, and every change is one ``zfs`` command where ZFS allows it,
so that a crash leaves either the old or the new state.
"""

import uuid as uuidlib

from zfsng import errors, lock, log, meta, names, sr as srmod, zfs


def _round_up(size, block):
    return (size + block - 1) // block * block


def _is_vdi(row):
    """A zvol or snapshot is a VDI when its own uuid is in its vdi
    property; inherited values (snapshots inherit from their zvol) and
    objects zfs-ng did not make fail this test."""
    return row.get(meta.VDI_UUID) == meta.object_uuid(row["name"])


def _to_volume(row):
    key = meta.object_uuid(row["name"])
    snapshot = row["type"] == "snapshot"
    if snapshot:
        used = int(row["used"] or 0)
    else:
        used = int(row["usedds"] or 0) + int(row["usedrefreserv"] or 0)
    return {
        "key": key, "uuid": key,
        "name": meta.decode_text(row[meta.VDI_NAME]),
        "description": meta.decode_text(row[meta.VDI_DESCRIPTION]),
        "read_write": not snapshot,
        "sharable": row.get(meta.VDI_SHARABLE) == "true",
        "virtual_size": int(row["volsize"]),
        "physical_utilisation": used,
        "uri": [meta.volume_uri(row["name"])],
        "keys": meta.decode_keys(row[meta.VDI_KEYS]),
    }


def list_volumes(sr):
    """Every visible VDI of the SR, from one zfs list."""
    srmod.sr_row(sr)
    rows = zfs.list_datasets(sr, meta.VOLUME_COLUMNS)
    return [_to_volume(r) for r in rows if _is_vdi(r)]


def find(sr, key):
    """The listing row of the VDI called key, or raise Volume_does_not_exist.

    A live VDI is found by name in one command; a snapshot VDI needs the
    SR's snapshot listing, since its parent is not known from the key.
    """
    if not names.is_uuid(key):
        raise errors.Volume_does_not_exist(key)
    try:
        row = zfs.get_one(meta.vdi_dataset(sr, key), meta.VOLUME_COLUMNS,
                          types="volume")
        if _is_vdi(row):
            return row
    except errors.DatasetNotFound:
        pass
    for row in zfs.list_datasets(sr, meta.VOLUME_COLUMNS, types="snapshot"):
        if meta.object_uuid(row["name"]) == key and _is_vdi(row):
            return row
    raise errors.Volume_does_not_exist(key)


def create(dbg, sr, name, description, size, sharable):
    if size <= 0:
        raise errors.InvalidArgument("size must be positive, got %d" % size)
    with lock.sr_lock(sr):
        row = srmod.sr_row(sr)
        block = int(row[meta.SR_VOLBLOCKSIZE])
        key = str(uuidlib.uuid4())
        dataset = meta.vdi_dataset(sr, key)
        props = {
            "volblocksize": str(block),
            meta.VDI_UUID: key,
            meta.VDI_NAME: meta.encode_text(name),
            meta.VDI_DESCRIPTION: meta.encode_text(description),
            meta.VDI_KEYS: meta.encode_keys({}),
            meta.VDI_SHARABLE: meta.encode_bool(sharable),
        }
        thin = row[meta.SR_PROVISIONING] != "thick"
        log.info("creating %s (%d bytes, %s)", dataset, size,
                 "thin" if thin else "thick")
        zfs.create_volume(dataset, _round_up(size, block), props, sparse=thin)
        return _to_volume(zfs.get_one(dataset, meta.VOLUME_COLUMNS))


def stat(dbg, sr, key):
    srmod.sr_row(sr)
    return _to_volume(find(sr, key))


def destroy(dbg, sr, key):
    with lock.sr_lock(sr):
        srmod.sr_row(sr)
        try:
            row = find(sr, key)
        except errors.Volume_does_not_exist:
            log.info("%s is already gone", key)  # xapi repeats destroys
            return None
        log.info("destroying %s", row["name"])
        zfs.destroy(row["name"])
    return None


HANDLERS = {
    "Volume.create": create, "Volume.stat": stat, "Volume.destroy": destroy,
}
