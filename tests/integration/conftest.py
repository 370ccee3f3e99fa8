"""Fixtures for the real-ZFS tests, run inside the QEMU guest.

The guest has real OpenZFS and spare virtio disks /dev/disk/by-id/
virtio-zfsng-d1..dN (tests/guest/run.sh). Every test starts and ends with
those disks blank: tapdisks ended, pools on them destroyed and labels
wiped by the ``disks`` fixture, whatever the test did.
"""

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from plugin_client import Plugin, PluginError  # noqa: E402

ROOT = os.environ.get("ZFSNG_ROOT", "/tmp/zfsng-root")


def sh(*argv, **kwargs):
    """Run a command for the test itself (not the plugin); return stdout."""
    check = kwargs.pop("check", True)
    kwargs.setdefault("timeout", 600)   # a bound for every command
    proc = subprocess.run(list(argv), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError("%s failed: %s" % (" ".join(argv),
                                                proc.stderr.decode()))
    return proc.stdout.decode()


def all_disks():
    disks = sorted((p for p in glob.glob("/dev/disk/by-id/virtio-zfsng-d*")
                    if re.match(r".*-d[0-9]+$", p)),
                   key=lambda p: int(p.rsplit("d", 1)[1]))
    assert len(disks) >= 6, "the guest must have 6 spare disks: %s" % disks
    return disks


def leaves(pool):
    """Leaf device paths of a pool (-H rows: name, then statistics)."""
    rows = sh("zpool", "list", "-v", "-H", "-P", "-o", "name", pool)
    return [line.strip().split("\t")[0] for line in rows.splitlines()
            if line.strip().startswith("/")]


def pools_on(disks):
    """Names of imported pools using any of the given disks."""
    real = set(os.path.realpath(d) for d in disks)
    found = set()
    for pool in sh("zpool", "list", "-H", "-o", "name").split():
        for leaf in leaves(pool):
            path = os.path.realpath(leaf)
            if any(path.startswith(r) for r in real):
                found.add(pool)
    return found


def end_blktap():
    """Kill every tapdisk and free every minor: a test that failed midway
    may leave a tapdisk holding a zvol open, and then no pool under it
    could be destroyed."""
    if not shutil.which("tap-ctl"):
        return
    fields = sh("tap-ctl", "list", check=False).split()
    pids = [f[4:] for f in fields if f.startswith("pid=")]
    for pid in sorted(set(pids)):
        sh("kill", "-9", pid, check=False)
    if pids:
        time.sleep(0.5)     # the driver sees the ring's owner go
        fields = sh("tap-ctl", "list", check=False).split()
    for minor in sorted(set(f[6:] for f in fields if f.startswith("minor="))):
        sh("tap-ctl", "free", "-m", minor, check=False)


def wipe(disks):
    end_blktap()
    for pool in pools_on(disks):
        sh("zpool", "destroy", "-f", pool, check=False)
    for disk in disks:
        for part in glob.glob(os.path.realpath(disk) + "[0-9]*"):
            sh("zpool", "labelclear", "-f", part, check=False)
        sh("umount", disk, check=False)
        sh("wipefs", "-a", disk, check=False)
    sh("udevadm", "settle")


def disk_state(disks):
    """What a rejected call must not change: signatures and first MiB.

    A disk of an imported pool is compared by its pool membership instead:
    ZFS rewrites the uberblocks in its labels (first 512 KiB) every txg.
    """
    state = {}
    for disk in disks:
        pools = pools_on([disk])
        if pools:
            head = "pool %s" % ",".join(sorted(pools))
        else:
            with open(disk, "rb") as f:
                head = hashlib.sha256(f.read(1 << 20)).hexdigest()
        sigs = sh("blkid", "-p", "-o", "export", disk, check=False)
        state[disk] = (head, sigs)
    state["pools"] = sh("zpool", "list", "-H", "-o", "name,guid")
    state["datasets"] = sh("zfs", "list", "-H", "-t", "all", "-o", "name")
    return state


def _series():
    """"2.1" or "2.3": the OpenZFS this guest runs."""
    version = sh("zfs", "version").split()[0]      # zfs-2.1.11-1+deb12u1
    return ".".join(version.split("-")[1].split(".")[:2])


def plays(n):
    """Whether this run plays crash point n (1, 2, ...) of a sweep.

    A crash sweep kills a call after each of its commands in turn and is
    the slowest part of the suite under emulation. make check runs the
    suite on OpenZFS 2.1 and on 2.3: each plays half of every sweep (2.1
    the odd points, 2.3 the even ones), so together they still cover every
    point, in half the time (the unit tests kill every call after every
    command on the fake). ZFSNG_CRASH_POINTS=all plays them all."""
    if os.environ.get("ZFSNG_CRASH_POINTS") == "all":
        return True
    return n % 2 == (1 if _series() == "2.1" else 0)


def played(points):
    """The points of a sweep this run plays (see plays)."""
    return [p for i, p in enumerate(points, 1) if plays(i)]


@pytest.fixture(scope="session")
def plugin():
    return Plugin(ROOT, env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})


@pytest.fixture
def disks():
    found = all_disks()
    wipe(found)
    yield found
    wipe(found)


@pytest.fixture
def new_uuid():
    return lambda: str(uuid.uuid4())


DATAPATH_PLUGIN = "usr/libexec/xapi-storage-script/datapath/zfs-ng"


@pytest.fixture(scope="session")
def dp():
    """The installed datapath plugin."""
    return Plugin(ROOT, plugin_dir=DATAPATH_PLUGIN,
                  env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})


def one_disk_sr(plugin, disks, new_uuid, name):
    """A fixture's body: an SR (and pool) called name on the first spare
    disk, attached; its pool destroyed afterwards."""
    stored = plugin("SR.create", uuid=new_uuid(), name=name,
                    description="", configuration={"device": disks[0]})
    yield plugin("SR.attach", configuration=stored)
    sh("zpool", "destroy", "-f", name, check=False)


@pytest.fixture
def sr(plugin, disks, new_uuid):
    """An SR on the first spare disk, for the datapath tests (a module that
    wants its own SR defines its own sr fixture)."""
    yield from one_disk_sr(plugin, disks, new_uuid, "dpsr")


__all__ = ["PluginError", "sh", "disk_state", "pools_on", "leaves", "all_disks", "wipe",
           "plays", "played"]
