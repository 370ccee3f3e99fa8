"""SR.*: the storage repository lifecycle on a pool or an adopted dataset.

An SR is one dataset (see ``meta``). The string SR.attach returns, which xapi
passes back as ``sr`` in every later call, is that dataset's name (or, for
a pool whose SR.destroy was killed after ``zpool destroy``, a name only
SR.destroy acts on: DESTROYING; for an SR whose destroy is done but whose
answer was lost, one SR.destroy answers at once: DESTROYED).

Ownership rule: zfs-ng exports or destroys a pool only if it created it
(``sr-owner=pool``); on adopted storage it only ever touches the SR's own
child dataset. SR.destroy never destroys what zfs-ng did not make
(SrHoldsOtherData), and blanks only disks proved to be the pool's own
(``cleanup``).

Every multi-step SR operation is finished or undone by the next call: a
destroy killed after ``zpool destroy`` by the next SR.attach + SR.destroy
(the saved clean-up plan), a create killed after ``zpool create`` by the
retry xapi makes with a new SR uuid (the unclaimed pool, ``_unclaimed``).

Rooms beside it: importing the pool on attach (``poolimport``), its
health (``health``), SR.probe (``probe``).
"""

import json

from zfsng import arc, collect, errors, hostid, inventory, lock, log, \
    meta, namelimits, names, ownership, pools, testhooks, values, wire, \
    zfs, zvoldev
from zfsng_volume import alert, arcfloor, cleanup, devconfig, devices, \
    health, poolimport, srmetrics, volume

LINK_TIMEOUT = 30.0  # seconds to wait for udev's /dev/zvol links on attach


def visible_volume_count(sr):
    return len(volume.list_volumes(sr))


def stat_of(sr, row=None, sr_health=None):
    row = row or inventory.sr_row(sr)
    used, available = int(row["used"]), int(row["available"])
    return {"sr": sr, "uuid": row[meta.SR_UUID],
            "name": values.decode_text(row[meta.SR_NAME]),
            "description": values.decode_text(row[meta.SR_DESCRIPTION]),
            "free_space": available, "total_space": used + available,
            "datasources": srmetrics.datasources(sr, row[meta.SR_UUID]),
            "clustered": False,
            "health": sr_health or health.health(meta.pool_of(sr))}


# --- create ---------------------------------------------------------------------

def _sr_props(uuid, cfg, name, description, owner, configuration=None):
    props = {
        "volmode": "dev",            # dom0 never scans guests' partitions
        "compression": cfg.compression,
        "dedup": cfg.dedup,
        "sync": cfg.sync,
        meta.SR_UUID: uuid,
        meta.SR_NAME: values.encode_text(name),
        meta.SR_DESCRIPTION: values.encode_text(description),
        meta.SR_OWNER: owner,
        meta.SR_PROVISIONING: cfg.provisioning,
        meta.SR_VOLBLOCKSIZE: str(cfg.volblocksize),
        meta.SR_FORMAT: meta.FORMAT_VERSION,
    }
    if cfg.logbias:
        props["logbias"] = cfg.logbias
    if owner == "pool":
        props[meta.SR_DEVICES] = values.encode_keys(cfg.devices)
        props[meta.SR_UNCLAIMED] = values.encode_keys(configuration)
    return props


def _choose_volblocksize(cfg):
    """Give cfg the default volblocksize of its pool's layout and the
    loaded OpenZFS unless device-config set one: the pool it creates, or
    the adopted one as ``zpool list -v`` shows it. Stored on the SR, so an
    SR keeps its block size whatever later defaults say. One device-config
    set is refused where it can freeze reads (check_small_blocks), unless
    a benchmark measuring that asks (test hook)."""
    if cfg.volblocksize is None:
        parity = cfg.creates_parity() if cfg.source == "pool" else \
            pools.has_parity(meta.pool_of(cfg.parent))
        cfg.volblocksize = devconfig.default_volblocksize(
            parity, zfs.kernel_version())
    elif cfg.volblocksize < devconfig.VOLBLOCKSIZE_SAFE and \
            not testhooks.get("ZFSNG_SMALL_BLOCKS_ANY_ARC"):
        devconfig.check_small_blocks(cfg.volblocksize, zfs.kernel_version(),
                                     arc.floor())


