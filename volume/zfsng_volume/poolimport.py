"""Finding an SR's pool on SR.attach, and importing it when zfs-ng owns it.

Its own room because importing is where hosts meet: a pool another host
imported (multihost, and hosts cloned with one hostid, which multihost
cannot tell apart), and a pool whose name an imported pool already has
(pool names come from SR name-labels). Every refusal says what the admin
does next.
"""

import os

from zfsng import errors, hostid, inventory, log, meta, pools
from zfsng_volume import devices


def _label_of(cfg):
    """The ZFS label of the SR's pool on one of its configured disks (or
    their partitions), or None when none can be read."""
    for device in cfg.devices:
        for member in devices.family(device):
            label = pools.read_label(member)
            if label and label.get("pool_guid") == cfg.pool_guid:
                return label
    return None


def _refuse_a_clones_pool(cfg):
    """Refuse a pool that another host with this host's hostid imported.

    Multihost protection tells hosts apart by hostid, and OpenZFS before
    2.3.6 skips its check when the pool's hostid is ours: two hosts cloned
    from one image would both import the pool. The labels also record the
    importing host's name, so a pool still marked imported (state 0) by a
    host with our hostid but another name is refused. (The same host after
    a crash has our name; an exported pool is state 1.)
    """
    label = _label_of(cfg)
    if label is None or label.get("state") != "0" or \
            label.get("hostid") != str(hostid.current()):
        return   # ZFS's own checks decide
    me = os.uname()[1]
    if label.get("hostname") in (None, "", me):
        return
    raise errors.PoolImportedElsewhere(
        "the SR's pool (guid %s) is marked imported by host '%s', which has "
        "this host's hostid %s: cloned hosts? Multihost protection cannot "
        "tell them apart. Give each host its own hostid (zgenhostid -f), "
        "then detach the SR on '%s', or, if that host is down for good, "
        "run 'zpool import -f -o cachefile=none %s' here and plug the PBD "
        "again" % (cfg.pool_guid, label["hostname"], hostid.text(),
                   label["hostname"], cfg.pool_guid))


def _import_owned(cfg):
    """Import the SR's pool by guid; under another name if an imported
    pool has its name.

    Pool names come from SR name-labels: a second SR "tank" created while
    the first was detached got the name too. The pool is renamed for good
    (its labels keep the new name); the SR string xapi gets from attach is
    the new name, and nothing else refers to the old one.
    """
    try:
        pools.import_pool(cfg.pool_guid)
    except errors.PoolNameCollision:
        name = _free_pool_name(cfg)
        log.warning("an imported pool has the name of the SR's pool (guid "
                    "%s): importing it as %s", cfg.pool_guid, name)
        pools.import_pool(cfg.pool_guid, new_name=name)


def _free_pool_name(cfg):
    """zfsng-<sr uuid prefix> (the name SR.create falls back to), else
    zfsng-<pool guid>, whichever no imported pool has."""
    taken = set(p["name"] for p in pools.list_pools())
    wanted = ["zfsng-" + cfg.sr_uuid[:8]] if cfg.sr_uuid else []
    for name in wanted + ["zfsng-" + cfg.pool_guid]:
        if name not in taken:
            return name
    raise errors.PoolNameTaken(
        "cannot import the SR's pool (guid %s): imported pools already "
        "have its name and the names %s; import it by hand under a free "
        "name (zpool import -o cachefile=none %s <name>), then plug the PBD"
        % (cfg.pool_guid, ", ".join(wanted + ["zfsng-" + cfg.pool_guid]),
           cfg.pool_guid))


def _ensure_imported(cfg):
    """The name of the SR's pool, importing it if zfs-ng owns it."""
    if cfg.pool_guid:
        pool = pools.pool_by_guid(cfg.pool_guid)
        if pool:
            return pool["name"]
        if cfg.source != "pool":
            raise errors.PoolNotFound(
                "pool %s (guid %s) is not imported; zfs-ng does not import "
                "pools it did not create: import it, then plug the PBD"
                % (meta.pool_of(cfg.parent) if cfg.parent else "?",
                   cfg.pool_guid))
        _refuse_a_clones_pool(cfg)
        log.info("importing pool with guid %s", cfg.pool_guid)
        try:
            _import_owned(cfg)
        except errors.PoolImportedElsewhere as exc:
            raise errors.PoolImportedElsewhere(
                "the SR's pool (guid %s) is, or was last, imported by "
                "another host; importing it here too would corrupt it. If "
                "that host runs, detach the SR there first; if it is down "
                "for good, run 'zpool import -f -o cachefile=none %s' here "
                "and plug the PBD again. ZFS said: %s"
                % (cfg.pool_guid, cfg.pool_guid, exc.message))
        except errors.ZfsError as exc:
            raise errors.PoolNotFound(
                "cannot import the SR's pool (guid %s): %s"
                % (cfg.pool_guid, exc.message))
        return pools.pool_by_guid(cfg.pool_guid)["name"]
    if cfg.parent:
        name = meta.pool_of(cfg.parent)
        if not pools.pool_by_name(name):
            raise errors.PoolNotFound("pool '%s' is not imported" % name)
        return name
    raise errors.InvalidConfiguration(
        "device-config needs pool-guid and sr_uuid to attach; "
        "'xe sr-probe type=zfs-ng device-config:device=...' prints them")


def locate(cfg):
    """The SR's dataset, its pool imported first if zfs-ng owns it."""
    pool = _ensure_imported(cfg)
    found = inventory.find_srs(pool)
    if cfg.sr_uuid:
        for dataset, value in found:
            if value == cfg.sr_uuid:
                return dataset
        raise errors.SR_does_not_exist(
            cfg.sr_uuid, "no zfs-ng SR %s in pool %s" % (cfg.sr_uuid, pool))
    if len(found) != 1:
        raise errors.InvalidConfiguration(
            "pool %s holds %d zfs-ng SRs; give device-config:sr_uuid"
            % (pool, len(found)))
    return found[0][0]
