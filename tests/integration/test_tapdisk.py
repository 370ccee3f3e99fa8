"""A guest's disk through XCP-ng's real tapdisk, driven by the installed
datapath plugin the way xapi drives it.

This guest has blktap v3.55.5 (tap-ctl, tapdisk) and the blktap2 driver
(tests/guest/blktap-image.sh), but no Xen: the tapdev
(/dev/xen/blktap-2/tapdev<N>) a guest's blkback would serve stands for the
guest's disk, and I/O on it goes through tapdisk to the zvol exactly as a
guest's would. Data is written and read with O_DIRECT and compared by
sha256 against the zvol itself, both ways.

xapi's sequences (xapi-storage-script main.ml): a VM start is
Datapath.open (epoch_begin), attach, activate; a shutdown deactivate,
detach, close. After a failure xapi repeats a call, so every call here is
made twice in a row unless the test is about something else.
"""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import PluginError, sh
from datapath_util import GUEST, SIZE, STATE_DIR, dataset, dd_hash, \
    dd_write, new_vdi, pattern, sha, states, uri, zfs_names
from xapi_flows import domain_of

OTHER_GUEST = domain_of("vbd/7/xvdb", "7")


@pytest.fixture
def vdi(plugin, sr):
    return new_vdi(plugin, sr)


def tap_list():
    """``tap-ctl list`` as dicts (pid and minor as ints)."""
    rows = []
    for line in sh("tap-ctl", "list").splitlines():
        row = dict(f.split("=", 1) for f in line.split(" ", 3) if "=" in f)
        for key in ("pid", "minor"):
            if key in row:
                row[key] = int(row[key])
        rows.append(row)
    return rows


def tapdisk_pids():
    found = subprocess.run(["pgrep", "-x", "tapdisk"], stdout=subprocess.PIPE,
                           timeout=60).stdout.decode().split()
    return sorted(int(p) for p in found)


# The kernel's own warnings and oopses (WARN(): "WARNING: CPU: 0 PID: 12
# at ..."; "BUG: kernel NULL pointer dereference"; "Oops: 0000 [#1]"), not
# messages that merely say WARNING, as ZFS's of a pool that other tests
# suspend on purpose ("WARNING: Pool 'dying' has encountered ...").
_KERNEL_COMPLAINT = re.compile(r"\] (WARNING: CPU: \d+ PID:|BUG: |Oops: |"
                               r"general protection fault)")


def kernel_complaints():
    """The kernel's warnings and oopses since boot: blktap's driver
    corrupting itself shows there first (a WARNING from the timer softirq
    long before the panic)."""
    return [line for line in sh("dmesg").splitlines()
            if _KERNEL_COMPLAINT.search(line)]


def nothing_left(sr_name):
    """No tapdisk, no minor, no state file, no datapath clone, and the
    kernel has not complained."""
    assert tap_list() == []
    assert tapdisk_pids() == []
    assert states() == []
    assert not [n for n in zfs_names(sr_name) if n.endswith(".ro")]
    assert kernel_complaints() == []


class Xapi(object):
    """xapi-storage-script's datapath calls for one VDI (main.ml): each one
    a Volume.stat of the VDI first, whose URI it then sends; each made
    twice in a row (as xapi repeats a call after a failure), the second
    answering the same, unless ``repeat=False``."""

    def __init__(self, dp, plugin, sr, vol, repeat=True):
        self.dp, self.plugin, self.sr, self.vol = dp, plugin, sr, vol
        self.repeat = repeat

    def __call__(self, method, **args):
        answers = []
        for _ in range(2 if self.repeat else 1):
            fresh = self.plugin("Volume.stat", sr=self.sr,
                                key=self.vol["key"])
            answers.append(self.dp(method, uri=uri(fresh), **args))
        assert answers[0] == answers[-1], (method, answers)
        return answers[0]

    def start(self, domain=GUEST, readonly=False, persistent=True):
        """A VM start: epoch_begin (open), attach, activate; returns the
        tapdev and the device tapdisk opened (the zvol, or its clone)."""
        self("Datapath.open", persistent=persistent)
        result = self("Datapath.attach", domain=domain)
        xendisk, block, nbd = result["implementations"]
        assert xendisk[0] == "XenDisk" and block[0] == "BlockDevice"
        assert xendisk[1]["backend_type"] == "vbd3"
        # xenopsd's params: the BlockDevice's path, tapdisk's device
        assert block[1]["path"] == xendisk[1]["params"]
        self("Datapath.activate_readonly" if readonly else
             "Datapath.activate", domain=domain)
        row = vbd_of(xendisk[1]["params"])
        assert nbd[0] == "Nbd" and nbd[1]["uri"].startswith(
            "nbd:unix:/var/run/blktap-control/nbd%d.%d:exportname=" % (
                row["pid"], row["minor"]))
        assert row["args"].startswith("aio:")     # raw
        return xendisk[1]["params"], row["args"][len("aio:"):]

    def stop(self, domain=GUEST):
        """A VM shutdown: deactivate, detach, epoch_end (close)."""
        self("Datapath.deactivate", domain=domain)
        self("Datapath.detach", domain=domain)
        self("Datapath.close")


