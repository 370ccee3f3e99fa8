"""Which datasets under an SR are zfs-ng's, and what a zvol's destroy must
wait for: the rules SR.destroy (never destroy what zfs-ng did not make)
and the collector (free a hidden parent once nothing needs it) share, on
``meta``'s kinds. Pure rules on listing rows, as ``meta`` is.
"""

from zfsng import names
from zfsng.meta import CLONE_SUFFIX, DATAPATH_CLONE, NONPERSISTENT_SNAPSHOT, \
    VDI_UUID, bookmarked_snapshot, clones_of, is_data_destroyed, \
    in_sink, is_internal, is_sink, is_snapshot, is_unfinished_create, \
    is_unfinished_sink, is_unmarked_clone, is_vdi, object_uuid, parent_of


def is_foreign(row):
    """A snapshot zfs-ng did not take (an admin's): never touched."""
    name = object_uuid(row["name"])
    return is_snapshot(row) and not is_internal(row) and \
        name != NONPERSISTENT_SNAPSHOT and row.get(VDI_UUID) != name


def has_dependents(volume, rows):
    """Whether anything still needs the zvol: one of its snapshots is a
    VDI, has clones, or is an admin's own; or a data-destroyed VDI's
    bookmark is on it (destroying the zvol would take the bookmark)."""
    return any((is_snapshot(r) and parent_of(r["name"]) == volume and
                (is_vdi(r) or clones_of(r) or is_foreign(r))) or
               (is_data_destroyed(r) and
                parent_of(bookmarked_snapshot(r)) == volume) for r in rows)


def made_by_zfsng(row, sr):
    """Whether a dataset, snapshot or bookmark below the SR dataset is
    zfs-ng's own: a zvol <sr>/<uuid> carrying a vdi value (a VDI, a hidden
    parent awaiting collection, a zvol the datapath set aside), a datapath
    clone <sr>/<uuid>.ro, and on those zvols the VDI snapshots,
    snapshots being freed (deferred), internal and reset-point snapshots,
    and the bookmarks data_destroy leaves, <uuid>#<uuid>; and what a power
    cut left unfinished (``is_unmarked_clone``, ``is_unfinished_create``:
    the rows need origin, usedds and DATAPATH_CLONE). Anything else
    (filesystems, other zvols, the admin's snapshots and bookmarks) is
    not. A mirror sink, either form, is (the rows need MIRROR_SINK), and
    a bounded one's zvol and snapshot below it."""
    if in_sink(row, sr):
        return True
    parent, _, last = parent_of(row["name"]).rpartition("/")
    if parent != sr:
        return False
    if row["type"] == "filesystem":
        return is_sink(row) or is_unfinished_sink(row)
    if row["type"] == "volume":
        if names.is_uuid(last):
            return bool(row.get(VDI_UUID)) or is_unmarked_clone(row)
        if is_unmarked_clone(row) or is_unfinished_create(row) or \
                is_sink(row):
            return True
        return last.endswith(CLONE_SUFFIX) and \
            names.is_uuid(last[:-len(CLONE_SUFFIX)]) and \
            row.get(DATAPATH_CLONE) is not None
    if row["type"] == "bookmark":
        vol, _, mark = last.partition("#")
        return names.is_uuid(vol) and names.is_uuid(mark)
    if row["type"] != "snapshot":
        return False
    return is_vdi(row) or is_internal(row) or \
        row.get("defer_destroy") == "on" or \
        object_uuid(row["name"]) == NONPERSISTENT_SNAPSHOT
