"""What SR.destroy blanks after ``zpool destroy``, decided before it.

zfs-ng blanks the disks of a pool it created when it destroys it, so that
they can take a new pool without force=true. It must never touch a disk
that is not in that pool: a device name recorded at SR.create may name
another disk since (a reboot that renamed disks, a hot-plug, a ``zpool
replace``). So, while the pool is still imported, the plan is made from
what the pool itself says and what its members' own labels say:

- each leaf the pool lists (``zpool list -v``: its path and vdev guid) is a
  target only if the ZFS label on that path (``zdb -l``) is that very vdev
  (same vdev guid, and for data and log devices the pool's guid); its
  clean-up is ``zpool labelclear``;
- a whole disk is a target only if it was given whole to zfs-ng at
  SR.create (``meta.SR_DEVICES``), one of its partitions is a proved leaf
  (ZFS partitions a whole disk), and it has a partition table, whose uuid
  is recorded; its clean-up is ``wipefs -a`` (the partition table ZFS
  wrote). A disk the admin added later (zpool replace, attach, add) only
  loses its ZFS label: zfs-ng was not given it whole.

The plan is written to PLAN_DIR, one file per pool guid, before ``zpool
destroy``, and removed once done. Every SR.destroy (of a pool or of an
adopted SR's dataset) also records, before its first destructive
command, that it destroys that SR (PLAN_DIR/sr/<sr uuid>.json), and keeps
the record: a retry whose first answer was lost proves with it that the
SR is gone (``destroy_record``). A destroy killed in between is finished
by the next SR.destroy (after the SR.attach xapi makes first, which finds
the plan): only once the pool is neither imported nor importable, and each
target only if it still is what the plan says (the same vdev guid in its
label, the same partition table uuid), whatever its name is by then.
"""

import os

from zfsng import errors, log, pools, runfiles
from zfsng_volume import devices

# Persistent: a plan must survive a reboot between zpool destroy and the
# clean-up. Tests point it elsewhere.
PLAN_DIR = "/var/lib/zfs-ng/destroy"


# --- making the plan -----------------------------------------------------------

def _proved_leaves(pool_guid, leaves):
    """[(path, vdev guid)] of the leaves whose own label says they are
    that vdev of that pool."""
    proved = []
    for path, guid in leaves:
        label = pools.vdev_label(path)
        if label and label.get("guid") == guid and \
                label.get("pool_guid", pool_guid) == pool_guid:
            proved.append((path, guid))
        else:
            log.warning("%s is listed in the pool (guid %s) but its label "
                        "says %s: it will not be cleaned", path, pool_guid,
                        label or "nothing")
    return proved


def _whole_disks(recorded, proved):
    """{leaf path: disk} for proved leaves that are a partition of a
    device given whole at SR.create."""
    leaf_names = dict((devices.kernel_name(path), path)
                      for path, _ in proved)
    found = {}
    for disk in recorded:
        try:
            rows = devices.lsblk(disk)
        except errors.DeviceNotFound:
            continue
        if not rows or rows[0].get("TYPE") != "disk":
            continue
        for row in rows[1:]:
            leaf = leaf_names.get(os.path.realpath(row.get("NAME", "")))
            if leaf and row.get("TYPE") == "part":
                found[leaf] = disk
    return found


def make(sr, pool, pool_guid, leaves, recorded):
    """The plan for destroying pool: leaves [(path, vdev guid)] as the
    pool lists them, recorded the devices SR.create was given."""
    proved = _proved_leaves(pool_guid, leaves)
    targets = [{"path": path, "vdev_guid": guid} for path, guid in proved]
    disks = _whole_disks(recorded, proved)
    for disk in sorted(set(disks.values())):
        ptuuid = devices.partition_table_uuid(disk)
        if ptuuid:
            targets.append({"path": disk, "ptuuid": ptuuid})
    return {"sr": sr, "pool": pool, "pool_guid": pool_guid,
            "targets": targets}


# --- keeping it ------------------------------------------------------------------

