"""The SR lifecycle on real OpenZFS, through the installed executables.

Each test plays the calls xapi makes (SR.create, then SR.attach and SR.stat
with the configuration SR.create returned, ...) and checks the pool with the
zfs/zpool tools themselves.
"""

import json
import os
import subprocess
import time

import pytest

from conftest import (PluginError, all_disks, arc_floor, arc_floor_at_least,
                      default_volblocksize, disk_state, leaves, pools_on,
                      played, sh, traced_points, wipe)

GiB = 1 << 30


def zfs_get(dataset, *props):
    out = sh("zfs", "get", "-Hp", "-o", "value", ",".join(props), dataset)
    return out.split("\n")[:len(props)]


def create_sr(plugin, uuid, config, name="zfsng-test", description="d"):
    stored = plugin("SR.create", uuid=uuid, configuration=config, name=name,
                    description=description)
    assert stored["sr_uuid"] == uuid
    assert stored["pool-guid"].isdigit()
    for key, value in config.items():
        assert stored[key] == value  # the user's keys are kept as given
    return stored


def attach(plugin, stored):
    """SR.attach; the plugin client follows it with the SR.stat xapi always
    makes of the answer, so no second stat here."""
    return plugin("SR.attach", configuration=stored)


def assert_blank(disks):
    for disk in disks:
        assert sh("blkid", "-p", "-o", "export", disk, check=False) == "", \
            "%s still carries a signature" % disk
    assert not pools_on(disks)


def assert_reusable(disks):
    """The disks take a new pool without -f, then are blank again."""
    sh("zpool", "create", "-o", "cachefile=none", "reuse", *disks)
    sh("zpool", "destroy", "reuse")


def full_cycle(plugin, uuid, stored, disks, block=None):
    """attach, VDI, detach, probe, re-attach, VDI still there, destroy.
    block: the default volblocksize of the layout (16K on raidz)."""
    block = block or default_volblocksize()
    sr = attach(plugin, stored)
    vol = plugin("Volume.create", sr=sr, name="disk one", description="first",
                 size=100 * 1024 * 1024 + 1, sharable=False)
    assert vol["virtual_size"] % block == 0
    assert vol["virtual_size"] >= 100 * 1024 * 1024 + 1
    zvol = "%s/%s" % (sr, vol["key"])
    assert zfs_get(zvol, "volsize") == [str(vol["virtual_size"])]
    assert zfs_get(zvol, "volblocksize", "volmode", "compression") == \
        [str(block), "dev", "lz4"]

    rc, out, _ = plugin.raw("SR.detach", {"dbg": "t", "sr": sr})
    assert (rc, out) == (0, "null\n")  # unit is null, never empty
    assert plugin("SR.detach", sr=sr) is None  # repeated: not an error
    found = plugin("SR.probe", configuration={
        k: v for k, v in stored.items() if k in ("device", "file-uri",
                                                 "vdev")})
    mine = [r for r in found if r["configuration"].get("sr_uuid") == uuid]
    assert len(mine) == 1, found
    assert mine[0]["complete"] is True
    assert mine[0]["sr"]["uuid"] == uuid
    assert mine[0]["configuration"]["pool-guid"] == stored["pool-guid"]
    # probing left the pool exported, as it found it
    assert stored["pool-guid"] not in sh("zpool", "list", "-H", "-o", "guid")

    sr = attach(plugin, mine[0]["configuration"])
    sr_again = attach(plugin, stored)  # repeated attach: same answer
    assert sr_again == sr
    vols = plugin("SR.ls", sr=sr)
    assert [(v["key"], v["name"], v["description"]) for v in vols] == \
        [(vol["key"], "disk one", "first")]
    assert os.path.exists("/dev/zvol/" + zvol)

    with pytest.raises(PluginError) as err:
        plugin("SR.destroy", sr=sr)
    assert err.value.code == "SR_NOT_EMPTY"
    plugin("Volume.destroy", sr=sr, key=vol["key"])
    plugin("Volume.destroy", sr=sr, key=vol["key"])  # xapi repeats it
    plugin("SR.destroy", sr=sr)
    plugin("SR.destroy", sr=sr)
    assert_blank(disks)
    assert_reusable(disks)