def _choose_pool_name(uuid, cfg, name):
    taken = set(p["name"] for p in pools.list_pools())
    if cfg.pool_name:
        if cfg.pool_name in taken:
            raise errors.PoolNameTaken(
                "a pool named '%s' is already imported; choose another "
                "device-config:pool-name" % cfg.pool_name)
        return cfg.pool_name
    if names.valid_pool_name(name) and name not in taken and \
            namelimits.room_for(name) >= 0:
        return name
    fallback = "zfsng-" + uuid[:8]
    if fallback in taken:
        raise errors.PoolNameTaken("pool '%s' already exists; give "
                                   "device-config:pool-name" % fallback)
    return fallback


def _stable_devices(cfg):
    """Name the devices by /dev/disk/by-id where the admin gave kernel
    names: in the pool (zpool status shows them) and in SR_DEVICES, which
    SR.destroy reads to know which whole disks were given to zfs-ng."""
    stable = dict((d, devices.stable_name(d)) for d in cfg.devices)
    cfg.devices = [stable[d] for d in cfg.devices]
    cfg.vdev_args = [stable.get(w, w) for w in cfg.vdev_args]


def _create_pool(uuid, cfg, name, description, configuration):
    pool = _choose_pool_name(uuid, cfg, name)
    devices.check_free(cfg.devices, cfg.force)
    _stable_devices(cfg)
    # multihost: no second host can import it while this one has it
    # (see hostid); it needs this host's hostid.
    hostid.require()
    _choose_volblocksize(cfg)
    pool_props = {"cachefile": "none", "multihost": "on"}
    if cfg.ashift is not None:
        pool_props["ashift"] = str(cfg.ashift)
    log.info("creating pool %s on %s", pool, " ".join(cfg.vdev_args))
    pools.create_pool(pool, cfg.vdev_args, pool_props,
                      _sr_props(uuid, cfg, name, description, "pool",
                                configuration),
                      force=cfg.force)
    return pool


def _check_adoptable(parent):
    try:
        row = zfs.get_one(parent, ["name", "type", meta.SR_UUID])
    except (errors.DatasetNotFound, errors.PoolNotFound):
        raise errors.PoolNotFound(
            "'%s' is not an imported pool or existing dataset; import the "
            "pool first (zpool import %s)" % (parent, meta.pool_of(parent)))
    if row["type"] != "filesystem":
        raise errors.InvalidConfiguration(
            "'%s' is a %s; adopt a pool or a filesystem dataset"
            % (parent, row["type"]))
    if row.get(meta.SR_UUID):
        raise errors.InvalidConfiguration(
            "'%s' is inside zfs-ng SR %s; SRs cannot be nested"
            % (parent, row[meta.SR_UUID]))


def _create_child(uuid, cfg, name, description):
    _check_adoptable(cfg.parent)
    _choose_volblocksize(cfg)
    dataset = meta.child_sr_dataset(cfg.parent, uuid)
    props = _sr_props(uuid, cfg, name, description, "dataset")
    props["mountpoint"] = "none"
    log.info("creating SR dataset %s", dataset)
    zfs.create_filesystem(dataset, props)
    return dataset


def _unclaimed(found, configuration):
    """A pool an SR.create with this same device-config made, that was
    never attached and holds nothing, or None.

    Such a pool is what a create killed after "zpool create" leaves: xapi
    never got its answer, so it forgot the SR, and retries with a new SR
    uuid on the same disks, which the pool now holds. Nothing could have
    used it (no SR.attach ever ran: the marker is there; no dataset or
    snapshot in it), so the retry takes it over instead of failing with
    DeviceInUse. (If xapi did get the answer but the PBD never plugged, its
    empty SR record no longer attaches: SR_does_not_exist; forget it.)
    """
    wanted = values.encode_keys(configuration)
    for dataset, _ in found:
        if "/" in dataset:
            continue
        row = zfs.get_one(dataset, [meta.SR_OWNER, meta.SR_UNCLAIMED])
        if row[meta.SR_OWNER] != "pool" or row[meta.SR_UNCLAIMED] != wanted:
            continue
        if len(zfs.list_datasets(dataset, ["name"], types="all")) == 1:
            return dataset
    return None


