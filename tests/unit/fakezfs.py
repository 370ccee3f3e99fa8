"""fakezfs: an in-memory host with OpenZFS 2.1 for zfs-ng's unit tests.

zfs-ng runs every external program through ``zfsng.runner``; the unit tests
install a ``FakeZfs`` there (``runner.set_runner``) and fake nothing else.
The fake keeps a small model of a host -- block devices, pools, datasets --
and answers the argv forms zfs-ng uses the way the real tools answer them:
the same output layout (tabs, ``-`` for "no value", ``zpool list -v`` vdev
lines that carry their statistics columns whatever ``-o`` says, ``zpool
status`` and ``zpool import`` text blocks), the same error texts on stderr
and the same exit codes (texts taken from OpenZFS 2.1 cmd/zpool, cmd/zfs and
libzfs, and from util-linux for lsblk, blkid and wipefs).

Rules
- Every argv is recorded in ``calls``, refused or not, so a test can check
  what ran, and that a refused call ran nothing that changes state
  (``mutations()``).
- An argv form the fake does not know raises AssertionError naming it (and
  is remembered in ``unknown``, which the test fixture checks): a gap in the
  fake fails a test, it never passes silently.
- One method per command: ``_zpool_create``, ``_zfs_list``, ``_lsblk``...
- Test set-up and the admin's own actions go through the helpers below
  (``add_disk``, ``offline``, ``write``...) or ``admin("zfs snapshot
  tank/x@y")``, which runs the same command code without recording it.

Sizes are modelled plainly but consistently: a whole disk given to ``zpool
create`` is partitioned (data partition 1, 8 MiB partition 9) as ZFS on
Linux does, each leaf loses its label area, raidz loses parity, the pool
keeps 1/32 as slop space; datasets account used = usedbydataset +
usedbysnapshots + usedbyrefreservation + usedbychildren, ``available`` is
the pool's free space (plus the unconsumed refreservation of a volume), and
a thick volume's refreservation is its size plus block-pointer overhead.

Changed block tracking: tests declare what a guest wrote or discarded
(``guest_write``, ``guest_free``); each zvol keeps the birth txg of every
block ever written (snapshots and clones copy them), so ``zfs send -i``
(read through the runner's ``stream``) emits a real record stream of the
blocks born since the base, holes and tail FREE as OpenZFS sends them
(``_zfs_send``), ``zdb -e -dddd <snapshot> 1`` prints the data object's
maxblkid, and bookmarks (``zfs bookmark``) are datasets of kind bookmark
that go with their zvol and never hold it.
"""

import os
import re
import shlex
import struct

from zfsng import errors, runner

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

ZFS_VERSION = "zfs-2.1.15-1\nzfs-kmod-2.1.15-1\n"
PROGRAMS = ("zpool", "zfs", "lsblk", "blkid", "wipefs", "udevadm", "zdb")
MUTATING = {
    ("zpool", "create"), ("zpool", "import"), ("zpool", "export"),
    ("zpool", "destroy"), ("zpool", "labelclear"), ("zfs", "create"),
    ("zfs", "set"), ("zfs", "inherit"), ("zfs", "destroy"),
    ("zfs", "snapshot"), ("zfs", "clone"), ("zfs", "rename"),
    ("zfs", "promote"), ("zfs", "bookmark"), ("wipefs",),
}

FS_BASE = 24 * KiB        # what an empty filesystem references
VOL_BASE = 12 * KiB       # what an empty zvol references
LABELS = 4 * 256 * KiB + 3584 * KiB   # vdev labels and boot area, per leaf
DEFAULT_VOLBLOCKSIZE = 8192            # OpenZFS 2.1 (16K since 2.2)

GROUP_MIN = {"mirror": 2, "raidz": 2, "raidz1": 2, "raidz2": 3, "raidz3": 4}
CLASSES = ("log", "cache", "spare", "special", "dedup")
NATIVE_DEFAULTS = {
    "compression": "off", "dedup": "off", "sync": "standard",
    "volmode": "default", "atime": "on", "readonly": "off",
    "canmount": "on", "checksum": "on", "recordsize": "131072",
    "logbias": "latency", "primarycache": "all", "secondarycache": "all",
}
COMPRESSION_RE = re.compile(
    r"^(on|off|lzjb|zle|lz4|gzip|gzip-[1-9]|zstd|zstd-([1-9]|1[0-9])|"
    r"zstd-fast|zstd-fast-([1-9]|10|20|30|40|50|60|70|80|90|100|500|1000))$")
NATIVE_CHOICES = {
    "dedup": ("on", "off", "verify", "sha256", "sha256,verify", "sha512",
              "sha512,verify", "skein", "skein,verify", "edonr,verify"),
    "sync": ("standard", "always", "disabled"),
    "volmode": ("default", "full", "geom", "dev", "none"),
    "atime": ("on", "off"), "readonly": ("on", "off"),
    "canmount": ("on", "off", "noauto"),
    "checksum": ("on", "off", "fletcher2", "fletcher4", "sha256", "sha512",
                 "skein", "edonr", "blake3"),
    "logbias": ("latency", "throughput"),
    "primarycache": ("all", "none", "metadata"),
    "secondarycache": ("all", "none", "metadata"),
}
USER_PROP_RE = re.compile(r"^[a-z0-9_.:-]+$")
COMPONENT_RE = re.compile(r"^[A-Za-z0-9_.: -]+$")
MAX_PROP_VALUE = 4095     # the fake's old cap; see FakeZfs.user_value_cap
# User property values: the kernel refuses strlen(value) >= ZAP_MAXVALUELEN
# (8192, include/sys/fs/zfs.h) with E2BIG, in dsl_props_set_check() (zfs set,
# zfs create -o, zfs clone -o) and zfs_check_userprops() (zfs snapshot -o).
# libzfs (zfs_valid_proplist) checks only the name length of a dataset user
# property, not the value: OpenZFS 2.1 and 2.3 alike.
ZAP_MAXVALUELEN = 8192
ZFS_MAXPROPLEN = 4096     # MAXPATHLEN: the buffer zfs list prints into


class CommandError(Exception):
    """A command failed: its stderr and exit status."""

    def __init__(self, err, rc=1):
        Exception.__init__(self, err)
        self.err = err if err.endswith("\n") else err + "\n"
        self.rc = rc


def nicenum(num):
    """zfs_nicenum(): 1024-based, as zpool prints sizes without -p."""
    n, index = num, 0
    while n >= 1024 and index < 6:
        n = (n + 512) // 1024
        index += 1
    if index == 0:
        return "%d" % num
    value = float(num) / (1 << (10 * index))
    suffix = " KMGTPE"[index]
    if value < 10 and num & (num - 1):
        return "%.2f%s" % (value, suffix)
    if value < 100 and num & (num - 1):
        return "%.1f%s" % (value, suffix)
    return "%.0f%s" % (value, suffix)


def parse_size(text):
    match = re.match(r"^([0-9]+)([KMGTP]?)B?$", text, re.I)
    if not match:
        return None
    scale = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB, "P": TiB * 1024}
    return int(match.group(1)) * scale[match.group(2).upper()]


# --- the model ---------------------------------------------------------------

class Device(object):
    """A block device: a disk, a partition or a holder (lvm, md...)."""

    def __init__(self, path, size, kind="disk", parent=None, mountpoint="",
                 signatures=None):
        self.path = path
        self.size = size
        self.kind = kind
        self.parent = parent
        self.mountpoint = mountpoint   # "", "/mnt/x" or "[SWAP]"
        self.signatures = list(signatures or [])  # [{"TYPE": "ext4"}, ...]
        self.label = None      # ZFS label: {"pool", "guid", "leaf_guid",
        #                        "klass"}; cache and spare labels name no
        #                        pool (zdb shows only the vdev guid)
        self.children = []     # paths of partitions and holders


class Leaf(object):
    def __init__(self, path, size, guid):
        self.path = path
        self.size = size
        self.guid = guid
        self.state = "ONLINE"
        self.aux = ""          # "too many errors", ...
        self.present = True    # False: shown by guid, "was <path>"
        self.errors = (0, 0, 0)


class Vdev(object):
    """A top-level vdev: kind disk/mirror/raidzN, in a class or not."""

    def __init__(self, kind, klass, leaves, guid=None):
        self.kind = kind
        self.klass = klass     # None, "log", "cache", "spare", ...
        self.leaves = leaves
        self.guid = guid       # a mirror's or raidz's own vdev guid


class Pool(object):
    def __init__(self, name, guid, vdevs, props):
        self.name = name
        self.guid = guid
        self.vdevs = vdevs
        self.props = props          # pool properties (-o)
        self.state = "ACTIVE"       # ACTIVE, EXPORTED, DESTROYED
        self.readonly = False
        self.health_override = None
        self.resilvering = False    # zpool status: a resilver is running
        self.label_name = None      # imported read-only under another name
        self.datasets = {}          # name -> Dataset (all types)
        self.txg = 4
        # (hostid, hostname) of another host that has it imported, as its
        # labels say (an exported pool here, imported there): see _zdb
        self.elsewhere = None

    def leaves(self):
        return [leaf for vdev in self.vdevs for leaf in vdev.leaves]


class Dataset(object):
    def __init__(self, name, kind, props, txg, guid):
        self.name = name
        self.kind = kind            # filesystem, volume, snapshot
        self.props = dict(props)    # local properties, native and user
        self.createtxg = txg
        self.guid = guid
        self.refer = 0              # bytes the dataset (or snapshot) sees
        self.from_origin = 0        # of refer, shared with the origin
        self.origin = None          # clones: the origin snapshot's name
        self.volsize = None
        self.volblocksize = None
        self.unique = 0             # snapshots: bytes only they hold
        self.clones = []            # snapshots: names of their clones
        self.defer_destroy = False  # snapshots
        # Volumes and their snapshots: the data object's level-0 blocks
        # ever written, blkid -> (birth txg, data: True, a hole: False),
        # its dn_maxblkid (0 for a zvol never written, as ZFS has it) and
        # the txg its dnode last changed (a write, a free, a new volsize).
        # Bookmarks: createtxg is the txg of the snapshot they mark.
        self.blocks = {}
        self.maxblkid = 0
        self.dnode_txg = txg


def _parent_name(name):
    if "@" in name or "#" in name:
        return _head(name)
    return name.rsplit("/", 1)[0] if "/" in name else None


def _head(name):
    """The dataset of a snapshot or bookmark name; a dataset's own."""
    return re.split("[@#]", name, 1)[0]


def _sort_key(ds):
    """zfs list's default order (libzfs_dataset_cmp): by dataset name,
    snapshots and bookmarks after their dataset in creation order (a
    bookmark after the snapshot it was made from)."""
    return (_head(ds.name), ds.kind in ("snapshot", "bookmark"),
            ds.createtxg, ds.kind == "bookmark")


def _getopt(argv, spec):
    """GNU getopt: short options from spec ("Hpo:" style), permuted
    non-options, ``--`` ends options. Returns ([(flag, value)], args), or
    None when argv holds an option that spec does not know."""
    takes = {}
    i = 0
    while i < len(spec):
        takes[spec[i]] = spec[i + 1:i + 2] == ":"
        i += 2 if takes[spec[i]] else 1
    opts, args, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            args.extend(argv[i + 1:])
            break
        if arg.startswith("-") and len(arg) > 1:
            j = 1
            while j < len(arg):
                flag = arg[j]
                if flag not in takes:
                    return None
                if takes[flag]:
                    value = arg[j + 1:]
                    if not value:
                        i += 1
                        if i >= len(argv):
                            return None
                        value = argv[i]
                    opts.append((flag, value))
                    break
                opts.append((flag, None))
                j += 1
        else:
            args.append(arg)
        i += 1
    return opts, args


