"""Checks that the disks an admin names are safe to turn into a pool.

SR.create must refuse, before it writes anything, a device that does not
exist, is mounted or used as swap, is held by LVM/dm/md, belongs to an
imported pool, or (without ``force=true``) carries a filesystem, partition
table or pool label. Each refusal names the device and what to do.

A device given by its kernel name is put in the pool by its stable
/dev/disk/by-id name (``stable_name``); SR.destroy's clean-up (``cleanup``)
uses the lookups here too.

Everything is asked of lsblk, blkid, udevadm and zpool through the command
runner, so the checks run the same against a fake in unit tests.
"""

import os
import re

from zfsng import errors, pools, runner, udev

_PAIR_RE = r'([A-Z:-]+)="([^"]*)"'
_HOLDER_TYPES = ("lvm", "crypt", "dm", "mpath", "md", "raid0", "raid1",
                 "raid4", "raid5", "raid6", "raid10", "linear")


def lsblk(device):
    """Rows (dicts NAME/TYPE/MOUNTPOINT) for the device and its children."""
    # -P (key="value" pairs) lists the device, then everything below it;
    # util-linux refuses it together with -l.
    result = runner.run(["lsblk", "-n", "-p", "-P",
                         "-o", "NAME,TYPE,MOUNTPOINT", device])
    if result.rc != 0:
        raise errors.DeviceNotFound(_not_found(device, result.err))
    return [dict(re.findall(_PAIR_RE, line))
            for line in result.out.splitlines()
            if line.strip()]


def _not_found(device, err):
    """Why lsblk refused device. It says "not a block device" for a path
    that does not exist too: an admin who mistyped a name hears that."""
    if not os.path.exists(device):
        return "device %s does not exist" % device
    return "device %s: %s" % (device, err.strip() or "not a block device")


def family(device):
    """Real paths of a device and of everything below it (partitions,
    holders), or [] when it does not exist."""
    try:
        rows = lsblk(device)
    except errors.DeviceNotFound:
        return []
    return [os.path.realpath(r["NAME"]) for r in rows if r.get("NAME")]


def kernel_name(path):
    """The kernel's name of the device path names (/dev/sdb for a
    /dev/disk/by-id link), or None when there is no such device."""
    try:
        return os.path.realpath(lsblk(path)[0]["NAME"])
    except (errors.DeviceNotFound, IndexError, KeyError):
        return None


def _blkid(device):
    """(exit status, {KEY: value}, stderr) of ``blkid -p -o export``."""
    result = runner.run(["blkid", "-p", "-o", "export", device])
    found = {}
    for line in result.out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key] = value
    return result.rc, found, result.err.strip()


def partition_table_uuid(device):
    """The uuid of the device's partition table (GPT's disk GUID, which
    ZFS writes new when it partitions a whole disk), or None."""
    rc, found, _ = _blkid(device)
    return found.get("PTUUID") if rc == 0 else None


def _signatures(device):
    """What blkid recognises on the device ({} when it is blank)."""
    rc, found, err = _blkid(device)
    if rc == 2:                 # blkid: nothing found
        return {}
    if rc == 8:                 # blkid: several signatures (ambivalent)
        return {"TYPE": "several signatures (%s)" % err}
    if rc != 0:
        raise errors.DeviceNotFound("device %s: blkid: %s" % (device, err))
    return dict((k, v) for k, v in found.items()
                if k in ("TYPE", "PTTYPE", "LABEL"))


def stable_name(device):
    """A /dev/disk/by-id name of the device when it is given by its kernel
    name (/dev/sdb, /dev/nvme0n1p3): kernel names change with a reboot, a
    hot-plug or a new controller; by-id names (wwn-, ata-, nvme-, scsi-...)
    follow the disk. A wwn- name is preferred (unique by design), then the
    first in order. Any other path (already by-id, /dev/mapper/...) is kept
    as given, and so is a device udev gives no by-id name.
    """
    if os.path.dirname(device) != "/dev":
        return device
    found = udev.links(device)[0] or []
    links = ["/dev/" + link for link in found
             if link.startswith("disk/by-id/") and
             not link.startswith("disk/by-id/lvm-pv-uuid-")]
    if not links:
        return device
    return sorted(links, key=lambda l: (
        not os.path.basename(l).startswith("wwn-"), l))[0]


def _pool_members():
    """{kernel device path: pool name} for every leaf of every imported
    pool (leaves may be named by udev links)."""
    members = {}
    for pool in pools.list_pools():
        for path in pools.pool_leaf_devices(pool["name"]):
            members[kernel_name(path) or path] = pool["name"]
    return members


def _check_family(device, rows, members):
    """rows: lsblk's, the device's own first, then what is built on it.

    Only something built on the device (a partition's LVM volume, an md
    array, a dm-crypt mapping, a multipath map over a path) holds it; the
    device's own type is no holder: a multipath map, an md array or an
    open dm-crypt mapping given in device-config is itself the disk.
    """
    for index, row in enumerate(rows):
        name, kind = row.get("NAME", ""), row.get("TYPE", "")
        mount = row.get("MOUNTPOINT", "")
        if mount == "[SWAP]":
            raise errors.DeviceInUse("device %s: %s is in use as swap"
                                     % (device, name))
        if mount:
            raise errors.DeviceInUse("device %s: %s is mounted on %s"
                                     % (device, name, mount))
        if index and kind in _HOLDER_TYPES:
            raise errors.DeviceInUse(
                "device %s is held by %s (%s); release it first"
                % (device, name, kind))
        pool = members.get(os.path.realpath(name))
        if pool:
            raise errors.DeviceInUse(
                "device %s (%s) belongs to imported pool '%s'"
                % (device, name, pool))


def check_free(devices, force):
    """Raise unless every device can become part of a new pool."""
    members = _pool_members()
    for device in devices:
        _check_family(device, lsblk(device), members)
    if force:
        return
    for device in devices:
        found = _signatures(device)
        if found:
            what = ", ".join("%s=%s" % kv for kv in sorted(found.items()))
            raise errors.DeviceHasData(
                "device %s is not blank (%s); if its data may be destroyed, "
                "add device-config:force=true" % (device, what))


def wipe(device):
    """Erase the signatures on device (``wipefs -a``): the partition table
    ZFS wrote on a whole disk, so it takes a new pool without force."""
    result = runner.run(["wipefs", "-a", device])
    if result.rc != 0:
        raise errors.DeviceInUse("%s: %s" % (device, result.err.strip()))