def _claim(pool, uuid, name, description):
    """Make the unclaimed pool this SR: one zfs set, atomic."""
    log.info("pool %s was made by an SR.create that never finished, with "
             "this device-config, and never used: it becomes SR %s",
             pool, uuid)
    zfs.set_props(pool, {meta.SR_UUID: uuid,
                         meta.SR_NAME: values.encode_text(name),
                         meta.SR_DESCRIPTION: values.encode_text(description)})
    return pool


def _stored_config(configuration, dataset):
    pool = pools.pool_by_name(meta.pool_of(dataset))
    stored = dict(configuration)
    stored["pool-guid"] = pool["guid"]
    stored["sr_uuid"] = zfs.get_one(dataset, [meta.SR_UUID])[meta.SR_UUID]
    return stored


@wire.method("SR.create")
def create(dbg, uuid, configuration, name, description):
    names.check_uuid(uuid, "SR uuid", errors.InvalidArgument)
    cfg = devconfig.parse(configuration)
    devconfig.check_room(cfg)
    for key in ("pool-guid", "sr_uuid"):
        if key in configuration:
            raise errors.InvalidConfiguration(
                "device-config:%s is set by zfs-ng; do not give it to "
                "sr-create" % key)
    with lock.global_lock():
        found = inventory.find_srs()
        dataset = inventory.sr_in(found, uuid)
        unclaimed = None if dataset or cfg.source != "pool" else \
            _unclaimed(found, configuration)
        if dataset:  # a repeated create: answer as the first one did
            log.info("SR %s already exists at %s", uuid, dataset)
        elif unclaimed:
            dataset = _claim(unclaimed, uuid, name, description)
        elif cfg.source == "pool":
            dataset = _create_pool(uuid, cfg, name, description,
                                   configuration)
        else:
            dataset = _create_child(uuid, cfg, name, description)
        return _stored_config(configuration, dataset)


# --- attach / detach -------------------------------------------------------------

def _destroy_left(cfg):
    """The SR string of a pool whose SR.destroy was killed after zpool
    destroy (its clean-up is saved, see ``cleanup``), or None. xapi
    retries an SR.destroy with SR.attach first: attach answers this string,
    and SR.destroy of it finishes the clean-up."""
    plan = cleanup.load(cfg.pool_guid) if cfg.pool_guid else None
    return plan["pool"] + DESTROYING + cfg.pool_guid if plan else None


def _destroy_done(cfg, exc):
    """The SR string of an SR whose destroy is done (its answer lost, xapi
    retries it: SR.attach, then SR.destroy), or None: cleanup recorded a
    destroy of it, and what that destroys is absent (exc): its pool is
    neither imported nor importable, or its dataset is gone from its
    pool."""
    record = cleanup.destroy_record(cfg.sr_uuid) if cfg.sr_uuid else None
    absent = {"pool": errors.PoolNotFound,
              "dataset": errors.SR_does_not_exist}.get(
                  (record or {}).get("owner"), ())
    if not isinstance(exc, absent):
        return None
    return record["sr"] + DESTROYED + cfg.sr_uuid


def _not_found(cfg, exc):
    """SrNotFound for an SR whose storage is missing and no destroy of
    which is recorded: how to bring it back, or to forget it."""
    uuid = cfg.sr_uuid or "<the SR's uuid>"
    check = ("'zpool import' and 'zpool list' show no pool with guid %s"
             % cfg.pool_guid) if cfg.source == "pool" else (
        "with its pool imported, 'zfs get -r %s %s' shows no dataset "
        "with sr-uuid %s"
        % (meta.SR_UUID, meta.pool_of(cfg.parent or "?"), uuid))
    return errors.SrNotFound(
        "%s. If its disks are only missing, bring them back and plug the "
        "PBD again. If the SR was destroyed (an sr-destroy whose answer "
        "was lost, or by hand), check that it is really gone (%s), then "
        "forget it: xe sr-forget uuid=%s" % (exc.message, check, uuid))


