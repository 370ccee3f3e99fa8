"""SR.*: the storage repository lifecycle on a pool or an adopted dataset.

An SR is one dataset (see ``meta``). The string SR.attach returns, which xapi
passes back as ``sr`` in every later call, is that dataset's name (or, for
a pool whose SR.destroy was killed after ``zpool destroy``, a name only
SR.destroy acts on: DESTROYING).

Ownership rule: zfs-ng exports or destroys a pool only if it created it
(``sr-owner=pool``); on adopted storage it only ever touches the SR's own
child dataset. SR.destroy never destroys what zfs-ng did not make
(SrHoldsOtherData), and blanks only disks proved to be the pool's own
(``cleanup``).

Every multi-step SR operation is finished or undone by the next call: a
destroy killed after ``zpool destroy`` by the next SR.attach + SR.destroy
(the saved clean-up plan), a create killed after ``zpool create`` by the
retry xapi makes with a new SR uuid (the unclaimed pool, ``_unclaimed``).
"""

import json
import os

from zfsng import alert, cleanup, collect, devconfig, devices, errors, \
    hostid, inventory, log, lock, meta, names, volume, wire, zfs, zvoldev

LINK_TIMEOUT = 30.0  # seconds to wait for udev's /dev/zvol links on attach


# --- finding SRs -------------------------------------------------------------

def find_srs(pool=None):
    """[(dataset, sr uuid)] of the zfs-ng SRs in one or all imported pools."""
    return zfs.find_local(meta.SR_UUID, pool)


def find_sr_by_uuid(sr_uuid, pool=None):
    return _sr_in(find_srs(pool), sr_uuid)


def _sr_in(found, sr_uuid):
    for dataset, value in found:
        if value == sr_uuid:
            return dataset
    return None


def visible_volume_count(sr):
    return len(volume.list_volumes(sr))


# --- health -------------------------------------------------------------------

# zpool states in which the pool still serves every block: ONLINE, and
# DEGRADED (redundancy or a log device lost, every block still readable).
# Any other (FAULTED, UNAVAIL, SUSPENDED...) means it cannot serve data.
SERVING = ("ONLINE", "DEGRADED")


# Leaf states of a device that no longer holds its share of the pool's
# data. A leaf under "cache" or "spares" holds no data: losing it loses no
# redundancy (a faulted cache device leaves the pool ONLINE, rightly).
LOST = ("FAULTED", "UNAVAIL", "REMOVED", "OFFLINE")
NO_DATA_SECTIONS = ("cache", "spares")


def _status_reason(pool):
    """(one line from ``zpool status -x``: its status sentence and bad
    devices, "" for a pool with no problem to report; whether a device
    that holds data, or a log device, is lost)."""
    try:
        text = zfs.pool_status(pool, problems_only=True)
    except errors.ZfsError as exc:
        return exc.message, False
    status, bad, in_status, in_config = [], [], False, False
    section, lost = None, False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("status:"):
            in_status = True
            status.append(stripped[len("status:"):].strip())
            continue
        if in_status and line.startswith(("\t", "        ")) and stripped:
            status.append(stripped)
            continue
        in_status = False
        if stripped.startswith("config:"):
            in_config = True
        elif stripped.startswith("errors:"):
            in_config = False
        elif in_config:
            words = stripped.split()
            if len(words) == 1:     # a section: logs, cache, spares...
                section = words[0]
            if len(words) < 2:
                continue
            # a disk missing since import is shown by its guid, with
            # "was <path>" at the end of the line
            path = words[-1] if words[-2] == "was" else words[0]
            if path.startswith("/") and words[1] != "ONLINE":
                bad.append("%s %s" % (path, words[1]))
                if words[1] in LOST and section not in NO_DATA_SECTIONS:
                    lost = True
    reason = " ".join(status)
    if bad:
        reason += (" " if reason else "") + "Devices: %s." % ", ".join(bad)
    return reason, lost