def test_device_sr_full_cycle(plugin, disks, new_uuid):
    uuid = new_uuid()
    stored = create_sr(plugin, uuid, {"device": disks[0]}, name="zfsng")
    assert sh("zpool", "list", "-H", "-o", "name").split() == ["zfsng"]
    assert zfs_get("zfsng", "org.xcp-ng.zfs-ng:sr-uuid") == [uuid]
    assert zfs_get("zfsng", "mountpoint") == ["none"]
    assert sh("zpool", "get", "-H", "-o", "value", "cachefile",
              "zfsng").strip() in ("none", "-")
    full_cycle(plugin, uuid, stored, disks[:1])


def test_file_uri_stripe(plugin, disks, new_uuid):
    uuid = new_uuid()
    config = {"file-uri": "file://%s,file://%s" % (disks[0], disks[1])}
    stored = create_sr(plugin, uuid, config, name="not a pool name")
    pool = "zfsng-" + uuid[:8]
    assert pool in sh("zpool", "list", "-H", "-o", "name").split()
    full_cycle(plugin, uuid, stored, disks[:2])


def test_mirror_health_follows_pool(plugin, disks, new_uuid):
    uuid = new_uuid()
    config = {"vdev": "mirror %s %s" % (disks[0], disks[1]),
              "pool-name": "mir", "compression": "zstd",
              "volblocksize": "64K", "ashift": "12", "sync": "always"}
    stored = create_sr(plugin, uuid, config)
    sr = attach(plugin, stored)
    assert sr == "mir"
    assert zfs_get("mir", "compression", "sync") == ["zstd", "always"]
    assert sh("zpool", "get", "-Hp", "-o", "value", "ashift",
              "mir").strip() == "12"
    vol = plugin("Volume.create", sr=sr, name="v", description="",
                 size=1000, sharable=False)
    assert vol["virtual_size"] == 64 * 1024
    assert plugin("SR.stat", sr=sr)["health"] == ["Healthy", ""]

    leg = leaves("mir")[-1]
    sh("zpool", "offline", "mir", leg)
    health = plugin("SR.stat", sr=sr)["health"]
    assert health[0] == "Healthy"   # still serves every block: scannable
    assert "DEGRADED" in health[1] and leg in health[1], health
    sh("zpool", "online", "mir", leg)
    sh("zpool", "wait", "-t", "resilver", "mir")
    assert plugin("SR.stat", sr=sr)["health"] == ["Healthy", ""]
    plugin("Volume.destroy", sr=sr, key=vol["key"])
    plugin("SR.destroy", sr=sr)
    assert_blank(disks[:2])


def test_8k_blocks_on_2_1_wait_for_an_arc_floor_of_256m(plugin, disks,
                                                         new_uuid):
    """OpenZFS 2.1 can stop small-block zvols' reads for good once the ARC
    shrinks to its floor: SR.create refuses 8K there, making nothing,
    until zfs_arc_min lifts the floor to 256 MiB; 2.3 takes it."""
    config = {"device": disks[0], "volblocksize": "8K"}
    if default_volblocksize() == 8192:       # OpenZFS 2.2 or later
        stored = create_sr(plugin, new_uuid(), config)
    else:
        floor = arc_floor()
        assert floor < 256 << 20, "the guest's ARC floor is %d" % floor
        with pytest.raises(PluginError) as info:
            create_sr(plugin, new_uuid(), config)
        assert info.value.name == "InvalidConfiguration", info.value.params
        assert "zfs_arc_min" in info.value.params[1]
        assert_blank(disks[:1])
        with arc_floor_at_least(256 << 20):
            stored = create_sr(plugin, new_uuid(), config)
    full_cycle(plugin, stored["sr_uuid"], stored, disks[:1], block=8192)


