"""Volume.set_name, set_description, set and unset: what xapi and admins
write on a VDI (its name-label, description and keys), each a
read-modify-write of the VDI's properties under the SR lock. Their
encoding (UTF-8 text, keys as one JSON property) is values.py's; the VDI
is found as every Volume call finds it (volume.find)."""

from zfsng import inventory, meta, values, wire, zfs
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


@wire.method("Volume.set")
def set_key(dbg, sr, key, k, v):
    _update(sr, key, lambda row: _with_key(row, k, v))


@wire.method("Volume.unset")
def unset_key(dbg, sr, key, k):
    _update(sr, key, lambda row: _with_key(row, k, None))
