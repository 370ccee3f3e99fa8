"""Two hosts, one link: the guest side of tests/guest/twohosts.sh.

A VM's disk moves, live, from a zfs-ng SR on host A to a zfs-ng SR on
host B: two QEMU guests joined by a byte stream (a virtio serial port on
each, /dev/virtio-ports/zfsng.link, the host's unix socket between them)
that stands for the network xapi's NBD connection crosses.

  twohost_guest.py destination  host B: receive_start3 (the leaf, its
                                mirror attach and its Nbd export), says
                                ready, carries the link to tapdisk's NBD
                                server until told to finalize, then
                                receive_finalize3 and the leaf's hash
  twohost_guest.py source       host A: a VM writing through its tapdev,
                                send_start over the link (xapi's one-shot
                                proxy, Data.mirror, Data.stat until
                                complete), the VM moves, and the
                                destination's hash must equal the source's
  twohost_guest.py source-cut   host A as source, until the mirror is
                                complete; then it asks the host to cut
                                host B's power (its QEMU killed) and
                                checks that the move fails while the VM
                                runs on here, every write it was told
                                was done on its disk
  twohost_guest.py source-lost  host A as source, until the mirror is
                                complete; then it asks the host to cut
                                its own power (its QEMU killed) while the
                                VM writes through the mirror
  twohost_guest.py destination-orphaned
                                host B with its source lost mid-mirror:
                                the link goes silent, never closed, and
                                xapi's receive_cancel2 (Storage_migrate's
                                killall at B's next toolstack start) must
                                still end the leaf's datapath and destroy
                                it, leaving nothing
  (host B's role is destination with source and source-cut)

The hand-over goes through /results, relayed by the host: B's ready.json
becomes A's remote.json, A's finalize B's, B's result.json A's.
"""

import json
import os
import select
import socket
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))

from conftest import DATAPATH_PLUGIN, ROOT, wipe  # noqa: E402
from datapath_util import dataset, zfs_names  # noqa: E402
from multihost_guest import RESULTS, put  # noqa: E402
from plugin_client import Plugin, PluginError  # noqa: E402
from test_migrate_out import GUEST, ZfsNgDestination, differing, \
    job_gone, migrate_live, recorded_vm, send_start, \
    wait_complete  # noqa: E402
from test_migrate_into import MIRROR_VM  # noqa: E402
from test_sr_lifecycle import attach  # noqa: E402
from test_tapdisk import nothing_left  # noqa: E402

DISK = "/dev/disk/by-id/virtio-zfsng-d1"    # each host's one disk
PORT = "/dev/virtio-ports/zfsng.link"
LINK = "/run/zfsng-link.sock"     # host A's end of the link, for the proxy
GO = b"\x01"                      # A to B: the proxy has its connection
WAIT = 1500                       # s: the longest one host waits for the other
LOST = 300      # s: the longest the source may take to see host B gone
                # (tapdisk's NBD timeout is 30 s, the relay's 60 s)


def wait_for(name):
    path = os.path.join(RESULTS, name)
    deadline = time.monotonic() + WAIT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError("the other host never wrote %s" % name)
        time.sleep(1)
    with open(path) as f:
        return json.loads(f.read() or "{}")     # the host's touch: empty


def carry(port, sock):
    """Bytes both ways between the port's fd and sock, in daemon threads
    (a serial port has no end of stream: the caller says when it is over)."""
    def port_to_sock():
        try:
            while True:
                data = os.read(port, 1 << 16)
                if not data:
                    break
                sock.sendall(data)
        except OSError:
            pass

    def sock_to_port():
        try:
            while True:
                data = memoryview(sock.recv(1 << 16))
                if not data:
                    break
                while data:             # a port takes what it has room for
                    data = data[os.write(port, data):]
        except OSError:
            pass
    ends = [threading.Thread(target=port_to_sock, daemon=True),
            threading.Thread(target=sock_to_port, daemon=True)]
    for t in ends:
        t.start()
    return ends


class Link(object):
    """Host A's side of the link, as the destination the source sees: a
    unix socket the proxy connects to, carried over the port once it has
    its connection; finalize asks host B for the leaf's hash."""

    def __init__(self, export):
        self.socket, self.export = LINK, export
        if os.path.exists(LINK):
            os.unlink(LINK)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(LINK)
        self.listener.listen(1)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        conn, _ = self.listener.accept()
        self.listener.close()
        port = os.open(PORT, os.O_RDWR)
        os.write(port, GO)
        carry(port, conn)[1].join()       # until the proxy closes

    def finalize(self):
        put("finalize", {})
        return wait_for("result.json")["hash"]


def new_sr(plugin, name):
    wipe([DISK])
    stored = plugin("SR.create", uuid=str(uuid.uuid4()), name=name,
                    description="", configuration={"device": DISK})
    return attach(plugin, stored)


def source(plugin, dp):
    sr = new_sr(plugin, "srcsr")
    link = Link(wait_for("remote.json")["export"])
    migrate_live(dp, plugin, sr, link, [])     # asserts the hashes equal
    plugin("SR.detach", sr=sr)


