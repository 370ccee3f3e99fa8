"""A running VM's disk moves from a SMAPIv1 SR into zfs-ng, through the
real tapdisk on both sides, in xapi's order (xen-api v26.1.4):

- destination, receive_start_common (storage_smapiv1_migrate.ml):
  Volume.create of the leaf, Volume.snapshot of it (the dummy),
  Datapath.attach and activate of the leaf in the mirror's pseudo-domain
  ("MIR" and six hex digits), Volume.create of the parent;
- nbd_handler (storage_migrate.ml): Datapath.import_activate of the leaf,
  and the connection's fd passed to the socket it answers (SCM_RIGHTS,
  the datapath's name as the message); mirror_pass_fds passes the other
  end to the source tapdisk's ``nbdclient<pid>`` the same way;
- the source's snapshot with the mirror (SMAPIv1's VDI.snapshot with
  sm_config mirror: tap-ctl pause, the snapshot, unpause with
  ``-2 nbd:<name>``): from then on every write of the guest goes to both;
- the copy of that snapshot into the parent (sparse_dd: the blocks that
  are not zeros), here through the parent's dom0 attach;
- the VM stops writing (its memory moves), the source's tapdisk closes;
  receive_finalize: Datapath.deactivate and detach of the leaf,
  Volume.compose(sr, key=leaf, key2=parent), Volume.destroy of the dummy
  (whose error xapi ignores), VDI.remove_from_sm_config of the leaf's
  base_mirror (Volume.unset of ``_sm_config_base_mirror``). xapi runs
  it inside log_and_ignore_exn and starts the VM on the leaf whatever
  it did: a leaf attached before its compose is refused
  (ComposePending), so a compose that failed never starts a VM on a
  partial disk.

The source stands for SMAPIv1's local ext SR: a raw file opened by
tapdisk (aio:, O_DIRECT) on ext4, here on a zvol beside the SR. The guest writes 4 KiB at sector
boundaries (smaller than the leaf's blocks), data or zeros, all the
time. The migrated VDI must then hold what the source holds, byte for
byte. And xapi's receive_cancel, at any step of the receive, must leave
nothing of the migration on the destination.
"""

import array
import hashlib
import json
import mmap
import os
import random
import socket
import threading
import time

import pytest

from conftest import one_disk_sr, sh
from plugin_client import PluginError
from datapath_util import attach_dom0, detach_dom0, once, write_direct
from test_tapdisk import nothing_left

KiB, MiB = 1 << 10, 1 << 20
DISK = 8 * MiB
MIRROR_VM = "MIR4d5e6f"
VM_AFTER = "9"                 # the VM's domain on this, the destination
DP = "mirror-dp-1"


@pytest.fixture
def sr(plugin, disks, new_uuid):
    yield from one_disk_sr(plugin, disks, new_uuid, "v1migsr")


