"""device-config: what ``xe sr-create device-config:...`` may say, checked.

Parsing is pure (no command runs) so a bad value is refused before anything
touches a disk. The result is an ``SrConfig``; ``KEYS`` documents every key
for Plugin.Query (``xe sm-list`` shows it).
"""

import re

from zfsng import arc, namelimits, names
from zfsng.errors import InvalidConfiguration

SOURCE_KEYS = ("device", "file-uri", "vdev", "zpool", "dataset")

KEYS = {
    "device": "Comma-separated block devices to build a new pool on "
              "(striped), e.g. /dev/sdb or /dev/sdb,/dev/sdc",
    "file-uri": "Same as device, as file:// URIs, e.g. file:///dev/sdb",
    "vdev": "Any zpool layout as zpool create takes it, e.g. "
            "'mirror /dev/sdb /dev/sdc log /dev/nvme0n1'",
    "zpool": "Adopt this existing, imported pool: the SR lives in a child "
             "dataset zfsng-<sr uuid>; the pool itself is never exported or "
             "destroyed by zfs-ng",
    "dataset": "Adopt this existing filesystem dataset (pool/path): the SR "
               "lives in a child dataset zfsng-<sr uuid>",
    "pool-name": "Name of the pool to create (default: the SR name-label if "
                 "it is a valid unused pool name, else zfsng-<uuid prefix>)",
    "compression": "off, lz4 (default), zstd, zstd-1..19, gzip, gzip-1..9",
    "volblocksize": "Block size of every VDI zvol, 4K..128K (default "
                    "8K on one disk, stripes and mirrors with OpenZFS "
                    "2.2 or later; 16K on raidz, dRAID and OpenZFS 2.1). "
                    "Under 16K on OpenZFS 2.1 only with an ARC floor "
                    "(zfs_arc_min) of 256M or more",
    "ashift": "Pool sector size exponent, 9..16 (default: detected by ZFS)",
    "provisioning": "thin (default) or thick (VDIs fully reserved)",
    "sync": "always (default: a guest's flushed writes survive a power "
            "cut), standard or disabled",
    "logbias": "latency (a sync write is in the log after one write; "
               "default: the pool's, latency unless set) or throughput "
               "(each sync write goes once, to its block: more bandwidth "
               "on a pool without a log device)",
    "dedup": "off (default), on or verify; costs RAM and write speed",
    "force": "true to use disks that carry an old filesystem, partition "
             "table or pool label (their data is lost); default false",
    "pool-guid": "Set by zfs-ng: the pool's guid, to find it again",
    "sr_uuid": "Set by zfs-ng: the SR's uuid",
}

# xapi adds no key of its own to an SMAPIv3 device-config (SRmaster is
# SMAPIv1 only), so every key must be one of KEYS.

POOL_OPTION_KEYS = ("pool-name", "ashift", "force")
COMPRESSION_RE = (r"^(off|lz4|zstd|zstd-([1-9]|1[0-9])|gzip|"
                  r"gzip-[1-9])\Z")
SIZE_RE = r"^([0-9]{1,12})([kKmM]?)\Z"
# Numbers are ASCII digits only: str.isdigit() and int() also take other
# scripts' digits ("\u00b2", "\u0663"), which no zfs command does.
ASHIFT_RE = r"^[0-9]{1,2}\Z"
GUID_RE = r"^[0-9]{1,20}\Z"
GROUP_MIN_DEVICES = {"mirror": 2, "raidz": 2, "raidz1": 2, "raidz2": 3,
                     "raidz3": 4}
CLASS_WORDS = ("log", "cache", "special", "dedup", "spare")
# Chosen by measurement (ARCHITECTURE.md, "Why these defaults"): 8K
# blocks halve the disk bytes of a 4k random read against 16K and cost no
# space on disks and mirrors; on raidz of 4K-sector disks an 8K block
# carries a whole parity sector per data sector or two (34-60% more
# space measured), 16K far less. OpenZFS 2.1 deadlocked with two 8K
# zvols under an ARC at 64 MiB (a 2 GiB dom0's floor) in two runs of two,
# with 16K once in a far longer run: 8K from 2.2 on, whose ARC eviction
# was rewritten (and SR.attach warns of a low floor on 2.1: arcfloor).
VOLBLOCKSIZE_SMALL = 8 * 1024
VOLBLOCKSIZE_SAFE = 16 * 1024
SMALL_BLOCKS_SINCE = arc.SAFE_SINCE
PARITY_WORDS = ("raidz", "raidz1", "raidz2", "raidz3")


