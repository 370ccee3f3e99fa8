"""Pool health on real OpenZFS: what SR.stat tells xapi, and the admin.

xapi fails every SR.scan of an SR that is not Healthy, so a pool that still
serves every block (a mirror missing a disk, a faulted log or cache device)
must stay Healthy and scannable, with the problem as the text, in the
plugin's log and in a XenAPI message sent once per change by a detached
``xe``. The guest has no xapi: a fake ``/opt/xensource/bin/xe`` records its
arguments and then hangs, so these tests also show that the call never
waits for it (not even for its stdout, as xapi-storage-script reads it).
"""

import json
import os
import subprocess
import time

import pytest

from conftest import arc_floor_at_least, leaves, sh

RUN_DIR = "/tmp/zfsng-run"      # the plugin fixture's ZFSNG_RUN_DIR
FAST = 15.0   # seconds: an SR.stat that waited for xe would take 30 (its
              # timeout), one that does not takes one or two under TCG


@pytest.fixture(autouse=True)
def _arc_floor_high_enough():
    """Only the pool's health is told here: on OpenZFS 2.1 SR.attach also
    warns of an ARC floor under 256 MiB (test_sr_lifecycle), which this
    floor silences."""
    with arc_floor_at_least(256 << 20):
        yield


def stat(plugin, sr):
    """SR.stat through the executable: (health, its stderr, seconds)."""
    start = time.monotonic()
    rc, out, err = plugin.raw("SR.stat", {"dbg": "health", "sr": sr})
    took = time.monotonic() - start
    assert rc == 0, (out, err)
    return json.loads(out)["health"], err, took


def make_sr(plugin, uuid, vdev, pool):
    stored = plugin("SR.create", uuid=uuid, name="h", description="",
                    configuration={"vdev": vdev, "pool-name": pool})
    return plugin("SR.attach", configuration=stored)


def alive(pid):
    return os.path.exists("/proc/%d" % pid)


def test_degraded_mirror_stays_healthy_and_tells_the_admin(
        plugin, disks, new_uuid, xe):
    uuid = new_uuid()
    sr = make_sr(plugin, uuid, "mirror %s %s" % (disks[0], disks[1]), "hm")
    vol = plugin("Volume.create", sr=sr, name="v", description="",
                 size=1 << 20, sharable=False)
    health, err, _ = stat(plugin, sr)
    assert health == ["Healthy", ""] and "warning" not in err
    assert xe(0, wait=1) == []

    leg = leaves("hm")[-1]
    sh("zpool", "offline", "hm", leg)
    health, err, took = stat(plugin, sr)
    assert health[0] == "Healthy"
    assert "hm is DEGRADED" in health[1] and leg in health[1]
    assert took < FAST, "SR.stat waited %.1fs: for xe?" % took
    assert "reported to xapi as Healthy" in err          # SMlog
    assert "ZFSNG_POOL_DEGRADED (priority 2) on SR %s" % uuid in err
    [sent] = xe(1)
    assert sent["name"] == "ZFSNG_POOL_DEGRADED"
    assert sent["priority"] == "2" and sent["sr-uuid"] == uuid
    assert leg in sent["body"]
    assert alive(xe.pids()[0])      # still hanging: the call did not wait
    with open(os.path.join(RUN_DIR, "health-hm.json")) as f:
        assert json.load(f)["state"] == "DEGRADED"

    # a scan as xapi's stat_with_retry does it: Healthy, so SR.ls
    assert [v["key"] for v in plugin("SR.ls", sr=sr)] == [vol["key"]]
    health, err, _ = stat(plugin, sr)            # no change: no message
    assert "XenAPI" not in err and len(xe(2, wait=2)) == 1
    text = plugin("Plugin.diagnostics")
    assert text.startswith("== pool health ==\npool hm is DEGRADED")
    assert leg in text.split("\n== ", 1)[0]

    sh("zpool", "online", "hm", leg)
    sh("zpool", "wait", "-t", "resilver", "hm")
    health, err, took = stat(plugin, sr)
    assert health == ["Healthy", ""] and took < FAST
    assert [m["name"] for m in xe(2)] == ["ZFSNG_POOL_DEGRADED",
                                          "ZFSNG_POOL_ONLINE"]
    assert xe(2)[1]["priority"] == "5"
    plugin("Volume.destroy", sr=sr, key=vol["key"])
    plugin("SR.destroy", sr=sr)