def _attach_missing(cfg, exc):
    """SR.attach when the SR's pool or dataset cannot be found: the string
    SR.destroy finishes or ends a destroy with, else SrNotFound."""
    left = _destroy_left(cfg) \
        if isinstance(exc, errors.PoolNotFound) else None
    if left is not None:
        log.info("the SR's pool was destroyed; SR.destroy of %s "
                 "finishes cleaning its disks", left)
        return left
    left = _destroy_done(cfg, exc)
    if left is None:
        raise _not_found(cfg, exc)
    log.info("SR %s was destroyed (%s); SR.destroy of %s has nothing left "
             "to do", cfg.sr_uuid, exc.message, left)
    return left


def _forget_destroys(cfg):
    """The SR is there: a destroy of it recorded (plan, record) was killed
    before it destroyed anything."""
    if cfg.pool_guid and cleanup.load(cfg.pool_guid):
        cleanup.drop(cfg.pool_guid)
    if cfg.sr_uuid:
        cleanup.drop_destroy_record(cfg.sr_uuid)


@wire.method("SR.attach")
def attach(dbg, configuration):
    cfg = devconfig.parse(configuration, need_source=False)
    with lock.global_lock():
        try:
            dataset = poolimport.locate(cfg)
        except (errors.PoolNotFound, errors.SR_does_not_exist) as exc:
            return _attach_missing(cfg, exc)
        _forget_destroys(cfg)
    with lock.sr_lock(dataset):
        row = zfs.get_one(dataset, [meta.SR_UNCLAIMED, meta.SR_UUID])
        _claimed(dataset, row)
        collect.collect(dataset)  # finish what a crash may have left
    zvoldev.wait_for_links([r["name"] for r in zfs.list_datasets(
        dataset, ["name"], types="volume")], LINK_TIMEOUT)
    srmetrics.start(dataset, row[meta.SR_UUID])
    arcfloor.check(dataset, row[meta.SR_UUID])
    return dataset


def _claimed(sr, row):
    """The SR's first attach: remove the mark that lets a retried SR.create
    take the pool over (see _unclaimed); from now on it is in use."""
    if row[meta.SR_UNCLAIMED] is None:
        return
    try:
        zfs.inherit(sr, meta.SR_UNCLAIMED)
    except errors.ZfsError as exc:
        log.warning("%s: cannot remove %s: %s", sr, meta.SR_UNCLAIMED,
                    exc.message)


@wire.method("SR.detach")
def detach(dbg, sr):
    """The statistics writer is always stopped and its file deleted (so
    xcp-rrdd deregisters it), even when the pool is gone already; it is
    started again if the export fails, the SR staying attached."""
    # the SR lock too: no Volume call may run on a pool being exported
    with lock.global_lock(), lock.sr_lock(sr):
        try:
            row = inventory.sr_row(sr)
        except errors.Sr_not_attached:
            log.info("SR %s is not attached: nothing to detach", sr)
            srmetrics.stop_recorded(sr)
            return None
        srmetrics.stop(row[meta.SR_UUID])
        if row[meta.SR_OWNER] == "pool":
            _export(sr, row[meta.SR_UUID])
    return None


def _export(sr, sr_uuid):
    """zpool export of the SR's pool. The writer is stopped before (its
    commands on the pool could make the export busy); if the export
    fails, the SR stays attached, and so does its writer."""
    log.info("exporting pool %s", meta.pool_of(sr))
    try:
        pools.export_pool(meta.pool_of(sr))
    except errors.StorageError:
        srmetrics.start(sr, sr_uuid)
        raise


# --- destroy -------------------------------------------------------------------------

# What SR.attach returns for a pool whose SR.destroy was killed after
# "zpool destroy": <pool>#destroying-<guid>. No dataset has such a name
# ('#' is not allowed in one), so no call can take it for a live SR; only
# SR.destroy does something with it: it finishes the clean-up.
DESTROYING = "#destroying-"
# What SR.attach returns for an SR whose destroy is done, though xapi
# never got its answer: <pool or dataset>#destroyed-<sr uuid>. SR.stat
# answers it while cleanup's record of the destroy is there; SR.destroy of
# it has nothing left to do, and xapi then forgets the SR.
DESTROYED = "#destroyed-"


def _recorded_devices(row):
    """The devices SR.create was given (SR_DEVICES), [] if unreadable."""
    try:
        disks = json.loads(row.get(meta.SR_DEVICES) or "[]")
    except ValueError:
        return []
    return [d for d in disks if isinstance(d, str)] \
        if isinstance(disks, list) else []