def test_attach_on_2_1_warns_of_an_arc_floor_under_256m(plugin, disks,
                                                        new_uuid, xe):
    """OpenZFS 2.1 can stop zvols' reads for good once the ARC shrinks to
    a floor under 256 MiB: every SR.attach says so in SMlog, and a XenAPI
    message goes to the SR once per boot; nothing is refused. Raised to
    256 MiB (or on 2.3) the floor is not mentioned."""
    uuid = new_uuid()
    stored = create_sr(plugin, uuid, {"device": disks[0],
                                      "pool-name": "arcw"})
    rc, out, err = plugin.raw("SR.attach", {"dbg": "arc",
                                            "configuration": stored})
    assert rc == 0, (out, err)
    sr = json.loads(out)
    if default_volblocksize() == 8192:       # OpenZFS 2.2 or later
        assert "ARC's floor" not in err
        assert xe(1, wait=3) == []
    else:
        floor = arc_floor()
        assert floor < 256 << 20, "the guest's ARC floor is %d" % floor
        assert "warning:" in err and \
            "with the ARC's floor at %d MiB" % (floor >> 20) in err
        [sent] = xe(1)
        assert (sent["name"], sent["priority"], sent["sr-uuid"]) == \
            ("ZFSNG_ARC_FLOOR_LOW", "3", uuid)
        assert "zfs_arc_min=268435456" in sent["body"]
        plugin("SR.detach", sr=sr)           # a PBD unplug and plug
        rc, out, err = plugin.raw("SR.attach", {"dbg": "arc",
                                                "configuration": stored})
        assert rc == 0 and "ARC's floor at" in err        # SMlog again
        assert len(xe(2, wait=3)) == 1                    # no new message
        plugin("SR.detach", sr=sr)
        with arc_floor_at_least(256 << 20):
            rc, out, err = plugin.raw("SR.attach", {
                "dbg": "arc", "configuration": stored})
            assert rc == 0 and "ARC's floor" not in err
    plugin("SR.destroy", sr=sr)
    assert_blank(disks[:1])


def test_raidz1_cycle(plugin, disks, new_uuid):
    uuid = new_uuid()
    stored = create_sr(plugin, uuid,
                       {"vdev": "raidz1 %s %s %s" % tuple(disks[:3])})
    status = sh("zpool", "status", "zfsng-test")
    assert "raidz1-0" in status
    full_cycle(plugin, uuid, stored, disks[:3], block=16384)


def test_stat_matches_zfs(plugin, disks, new_uuid):
    stored = create_sr(plugin, new_uuid(), {"device": disks[0]},
                       name="space")
    sr = attach(plugin, stored)
    plugin("Volume.create", sr=sr, name="v", description="",
           size=64 * 1024 * 1024, sharable=False)
    sh("dd", "if=/dev/urandom", "of=/dev/zvol/space/" +
       plugin("SR.ls", sr=sr)[0]["key"], "bs=1M", "count=16", "oflag=direct")
    sh("zpool", "sync", "space")
    stat = plugin("SR.stat", sr=sr)
    used, avail = [int(v) for v in zfs_get("space", "used", "available")]
    assert abs(stat["free_space"] - avail) <= 0.01 * avail
    assert abs(stat["total_space"] - (used + avail)) <= \
        0.01 * (used + avail)
    assert stat["name"] == "space" and stat["description"] == "d"


def test_thick_provisioning_reserves(plugin, disks, new_uuid):
    stored = create_sr(plugin, new_uuid(), {"device": disks[0],
                                            "provisioning": "thick"},
                       name="thick")
    sr = attach(plugin, stored)
    vol = plugin("Volume.create", sr=sr, name="v", description="",
                 size=128 * 1024 * 1024, sharable=True)
    refres = int(zfs_get("thick/" + vol["key"], "refreservation")[0])
    assert refres >= 128 * 1024 * 1024
    assert vol["physical_utilisation"] >= 128 * 1024 * 1024
    assert vol["sharable"] is True


def test_adopted_pool_is_never_exported_or_destroyed(plugin, disks,
                                                     new_uuid):
    sh("zpool", "create", "-o", "cachefile=none", "-m", "none", "tank",
       disks[3])
    sh("zfs", "create", "-V", "8M", "tank/admins-own")
    uuid = new_uuid()
    stored = create_sr(plugin, uuid, {"zpool": "tank"})
    sr = attach(plugin, stored)
    assert sr == "tank/zfsng-" + uuid
    vol = plugin("Volume.create", sr=sr, name="v", description="",
                 size=1 << 20, sharable=False)
    assert zfs_get("%s/%s" % (sr, vol["key"]), "volblocksize") == \
        [str(default_volblocksize())]
    assert [v["key"] for v in plugin("SR.ls", sr=sr)] == [vol["key"]]
    plugin("SR.detach", sr=sr)
    assert "tank" in sh("zpool", "list", "-H", "-o", "name").split()
    sr = attach(plugin, stored)
    assert plugin("SR.ls", sr=sr)[0]["name"] == "v"
    plugin("Volume.destroy", sr=sr, key=vol["key"])
    plugin("SR.destroy", sr=sr)
    left = sh("zfs", "list", "-H", "-o", "name", "-r", "tank").split()
    assert left == ["tank", "tank/admins-own"]


