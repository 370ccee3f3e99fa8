"""Storage migration out of zfs-ng, live: Data.mirror and Data.stat with
the real tapdisk (pause, unpause with an NBD secondary) and real ZFS, while
writers keep writing through the guest's tapdev as guests do (sectors,
pages, large writes, zeros over data, flushes, two at once overlapping).

xapi's order (xen-api v26.1.4): the destination, here a second zfs-ng SR,
runs receive_start3 (Volume.create of the leaf, Datapath.attach for the
mirror's pseudo-domain, activate, its Nbd answer); the source runs
send_start: Datapath.attach of the VDI in dom0 (not activated), a
one-shot proxy at /var/run/nbdproxy/export/<mirror vm> to the
destination (here a plain unix-socket relay, as xapi's is once its HTTP
request is made), Data.mirror(uri, the VM's domid, nbd+unix:///<export>
?socket=<proxy>), then Data.stat in a loop until complete. The VM then
moves: its VBD is deactivated and detached on the source (tapdisk closes
its secondary), the dom0 attach goes, and receive_finalize3 deactivates
and detaches the leaf. The destination must then equal the source, byte
for byte, with every write the guest made during the migration.
"""

import mmap
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from conftest import end_blktap, sh, wipe
from plugin_client import PluginError
from datapath_util import GUEST, STATE_DIR, dataset, write_direct
from migration_util import BLOCK, Proxy, Writer, whole_hash
from test_migrate_into import MIRROR_VM, nbd_of
from test_durability import copy
from test_tapdisk import Xapi, nothing_left
from xapi_flows import domain_of

PROXY_DIR = "/var/run/nbdproxy/export"
# send_start's dom0 attach: xapi's dp "mirror_" ^ the VBD's dp
# (xapi_vm_migrate.ml), here the running guest's first disk
SOURCE_DP = "mirror_vbd/%s/xvda" % GUEST
HALTED_VM = "6f1d2c3b-4a5e-4f60-8b7a-9c8d7e6f5a4b"
MIG_SIZE = 32 << 20      # each round is a copy of it under emulation
WRITE_EVERY = 0.2        # s: a busy guest the emulated link outpaces, so
                         # rounds shrink (a flood makes each snapshot wait
                         # a minute under one emulated vCPU; the benchmark
                         # plays faster writers)


def send_start(vm, destination, domain=GUEST, dp=SOURCE_DP,
               cut_after=None):
    """xapi's send_start on the source: the VDI attached in dom0 for the
    dp "mirror_" ^ the VBD's (not activated), xapi's one-shot proxy to
    the destination, Data.mirror(uri, the VM's domid, the proxy's URI).
    Returns (the dom0 domain, the proxy, the operation)."""
    dom0 = domain_of(dp, "0")
    vm("Datapath.attach", domain=dom0)
    proxy = Proxy(os.path.join(PROXY_DIR, MIRROR_VM), destination.socket,
                  cut_after=cut_after)
    remote = "nbd+unix:///%s?socket=%s/%s" % (destination.export, PROXY_DIR,
                                              MIRROR_VM)
    op = vm("Data.mirror", domain=domain, remote=remote)
    assert op[0] == "MirrorV1"
    return dom0, proxy, op


def wait_complete(dp, key, bound=900):
    deadline = time.monotonic() + bound
    seen = []
    while time.monotonic() < deadline:
        got = dp("Data.stat", operation=["MirrorV1", key])
        seen.append(got)
        assert not got["failed"], seen[-3:]
        if got["complete"]:
            return seen
    raise AssertionError("no complete within %d s: %r" % (bound, seen[-3:]))


class ZfsNgDestination(object):
    """A second zfs-ng SR: receive_start3, then receive_finalize3."""

    def __init__(self, dp, plugin, sr):
        self.leaf = plugin("Volume.create", sr=sr, name="leaf",
                           description="", size=MIG_SIZE, sharable=False)
        self.xapi = Xapi(dp, plugin, sr, self.leaf, repeat=False)
        attached = self.xapi("Datapath.attach", domain=MIRROR_VM)
        self.socket, self.export = nbd_of(attached)
        self.xapi("Datapath.activate", domain=MIRROR_VM)

    def finalize(self):
        self.xapi("Datapath.deactivate", domain=MIRROR_VM)
        self.xapi("Datapath.detach", domain=MIRROR_VM)
        return whole_hash("/dev/zvol/" + dataset(self.leaf))


class NbdFileDestination(object):
    """Any other SR: a plain NBD server (qemu-nbd) on a raw file."""

    def __init__(self, tmp_path, size=MIG_SIZE):
        self.image = str(tmp_path / "dest.raw")
        with open(self.image, "wb") as f:
            f.truncate(size)
        self.socket, self.export = str(tmp_path / "dest.sock"), "leaf"
        self.proc = subprocess.Popen(
            ["qemu-nbd", "-f", "raw", "-x", self.export, "-k", self.socket,
             "-t", self.image], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.socket):
            assert self.proc.poll() is None, self.proc.stderr.read()
            assert time.monotonic() < deadline, "qemu-nbd did not start"
            time.sleep(0.1)

    def finalize(self):
        self.stop()
        return whole_hash(self.image)

    def stop(self):
        """The server ended, nothing read (a whole read of a large
        sparse image takes a minute under emulation)."""
        self.proc.terminate()
        self.proc.wait(60)


@pytest.fixture
def zfsng_destination(dp, plugin, disks, new_uuid):
    stored = plugin("SR.create", uuid=new_uuid(), name="destsr",
                    description="", configuration={"device": disks[1]})
    yield ZfsNgDestination(dp, plugin,
                           plugin("SR.attach", configuration=stored))
    sh("zpool", "destroy", "-f", "destsr", check=False)


@pytest.fixture
def released(dp, plugin, sr):
    """Whatever a failed test left running: the writer stopped, every
    datapath state of this host released as xapi would (deactivate,
    detach), so that the SRs' teardown never waits on a held zvol."""
    left = []
    yield left
    for item in left:
        if isinstance(item, threading.Thread):      # a guest writing
            item.stop.set()
            item.join(60)
    for st in datapath_states():
        for method in ("Datapath.deactivate", "Datapath.detach"):
            try:
                dp(method, uri=st["uri"], domain=st["domain"])
            except Exception:     # best effort: the test has failed already
                pass


