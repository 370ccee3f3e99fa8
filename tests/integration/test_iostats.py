"""I/O statistics on real OpenZFS, through the real tapdisk.

The guest has no xapi and no xcp-rrdd, so each side is checked against
what that daemon does, written here on its own:
- xcp-rrdd's iostat plugin (xen-api ocaml/xcp-rrdd/bin/rrdp-iostat) reads
  each ``tap-ctl list`` line as ``pid=%d minor=%d state=%s args=%s@:%s``
  (the kind up to the first ':', then the path; kinds aio, vhd and qcow2),
  reads every ``/dev/sm/phy/<sr>/<vdi>`` with one readlink, and names a
  tapdisk's SR and VDI by the link whose target is its path, as a string;
  its VM by the VBD's ``sm-data/vdi-uuid``, written from the XenDisk's
  ``extra``;
- xcp-rrdd reads ``/dev/shm/metrics/<uid>`` in protocol V2
  (tests/rrdv2.py, a reader written from the format).
"""

import os
import re
import signal
import subprocess
import time

import pytest

from conftest import ROOT, Plugin, sh
from datapath_util import GUEST, attach_dom0, detach_dom0, \
    new_vdi, once, uri
from xapi_flows import vdi_snapshot

import rrdv2

PHY = "/dev/sm/phy"
METRICS = "/dev/shm/metrics"
PERIOD = 2          # ZFSNG_METRICS_PERIOD of these tests' SR


# --- the iostat plugin's rule ------------------------------------------------

_LINE = re.compile(r"pid=(\d+) minor=(\d+) state=(\S+) args=([^:\s]*):(\S+)")


def tapdisk_paths():
    """(pid, minor) -> path, for every line the iostat plugin accepts."""
    found = {}
    for line in sh("tap-ctl", "list").splitlines():
        m = _LINE.match(line)
        if m and m.group(4) in ("aio", "vhd", "qcow2"):
            found[(int(m.group(1)), int(m.group(2)))] = m.group(5)
    return found


def phy_map():
    """link target -> (sr uuid, vdi uuid), one readlink per entry."""
    table = {}
    for sr in os.listdir(PHY) if os.path.isdir(PHY) else []:
        for vdi in os.listdir(os.path.join(PHY, sr)):
            table[os.readlink(os.path.join(PHY, sr, vdi))] = (sr, vdi)
    return table


def named(path):
    return phy_map().get(path)


def links_of(keys):
    return [v for v in phy_map().values() if v[1] in keys]


def guest_start(dp, plugin, sr, vol, persistent=True):
    """A VM start (open, attach, activate), each with a fresh Volume.stat
    first as xapi does; the attach's XenDisk extra and tapdisk's path."""
    def call(method, **args):
        fresh = plugin("Volume.stat", sr=sr, key=vol["key"])
        return dp(method, uri=uri(fresh), **args)
    call("Datapath.open", persistent=persistent)
    answer = call("Datapath.attach", domain=GUEST)
    call("Datapath.activate", domain=GUEST)
    (xendisk,) = [i[1] for i in answer["implementations"]
                  if i[0] == "XenDisk"]
    tapdev = int(xendisk["params"].rsplit("tapdev", 1)[1])
    (path,) = [p for (pid, minor), p in tapdisk_paths().items()
               if minor == tapdev]
    return xendisk["extra"], path


def guest_stop(dp, plugin, sr, vol):
    fresh = plugin("Volume.stat", sr=sr, key=vol["key"])
    for method, args in (("Datapath.deactivate", {"domain": GUEST}),
                         ("Datapath.detach", {"domain": GUEST}),
                         ("Datapath.close", {})):
        dp(method, uri=uri(fresh), **args)


def test_guest_and_dom0_disks_are_named_to_the_iostat_plugin(
        dp, plugin, sr):
    sr_uuid = plugin("SR.stat", sr=sr)["uuid"]
    vol, other = new_vdi(plugin, sr), new_vdi(plugin, sr)
    extra, path = guest_start(dp, plugin, sr, vol, persistent=False)
    assert extra == {"vdi-uuid": vol["key"]}
    assert named(path) == (sr_uuid, vol["key"])
    assert os.path.realpath(path) == os.path.realpath(
        "/dev/zvol/" + uri(vol)[len("zfs-ng:///"):])

    device = attach_dom0(dp, other, call=once)      # no tapdisk: its link
    assert named(device) == (sr_uuid, other["key"])  # names the zvol alone
    assert device not in tapdisk_paths().values()
    detach_dom0(dp, other, call=once)
    assert links_of([other["key"]]) == []

    # a backup's snapshot while the non-persistent VM runs: the reset at
    # shutdown rotates (another zvol under the disk's name), and the next
    # start's tapdisk is still named the VDI
    snap = vdi_snapshot(plugin, sr, vol["key"])
    guest_stop(dp, plugin, sr, vol)
    assert plugin("Volume.stat", sr=sr, key=snap["key"])["uri"] != [
        uri(vol) + "@" + snap["key"]]              # moved: it rotated
    extra, path = guest_start(dp, plugin, sr, vol, persistent=False)
    assert named(path) == (sr_uuid, vol["key"])
    guest_stop(dp, plugin, sr, vol)
    assert links_of([vol["key"], other["key"]]) == []