def test_adopted_dataset(plugin, disks, new_uuid):
    """On an adopted raidz pool the default volblocksize is raidz's."""
    sh("zpool", "create", "-o", "cachefile=none", "tank", "raidz1",
       *disks[1:4])
    sh("zfs", "create", "-o", "mountpoint=none", "tank/vms")
    uuid = new_uuid()
    stored = create_sr(plugin, uuid, {"dataset": "tank/vms",
                                      "compression": "off"})
    sr = attach(plugin, stored)
    assert sr == "tank/vms/zfsng-" + uuid
    assert zfs_get(sr, "compression") == ["off"]
    vol = plugin("Volume.create", sr=sr, name="v", description="",
                 size=1 << 20, sharable=False)
    assert zfs_get("%s/%s" % (sr, vol["key"]), "volblocksize") == ["16384"]
    plugin("Volume.destroy", sr=sr, key=vol["key"])
    found = plugin("SR.probe", configuration={"zpool": "tank"})
    assert [r["configuration"]["sr_uuid"] for r in found] == [uuid]
    plugin("SR.destroy", sr=sr)
    assert sh("zfs", "list", "-H", "-o", "name", "-r", "tank").split() == \
        ["tank", "tank/vms"]


def test_repeated_create_is_idempotent(plugin, disks, new_uuid):
    uuid = new_uuid()
    first = create_sr(plugin, uuid, {"device": disks[0]}, name="once")
    again = create_sr(plugin, uuid, {"device": disks[0]}, name="once")
    assert first == again
    assert sh("zpool", "list", "-H", "-o", "name").split() == ["once"]


def test_set_name_and_description_persist(plugin, disks, new_uuid):
    stored = create_sr(plugin, new_uuid(), {"device": disks[0]}, name="nm")
    sr = attach(plugin, stored)
    plugin("SR.set_name", sr=sr, new_name="caf\u00e9\tVM store\nB")
    plugin("SR.set_description", sr=sr, new_description="")
    plugin("SR.detach", sr=sr)
    sr = attach(plugin, stored)
    stat = plugin("SR.stat", sr=sr)
    assert stat["name"] == "caf\u00e9\tVM store\nB"
    assert stat["description"] == ""


def test_diagnostics_report(plugin, disks, new_uuid):
    stored = create_sr(plugin, new_uuid(), {"device": disks[0]}, name="dg")
    attach(plugin, stored)
    text = plugin("Plugin.diagnostics")
    assert "zpool status dg" in text and "ONLINE" in text
    assert "org.xcp-ng.zfs-ng:volblocksize: %d" % default_volblocksize() \
        in text


@pytest.mark.parametrize("config,error", [
    ({"device": "/dev/disk/by-id/virtio-does-not-exist"}, "DeviceNotFound"),
    ({"device": "-f"}, "InvalidConfiguration"),
    ({"device": "{d0} --"}, "InvalidConfiguration"),
    ({"device": "{d0};reboot"}, "InvalidConfiguration"),
    ({"device": "$(reboot)"}, "InvalidConfiguration"),
    ({"vdev": "mirror {d0} -f {d1}"}, "InvalidConfiguration"),
    ({"vdev": "mirror {d0}"}, "InvalidConfiguration"),
    ({"device": "{d0}", "colour": "blue"}, "InvalidConfiguration"),
    ({"device": "{d0}", "compression": "lz5"}, "InvalidConfiguration"),
    ({"device": "{d0}", "volblocksize": "3K"}, "InvalidConfiguration"),
    ({"device": "{d0}", "ashift": "20"}, "InvalidConfiguration"),
    ({"device": "{d0}", "ashift": u"\u00b2"}, "InvalidConfiguration"),
    ({"device": "{d0}", "provisioning": "fat"}, "InvalidConfiguration"),
    ({"device": "{d0}", "pool-name": "mirror"}, "InvalidConfiguration"),
    ({"zpool": "nosuchpool"}, "PoolNotFound"),
    ({"device": "{d5}"}, "DeviceInUse"),          # in pool 'busy'
    ({"device": "{d4}"}, "DeviceInUse"),          # mounted
    ({"device": "{d2}"}, "DeviceHasData"),        # old ext4, no force
])
def test_bad_config_changes_nothing(plugin, dirty_disks, new_uuid, config,
                                    error):
    names = dict(("d%d" % i, d) for i, d in enumerate(dirty_disks))
    config = dict((k, v.format(**names)) for k, v in config.items())
    before = disk_state(dirty_disks)
    with pytest.raises(PluginError) as err:
        plugin("SR.create", uuid=new_uuid(), configuration=config,
               name="bad", description="")
    assert err.value.code == "SR_BACKEND_FAILURE"
    assert err.value.name == error, err.value.params
    assert len(err.value.params[1]) > 10  # a sentence, not a code
    assert disk_state(dirty_disks) == before


