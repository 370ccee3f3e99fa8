"""Reading the pool through the model: is a dataset a zfs-ng SR, and what
the SR holds. The I/O half of ``meta`` (which only judges rows): both
plugins, the SR and Volume methods and the collector read an SR here, so
none of them needs another's module to do it.
"""

from zfsng import errors, meta, names, zfs


def sr_row(sr):
    """meta.SR_COLUMNS (and type) of an attached SR, or raise
    Sr_not_attached."""
    try:
        names.check_dataset_name(sr)
    except errors.InvalidConfiguration:
        raise errors.Sr_not_attached(sr)
    try:
        row = zfs.get_one(sr, meta.SR_COLUMNS + ["type"])
    except (errors.DatasetNotFound, errors.PoolNotFound):
        raise errors.Sr_not_attached(sr)
    return check_sr_row(sr, row)


def check_sr_row(sr, row):
    """row if it is the listing of sr's own SR dataset (meta.is_sr_root),
    else raise Sr_not_attached."""
    if not meta.is_sr_root(sr, row):
        raise errors.Sr_not_attached(sr)
    return row


def rows(sr):
    """meta.VOLUME_COLUMNS of every zvol and snapshot directly under the
    SR, and of the mirror sinks there (filesystems: ``meta.is_sink``,
    ``is_unfinished_sink``; no other filesystem is zfs-ng's), from one
    ``zfs list``."""
    return [r for r in zfs.list_datasets(
        sr, meta.VOLUME_COLUMNS, types="filesystem,volume,snapshot")
        if meta.in_sr(r, sr) and (r["type"] != "filesystem" or
                                  meta.is_sink(r) or
                                  meta.is_unfinished_sink(r))]


def find_srs(pool=None):
    """[(dataset, sr uuid)] of the zfs-ng SRs in one or all imported pools."""
    return zfs.find_local(meta.SR_UUID, pool)


def find_sr_by_uuid(sr_uuid, pool=None):
    return sr_in(find_srs(pool), sr_uuid)


def sr_in(found, sr_uuid):
    for dataset, value in found:
        if value == sr_uuid:
            return dataset
    return None