def test_faulted_cache_and_log_devices_lose_no_data(plugin, disks, new_uuid):
    vdev = "mirror %s %s log %s cache %s" % tuple(disks[:4])
    sr = make_sr(plugin, new_uuid(), vdev, "hcl")
    cache = [p for p in leaves("hcl") if p.startswith(disks[3])][0]
    log = [p for p in leaves("hcl") if p.startswith(disks[2])][0]

    sh("zpool", "offline", "-f", "hcl", cache)       # cache: pool ONLINE
    health, _, _ = stat(plugin, sr)
    assert health[0] == "Healthy"
    assert "hcl is ONLINE" in health[1] and cache in health[1], health
    plugin("SR.ls", sr=sr)

    sh("zpool", "offline", "-f", "hcl", log)         # log: pool DEGRADED
    health, _, _ = stat(plugin, sr)
    assert health[0] == "Healthy"
    assert "hcl is DEGRADED" in health[1] and log in health[1], health
    plugin("SR.ls", sr=sr)
    sh("zpool", "clear", "hcl")
    plugin("SR.destroy", sr=sr)


DM = "zfsng-dying"


@pytest.fixture
def dying_disk(disks):
    """/dev/mapper/zfsng-dying over the first disk, and fail(), heal():
    swap its table to the error target (every I/O fails) and back."""
    sectors = sh("blockdev", "--getsz", disks[0]).strip()
    linear = "0 %s linear %s 0" % (sectors, os.path.realpath(disks[0]))

    def load(table, check=True):
        sh("dmsetup", "suspend", DM, check=check, timeout=60)
        sh("dmsetup", "load", DM, "--table", table, check=check, timeout=60)
        sh("dmsetup", "resume", DM, check=check, timeout=60)
    sh("modprobe", "dm_mod")
    sh("dmsetup", "create", DM, "--table", linear)
    sh("udevadm", "settle")
    yield ("/dev/mapper/" + DM, lambda: load("0 %s error" % sectors),
           lambda: load(linear))
    load(linear, check=False)
    for pool in sh("zpool", "list", "-H", "-o", "name").split():
        sh("zpool", "clear", pool, check=False, timeout=120)
        sh("zpool", "destroy", "-f", pool, check=False, timeout=120)
    sh("dmsetup", "remove", "--retry", DM, check=False, timeout=60)


def test_a_suspended_pool_is_unavailable(plugin, dying_disk, new_uuid, xe):
    device, fail, heal = dying_disk
    sh("zpool", "create", "-f", "-o", "cachefile=none", "-m", "none",
       "dying", device)
    uuid = new_uuid()
    stored = plugin("SR.create", uuid=uuid, configuration={"zpool": "dying"},
                    name="dying", description="")
    sr = plugin("SR.attach", configuration=stored)
    vol = plugin("Volume.create", sr=sr, name="v", description="",
                 size=8 << 20, sharable=False)
    sh("udevadm", "settle")
    before, _, _ = stat(plugin, sr)
    assert before == ["Healthy", ""]
    answer = plugin("SR.stat", sr=sr)

    fail()
    # a write makes ZFS find the disk dead: the pool suspends
    writer = subprocess.Popen(
        ["dd", "if=/dev/urandom", "of=/dev/zvol/%s/%s" % (sr, vol["key"]),
         "bs=1M", "count=4", "oflag=direct", "conv=fsync", "status=none"],
        stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while sh("zpool", "list", "-H", "-o", "health", "dying",
             timeout=60).strip() != "SUSPENDED":
        assert time.monotonic() < deadline, "the pool did not suspend"
        time.sleep(1)
    listing = subprocess.run(["zfs", "list", sr], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=60)
    assert b"suspended" in listing.stderr     # no zfs command answers

    health, err, took = stat(plugin, sr)
    assert health[0] == "Unavailable"
    assert "dying is SUSPENDED" in health[1], health
    assert took < FAST
    now = plugin("SR.stat", sr=sr)
    assert (now["uuid"], now["name"], now["total_space"]) == \
        (answer["uuid"], answer["name"], answer["total_space"])
    [sent] = xe(1)
    assert (sent["name"], sent["priority"]) == ("ZFSNG_POOL_SUSPENDED", "1")
    assert sent["sr-uuid"] == uuid

    heal()
    sh("zpool", "clear", "dying", timeout=300)
    writer.wait(timeout=300)
    health, _, _ = stat(plugin, sr)
    assert health[0] == "Healthy", health
    assert len(xe(2)) == 2
