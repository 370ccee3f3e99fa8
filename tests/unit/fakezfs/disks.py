"""The fake host's block devices: lsblk, blkid, wipefs, udevadm.

``Disks``, a mixin of ``FakeZfs``: the test set-up of disks, partitions
and holders (``add_disk``, ``add_partition``, ``rename_disk``...), what
befalls a pool's leaves (``offline``, ``fault``, ``lose``, ``replace``...)
and the util-linux and udev commands zfs-ng runs on devices.
"""

import re

from .model import GiB, CommandError, Device, _Unknown


class Disks(object):
    """Block devices, their signatures and links, and pools' leaves."""

    # --- test set-up: disks, and the state of pools and their leaves -------

    def add_disk(self, path, size=10 * GiB, fs=None, pttype=None,
                 mountpoint="", kind="disk", by_id=None, ashift=9):
        """A disk; by_id: its udev name under /dev/disk/by-id (its
        partitions get <by_id>-part<N>, as udev names them); ashift: the
        one ZFS detects on it (9: 512-byte sectors, 12: 4 KiB)."""
        sigs = []
        if pttype:
            sigs.append({"PTTYPE": pttype, "PTUUID": "0c0ffee0"})
        if fs:
            sigs.append({"TYPE": fs, "USAGE": "filesystem"})
        self.devices[path] = Device(path, size, kind, None, mountpoint, sigs)
        self.devices[path].ashift = ashift
        if by_id:
            self.links["/dev/disk/by-id/" + by_id] = path
        return path

    def by_id(self, path):
        """The /dev/disk/by-id link of a kernel device (None without)."""
        links = [l for l, t in self.links.items() if t == path and
                 l.startswith("/dev/disk/by-id/")]
        return links[0] if links else None

    def rename_disk(self, old, new):
        """After a reboot or a hot-plug the disk old is called new (its
        partitions too); its by-id links follow it. An imported pool's
        leaves named by the kernel name follow too: ZFS finds its devices
        again at import and keeps the names it found."""
        moves = [(d.path, new + d.path[len(old):]) for d in self._family(old)]
        for before, after in moves:
            dev = self.devices.pop(before)
            dev.path = after
            dev.parent = dev.parent and new + dev.parent[len(old):]
            dev.children = [new + c[len(old):] for c in dev.children]
            self.devices[after] = dev
            for link, target in list(self.links.items()):
                if target == before:
                    self.links[link] = after
            for pool in self.pools:
                for leaf in pool.leaves():
                    if leaf.path == before:
                        leaf.path = after

    def replace(self, pool, old_leaf, new_disk):
        """The admin's ``zpool replace <pool> <old leaf> <new disk>``,
        resilvered: the new disk is partitioned and labelled, the old
        leaf's device keeps its (now stale) label, as ZFS leaves it."""
        pool = self.pool(pool)
        for vdev in pool.vdevs:
            for index, leaf in enumerate(vdev.leaves):
                if leaf.path == old_leaf:
                    vdev.leaves[index] = self._make_leaf(pool, new_disk,
                                                         vdev.klass)
                    return vdev.leaves[index].path
        raise KeyError(old_leaf)

    def _dev(self, path):
        """The device a path names (a kernel name or a udev link)."""
        return self.devices.get(self.links.get(path, path))

    def add_partition(self, disk, number, size=None, fs=None, mountpoint=""):
        parent = self.devices[disk]
        path = self._part_name(disk, number)
        size = size or parent.size // 2
        sigs = [{"TYPE": fs, "USAGE": "filesystem"}] if fs else []
        self.devices[path] = Device(path, size, "part", disk, mountpoint,
                                    sigs)
        self._link_partition(disk, path, number)
        parent.children.append(path)
        if not any("PTTYPE" in s for s in parent.signatures):
            parent.signatures.append({"PTTYPE": "gpt", "PTUUID": "0c0ffee1"})
        return path

    def add_holder(self, parent, path, kind="lvm", mountpoint=""):
        self.devices[path] = Device(path, self.devices[parent].size, kind,
                                    parent, mountpoint)
        self.devices[parent].children.append(path)
        return path

    def _leaf(self, path):
        for pool in self.pools:
            if pool.state != "ACTIVE":
                continue
            for leaf in pool.leaves():
                if leaf.path == path:
                    return pool, leaf
        raise KeyError("no leaf %s in an imported pool" % path)

    def offline(self, path):
        """``zpool offline``: the leaf is OFFLINE."""
        self._leaf(path)[1].state = "OFFLINE"

    def online(self, path):
        """``zpool online``: the leaf is ONLINE again."""
        self._leaf(path)[1].state = "ONLINE"

    def fault(self, path):
        """The leaf failed with too many errors."""
        leaf = self._leaf(path)[1]
        leaf.state, leaf.aux, leaf.errors = "FAULTED", "too many errors", \
            (3, 41, 0)

    def lose(self, path):
        """The leaf's disk is gone (as after an import without it)."""
        leaf = self._leaf(path)[1]
        leaf.state, leaf.present = "UNAVAIL", False

    def set_health(self, pool, state):
        """Force the pool's state (FAULTED, SUSPENDED...)."""
        self.pool(pool).health_override = state

    def resilver(self, pool, running=True):
        """A resilver is running (or has ended): zpool status says so."""
        self.pool(pool).resilvering = running

    # --- block devices -------------------------------------------------------

    def _family(self, path):
        """The device and everything below it, lsblk's -l order."""
        out = [self._dev(path)]
        for child in out[0].children:
            out.extend(self._family(child))
        return out

    def _link_partition(self, disk, part, number):
        """udev's by-id link of a partition: its disk's, -part<N>."""
        link = self.by_id(disk)
        if link:
            self.links["%s-part%d" % (link, number)] = part

    def _udevadm_info(self, argv):
        """``udevadm info --query=symlink --name=<dev>``: the device's
        links, relative to /dev, space-separated."""
        if len(argv) != 4 or argv[2] != "--query=symlink" or \
                not argv[3].startswith("--name="):
            raise _Unknown()
        name = argv[3][len("--name="):]
        dev = self._dev(name)
        if dev is None:
            raise CommandError('Unknown device "%s": No such device' % name)
        links = sorted(l[len("/dev/"):] for l, t in self.links.items()
                       if t == dev.path)
        return " ".join(links) + "\n"

    def _lsblk(self, argv):
        """``lsblk -n -p -P -o NAME,TYPE,MOUNTPOINT <dev>``, the one form
        zfs-ng sends (devices.lsblk)."""
        if argv[1:-1] != ["-n", "-p", "-P", "-o", "NAME,TYPE,MOUNTPOINT"]:
            raise _Unknown()
        path = argv[-1]
        if self._dev(path) is None:
            raise CommandError("lsblk: %s: not a block device" % path, rc=32)
        lines = ['NAME="%s" TYPE="%s" MOUNTPOINT="%s"'
                 % (dev.path, dev.kind, dev.mountpoint)
                 for dev in self._family(path)]
        return "\n".join(lines) + "\n"

    def _blkid_signatures(self, dev):
        sigs = [dict(s) for s in dev.signatures]
        # libblkid finds no zfs_member on a cache or spare device: their
        # labels hold no uberblock
        if dev.label and dev.label.get("klass") not in ("cache", "spare"):
            sigs.append({"LABEL": dev.label["pool"],
                         "UUID": dev.label["guid"],
                         "UUID_SUB": dev.label["leaf_guid"],
                         "TYPE": "zfs_member", "USAGE": "filesystem"})
        return sigs

    def _blkid(self, argv):
        if argv[1:-1] != ["-p", "-o", "export"]:
            raise _Unknown()
        path = argv[-1]
        if self._dev(path) is None:
            raise CommandError("blkid: error: %s: No such file or directory"
                               % path, rc=2)
        sigs = self._blkid_signatures(self._dev(path))
        if not sigs:
            raise CommandError("", rc=2)   # nothing found: silent, exit 2
        if len([s for s in sigs if "TYPE" in s]) > 1:
            raise CommandError(
                "blkid: %s: ambivalent result (probably more filesystems on "
                "the device, use wipefs(8) to see more details)" % path, rc=8)
        lines = ["DEVNAME=%s" % path]
        for sig in sigs:
            lines += ["%s=%s" % kv for kv in sorted(sig.items())]
        return "\n".join(lines) + "\n"

    def _in_use(self, dev):
        """Mounted, or opened by an imported pool (one of its leaves now:
        a stale label of a replaced disk opens nothing)."""
        for member in self._family(dev.path):
            if member.mountpoint or self._member_of_active(member):
                return True
        return False

    def _member_of_active(self, dev):
        """The imported pool that has dev as a leaf now, or None."""
        for pool in self.pools:
            if pool.state == "ACTIVE" and [
                    leaf for leaf in pool.leaves()
                    if self._dev(leaf.path) is dev]:
                return pool
        return None

    def _wipefs(self, argv):
        if len(argv) != 3 or argv[1] != "-a":
            raise _Unknown()
        path = argv[2]
        if self._dev(path) is None:
            raise CommandError("wipefs: error: %s: probing initialization "
                               "failed: No such file or directory" % path)
        dev = self._dev(path)
        if self._in_use(dev):
            raise CommandError("wipefs: error: %s: probing initialization "
                               "failed: Device or resource busy" % path)
        lines = []
        for sig in self._blkid_signatures(dev):
            kind = sig.get("PTTYPE") or sig.get("TYPE")
            lines.append("%s: 8 bytes were erased at offset 0x00000200 (%s)"
                         ": 45 46 49 20 50 41 52 54" % (path, kind))
            if "PTTYPE" in sig:
                for child in list(dev.children):
                    if self.devices[child].kind == "part":
                        self._remove_device(child)
                        dev.children.remove(child)
        dev.signatures, dev.label = [], None
        return "\n".join(lines) + ("\n" if lines else "")

    def _remove_device(self, path):
        for child in self.devices[path].children:
            self._remove_device(child)
        del self.devices[path]
        for link, target in list(self.links.items()):
            if target == path:
                del self.links[link]

    def _udevadm_settle(self, argv):
        if len(argv) != 3 or not re.match(r"^--timeout=[0-9]+$", argv[2]):
            raise _Unknown()
        return ""
