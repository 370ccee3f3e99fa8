"""The fake host's model, shared by every room of the fake.

The constants of the OpenZFS 2.1 host it plays (sizes, the programs it
fakes, the argv forms that change state, property defaults, choices and
length limits), ``CommandError`` (a failed command's stderr and exit
status), ``nicenum`` and ``parse_size``, the model classes (``Device``,
``Leaf``, ``Vdev``, ``Pool``, ``Dataset``), the helpers that name and sort
datasets, GNU getopt, and ``_Unknown`` (an argv form the fake does not
know). It imports no other room.
"""

import re
import sys

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

ZFS_VERSION = "zfs-2.1.15-1\nzfs-kmod-2.1.15-1\n"
PROGRAMS = ("zpool", "zfs", "lsblk", "blkid", "wipefs", "udevadm", "zdb")
# The plugin's own interpreter runs ``-m zfsng.rangecopy``, which writes
# a zvol (FakeZfs answers it too; not in PROGRAMS, which
# tests/protocol/fakezfs_cmd.py installs wrappers for, by name).
PYTHON = sys.executable
MUTATING = {
    (PYTHON, "-m"),
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
        self.ashift = 9        # the ashift ZFS detects on it (its sectors)


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
        self.ashift = 9        # set when made: zpool create -o or detected


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
