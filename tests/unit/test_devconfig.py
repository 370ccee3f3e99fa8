"""zfsng_volume.devconfig: every device-config key, option, default and bad value.

Parsing is pure: nothing runs (the autouse fixture refuses any command).
Every refusal is InvalidConfiguration with a message naming the key, so an
admin reading ``xe sr-create``'s error knows which key to fix.
"""

import re

import pytest

from zfsng_volume import devconfig, plugin
from zfsng.errors import InvalidConfiguration

from conftest import SR_UUID

DEV = {"device": "/dev/sdb"}


def parse(config, need_source=True):
    return devconfig.parse(config, need_source)


def refused(config, need_source=True):
    with pytest.raises(InvalidConfiguration) as info:
        devconfig.parse(config, need_source)
    return info.value.message


# --- defaults and every key --------------------------------------------------

def test_defaults():
    cfg = parse(DEV)
    assert cfg.source == "pool"
    assert cfg.devices == ["/dev/sdb"]
    assert cfg.vdev_args == ["/dev/sdb"]
    assert cfg.parent is None
    assert cfg.pool_name is None
    assert cfg.compression == "lz4"
    assert cfg.volblocksize is None  # SR.create picks it by the layout
    assert cfg.ashift is None
    assert cfg.provisioning == "thin"
    assert cfg.sync == "always"     # tapdisk passes no flush on
    assert cfg.dedup == "off"
    assert cfg.force is False
    assert cfg.pool_guid is None
    assert cfg.sr_uuid is None


@pytest.mark.parametrize("vdev,parity", [
    ("/dev/sdb", False), ("/dev/sdb /dev/sdc", False),
    ("mirror /dev/sdb /dev/sdc log mirror /dev/sdd /dev/sde", False),
    ("raidz /dev/sdb /dev/sdc", True),
    ("raidz3 /dev/sdb /dev/sdc /dev/sdd /dev/sde cache /dev/sdf", True)])
def test_the_default_volblocksize_is_16k_on_raidz_8k_elsewhere(vdev,
                                                              parity):
    cfg = parse({"vdev": vdev})
    assert cfg.creates_parity() is parity
    assert devconfig.default_volblocksize(cfg.creates_parity(), (2, 3)) == \
        (16384 if parity else 8192)
    for old in ((2, 1), (0, 8), None):     # 2.1's ARC: 16K everywhere
        assert devconfig.default_volblocksize(cfg.creates_parity(),
                                              old) == 16384


def test_every_key_is_documented_for_xe_sm_list():
    assert plugin.query("x")["configuration"] == devconfig.KEYS
    for key, text in devconfig.KEYS.items():
        assert text.strip(), key
    assert set(devconfig.SOURCE_KEYS) <= set(devconfig.KEYS)


def test_every_pool_key_at_once():
    cfg = parse({"device": "/dev/sdb,/dev/sdc", "pool-name": "vmpool",
                 "compression": "zstd-3", "volblocksize": "64K",
                 "ashift": "12", "provisioning": "thick", "sync": "always",
                 "dedup": "verify", "force": "true",
                 "pool-guid": "12345678901234567890", "sr_uuid": SR_UUID})
    assert cfg.devices == ["/dev/sdb", "/dev/sdc"]
    assert cfg.pool_name == "vmpool"
    assert cfg.compression == "zstd-3"
    assert cfg.volblocksize == 65536
    assert cfg.ashift == 12
    assert cfg.provisioning == "thick"
    assert cfg.sync == "always"
    assert cfg.dedup == "verify"
    assert cfg.force is True
    assert cfg.pool_guid == "12345678901234567890"
    assert cfg.sr_uuid == SR_UUID


@pytest.mark.parametrize("key,value,devices", [
    ("device", "/dev/sdb", ["/dev/sdb"]),
    ("device", "/dev/sdb,/dev/sdc", ["/dev/sdb", "/dev/sdc"]),
    ("device", " /dev/sdb , /dev/sdc ", ["/dev/sdb", "/dev/sdc"]),
    ("device", "/dev/nvme0n1", ["/dev/nvme0n1"]),
    ("device", "/dev/disk/by-id/ata-ST4000DM004-2CV104_ZFN0ABCD",
     ["/dev/disk/by-id/ata-ST4000DM004-2CV104_ZFN0ABCD"]),
    ("device", "/dev/disk/by-path/pci-0000:00:1f.2-ata-1.0-part3",
     ["/dev/disk/by-path/pci-0000:00:1f.2-ata-1.0-part3"]),
    ("device", "/dev/mapper/mpatha", ["/dev/mapper/mpatha"]),
    ("file-uri", "file:///dev/sdb", ["/dev/sdb"]),
    ("file-uri", "file:///dev/sdb,file:///dev/sdc", ["/dev/sdb", "/dev/sdc"]),
    ("file-uri", "file:///dev/disk/by-id/wwn-0x5000c500a1b2c3d4",
     ["/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"]),
])
def test_device_list(key, value, devices):
    """device and file-uri: a comma-separated list of whole devices, each
    a vdev of its own."""
    cfg = parse({key: value})
    assert (cfg.source, cfg.devices, cfg.vdev_args) == ("pool", devices,
                                                        devices)