def datapath_states():
    import json
    found = []
    for name in os.listdir(STATE_DIR) if os.path.isdir(STATE_DIR) else ():
        if name.endswith(".json"):
            with open(os.path.join(STATE_DIR, name)) as f:
                found.append(json.load(f))
    return found


def test_a_running_vms_disk_moves_to_another_zfs_ng_sr(
        dp, plugin, sr, zfsng_destination, released):
    migrate_live(dp, plugin, sr, zfsng_destination, released)


def test_a_running_vms_disk_moves_to_any_nbd_destination(
        dp, plugin, sr, tmp_path, released):
    """Any other SR's receive side: a plain NBD server on a raw file."""
    migrate_live(dp, plugin, sr, NbdFileDestination(tmp_path), released)


def migrate_live(dp, plugin, sr, destination, released):
    src = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=MIG_SIZE, sharable=False)
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    with open("/dev/zvol/" + dataset(src), "r+b") as f:     # a used disk
        for at in range(0, MIG_SIZE // 2, 4 * BLOCK):
            f.seek(at)
            f.write(os.urandom(BLOCK))
    # two guest threads: sectors, pages and large writes, zeros over
    # data, flushes, each overlapping the other's writes
    writers = [Writer(tapdev, seed, MIG_SIZE, WRITE_EVERY, mixed=True)
               for seed in (1, 2)]
    for writer in writers:
        writer.start()
        released.append(writer)
    # the source: send_start
    dom0, proxy, op = send_start(vm, destination)
    seen = wait_complete(dp, op[1])
    progress = [s.get("progress", 0.0) for s in seen]
    assert progress == sorted(progress) and progress[-1] == 1.0
    names = sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-r",
               sr).split()        # mirroring holds no snapshot
    assert not [n for n in names if "@zfsng-sxm-" in n]
    time.sleep(2)                     # the guest writes on, mirrored
    for writer in writers:
        writer.stop.set()
        writer.join(60)
        assert writer.error is None and writer.count > 0
        assert writer.flushes > 0
    # the VM moves: its VBD goes on the source, then the dom0 attach
    vm("Datapath.deactivate", domain=GUEST)
    vm("Datapath.detach", domain=GUEST)
    vm("Datapath.close")
    vm("Datapath.detach", domain=dom0)
    proxy.join(60)
    done = dp("Data.stat", operation=["MirrorV1", op[1]])
    assert done == {"failed": False, "complete": True, "progress": 1.0}
    job = job_gone(op[1])
    assert job["phase"] == "done" and job["rounds"] and job["copied"] > 0
    assert "pause_seconds" in job
    told = smlog(op[1])                 # what an admin reads, per round
    assert len([t for t in told if "mirror round" in t]) == \
        len(job["rounds"]) and [t for t in told if "was paused" in t]
    assert destination.finalize() == whole_hash("/dev/zvol/" + dataset(src))
    names = sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-r",
               sr).split()
    assert not [n for n in names if "@zfsng-sxm-" in n]
    nothing_left(sr)


def smlog(key):
    """The log lines of mirror job key (the guest's syslog stands for
    dom0's SMlog)."""
    with open("/var/log/messages", errors="replace") as f:
        return [line for line in f if "[%s]" % key in line]


def stat_until(dp, key, what, bound=900):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        got = dp("Data.stat", operation=["MirrorV1", key])
        if what(got):
            return got
        time.sleep(0.2)
    raise AssertionError("Data.stat never matched: %r" % got)


def job_until(key, phase, bound=900):
    """Wait until the job's file says phase, without a Data.stat."""
    import json
    path = "/var/run/nonpersistent/zfs-ng-datapath-mirror/%s.json" % key
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        with open(path) as f:
            job = json.load(f)
        if job["phase"] == phase:
            return job
        assert job["phase"] not in ("done", "failed"), job
        time.sleep(0.2)
    raise AssertionError("the mirror job never reached %s" % phase)


def job_gone(key):
    """The job's process ended (its file says so)."""
    import json
    path = "/var/run/nonpersistent/zfs-ng-datapath-mirror/%s.json" % key
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(path) as f:
            job = json.load(f)
        if job["phase"] in ("done", "failed"):
            return job
        time.sleep(0.2)
    raise AssertionError("the mirror job did not end: %r" % job)