def pool_health(pool):
    """(zpool state, v5 health) of pool: Healthy while it serves every
    block, with the problem as text if it has one; else Unavailable.

    Why never Recovering (nor Unreachable): since xen-api v24.29.0 SR.scan
    (``stat_with_retry`` in xapi-storage-script) fails with SR_UNHEALTHY
    for any health but Healthy, after retrying Unreachable 3 times. A
    DEGRADED mirror reported as Recovering would block scans, and every
    tool that scans (Xen Orchestra's disk views), exactly while ZFS keeps
    the data available. xapi drops Healthy's text; ``alert`` tells the
    admin (SMlog, a XenAPI message) and Plugin.diagnostics leads with it.

    An ONLINE pool with a lost data or log device is DEGRADED here: OpenZFS
    2.3 faults a mirror leg that fails every I/O ("too many errors") and
    still calls the pool and the mirror ONLINE (seen by the fault
    campaign, tests/faults/storage.py mirror-loss), though the pool has
    lost that leg's redundancy just as after ``zpool offline``. The admin
    must hear it as the DEGRADED pool it is (ZFSNG_POOL_DEGRADED, priority
    2), not as a minor problem of an ONLINE one.
    """
    row = zfs.pool_by_name(pool)
    state = row["health"] if row else "UNAVAIL"
    problem, lost = _status_reason(pool)
    if state == "ONLINE" and not problem:
        return state, ["Healthy", ""]
    shown = state
    if state == "ONLINE" and lost:
        state = "DEGRADED"
        shown = "DEGRADED (zpool says ONLINE, but a device is lost)"
    text = ("pool %s is %s. %s" % (pool, shown, problem)).strip()
    if state == "SUSPENDED" and row and row.get("multihost") == "on":
        text += " " + SUSPENDED_MULTIHOST
    return state, ["Healthy" if state in SERVING else "Unavailable", text]


# zpool status tells the admin to run 'zpool clear' on a suspended pool.
# On a pool with multihost on (every pool zfs-ng creates) OpenZFS does not
# resume it: in the fault campaign's disk-loss, once the disk was back,
# 2.1 refused the clear ("invalid argument for this pool operation") and
# on 2.3 it hung in the kernel for good, and every later zpool command
# with it (openzfs/zfs issues 19033 and 19036). A reboot is the only way
# out, so the admin hears it first.
SUSPENDED_MULTIHOST = (
    "The pool has multihost on: OpenZFS does not resume it with 'zpool "
    "clear' (2.1 refuses it, later versions may hang it and every later "
    "zpool command: openzfs/zfs issues 19033, 19036). Reconnect the disks "
    "and reboot the host; plugging the SR in again imports the pool.")


def health(pool):
    return pool_health(pool)[1]


def stat_of(sr, row=None, sr_health=None):
    row = row or inventory.sr_row(sr)
    used, available = int(row["used"]), int(row["available"])
    return {"sr": sr, "uuid": row[meta.SR_UUID],
            "name": meta.decode_text(row[meta.SR_NAME]),
            "description": meta.decode_text(row[meta.SR_DESCRIPTION]),
            "free_space": available, "total_space": used + available,
            "datasources": [], "clustered": False,
            "health": sr_health or health(meta.pool_of(sr))}


# --- create ---------------------------------------------------------------------

def _sr_props(uuid, cfg, name, description, owner, configuration=None):
    props = {
        "volmode": "dev",            # dom0 never scans guests' partitions
        "compression": cfg.compression,
        "dedup": cfg.dedup,
        meta.SR_UUID: uuid,
        meta.SR_NAME: meta.encode_text(name),
        meta.SR_DESCRIPTION: meta.encode_text(description),
        meta.SR_OWNER: owner,
        meta.SR_PROVISIONING: cfg.provisioning,
        meta.SR_VOLBLOCKSIZE: str(cfg.volblocksize),
        meta.SR_FORMAT: meta.FORMAT_VERSION,
    }
    if cfg.sync:
        props["sync"] = cfg.sync
    if owner == "pool":
        props[meta.SR_DEVICES] = meta.encode_keys(cfg.devices)
        props[meta.SR_UNCLAIMED] = meta.encode_keys(configuration)
    return props


def _choose_pool_name(uuid, cfg, name):
    taken = set(p["name"] for p in zfs.list_pools())
    if cfg.pool_name:
        if cfg.pool_name in taken:
            raise errors.PoolNameTaken(
                "a pool named '%s' is already imported; choose another "
                "device-config:pool-name" % cfg.pool_name)
        return cfg.pool_name
    if names.valid_pool_name(name) and name not in taken and \
            meta.room_for(name) >= 0:
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
    pool_props = {"cachefile": "none", "multihost": "on"}
    if cfg.ashift is not None:
        pool_props["ashift"] = str(cfg.ashift)
    log.info("creating pool %s on %s", pool, " ".join(cfg.vdev_args))
    zfs.create_pool(pool, cfg.vdev_args, pool_props,
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
    wanted = meta.encode_keys(configuration)
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
                         meta.SR_NAME: meta.encode_text(name),
                         meta.SR_DESCRIPTION: meta.encode_text(description)})
    return pool


def _stored_config(configuration, dataset):
    pool = zfs.pool_by_name(meta.pool_of(dataset))
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
        found = find_srs()
        dataset = _sr_in(found, uuid)
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