@pytest.mark.parametrize("value,devices", [
    ("/dev/sdb", ["/dev/sdb"]),
    ("/dev/sdb /dev/sdc", ["/dev/sdb", "/dev/sdc"]),
    ("mirror /dev/sdb /dev/sdc", ["/dev/sdb", "/dev/sdc"]),
    ("mirror /dev/sdb /dev/sdc /dev/sdd", ["/dev/sdb", "/dev/sdc",
                                           "/dev/sdd"]),
    ("mirror /dev/sdb /dev/sdc mirror /dev/sdd /dev/sde",
     ["/dev/sdb", "/dev/sdc", "/dev/sdd", "/dev/sde"]),
    ("raidz /dev/sdb /dev/sdc", ["/dev/sdb", "/dev/sdc"]),
    ("raidz1 /dev/sdb /dev/sdc /dev/sdd", ["/dev/sdb", "/dev/sdc",
                                           "/dev/sdd"]),
    ("raidz2 /dev/sdb /dev/sdc /dev/sdd", ["/dev/sdb", "/dev/sdc",
                                           "/dev/sdd"]),
    ("raidz3 /dev/sdb /dev/sdc /dev/sdd /dev/sde",
     ["/dev/sdb", "/dev/sdc", "/dev/sdd", "/dev/sde"]),
    ("mirror /dev/sdb /dev/sdc log /dev/nvme0n1",
     ["/dev/sdb", "/dev/sdc", "/dev/nvme0n1"]),
    ("mirror /dev/sdb /dev/sdc cache /dev/nvme0n1 /dev/nvme1n1",
     ["/dev/sdb", "/dev/sdc", "/dev/nvme0n1", "/dev/nvme1n1"]),
    ("raidz1 /dev/sdb /dev/sdc /dev/sdd spare /dev/sde",
     ["/dev/sdb", "/dev/sdc", "/dev/sdd", "/dev/sde"]),
    ("/dev/sdb special /dev/nvme0n1", ["/dev/sdb", "/dev/nvme0n1"]),
    ("/dev/sdb dedup /dev/nvme0n1", ["/dev/sdb", "/dev/nvme0n1"]),
    ("  mirror   /dev/sdb\t/dev/sdc  ", ["/dev/sdb", "/dev/sdc"]),
])
def test_vdev(value, devices):
    cfg = parse({"vdev": value})
    assert cfg.source == "pool"
    assert cfg.devices == devices
    assert cfg.vdev_args == value.split()


@pytest.mark.parametrize("value", [
    "mirror /dev/sdb /dev/sdc log mirror /dev/sdd /dev/sde",
    "mirror /dev/sdb /dev/sdc special mirror /dev/sdd /dev/sde",
    "/dev/sdb dedup mirror /dev/sdd /dev/sde",
])
def test_vdev_mirrored_class_section(value):
    cfg = parse({"vdev": value})
    assert cfg.vdev_args == value.split()
    assert len(cfg.devices) == 4 if value.startswith("mirror") else 3


def test_zpool_and_dataset_sources():
    cfg = parse({"zpool": "tank"})
    assert (cfg.source, cfg.parent, cfg.devices) == ("zpool", "tank", [])
    cfg = parse({"dataset": "tank/vms/sr1"})
    assert (cfg.source, cfg.parent) == ("dataset", "tank/vms/sr1")
    cfg = parse({"dataset": "tank"})
    assert (cfg.source, cfg.parent) == ("dataset", "tank")


def test_options_apply_to_adopted_storage_too():
    cfg = parse({"zpool": "tank", "compression": "off",
                 "volblocksize": "8K", "provisioning": "thick",
                 "sync": "disabled", "dedup": "on"})
    assert (cfg.compression, cfg.volblocksize, cfg.provisioning, cfg.sync,
            cfg.dedup) == ("off", 8192, "thick", "disabled", "on")