def test_a_halted_vms_disk_moves_to_another_zfs_ng_sr(
        dp, plugin, sr, zfsng_destination, released):
    """xapi mirrors a halted (or suspended) VM's disks too, with its
    domid -1, the disk attached in dom0 only: one snapshot is copied, no
    tapdisk, and the destination equals the source."""
    src = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=MIG_SIZE, sharable=False)
    with open("/dev/zvol/" + dataset(src), "r+b") as f:
        for at in range(0, MIG_SIZE, 3 * BLOCK):
            f.seek(at)
            f.write(os.urandom(BLOCK // 8) * 8 if at % 2 else bytes(BLOCK))
        f.seek(MIG_SIZE - 512)
        f.write(os.urandom(512))                 # a sub-block write
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    # a halted VM's VBD dp: vbd/<vm uuid>/<vdi uuid> (storage_access.ml)
    dom0, proxy, op = send_start(vm, zfsng_destination, domain="-1",
                                 dp="mirror_vbd/%s/%s" % (HALTED_VM,
                                                          src["key"]))
    seen = wait_complete(dp, op[1])
    assert seen[-1]["progress"] == 1.0
    job = job_gone(op[1])
    assert job["phase"] == "done" and len(job["rounds"]) == 1
    vm("Datapath.deactivate", domain=dom0)       # DP.destroy of mirror_
    vm("Datapath.detach", domain=dom0)
    proxy.join(60)
    assert zfsng_destination.finalize() == whole_hash(
        "/dev/zvol/" + dataset(src))
    assert not sh("tap-ctl", "list").strip()
    names = sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-r",
               sr).split()
    assert not [n for n in names if "@zfsng-sxm-" in n]
    nothing_left(sr)


@pytest.mark.parametrize("caught_by", ["data-stat", "deactivate"])
def test_a_mirror_lost_after_complete_stops_the_move(
        dp, plugin, sr, tmp_path, caught_by, released):
    """The destination lost once Data.stat said complete: xapi no longer
    polls. Its last Data.stat before it moves the VM's memory raises
    MirrorFailed (the move fails, the VM still runs here); without that
    call, the deactivate xenopsd makes of the suspended VM's disk before
    the destination resumes it raises it (xenopsd then halts the VM here).
    Either way once, the guest never saw an error, and its disk here
    holds every write it made."""
    destination = NbdFileDestination(tmp_path)
    src = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=MIG_SIZE, sharable=False)
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    writer = Writer(tapdev, 3, MIG_SIZE, WRITE_EVERY)
    writer.start()
    released.append(writer)
    dom0, proxy, op = send_start(vm, destination)
    wait_complete(dp, op[1])
    proxy.cut.set()
    time.sleep(2)                    # the guest writes on: not mirrored
    writer.stop.set()
    writer.join(60)
    assert writer.error is None and writer.count > 0
    if caught_by == "data-stat":
        assert job_gone(op[1])["phase"] == "failed"
        with pytest.raises(PluginError) as err:
            dp("Data.stat", operation=["MirrorV1", op[1]])
        assert err.value.name == "MirrorFailed", err.value.params
        full_pool_keeps_every_answered_write(sr, tapdev, dataset(src))
    with open(tapdev, "rb") as f:            # the disk still serves
        expected = f.read()
    if caught_by == "deactivate":
        with pytest.raises(PluginError) as err:
            vm("Datapath.deactivate", domain=GUEST)
        assert err.value.name == "MirrorFailed", err.value.params
    else:
        vm("Datapath.deactivate", domain=GUEST)
    got = dp("Data.stat", operation=["MirrorV1", op[1]])
    assert got["failed"] and not got["complete"]
    with open("/dev/zvol/" + dataset(src), "rb") as f:
        assert f.read() == expected
    vm("Datapath.deactivate", domain=GUEST)     # xapi's clean-up: no error
    vm("Datapath.detach", domain=GUEST)
    vm("Datapath.close")
    vm("Datapath.detach", domain=dom0)
    destination.finalize()
    nothing_left(sr)


def full_pool_keeps_every_answered_write(sr, tapdev, zvol, start=0):
    """The VM runs on here after its mirror failed: with its pool full,
    each write from start on is refused (the guest's I/O error, as
    without a move) or kept, never answered and lost. tapdisk ignores
    ENOSPC on an image it once mirrored until the image is reopened
    without a secondary. Some writes must be refused: start where the
    guest had not written (OpenZFS 2.3 takes an overwrite of a block on a
    full pool, 2.1 refuses it)."""
    pool = sr.split("/")[0]
    fill_pool(pool)
    refused = 0
    try:
        for at in range(start, start + 64 * BLOCK, BLOCK):
            data = os.urandom(BLOCK)
            try:
                write_direct(tapdev, [(at, data)])
            except OSError:
                refused += 1
                continue
            assert not differing("/dev/zvol/" + zvol, [(at, data)])
    finally:
        sh("zfs", "destroy", pool + "/filler")
    assert refused, "the pool was never full"


def fill_pool(pool):
    """A dataset whose reservation takes all but a little of the pool's
    free space (which moves while txgs sync: tried with wider margins)."""
    for margin in (64 << 10, 1 << 20, 8 << 20):
        avail = int(sh("zfs", "get", "-Hp", "-o", "value", "available",
                       pool))
        sh("zfs", "create", "-o", "reservation=%d" % (avail - margin),
           pool + "/filler", check=False)
        if sh("zfs", "list", "-H", "-o", "name", pool + "/filler",
              check=False).strip():
            return
    raise AssertionError("could not fill %s" % pool)


def differing(path, written):
    """The (offset, what was read) of the writes in written that path
    does not read back: a short answer where pytest's diff of two 64 KiB
    byte strings takes minutes under emulation."""
    wrong = []
    for at, data in written:
        got = read_direct(path, at, len(data))
        if got != data:
            wrong.append((at, "zeros" if not any(got) else "other data"))
    return wrong


def tapdisk_log():
    """tapdisk's lines in the guest's syslog (its ENOSPC, a timeout)."""
    with open("/var/log/messages", errors="replace") as f:
        return [line.strip() for line in f if "tapdisk" in line][-20:]


def read_direct(path, at, length):
    buf = mmap.mmap(-1, length)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        os.lseek(fd, at, os.SEEK_SET)
        assert os.readv(fd, [buf]) == length      # aligned, past the cache
    finally:
        os.close(fd)
    return bytes(buf)