class Source(object):
    """A SMAPIv1 VDI on a file SR: a raw file opened by its own tapdisk,
    as SMAPIv1's blktap2.py does it (spawn, allocate, attach, open)."""

    def __init__(self, sr, seed):
        self.dev = sr + "/v1sr"
        sh("zfs", "create", "-V", str(4 * DISK), self.dev)
        sh("udevadm", "settle")
        sh("mkfs.ext4", "-q", "/dev/zvol/" + self.dev)
        os.makedirs("/mnt/v1sr", exist_ok=True)
        sh("mount", "/dev/zvol/" + self.dev, "/mnt/v1sr")
        self.path = "/mnt/v1sr/disk.raw"
        with open(self.path, "wb") as f:
            f.write(self.initial(seed))
        self.pid = int(sh("tap-ctl", "spawn").strip())
        self.tapdev = sh("tap-ctl", "allocate").strip()
        self.minor = int(self.tapdev.rsplit("tapdev", 1)[1])
        sh("tap-ctl", "attach", "-p", str(self.pid), "-m", str(self.minor))
        sh("tap-ctl", "open", "-p", str(self.pid), "-m", str(self.minor),
           "-a", "aio:" + self.path)

    @staticmethod
    def initial(seed):
        """The disk's content before the guest writes: random bytes, and
        a region of zeros."""
        data = bytearray(random.Random(seed).getrandbits(8 * DISK).to_bytes(
            DISK, "little"))
        data[5 * MiB:6 * MiB] = bytes(MiB)
        return bytes(data)

    def tap(self, *args):
        sh("tap-ctl", args[0], "-p", str(self.pid), "-m", str(self.minor),
           *args[1:])

    def close(self):
        """SMAPIv1's detach: tap-ctl destroy (close, detach, free). A
        tapdisk that took an NBD client's fd stays up idle: ended as
        blktap2.py's TapCtl.shutdown would."""
        sh("tap-ctl", "destroy", "-p", str(self.pid), "-m", str(self.minor))
        for sig in (0, 15, 9):
            if sig:
                os.kill(self.pid, sig)
            for _ in range(50):
                if not os.path.exists("/proc/%d" % self.pid):
                    return
                time.sleep(0.1)

    def remove(self):
        sh("umount", "/mnt/v1sr")
        sh("zfs", "destroy", self.dev)

    def digest(self):
        with open(self.path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()


class Guest(threading.Thread):
    """The VM: writes of size bytes (4 KiB unless told) at sector
    boundaries through the source's tapdev (O_DIRECT), random data or,
    one in four, zeros; pause seconds between two; each one kept in
    self.log when log is a list."""

    def __init__(self, tapdev, seed, pause=0.01, log=None, size=4 * KiB):
        threading.Thread.__init__(self, daemon=True)
        self.tapdev, self.rng = tapdev, random.Random(seed)
        self.stop, self.count, self.error = threading.Event(), 0, None
        self.pause, self.log, self.size = pause, log, size

    def run(self):
        size = self.size
        buf = mmap.mmap(-1, size)
        fd = os.open(self.tapdev, os.O_WRONLY | os.O_DIRECT)
        try:
            while not self.stop.is_set():
                buf.seek(0)
                buf.write(bytes(size) if self.rng.random() < 0.25 else
                          os.urandom(size))
                at = self.rng.randrange((DISK - size) // 512) * 512
                os.pwrite(fd, buf, at)
                if self.log is not None:
                    self.log.append((at, bytes(buf)))
                self.count += 1
                self.stop.wait(self.pause)
        except OSError as exc:
            self.error = exc
        finally:
            os.close(fd)


def pass_fd(path, fd, name):
    """Send fd to the unix socket path, with name as the message."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.sendmsg([name.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                     array.array("i", [fd]))])
    finally:
        s.close()


def copy_sparse(snapshot, device):
    """sparse_dd's part: the snapshot's blocks that are not zeros."""
    fd = os.open(device, os.O_WRONLY)
    try:
        with open(snapshot, "rb") as f:
            for at in range(0, DISK, 64 * KiB):
                block = f.read(64 * KiB)
                if block.strip(b"\0"):
                    os.pwrite(fd, block, at)
        os.fsync(fd)
    finally:
        os.close(fd)


def uri(vol):
    (u,) = vol["uri"]
    return u


def connect(path, source):
    """nbd_handler and mirror_pass_fds: one connection, an end to the
    leaf's import server at path and one to the source's tapdisk."""
    here, there = socket.socketpair()
    pass_fd(path, there.fileno(), DP)
    pass_fd("/var/run/blktap-control/nbdclient%d" % source.pid,
            here.fileno(), DP)
    here.close()
    there.close()


def snapshot_with_mirror(source):
    """The source's snapshot (a copy of its file, the tapdisk paused)
    taken once the mirror is on: then it mirrors to DP."""
    source.tap("pause")
    sh("cp", "--sparse=always", source.path, "/mnt/v1sr/snap.raw")
    source.tap("unpause", "-2", "nbd:" + DP)


def copy_in(dp, parent):
    """xapi's copy of that snapshot into the parent, through its dom0
    attach."""
    device = attach_dom0(dp, parent, call=once)
    copy_sparse("/mnt/v1sr/snap.raw", device)
    detach_dom0(dp, parent, call=once)


def receive_start(plugin, dp, sr, description):
    """receive_start_common, on the destination: (leaf, dummy, parent)."""
    leaf = plugin("Volume.create", sr=sr, name="web01",
                  description=description, size=DISK, sharable=False)
    dummy = plugin("Volume.snapshot", sr=sr, key=leaf["key"])
    dp("Datapath.attach", uri=uri(leaf), domain=MIRROR_VM)
    dp("Datapath.activate", uri=uri(leaf), domain=MIRROR_VM)
    parent = plugin("Volume.create", sr=sr, name="web01", description="",
                    size=DISK, sharable=False)
    return leaf, dummy, parent


def test_a_running_vms_disk_moves_in_from_a_file_sr(plugin, dp, sr):
    source = Source(sr, 7)
    guest = Guest(source.tapdev, 8)
    guest.start()
    leaf, dummy, parent = receive_start(plugin, dp, sr, "moved")
    # nbd_handler and mirror_pass_fds: one connection, an end each side
    path = dp("Datapath.import_activate", uri=uri(leaf), domain=MIRROR_VM)
    assert dp("Datapath.import_activate", uri=uri(leaf),
              domain=MIRROR_VM) == path
    connect(path, source)
    # the snapshot with the mirror on, then the copy into the parent
    snapshot_with_mirror(source)
    written = guest.count
    copy_in(dp, parent)
    time.sleep(2)                            # the guest writes on
    guest.stop.set()
    guest.join(30)
    assert guest.error is None and guest.count > written + 20
    stats = json.loads(sh("tap-ctl", "stats", "-p", str(source.pid),
                          "-m", str(source.minor)))
    assert stats["nbd_mirror_failed"] == 0, stats   # xapi's check
    source.close()                           # the VM left this host
    want = source.digest()
    # receive_finalize
    dp("Datapath.deactivate", uri=uri(leaf), domain=MIRROR_VM)
    dp("Datapath.detach", uri=uri(leaf), domain=MIRROR_VM)
    # a compose that failed is logged and ignored by xapi, which then
    # starts the VM on the leaf: refused, never served half composed
    with pytest.raises(PluginError) as err:
        dp("Datapath.attach", uri=uri(leaf), domain=VM_AFTER)
    assert err.value.name == "ComposePending", err.value.params
    plugin("Volume.compose", sr=sr, key=leaf["key"], key2=parent["key"])
    try:
        plugin("Volume.destroy", sr=sr, key=dummy["key"])
    except Exception:
        pass                                 # xapi ignores it
    # remove_from_sm_config leaf base_mirror (main.ml: a prefixed key)
    plugin("Volume.unset", sr=sr, key=leaf["key"],
           k="_sm_config_base_mirror")
    listed = dict((v["key"], v) for v in plugin("SR.ls", sr=sr))
    assert list(listed) == [leaf["key"]]
    moved = listed[leaf["key"]]
    got = attach_dom0(dp, moved, readonly=True, call=once)
    try:
        with open(got, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == want
    finally:
        detach_dom0(dp, moved, call=once)
    plugin("Volume.destroy", sr=sr, key=leaf["key"])
    source.remove()
    assert not os.path.exists("/proc/%d" % source.pid)
    assert sh("zfs", "list", "-H", "-o", "name", "-r", "-t", "all",
              sr).split() == [sr]
    nothing_left(sr)


STEPS = ["received", "mirroring", "written", "copying", "copied"]


@pytest.mark.parametrize("step", STEPS)
def test_a_receive_cancelled_at_any_step_leaves_nothing(plugin, dp, sr,
                                                        step):
    """receive_cancel (storage_smapiv1_migrate.ml): the leaf's datapath
    destroyed (deactivate, detach), then VDI.destroy of the dummy, the
    leaf and the parent, each error ignored. Cancelled once the receive
    has started, once the leaf's tapdisk mirrors into its sink, once the
    mirror wrote, in the middle of the parent's copy (its own datapath
    destroyed first, as the failed copy does) and after it: nothing of
    the migration may be left on the destination."""
    leaf, dummy, parent = receive_start(plugin, dp, sr, "")
    at = STEPS.index(step)
    if at >= 1:
        dp("Datapath.import_activate", uri=uri(leaf), domain=MIRROR_VM)
    if at >= 2:
        write_direct("/dev/zvol/%s/%s.in/writes" % (sr, leaf["key"]),
                     [(3 * MiB + 512, os.urandom(4 * KiB))])
    if at >= 3:
        device = attach_dom0(dp, parent, call=once)
        with open(device, "r+b") as f:
            f.write(os.urandom(MiB))
        if at == 3:                          # the copy fails midway
            detach_dom0(dp, parent, call=once)
    if at >= 4:
        with open(device, "r+b") as f:
            f.seek(4 * MiB)
            f.write(os.urandom(MiB))
        detach_dom0(dp, parent, call=once)
    # receive_cancel
    dp("Datapath.deactivate", uri=uri(leaf), domain=MIRROR_VM)
    dp("Datapath.detach", uri=uri(leaf), domain=MIRROR_VM)
    for key in (dummy["key"], leaf["key"], parent["key"]):
        try:
            plugin("Volume.destroy", sr=sr, key=key)
        except Exception:
            pass                             # xapi logs and ignores it
    assert plugin("SR.ls", sr=sr) == []
    assert sh("zfs", "list", "-H", "-o", "name", "-r", "-t", "all",
              sr).split() == [sr], step
    nothing_left(sr)


# --- a move in whose mirror sink reaches its bound ---------------------------

KEEP = 64 * MiB     # the destination's free space when the move starts


@pytest.fixture
def sr12(plugin, disks, new_uuid):
    """An SR on an ashift=12 pool (4 KiB sectors: a 512-byte block of the
    sink takes 4 KiB there)."""
    yield from one_disk_sr(plugin, disks, new_uuid, "v1mig12",
                           {"ashift": "12"})


def zget(name, prop):
    return int(sh("zfs", "get", "-Hp", "-o", "value", prop, name))


def tapdisk_lines(pid, since):
    """The syslog lines of tapdisk pid after the first since lines."""
    mark = "tapdisk[%d]:" % pid
    with open("/var/log/messages", errors="replace") as f:
        return [line.rstrip() for line in list(f)[since:] if mark in line]


def refused_errno(zvol):
    """The errno of an O_DIRECT write (tapdisk's aio) into a full sink:
    4 KiB writes into its free sectors until one fails (a few may fit)."""
    for at in range(0, DISK, 4 * KiB):
        try:
            write_direct("/dev/zvol/" + zvol, [(at, os.urandom(4 * KiB))])
        except OSError as exc:
            return exc.errno
    return None


def test_a_move_in_whose_sink_fills_fails_and_the_pool_keeps_room(
        plugin, dp, sr12):
    """The destination has KEEP bytes free (the rest held by another
    dataset's reservation, as thick VDIs hold theirs). The sink's quota is
    half of it. The guest writes until the sink is full: then the zvol
    fails the mirror's write with EIO (ZFS's EDQUOT has no block status),
    the leaf's tapdisk answers it with an NBD error (-EIO, sent in network
    order: the source logs "Error in reply: -67108865"), the source's NBD
    client fails the request with EIO and its VBD drops the secondary
    ("Got non-zero res 5 for NBD secondary - disabling mirroring",
    nbd_mirror_failed=1, which xapi reads: MIRROR_FAILED). The guest's
    writes all succeed, on the source alone, which holds every one. The
    pool keeps room: another VDI there still writes. receive_cancel then
    leaves nothing."""
    sr = sr12
    with open("/var/log/messages", errors="replace") as f:
        since = len(f.readlines())
    source = Source(sr, 9)
    leaf, dummy, parent = receive_start(plugin, dp, sr, "")
    other = plugin("Volume.create", sr=sr, name="other", description="",
                   size=DISK, sharable=False)
    sh("zfs", "create", "-o", "canmount=off", "-o", "reservation=%d" % (
        zget(sr, "available") - KEEP), sr + "/held")
    free = zget(sr, "available")
    path = dp("Datapath.import_activate", uri=uri(leaf), domain=MIRROR_VM)
    sink = "%s/%s.in" % (sr, leaf["key"])
    zvol = sink + "/writes"
    quota = zget(sink, "quota")
    assert free // 2 - MiB <= quota <= free // 2
    log = []          # 64 KiB writes: 512 KiB each in the sink, at ashift 12
    guest = Guest(source.tapdev, 10, pause=0, log=log, size=64 * KiB)
    guest.start()
    connect(path, source)
    snapshot_with_mirror(source)
    copy_in(dp, parent)

    def stats():
        return json.loads(sh("tap-ctl", "stats", "-p", str(source.pid),
                             "-m", str(source.minor)))

    started, deadline = guest.count, time.monotonic() + 900
    while stats()["nbd_mirror_failed"] == 0:       # xapi's check
        assert time.monotonic() < deadline and guest.is_alive(), \
            (guest.count, zget(sink, "used"), quota, guest.error)
        time.sleep(2)
    failed_at = guest.count
    time.sleep(2)                                  # the guest writes on
    guest.stop.set()
    guest.join(30)
    assert guest.error is None and guest.count > failed_at > started
    used, left = zget(sink, "used"), zget(sr, "available")
    print("sink bound: %d writes of 64 KiB, quota %d, sink used %d, zvol "
          "used %d logicalused %d (ashift 12, one disk), pool available "
          "%d of %d" % (failed_at, quota, used, zget(zvol, "used"),
                        zget(zvol, "logicalused"), left, free))
    assert used <= quota + MiB
    assert left >= free - quota - DISK - 4 * MiB   # less the parent's copy
    print("a write into the full sink: errno %s" % refused_errno(zvol))
    src_log = tapdisk_lines(source.pid, since)
    print("\n".join(line for line in src_log if "rror" in line)[-2000:])
    assert any("Error in reply" in line for line in src_log)
    assert any("NBD secondary - disabling mirroring" in line
               for line in src_log)
    # another VDI of the destination pool writes on
    device = attach_dom0(dp, other, call=once)
    write_direct(device, [(at, os.urandom(64 * KiB))
                          for at in range(0, 4 * MiB, 64 * KiB)])
    detach_dom0(dp, other, call=once)
    # the source holds every write of the guest
    source.close()
    want = bytearray(Source.initial(9))
    for at, data in log:
        want[at:at + len(data)] = data
    assert source.digest() == hashlib.sha256(want).hexdigest()
    # receive_cancel
    dp("Datapath.deactivate", uri=uri(leaf), domain=MIRROR_VM)
    dp("Datapath.detach", uri=uri(leaf), domain=MIRROR_VM)
    for key in (dummy["key"], leaf["key"], parent["key"]):
        try:
            plugin("Volume.destroy", sr=sr, key=key)
        except Exception:
            pass                             # xapi logs and ignores it
    assert [v["key"] for v in plugin("SR.ls", sr=sr)] == [other["key"]]
    plugin("Volume.destroy", sr=sr, key=other["key"])
    sh("zfs", "destroy", sr + "/held")
    source.remove()
    assert sh("zfs", "list", "-H", "-o", "name", "-r", "-t", "all",
              sr).split() == [sr]
    nothing_left(sr)