# --- the SR's own figures ----------------------------------------------------

@pytest.fixture(scope="module")
def fast_plugin():
    """The volume plugin, its SR statistics every PERIOD seconds."""
    return Plugin(ROOT, env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run",
                             "ZFSNG_METRICS_PERIOD": str(PERIOD)})


def read_metrics(path):
    """The file as xcp-rrdd reads it, a torn read retried (xcp-rrdd skips
    a cycle on a bad checksum)."""
    for _ in range(20):
        try:
            return rrdv2.read_file(path)
        except rrdv2.Invalid:
            time.sleep(0.1)
    return rrdv2.read_file(path)


def wait_for(check, what, limit=90.0):
    deadline = time.monotonic() + limit
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "no %s in %.0f s" % (what, limit)
        time.sleep(0.5)


def writers(sr_uuid):
    """The SR's writer processes; not a child of one caught between its
    fork and its exec (it still shows the writer's command line)."""
    found = set(int(p) for p in subprocess.run(
        ["pgrep", "-f", "zfsng_volume.srmetrics .*%s" % sr_uuid],
        stdout=subprocess.PIPE, timeout=60).stdout.decode().split())
    return sorted(p for p in found if _parent(p) not in found)


def _parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (IOError, OSError, IndexError, ValueError):
        return None


def fresh_sample(path, after, **wanted):
    """A sample newer than after whose values meet wanted's checks."""
    def check():
        got = read_metrics(path)
        values = dict((k, v["value"]) for k, v in got["sources"].items())
        return got if got["timestamp"] > after and all(
            test(values[k]) for k, test in wanted.items()) else None
    return check


def test_the_sr_figures_follow_the_attach_and_the_load(
        fast_plugin, dp, disks, new_uuid):
    sr_uuid = new_uuid()
    stored = fast_plugin("SR.create", uuid=sr_uuid, name="metrics",
                         description="", configuration={"device": disks[0]})
    attached_at = time.monotonic()
    sr = fast_plugin("SR.attach", configuration=stored)
    path = os.path.join(METRICS, "zfs-ng-" + sr_uuid)
    assert os.path.exists(path)          # before xapi would register it
    assert fast_plugin("SR.stat", sr=sr)["datasources"] == [
        "xeno+shm:///zfs-ng-" + sr_uuid]
    inode = os.stat(path).st_ino

    first = wait_for(fresh_sample(path, 0, zfs_health=lambda v: v == 0),
                     "first sample")
    size = int(sh("zpool", "list", "-Hp", "-o", "size", "metrics"))
    values = first["sources"]
    assert values["zfs_pool_size"]["value"] == size
    assert all(s["owner"] == ("sr", sr_uuid) for s in values.values())
    assert len(writers(sr_uuid)) == 1

    vol = new_vdi(fast_plugin, sr)
    device = attach_dom0(dp, vol, call=once)
    fio = subprocess.Popen(
        ["fio", "--name=load", "--filename=" + device, "--rw=randwrite",
         "--bs=64k", "--direct=1", "--ioengine=psync", "--size=48M",
         "--time_based", "--runtime=10", "--end_fsync=1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(fresh_sample(path, first["timestamp"],
                              zfs_write_iops=lambda v: v > 0,
                              zfs_write_throughput=lambda v: v > 0,
                              zfs_write_latency=lambda v: v > 0),
                 "sample of the fio load")
    finally:
        assert fio.wait(timeout=300) == 0, fio.stderr.read()
    assert os.stat(path).st_ino == inode         # rewritten in place
    detach_dom0(dp, vol, call=once)
    fast_plugin("Volume.destroy", sr=sr, key=vol["key"])

    # a writer killed: the next SR.stat starts another
    (killed,) = writers(sr_uuid)
    os.killpg(killed, signal.SIGKILL)
    wait_for(lambda: writers(sr_uuid) == [], "end of the killed writer")
    time.sleep(max(0.0, attached_at + 31 - time.monotonic()))

    def stat_then_writers():
        # as xapi's scans call SR.stat, again and again: the plugin's own
        # clock of the last spawn, not this test's, says when it may
        # start another (a slow SR.attach made one call come too early)
        fast_plugin("SR.stat", sr=sr)
        return writers(sr_uuid)
    (again,) = wait_for(stat_then_writers, "writer started again")
    assert again != killed
    last = read_metrics(path)["timestamp"]
    wait_for(fresh_sample(path, last), "sample of the new writer")

    fast_plugin("SR.detach", sr=sr)
    assert not os.path.exists(path)              # xcp-rrdd deregisters it
    wait_for(lambda: writers(sr_uuid) == [], "end of the writer", 10)
    sr = fast_plugin("SR.attach", configuration=stored)
    assert read_metrics(path)["sources"]
    assert len(writers(sr_uuid)) == 1
    fast_plugin("SR.destroy", sr=sr)
    assert not os.path.exists(path)
    wait_for(lambda: writers(sr_uuid) == [], "end of the writer", 10)