def test_a_pool_filled_during_the_mirror_keeps_the_guests_disk(
        dp, plugin, sr, tmp_path, released):
    """In mirror mode tapdisk answers an ENOSPC on the zvol by dropping
    it and serving the guest zeros (seen here without the guard). The
    guard gives the disk room to be written whole, and ZFS's estimate of
    the writes not yet synced (24 times each dirtied byte: OpenZFS 2.1
    refuses what the refreservation does not cover once the pool is
    full), which the relay keeps bounded with a sync per window. So a
    pool filled meanwhile changes nothing, whatever tapdisk has in
    flight: scattered small writes, then the whole disk rewritten by
    four writers at once in 1 MiB writes (tapdisk's ring full), then as
    much again. The guest reads what it wrote, the move ends with the
    destination equal to the source, and the disk's refreservation is
    put back."""
    destination = NbdFileDestination(tmp_path)
    src = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=MIG_SIZE, sharable=False)
    zvol = "/dev/zvol/" + dataset(src)
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    dom0, proxy, op = send_start(vm, destination)
    wait_complete(dp, op[1])
    pool = sr.split("/")[0]
    fill_pool(pool)
    try:
        written = [(at, os.urandom(BLOCK))
                   for at in range(0, MIG_SIZE, MIG_SIZE // 16)]
        write_direct(tapdev, written)
        wrong = differing(tapdev, written) + differing(zvol, written)
        assert not wrong, (wrong, tapdisk_log())
        for _ in range(2):
            written = concurrent_writes(tapdev, writers=4, size=1 << 20)
            wrong = differing(tapdev, written) + differing(zvol, written)
            assert not wrong, (wrong[:4], tapdisk_log())
    finally:
        sh("zfs", "destroy", pool + "/filler")
    vm.stop(domain=GUEST)                     # the VM moves
    vm("Datapath.detach", domain=dom0)
    proxy.join(60)
    assert job_gone(op[1])["phase"] == "done"
    assert destination.finalize() == whole_hash(zvol)
    assert sh("zfs", "get", "-Hp", "-o", "value", "refreservation",
              dataset(src)).strip() in ("0", "none")
    assert sh("zfs", "get", "-Hp", "-o", "source",
              "org.xcp-ng.zfs-ng:mirror-guard", dataset(src)).strip() != \
        "local"
    nothing_left(sr)


def concurrent_writes(tapdev, writers, size):
    """The whole disk written anew in writes of size bytes, by writers
    threads at once, each its own part (O_DIRECT, no wait between two);
    returns the (offset, data) written. Raises the first writer's error."""
    part = MIG_SIZE // writers
    plans = [[(at, os.urandom(size)) for at in range(w * part,
                                                    (w + 1) * part, size)]
             for w in range(writers)]
    errors = []

    def write(plan):
        try:
            write_direct(tapdev, plan)
        except (OSError, AssertionError) as exc:
            errors.append(exc)
    threads = [threading.Thread(target=write, args=(plan,), daemon=True)
               for plan in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert not errors and not any(t.is_alive() for t in threads), errors
    return [w for plan in plans for w in plan]


class Recording(threading.Thread):
    """A guest writing BLOCKs through its tapdev one after the other,
    keeping each write tapdisk acknowledged (the last at each offset)
    and the longest one's seconds."""

    def __init__(self, tapdev):
        threading.Thread.__init__(self, daemon=True)
        self.tapdev, self.stop = tapdev, threading.Event()
        self.acked, self.error, self.longest = {}, None, 0.0

    def run(self):
        at = 0
        try:
            while not self.stop.is_set():
                data = os.urandom(BLOCK)
                began = time.monotonic()
                write_direct(self.tapdev, [(at, data)])
                self.longest = max(self.longest, time.monotonic() - began)
                self.acked[at] = data
                at = (at + BLOCK) % MIG_SIZE
                self.stop.wait(WRITE_EVERY)
        except OSError as exc:
            self.error = exc


def recorded_vm(dp, plugin, sr):
    """A new disk, its VM started, a Recording guest writing: (the
    volume, the Xapi, the tapdev, the guest)."""
    src = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=MIG_SIZE, sharable=False)
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    guest = Recording(tapdev)
    guest.start()
    return src, vm, tapdev, guest


def test_a_killed_mirror_job_leaves_no_write_unkept(
        dp, plugin, sr, tmp_path, released):
    """The mirror job killed (SIGKILL: no cleanup of its own) while
    tapdisk mirrors the guest's writes: the next Data.stat (xapi polls
    it) answers failed and does the job's cleanup, so the VBD leaves
    mirror mode (with the pool full, a write is refused or kept, never
    answered and lost, as tapdisk does to a mirrored image) and the disk's
    space guard is put back; the zvol holds every write the guest was
    told was done."""
    destination = NbdFileDestination(tmp_path)
    src, vm, tapdev, guest = recorded_vm(dp, plugin, sr)
    released.append(guest)
    dom0, proxy, op = send_start(vm, destination)
    job = job_until(op[1], "mirroring")
    os.kill(job["pid"], signal.SIGKILL)
    time.sleep(1)                      # the guest writes on
    got = dp("Data.stat", operation=["MirrorV1", op[1]])
    assert got["failed"] and not got["complete"]
    guest.stop.set()
    guest.join(60)
    assert guest.error is None and len(guest.acked) > 5
    job = job_gone(op[1])
    assert job["phase"] == "failed" and job["ended"]
    assert sh("zfs", "get", "-Hp", "-o", "source",
              "org.xcp-ng.zfs-ng:mirror-guard", dataset(src)).strip() != \
        "local"
    assert not differing("/dev/zvol/" + dataset(src),
                         sorted(guest.acked.items()))
    fresh = MIG_SIZE - 64 * BLOCK       # blocks the guest never wrote
    assert max(guest.acked) < fresh
    full_pool_keeps_every_answered_write(sr, tapdev, dataset(src), fresh)
    vm.stop(domain=GUEST)
    vm("Datapath.detach", domain=dom0)
    destination.finalize()
    nothing_left(sr)


def test_a_disk_its_pool_cannot_guard_is_not_mirrored(
        dp, plugin, sr, tmp_path, released):
    """A thin disk larger than its pool's free space: the job fails
    before tapdisk is ever paused, saying why; the VM runs on, its disk
    as it was, and nothing is left."""
    size = 4 << 30                             # the pool's disk: 1 GiB
    destination = NbdFileDestination(tmp_path, size)
    src = plugin("Volume.create", sr=sr, name="big", description="",
                 size=size, sharable=False)
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    data = os.urandom(BLOCK)
    write_direct(tapdev, [(0, data)])
    dom0, proxy, op = send_start(vm, destination)
    got = stat_until(dp, op[1], lambda s: s["failed"])
    assert not got["complete"]
    job = job_gone(op[1])
    assert "room" in job["error"] and "pause_seconds" not in job
    assert read_direct(tapdev, 0, BLOCK) == data
    vm.stop(domain=GUEST)
    vm("Datapath.detach", domain=dom0)
    destination.stop()            # it never got a byte
    nothing_left(sr)


def test_a_guest_rebooted_during_its_move_fails_the_move(
        dp, plugin, sr, tmp_path, released):
    """The guest reboots once its mirror was told complete: xenopsd closes
    the old domain's VBD (the mirror ends), then opens the disk for a new
    domain, whose writes no mirror carries. The deactivate xenopsd then
    makes in VM_save raises MirrorFailed: the move stops, and the disk
    here holds the new domain's writes."""
    destination = NbdFileDestination(tmp_path)
    src = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=MIG_SIZE, sharable=False)
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    dom0, proxy, op = send_start(vm, destination)
    wait_complete(dp, op[1])
    vm.stop(domain=GUEST)               # the reboot: epoch_end, ...
    assert job_gone(op[1])["phase"] == "done"
    rebooted = str(int(GUEST) + 1)
    tapdev, _ = vm.start(domain=rebooted)       # ... a new domain
    data = os.urandom(BLOCK)
    write_direct(tapdev, [(0, data)])
    with pytest.raises(PluginError) as err:     # VM_save
        vm("Datapath.deactivate", domain=rebooted)
    assert err.value.name == "MirrorFailed", err.value.params
    with open("/dev/zvol/" + dataset(src), "rb") as f:
        assert f.read(BLOCK) == data
    vm.stop(domain=rebooted)                    # xapi's clean-up
    vm("Datapath.detach", domain=dom0)
    destination.finalize()
    nothing_left(sr)


@pytest.mark.parametrize("when", ["copying", "mirroring", "vm-stops"])
def test_a_failed_mirror_leaves_the_vm_running_and_nothing_behind(
        dp, plugin, sr, tmp_path, when, released):
    """The destination lost while the disk is copied, or once it is
    mirrored, or the VM shut down mid-copy: Data.stat says failed, the
    guest never sees an error (tapdisk was never left paused; a dropped
    secondary is tapdisk's nbd_mirror_failed), and the job leaves no
    snapshot behind. (Once mirrored, polled before it failed: xapi's
    mirror_wait sees failed, so nothing is raised.)"""
    destination = NbdFileDestination(tmp_path)
    src = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=MIG_SIZE, sharable=False)
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    with open("/dev/zvol/" + dataset(src), "r+b") as f:
        f.write(os.urandom(MIG_SIZE // 2))
    writer = Writer(tapdev, 2, MIG_SIZE, WRITE_EVERY)
    writer.start()
    released.append(writer)
    dom0, proxy, op = send_start(
        vm, destination, cut_after=(8 << 20) if when == "copying" else None)
    if when == "mirroring":
        job_until(op[1], "mirroring")     # complete, xapi not told yet
        time.sleep(1)
        proxy.cut.set()
        job_gone(op[1])                   # failed before xapi read it
    if when == "vm-stops":
        stat_until(dp, op[1], lambda s: s["progress"] > 0 or s["failed"])
        writer.stop.set()
        writer.join(60)
        vm.stop(domain=GUEST)
    got = stat_until(dp, op[1], lambda s: s["failed"])
    assert got["complete"] is False
    job = job_gone(op[1])
    assert job["phase"] == "failed" and job["error"]
    if when != "vm-stops":
        time.sleep(1)
        writer.stop.set()
        writer.join(60)
        with open(tapdev, "rb") as f:             # the disk still serves
            assert len(f.read(BLOCK)) == BLOCK
        vm.stop(domain=GUEST)
    assert writer.error is None and writer.count > 0
    names = sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-r",
               sr).split()
    assert not [n for n in names if "@zfsng-sxm-" in n]
    vm("Datapath.detach", domain=dom0)             # xapi's clean-up
    destination.finalize()
    nothing_left(sr)


# --- xapi's copies of a VM's snapshots and suspend image ---------------------
#
# xapi_vm_migrate.ml (v26.1.4): the VM's own RW disks are mirrored
# (do_mirror), its snapshots' disks and its suspend image copied
# (vdi_filter with allow_mirror false, get_vdi_mirror ... false), all in one
# list sorted by size, then snapshot_time (a leaf's is the epoch), each
# nested in the previous one's continuation (with_many), so a running VM's
# mirror lives on while the copies after it run. A copy is DATA.copy:
# Storage_smapiv1_migrate.Copy.copy_into_sr, whose with_activated_disk
# makes VDI.attach3 (read_write false) and VDI.activate3 for a fresh uuid
# dp and the vm "CP" ^ 3 hex of the VM's ref ^ 3 of the VDI's; domain_of
# passes that vm as the domain. activate3 becomes VDI.activate_readonly
# for an SR declaring VDI_ACTIVATE_READONLY, as zfs-ng does (storage_mux.ml
# 614-638), then Datapath.activate_readonly (main.ml 1529-1560): tapdisk
# opens the zvol read-only, the VDI keeps its content_id. sparse_dd reads
# the image under tapdisk's device (an aio tapdisk's zvol, O_RDONLY:
# vhd-tool impl.ml 937-945); played here through the BlockDevice. Then
# VDI.deactivate, VDI.detach, and VDI.set_content_id on the source VDI.


def copy_vm(vm_ref, vdi_ref):
    """xapi's copy_vm name (get_vdi_mirror): CP and two 3-hex digests."""
    import hashlib

    def three(ref):
        return hashlib.md5(ref.encode()).hexdigest()[:3]
    return "CP" + three(vm_ref) + three(vdi_ref)


def xapi_copy_read(dp, plugin, sr, vol, domain, base=None):
    """copy_into_vdi's reads: with_activated_disk for the base (if any:
    the first VDI of the SR whose content_id is the new destination
    VDI's; none since zfs-ng never reports "", but before that any VDI,
    the mirrored disk itself too: played here as the worst case), then
    for the VDI copied: attach, activate, its BlockDevice read whole
    (sparse_dd), deactivate, detach, each in the reverse order; then
    set_content_id. Each activate is the one storage_mux picks for a
    read-only attach (read_only_activate); neither VDI's content_id
    changes. Returns the hash read and the device's size."""
    held = []
    read = ([base] if base else []) + [vol]
    ids, activate = content_ids(read), read_only_activate(plugin)
    try:
        for one in read:
            xapi = Xapi(dp, plugin, sr, one, repeat=False)
            impls = dict((kind, args) for kind, args in xapi(
                "Datapath.attach", domain=domain)["implementations"])
            held.append(xapi)
            xapi(activate, domain=domain)
        path = impls["BlockDevice"]["path"]      # files first, then these
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
        got = whole_hash(path)
        assert content_ids(read) == ids
    finally:
        for xapi in reversed(held):
            xapi("Datapath.deactivate", domain=domain)
            xapi("Datapath.detach", domain=domain)
    plugin("Volume.set", sr=sr, key=vol["key"], k="content_id",
           v="cid-" + vol["key"])
    return got, size


def read_only_activate(plugin):
    """storage_mux.ml activate3 (614-638): VDI.activate_readonly for a VDI
    attached read-only if the SR's features (the volume plugin's Query)
    list VDI_ACTIVATE_READONLY, else activate3."""
    if "VDI_ACTIVATE_READONLY" in plugin("Plugin.Query")["features"]:
        return "Datapath.activate_readonly"
    return "Datapath.activate"


def content_ids(vols):
    """The content_id property of each VDI's dataset, in one zfs get
    (its name from this checkout's zfsng.meta)."""
    import sys
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                        "..", "volume")
    if path not in sys.path:
        sys.path.insert(0, path)
    from zfsng import meta
    return sh("zfs", "get", "-H", "-o", "value", meta.CONTENT_ID,
              *[dataset(v) for v in vols]).split()


