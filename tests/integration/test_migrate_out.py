"""Storage migration out of zfs-ng, live: Data.mirror and Data.stat with
the real tapdisk (pause, unpause with an NBD secondary) and real ZFS, while
a writer keeps writing through the guest's tapdev.

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

import hashlib
import mmap
import os
import random
import socket
import threading
import time

import pytest

from conftest import sh
from datapath_util import GUEST, SIZE, dataset
from test_migrate_into import MIRROR_VM, nbd_of
from test_tapdisk import Xapi, nothing_left, tap_list
from xapi_flows import domain_of

PROXY_DIR = "/var/run/nbdproxy/export"
SOURCE_DP = "4b1c7d2e-3f5a-4e6b-9c8d-7a6b5c4d3e2f"
BLOCK = 64 * 1024


@pytest.fixture
def dest_sr(plugin, disks, new_uuid):
    """A second SR: the migration's destination."""
    stored = plugin("SR.create", uuid=new_uuid(), name="destsr",
                    description="", configuration={"device": disks[1]})
    yield plugin("SR.attach", configuration=stored)
    sh("zpool", "destroy", "-f", "destsr", check=False)


def one_shot_proxy(path, upstream):
    """xapi's export_nbd_proxy once connected: one accept, then bytes
    both ways to upstream until either side closes."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def pipe(a, b):
        try:
            while True:
                data = a.recv(1 << 20)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def serve():
        conn, _ = listener.accept()
        listener.close()
        os.unlink(path)
        out = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        out.connect(upstream)
        threads = [threading.Thread(target=pipe, args=(conn, out)),
                   threading.Thread(target=pipe, args=(out, conn))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


class Writer(threading.Thread):
    """A guest writing through its tapdev with O_DIRECT: random 64 KiB
    blocks, random data or zeros over data, until stopped."""

    def __init__(self, tapdev, seed):
        threading.Thread.__init__(self, daemon=True)
        self.tapdev, self.rnd = tapdev, random.Random(seed)
        self.stop = threading.Event()
        self.count, self.error = 0, None

    def run(self):
        buf = mmap.mmap(-1, BLOCK)
        fd = os.open(self.tapdev, os.O_WRONLY | os.O_DIRECT)
        try:
            while not self.stop.is_set():
                buf.seek(0)
                buf.write(bytes(BLOCK) if self.rnd.random() < 0.2 else
                          self.rnd.getrandbits(8 * BLOCK).to_bytes(
                              BLOCK, "little"))
                os.pwrite(fd, buf, self.rnd.randrange(SIZE // BLOCK) * BLOCK)
                self.count += 1
        except OSError as exc:
            self.error = exc
        finally:
            os.close(fd)


def whole_hash(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def test_a_running_vms_disk_moves_with_every_write(dp, plugin, sr, dest_sr):
    src = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=SIZE, sharable=False)
    vm = Xapi(dp, plugin, sr, src, repeat=False)
    tapdev, _ = vm.start(domain=GUEST)
    with open("/dev/zvol/" + dataset(src), "r+b") as f:     # a used disk
        for at in range(0, SIZE // 2, 4 * BLOCK):
            f.seek(at)
            f.write(os.urandom(BLOCK))
    writer = Writer(tapdev, 1)
    writer.start()
    # destination: receive_start3
    leaf = plugin("Volume.create", sr=dest_sr, name="leaf", description="",
                  size=SIZE, sharable=False)
    dest = Xapi(dp, plugin, dest_sr, leaf, repeat=False)
    attached = dest("Datapath.attach", domain=MIRROR_VM)
    socket_path, export = nbd_of(attached)
    dest("Datapath.activate", domain=MIRROR_VM)
    # source: send_start
    dom0 = domain_of(SOURCE_DP, "0")
    vm("Datapath.attach", domain=dom0)
    proxy = one_shot_proxy(os.path.join(PROXY_DIR, MIRROR_VM), socket_path)
    remote = "nbd+unix:///%s?socket=%s/%s" % (export, PROXY_DIR, MIRROR_VM)
    op = vm("Data.mirror", domain=GUEST, remote=remote)   # live_vm: domid
    assert op[0] == "MirrorV1"
    seen = wait_complete(dp, op[1])
    progress = [s.get("progress", 0.0) for s in seen]
    assert progress == sorted(progress) and progress[-1] == 1.0
    time.sleep(2)                     # the guest writes on, mirrored
    writer.stop.set()
    writer.join(60)
    assert writer.error is None and writer.count > 0
    # the VM moves: its VBD goes on the source, then the dom0 attach
    vm("Datapath.deactivate", domain=GUEST)
    vm("Datapath.detach", domain=GUEST)
    vm("Datapath.close")
    vm("Datapath.detach", domain=dom0)
    proxy.join(60)
    done = dp("Data.stat", operation=["MirrorV1", op[1]])
    assert done == {"failed": False, "complete": True, "progress": 1.0}
    # receive_finalize3 on the destination
    dest("Datapath.deactivate", domain=MIRROR_VM)
    dest("Datapath.detach", domain=MIRROR_VM)
    assert whole_hash("/dev/zvol/" + dataset(leaf)) == \
        whole_hash("/dev/zvol/" + dataset(src))
    names = sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-r",
               sr).split()
    assert not [n for n in names if "@zfsng-sxm-" in n]
    assert tap_list() == []
    nothing_left(sr)