def default_volblocksize(parity, zfs_version):
    """The volblocksize of a new SR that device-config does not set: by
    its pool's layout (parity: raidz or dRAID data vdevs) and the loaded
    OpenZFS's (major, minor), None if unknown."""
    if parity or not zfs_version or zfs_version < SMALL_BLOCKS_SINCE:
        return VOLBLOCKSIZE_SAFE
    return VOLBLOCKSIZE_SMALL


def check_small_blocks(size, zfs_version, arc_floor):
    """Refuse a volblocksize under 16K where OpenZFS before 2.2 runs with
    an ARC that may shrink below arc.FLOOR_NEEDED (arc_floor: bytes,
    None if unknown; zfs_version: (major, minor), None if unknown). An
    admin may still ask for them where the ARC cannot fall that low."""
    if size >= VOLBLOCKSIZE_SAFE or \
            not arc.floor_too_low(zfs_version, arc_floor):
        return
    release = "%d.%d" % zfs_version if zfs_version else "an unknown release"
    floor = "%d MiB" % (arc_floor >> 20) if arc_floor else "unknown"
    raise InvalidConfiguration(
        "device-config:volblocksize=%dK: this host runs OpenZFS %s, which "
        "can stop a zvol's reads for good with blocks under 16K once the "
        "ARC shrinks to its floor (%s here). Use 16K or more, or OpenZFS "
        "2.2 or later, or raise the floor to 256 MiB or more "
        "('options zfs zfs_arc_min=%d' in /etc/modprobe.d/zfs.conf, then "
        "reboot) and retry" % (size >> 10, release, floor,
                               arc.FLOOR_NEEDED))


class SrConfig(object):
    """A checked device-config. ``source`` says where the SR lives:
    "pool" (zfs-ng creates a pool from ``vdev_args``), "zpool" or
    "dataset" (adopted: the SR is a child of ``parent``)."""

    def __init__(self):
        self.source = None
        self.devices = []        # leaf device paths, in order given
        self.vdev_args = []      # the vdev part of zpool create's argv
        self.parent = None       # adopted pool or dataset
        self.pool_name = None
        self.compression = "lz4"
        # None: not given, chosen at SR.create from the pool's layout
        # (default_volblocksize)
        self.volblocksize = None
        self.ashift = None
        self.provisioning = "thin"
        # tapdisk never passes a guest's flush on to the zvol: only
        # sync=always makes a write the guest saw complete survive a
        # power cut (ARCHITECTURE.md, "Why these defaults")
        self.sync = "always"
        # None: inherited from the pool (OpenZFS's latency, unless its
        # admin chose otherwise); ARCHITECTURE.md, "Why these defaults"
        self.logbias = None
        self.dedup = "off"
        self.force = False
        self.pool_guid = None
        self.sr_uuid = None

    def creates_parity(self):
        """Whether the pool this config creates has raidz data vdevs
        (parse_vdev allows raidz groups only among the data vdevs)."""
        return any(word in PARITY_WORDS for word in self.vdev_args)


def _no_option_like(key, value):
    if value.startswith("-") or re.search(r"\s-", value):
        raise InvalidConfiguration(
            "device-config:%s=%r: values may not contain options "
            "(nothing may start with '-')" % (key, value))


def _split_list(key, value):
    items = [v.strip() for v in value.split(",")]
    if not value.strip() or any(not v for v in items):
        raise InvalidConfiguration(
            "device-config:%s=%r: give one or more comma-separated devices"
            % (key, value))
    return items


def _devices_from_uri(value):
    devices = []
    for uri in _split_list("file-uri", value):
        if not uri.startswith("file://"):
            raise InvalidConfiguration(
                "device-config:file-uri: %r is not a file:// URI (example: "
                "file:///dev/sdb)" % uri)
        devices.append(uri[len("file://"):])
    return devices