def written_disk(plugin, sr, size):
    """A disk with data here and there (a sparse disk)."""
    vol = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=size, sharable=False)
    with open("/dev/zvol/" + dataset(vol), "r+b") as f:
        for at in range(0, size, 4 * BLOCK):
            f.seek(at)
            f.write(os.urandom(512) * 128)
    return vol


def rewrite(vol, seed, every):
    """New data over part of the disk (between two snapshots)."""
    with open("/dev/zvol/" + dataset(vol), "r+b") as f:
        for at in range(seed * BLOCK, MIG_SIZE, every * BLOCK):
            f.seek(at)
            f.write(os.urandom(BLOCK))
        f.flush()
        os.fsync(f.fileno())


def test_a_running_vm_with_snapshots_moves(
        dp, plugin, sr, zfsng_destination, released):
    """Two snapshots, written between: the leaf mirrored while the guest
    runs, then each snapshot read whole through a CP domain's tapdisk
    while the leaf's job still mirrors (oldest first, as xapi sorts
    equal sizes), each equal to the disk when it was taken, the leaf
    opened too for that domain as sparse_dd's base; the guest writes on
    meanwhile, the move ends well and nothing is left."""
    from xapi_flows import vdi_snapshot
    src = written_disk(plugin, sr, MIG_SIZE)
    zvol = "/dev/zvol/" + dataset(src)
    snaps = []
    for n in (1, 2):
        expected = whole_hash(zvol)
        snaps.append((vdi_snapshot(plugin, sr, src["key"]), expected))
        rewrite(src, n, 3 + n)
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    dom0, proxy, op = send_start(vm, zfsng_destination)
    wait_complete(dp, op[1])
    for n, (snap, expected) in enumerate(snaps):
        write_direct(tapdev, [(n * BLOCK, os.urandom(BLOCK))])
        # the snapshot VM's ref and the snapshot VDI's
        got, size = xapi_copy_read(dp, plugin, sr, snap, copy_vm(
            "OpaqueRef:vm-%d" % n, "OpaqueRef:" + snap["key"]), base=src)
        assert (got, size) == (expected, MIG_SIZE)
        assert job_of(op[1])["phase"] == "mirroring"  # the job lives on
    assert not dp("Data.stat", operation=["MirrorV1", op[1]])["failed"]
    write_direct(tapdev, [(MIG_SIZE - BLOCK, os.urandom(BLOCK))])
    vm("Datapath.deactivate", domain=GUEST)            # the VM moves
    vm("Datapath.detach", domain=GUEST)
    vm("Datapath.close")
    vm("Datapath.detach", domain=dom0)
    proxy.join(60)
    assert job_gone(op[1])["phase"] == "done"
    assert zfsng_destination.finalize() == whole_hash(zvol)
    for snap, expected in snaps:                       # nothing changed
        assert plugin("Volume.stat", sr=sr, key=snap["key"])["keys"][
            "content_id"] == "cid-" + snap["key"]
    names = sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-r",
               sr).split()
    assert not [n for n in names if "@zfsng-sxm-" in n]
    nothing_left(sr)


