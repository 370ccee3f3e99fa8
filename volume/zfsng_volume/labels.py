"""Volume.set_name, set_description, set and unset: what xapi and admins
write on a VDI (its name-label, description and keys), each a
read-modify-write of the VDI's properties under the SR lock. Their
encoding (UTF-8 text, keys as one JSON property) is values.py's; the VDI
is found as every Volume call finds it (volume.find). The key
"content_id" is kept apart, and not always as given: see contentid.py."""

from zfsng import contentid, errors, inventory, log, meta, values, wire, zfs
from zfsng_volume.volume import locked, find


def _update(sr, key, change):
    """Read-modify-write of one VDI's properties under the SR lock."""
    with locked(sr):
        inventory.sr_row(sr)
        row = find(sr, key)
        zfs.set_props(row["name"], change(row))


@wire.method("Volume.set_name")
def set_name(dbg, sr, key, new_name):
    _update(sr, key, lambda row: {meta.VDI_NAME: values.encode_text(new_name)})


@wire.method("Volume.set_description")
def set_description(dbg, sr, key, new_description):
    _update(sr, key, lambda row: {
        meta.VDI_DESCRIPTION: values.encode_text(new_description)})


def _with_key(row, k, v):
    keys = values.decode_keys(row[meta.VDI_KEYS], row["name"])
    if v is None:
        keys.pop(k, None)
    else:
        keys[k] = v
    return {meta.VDI_KEYS: values.encode_keys(keys)}


def _set_content_id(sr, key, value):
    """Volume.set (or unset: value None) of content_id: what
    contentid.settled keeps of value, in one zfs set, the key of that
    name an older version kept in the keys dropped with it. When the id
    moves from a snapshot's parent, the parent gets a fresh one first: a
    crash between the two leaves each with an id of its own."""
    with locked(sr):
        inventory.sr_row(sr)
        row = find(sr, key)
        rows = inventory.rows(sr)
        chosen, moved, why = contentid.settled(value, row, rows)
        if why is not None:
            log.info("%s: content_id %r not taken (%s): %s instead",
                     key, value, why, chosen)
        if moved is not None:
            log.info("%s: content_id %s moves from its parent %s, which "
                     "gets a fresh one", key, chosen, moved[meta.VDI_UUID])
            zfs.set_props(moved["name"], {meta.CONTENT_ID: contentid.encode(
                contentid.fresh(), moved[meta.VDI_UUID])})
        props = {meta.CONTENT_ID: contentid.encode(chosen, key)}
        try:
            keys = values.decode_keys(row[meta.VDI_KEYS], row["name"])
        except errors.MetadataUnreadable:
            keys = {}
        if contentid.KEY in keys:
            props.update(_with_key(row, contentid.KEY, None))
        zfs.set_props(row["name"], props)


@wire.method("Volume.set")
def set_key(dbg, sr, key, k, v):
    if k == contentid.KEY:
        return _set_content_id(sr, key, v)
    _update(sr, key, lambda row: _with_key(row, k, v))


@wire.method("Volume.unset")
def unset_key(dbg, sr, key, k):
    if k == contentid.KEY:
        return _set_content_id(sr, key, None)
    _update(sr, key, lambda row: _with_key(row, k, None))