def _label_of(cfg):
    """The ZFS label of the SR's pool on one of its configured disks (or
    their partitions), or None when none can be read."""
    for device in cfg.devices:
        for member in devices.family(device):
            label = zfs.read_label(member)
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
        zfs.import_pool(cfg.pool_guid)
    except errors.PoolNameCollision:
        name = _free_pool_name(cfg)
        log.warning("an imported pool has the name of the SR's pool (guid "
                    "%s): importing it as %s", cfg.pool_guid, name)
        zfs.import_pool(cfg.pool_guid, new_name=name)


def _free_pool_name(cfg):
    """zfsng-<sr uuid prefix> (the name SR.create falls back to), else
    zfsng-<pool guid>, whichever no imported pool has."""
    taken = set(p["name"] for p in zfs.list_pools())
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
        pool = zfs.pool_by_guid(cfg.pool_guid)
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
        return zfs.pool_by_guid(cfg.pool_guid)["name"]
    if cfg.parent:
        name = meta.pool_of(cfg.parent)
        if not zfs.pool_by_name(name):
            raise errors.PoolNotFound("pool '%s' is not imported" % name)
        return name
    raise errors.InvalidConfiguration(
        "device-config needs pool-guid and sr_uuid to attach; "
        "'xe sr-probe type=zfs-ng device-config:device=...' prints them")


def _locate(cfg):
    pool = _ensure_imported(cfg)
    found = find_srs(pool)
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


def _destroy_left(cfg):
    """The SR string of a pool whose SR.destroy was killed after zpool
    destroy (its clean-up is saved, see ``cleanup``), or None. xapi
    retries an SR.destroy with SR.attach first: attach answers this string,
    and SR.destroy of it finishes the clean-up."""
    plan = cleanup.load(cfg.pool_guid) if cfg.pool_guid else None
    return plan["pool"] + DESTROYING + cfg.pool_guid if plan else None


@wire.method("SR.attach")
def attach(dbg, configuration):
    cfg = devconfig.parse(configuration, need_source=False)
    with lock.global_lock():
        try:
            dataset = _locate(cfg)
        except errors.PoolNotFound:
            left = _destroy_left(cfg)
            if left is None:
                raise
            log.info("the SR's pool was destroyed; SR.destroy of %s "
                     "finishes cleaning its disks", left)
            return left
        if cfg.pool_guid and cleanup.load(cfg.pool_guid):
            cleanup.drop(cfg.pool_guid)  # killed before zpool destroy
    with lock.sr_lock(dataset):
        _claimed(dataset)
        collect.collect(dataset)  # finish what a crash may have left
    zvoldev.wait_for_links([r["name"] for r in zfs.list_datasets(
        dataset, ["name"], types="volume")], LINK_TIMEOUT)
    return dataset


def _claimed(sr):
    """The SR's first attach: remove the mark that lets a retried SR.create
    take the pool over (see _unclaimed); from now on it is in use."""
    if zfs.get_one(sr, [meta.SR_UNCLAIMED])[meta.SR_UNCLAIMED] is None:
        return
    try:
        zfs.inherit(sr, meta.SR_UNCLAIMED)
    except errors.ZfsError as exc:
        log.warning("%s: cannot remove %s: %s", sr, meta.SR_UNCLAIMED,
                    exc.message)


@wire.method("SR.detach")
def detach(dbg, sr):
    # the SR lock too: no Volume call may run on a pool being exported
    with lock.global_lock(), lock.sr_lock(sr):
        try:
            row = inventory.sr_row(sr)
        except errors.Sr_not_attached:
            log.info("SR %s is not attached: nothing to detach", sr)
            return None
        if row[meta.SR_OWNER] == "pool":
            log.info("exporting pool %s", meta.pool_of(sr))
            zfs.export_pool(meta.pool_of(sr))
    return None


# --- destroy -------------------------------------------------------------------------

# What SR.attach returns for a pool whose SR.destroy was killed after
# "zpool destroy": <pool>#destroying-<guid>. No dataset has such a name
# ('#' is not allowed in one), so no call can take it for a live SR; only
# SR.destroy does something with it: it finishes the clean-up.
DESTROYING = "#destroying-"


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
    guid = zfs.pool_by_name(pool)["guid"]
    plan = cleanup.make(pool, pool, guid, zfs.pool_leaves(pool),
                        _recorded_devices(row))
    cleanup.save(plan)
    log.info("destroying pool %s, then cleaning %s", pool,
             ", ".join(t["path"] for t in plan["targets"]) or "nothing")
    try:
        zfs.destroy_pool(pool)
    except errors.ZfsError:
        if zfs.pool_by_guid(guid):
            cleanup.drop(guid)      # not destroyed: nothing to finish
        raise
    cleanup.finish(plan, check=False)