@pytest.mark.parametrize("value", [
    "off", "lz4", "zstd", "zstd-1", "zstd-9", "zstd-19", "gzip", "gzip-1",
    "gzip-9"])
def test_compression_values(value):
    assert parse(dict(DEV, compression=value)).compression == value


@pytest.mark.parametrize("value,size", [
    ("4K", 4096), ("4k", 4096), ("8K", 8192), ("16K", 16384),
    ("32k", 32768), ("64K", 65536), ("128K", 131072), ("4096", 4096),
    ("131072", 131072), ("16384", 16384),
])
def test_volblocksize_values(value, size):
    assert parse(dict(DEV, volblocksize=value)).volblocksize == size


@pytest.mark.parametrize("key,value,attr,expected", [
    ("ashift", "9", "ashift", 9), ("ashift", "12", "ashift", 12),
    ("ashift", "16", "ashift", 16),
    ("provisioning", "thin", "provisioning", "thin"),
    ("provisioning", "thick", "provisioning", "thick"),
    ("sync", "standard", "sync", "standard"),
    ("sync", "always", "sync", "always"),
    ("sync", "disabled", "sync", "disabled"),
    ("logbias", "latency", "logbias", "latency"),
    ("logbias", "throughput", "logbias", "throughput"),
    ("dedup", "off", "dedup", "off"), ("dedup", "on", "dedup", "on"),
    ("dedup", "verify", "dedup", "verify"),
    ("force", "true", "force", True), ("force", "false", "force", False),
    ("pool-name", "tank", "pool_name", "tank"),
    ("pool-name", "vm_pool-2.x:y", "pool_name", "vm_pool-2.x:y"),
])
def test_option_values(key, value, attr, expected):
    assert getattr(parse(dict(DEV, **{key: value})), attr) == expected


def test_attach_and_probe_need_no_source():
    cfg = parse({}, need_source=False)
    assert cfg.source is None and cfg.devices == []
    cfg = parse({"pool-guid": "42", "sr_uuid": SR_UUID}, need_source=False)
    assert (cfg.source, cfg.pool_guid, cfg.sr_uuid) == (None, "42", SR_UUID)


# --- bad values: each refused, naming its key --------------------------------

HOSTILE = ["-f", "--", "-", ";", "$(reboot)", "`id`", "a b", "x;id",
           "x|id", "x&&id", "x\nid", "", " "]

BAD = [({"device": v}, "device") for v in HOSTILE + [
    "sdb", "/tmp/disk.img", "/dev/../etc/passwd", "/dev/sdb,",
    ",/dev/sdb", "/dev/sdb/", "/dev//sdb", "/dev/sd`id`",
    "/dev/sdb /dev/sdc", "/dev/sdb, -f", "/dev/sdb,-f", "/dev/sdb;reboot",
    "/dev/$(reboot)", "/dev/",
    "/dev/sdb,/dev/sdc;id"]]
BAD += [({"file-uri": v}, "file-uri") for v in HOSTILE + [
    "/dev/sdb", "http://host/dev/sdb", "file://dev/sdb", "file:/dev/sdb",
    "file:///dev/sdb;id", "file:///tmp/x.img", "file:///dev/sdb,"]]
BAD += [({"vdev": v}, "vdev") for v in HOSTILE + [
    "mirror /dev/sdb", "log /dev/sdb", "raidz2 /dev/sdb /dev/sdc",
    "raidz3 /dev/sdb /dev/sdc /dev/sdd", "raidz1 /dev/sdb",
    "/dev/sdb cache mirror /dev/sdc /dev/sdd",
    "/dev/sdb spare mirror /dev/sdc /dev/sdd",
    "/dev/sdb spare raidz1 /dev/sdc /dev/sdd",
    "cache mirror /dev/sdc /dev/sdd", "cache /dev/sdb", "spare /dev/sdb",
    "special /dev/sdb", "mirror /dev/sdb -f /dev/sdc",
    "mirror /dev/sdb /dev/sdc; reboot", "mirror /dev/sdb /dev/sdc && id",
    "draid /dev/sdb /dev/sdc /dev/sdd", "mirror", "raidz", "/dev/sdb log",
    "/dev/sdb log cache /dev/sdc", "mirror mirror /dev/sdb /dev/sdc",
    "sdb sdc", "mirror sdb sdc", "/dev/sdb replacing /dev/sdc",
    "-o ashift=9 /dev/sdb", "/dev/sdb -o ashift=9"]]