def check_room(cfg):
    """For SR.create: every name zfs-ng will make in the SR fits ZFS's
    limit (namelimits.longest_name), for the pool-name or the adopted pool or
    dataset given; else refused now, before anything exists, not by a
    snapshot months later. (Not checked at attach: an SR made before
    this check must stay reachable.)"""
    if cfg.source != "pool":
        _with_room(namelimits.sample_sr_dataset(cfg.parent),
                   "device-config:%s" % cfg.source, cfg.parent)
    elif cfg.pool_name:
        _with_room(cfg.pool_name, "device-config:pool-name", cfg.pool_name)


def _with_room(sr, what, given):
    room = namelimits.room_for(sr)
    if room < 0:
        suffix = namelimits.longest_name(sr)[len(given):]
        raise InvalidConfiguration(
            "%s is too long by %d characters: zfs-ng makes names such as "
            "<%s>%s (%d characters more) in it, and ZFS allows %d in all; "
            "use a name of at most %d characters"
            % (what, -room, what, suffix, len(suffix), namelimits.MAX_NAME,
               len(given) + room))
    return sr


def parse_vdev(value):
    """Check a zpool layout; return (argv words, leaf devices).

    Plain devices are top-level vdevs of their own; a group word (mirror,
    raidzN) collects the devices after it; a class word (log, cache, ...)
    starts a section whose vdevs follow it. Every group and every section
    needs devices, data vdevs must not mix redundancy (zpool wants -f for
    that, and force=true means "overwrite old data", not "weaken the
    pool"), cache and spare take plain devices, log/special/dedup plain
    devices or mirrors.
    """
    words = value.split()
    groups, devices, current, section, sections = [], [], None, None, {}
    for word in words:
        if word in CLASS_WORDS:
            if not any(g[1] is None for g in groups):
                raise InvalidConfiguration(
                    "device-config:vdev: data devices must come before '%s'"
                    % word)
            section, current = word, None
            sections.setdefault(word, 0)
        elif word in GROUP_MIN_DEVICES:
            if section in ("cache", "spare") or \
                    (section and word != "mirror"):
                raise InvalidConfiguration(
                    "device-config:vdev: %s devices cannot be in a %s group"
                    % (section, word))
            current = [word, section, 0]
            groups.append(current)
        elif word.startswith("/"):
            names.check_device_path(word, "device-config:vdev device")
            devices.append(word)
            if current is None:
                groups.append(["device", section, 1])
            else:
                current[2] += 1
            if section:
                sections[section] += 1
        else:
            raise InvalidConfiguration(
                "device-config:vdev: %r is neither a device path (/dev/...) "
                "nor one of %s" % (word, ", ".join(
                    sorted(GROUP_MIN_DEVICES) + list(CLASS_WORDS))))
    for word, _, count in groups:
        need = GROUP_MIN_DEVICES.get(word, 1)
        if count < need:
            raise InvalidConfiguration(
                "device-config:vdev: '%s' needs at least %d device(s), got %d"
                % (word, need, count))
    for word, count in sorted(sections.items()):
        if not count:
            raise InvalidConfiguration(
                "device-config:vdev: '%s' needs at least 1 device" % word)
    kinds = set({"raidz": "raidz1"}.get(g[0], g[0]) for g in groups
                if g[1] is None)
    if len(kinds) > 1:
        raise InvalidConfiguration(
            "device-config:vdev: the data vdevs mix %s; a pool is only as "
            "redundant as its weakest vdev, use one kind"
            % " and ".join(sorted(kinds)))
    if not devices:
        raise InvalidConfiguration("device-config:vdev names no device")
    _check_unique(devices, "vdev")
    return words, devices


def _check_unique(devices, key):
    seen = set()
    for dev in devices:
        if dev in seen:
            raise InvalidConfiguration(
                "device-config:%s: device %s is named twice" % (key, dev))
        seen.add(dev)


def _parse_size(key, value):
    match = re.match(SIZE_RE, value)
    if not match:
        raise InvalidConfiguration(
            "device-config:%s=%r: give a size such as 16K or 16384"
            % (key, value))
    number = int(match.group(1))
    return number * {"": 1, "k": 1024, "m": 1024 ** 2}[match.group(2).lower()]


def _choice(key, value, choices):
    if value not in choices:
        raise InvalidConfiguration(
            "device-config:%s=%r: use one of %s" % (key, value,
                                                     ", ".join(choices)))
    return value