def _finish_destroyed(sr):
    """SR.destroy of an SR that is not attached: finish the clean-up a
    killed destroy left, if any (see ``cleanup``)."""
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


FOREIGN_COLUMNS = ["name", "type", "defer_destroy", "origin", "usedds",
                   meta.VDI_UUID, meta.DATAPATH_CLONE]


def other_data(sr):
    """The datasets, snapshots and bookmarks below the SR dataset that
    zfs-ng did not make (meta.made_by_zfsng), outermost only (what is below
    one of them is not named again). SR.destroy refuses while there is
    any: destroying the pool or the SR dataset would destroy them."""
    found = []
    for row in zfs.list_datasets(sr, FOREIGN_COLUMNS, types="all"):
        if row["name"] == sr or meta.made_by_zfsng(row, sr) or \
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
        if row[meta.SR_OWNER] == "pool":
            _destroy_pool(meta.pool_of(sr), row)
        else:
            log.info("destroying SR dataset %s", sr)
            zfs.destroy(sr, recursive=True)
    return None


# --- the rest ---------------------------------------------------------------------------

@wire.method("SR.stat")
def stat(dbg, sr):
    """The SR's record; a pool problem is also logged and, when it changed,
    sent as a XenAPI message in the background (``alert``)."""
    if DESTROYING in sr:
        return _stat_of_a_destroyed_pool(sr)
    try:
        row = inventory.sr_row(sr)
    except errors.ZfsError as exc:
        record = _stat_of_a_dead_pool(sr)
        if record is None:
            raise exc
        return record
    state, sr_health = pool_health(meta.pool_of(sr))
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


def _stat_of_a_dead_pool(sr):
    """When ``zfs get`` fails because the pool cannot serve data (it is
    SUSPENDED: "pool I/O is currently suspended"): the SR's last answer,
    Unavailable. None when the pool serves data or there is no answer."""
    try:
        state, sr_health = pool_health(meta.pool_of(sr))
    except errors.StorageError:
        return None
    last = alert.last_record(sr)
    if state in SERVING or last is None:
        return None
    record = dict(last, health=sr_health)
    alert.report(record, meta.pool_of(sr), state)
    return record


@wire.method("SR.set_name")
def set_name(dbg, sr, new_name):
    with lock.sr_lock(sr):
        inventory.sr_row(sr)
        zfs.set_props(sr, {meta.SR_NAME: meta.encode_text(new_name)})


@wire.method("SR.set_description")
def set_description(dbg, sr, new_description):
    with lock.sr_lock(sr):
        inventory.sr_row(sr)
        zfs.set_props(sr, {meta.SR_DESCRIPTION:
                           meta.encode_text(new_description)})


@wire.method("SR.ls")
def ls(dbg, sr):
    return volume.list_volumes(sr)


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
    config["pool-guid"] = zfs.pool_by_name(meta.pool_of(dataset))["guid"]
    config["sr_uuid"] = sr_uuid
    return config


def _probe_pool(configuration, pool):
    return [{"configuration": _probe_config(configuration, ds, uuid),
             "complete": True, "sr": stat_of(ds), "extra_info": {}}
            for ds, uuid in find_srs(pool)]


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
        zfs.import_pool(guid, search_dirs=dirs, readonly=True, mount=False)
    except errors.PoolNameCollision:
        zfs.import_pool(guid, search_dirs=dirs, readonly=True, mount=False,
                        new_name="zfsng-probe-" + guid)


def _probe_exported(configuration, cfg, dirs):
    """Import each importable candidate read-only, read its SRs, export."""
    results = []
    for pool in zfs.importable_pools(dirs):
        if cfg.parent and pool["name"] != meta.pool_of(cfg.parent):
            continue
        try:
            _import_to_read(pool["guid"], dirs)
        except errors.ZfsError as exc:
            log.info("probe: cannot read pool %s (%s): %s", pool["name"],
                     pool["guid"], exc.message)
            continue
        name = zfs.pool_by_guid(pool["guid"])["name"]
        try:
            results += _probe_pool(configuration, name)
        finally:
            zfs.export_pool(name)
    return results


@wire.method("SR.probe")
def probe(dbg, configuration):
    cfg = devconfig.parse(configuration, need_source=False)
    results = []
    with lock.global_lock():
        dirs = _search_dirs(cfg)
        for pool in zfs.list_pools():
            leaves = zfs.pool_leaf_devices(pool["name"]) \
                if cfg.devices else []
            if _pool_matches(cfg, pool["name"], leaves):
                results += _probe_pool(configuration, pool["name"])
        results += _probe_exported(configuration, cfg, dirs)
    return results