def _destroy_pool(pool, row):
    """zpool destroy, then blank the pool's disks (see ``cleanup``): what
    to blank is decided and saved before, so that a destroy killed in
    between is finished by the next one."""
    guid = pools.pool_by_name(pool)["guid"]
    plan = cleanup.make(pool, pool, guid, pools.pool_leaves(pool),
                        _recorded_devices(row))
    cleanup.save(plan)
    cleanup.record_destroy(row[meta.SR_UUID], pool, "pool", guid)
    log.info("destroying pool %s, then cleaning %s", pool,
             ", ".join(t["path"] for t in plan["targets"]) or "nothing")
    try:
        pools.destroy_pool(pool)
    except errors.ZfsError:
        if pools.pool_by_guid(guid):
            cleanup.drop(guid)      # not destroyed: nothing to finish
            cleanup.drop_destroy_record(row[meta.SR_UUID])
        raise
    cleanup.finish(plan, check=False)


def _destroy_dataset(sr, row):
    """zfs destroy -r of an adopted SR's own dataset, recorded first (see
    ``cleanup``); the record is dropped if the dataset is still there."""
    cleanup.record_destroy(row[meta.SR_UUID], sr, "dataset")
    log.info("destroying SR dataset %s", sr)
    try:
        zfs.destroy(sr, recursive=True)
    except errors.StorageError:
        if _still_there(sr):        # else gone, or unreadable: kept
            cleanup.drop_destroy_record(row[meta.SR_UUID])
        raise


def _still_there(sr):
    try:
        inventory.sr_row(sr)
    except errors.StorageError:
        return False
    return True


def _finish_destroyed(sr):
    """SR.destroy of an SR that is not attached: finish the clean-up a
    killed destroy left, if any (see ``cleanup``)."""
    srmetrics.stop_recorded(sr)
    if DESTROYED in sr:
        log.info("SR %s was destroyed already: nothing left to do", sr)
        return
    if DESTROYING in sr:
        plans = [p for p in [cleanup.load(sr.partition(DESTROYING)[2])] if p]
    else:
        plans = cleanup.load_for(sr)
    if not plans:
        log.info("SR %s does not exist: already destroyed", sr)
    for plan in plans:
        log.info("finishing the clean-up of destroyed pool %s (guid %s)",
                 plan["pool"], plan["pool_guid"])
        cleanup.finish(plan)


FOREIGN_COLUMNS = ["name", "type", "defer_destroy", "origin", "used", "usedds",
                   meta.VDI_UUID, meta.DATAPATH_CLONE, meta.MIRROR_SINK]


def other_data(sr):
    """The datasets, snapshots and bookmarks below the SR dataset that
    zfs-ng did not make (ownership.made_by_zfsng), outermost only (what is below
    one of them is not named again). SR.destroy refuses while there is
    any: destroying the pool or the SR dataset would destroy them."""
    found = []
    for row in zfs.list_datasets(sr, FOREIGN_COLUMNS, types="all"):
        if row["name"] == sr or ownership.made_by_zfsng(row, sr) or \
                any(meta.below(row["name"], f) for f in found):
            continue
        found.append(row["name"])
    return found


def _refuse_other_data(sr):
    found = other_data(sr)
    if found:
        shown = ", ".join(found[:10]) + (
            " and %d more" % (len(found) - 10) if len(found) > 10 else "")
        raise errors.SrHoldsOtherData(
            "SR %s holds data zfs-ng did not create: %s. Destroying the SR "
            "would destroy it too; move it away or destroy it yourself "
            "(zfs rename, zfs destroy), then destroy the SR" % (sr, shown))


@wire.method("SR.destroy")
def destroy(dbg, sr):
    """Refused while the SR holds a VDI (SrNotEmpty) or anything zfs-ng did
    not make (SrHoldsOtherData); then the pool zfs-ng created is destroyed
    and its disks blanked, or the SR's own dataset destroyed."""
    with lock.global_lock(), lock.sr_lock(sr):
        try:
            row = inventory.sr_row(sr)
        except errors.Sr_not_attached:
            _finish_destroyed(sr)
            return None
        count = visible_volume_count(sr)
        if count:
            raise errors.SrNotEmpty(
                "SR %s still holds %d VDI(s); destroy them first"
                % (sr, count))
        _refuse_other_data(sr)
        srmetrics.stop(row[meta.SR_UUID])
        if row[meta.SR_OWNER] == "pool":
            _destroy_pool(meta.pool_of(sr), row)
        else:
            _destroy_dataset(sr, row)
    return None