def _parse_options(cfg, config):
    if "compression" in config:
        if not re.match(COMPRESSION_RE, config["compression"]):
            raise InvalidConfiguration(
                "device-config:compression=%r: use off, lz4, zstd, "
                "zstd-1..19, gzip or gzip-1..9" % config["compression"])
        cfg.compression = config["compression"]
    if "volblocksize" in config:
        size = _parse_size("volblocksize", config["volblocksize"])
        if size < 4096 or size > 131072 or size & (size - 1):
            raise InvalidConfiguration(
                "device-config:volblocksize=%r: use a power of two from 4K "
                "to 128K" % config["volblocksize"])
        cfg.volblocksize = size
    if "ashift" in config:
        value = config["ashift"]
        if not re.match(ASHIFT_RE, value) or not 9 <= int(value) <= 16:
            raise InvalidConfiguration(
                "device-config:ashift=%r: use a number from 9 to 16 (12 for "
                "4K-sector disks)" % value)
        cfg.ashift = int(value)
    if "provisioning" in config:
        cfg.provisioning = _choice("provisioning", config["provisioning"],
                                   ("thin", "thick"))
    if "sync" in config:
        cfg.sync = _choice("sync", config["sync"],
                           ("standard", "always", "disabled"))
    if "logbias" in config:
        cfg.logbias = _choice("logbias", config["logbias"],
                              ("latency", "throughput"))
    if "dedup" in config:
        cfg.dedup = _choice("dedup", config["dedup"], ("off", "on", "verify"))
    if "force" in config:
        cfg.force = _choice("force", config["force"],
                            ("true", "false")) == "true"
    if "pool-name" in config:
        cfg.pool_name = names.check_pool_name(config["pool-name"],
                                              "device-config:pool-name")


def _parse_source(cfg, config, need_source):
    given = [k for k in SOURCE_KEYS if k in config]
    if len(given) > 1:
        raise InvalidConfiguration(
            "device-config: give only one of %s (got %s)"
            % (", ".join(SOURCE_KEYS), ", ".join(given)))
    if not given:
        if need_source:
            raise InvalidConfiguration(
                "device-config: say where the SR lives with one of %s"
                % ", ".join(SOURCE_KEYS))
        return
    key = given[0]
    value = config[key]
    if key in ("device", "file-uri"):
        devices = (_split_list(key, value) if key == "device"
                   else _devices_from_uri(value))
        for dev in devices:
            names.check_device_path(dev, "device-config:%s" % key)
        _check_unique(devices, key)
        cfg.source, cfg.devices, cfg.vdev_args = "pool", devices, devices
    elif key == "vdev":
        cfg.source = "pool"
        cfg.vdev_args, cfg.devices = parse_vdev(value)
    elif key == "zpool":
        cfg.source = "zpool"
        cfg.parent = names.check_pool_name(value, "device-config:zpool")
    else:
        cfg.source = "dataset"
        cfg.parent = names.check_dataset_name(value, "device-config:dataset")
    if cfg.source != "pool":
        misplaced = [k for k in POOL_OPTION_KEYS if k in config]
        if misplaced:
            raise InvalidConfiguration(
                "device-config: %s only apply when zfs-ng creates the pool "
                "(device, file-uri or vdev), not with %s"
                % (", ".join(misplaced), key))


def parse(config, need_source=True):
    """Check a device-config dict and return an SrConfig.

    Raises InvalidConfiguration naming the key and what to do. Nothing runs.
    """
    unknown = sorted(k for k in config if k not in KEYS)
    if unknown:
        raise InvalidConfiguration(
            "device-config: unknown key(s) %s; known keys: %s"
            % (", ".join(unknown), ", ".join(sorted(KEYS))))
    for key, value in config.items():
        _no_option_like(key, value)
    cfg = SrConfig()
    _parse_source(cfg, config, need_source)
    _parse_options(cfg, config)
    if "pool-guid" in config:
        if not re.match(GUID_RE, config["pool-guid"]):
            raise InvalidConfiguration("device-config:pool-guid must be a "
                                       "number, got %r" % config["pool-guid"])
        cfg.pool_guid = config["pool-guid"]
    if "sr_uuid" in config:
        cfg.sr_uuid = names.check_uuid(config["sr_uuid"],
                                       "device-config:sr_uuid",
                                       InvalidConfiguration)
    return cfg
