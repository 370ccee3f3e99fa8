"""Bounds on real ZFS: a disk that stops answering (a device-mapper device
suspended under the pool, so every I/O to it waits) must not hang the
plugin. Each call comes back with a typed error within its bound (lowered
here by the test hooks), no lock stays held, and once the disk answers
again every call works and nothing was lost.

The calls made while the disk hangs wait out their bound, then the
runner's KILL_GRACE for each command stuck in the kernel: those two set
most of the test's time, so they are lowered further for these calls
(STUCK_BOUND, STUCK_GRACE) than for the calls before and after, which
must succeed under emulation."""

import hashlib
import os
import time

import pytest

from conftest import ROOT, PluginError, sh
from plugin_client import Plugin

DM = "zfsng-stuck"
MiB = 1 << 20
BOUND = 10        # seconds: ZFSNG_CMD_TIMEOUT below
STUCK_BOUND = 3   # seconds: the same, for the calls while the disk hangs
STUCK_GRACE = 1   # seconds: their ZFSNG_KILL_GRACE (runner.KILL_GRACE)
SLACK = 60        # seconds a call may take beyond its bound under TCG


@pytest.fixture
def stuck_disk(disks):
    """/dev/mapper/zfsng-stuck: a linear map of the first disk."""
    sectors = sh("blockdev", "--getsz", disks[0]).strip()
    sh("modprobe", "dm_mod")
    sh("dmsetup", "create", DM, "--table",
       "0 %s linear %s 0" % (sectors, os.path.realpath(disks[0])))
    sh("udevadm", "settle")
    yield "/dev/mapper/" + DM
    sh("dmsetup", "resume", DM, check=False, timeout=60)
    for pool in sh("zpool", "list", "-H", "-o", "name").split():
        sh("zpool", "clear", pool, check=False, timeout=120)
        sh("zpool", "destroy", "-f", pool, check=False, timeout=120)
    sh("dmsetup", "remove", "--retry", DM, check=False, timeout=60)


def bounded_plugin(bound, **env):
    """The volume plugin, every command and lock wait bounded to bound
    seconds (env: more test hooks)."""
    return Plugin(ROOT, env=dict(env, ZFSNG_RUN_DIR="/tmp/zfsng-run",
                                 ZFSNG_CMD_TIMEOUT=str(bound),
                                 ZFSNG_LOCK_WAIT=str(bound)))


@pytest.fixture
def bounded():
    return bounded_plugin(BOUND)


def timed(plugin, method, **args):
    """(result or PluginError, seconds)."""
    start = time.monotonic()
    try:
        result = plugin(method, **args)
    except PluginError as exc:
        result = exc
    return result, time.monotonic() - start


def vdi_hash(sr, key):
    with open("/dev/zvol/%s/%s" % (sr, key), "rb") as f:
        return hashlib.sha256(f.read(4 * MiB)).hexdigest()


def test_a_disk_that_stops_answering(bounded, stuck_disk, new_uuid):
    """On an admin's pool without multihost (failmode=wait, the default)
    I/O to the stuck disk just waits, forever: only the bounds end the
    calls. (A pool zfs-ng creates has multihost on: ZFS suspends it after
    about 10 s of stalled writes, and calls fail at once with
    PoolSuspended; bringing such a pool back is the fault campaign's
    subject, not this test's.)"""
    sh("zpool", "create", "-o", "cachefile=none", "-m", "none",
       "stuckpool", stuck_disk)
    config = {"zpool": "stuckpool"}
    stored = bounded("SR.create", uuid=new_uuid(), configuration=config,
                     name="stuck", description="")
    sr = bounded("SR.attach", configuration=stored)
    vol = bounded("Volume.create", sr=sr, name="data", description="",
                  size=4 * MiB, sharable=False)
    sh("udevadm", "settle")
    with open("/dev/zvol/%s/%s" % (sr, vol["key"]), "r+b") as f:
        f.write(os.urandom(4 * MiB))
    sh("sync")
    before = vdi_hash(sr, vol["key"])

    sh("dmsetup", "suspend", DM, timeout=60)   # every I/O now waits
    stuck = bounded_plugin(STUCK_BOUND, ZFSNG_KILL_GRACE=str(STUCK_GRACE))
    outcomes = []
    for method, args in [
            ("Volume.snapshot", {"sr": sr, "key": vol["key"]}),
            ("Volume.set_name", {"sr": sr, "key": vol["key"],
                                 "new_name": "renamed"}),
            ("Volume.create", {"sr": sr, "name": "new", "description": "",
                               "size": MiB, "sharable": False}),
            ("SR.stat", {"sr": sr}),
            ("SR.ls", {"sr": sr})]:
        result, seconds = timed(stuck, method, **args)
        outcomes.append((method, getattr(result, "name", "ok"), seconds,
                         getattr(result, "params", None)))
        assert seconds < STUCK_BOUND + SLACK, outcomes
    print("while the disk hangs:", outcomes)
    # a call that needs the disk to change something cannot succeed: it
    # waits out its bound
    assert outcomes[0][1] == "CommandTimeout", outcomes
    # the others fail typed, in time; a read may be answered from memory
    assert all(name in ("ok", "CommandTimeout", "SrBusy")
               for _, name, _, _ in outcomes), outcomes

    sh("dmsetup", "resume", DM, timeout=60)
    deadline = time.monotonic() + 300
    while True:
        result, _ = timed(bounded, "SR.stat", sr=sr)
        if not isinstance(result, PluginError):
            break
        assert time.monotonic() < deadline, result
        time.sleep(1)
    assert result["health"][0] == "Healthy"
    listed = dict((v["key"], v) for v in bounded("SR.ls", sr=sr))
    assert vol["key"] in listed
    assert vdi_hash(sr, vol["key"]) == before
    # no lock left held, nothing half-done: every call works again
    snap = bounded("Volume.snapshot", sr=sr, key=vol["key"])
    bounded("Volume.destroy", sr=sr, key=snap["key"])
    for key in listed:
        bounded("Volume.destroy", sr=sr, key=key)
    assert bounded("SR.ls", sr=sr) == []
    bounded("SR.destroy", sr=sr)