@pytest.fixture
def xapi(dp, plugin, sr, vdi):
    return Xapi(dp, plugin, sr, vdi)


def vbd_of(tapdev):
    minor = int(tapdev.rsplit("tapdev", 1)[1])
    [row] = [r for r in tap_list() if r.get("minor") == minor]
    return row


def zvol(vol):
    return "/dev/zvol/" + dataset(vol)


def test_a_guest_reads_and_writes_the_zvol_through_tapdisk(xapi, sr, vdi):
    tapdev, block = xapi.start()
    row = vbd_of(tapdev)
    assert os.path.realpath(block) == os.path.realpath(zvol(vdi))
    assert tapdisk_pids() == [row["pid"]]
    one, two = pattern(1), pattern(2)
    assert dd_write(tapdev, one) == (0, "")
    assert dd_hash(zvol(vdi)) == sha(one)       # the guest's write is there
    assert dd_write(zvol(vdi), two) == (0, "")
    assert dd_hash(tapdev) == sha(two)          # and the reverse
    with open(tapdev, "rb") as f:
        assert f.seek(0, os.SEEK_END) == SIZE   # the guest sees its size
    xapi.stop()
    nothing_left(sr)
    assert dd_hash(zvol(vdi)) == sha(two)
    xapi.repeat = False
    tapdev, _ = xapi.start()                    # the VM's next boot
    assert len(tap_list()) == 1 and len(tapdisk_pids()) == 1
    assert dd_hash(tapdev) == sha(two)
    xapi.stop()
    nothing_left(sr)


def test_a_snapshot_vdi_is_served_read_only_from_its_clone(xapi, dp, plugin,
                                                           sr, vdi):
    one, two = pattern(3), pattern(4)
    tapdev, _ = xapi.start()
    assert dd_write(tapdev, one) == (0, "")
    snap = plugin("Volume.snapshot", sr=sr, key=vdi["key"])
    assert dd_write(tapdev, two) == (0, "")
    # the snapshot to another VM, while the VDI stays in use
    other = Xapi(dp, plugin, sr, snap)
    snap_dev, snap_block = other.start(domain=OTHER_GUEST)
    assert snap_block.endswith(".ro")
    assert len(tapdisk_pids()) == 2             # one tapdisk per VBD
    assert dd_hash(snap_dev) == sha(one)        # its point in time
    assert dd_hash(tapdev) == sha(two)
    assert dd_write(snap_dev, two)[0] != 0      # tapdisk opened it -R
    assert dd_hash(snap_dev) == sha(one)
    other.stop(domain=OTHER_GUEST)
    assert [n for n in zfs_names(sr) if n.endswith(".ro")] == []
    xapi.stop()
    nothing_left(sr)


def test_activate_readonly_opens_the_vdi_read_only(xapi, sr, vdi):
    one = pattern(5)
    assert dd_write(zvol(vdi), one) == (0, "")
    tapdev, _ = xapi.start(readonly=True)
    assert dd_hash(tapdev) == sha(one)
    assert dd_write(tapdev, pattern(6))[0] != 0
    assert dd_hash(zvol(vdi)) == sha(one)
    xapi.stop()
    nothing_left(sr)


def test_a_non_persistent_disk_through_tapdisk_is_reset_at_close(xapi, sr,
                                                                 vdi):
    one, two = pattern(7), pattern(8)
    assert dd_write(zvol(vdi), one) == (0, "")
    for boot in range(2):                       # two boots of the VM
        tapdev, _ = xapi.start(persistent=False)
        assert dd_hash(tapdev) == sha(one)      # each boot starts clean
        assert dd_write(tapdev, two) == (0, "")
        assert dd_hash(tapdev) == sha(two)
        xapi.stop()
        assert dd_hash(zvol(vdi)) == sha(one), boot
    nothing_left(sr)


def _kill(pid):
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid in tapdisk_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid not in tapdisk_pids()