BAD += [({"zpool": v}, "zpool") for v in HOSTILE + [
    "tank/x", "mirror", "mirror2", "raidz", "log", "spare", "c0t0d0", "c1",
    "1tank", "_tank", "tank@s", "tank/", "/tank", "x" * 201]]
BAD += [({"dataset": v}, "dataset") for v in HOSTILE + [
    "tank/a@snap", "tank//a", "tank/../x", "tank/./x", "tank/a b",
    "/tank/a", "tank/", "tank/$(id)", "tank/a;id", "mirror/a", "1tank/a",
    "tank/a#bm"]]
BAD += [(dict(DEV, compression=v), "compression") for v in HOSTILE + [
    "LZ4", "on", "zle", "lzjb", "zstd-0", "zstd-20", "zstd-fast",
    "gzip-0", "gzip-10", "lz4 ", " lz4"]]
BAD += [(dict(DEV, volblocksize=v), "volblocksize") for v in HOSTILE + [
    "0", "512", "2048", "2K", "3K", "12K", "256K", "1M", "16KB", "16 K",
    "0x4000", "-16K", "16384;id", "16G", "1.5K"]]
BAD += [(dict(DEV, ashift=v), "ashift") for v in HOSTILE + [
    "0", "8", "17", "twelve", "12.0", "-12", " 12", "12 ", "0x0c"]]
BAD += [(dict(DEV, provisioning=v), "provisioning") for v in HOSTILE + [
    "thik", "THIN", "Thick", "thin;id", "sparse"]]
BAD += [(dict(DEV, sync=v), "sync") for v in HOSTILE + [
    "on", "Always", "off", "standard "]]
BAD += [(dict(DEV, logbias=v), "logbias") for v in HOSTILE + [
    "Latency", "bandwidth", "throughput ", "on"]]
BAD += [(dict(DEV, dedup=v), "dedup") for v in HOSTILE + [
    "sha256", "yes", "ON", "verify,sha256"]]
BAD += [(dict(DEV, force=v), "force") for v in HOSTILE + [
    "yes", "1", "True", "TRUE", "on"]]
BAD += [(dict(DEV, **{"pool-name": v}), "pool-name") for v in HOSTILE + [
    "mirror", "log", "raidz2", "spare1", "c1", "c0t0d0", "1pool",
    "po ol", "pool/x", "pool@s", "x" * 201, "_pool"]]
BAD += [(dict(DEV, **{"pool-guid": v}), "pool-guid") for v in HOSTILE + [
    "abc", "12a", "0x12", "1 2", "1.5"]]
BAD += [(dict(DEV, sr_uuid=v), "sr_uuid") for v in HOSTILE + [
    "not-a-uuid", SR_UUID.upper(), SR_UUID + "0", SR_UUID[:-1],
    "{%s}" % SR_UUID]]
BAD += [
    (dict(DEV, foo="bar"), "foo"),
    (dict(DEV, SRmaster="true"), "SRmaster"),
    (dict(DEV, Device="/dev/sdc"), "Device"),
    ({"devices": "/dev/sdb"}, "devices"),
    ({"zpool": "tank", "pool-name": "other"}, "pool-name"),
    ({"zpool": "tank", "ashift": "12"}, "ashift"),
    ({"zpool": "tank", "force": "true"}, "force"),
    ({"dataset": "tank/a", "force": "false"}, "force"),
    ({"dataset": "tank/a", "pool-name": "x"}, "pool-name"),
]


def _key_named(message, key):
    """The key appears in the message as a word of its own."""
    return re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(key),
                     message) is not None


@pytest.mark.parametrize("config,key", BAD,
                         ids=["%s=%r" % (k, c.get(k)) for c, k in BAD])
def test_bad_value_is_refused_naming_the_key(config, key):
    message = refused(config)
    assert _key_named(message, key), message


def test_hostile_values_never_reach_the_config():
    for config, _ in BAD:
        with pytest.raises(InvalidConfiguration):
            parse(config)


@pytest.mark.parametrize("config", [
    {"device": "/dev/sdb", "zpool": "tank"},
    {"device": "/dev/sdb", "vdev": "mirror /dev/sdc /dev/sdd"},
    {"file-uri": "file:///dev/sdb", "device": "/dev/sdb"},
    {"zpool": "tank", "dataset": "tank/a"},
    {"device": "/dev/sdb", "file-uri": "file:///dev/sdc", "vdev": "/dev/sdd",
     "zpool": "tank", "dataset": "tank/a"},
])
def test_two_sources_are_refused(config):
    message = refused(config)
    for key in config:
        assert key in message, message


