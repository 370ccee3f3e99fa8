"""SR.probe: which zfs-ng SRs a device-config names, on imported pools
and on exported ones (imported read-only, read, exported again).

Its own room: discovery reads pools the SR lifecycle never touches, and
never changes one (an exported pool is imported read-only, without
mounting, under a temporary name if its own is taken).
"""

import json

from zfsng import errors, inventory, lock, log, meta, pools, wire, zfs
from zfsng_volume import devconfig, devices, sr


def _probe_config(configuration, dataset, sr_uuid):
    config = dict((k, v) for k, v in configuration.items()
                  if k in devconfig.SOURCE_KEYS)
    if not config:   # say where the SR lives: attach decides on it
        row = zfs.get_one(dataset, [meta.SR_OWNER, meta.SR_DEVICES])
        if row[meta.SR_OWNER] == "pool":
            config["device"] = ",".join(
                json.loads(row[meta.SR_DEVICES] or "[]"))
        else:
            config["dataset"] = dataset.rsplit("/", 1)[0]
    config["pool-guid"] = pools.pool_by_name(meta.pool_of(dataset))["guid"]
    config["sr_uuid"] = sr_uuid
    return config


def _probe_pool(configuration, pool):
    return [{"configuration": _probe_config(configuration, ds, uuid),
             "complete": True, "sr": sr.stat_of(ds), "extra_info": {}}
            for ds, uuid in inventory.find_srs(pool)]


def _pool_matches(cfg, pool_name, leaves):
    if cfg.source is None:
        return True
    if cfg.parent:
        return pool_name == meta.pool_of(cfg.parent)
    family = set()
    for device in cfg.devices:
        family.update(devices.family(device))
    return any((devices.kernel_name(leaf) or leaf) in family
               for leaf in leaves)


def _search_dirs(cfg):
    """Where zpool import looks: the given devices and their partitions.

    A device that does not exist is refused: with nothing to look in,
    zpool import would scan every disk and report every exported SR.
    """
    dirs = []
    for device in cfg.devices:
        found = devices.family(device)
        if not found:
            raise errors.DeviceNotFound(
                "device %s does not exist or is not a block device"
                % device)
        dirs.extend(found)
    return dirs


def _import_to_read(guid, dirs):
    """Import read-only, without mounting; if an imported pool has its
    name, under a temporary one (read-only: its labels keep their name)."""
    try:
        pools.import_pool(guid, search_dirs=dirs, readonly=True, mount=False)
    except errors.PoolNameCollision:
        pools.import_pool(guid, search_dirs=dirs, readonly=True,
                          mount=False, new_name="zfsng-probe-" + guid)


def _probe_exported(configuration, cfg, dirs):
    """Import each importable candidate read-only, read its SRs, export."""
    results = []
    for pool in pools.importable_pools(dirs):
        if cfg.parent and pool["name"] != meta.pool_of(cfg.parent):
            continue
        try:
            _import_to_read(pool["guid"], dirs)
        except errors.ZfsError as exc:
            log.info("probe: cannot read pool %s (%s): %s", pool["name"],
                     pool["guid"], exc.message)
            continue
        name = pools.pool_by_guid(pool["guid"])["name"]
        try:
            results += _probe_pool(configuration, name)
        finally:
            pools.export_pool(name)
    return results


@wire.method("SR.probe")
def probe(dbg, configuration):
    cfg = devconfig.parse(configuration, need_source=False)
    results = []
    with lock.global_lock():
        dirs = _search_dirs(cfg)
        for pool in pools.list_pools():
            leaves = pools.pool_leaf_devices(pool["name"]) \
                if cfg.devices else []
            if _pool_matches(cfg, pool["name"], leaves):
                results += _probe_pool(configuration, pool["name"])
        results += _probe_exported(configuration, cfg, dirs)
    return results