def test_a_suspended_vms_disk_and_memory_image_move(
        dp, plugin, sr, tmp_path, released):
    """A suspended VM: its suspend image (an ordinary VDI of the SR,
    smaller than the disk, so copied first) read whole through a CP
    domain's tapdisk, attached twice there (as sparse_dd's base too), and
    left unchanged, then its disk mirrored with the
    domid -1 (one snapshot copied), the destination equal to it. Small
    disks and any NBD destination: the halted VM's test above moves a
    larger disk to a zfs-ng SR."""
    size, image_size = 8 << 20, 2 << 20
    destination = NbdFileDestination(tmp_path, size)
    image = written_disk(plugin, sr, image_size)
    expected = whole_hash("/dev/zvol/" + dataset(image))
    src = written_disk(plugin, sr, size)
    # its base was once itself (a plain VDI's content_id was "", as the
    # destination's): the worst case, played still
    got, read = xapi_copy_read(dp, plugin, sr, image, copy_vm(
        "OpaqueRef:" + HALTED_VM, "OpaqueRef:" + image["key"]),
        base=image)
    assert (got, read) == (expected, image_size)
    assert whole_hash("/dev/zvol/" + dataset(image)) == expected
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    dom0, proxy, op = send_start(vm, destination, domain="-1",
                                 dp="mirror_vbd/%s/%s" % (HALTED_VM,
                                                          src["key"]))
    wait_complete(dp, op[1])
    assert job_gone(op[1])["phase"] == "done"
    vm("Datapath.deactivate", domain=dom0)
    vm("Datapath.detach", domain=dom0)
    proxy.join(60)
    assert destination.finalize() == whole_hash("/dev/zvol/" + dataset(src))
    nothing_left(sr)


def job_of(key):
    import json
    path = "/var/run/nonpersistent/zfs-ng-datapath-mirror/%s.json" % key
    with open(path) as f:
        return json.load(f)


def _thin_leaf_writes_can_fail(plugin, sr, leaf):
    """The destination's leaf as receive_start3 makes it on a zfs-ng SR
    with its defaults: thin, no refreservation, so a full pool refuses its
    writes. (A thick SR's leaf has refreservation=auto: the room for
    every write of it is kept whatever else fills the pool, and nothing
    else writes it while it is received: that case cannot fill.)"""
    assert sh("zfs", "get", "-Hp", "-o", "value", "refreservation",
              dataset(leaf)).strip() in ("0", "none")