def test_a_tapdisk_killed_under_a_running_vm_is_replaced(xapi, sr, vdi):
    one, two = pattern(9), pattern(10)
    tapdev, _ = xapi.start()
    assert dd_write(tapdev, one) == (0, "")
    old = vbd_of(tapdev)["pid"]
    _kill(old)
    # xapi's next activate (a VBD replug) gets a new tapdisk on the same
    # minor: the guest's device path does not change
    xapi("Datapath.activate", domain=GUEST)
    row = vbd_of(tapdev)
    assert row["pid"] != old and tapdisk_pids() == [row["pid"]]
    assert dd_hash(tapdev) == sha(one)
    assert dd_write(tapdev, two) == (0, "")
    assert dd_hash(zvol(vdi)) == sha(two)
    xapi.stop()
    nothing_left(sr)


def test_a_clone_of_a_disk_whose_tapdisk_died_gets_a_fresh_content_id(
        xapi, plugin, sr, vdi):
    """The VM's disk is activated read-write but nothing holds its zvol
    open at the clone (its tapdisk died, not replaced yet): the VM writes
    on after the next activate (test above), so the clone, which keeps
    the data of now, must not share the id the disk reports (xapi's
    copies pick a base by it: zfsng/contentid.py)."""
    xapi.repeat = False
    tapdev, _ = xapi.start()
    assert dd_write(tapdev, pattern(15)) == (0, "")
    _kill(vbd_of(tapdev)["pid"])
    [name] = states()
    with open(os.path.join(STATE_DIR, name)) as f:
        record = json.load(f)
    assert (record["active"], record["readonly"]) == (True, False)
    clone = plugin("Volume.clone", sr=sr, key=vdi["key"])
    source = plugin("Volume.stat", sr=sr, key=vdi["key"])
    assert clone["keys"]["content_id"] not in (
        source["keys"]["content_id"], "")
    xapi.stop()
    nothing_left(sr)
    plugin("Volume.destroy", sr=sr, key=clone["key"])


def test_a_tapdisk_killed_while_the_vm_holds_its_disk(xapi, sr, vdi):
    one, two = pattern(13), pattern(14)
    tapdev, _ = xapi.start()
    assert dd_write(tapdev, one) == (0, "")
    # blkback keeps a running VM's tapdev open: the dead tapdisk's device
    # stays until the VBD is unplugged, and no new tapdisk can take it
    with open(tapdev, "rb") as disk:
        holder = subprocess.Popen(["sleep", "600"], stdin=disk)
    try:
        _kill(vbd_of(tapdev)["pid"])
        with pytest.raises(PluginError) as err:
            xapi("Datapath.activate", domain=GUEST)
        assert err.value.name == "TapdevHeld", err.value
        assert tapdisk_pids() == []
    finally:
        holder.kill()
        holder.wait(timeout=60)
    # the VBD unplugged: the driver destroys the old device (a retry every
    # 5 s), which activate waits for, and a new tapdisk serves the zvol
    xapi("Datapath.activate", domain=GUEST)
    assert tapdisk_pids() == [vbd_of(tapdev)["pid"]]
    assert dd_hash(tapdev) == sha(one)
    assert dd_write(tapdev, two) == (0, "")
    assert dd_hash(zvol(vdi)) == sha(two)
    xapi.stop()
    nothing_left(sr)


@pytest.mark.parametrize("active", [True, False])
def test_a_vm_whose_tapdisk_died_shuts_down_cleanly(xapi, sr, vdi, active):
    xapi("Datapath.open", persistent=True)
    result = xapi("Datapath.attach", domain=GUEST)
    tapdev = result["implementations"][0][1]["params"]
    if active:
        xapi("Datapath.activate", domain=GUEST)
    _kill(vbd_of(tapdev)["pid"])
    xapi.stop()                 # the minor it held is freed
    nothing_left(sr)


def test_destroy_of_a_vdi_in_use_by_a_vm_is_refused(xapi, plugin, sr, vdi):
    tapdev, _ = xapi.start()
    # xapi never asks this; if something does, the zvol tapdisk holds
    # open stays, and so does the guest's disk
    with pytest.raises(PluginError) as err:
        plugin("Volume.destroy", sr=sr, key=vdi["key"])
    assert err.value.name == "DatasetBusy"
    assert dd_write(tapdev, pattern(12)) == (0, "")
    assert dd_hash(zvol(vdi)) == sha(pattern(12))
    xapi.stop()
    nothing_left(sr)
    plugin("Volume.destroy", sr=sr, key=vdi["key"])
    assert dataset(vdi) not in zfs_names(sr)