@pytest.fixture(scope="module")
def dirty_disks():
    """Disks an admin might wrongly name: d5 in pool 'busy', d4 mounted
    (read-only, so the kernel writes nothing to it), d2 an old ext4."""
    disks = all_disks()
    wipe(disks)
    sh("zpool", "create", "-o", "cachefile=none", "busy", disks[5])
    for disk in (disks[4], disks[2]):
        sh("mkfs.ext4", "-q", "-F", "-E",
           "lazy_itable_init=0,lazy_journal_init=0", disk)
    sh("mkdir", "-p", "/mnt/d4")
    sh("mount", "-o", "ro", disks[4], "/mnt/d4")
    yield disks
    sh("umount", "/mnt/d4", check=False)
    wipe(disks)


def test_force_reuses_old_filesystem(plugin, disks, new_uuid):
    sh("mkfs.ext4", "-q", "-F", disks[2])
    stored = create_sr(plugin, new_uuid(), {"device": disks[2],
                                            "force": "true"}, name="forced")
    sr = attach(plugin, stored)
    assert plugin("SR.stat", sr=sr)["health"] == ["Healthy", ""]


# --- SR.destroy: only the pool's own disks, only zfs-ng's data -----------------

PLAN_DIR = "/var/lib/zfs-ng/destroy"


def first_mib(disk):
    with open(disk, "rb") as f:
        return f.read(1 << 20)


def zfs_member(device):
    """The pool guid blkid reads in device's ZFS label, or None."""
    out = sh("blkid", "-p", "-o", "export", device, check=False)
    found = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
    return found.get("UUID") if found.get("TYPE") == "zfs_member" else None


def test_destroy_spares_a_disk_replaced_out_of_the_pool(plugin, disks,
                                                        new_uuid):
    """Disks given by kernel name are recorded by-id. The admin replaces
    one (zpool replace) and reuses it for a filesystem: SR.destroy blanks
    the disk still given to zfs-ng, clears the ZFS label of the one the
    admin added, and leaves the replaced one's filesystem alone."""
    d0, d1, d2 = disks[:3]
    kernel = [os.path.realpath(d) for d in (d0, d1)]
    stored = create_sr(plugin, new_uuid(),
                       {"vdev": "mirror %s %s" % tuple(kernel)}, name="rep")
    assert json.loads(zfs_get("rep", "org.xcp-ng.zfs-ng:devices")[0]) == \
        [d0, d1]
    assert leaves("rep") == [d0 + "-part1", d1 + "-part1"]
    sr = attach(plugin, stored)
    sh("zpool", "replace", "rep", d1 + "-part1", d2)
    sh("zpool", "wait", "-t", "replace", "rep")   # d1 resilvered out
    assert leaves("rep") == [d0 + "-part1", d2 + "-part1"]
    # the admin reuses d1 (ZFS closes it a moment after the replace: a
    # busy wipefs is tried again)
    for _ in range(60):
        if subprocess.call(["wipefs", "-a", d1 + "-part1"]) == 0:
            break
        time.sleep(0.5)
    sh("wipefs", "-a", d1)
    sh("udevadm", "settle")
    sh("mkfs.ext4", "-q", "-F", d1)
    before = first_mib(d1)

    plugin("SR.destroy", sr=sr)
    assert first_mib(d1) == before
    assert "TYPE=ext4" in sh("blkid", "-p", "-o", "export", d1)
    assert_blank([d0])
    sh("udevadm", "settle")
    assert zfs_member(d2 + "-part1") is None       # not a pool member
    assert "PTTYPE=gpt" in sh("blkid", "-p", "-o", "export", d2)
    assert not os.path.exists(os.path.join(
        PLAN_DIR, stored["pool-guid"] + ".json"))