# --- the rest ---------------------------------------------------------------------------

@wire.method("SR.stat")
def stat(dbg, sr):
    """The SR's record; a pool problem is also logged and, when it changed,
    sent as a XenAPI message in the background (``alert``)."""
    if DESTROYING in sr:
        return _stat_of_a_destroyed_pool(sr)
    if DESTROYED in sr:
        return _stat_of_a_destroyed_sr(sr)
    try:
        row = inventory.sr_row(sr)
    except errors.ZfsError as exc:
        record = _stat_of_a_dead_pool(sr)
        if record is None:
            raise exc
        return record
    state, sr_health = health.pool_health(meta.pool_of(sr))
    record = stat_of(sr, row, sr_health)
    alert.report(record, meta.pool_of(sr), state)
    return record


def _stat_of_a_destroyed_pool(sr):
    """SR.stat of what SR.attach answers for a pool whose SR.destroy was
    killed after ``zpool destroy``. xapi-storage-script's SR.attach calls
    SR.stat on the attach's answer before it records the SR as attached:
    refused, the plug fails and the retried sr-destroy never reaches
    SR.destroy. Answered (empty, Unavailable, saying what finishes it), the
    plug succeeds and SR.destroy, or SR.detach and sr-forget, follow. A
    scan is refused by xapi itself, as for any SR that is not Healthy."""
    pool, _, guid = sr.partition(DESTROYING)
    plan = cleanup.load(guid)
    if plan is None or plan.get("pool") != pool:
        raise errors.Sr_not_attached(sr)
    text = ("pool %s was destroyed by an SR.destroy that did not finish: "
            "'xe sr-destroy' again blanks its disks (%s)" % (
                pool, ", ".join(t["path"] for t in plan["targets"]) or
                "nothing left to blank"))
    return {"sr": sr, "name": pool, "description": text, "free_space": 0,
            "total_space": 0, "datasources": [], "clustered": False,
            "health": ["Unavailable", text]}


def _stat_of_a_destroyed_sr(sr):
    """SR.stat of what SR.attach answers for an SR whose destroy is done
    but whose answer was lost: answered (empty, Unavailable), so that the
    plug xapi makes before it retries SR.destroy succeeds."""
    dataset, _, uuid = sr.partition(DESTROYED)
    record = cleanup.destroy_record(uuid)
    if record is None or record.get("sr") != dataset:
        raise errors.Sr_not_attached(sr)
    text = ("SR %s was destroyed (%s is gone): 'xe sr-destroy' again "
            "forgets it" % (uuid, dataset))
    return {"sr": sr, "name": dataset, "uuid": uuid, "description": text,
            "free_space": 0, "total_space": 0, "datasources": [],
            "clustered": False, "health": ["Unavailable", text]}


def _stat_of_a_dead_pool(sr):
    """When ``zfs get`` fails because the pool cannot serve data (it is
    SUSPENDED: "pool I/O is currently suspended"): the SR's last answer,
    Unavailable. None when the pool serves data or there is no answer."""
    try:
        state, sr_health = health.pool_health(meta.pool_of(sr))
    except errors.StorageError:
        return None
    last = alert.last_record(sr)
    if state in health.SERVING or last is None:
        return None
    record = dict(last, health=sr_health)
    alert.report(record, meta.pool_of(sr), state)
    return record


@wire.method("SR.set_name")
def set_name(dbg, sr, new_name):
    with lock.sr_lock(sr):
        inventory.sr_row(sr)
        zfs.set_props(sr, {meta.SR_NAME: values.encode_text(new_name)})


@wire.method("SR.set_description")
def set_description(dbg, sr, new_description):
    with lock.sr_lock(sr):
        inventory.sr_row(sr)
        zfs.set_props(sr, {meta.SR_DESCRIPTION:
                           values.encode_text(new_description)})


@wire.method("SR.ls")
def ls(dbg, sr):
    return volume.list_volumes(sr)