@pytest.mark.parametrize("told", ["before-complete", "after-complete"])
def test_a_full_destination_pool_fails_the_move_not_the_guest(
        dp, plugin, sr, zfsng_destination, told, released):
    """The destination's pool fills while the disk is mirrored: its
    tapdisk's write of the leaf fails (ENOSPC, not retried: tapdisk-vbd.c
    tapdisk_vbd_request_should_retry) and its NBD server answers the
    request with an error (tapdisk-nbdserver.c); the relay passes it to
    the source tapdisk, which drops the secondary and answers the guest
    once the zvol has the write (block-nbd.c tdnbd_disable, tapdisk-vbd.c
    nbd_mirror_failed), and fails the mirror. xapi sees Data.stat
    ``failed`` if it was not told ``complete`` yet, else MirrorFailed
    from its last Data.stat: the move fails, the VM runs on here and its
    disk has every write it made, those the destination refused too."""
    destination = zfsng_destination
    _thin_leaf_writes_can_fail(plugin, destination.xapi.sr,
                               destination.leaf)
    src = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=MIG_SIZE, sharable=False)
    zvol = "/dev/zvol/" + dataset(src)
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    with open(zvol, "r+b") as f:                       # a used disk
        f.write(os.urandom(MIG_SIZE // 4))
    writer = Writer(tapdev, 5, MIG_SIZE, WRITE_EVERY, mixed=True)
    writer.start()
    released.append(writer)
    dom0, proxy, op = send_start(vm, destination)
    if told == "after-complete":
        wait_complete(dp, op[1])
    else:
        job_until(op[1], "mirroring")           # xapi not told yet
    writer.stop.set()
    writer.join(60)
    assert writer.error is None and writer.count > 0
    dest_pool = destination.xapi.sr.split("/")[0]
    fill_pool(dest_pool)
    try:
        # the guest writes new blocks, each acknowledged: the destination
        # refuses one (its pool full), the zvol here keeps every one
        written = []
        for n, at in enumerate(range(MIG_SIZE // 4, MIG_SIZE, BLOCK)):
            data = os.urandom(BLOCK)
            write_direct(tapdev, [(at, data)])
            written.append((at, data))
            if n % 8 == 7 and _job_phase(op[1]) == "failed":
                break
        job = job_gone(op[1])
        assert job["phase"] == "failed", job
        assert "the destination failed a mirrored request: ENOSPC" in \
            job["error"], job["error"]
        for at, data in written:
            assert read_direct(tapdev, at, BLOCK) == data, at
            assert read_direct(zvol, at, BLOCK) == data, at
    finally:
        sh("zfs", "destroy", dest_pool + "/filler")
    if told == "after-complete":
        with pytest.raises(PluginError) as err:     # before the memory
            dp("Data.stat", operation=["MirrorV1", op[1]])
        assert err.value.name == "MirrorFailed", err.value.params
    got = dp("Data.stat", operation=["MirrorV1", op[1]])
    assert got["failed"] and not got["complete"]
    with open(tapdev, "rb") as f:             # the VM runs on here
        expected = f.read()
    vm.stop(domain=GUEST)                     # xapi's clean-up: no error
    vm("Datapath.detach", domain=dom0)
    proxy.join(60)
    with open(zvol, "rb") as f:
        assert f.read() == expected
    # the destination: receive_cancel2 (DP.destroy, VDI.destroy)
    destination.xapi("Datapath.deactivate", domain=MIRROR_VM)
    destination.xapi("Datapath.detach", domain=MIRROR_VM)
    plugin("Volume.destroy", sr=destination.xapi.sr,
           key=destination.leaf["key"])
    assert sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r",
              destination.xapi.sr).split() == [destination.xapi.sr]
    nothing_left(sr)


def _job_phase(key):
    import json
    path = "/var/run/nonpersistent/zfs-ng-datapath-mirror/%s.json" % key
    with open(path) as f:
        return json.load(f)["phase"]


MIRROR_DIR = "/var/run/nonpersistent/zfs-ng-datapath-mirror"
GUARD = "org.xcp-ng.zfs-ng:mirror-guard"


def _leftovers(sr):
    """What a move leaves on the source SR: the job's snapshots, and the
    space guard's refreservation with its mark ({zvol: (refreservation,
    mark)} for every zvol that has a mark)."""
    snaps = [n for n in sh("zfs", "list", "-H", "-o", "name", "-t",
                           "snapshot", "-r", sr).split() if "@zfsng-sxm-" in n]
    guards = {}
    for line in sh("zfs", "get", "-Hp", "-r", "-t", "volume", "-o",
                   "name,value,source", GUARD, sr).splitlines():
        name, value, source = line.split("\t")
        if source == "local":
            guards[name] = (sh("zfs", "get", "-Hp", "-o", "value",
                               "refreservation", name).strip(), value)
    return snaps, guards


def _kill_session(pid):
    """SIGKILL to the process group of pid (the mirror job's: its
    ``timeout``, itself and its commands)."""
    try:
        os.killpg(os.getpgid(pid), 9)
    except OSError:
        pass


def _power_off(pools):
    """What a power cut ends besides the mirror job: every tapdisk, every
    pool left imported (exported by force: nothing reaches their disks,
    frozen), and every tmpfs file (the datapath's states and jobs, the
    locks, xapi's proxy)."""
    end_blktap()
    for pool in pools:
        for _ in range(10):     # udev may still probe a zvol tapdisk held
            sh("udevadm", "settle")
            if not sh("zpool", "export", "-f", pool, check=False) and \
                    pool not in sh("zpool", "list", "-H", "-o",
                                   "name").split():
                break
            time.sleep(1)
        else:
            raise AssertionError("%s could not be exported" % pool)
    for path in (STATE_DIR, MIRROR_DIR, "/tmp/zfsng-run", PROXY_DIR):
        shutil.rmtree(path, ignore_errors=True)


_WATCH = []


def _step(text, stuck=240):
    """Where the test is, printed as it goes (-s shows it live); if the
    next step does not come within stuck seconds, what every thread and
    process waits on is printed too."""
    print("power cut %s: %s" % (time.strftime("%H:%M:%S"), text),
          flush=True)
    for timer in _WATCH:
        timer.cancel()
    del _WATCH[:]
    if text != "done":
        timer = threading.Timer(stuck, _stuck)
        timer.daemon = True
        timer.start()
        _WATCH.append(timer)


def _stuck():
    import faulthandler
    import sys
    print(sh("ps", "-eo", "pid,stat,wchan:32,args", check=False),
          flush=True)
    faulthandler.dump_traceback(sys.stdout, all_threads=True)


def _collected(since):
    """The collector's lines (the guest's syslog stands for dom0's
    SMlog) logged after the byte offset since."""
    with open("/var/log/messages", errors="replace") as f:
        f.seek(since)
        return [line for line in f if "collect: " in line]


@pytest.mark.parametrize("cut", ["mirroring", "copying"])
def test_a_host_power_cut_mid_move_leaves_the_source_whole(
        dp, plugin, disks, new_uuid, cut):
    """The host's power cut while a running VM's disk is copied (the job
    holds its snapshots) or mirrored (the space guard stands), both SRs
    on this host (a move between two of its SRs). A power cut is played
    as test_durability plays it: both pools frozen (``zpool freeze``: no
    transaction group reaches the disks any more, the ZIL still does),
    the mirror job killed, the guest's last writes flushed, the disks
    copied as they are, every process and tmpfs file ended, the copies
    put back. Then the host boots as xapi boots it: each SR
    attached (PBD.plug); Storage_migrate.killall finds no record (its
    tables are in /var/run/nonpersistent, emptied by the reboot) and
    calls nothing; the VM starts again on the source. Every write the
    guest saw complete before the cut is there (sync=always: each was in
    the ZIL), SR.attach's collector removed the move's snapshots and put
    the guard's refreservation back, the VDI serves a new domain, and the
    destination's half-written leaf is destroyed (Volume.destroy, what
    receive_cancel2's VDI.destroy calls) leaving nothing."""
    spares = disks[2:4]
    stored = [plugin("SR.create", uuid=new_uuid(), name=name,
                     description="", configuration={"device": disk})
              for name, disk in (("cutsrc", disks[0]), ("cutdst", disks[1]))]
    sr, dest_sr = [plugin("SR.attach", configuration=c) for c in stored]
    made = sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r",
              dest_sr).split()
    destination = ZfsNgDestination(dp, plugin, dest_sr)
    src = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=MIG_SIZE, sharable=False)
    before = sh("zfs", "get", "-Hp", "-o", "value", "refreservation",
                dataset(src)).strip()
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    _step("started")
    with open("/dev/zvol/" + dataset(src), "r+b") as f:     # a used disk
        f.write(os.urandom(MIG_SIZE // 2))
    writer = Writer(tapdev, 6, MIG_SIZE, WRITE_EVERY, mixed=True)
    writer.start()
    try:
        dom0, proxy, op = send_start(vm, destination)
        if cut == "mirroring":
            wait_complete(dp, op[1])
        else:
            deadline = time.monotonic() + 300
            while not _leftovers(sr)[0]:
                assert time.monotonic() < deadline, "no snapshot taken"
                time.sleep(0.1)
        # what the cut leaves: each made by a command that returned once
        # its transaction group was on disk
        left = _leftovers(sr)
        # from here no transaction group reaches the disks: what the
        # pools hold at the cut is what they hold now, and the writes
        # the guest sees complete until the copy (each in the ZIL)
        for pool in ("cutsrc", "cutdst"):
            sh("zpool", "freeze", pool)
        # the cut ends the job with it: no command of it runs on a frozen
        # pool (tapdisk drops a secondary gone and writes on)
        _kill_session(_job(op[1])["pid"])
        _step("frozen, the job killed, left %r" % (left,))
    finally:
        writer.stop.set()
        writer.join(60)
    assert writer.error is None and writer.count > 0
    if cut == "copying":
        assert left[0], "no snapshot of the job at the cut"
    else:
        assert list(left[1]) == [dataset(src)], left
        assert left[1][dataset(src)][0] not in ("0", "none"), left
    # the guest's last writes before the cut, flushed (write_direct's
    # fsync), mirrored or not
    write_direct(tapdev, [(at, os.urandom(BLOCK))
                          for at in range(BLOCK, MIG_SIZE, MIG_SIZE // 8)])
    with open(tapdev, "rb") as f:
        expected = f.read()
    _step("written, copying the disks")
    for disk, spare in zip(disks[:2], spares):      # the power cut
        copy(disk, spare)
    proxy.cut.set()
    _step("copied, powering off")
    _power_off(("cutsrc", "cutdst"))
    _step("off, putting the disks back")
    for disk, spare in zip(disks[:2], spares):      # the host boots again
        copy(spare, disk)
    _step("put back")
    wipe(spares)
    _step("booted, attaching")
    since = os.path.getsize("/var/log/messages")
    # xapi's boot: PBD.plug of each SR; Storage_migrate.killall: no record
    for config in stored:
        plugin("SR.attach", configuration=config)
    _step("attached")
    assert _leftovers(sr) == ([], {}), "SR.attach's collector left them"
    told = _collected(since)       # SR.attach removed what the cut left
    for snap in left[0]:
        assert [t for t in told if "destroy " + snap in t], (snap, told)
    for zvol in left[1]:
        assert [t for t in told if "unguard " + zvol in t], (zvol, told)
    assert sh("zfs", "get", "-Hp", "-o", "value", "refreservation",
              dataset(src)).strip() == before
    # the destination's half-written leaf: destroyed, nothing left
    plugin("Volume.destroy", sr=dest_sr, key=destination.leaf["key"])
    assert sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r",
              dest_sr).split() == made
    _step("the destination's leaf destroyed")
    # the VM starts again on the source: every flushed write is there
    rebooted = str(int(GUEST) + 1)
    tapdev, _ = vm.start(domain=rebooted)
    with open(tapdev, "rb") as f:
        assert f.read() == expected
    data = os.urandom(BLOCK)
    write_direct(tapdev, [(0, data)])
    assert read_direct("/dev/zvol/" + dataset(src), 0, BLOCK) == data
    vm.stop(domain=rebooted)
    nothing_left(sr)
    _step("done")


def _job(key):
    import json
    with open(os.path.join(MIRROR_DIR, key + ".json")) as f:
        return json.load(f)
