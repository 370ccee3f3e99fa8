"""Scope: the datapath acts on zfs-ng VDIs only.

A URI only has to look like ``<dataset>/<uuid>[@<uuid>]`` to parse, and
that fits datasets zfs-ng never made: a filesystem or zvol an admin named by
a uuid, in any pool. Before the datapath snapshots, rolls back or clones
anything, it proves the URI names a VDI, as the volume plugin defines one
(``zfsng.meta``):

- the zvol (or the snapshot of a zvol) exists;
- its ``org.xcp-ng.zfs-ng:vdi`` is its own uuid (a value inherited from
  elsewhere cannot be: a snapshot inherits its zvol's uuid, not its own);
- it still has data (not a snapshot VDI whose data was destroyed);
- its parent is a zfs-ng SR dataset (``zfsng.inventory.sr_row``: the local
  ``sr-uuid`` mark of an SR root).

Otherwise the call fails with Volume_does_not_exist (nothing by that name)
or NotAVdi, having changed nothing.
"""

from zfsng import errors, inventory, meta, zfs

from zfsng_datapath.errors import NotAVdi

COLUMNS = ["name", "type", "volsize", "origin", meta.VDI_UUID,
           meta.CBT_BOOKMARK]


def row(name, columns=None):
    """The listing of one dataset, or None when it does not exist."""
    try:
        return zfs.get_one(name, columns or COLUMNS)
    except (errors.DatasetNotFound, errors.PoolNotFound):
        return None


def check(target):
    """The COLUMNS of the VDI the URI names, or raise."""
    check_sr(target)
    return check_vdi(target)


def check_vdi(target):
    """check without the SR's own check (done already)."""
    key = target.key()
    found = row(target.dataset)
    if found is None:
        raise errors.Volume_does_not_exist(key)
    kind = "snapshot" if target.snapshot else "volume"
    if found["type"] != kind or found["volsize"] is None:
        raise NotAVdi("%s is a %s, not a zfs-ng VDI: the datapath leaves it "
                      "alone" % (target.dataset, found["type"]))
    if found.get(meta.VDI_UUID) != key:
        raise NotAVdi("%s is not a zfs-ng VDI (its %s is %r, not its own "
                      "uuid): the datapath leaves it alone"
                      % (target.dataset, meta.VDI_UUID,
                         found.get(meta.VDI_UUID)))
    if meta.is_data_destroyed(found):
        raise errors.DataDestroyed(
            "VDI %s has no data to attach: Volume.data_destroy freed it "
            "(only its metadata is kept, for changed block tracking)" % key)
    return found


def check_sr(target):
    """The SR's row (zfsng.meta.SR_COLUMNS); NotAVdi unless the URI's
    parent dataset is a zfs-ng SR."""
    try:
        return inventory.sr_row(target.sr)
    except errors.Sr_not_attached:
        raise NotAVdi("%s is not in an attached zfs-ng SR (%s is no SR "
                      "dataset): the datapath leaves it alone"
                      % (target.dataset, target.sr))