def source_cut(plugin, dp):
    """Host B's power cut while tapdisk mirrors the VM's writes to it,
    after Data.stat said complete (xapi no longer polls, the moment a
    lost mirror is hardest to see). xapi's last Data.stat before it
    moves the VM's memory must then fail the move (MirrorFailed), the
    guest must never see an error, and the disk here must hold every
    write the guest was told was done. The longest write is printed:
    what the guest lived through while tapdisk waited for host B."""
    sr = new_sr(plugin, "srcsr")
    link = Link(wait_for("remote.json")["export"])
    src, vm, tapdev, guest = recorded_vm(dp, plugin, sr)
    dom0, proxy, op = send_start(vm, link)
    wait_complete(dp, op[1])
    put("cut", {})                        # the host pulls B's plug
    failed = mirror_failure(dp, op[1])
    time.sleep(2)                         # the guest writes on, here
    guest.stop.set()
    guest.join(60)
    assert guest.error is None and guest.acked, guest.error
    assert job_gone(op[1])["phase"] == "failed"
    assert not differing("/dev/zvol/" + dataset(src),
                         sorted(guest.acked.items()))
    vm.stop(domain=GUEST)             # xapi's clean-up: no error
    vm("Datapath.detach", domain=dom0)
    plugin("Volume.destroy", sr=sr, key=src["key"])
    nothing_left(sr)
    plugin("SR.detach", sr=sr)
    print("twohost source-cut: host B's loss seen after %.1f s (%s); "
          "the guest's longest write %.1f s, %d writes kept"
          % (failed[0], failed[1], guest.longest, len(guest.acked)),
          flush=True)


def source_lost(plugin, dp):
    """Host A's own power cut while tapdisk mirrors the VM's writes to
    host B (after complete: the link busy with the guest's writes, a
    request possibly half sent). Nothing here survives: the host kills
    this guest's QEMU once asked; the source's side of a power cut is
    test_migrate_out.py's test_a_host_power_cut_mid_move_leaves_the_
    source_whole."""
    sr = new_sr(plugin, "srcsr")
    link = Link(wait_for("remote.json")["export"])
    src, vm, tapdev, guest = recorded_vm(dp, plugin, sr)
    dom0, proxy, op = send_start(vm, link)
    wait_complete(dp, op[1])
    time.sleep(2)                         # writes cross the link
    put("cut", {})                        # the host pulls this plug
    time.sleep(WAIT)
    raise AssertionError("host A was never cut")


def mirror_failure(dp, key):
    """xapi's Data.stat until the move fails: (seconds, how). After
    complete the plugin answers MirrorFailed once, then failed."""
    started = time.monotonic()
    while time.monotonic() - started < LOST:
        try:
            got = dp("Data.stat", operation=["MirrorV1", key])
        except PluginError as err:
            assert err.name == "MirrorFailed", err.params
            return time.monotonic() - started, "MirrorFailed"
        if got["failed"]:
            return time.monotonic() - started, "failed"
        time.sleep(1)
    raise AssertionError("host B lost %d s ago, the move still stands"
                         % LOST)


def receiving(plugin, dp):
    """receive_start3 on a new SR, then the link carried to the leaf's
    tapdisk once host A's proxy is connected: (sr, leaf, the socket)."""
    sr = new_sr(plugin, "destsr")
    leaf = ZfsNgDestination(dp, plugin, sr)     # receive_start3
    port = os.open(PORT, os.O_RDWR)
    put("ready.json", {"export": leaf.export})
    ready, _, _ = select.select([port], [], [], WAIT)
    assert ready and os.read(port, 1) == GO, "host A never connected"
    tapdisk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tapdisk.connect(leaf.socket)
    carry(port, tapdisk)
    return sr, leaf, tapdisk


def destination(plugin, dp):
    sr, leaf, tapdisk = receiving(plugin, dp)
    wait_for("finalize")             # the VM has moved: the mirror is over
    tapdisk.close()
    put("result.json", {"hash": leaf.finalize()})   # receive_finalize3
    nothing_left(sr)
    plugin("SR.detach", sr=sr)


def destination_orphaned(plugin, dp):
    """Host B once host A's power is cut mid-mirror. No FIN comes over a
    cut link, so xapi's end of the NBD connection (its proxy to the
    leaf's tapdisk) stays open and silent, as here. Nothing on B stops
    the receive by itself: its record stays in Storage_migrate's state
    until xapi's killall at the next toolstack start calls receive_
    cancel2 (storage_migrate.ml killall; storage_smapiv3_migrate.ml
    receive_cancel2: DP.destroy of the leaf's datapath, then VDI.destroy,
    each logged and ignored). Both must work with the connection still
    open, and leave nothing: no tapdisk, no minor, no state, no leaf."""
    sr, leaf, tapdisk = receiving(plugin, dp)
    wait_for("source-cut")
    time.sleep(5)                 # what was in flight has landed
    took = []
    for method in ("Datapath.deactivate", "Datapath.detach"):  # DP.destroy
        started = time.monotonic()
        leaf.xapi(method, domain=MIRROR_VM)
        took.append(time.monotonic() - started)
    started = time.monotonic()
    plugin("Volume.destroy", sr=sr, key=leaf.leaf["key"])       # VDI.destroy
    took.append(time.monotonic() - started)
    nothing_left(sr)
    gone = dataset(leaf.leaf)
    assert not [n for n in zfs_names(sr) if n.startswith(gone)], \
        zfs_names(sr)
    tapdisk.close()
    plugin("SR.detach", sr=sr)
    print("twohost destination-orphaned: receive_cancel2 with the link "
          "silent: deactivate %.1f s, detach %.1f s, destroy %.1f s"
          % tuple(took), flush=True)


def main(role):
    env = {"ZFSNG_RUN_DIR": "/tmp/zfsng-run"}
    plugin = Plugin(ROOT, env=env)
    dp = Plugin(ROOT, plugin_dir=DATAPATH_PLUGIN, env=env)
    {"source": source, "source-cut": source_cut,
     "source-lost": source_lost, "destination": destination,
     "destination-orphaned": destination_orphaned}[role](plugin, dp)
    print("twohost %s: ok" % role, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