class _Unknown(Exception):
    pass


class FakeZfs(object):
    """The runner: ``FakeZfs()(argv, stdin_text) -> runner.Result``."""

    def __init__(self):
        self.calls = []
        self.unknown = []
        self.devices = {}
        self.links = {}             # udev symlink -> kernel device path
        self.pools = []             # every pool ever made, any state
        self.injected = []          # [prefix, rc, err, times]
        # This host, as the labels of the pools it imports record it (the
        # hostid is the one tests/unit/conftest.py gives the plugin).
        self.hostid, self.hostname = 0x5eed1d05, os.uname()[1]
        self._guid = 9 * 10 ** 18 + 170000000000000
        self.default_volblocksize = DEFAULT_VOLBLOCKSIZE
        # Not OpenZFS: a cap of 4096 bytes on user property values that
        # this fake always had (tests/unit/test_fakezfs.py relies on it).
        # None leaves only what OpenZFS 2.1/2.3 enforce (ZAP_MAXVALUELEN).
        self.user_value_cap = None
        self._sending = None        # zfs send's stream while it runs
        # A power cut inside the next zfs create or zfs clone (cut_next).
        self.cut_props = None

    @classmethod
    def with_disks(cls):
        """A host with four blank 10 GiB disks /dev/sdb../dev/sde: the one
        every unit test starts from, so that device names in the tests
        mean the same disks everywhere."""
        host = cls()
        for name in "bcde":
            host.add_disk("/dev/sd" + name)
        return host

    # --- the runner interface ------------------------------------------------

    def __call__(self, argv, stdin_text=None):
        self.calls.append(list(argv))
        return self._run(list(argv))

    def admin(self, command):
        """Run a command line as the admin would (not recorded); raise
        CommandError when it fails. Returns stdout."""
        result = self._run(shlex.split(command))
        if result.rc != 0:
            raise CommandError(result.err, result.rc)
        return result.out

    def _run(self, argv):
        assert argv and all(isinstance(a, str) for a in argv), argv
        for rule in self.injected:
            prefix, rc, err, times = rule
            if argv[:len(prefix)] == prefix and times != 0:
                rule[3] -= 1
                return runner.Result(argv, rc, "", err)
        handler = self._handler(argv)
        try:
            if handler is None:
                raise _Unknown()
            out = handler(argv)
        except _Unknown:
            self.unknown.append(argv)
            raise AssertionError("fakezfs: unsupported command %r" % (argv,))
        except CommandError as exc:
            return runner.Result(argv, exc.rc, "", exc.err)
        if isinstance(out, tuple):      # (stdout, stderr)
            return runner.Result(argv, 0, out[0], out[1])
        return runner.Result(argv, 0, out or "", "")

    def _zdb(self, argv):
        """``zdb -l -- <device>``: the first label's pool facts."""
        if argv[1:2] == ["-e"]:
            return self._zdb_objects(argv)
        if argv[1:3] != ["-l", "--"] or len(argv) != 4:
            raise _Unknown()
        dev = self._dev(argv[3])
        pools = [p for p in self.pools
                 if dev is not None and dev.label and
                 p.guid == dev.label["guid"]]
        if not pools:
            raise CommandError("failed to unpack label 0\nfailed to unpack "
                               "label 1\nfailed to unpack label 2\nfailed "
                               "to unpack label 3", rc=2)
        klass = dev.label.get("klass")
        if klass in ("cache", "spare"):
            # vdev_label_init(): an L2ARC or hot spare label holds only
            # its version, state (POOL_STATE_L2CACHE 4, _SPARE 3), guid;
            # zdb then prints a cache device's L2ARC header (OpenZFS 2.1)
            header = "" if klass == "spare" else (
                "------------------------------------\nL2ARC device header"
                "\n------------------------------------\n    magic: "
                "6504978260106102853\n    version: 1\n    pool_guid: %s\n"
                "    flags: 1\n\n" % pools[-1].guid)
            return ("------------------------------------\nLABEL 0\n"
                    "------------------------------------\n"
                    "    version: 5000\n    state: %d\n    guid: %s\n"
                    "    labels = 0 1 2 3 \n%s"
                    % (4 if klass == "cache" else 3, dev.label["leaf_guid"],
                       header))
        pool = pools[-1]
        state = {"ACTIVE": 0, "EXPORTED": 1}.get(pool.state, 2)
        hostid, hostname = self.hostid, self.hostname
        if pool.elsewhere and pool.state == "EXPORTED":
            state, (hostid, hostname) = 0, pool.elsewhere
        return ("------------------------------------\nLABEL 0\n"
                "------------------------------------\n"
                "    version: 5000\n    name: '%s'\n    state: %d\n"
                "    txg: %d\n    pool_guid: %s\n    errata: 0\n"
                "    hostid: %d\n    hostname: '%s'\n"
                "    top_guid: %s\n    guid: %s\n"
                % (pool.name, state, pool.txg, pool.guid, hostid, hostname,
                   dev.label["leaf_guid"], dev.label["leaf_guid"]))

    def _handler(self, argv):
        prog = argv[0]
        if prog == "zdb":
            return self._zdb
        if prog in ("zpool", "zfs", "udevadm") and len(argv) > 1:
            return getattr(self, "_%s_%s" % (prog, argv[1]), None)
        if prog in ("lsblk", "blkid", "wipefs"):
            return getattr(self, "_" + prog)
        return None

    def _getopt(self, argv, start, spec):
        parsed = _getopt(argv[start:], spec)
        if parsed is None:
            raise _Unknown()
        return parsed

    # --- what tests look at --------------------------------------------------

    def mutations(self, since=0):
        """The recorded argvs that change state (from calls[since:])."""
        return [a for a in self.calls[since:] if self._mutating(a)]

    @staticmethod
    def _mutating(argv):
        if argv[:2] == ["zpool", "import"]:      # a listing reads only
            parsed = _getopt(argv[2:], "o:Nd:")
            return parsed is None or bool(parsed[1])
        return tuple(argv[:2]) in MUTATING or tuple(argv[:1]) in MUTATING

    def ran(self, *prefix, **kwargs):
        """Recorded argvs that start with prefix (from calls[since:])."""
        prefix = list(prefix)
        return [a for a in self.calls[kwargs.get("since", 0):]
                if a[:len(prefix)] == prefix]

    def imported(self):
        return sorted(p.name for p in self.pools if p.state == "ACTIVE")

    def pool(self, name, state="ACTIVE"):
        for pool in self.pools:
            if pool.name == name and pool.state == state:
                return pool
        raise KeyError("no %s pool %s" % (state, name))

    def dataset(self, name):
        pool, ds = self._lookup(name)
        return ds

    def exists(self, name):
        try:
            self._lookup(name)
            return True
        except CommandError:
            return False

    def get(self, name, prop):
        """A property as ``zfs list -Hp`` prints it (None for ``-``)."""
        pool, ds = self._lookup(name)
        return self._value(pool, ds, prop)

    def local_props(self, name):
        return dict(self.dataset(name).props)

    # --- test set-up ---------------------------------------------------------

    def cut_next(self, keep=()):
        """The next ``zfs create`` or ``zfs clone`` stops where a power cut
        can stop it: ZFS makes the dataset in one transaction group and
        sets the properties given with -o afterwards (zfs_ioc_create,
        zfs_ioc_clone, then zfs_set_prop_nvlist): the special ones
        (refreservation) one sync task each, then every other one
        (readonly, user properties) in one. The dataset is left with its
        creation's own (a zvol's volsize and volblocksize, a clone's
        origin) and the -o properties named in keep (the special ones
        set before the cut), nothing else."""
        self.cut_props = tuple(keep)

    def _cut(self, props):
        """props as a cut_next leaves them (all of them without one)."""
        if self.cut_props is None:
            return props
        kept = dict((k, v) for k, v in props.items() if k in self.cut_props)
        self.cut_props = None
        return kept

    def add_disk(self, path, size=10 * GiB, fs=None, pttype=None,
                 mountpoint="", kind="disk", by_id=None):
        """A disk; by_id: its udev name under /dev/disk/by-id (its
        partitions get <by_id>-part<N>, as udev names them)."""
        sigs = []
        if pttype:
            sigs.append({"PTTYPE": pttype, "PTUUID": "0c0ffee0"})
        if fs:
            sigs.append({"TYPE": fs, "USAGE": "filesystem"})
        self.devices[path] = Device(path, size, kind, None, mountpoint, sigs)
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

    def inject(self, command, err, rc=1, times=1):
        """The next ``times`` runs of argvs starting with the words of
        command fail with err (times=-1: always)."""
        self.injected.append([command.split(), rc, err, times])

    def write(self, name, nbytes, overwrite=0):
        """A guest writes nbytes of new data, and overwrites overwrite
        bytes of existing data (kept by the newest snapshot, if any)."""
        pool, ds = self._lookup(name)
        self._check_space(pool, name, nbytes, ds)
        ds.refer += nbytes
        if overwrite:
            snaps = self._snapshots(pool, ds.name)
            if snaps:
                snaps[-1].unique += overwrite
            ds.from_origin = max(0, ds.from_origin - overwrite)

    def guest_write(self, name, offset, length):
        """A guest writes (non-zero data) to bytes offset..offset+length of
        zvol name: every volblocksize block it touches is born in a new
        txg, as ZFS writes whole blocks. Used space grows by the blocks
        that held no data."""
        pool, ds = self._zvol(name)
        first, last = self._block_range(ds, offset, length)
        fresh = [b for b in range(first, last + 1)
                 if not ds.blocks.get(b, (0, False))[1]]
        self._check_space(pool, name, len(fresh) * ds.volblocksize, ds)
        pool.txg += 1
        for blkid in range(first, last + 1):
            ds.blocks[blkid] = (pool.txg, True)
        ds.maxblkid = max(ds.maxblkid, last)
        ds.dnode_txg = pool.txg
        ds.refer += len(fresh) * ds.volblocksize

    def guest_free(self, name, offset, length):
        """A guest discards bytes offset..offset+length of zvol name
        (zvol_discard: dmu_free_long_range). Whole blocks holding data or
        written before become holes born in a new txg; a block never
        written stays a hole without birth time; the partly covered
        blocks at either end are zeroed in place: rewritten. maxblkid
        does not shrink (only a truncation would)."""
        pool, ds = self._zvol(name)
        block = ds.volblocksize
        first, last = self._block_range(ds, offset, length)
        pool.txg += 1
        for blkid in range(first, last + 1):
            whole = offset <= blkid * block and \
                (blkid + 1) * block <= offset + length
            birth, data = ds.blocks.get(blkid, (None, False))
            if birth is None:
                continue
            if whole:
                ds.blocks[blkid] = (pool.txg, False)
                ds.refer -= block if data else 0
            elif data:
                ds.blocks[blkid] = (pool.txg, True)
        ds.dnode_txg = pool.txg

    def _zvol(self, name):
        pool, ds = self._lookup(name)
        assert ds.kind == "volume", "a guest writes to zvols: %s" % name
        return pool, ds

    @staticmethod
    def _block_range(ds, offset, length):
        assert length > 0 and 0 <= offset and \
            offset + length <= ds.volsize, (offset, length, ds.volsize)
        return offset // ds.volblocksize, \
            (offset + length - 1) // ds.volblocksize

    @staticmethod
    def _copy_data(source, ds):
        """A snapshot or clone starts with its source's blocks."""
        ds.blocks = dict(source.blocks)
        ds.maxblkid, ds.dnode_txg = source.maxblkid, source.dnode_txg

    # --- model helpers -------------------------------------------------------

    def _new_guid(self):
        self._guid += 7919131
        return str(self._guid)

    @staticmethod
    def _part_name(disk, number):
        return "%s%s%d" % (disk, "p" if disk[-1].isdigit() else "", number)

    def _active_pool(self, name):
        for pool in self.pools:
            if pool.name == name and pool.state == "ACTIVE":
                return pool
        return None

    def _open_pool(self, name):
        """The imported pool called name, or the error every zpool command
        that opens a pool by name gives (libzfs zpool_open)."""
        pool = self._active_pool(name)
        if pool is None:
            raise CommandError("cannot open '%s': no such pool" % name)
        return pool

    def _lookup(self, name, errprefix=None):
        """(pool, dataset) of an imported dataset, or CommandError."""
        pool = self._active_pool(_head(name.split("/")[0]))
        ds = pool.datasets.get(name) if pool else None
        if ds is None:
            raise CommandError("%s: dataset does not exist"
                               % (errprefix or "cannot open '%s'" % name))
        return pool, ds

    def _children(self, pool, name):
        return sorted((d for d in pool.datasets.values()
                       if d.kind not in ("snapshot", "bookmark") and
                       _parent_name(d.name) == name), key=_sort_key)

    def _snapshots(self, pool, name):
        return sorted((d for d in pool.datasets.values()
                       if d.kind == "snapshot" and _head(d.name) == name),
                      key=lambda d: d.createtxg)

    def _descendants(self, pool, name, bookmarks=False):
        """Everything below name: children, snapshots (and bookmarks),
        recursively."""
        return [d for d in pool.datasets.values()
                if d.name.startswith(name + "/") or
                d.name.startswith(name + "@") or
                (bookmarks and d.name.startswith(name + "#"))]

    def _bookmarks(self, pool, name):
        return sorted((d for d in pool.datasets.values()
                       if d.kind == "bookmark" and _head(d.name) == name),
                      key=lambda d: d.createtxg)

    # space

    def _capacity(self, pool):
        """(usable bytes, raw bytes) of the pool's data vdevs."""
        usable = raw = 0
        for vdev in pool.vdevs:
            if vdev.klass in ("log", "cache", "spare"):
                continue
            size = min(leaf.size for leaf in vdev.leaves) - LABELS
            size = size // MiB * MiB
            count = len(vdev.leaves)
            if vdev.kind in ("disk", "mirror"):
                usable += size
                raw += size
            else:
                parity = 1 if vdev.kind == "raidz" else int(vdev.kind[-1])
                usable += (count - parity) * size
                raw += count * size
        return usable, raw

    def _slop(self, usable):
        return min(max(min(usable >> 5, 128 * GiB), 128 * MiB), usable // 2)

    def _pool_avail(self, pool):
        usable, _ = self._capacity(pool)
        root = pool.datasets[pool.name]
        return max(0, usable - self._slop(usable) - self._used(pool, root))

    def _refreservation(self, ds):
        value = ds.props.get("refreservation", "none")
        return 0 if value == "none" else int(value)

    @staticmethod
    def _auto_reservation(volsize, volblocksize):
        """zvol_volsize_to_reservation(), roughly: data plus block
        pointers plus a little metadata."""
        return volsize + (volsize // volblocksize) * 256 + 64 * KiB

    def _usedds(self, ds):
        return ds.refer - ds.from_origin

    def _usedsnap(self, pool, ds):
        return sum(s.unique for s in self._snapshots(pool, ds.name))

    def _usedrefreserv(self, ds):
        return max(0, self._refreservation(ds) - self._usedds(ds))

    def _usedchild(self, pool, ds):
        return sum(self._used(pool, c) for c in self._children(pool, ds.name))

    def _used(self, pool, ds):
        if ds.kind == "snapshot":
            return ds.unique
        return (self._usedds(ds) + self._usedsnap(pool, ds) +
                self._usedrefreserv(ds) + self._usedchild(pool, ds))

    def _allocated(self, pool):
        usable, raw = self._capacity(pool)
        data = sum(self._usedds(d) if d.kind != "snapshot" else d.unique
                   for d in pool.datasets.values())
        return data * raw // usable if usable else 0

    def _check_space(self, pool, name, need, ds=None, what="out of space",
                     prefix=None):
        avail = self._pool_avail(pool)
        if ds is not None and ds.kind == "volume":
            avail += self._usedrefreserv(ds)
        if need > avail:
            raise CommandError("%s: %s" % (prefix or "cannot write '%s'"
                                           % name, what))

    # properties

    def _inherited(self, pool, ds, prop):
        """(value, source dataset) along the inheritance chain, or (None,
        None). Snapshots inherit from their dataset."""
        name = ds.name
        while name is not None:
            current = pool.datasets.get(name)
            if current is not None and prop in current.props:
                return current.props[prop], name
            name = _parent_name(name)
        return None, None

    def _value(self, pool, ds, prop):
        """The text ``zfs list -Hp`` prints for prop; None means ``-``."""
        if ds.kind == "bookmark":
            # a bookmark has no property but these (user ones neither)
            return {"name": ds.name, "type": "bookmark", "guid": ds.guid,
                    "createtxg": str(ds.createtxg),
                    "creation": str(1700000000 + ds.createtxg)}.get(prop)
        snap = ds.kind == "snapshot"
        head = pool.datasets.get(_head(ds.name))
        is_vol = (head or ds).kind == "volume"
        if ":" in prop:
            return self._inherited(pool, ds, prop)[0]
        simple = {
            "name": lambda: ds.name,
            "type": lambda: ds.kind,
            "guid": lambda: ds.guid,
            "createtxg": lambda: str(ds.createtxg),
            "creation": lambda: str(1700000000 + ds.createtxg),
            "used": lambda: str(self._used(pool, ds)),
            "referenced": lambda: str(ds.refer),
            "refer": lambda: str(ds.refer),
            "logicalused": lambda: str(self._used(pool, ds)),
            "logicalreferenced": lambda: str(ds.refer),
            "compressratio": lambda: "1.00",
            "refcompressratio": lambda: "1.00",
        }
        if prop in simple:
            return simple[prop]()
        if prop in ("available", "avail", "usedbydataset", "usedds",
                    "usedbysnapshots", "usedsnap", "usedbychildren",
                    "usedchild", "usedbyrefreservation", "usedrefreserv",
                    "refreservation", "reservation", "written"):
            if snap:
                return None
            return str({
                "available": lambda: self._pool_avail(pool) + (
                    self._usedrefreserv(ds) if is_vol else 0),
                "usedbydataset": lambda: self._usedds(ds),
                "usedbysnapshots": lambda: self._usedsnap(pool, ds),
                "usedbychildren": lambda: self._usedchild(pool, ds),
                "usedbyrefreservation": lambda: self._usedrefreserv(ds),
                "refreservation": lambda: self._refreservation(ds),
                "reservation": lambda: 0,
                "written": lambda: self._usedds(ds),
            }[{"avail": "available", "usedds": "usedbydataset",
               "usedsnap": "usedbysnapshots", "usedchild": "usedbychildren",
               "usedrefreserv": "usedbyrefreservation"}.get(prop, prop)]())
        if prop in ("volsize", "volblocksize"):
            # A snapshot of a zvol shows its volsize but no volblocksize
            # ("-"): seen on OpenZFS 2.1 and 2.3 (tests/integration/
            # test_fakezfs_contract.py)
            if not is_vol or (snap and prop == "volblocksize"):
                return None
            return str(getattr(ds, prop))
        if prop == "origin":
            return None if snap else ds.origin
        if prop == "clones":
            # get_clones_string(): no clone is "-" (the property does not
            # apply), and the list is strlcat'ed into zfs list's
            # ZFS_MAXPROPLEN buffer, so a long one is cut short.
            if not snap or not ds.clones:
                return None
            return ",".join(ds.clones)[:ZFS_MAXPROPLEN - 1]
        if prop == "defer_destroy":
            return ("on" if ds.defer_destroy else "off") if snap else None
        if prop == "mountpoint":
            if snap or is_vol:
                return None
            value, source = self._inherited(pool, ds, prop)
            if value is None:
                return "/" + ds.name
            if value in ("none", "legacy") or source == ds.name:
                return value
            return value.rstrip("/") + ds.name[len(source):]
        if prop in NATIVE_DEFAULTS:
            value, _ = self._inherited(pool, ds, prop)
            return value if value is not None else NATIVE_DEFAULTS[prop]
        raise CommandError("bad property list: invalid property '%s'" % prop,
                           rc=2)

    def _source(self, pool, ds, prop):
        if prop in ds.props:
            return "local"
        if ":" in prop or prop in NATIVE_DEFAULTS or prop == "mountpoint":
            value, source = self._inherited(pool, ds, prop)
            if source is None:
                return "default" if ":" not in prop else "-"
            return "inherited from %s" % source
        return "-"

    def _check_prop(self, kind, key, value, errprefix, creating=True):
        """libzfs zfs_valid_proplist(), for the properties zfs-ng sets."""
        if ":" in key:
            if not USER_PROP_RE.match(key) or len(key) > 255:
                raise CommandError("%s: invalid property '%s'"
                                   % (errprefix, key))
            if self.user_value_cap is not None and \
                    len(value.encode("utf-8")) >= self.user_value_cap:
                raise CommandError("%s: property value '%s' is too long"
                                   % (errprefix, value))
            return
        if kind == "snapshot":
            raise CommandError("%s: this property can not be modified for "
                               "snapshots" % errprefix)
        if key == "compression":
            if not COMPRESSION_RE.match(value):
                raise CommandError(
                    "%s: 'compression' must be one of 'on | off | lzjb | "
                    "gzip | gzip-[1-9] | zle | lz4 | zstd | zstd-[1-19] | "
                    "zstd-fast | zstd-fast-[1-10,20,30,40,50,60,70,80,90,"
                    "100,500,1000]'" % errprefix)
        elif key in NATIVE_CHOICES:
            if value not in NATIVE_CHOICES[key]:
                raise CommandError("%s: '%s' must be one of '%s'" % (
                    errprefix, key, " | ".join(NATIVE_CHOICES[key])))
        elif key == "mountpoint":
            if kind != "filesystem":
                raise CommandError("%s: 'mountpoint' does not apply to "
                                   "datasets of this type" % errprefix)
            if value not in ("none", "legacy") and not value.startswith("/"):
                raise CommandError("%s: bad mount point '%s': must be an "
                                   "absolute path, 'none', or 'legacy'"
                                   % (errprefix, value))
        elif key == "volblocksize":
            if not creating:
                raise CommandError("%s: 'volblocksize' is readonly"
                                   % errprefix)
            size = parse_size(value)
            if kind != "volume" or size is None or size < 512 or \
                    size > 128 * KiB or size & (size - 1):
                raise CommandError(
                    "%s: 'volblocksize' must be power of 2 from 512B to "
                    "128KB" % errprefix)
        elif key in ("refreservation", "reservation"):
            if value == "auto" and key == "refreservation":
                if kind != "volume":
                    raise CommandError("%s: 'refreservation=auto' only "
                                       "supported on volumes" % errprefix)
            elif value != "none" and parse_size(value) is None:
                raise CommandError("%s: bad numeric value '%s'"
                                   % (errprefix, value))
        elif key == "volsize":
            if kind != "volume":
                raise CommandError("%s: 'volsize' does not apply to datasets"
                                   " of this type" % errprefix)
        else:
            raise CommandError("%s: invalid property '%s'" % (errprefix, key))

    @staticmethod
    def _too_big(props):
        """Whether the kernel refuses one of these user property values
        with E2BIG (strlen >= ZAP_MAXVALUELEN)."""
        return any(":" in key and len(value.encode("utf-8")) >=
                   ZAP_MAXVALUELEN for key, value in props.items())

    @staticmethod
    def _internal_error(action, description):
        """zfs_standard_error() on an errno it has no case for (E2BIG from
        zfs create/clone/snapshot): EZFS_UNKNOWN, which zfs_verror() prints
        as an internal error before abort(): SIGABRT, -6 from Popen."""
        return CommandError("internal error: %s: %s" % (action, description),
                            rc=-6)

    @staticmethod
    def _parse_props(pairs, errprefix):
        props = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                raise CommandError("missing '=' for property=value argument",
                                   rc=2)
            if key in props:
                raise CommandError("property '%s' specified multiple times"
                                   % key, rc=2)
            props[key] = value
        return props

    def _check_name(self, name, errprefix, snapshot=False):
        head, at, snap = name.partition("@")
        parts = head.split("/")
        bad = [p for p in parts + ([snap] if at else [])
               if not p or not COMPONENT_RE.match(p)]
        if bad or (at and not snapshot) or (snapshot and not at) or \
                len(name) >= 256:
            raise CommandError("%s: invalid character or empty component in "
                               "name" % errprefix)

    def _new_dataset(self, pool, name, kind, props):
        pool.txg += 1
        ds = Dataset(name, kind, props, pool.txg, self._new_guid())
        pool.datasets[name] = ds
        return ds

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

    # --- zpool ---------------------------------------------------------------

    def _health(self, pool):
        if pool.health_override:
            return pool.health_override
        state = "ONLINE"
        for vdev in pool.vdevs:
            bad = len([leaf for leaf in vdev.leaves if leaf.state != "ONLINE"])
            if not bad or vdev.klass in ("cache", "spare"):
                continue
            if vdev.kind in ("disk",) or \
                    (vdev.kind == "mirror" and bad == len(vdev.leaves)) or \
                    (vdev.kind.startswith("raidz") and
                     bad > (1 if vdev.kind == "raidz" else
                            int(vdev.kind[-1]))):
                if vdev.klass == "log":
                    state = "DEGRADED"
                    continue
                return "UNAVAIL"
            state = "DEGRADED"
        return state

    def _vdev_state(self, vdev):
        bad = [leaf for leaf in vdev.leaves if leaf.state != "ONLINE"]
        if not bad:
            return "ONLINE"
        if vdev.kind == "disk":
            return bad[0].state
        limit = len(vdev.leaves) - 1 if vdev.kind == "mirror" else \
            (1 if vdev.kind == "raidz" else int(vdev.kind[-1]))
        return "UNAVAIL" if len(bad) > limit else "DEGRADED"

    def _pool_prop(self, pool, prop):
        usable, raw = self._capacity(pool)
        alloc = self._allocated(pool)
        values = {
            "name": pool.name, "guid": pool.guid,
            "health": self._health(pool), "size": str(raw),
            "allocated": str(alloc), "alloc": str(alloc),
            "free": str(raw - alloc), "freeing": "0",
            "capacity": str(alloc * 100 // raw if raw else 0),
            "cap": str(alloc * 100 // raw if raw else 0),
            "fragmentation": "0", "frag": "0", "dedupratio": "1.00",
            "expandsize": "-", "checkpoint": "-",
            "altroot": "-", "readonly": "on" if pool.readonly else "off",
            "cachefile": pool.props.get("cachefile", "-"),
            "ashift": pool.props.get("ashift", "0"),
            "multihost": pool.props.get("multihost", "off"),
        }
        if prop not in values:
            raise CommandError("property '%s' is not a valid pool or vdev "
                               "property" % prop, rc=2)
        return values[prop]

    def _zpool_list(self, argv):
        opts, args = self._getopt(argv, 2, "HpPvgo:")
        flags = dict(opts)
        if "H" not in flags or "o" not in flags:
            raise _Unknown()
        columns = flags["o"].split(",")
        if "v" in flags and (("P" in flags) == ("g" in flags) or
                             columns != ["name"]):
            raise _Unknown()
        if args:
            pools = [self._open_pool(name) for name in args]
        else:
            pools = sorted((p for p in self.pools if p.state == "ACTIVE"),
                           key=lambda p: p.name)
        lines = []
        for pool in pools:
            lines.append("\t".join(self._pool_prop(pool, c) for c in columns))
            if "v" in flags:
                lines += self._list_vdev_lines(pool, guids="g" in flags)
        return "".join(line + "\n" for line in lines)

    def _list_vdev_lines(self, pool, guids=False):
        """``zpool list -v -H -P``: print_list_stats(). Vdev lines are a tab,
        the name and always the fixed statistics columns; class headers are
        printed with spaces and dashes, even with -H. With -g instead of
        -P, every vdev is named by its guid."""
        dashes = ("%-9s      -      -      -        -         -      -"
                  "      -      -         -")

        def stats(size, alloc, toplevel, state):
            if not toplevel:
                return "\t-\t-\t-\t-\t-\t-\t-\t-\t%s" % state
            return "\t%s\t%s\t%s\t-\t-\t0%%\t%d%%\t1.00x\t%s" % (
                nicenum(size), nicenum(alloc), nicenum(size - alloc),
                alloc * 100 // size if size else 0, state)

        lines = []
        usable, raw = self._capacity(pool)
        alloc = self._allocated(pool)
        groups = [(None, ""), ("dedup", "dedup"), ("special", "special"),
                  ("log", "logs"), ("cache", "cache"), ("spare", "spare")]
        for klass, header in groups:
            vdevs = [v for v in pool.vdevs if v.klass == klass]
            if not vdevs:
                continue
            if header:
                lines.append(dashes % header)
            for index, vdev in enumerate(pool.vdevs):
                if vdev.klass != klass:
                    continue
                size = min(leaf.size for leaf in vdev.leaves) - LABELS
                if vdev.kind.startswith("raidz"):   # raw size, with parity
                    size *= len(vdev.leaves)
                share = alloc * size // raw if raw else 0
                top = klass not in ("cache", "spare")
                if vdev.kind == "disk":
                    leaf = vdev.leaves[0]
                    lines.append("\t%s%s" % (
                        leaf.guid if guids else leaf.path, stats(
                            size, share, top, self._leaf_state(leaf, klass))))
                    continue
                lines.append("\t%s%s" % (
                    vdev.guid if guids else "%s-%d" % (vdev.kind, index),
                    stats(size, share, top, self._vdev_state(vdev))))
                for leaf in vdev.leaves:
                    lines.append("\t%s%s" % (
                        leaf.guid if guids else leaf.path, stats(
                            0, 0, False, self._leaf_state(leaf, klass))))
        return lines

    @staticmethod
    def _leaf_state(leaf, klass):
        if klass == "spare" and leaf.state == "ONLINE":
            return "AVAIL"
        return leaf.state

    def _parse_vdevs(self, words, name, force):
        """zpool create's vdev words -> [(kind, klass, [paths])]."""
        groups, klass, current = [], None, None
        for word in words:
            if word in CLASSES:
                klass, current = word, None
            elif word in GROUP_MIN:
                current = [word if word != "raidz" else "raidz1", klass, []]
                groups.append(current)
            elif word.startswith("/"):
                if current is None:       # a plain device: its own vdev
                    groups.append(["disk", klass, [word]])
                else:                     # joins the mirror/raidz before it
                    current[2].append(word)
            else:
                raise CommandError("cannot open '%s': no such device in "
                                   "/dev\nmust be a full path or shorthand "
                                   "device name" % word)
        for kind, klass, paths in groups:
            need = GROUP_MIN.get(kind, 1)
            if len(paths) < need:
                raise CommandError("invalid vdev specification: %s requires "
                                   "at least %d devices" % (kind, need))
            if klass in ("cache", "spare") and kind != "disk":
                raise CommandError("invalid vdev specification: %s devices "
                                   "cannot be in a %s" % (klass, kind))
            if klass in ("log", "special", "dedup") and \
                    kind not in ("disk", "mirror"):
                raise CommandError("invalid vdev specification: unsupported "
                                   "'%s' device: %s" % (klass, kind))
        if not [g for g in groups if g[1] is None]:
            raise CommandError("invalid vdev specification: at least one "
                               "toplevel vdev must be specified")
        kinds = set(g[0] for g in groups if g[1] is None)
        if len(kinds) > 1 and not force:
            raise CommandError(
                "invalid vdev specification\nuse '-f' to override the "
                "following errors:\nmismatched replication level: both %s "
                "vdevs are present" % " and ".join(sorted(kinds)))
        return groups

    def _check_leaf_free(self, path, force):
        """make_leaf_vdev() and is_device_in_use(): (problem, whether -f
        overrides it) for one device and its partitions and holders."""
        for member in self._family(path):
            if member.mountpoint == "[SWAP]":
                return "%s is currently used by swap. Please see swapon(8)." \
                    % member.path, False
            if member.mountpoint:
                return "%s is currently mounted on %s" % (
                    member.path, member.mountpoint), False
            # a device mapper, md or multipath device is itself usable (a
            # leaf of its own, not partitioned); only one built on the
            # device holds it (the kernel refuses ZFS's exclusive open)
            if member.path != self.devices[path].path and \
                    member.kind not in ("disk", "part"):
                return "%s is in use by %s" % (member.path, member.kind), \
                    False
            label = member.label
            if label:
                pool = self._active_pool(label["pool"])
                if pool is not None and pool.guid == label["guid"]:
                    return "%s is part of active pool '%s'" % (
                        member.path, label["pool"]), False
                if [p for p in self.pools if p.guid == label["guid"] and
                        p.state == "EXPORTED"]:
                    return "%s is part of exported pool '%s'" % (
                        member.path, label["pool"]), True
                # a destroyed pool's label does not hold the device
            for sig in member.signatures:
                if "TYPE" in sig:
                    return "%s contains a filesystem of type '%s'" % (
                        member.path, sig["TYPE"]), True
                if sig.get("PTTYPE", "gpt") != "gpt":
                    return ("%s does not contain an EFI label but it may "
                            "contain partition\ninformation in the MBR."
                            % member.path), True
        return None, True

    def _zpool_create(self, argv):
        opts, args = self._getopt(argv, 2, "fo:O:m:")
        if not args:
            raise CommandError("missing pool name argument", rc=2)
        force = ("f", None) in opts
        name, words = args[0], args[1:]
        errprefix = "cannot create '%s'" % name
        if not re.match(r"^[A-Za-z][A-Za-z0-9_.: -]*$", name) or \
                re.match(r"^(mirror|raidz|draid|spare|log)", name) or \
                re.match(r"^c[0-9]", name):
            raise CommandError("%s: invalid name" % errprefix)
        pool_props, fs_props = {}, {}
        for flag, value in opts:
            if flag == "o":
                key, _, val = value.partition("=")
                if key == "ashift" and not (val.isdigit() and
                                            (9 <= int(val) <= 16 or
                                             val == "0")):
                    raise CommandError("property 'ashift' number %s is "
                                       "invalid." % val, rc=2)
                if key not in ("cachefile", "ashift", "autotrim",
                               "autoexpand", "comment", "compatibility",
                               "multihost"):
                    raise CommandError("property '%s' is not a valid pool or"
                                       " vdev property" % key, rc=2)
                pool_props[key] = val
            elif flag == "O":
                fs_props.update(self._parse_props([value], errprefix))
            elif flag == "m":
                fs_props["mountpoint"] = value
        for key, value in sorted(fs_props.items()):
            self._check_prop("filesystem", key, value, errprefix)
        if not words:
            raise CommandError("missing vdev specification", rc=2)
        for word in words:
            if word.startswith("/") and self._dev(word) is None:
                raise CommandError("cannot open '%s': No such file or "
                                   "directory" % word)
        groups = self._parse_vdevs(words, name, force)
        paths = [p for g in groups for p in g[2]]
        if len(set(paths)) != len(paths):
            raise CommandError("invalid vdev specification\nthe following "
                               "errors must be manually repaired:\na device"
                               " is named twice")
        must, may = [], []
        for path in paths:
            problem, fixable = self._check_leaf_free(self._dev(path).path,
                                                     force)
            if problem and not fixable:
                must.append(problem)
            elif problem and not force:
                may.append(problem)
        if must:
            raise CommandError("invalid vdev specification\nthe following "
                               "errors must be manually repaired:\n" +
                               "\n".join(must))
        if may:
            raise CommandError("invalid vdev specification\nuse '-f' to "
                               "override the following errors:\n" +
                               "\n".join(may))
        if self._active_pool(name):
            raise CommandError("%s: pool already exists" % errprefix)
        pool = Pool(name, self._new_guid(), [], pool_props)
        for kind, klass, group_paths in groups:
            leaves = [self._make_leaf(pool, p, klass) for p in group_paths]
            pool.vdevs.append(Vdev(kind, klass, leaves,
                                   None if kind == "disk" else
                                   self._new_guid()))
        self.pools.append(pool)
        root = self._new_dataset(pool, name, "filesystem", fs_props)
        root.refer = FS_BASE
        return ""

    def _make_leaf(self, pool, path, klass=None):
        """Label the device; a whole disk gets ZFS's own partitions (and a
        new GPT uuid). Given by a udev link, the leaf is the partition's
        link (<link>-part1), as ZFS names it."""
        dev = self._dev(path)
        for child in list(dev.children):
            self._remove_device(child)
        dev.children = []
        dev.signatures, dev.label = [], None
        if dev.kind == "disk":
            ptuuid = "%s-%s" % (self._new_guid()[-8:], pool.guid[-8:])
            dev.signatures = [{"PTTYPE": "gpt", "PTUUID": ptuuid}]
            data = self._part_name(dev.path, 1)
            reserved = self._part_name(dev.path, 9)
            self.devices[data] = Device(data, dev.size - 9 * MiB, "part",
                                        dev.path)
            self.devices[reserved] = Device(reserved, 8 * MiB, "part",
                                            dev.path)
            self._link_partition(dev.path, data, 1)
            self._link_partition(dev.path, reserved, 9)
            dev.children = [data, reserved]
            linked = path != dev.path
            path = path + "-part1" if linked else data
            dev = self.devices[data]
        leaf = Leaf(path, dev.size, self._new_guid())
        dev.label = {"pool": pool.name, "guid": pool.guid,
                     "leaf_guid": leaf.guid, "klass": klass}
        return leaf

    def _visible_to_scan(self, pool, dirs):
        if not dirs:
            return True
        for leaf in pool.leaves():
            path = self.links.get(leaf.path, leaf.path)
            for where in dirs:
                where = self.links.get(where, where)
                if path == where or path.startswith(where.rstrip("/") + "/"):
                    return True
        return False

    def _labelled(self, pool):
        """Whether the pool's leaves still carry its labels."""
        return any(self._dev(leaf.path) is not None and
                   self._dev(leaf.path).label is not None and
                   self._dev(leaf.path).label["guid"] == pool.guid
                   for leaf in pool.leaves())

    def _importable(self, dirs):
        return [p for p in self.pools if p.state == "EXPORTED" and
                self._labelled(p) and self._visible_to_scan(p, dirs)]

    def _zpool_import(self, argv):
        opts, args = self._getopt(argv, 2, "o:Nd:")
        dirs = [v for f, v in opts if f == "d"]
        if not args:
            if [f for f, _ in opts if f != "d"]:
                raise _Unknown()
            pools = self._importable(dirs)
            if not pools:
                return "", "no pools available to import\n"
            return "\n".join(self._import_block(p) for p in pools), ""
        if len(args) not in (1, 2):
            raise _Unknown()
        props = {}
        for flag, value in opts:
            if flag == "o":
                key, _, val = value.partition("=")
                if key not in ("cachefile", "readonly"):
                    raise _Unknown()
                props[key] = val
        target = args[0]
        found = [p for p in self._importable(dirs)
                 if p.guid == target or p.name == target]
        if not found:
            raise CommandError("cannot import '%s': no such pool available"
                               % target)
        pool = found[0]
        if pool.elsewhere and pool.elsewhere[0] != self.hostid:
            # multihost sees the other host's writes (OpenZFS before 2.3.6
            # skips the check when the hostid is ours: then it imports)
            raise CommandError(
                "cannot import '%s': pool is imported on host '%s' "
                "(hostid=%x).\nExport the pool on the other system, then run"
                " 'zpool import'." % (pool.name, pool.elsewhere[1],
                                      pool.elsewhere[0]))
        pool.elsewhere = None
        name = args[1] if len(args) == 2 else pool.name
        if self._active_pool(name) and pool.props.get("multihost") == "on":
            # seen on OpenZFS 2.1 importing a multihost pool by guid: the
            # kernel's EEXIST, as libzfs words it
            raise CommandError("cannot import '%s': pool already exists"
                               % name)
        if self._active_pool(name):
            # do_import(): the name given (the guid, or the new name)
            raise CommandError(
                "cannot import '%s': a pool with that name already exists\n"
                "use the form 'zpool import <pool | id> <newpool>' to give it"
                " a new name" % args[-1])
        pool.readonly = props.get("readonly") == "on"
        pool.label_name = None
        if name != pool.name:               # zpool import <id> <newname>
            # read-only: the labels are not written, they keep the old name
            pool.label_name = pool.name if pool.readonly else None
            self._rename_pool(pool, name, labels=not pool.readonly)
        pool.state = "ACTIVE"
        if "cachefile" in props:
            pool.props["cachefile"] = props["cachefile"]
        return ""

    def _rename_pool(self, pool, new, labels=True):
        old = pool.name
        renamed = {}
        for name, ds in pool.datasets.items():
            ds.name = new + name[len(old):]
            renamed[ds.name] = ds
            if ds.origin:
                ds.origin = new + ds.origin[len(old):]
            ds.clones = [new + c[len(old):] for c in ds.clones]
        pool.datasets, pool.name = renamed, new
        for leaf in (pool.leaves() if labels else []):
            dev = self._dev(leaf.path)
            label = dev.label if dev else None
            if label and label["guid"] == pool.guid:
                label["pool"] = new

    def _import_block(self, pool):
        lines = ["   pool: %s" % pool.name, "     id: %s" % pool.guid,
                 "  state: ONLINE",
                 " action: The pool can be imported using its name or "
                 "numeric identifier.", " config:", "",
                 "\t%-12s  ONLINE" % pool.name]
        for index, vdev in enumerate(pool.vdevs):
            if vdev.kind != "disk":
                lines.append("\t  %-10s  ONLINE" % ("%s-%d" % (vdev.kind,
                                                               index)))
            for leaf in vdev.leaves:
                lines.append("\t    %-8s  ONLINE" % leaf.path.split("/")[-1])
        return "\n".join(lines) + "\n"

    def _zpool_export(self, argv):
        opts, args = self._getopt(argv, 2, "")
        if len(args) != 1:
            raise _Unknown()
        pool = self._open_pool(args[0])
        if pool.label_name:                  # read-only, renamed
            self._rename_pool(pool, pool.label_name, labels=False)
            pool.label_name = None
        pool.state, pool.readonly = "EXPORTED", False
        return ""

    def _zpool_destroy(self, argv):
        opts, args = self._getopt(argv, 2, "")
        if len(args) != 1:
            raise _Unknown()
        pool = self._open_pool(args[0])
        if pool.readonly:
            raise CommandError("cannot destroy '%s': pool is read-only"
                               % pool.name)
        pool.state = "DESTROYED"
        return ""

    def _zpool_labelclear(self, argv):
        opts, args = self._getopt(argv, 2, "f")
        if len(args) != 1:
            raise _Unknown()
        path = args[0]
        if self._dev(path) is None:
            raise CommandError("failed to open %s: No such file or directory"
                               % path)
        dev = self._dev(path)
        if dev.label:
            # zpool_in_use(): the label's vdev must be in the imported
            # pool's config now (a replaced disk's stale label is not)
            pool = self._member_of_active(dev)
            if pool is not None:
                raise CommandError(
                    "labelclear operation failed.\n\tVdev %s is a member "
                    "(ACTIVE), of pool \"%s\".\n\tTo remove label information"
                    " from this device, export or destroy\n\tthe pool, or "
                    "remove %s from the configuration of this pool\n\tand "
                    "retry the labelclear operation." % (path, pool.name,
                                                         path))
            exported = [p for p in self.pools if p.guid == dev.label["guid"]
                        and p.state == "EXPORTED"]
            if exported and ("f", None) not in opts:
                raise CommandError("use '-f' to override the following "
                                   "error:\n%s is a member of exported pool "
                                   "\"%s\"" % (path, exported[0].name))
        dev.label = None
        return ""

    def _zpool_status(self, argv):
        opts, args = self._getopt(argv, 2, "Px")
        if sorted(opts) not in ([("P", None)], [("P", None), ("x", None)]) \
                or len(args) != 1:
            raise _Unknown()
        pool = self._open_pool(args[0])
        text = self._status_text(pool)
        if ("x", None) in opts and "\nstatus: " not in text:
            # -x: a pool whose status is OK (zpool_get_status) is one line
            return "pool '%s' is healthy\n" % pool.name
        return text

    def _status_text(self, pool):
        health = self._health(pool)
        leaves = pool.leaves()
        # libzfs's status looks at data, log and cache leaves, not spares
        used = [leaf for vdev in pool.vdevs if vdev.klass != "spare"
                for leaf in vdev.leaves]
        out = ["  pool: %s" % pool.name, " state: %s" % health]
        # zpool status's own words (OpenZFS zpool_main.c)
        see = "   see: https://openzfs.github.io/openzfs-docs/msg/ZFS-8000-"
        replicas = ["\tSufficient replicas exist for the pool to continue "
                    "functioning in a",
                    "\tdegraded state."]
        if health in ("UNAVAIL", "FAULTED", "SUSPENDED"):
            out += ["status: One or more devices are faulted in response to "
                    "IO failures.",
                    "action: Make sure the affected devices are connected, "
                    "then run 'zpool clear'.",
                    see + "HC"]
        elif pool.resilvering:   # checked first by libzfs
            out += ["status: One or more devices is currently being "
                    "resilvered.  The pool will",
                    "\tcontinue to function, possibly in a degraded state.",
                    "action: Wait for the resilver to complete."]
        elif any(not leaf.present for leaf in used):
            out += ["status: One or more devices could not be used because "
                    "the label is missing or",
                    "\tinvalid.  Sufficient replicas exist for the pool to "
                    "continue",
                    "\tfunctioning in a degraded state.",
                    "action: Replace the device using 'zpool replace'.",
                    see + "4J"]
        elif any(leaf.state == "FAULTED" for leaf in used):
            out += ["status: One or more devices are faulted in response to "
                    "persistent errors."] + replicas + [
                    "action: Replace the faulted device, or use 'zpool clear'"
                    " to mark the device",
                    "\trepaired.",
                    see + "K4"]
        elif any(leaf.state == "OFFLINE" for leaf in used):
            out += ["status: One or more devices has been taken offline by "
                    "the administrator."] + replicas + [
                    "action: Online the device using 'zpool online' or "
                    "replace the device with",
                    "\t'zpool replace'."]
        out += ["config:", ""]
        width = max([len(pool.name), 10] +
                    [len(leaf.path) + 4 for leaf in leaves])

        def row(depth, name, state, errors=(0, 0, 0), aux="", spare=False):
            line = "\t%s%s  %-8s" % (" " * depth, name.ljust(width - depth),
                                     state)
            if not spare:
                line += " %5d %5d %5d" % errors
            return line + ("  " + aux if aux else "")

        def leaf_row(depth, leaf, spare=False):
            name = leaf.path if leaf.present else leaf.guid
            aux = ("was %s" % leaf.path) if not leaf.present else leaf.aux
            return row(depth, name, self._leaf_state(
                leaf, "spare" if spare else None), leaf.errors, aux, spare)

        out.append("\t%s  STATE     READ WRITE CKSUM" % "NAME".ljust(width))
        out.append(row(0, pool.name, health, aux="insufficient replicas"
                       if health == "UNAVAIL" else ""))
        for klass, header in [(None, "")] + [
                ("dedup", "dedup"), ("special", "special"), ("log", "logs"),
                ("cache", "cache"), ("spare", "spares")]:
            vdevs = [(i, v) for i, v in enumerate(pool.vdevs)
                     if v.klass == klass]
            if not vdevs:
                continue
            if header:
                out.append("\t%s%s" % (header, "\t" if klass in (
                    "dedup", "special", "log") else ""))
            for index, vdev in vdevs:
                if vdev.kind == "disk":
                    out.append(leaf_row(2, vdev.leaves[0], klass == "spare"))
                    continue
                out.append(row(2, "%s-%d" % (vdev.kind, index),
                               self._vdev_state(vdev)))
                for leaf in vdev.leaves:
                    out.append(leaf_row(4, leaf))
        out += ["", "errors: No known data errors"]
        return "\n".join(out) + "\n"

    # --- zfs -----------------------------------------------------------------

    def _zfs_version(self, argv):
        if len(argv) != 2:
            raise _Unknown()
        return ZFS_VERSION

    @staticmethod
    def _types(text):
        names = {"filesystem": "filesystem", "fs": "filesystem",
                 "volume": "volume", "vol": "volume",
                 "snapshot": "snapshot", "snap": "snapshot",
                 "bookmark": "bookmark"}
        types = set()
        for word in text.split(","):
            if word == "all":
                types |= {"filesystem", "volume", "snapshot", "bookmark"}
            elif word in names:
                types.add(names[word])
            else:
                raise CommandError("invalid type '%s'" % word, rc=2)
        return types

    def _iterate(self, roots, types, recurse, depth):
        """zfs_for_each(): the datasets zfs list/get visit, in order."""
        argtypes = set(types)
        if recurse:
            argtypes.add("filesystem")
            if types & {"snapshot", "bookmark"}:
                argtypes.add("volume")
        found = []
        if roots is None:
            pools = sorted((p for p in self.pools if p.state == "ACTIVE"),
                           key=lambda p: p.name)
            starts = [(p, p.datasets[p.name]) for p in pools]
        else:
            starts = []
            for name in roots:
                pool, ds = self._lookup(name)
                if ds.kind not in argtypes:
                    raise CommandError(
                        "cannot open '%s': operation not applicable to "
                        "datasets of this type" % name)
                starts.append((pool, ds))
        for pool, ds in starts:
            base = ds.name.count("/") + ds.name.count("@")
            members = [ds]
            if recurse:
                members += [d for d in self._descendants(pool, ds.name,
                                                         bookmarks=True)
                            if depth is None or
                            d.name.count("/") + d.name.count("@") +
                            d.name.count("#") - base <= depth]
            for member in sorted(members, key=_sort_key):
                if member.kind in types:
                    found.append((pool, member))
        return found

    def _zfs_list(self, argv):
        opts, args = self._getopt(argv, 2, "Hpo:t:rd:")
        flags = dict(opts)
        if "H" not in flags or "p" not in flags or "o" not in flags or \
                not args:
            raise _Unknown()
        columns = flags["o"].split(",")
        types = self._types(flags.get("t", "filesystem,volume"))
        recurse = "r" in flags or "d" in flags
        depth = int(flags["d"]) if "d" in flags else None
        if types and types <= {"snapshot", "bookmark"} and not recurse:
            recurse, depth = True, 1   # zfs list -t snapshot <dataset>
        rows = []
        for pool, ds in self._iterate(args, types, recurse, depth):
            cells = [self._value(pool, ds, c) for c in columns]
            rows.append("\t".join("-" if c is None else c for c in cells))
        return "".join(r + "\n" for r in rows)

    def _zfs_get(self, argv):
        opts, args = self._getopt(argv, 2, "Hpo:t:rs:")
        flags = dict(opts)
        if "H" not in flags or "p" not in flags or "o" not in flags or \
                not args:
            raise _Unknown()
        props = args[0].split(",")
        roots = args[1:] or None
        columns = flags["o"].split(",")
        types = self._types(flags.get("t", "filesystem,volume"))
        recurse, depth = "r" in flags, None
        sources = flags.get("s", "local,default,inherited,temporary,"
                                 "received,none").split(",")
        rows = []
        for pool, ds in self._iterate(roots, types, recurse, depth):
            for prop in props:
                value = self._value(pool, ds, prop)
                source = self._source(pool, ds, prop)
                kind = source.split()[0] if source != "-" else "none"
                if kind not in sources:
                    continue
                cell = {"name": ds.name, "property": prop,
                        "value": "-" if value is None else value,
                        "source": source}
                rows.append("\t".join(cell[c] for c in columns))
        return "".join(r + "\n" for r in rows)

    def _zfs_set(self, argv):
        """OpenZFS 2.1: no getopt; prop=value words, then datasets; any
        first argument starting with '-' is refused."""
        if len(argv) > 2 and argv[2].startswith("-"):
            raise CommandError("invalid option '%s'\nusage:\n\tset <property="
                               "value> ... <filesystem|volume|snapshot> ..."
                               % argv[2][1:2], rc=2)
        words = argv[2:]
        pairs = [w for w in words if "=" in w]
        names = words[len(pairs):]
        if not pairs or not names or any("=" in n for n in names):
            raise CommandError("invalid argument order\nusage:\n\tset "
                               "<property=value> ... <filesystem|volume|"
                               "snapshot> ...", rc=2)
        props = self._parse_props(pairs, "cannot set property")
        for name in names:
            errprefix = "cannot set property for '%s'" % name
            pool, ds = self._lookup(name)
            for key, value in sorted(props.items()):
                self._check_prop(ds.kind, key, value, errprefix,
                                 creating=False)
            if pool.readonly:
                raise CommandError("%s: pool is read-only" % errprefix)
            self._apply_props(pool, ds, props, errprefix)
        return ""

    def _apply_props(self, pool, ds, props, errprefix):
        """libzfs zfs_prop_set_list(), then the kernel's
        zfs_set_prop_nvlist(), which is not one transaction.

        libzfs refuses bad values first (then nothing is set), adds the
        refreservation a thick volume's volsize change implies
        (zfs_add_synthetic_resv) and resolves refreservation=auto for the
        new size (zfs_fix_auto_resv). The kernel then sets each special
        property (volsize, refreservation) on its own, retrying a failed
        one once after the others, and the plain ones (user properties) in
        one batch, or one by one when the batch fails. A thick volume
        grown past the free space keeps its old volsize and refreservation
        and the command fails: so OpenZFS 2.1 and 2.3 answer ``zfs set
        refreservation=auto volsize=<too big>`` (tests/integration/
        test_fakezfs_contract.py; this fake used to keep the new volsize).
        """
        props = dict(props)
        if "volsize" in props:
            size = parse_size(props["volsize"])
            if size is not None and size % ds.volblocksize:
                raise CommandError("%s: 'volsize' must be a multiple of "
                                   "volume block size (%s)"
                                   % (errprefix, nicenum(ds.volblocksize)))
            if size is None or size == 0:
                raise CommandError("%s: 'volsize' cannot be zero"
                                   % errprefix)
            props["volsize"] = str(size)
            old_auto = self._auto_reservation(ds.volsize, ds.volblocksize)
            if self._refreservation(ds) == old_auto and \
                    "refreservation" not in props:
                props["refreservation"] = "auto"
        if props.get("refreservation") == "auto":
            props["refreservation"] = str(self._auto_reservation(
                int(props.get("volsize", ds.volsize)), ds.volblocksize))
        elif props.get("refreservation") not in (None, "none"):
            props["refreservation"] = str(parse_size(props["refreservation"]))
        failed = []
        special = [k for k in props if k in ("volsize", "refreservation")]
        old_volsize = ds.volsize
        retry = [k for k in special if not self._set_special(
            pool, ds, k, props[k])]
        failed += [k for k in retry if not self._set_special(
            pool, ds, k, props[k])]
        if failed:
            ds.volsize = old_volsize   # as real ZFS leaves it (see above)
        plain = dict((k, v) for k, v in props.items() if k not in special)
        for key, value in plain.items():
            if self._too_big({key: value}):
                failed.append(key)
            else:
                ds.props[key] = value
        if failed:
            raise CommandError("\n".join(
                "%s: %s" % (errprefix, "property value too long"
                            if ":" in key else
                            "size is greater than available space")
                for key in failed))

    def _set_special(self, pool, ds, key, value):
        """zfs_prop_set_special() for volsize and refreservation: whether
        it took (a refreservation needs the free space it adds)."""
        if key == "volsize":
            if int(value) != ds.volsize:
                pool.txg += 1
                ds.dnode_txg = pool.txg    # object 2 (the size) rewritten
            ds.volsize = int(value)
            return True
        if value != "none":
            grow = int(value) - max(self._refreservation(ds),
                                    self._usedds(ds))
            if grow > self._pool_avail(pool):
                return False
        ds.props[key] = value
        return True

    def _zfs_inherit(self, argv):
        """``zfs inherit <prop> <dataset>...``: the local value goes (no
        error when there was none)."""
        opts, args = self._getopt(argv, 2, "rS")
        if opts or len(args) < 2:
            raise _Unknown()
        prop, names = args[0], args[1:]
        for name in names:
            pool, ds = self._lookup(name)
            if ":" not in prop and prop not in NATIVE_DEFAULTS:
                raise CommandError("invalid property '%s'" % prop, rc=2)
            if pool.readonly:
                raise CommandError("cannot inherit %s for '%s': pool is "
                                   "read-only" % (prop, name))
            ds.props.pop(prop, None)
        return ""

    def _zfs_create(self, argv):
        opts, args = self._getopt(argv, 2, "V:so:")
        if len(args) != 1:
            raise _Unknown()
        name = args[0]
        errprefix = "cannot create '%s'" % name
        self._check_name(name, errprefix)
        kind = "volume" if any(f == "V" for f, _ in opts) else "filesystem"
        props = self._parse_props([v for f, v in opts if f == "o"],
                                  errprefix)
        sparse = ("s", None) in opts
        if sparse and kind != "volume":
            raise CommandError("'-s' can only be used when creating a volume",
                               rc=2)
        for key, value in sorted(props.items()):
            self._check_prop(kind, key, value, errprefix)
        pool = self._active_pool(name.split("/")[0])
        if pool is None:
            raise CommandError("%s: no such pool '%s'"
                               % (errprefix, name.split("/")[0]))
        parent = pool.datasets.get(_parent_name(name) or "")
        if "/" not in name:
            raise CommandError("%s: missing dataset name" % errprefix)
        if name in pool.datasets:
            raise CommandError("%s: dataset already exists" % errprefix)
        if parent is None:
            raise CommandError("%s: parent does not exist" % errprefix)
        if parent.kind != "filesystem":
            raise CommandError("%s: parent is not a filesystem" % errprefix)
        if pool.readonly:
            raise CommandError("%s: pool is read-only" % errprefix)
        if kind == "filesystem":
            if self._too_big(props):
                raise self._internal_error(errprefix,
                                           "Argument list too long")
            ds = self._new_dataset(pool, name, kind, self._cut(props))
            ds.refer = FS_BASE
            return ""
        volsize = parse_size(dict(opts)["V"])
        block = parse_size(props.pop("volblocksize",
                                     str(self.default_volblocksize)))
        if not volsize:
            raise CommandError("%s: volume size cannot be zero" % errprefix)
        if volsize % block:
            raise CommandError("%s: volume size must be a multiple of volume "
                               "block size" % errprefix)
        if not sparse and "refreservation" not in props:
            props["refreservation"] = "auto"
        if props.get("refreservation") == "auto":
            props["refreservation"] = str(self._auto_reservation(volsize,
                                                                 block))
        reserve = self._refreservation(Dataset(name, kind, props, 0, "0"))
        if reserve > self._pool_avail(pool):
            raise CommandError("%s: out of space" % errprefix)
        if self._too_big(props):   # created, props refused, destroyed
            raise self._internal_error(errprefix, "Argument list too long")
        ds = self._new_dataset(pool, name, kind, self._cut(props))
        ds.volsize, ds.volblocksize, ds.refer = volsize, block, VOL_BASE
        return ""

    def _zfs_snapshot(self, argv):
        opts, args = self._getopt(argv, 2, "o:")
        if not args:
            raise _Unknown()
        props = self._parse_props([v for _, v in opts],
                                  "cannot create snapshot")
        checked = False
        for name in args:
            errprefix = "cannot create snapshot '%s'" % name
            self._check_name(name, errprefix, snapshot=True)
            for key, value in sorted(props.items()):
                self._check_prop("snapshot", key, value, errprefix)
            if not checked and self._too_big(props):
                # zfs_ioc_snapshot: zfs_check_userprops() fails the whole
                # call with E2BIG before any snapshot is taken
                raise self._internal_error("cannot create snapshots ",
                                           "Argument list too long")
            checked = True
            pool, head = self._lookup(_head(name), errprefix)
            if name in pool.datasets:
                raise CommandError("%s: dataset already exists" % errprefix)
            if pool.readonly:
                raise CommandError("%s: pool is read-only" % errprefix)
        for name in args:
            pool, head = self._lookup(_head(name))
            snap = self._new_dataset(pool, name, "snapshot", props)
            snap.refer = head.refer
            snap.volsize, snap.volblocksize = head.volsize, head.volblocksize
            self._copy_data(head, snap)
        return ""

    def _zfs_clone(self, argv):
        opts, args = self._getopt(argv, 2, "o:")
        if len(args) != 2:
            raise _Unknown()
        origin, name = args
        errprefix = "cannot create '%s'" % name
        pool, snap = self._lookup(origin)
        if snap.kind != "snapshot":
            raise CommandError("cannot open '%s': operation not applicable to"
                               " datasets of this type" % origin)
        self._check_name(name, errprefix)
        head = pool.datasets[_head(origin)]
        props = self._parse_props([v for _, v in opts], errprefix)
        for key, value in sorted(props.items()):
            self._check_prop(head.kind, key, value, errprefix,
                             creating=False)
        if _head(name).split("/")[0] != pool.name:
            raise CommandError("%s: source and target pools differ"
                               % errprefix)
        if name in pool.datasets:
            raise CommandError("%s: dataset already exists" % errprefix)
        parent = pool.datasets.get(_parent_name(name) or "")
        if parent is None:
            raise CommandError("%s: parent does not exist" % errprefix)
        if pool.readonly:
            raise CommandError("%s: pool is read-only" % errprefix)
        if props.get("refreservation") == "auto":
            props["refreservation"] = str(self._auto_reservation(
                snap.volsize, snap.volblocksize))
        if self._refreservation(Dataset(name, head.kind, props, 0, "0")) > \
                self._pool_avail(pool):
            raise CommandError("%s: out of space" % errprefix)
        if self._too_big(props):   # zfs_ioc_clone destroys it again
            raise self._internal_error(errprefix, "Argument list too long")
        ds = self._new_dataset(pool, name, head.kind, self._cut(props))
        ds.origin, ds.refer, ds.from_origin = origin, snap.refer, snap.refer
        ds.volsize, ds.volblocksize = snap.volsize, snap.volblocksize
        self._copy_data(snap, ds)
        snap.clones.append(name)
        return ""

    def _zfs_rename(self, argv):
        """``zfs rename [--] <zvol> <new>`` (its snapshots follow, and the
        clones' origin names with them) or ``<zvol>@<a> <zvol>@<b>``
        (OpenZFS 2.1 libzfs zfs_rename: its error texts)."""
        opts, args = self._getopt(argv, 2, "")
        if opts or len(args) != 2:
            raise _Unknown()
        old, new = args
        pool, ds = self._lookup(old)
        errprefix = "cannot rename to '%s'" % new
        if "@" in old:
            if _head(new) != _head(old):
                raise CommandError("%s: snapshots must be part of same "
                                   "dataset" % errprefix)
        elif ds.kind != "volume" or "@" in new:
            raise _Unknown()     # zfs-ng renames zvols only
        elif _parent_name(new) not in pool.datasets:
            raise CommandError("%s: parent does not exist" % errprefix)
        if new in pool.datasets:
            raise CommandError("%s: dataset already exists" % errprefix)
        moves = [(old, new)]
        if "@" not in old:
            moves += [(d.name, new + d.name[len(old):])
                      for d in self._snapshots(pool, old)]
        self._rename_all(pool, moves)
        return ""

    @staticmethod
    def _rename_all(pool, moves):
        renamed = dict(moves)
        for old, new in moves:
            ds = pool.datasets.pop(old)
            ds.name = new
            pool.datasets[new] = ds
        for ds in pool.datasets.values():
            ds.origin = renamed.get(ds.origin, ds.origin)
            ds.clones = [renamed.get(c, c) for c in ds.clones]

    def _zfs_destroy(self, argv):
        opts, args = self._getopt(argv, 2, "rd")
        if len(args) != 1:
            raise _Unknown()
        recurse, defer = ("r", None) in opts, ("d", None) in opts
        name = args[0]
        if "@" in name:
            return self._destroy_snapshots(name, recurse, defer)
        if "#" in name:
            return self._destroy_bookmark(name, recurse, defer)
        pool, ds = self._lookup(name)
        if defer:   # -d opens the target as a snapshot
            raise CommandError("cannot open '%s': operation not applicable to"
                               " datasets of this type" % name)
        errprefix = "cannot destroy '%s'" % name
        if "/" not in name and not recurse:
            raise CommandError(
                "%s: operation does not apply to pools\nuse 'zfs destroy -r "
                "%s' to destroy all datasets in the pool\nuse 'zpool destroy "
                "%s' to destroy the pool itself" % (errprefix, name, name))
        below = sorted(self._descendants(pool, name), key=_sort_key)
        if below and not recurse:
            raise CommandError("%s: %s has children\nuse '-r' to destroy the "
                               "following datasets:\n%s" % (
                                   errprefix, ds.kind,
                                   "\n".join(d.name for d in below)))
        inside = set(d.name for d in below) | {name}
        clones = [c for d in below for c in d.clones if c not in inside]
        if clones:
            raise CommandError("%s: %s has dependent clones\nuse '-R' to "
                               "destroy the following datasets:\n%s" % (
                                   errprefix, ds.kind, "\n".join(clones)))
        if pool.readonly:
            raise CommandError("%s: pool is read-only" % errprefix)
        doomed = below + ([ds] if "/" in name else [])
        for victim in sorted(doomed, key=lambda d: -d.name.count("/")):
            if victim.name in pool.datasets:   # not freed with a clone
                self._forget(pool, victim)
        return ""

    def _destroy_snapshots(self, name, recurse, defer):
        head, snapname = name.split("@", 1)
        pool, ds = self._lookup(head)
        heads = [ds] + (sorted((d for d in self._descendants(pool, head)
                                if d.kind != "snapshot"), key=_sort_key)
                        if recurse else [])
        snaps = [pool.datasets[h.name + "@" + snapname] for h in heads
                 if h.name + "@" + snapname in pool.datasets]
        if not snaps:
            raise CommandError("could not find any snapshots to destroy; "
                               "check snapshot names.")
        for snap in snaps:
            if snap.clones and not defer:
                raise CommandError(
                    "cannot destroy '%s': snapshot has dependent clones\nuse "
                    "'-R' to destroy the following datasets:\n%s"
                    % (snap.name, "\n".join(snap.clones)))
        if pool.readonly:
            raise CommandError("cannot destroy snapshots: pool is read-only")
        for snap in snaps:
            if snap.clones:
                snap.defer_destroy = True
            else:
                self._forget(pool, snap)
        return ""

    def _forget(self, pool, ds):
        """Remove a dataset (its bookmarks go with it: they live in the
        dataset); free a deferred origin with its last clone."""
        del pool.datasets[ds.name]
        if ds.kind in ("volume", "filesystem"):
            for mark in self._bookmarks(pool, ds.name):
                del pool.datasets[mark.name]
        if ds.origin and ds.origin in pool.datasets:
            origin = pool.datasets[ds.origin]
            origin.clones.remove(ds.name)
            if origin.defer_destroy and not origin.clones:
                self._forget(pool, origin)

    # --- changed block tracking: bookmarks, zfs send, zdb -dddd -------------

    def _zfs_bookmark(self, argv):
        """``zfs bookmark <snapshot|bookmark> <bookmark>`` (zfs_do_bookmark,
        OpenZFS 2.1 and 2.3): the new bookmark marks the source's txg."""
        opts, args = self._getopt(argv, 2, "")
        usage = "usage:\n\tbookmark <snapshot|bookmark> <newbookmark>\n"
        if len(args) != 2:
            raise _Unknown()
        source, name = args
        if "@" not in source and "#" not in source:
            raise CommandError("invalid source name '%s': must contain a '@'"
                               " or '#'\n%s" % (source, usage), rc=2)
        if "#" not in name:
            raise CommandError("invalid bookmark name '%s': must contain a "
                               "'#'\n%s" % (name, usage), rc=2)
        if source[0] in "@#" or name[0] == "#":
            raise _Unknown()   # short names: zfs-ng sends full ones
        try:
            pool, src = self._lookup(source)
        except CommandError as exc:   # zfs_open() failed: usage, exit 2
            raise CommandError(exc.err + usage, rc=2)
        errprefix = "cannot create bookmark '%s'" % name
        head, _, short = name.partition("#")
        if not short or not COMPONENT_RE.match(short) or len(name) >= 256:
            raise CommandError("%s: invalid argument" % errprefix)
        if head.split("/")[0] != pool.name:
            raise CommandError("%s: bookmark is in a different pool"
                               % errprefix)
        if head not in pool.datasets:
            raise CommandError("%s: dataset does not exist" % errprefix)
        if head != _head(source):
            raise CommandError("%s: source is not an ancestor of the new "
                               "bookmark's dataset" % errprefix)
        if name in pool.datasets:
            raise CommandError("%s: bookmark exists" % errprefix)
        if pool.readonly:
            raise CommandError("%s: pool is read-only" % errprefix)
        pool.datasets[name] = Dataset(name, "bookmark", {}, src.createtxg,
                                      src.guid)
        return ""

    def _destroy_bookmark(self, name, recurse, defer):
        """``zfs destroy <vol>#<name>`` (zfs_do_destroy)."""
        if defer or recurse:
            raise CommandError("%s is not supported with bookmark" % (
                "defer destroy" if defer else "recursive"), rc=255)
        pool = self._active_pool(_head(name.split("/")[0]))
        mark = pool.datasets.get(name) if pool else None
        if mark is None or mark.kind != "bookmark":
            raise CommandError("bookmark '%s' does not exist." % name)
        if pool.readonly:
            raise CommandError("cannot destroy bookmark: pool is read-only")
        del pool.datasets[name]
        return ""

    # zfs send

    def stream(self, argv, consume, bound=None):
        """The runner's stream(argv, consume): the command's stdout (bytes)
        is read by consume(read); returns (Result, consume's value), as
        runner.SubprocessRunner.stream does. Only ``zfs send`` and ``zdb
        -ddddd`` write a stream. A failed command writes nothing: consume's
        StorageError over the empty stream gives way to the command's
        Result. The bound asked for is kept in ``bounds`` (argv, bound)."""
        self.calls.append(list(argv))
        self.bounds = getattr(self, "bounds", []) + [(list(argv), bound)]
        self._sending = _Reader([])
        try:
            result = self._run(list(argv))
            reader = self._sending if result.rc == 0 else _Reader([])
        finally:
            self._sending = None
        try:
            value = consume(reader.read)
        except errors.StorageError:
            if result.rc == 0:
                raise
            return result, None
        return result, value

    def _zfs_send(self, argv):
        """``zfs send -L -e -c [-i <from>] <snapshot>`` (zfs_send_one): an
        incremental stream (a full one without -i: from txg 0) of the data object (object 1) in OpenZFS's
        record layout, little-endian. What it holds, as OpenZFS 2.1 and
        2.3 send it (traverse_visitbp, send_holes_without_birth_time=1):
        the blocks born after from's txg, walked down the block tree
        (indirect blocks of 1024 pointers, 3 pointers in the dnode): a
        data block is a WRITE of one block, a hole born after from a FREE,
        and under every indirect block walked, a never-written subtree a
        FREE of its whole span; then, once the dnode changed, the FREE
        from (maxblkid + 1) * volblocksize to the object's end. FREEs
        that touch are one record. Not modelled: indirect blocks turned
        into holes by a discard of their whole span (ZFS then sends one
        FREE of the span; here, one per block), embedded and compressed
        records (-e -c change the payloads, never the ranges), and any
        object but the data object."""
        if getattr(self, "_sending", None) is None:
            raise _Unknown()    # a send stream is never read as text
        opts, args = self._getopt(argv, 2, "Leci:")
        flags = dict(opts)
        if sorted(flags) not in (["L", "c", "e", "i"], ["L", "c", "e"]) or \
                len(args) != 1:
            raise _Unknown()
        if "i" not in flags:       # a full stream: everything born since 0
            pool, to = self._lookup(args[0])
            if to.kind != "snapshot":
                raise _Unknown()
            self._sending = _Reader(self._send_records(to, 0))
            return ""
        base, target = flags["i"], args[0]
        if "@" not in target or ("@" not in base and "#" not in base) or \
                base[0] in "@#":
            raise _Unknown()
        pool, to = self._lookup(target)
        errprefix = "warning: cannot send '%s'" % target
        if "@" in base:
            _, start = self._lookup(base)
        else:
            start = pool.datasets.get(base)
            if start is None or start.kind != "bookmark":
                raise CommandError("%s: incremental source (%s) does not "
                                   "exist" % (errprefix, base))
        if not self._is_before(pool, start, to):
            raise CommandError("%s: not an earlier snapshot from the same "
                               "fs" % errprefix)
        self._sending = _Reader(self._send_records(to, start.createtxg))
        return ""

    def _is_before(self, pool, earlier, later):
        """snapshot_is_before() (and the kernel's check of a bookmark):
        earlier is older and in later's history: its zvol, or the origin
        of its zvol (before the clone's origin), recursively."""
        if earlier.createtxg >= later.createtxg:
            return False
        head = pool.datasets.get(_head(later.name))
        while head is not None:
            if _head(earlier.name) == head.name:
                return True
            if not head.origin or head.origin not in pool.datasets:
                return False
            origin = pool.datasets[head.origin]
            if earlier.createtxg > origin.createtxg:
                return False
            head = pool.datasets.get(_head(origin.name))
        return False

    def _send_records(self, to, fromtxg):
        """The records of the stream, as _Reader chunks."""
        block, fanout, top = to.volblocksize, 1024, 3
        yield _record(SEND_BEGIN, [(4, "I", 0), (8, "Q", SEND_MAGIC),
                                   (32, "Q", int(to.guid))])
        if to.dnode_txg > fromtxg:
            yield _record(SEND_OBJECT, [(8, "Q", 1), (16, "I", 23),
                                        (24, "I", block)])
            records = []
            levels = 1
            while top * fanout ** (levels - 1) <= to.maxblkid:
                levels += 1
            births = [dict((b, t) for b, (t, _) in to.blocks.items())]
            for level in range(1, levels):
                above = {}
                for blkid, birth in births[-1].items():
                    key = blkid // fanout
                    above[key] = max(above.get(key, 0), birth)
                births.append(above)

            def walk(level, index):
                birth = births[level].get(index)
                span = fanout ** level
                if birth is None:        # never written: a hole, birth 0
                    records.append(("free", index * span * block,
                                    span * block))
                elif birth > fromtxg and level == 0:
                    records.append(("write" if to.blocks[index][1] else
                                    "free", index * block, block))
                elif birth > fromtxg:
                    for child in range(index * fanout, (index + 1) * fanout):
                        walk(level - 1, child)

            for index in range(top):
                walk(levels - 1, index)
            tail = (to.maxblkid + 1) * block
            yield _record(SEND_FREE, [(8, "Q", 1), (16, "Q", tail),
                                      (24, "Q", SEND_END_OF_OBJECT)])
            pending = None
            for kind, offset, length in records:
                if kind == "free":
                    if pending and pending[1] == offset:
                        pending = (pending[0], offset + length)
                        continue
                    if pending:
                        yield _free(*pending)
                    pending = (offset, offset + length)
                    continue
                if pending:
                    yield _free(*pending)
                    pending = None
                yield _record(SEND_WRITE, [(8, "Q", 1), (16, "I", 23),
                                           (24, "Q", offset),
                                           (32, "Q", length)])
                yield length             # its payload
            if pending:
                yield _free(*pending)
            yield _record(SEND_FREEOBJECTS, [(8, "Q", 3), (16, "Q", 0)])
        yield _record(SEND_END, [(40, "Q", int(to.guid))])

    # zdb

    def _zdb_objects(self, argv):
        """``zdb -e -p <dir>... -dddd <dataset> 1``: the data object of a
        zvol or snapshot, as zdb reads it from the pool's disks (dump_dnode
        at verbosity 4: its "dnode maxblkid" line); with ``-ddddd``
        (verbosity 5, read as a stream) its block tree too
        (``_indirect_blocks``)."""
        dirs, i = [], 2
        while argv[i:i + 1] == ["-p"] and i + 1 < len(argv):
            dirs.append(argv[i + 1])
            i += 2
        tree = argv[i:i + 1] == ["-ddddd"]
        if tree and getattr(self, "_sending", None) is None:
            raise _Unknown()    # printed to a stream only
        if argv[i:i + 1] not in (["-dddd"], ["-ddddd"]) or \
                len(argv) != i + 3 or argv[i + 2] != "1" or not dirs:
            raise _Unknown()
        name = argv[i + 1]
        pool = None
        for candidate in self.pools:
            if candidate.name == _head(name.split("/")[0]) and \
                    candidate.state == "ACTIVE":
                pool = candidate
        if pool is None or not [l for l in pool.leaves()
                                if os.path.dirname(l.path) in dirs]:
            raise CommandError("zdb: can't open '%s': No such file or "
                               "directory" % _head(name.split("/")[0]))
        ds = pool.datasets.get(name)
        if ds is None or ds.kind not in ("volume", "snapshot") or \
                ds.volblocksize is None:
            raise CommandError("failed to hold dataset '%s': No such file "
                               "or directory" % name, rc=2)
        text = ("Dataset %s [ZVOL], ID %d, cr_txg %d, %s, 2 objects\n\n"
                "    Object  lvl   iblk   dblk  dsize  dnsize  lsize   %%full"
                "  type\n"
                "%10d  %3d  %5s  %5s  %5s  %6s  %5s  %6s  zvol object\n"
                "\tdnode flags: USED_BYTES \n\tdnode maxblkid: %d\n\n"
                % (name, 100 + ds.createtxg, ds.createtxg, nicenum(ds.refer),
                   1, 1 if ds.maxblkid == 0 else 2, "128K",
                   nicenum(ds.volblocksize), nicenum(ds.refer), "512",
                   nicenum((ds.maxblkid + 1) * ds.volblocksize), "100.00",
                   ds.maxblkid))
        if not tree:
            return text
        self._sending = _Reader([(text + self._indirect_blocks(ds)).encode()])
        return ""

    def _indirect_blocks(self, ds):
        """zdb's dump_indirect of the data object (cmd/zdb/zdb.c,
        visit_indirect, snprintf_blkptr_compact at -ddddd): every block
        pointer with a birth, pre-order, indirect blocks of 1024 pointers
        and 3 in the dnode as _send_records walks them. An indirect
        block's birth is its newest child's, its fill the data blocks
        under it; one with none is a hole. Not modelled: embedded blocks
        (printed as EMBEDDED, fill 1) and gang blocks."""
        block, fanout, top = ds.volblocksize, 1024, 3
        levels = 1
        while top * fanout ** (levels - 1) <= ds.maxblkid:
            levels += 1
        tiers = [dict((b, (t, 1 if data else 0))
                      for b, (t, data) in ds.blocks.items())]
        for level in range(1, levels):
            above = {}
            for blkid, (birth, fill) in tiers[-1].items():
                old = above.get(blkid // fanout, (0, 0))
                above[blkid // fanout] = (max(old[0], birth), old[1] + fill)
            tiers.append(above)
        lines = ["Indirect blocks:"]

        def visit(level, index):
            if index not in tiers[level]:
                return              # birth 0: not printed
            birth, fill = tiers[level][index]
            marks = "".join("L%x" % level if l == level else " "
                            for l in range(levels - 1, -2, -1))
            size = block if level == 0 else 128 * KiB
            if fill:
                bp = "0:%x:%x %xL/%xP F=%d B=%d/%d cksum=%016x:0:0:0" % (
                    (index + 1) * 4096, 4096, size, 4096, fill, birth, birth,
                    index)
            else:
                bp = "0:0:0 %xL B=%d" % (size, birth)
            lines.append("%16x %s%s" % (index * fanout ** level * block,
                                        marks, bp))
            if level and fill:
                for child in range(index * fanout, (index + 1) * fanout):
                    visit(level - 1, child)

        for index in range(top):
            visit(levels - 1, index)
        return "\n".join(lines) + "\n\n"


# --- zfs send stream records (OpenZFS include/sys/zfs_ioctl.h) ----------------

SEND_HEADER = 312          # sizeof (dmu_replay_record_t)
SEND_MAGIC = 0x2F5BACBAC   # DMU_BACKUP_MAGIC
SEND_END_OF_OBJECT = (1 << 64) - 1
(SEND_BEGIN, SEND_OBJECT, SEND_FREEOBJECTS, SEND_WRITE, SEND_FREE,
 SEND_END) = range(6)


def _record(kind, fields):
    """A record's header, little-endian: drr_type, drr_payloadlen, then
    (offset, struct format, value) fields of the drr_u union."""
    hdr = bytearray(SEND_HEADER)
    struct.pack_into("<I", hdr, 0, kind)
    for at, fmt, value in fields:
        struct.pack_into("<" + fmt, hdr, at, value)
    return bytes(hdr)


def _free(offset, end):
    return _record(SEND_FREE, [(8, "Q", 1), (16, "Q", offset),
                               (24, "Q", end - offset)])


class _Reader(object):
    """A pipe's read(n) over chunks: bytes, or an int (that many bytes of
    payload, made as they are read)."""

    def __init__(self, chunks):
        self.chunks = iter(chunks)
        self.current = b""

    def read(self, n=-1):
        while not self.current:
            chunk = next(self.chunks, None)
            if chunk is None:
                return b""
            self.current = chunk
        if isinstance(self.current, int):
            take = self.current if n < 0 else min(n, self.current)
            self.current -= take
            return b"\xa5" * take
        take = self.current if n < 0 else self.current[:n]
        self.current = self.current[len(take):]
        return take