def test_destroy_refuses_data_zfsng_did_not_make(plugin, disks, new_uuid):
    stored = create_sr(plugin, new_uuid(), {"device": disks[0]}, name="own")
    sr = attach(plugin, stored)
    sh("zfs", "create", "own/backups")
    sh("zfs", "snapshot", "own@before")
    with pytest.raises(PluginError) as err:
        plugin("SR.destroy", sr=sr)
    assert err.value.name == "SrHoldsOtherData"
    assert "own/backups" in err.value.params[1]
    assert "own@before" in err.value.params[1]
    assert sorted(sh("zfs", "list", "-H", "-t", "all", "-o", "name", "-r",
                     "own").split()) == ["own", "own/backups", "own@before"]
    sh("zfs", "destroy", "own/backups")
    sh("zfs", "destroy", "own@before")
    plugin("SR.destroy", sr=sr)
    assert_blank(disks[:1])


def test_destroy_killed_anywhere_is_finished_by_the_retry(plugin, disks,
                                                         new_uuid, tmp_path):
    """Kill SR.destroy after each of its commands that changes something
    (and the one before zpool destroy; this run's share of them,
    conftest.plays); xapi then detaches the SR and, on
    the admin's retry, attaches it (with the SR.stat xapi's daemon makes
    of the answer) and destroys what attach answered: the
    disks end up blank every time, with no plan left. (The unit tests kill
    it after every single command, on the fake.)"""
    config = {"vdev": "mirror %s %s" % (disks[0], disks[1])}
    sr = attach(plugin, create_sr(plugin, new_uuid(), config, name="kd"))
    points, argvs = traced_points(plugin, "SR.destroy", tmp_path, sr=sr)
    destroy_at = [a[:2] for a in argvs].index(["zpool", "destroy"]) + 1
    assert points[:2] == [destroy_at - 1, destroy_at]
    assert_blank(disks[:2])
    for n in played(points):
        stored = create_sr(plugin, new_uuid(), config, name="kd")
        sr = attach(plugin, stored)
        crashing = plugin.__class__(plugin.root, env=dict(
            plugin.env, ZFSNG_CRASH_AFTER=str(n)))
        rc, out, _ = crashing.raw("SR.destroy", {"dbg": "crash", "sr": sr})
        assert rc == 137, (n, rc, out)
        plugin("SR.detach", sr=sr)
        again = plugin("SR.attach", configuration=stored)   # and SR.stat
        if n >= destroy_at:
            assert again == "kd#destroying-" + stored["pool-guid"], n
            # an unplug (sr-forget's first step) works and keeps the plan
            plugin("SR.detach", sr=again)
            again = plugin("SR.attach", configuration=stored)
        plugin("SR.destroy", sr=again)
        assert_blank(disks[:2])
        assert not os.path.exists(os.path.join(
            PLAN_DIR, stored["pool-guid"] + ".json")), n