def test_no_source_is_refused_naming_the_keys():
    message = refused({})
    for key in devconfig.SOURCE_KEYS:
        assert key in message
    message = refused({"compression": "lz4"})
    assert "device" in message


def test_unknown_keys_are_all_named():
    message = refused(dict(DEV, foo="1", bar="2"))
    assert "bar, foo" in message
    assert "known keys" in message


@pytest.mark.parametrize("config,key", [
    ({"device": "/dev/sdb,/dev/sdb"}, "device"),
    ({"file-uri": "file:///dev/sdb,file:///dev/sdb"}, "file-uri"),
    ({"vdev": "mirror /dev/sdb /dev/sdb"}, "vdev"),
    ({"vdev": "mirror /dev/sdb /dev/sdc log /dev/sdb"}, "vdev"),
])
def test_device_named_twice_names_the_key(config, key):
    message = refused(config)
    assert "/dev/sdb" in message
    assert "device-config:%s" % key in message, message


@pytest.mark.parametrize("config", [
    {"device": "/dev/sdb,/dev/sdb"},
    {"vdev": "mirror /dev/sdb /dev/sdb"},
    {"vdev": "/dev/sdb cache /dev/sdb"},
])
def test_device_named_twice_is_refused(config):
    assert "/dev/sdb" in refused(config)


MIXED_REDUNDANCY = [
    "/dev/sdb mirror /dev/sdc /dev/sdd",
    "mirror /dev/sdb /dev/sdc raidz1 /dev/sdd /dev/sde /dev/sdf",
    "/dev/sdb raidz1 /dev/sdc /dev/sdd /dev/sde",
]
# Refused today, but only by the class-word bug above ("'log' needs at
# least 1 device(s), got 0"); the message must say what is wrong: raidz.
RAIDZ_CLASS_SECTION = [
    "mirror /dev/sdb /dev/sdc log raidz1 /dev/sdd /dev/sde /dev/sdf",
    "/dev/sdb special raidz1 /dev/sdc /dev/sdd /dev/sde",
    "/dev/sdb dedup raidz2 /dev/sdc /dev/sdd /dev/sde",
]


@pytest.mark.parametrize("value,said",
                         [(v, []) for v in MIXED_REDUNDANCY] +
                         [(v, ["raidz"]) for v in RAIDZ_CLASS_SECTION],
                         ids=MIXED_REDUNDANCY + RAIDZ_CLASS_SECTION)
def test_vdev_layout_is_refused_saying_why(value, said):
    message = refused({"vdev": value})
    assert "device-config:vdev" in message
    for text in said:
        assert text in message, message


@pytest.mark.parametrize("config,key", [
    ({"zpool": "tank\n"}, "zpool"),
    ({"dataset": "tank/vms\n"}, "dataset"),
    (dict(DEV, **{"pool-name": "tank\n"}), "pool-name"),
    (dict(DEV, compression="lz4\n"), "compression"),
    (dict(DEV, sr_uuid=SR_UUID + "\n"), "sr_uuid"),
])
def test_trailing_newline_is_refused(config, key):
    assert _key_named(refused(config), key)


# --- numbers are ASCII digits ------------------------------------------------
# str.isdigit() is true for "\u00b2" (superscript two) and other scripts'
# digits, and int() takes some of them; zfs takes neither.

NON_ASCII_DIGITS = [u"\u00b2", u"1\u00b2", u"\u0661\u0662", u"\uff11\uff12",
                    u"\U0001d7d9", u"\u0969"]


@pytest.mark.parametrize("value", NON_ASCII_DIGITS)
def test_ashift_takes_ascii_digits_only(value):
    assert "ashift" in refused(dict(DEV, ashift=value))


@pytest.mark.parametrize("value", NON_ASCII_DIGITS)
def test_pool_guid_takes_ascii_digits_only(value):
    assert "pool-guid" in refused({"pool-guid": value}, need_source=False)


@pytest.mark.parametrize("value", [u"\u00b2" + "K", u"\u0661\u0666K",
                                   "1" * 40 + "K"])
def test_volblocksize_takes_ascii_digits_only(value):
    assert "volblocksize" in refused(dict(DEV, volblocksize=value))
