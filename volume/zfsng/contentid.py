"""A VDI's content_id: the name xapi's storage copies match a base by.

xapi moves a VM's snapshots and suspend image with
Storage_smapiv1_migrate.Copy.copy_into_sr (xen-api v26.1.4,
storage_smapiv1_migrate.ml:302-392): it looks in the destination SR for a
VDI whose content_id is one of the source's similar ones, clones it, and
has sparse_dd copy onto the clone only what differs from the *local* VDI
whose content_id equals the clone's (copy_into_vdi, 171 and 183-196,
plain string equality, with -prezeroed: 264). Then it claims the
source's content_id for the copy (285) and sets it on the source again
(288). So two VDIs that report one content_id must hold the same data:
a wrong match leaves another disk's blocks in the copy, unnoticed.
xapi-storage-script reports a SMAPIv3 VDI's key "content_id", "" when
there is none (main.ml:747), and sets it on every snapshot to the
parent's location, its key (main.ml:1442, xapi_vdi.ml:836-840): ""
and that key would match unrelated disks. Hence the rules here:

- every VDI reports a content_id of its own, never "": a fresh one from
  Volume.create, Volume.snapshot and a clone of a live VDI in use; a
  clone of a snapshot, or of a live VDI not in use, has the same data
  and keeps its source's (xapi clones the nearest VDI and needs the
  clone's id to find the base: without it sparse_dd would copy with no
  base onto the clone's data, and, prezeroed, leave the clone's blocks
  where the source holds zeros). In use: a process holds its zvol open
  (zvoldev.openers), or this host's datapath has it activated
  read-write (zfsng/attachstate.py ``writers``), open at this instant
  or not: a tapdisk that died is replaced on the next activate and the
  VM writes on, so its data leaves the id a clone would share. A stale
  record only costs a fresh id (a copy with no base), never data;
- Volume.set of "", of a VDI's key, or of an id another VDI reports
  stores a fresh one instead (``settled``), but for the two claims xapi
  makes that are true: the id the VDI already reports (288, and 285 after
  a copy onto a clone), and the id of a snapshot's own parent, which
  main.ml's snapshot passes after a copy (the id moves to the snapshot,
  the parent gets a fresh one; xapi's SR.update_snapshot_info_dest,
  storage_mux.ml:389-408, checks that the copied snapshot reports the
  source's id);
- Datapath.activate of a live VDI gives it a fresh one before anything
  writes to it (zfsng_datapath/datapath.py), as SMAPIv1 drops its id at
  a read-write activate (storage_smapiv1.ml:519-526); Volume.compose
  gives the composed VDI one (its data changed), and a zvol a revert or a
  reset makes again derives a new one (its guid is new).

The id is a property of its own (meta.CONTENT_ID), not in the JSON of
keys: the datapath changes it with one ``zfs set`` of that property alone,
so it never rewrites keys a Volume.set changes meanwhile. Its value names
the VDI it was set for, {"id": ..., "of": <vdi uuid>}: a snapshot
inherits its zvol's user properties, so a snapshot made before this
version would otherwise report its zvol's id. A "content_id"
in the keys (what versions before this one stored) is never reported:
a snapshot's is its parent's key, and another may be a claim the VDI's
writes made stale since.
"""

import json

from zfsng import meta, names, values

KEY = "content_id"

# The namespace of derived ids (version 5 UUIDs): zfs-ng's own, fixed for
# ever. Not through the uuid module: names.new_uuid says why.
_NAMESPACE = "5b1f7a52-3c1e-4f0e-9d55-2b8f6a0c1d7e"


def fresh():
    """A content_id nobody reports yet."""
    return names.new_uuid()


def encode(content_id, vdi_uuid):
    """The property's value for the VDI vdi_uuid: JSON, as every free
    text zfs-ng stores, naming the VDI (an inherited value is not its)."""
    return values.checked(json.dumps({"id": content_id, "of": vdi_uuid},
                                      sort_keys=True, separators=(",", ":")))


def stored(row):
    """The content_id set for the VDI of row, or None (none set, one it
    inherited, one set by hand to anything else)."""
    try:
        value = json.loads(row.get(meta.CONTENT_ID) or "null")
    except ValueError:
        return None
    if not isinstance(value, dict) or \
            value.get("of") != row.get(meta.VDI_UUID):
        return None
    found = value.get("id")
    return found if isinstance(found, str) and found else None


def derived(row):
    """The content_id of a VDI that has none stored: one a version before
    this made, or a zvol a revert or a reset made again. Derived, never
    written (Volume.stat and SR.ls change nothing): stable while the
    dataset is the same, from its name's uuid and its ZFS guid, so it is
    unique, and new for a dataset made again in its place (a new guid)."""
    return names.name_uuid(_NAMESPACE, "%s:%s" % (
        meta.object_uuid(row["name"]), row.get("guid") or row["name"]))


def reported(row):
    """What xapi is told: stored, else derived; never ""."""
    return stored(row) or derived(row)


def settled(value, row, rows):
    """What Volume.set content_id=value stores on the VDI of row: (the id,
    the row of the VDI whose id moves to it or None, why value was not
    taken or None). rows: the SR's listing."""
    vdis = meta.vdi_rows(rows)
    if not value:
        return fresh(), None, "it is empty"
    if value in set(r.get(meta.VDI_UUID) for r in vdis):
        return fresh(), None, "it is a VDI's key"
    if value == reported(row):
        return value, None, None
    holders = [r for r in vdis if r["name"] != row["name"] and
               reported(r) == value]
    if not holders:
        return value, None, None
    parent = meta.parent_of(row["name"])
    for holder in holders:
        if meta.is_snapshot(row) and holder["name"] == parent:
            return value, holder, None
    return fresh(), None, "VDI %s reports it" % holders[0][meta.VDI_UUID]