def test_create_killed_anywhere_is_usable_by_a_new_uuid(plugin, disks,
                                                       new_uuid, tmp_path):
    """Kill SR.create before and after zpool create (this run's share of
    those points, conftest.plays); xapi forgets the SR and the admin's
    retry comes with a new uuid on the same disk: it succeeds, and the SR
    works. (The unit tests kill it after every single command, on the
    fake.)"""
    config = {"device": disks[0]}
    points, argvs = traced_points(plugin, "SR.create", tmp_path,
                                  uuid=new_uuid(), configuration=config,
                                  name="kc", description="")
    assert [argvs[n - 1][:2] for n in points[1:]] == [["zpool", "create"]]
    # the traced create's pool, never attached, is taken over by the next
    # create (whose path, shorter, no crash point may fall beyond); then
    # each round starts and ends with the disk blank
    first = create_sr(plugin, new_uuid(), config, name="kc")
    plugin("SR.destroy", sr=attach(plugin, first))
    assert_blank(disks[:1])
    for n in played(points):
        crashing = plugin.__class__(plugin.root, env=dict(
            plugin.env, ZFSNG_CRASH_AFTER=str(n)))
        rc, out, _ = crashing.raw("SR.create", {
            "dbg": "crash", "uuid": new_uuid(), "configuration": config,
            "name": "kc", "description": ""})
        assert rc == 137, (n, rc, out)
        uuid = new_uuid()
        stored = create_sr(plugin, uuid, config, name="kc")
        assert zfs_get("kc", "org.xcp-ng.zfs-ng:unclaimed") != ["-"]
        sr = attach(plugin, stored)
        assert plugin("SR.stat", sr=sr)["uuid"] == uuid
        # attached once: never taken over again
        assert zfs_get(sr, "org.xcp-ng.zfs-ng:unclaimed") == ["-"]
        vol = plugin("Volume.create", sr=sr, name="v", description="",
                     size=1 << 20, sharable=False)
        plugin("Volume.destroy", sr=sr, key=vol["key"])
        plugin("SR.destroy", sr=sr)
        assert_blank(disks[:1])


# --- names, probe, stacked devices -------------------------------------------

def test_two_srs_named_alike_both_attach(plugin, disks, new_uuid):
    first_uuid, second_uuid = new_uuid(), new_uuid()
    first = create_sr(plugin, first_uuid, {"device": disks[0]}, name="twin")
    plugin("SR.detach", sr=attach(plugin, first))
    second = create_sr(plugin, second_uuid, {"device": disks[1]},
                       name="twin")
    assert attach(plugin, second) == "twin"
    renamed = attach(plugin, first)
    assert renamed == "zfsng-" + first_uuid[:8]
    assert plugin("SR.stat", sr=renamed)["uuid"] == first_uuid
    assert plugin("SR.stat", sr="twin")["uuid"] == second_uuid
    vol = plugin("Volume.create", sr=renamed, name="v", description="",
                 size=1 << 20, sharable=False)
    plugin("SR.detach", sr=renamed)
    # probe reads it while "twin" is imported, and leaves its name as is
    [found] = [r for r in plugin("SR.probe",
                                 configuration={"device": disks[0]})
               if r["configuration"].get("sr_uuid") == first_uuid]
    assert found["configuration"]["pool-guid"] == first["pool-guid"]
    assert attach(plugin, found["configuration"]) == renamed
    plugin("Volume.destroy", sr=renamed, key=vol["key"])
    plugin("SR.destroy", sr=renamed)
    plugin("SR.destroy", sr="twin")
    assert_blank(disks[:2])


def test_probe_of_a_missing_device_reports_no_sr(plugin, disks, new_uuid):
    stored = create_sr(plugin, new_uuid(), {"device": disks[0]}, name="pm")
    plugin("SR.detach", sr=attach(plugin, stored))
    with pytest.raises(PluginError) as err:
        plugin("SR.probe", configuration={
            "device": "/dev/disk/by-id/virtio-zfsng-nothing"})
    assert err.value.name == "DeviceNotFound"
    assert stored["pool-guid"] not in sh("zpool", "list", "-H", "-o",
                                         "guid")


def test_a_device_mapper_device_is_not_held_by_itself(plugin, disks,
                                                      new_uuid):
    """A dm device (as multipath or dm-crypt give) is lsblk's type "dm"
    for its own row: it is the disk, not a holder of it."""
    disk = os.path.realpath(disks[3])
    sectors = sh("blockdev", "--getsz", disk).strip()
    sh("dmsetup", "create", "zfsnglin", "--table",
       "0 %s linear %s 0" % (sectors, disk))
    try:
        sh("udevadm", "settle")
        stored = create_sr(plugin, new_uuid(),
                           {"device": "/dev/mapper/zfsnglin"}, name="dmsr")
        sr = attach(plugin, stored)
        assert leaves("dmsr") == ["/dev/mapper/zfsnglin"]
        plugin("SR.destroy", sr=sr)
        assert zfs_member("/dev/mapper/zfsnglin") is None
    finally:
        sh("zpool", "destroy", "dmsr", check=False)
        sh("dmsetup", "remove", "zfsnglin", check=False)