def _path(pool_guid):
    return os.path.join(PLAN_DIR, "%s.json" % pool_guid)


def save(plan):
    """Write the plan durably (it must outlive a crash or a reboot)."""
    runfiles.write_json(_path(plan["pool_guid"]), plan, durable=True)


def _read(path, key, value):
    """The JSON object at path whose key is value, or None (no file, or
    one that is not what its name says)."""
    try:
        found = runfiles.read_json(path)
    except (IOError, OSError):
        return None
    return found if isinstance(found, dict) and \
        found.get(key) == value else None


def load(pool_guid):
    """The plan saved for that pool, or None."""
    return _read(_path(pool_guid), "pool_guid", pool_guid)


def load_for(sr):
    """The saved plans of SR sr (several if pools of that name were
    destroyed one after the other and each killed)."""
    return [plan for guid, plan in runfiles.read_all_json(PLAN_DIR)
            if isinstance(plan, dict) and plan.get("pool_guid") == guid and
            plan.get("sr") == sr]


def drop(pool_guid):
    try:
        runfiles.remove(_path(pool_guid))
    except OSError:
        pass


# --- the record that a destroy of an SR was under way ------------------------

def _record_path(sr_uuid):
    return runfiles.file_name(os.path.join(PLAN_DIR, "sr"), sr_uuid, ".json")


def record_destroy(sr_uuid, sr, owner, pool_guid=None):
    """Record, durably and before the first destructive command, that SR
    sr_uuid (dataset sr; owner "pool" or "dataset", as meta.SR_OWNER) is
    being destroyed. Kept once done (a few hundred bytes per SR): xapi
    retries a destroy whose answer was lost, and only this says that a
    missing pool or dataset was destroyed rather than lost."""
    runfiles.write_json(_record_path(sr_uuid), {
        "sr_uuid": sr_uuid, "sr": sr, "owner": owner,
        "pool_guid": pool_guid}, durable=True)


def destroy_record(sr_uuid):
    """The record of SR sr_uuid's destroy, or None."""
    return _read(_record_path(sr_uuid), "sr_uuid", sr_uuid)


def drop_destroy_record(sr_uuid):
    """The SR is there after all: its destroy failed, or was killed
    before it destroyed anything."""
    try:
        runfiles.remove(_record_path(sr_uuid))
    except OSError:
        pass


# --- doing it --------------------------------------------------------------------------

def _destroyed(plan):
    """Whether the plan's pool is gone: neither imported nor importable
    from the devices it was on (a destroyed pool is not importable)."""
    guid = plan["pool_guid"]
    if pools.pool_by_guid(guid):
        return False
    dirs = []
    for target in plan["targets"]:
        dirs.extend(devices.family(target["path"]))
    if not dirs:
        return True
    return not [p for p in pools.importable_pools(sorted(set(dirs)))
                if p["guid"] == guid]


def _clean(target):
    """Clean one target if it still is what the plan says; a problem as
    text, or None."""
    path = target["path"]
    try:
        if "vdev_guid" in target:
            label = pools.vdev_label(path)
            if not label or label.get("guid") != target["vdev_guid"]:
                return None          # cleaned already, or another device
            pools.labelclear(path)
        elif devices.partition_table_uuid(path) == target["ptuuid"]:
            devices.wipe(path)
    except errors.StorageError as exc:
        return "%s: %s" % (path, exc.message)
    return None


def finish(plan, check=True):
    """Clean every target, then forget the plan. check: first make sure
    the pool was destroyed (a retry); returns False if it was not."""
    if check and not _destroyed(plan):
        log.warning("pool %s (guid %s) was not destroyed: its disks are "
                    "left as they are", plan["pool"], plan["pool_guid"])
        return False
    problems = [p for p in (_clean(t) for t in plan["targets"]) if p]
    for problem in problems:
        log.warning("pool %s destroyed, but cleaning a disk failed: %s",
                    plan["pool"], problem)
    drop(plan["pool_guid"])
    return True
