"""A real Xen PV VM whose disk is a zfs-ng VDI: blkfront in the domU, the
vbd3 backend (blktap 3.55.5's tapback) and tapdisk in dom0, on OpenZFS.

Run by ``make test-xen`` in the test guest booted as a Xen 4.17 host
(tests/guest/run.sh --xen: Xen, dom0, xenstored, xenconsoled and tapback
are real; TESTING.md says which parts of XCP-ng's stack are played).

xapi and xenopsd are not here. What they do is played from their source
(xen-api v26.1.4), step for step:

* the datapath calls: Datapath.open, attach and activate with the guest's
  domid as the domain (xapi-storage-script main.ml:77-85 domain_of), made
  through the installed plugin before any xenstore node exists
  (xenops_server_xen.ml:4142-4225: VBD.attach, then VBD.activate runs
  Storage.activate, and only then Device.Vbd.add);
* Device.Vbd.add (device.ml:642-740, Generic.add_device :118-164): one
  xenstore transaction writing the frontend, the read-only frontend, the
  backend, the hotplug dir, the private dir and the xenserver dir with
  xenopsd's permissions (xenbus_utils.ml:78-104), the backend keys of
  :692-709 plus xapi's polling keys (xapi_xenops.ml:661-680, defaults
  xapi_globs.ml:770-773) and sm-data/* from the attach answer's XenDisk
  (xenops_server_xen.ml:301-331,4153-4164); then the ``vdi`` key
  (xenops_server_xen.ml:4218-4224);
* xapi's ``block`` hotplug script (ocaml/xenopsd/scripts/block at v26.1.4,
  lines 37-49): physical-device is the tapdev's major:minor in hex,
  then the hotplug node and hotplug-status=connected;
* the clean unplug (Device.clean_shutdown, device.ml:214-232 and 269-328):
  backend online=0 and state=5 in one transaction; a wait for the frontend
  to close (state 6), for hotplug-status or the frontend's state to go,
  failing on the frontend's error node; rm of the frontends; the same
  wait; rm_device_state (:184-192); then Vbd.release (:591-604,
  hotplug.ml:279-300) and, once the domain is gone, Domain.destroy's rm
  of the domain's backend dirs (domain.ml:909-926), which ends tapback's
  slave for it; then Datapath.deactivate, detach and close.

xl (Xen 4.17) only builds, unpauses and reaps the domU, with no disk in its
configuration: libxl 4.17 cannot make a vbd3 device (libxl_disk.c:370-373,
"blktap is not supported"; vbd3 came with Xen 4.19).

The domU (tests/guest/xen/domu-init) reads what dom0 wrote to the zvol
before the plug, writes a seeded pattern to /dev/xvda with O_DIRECT, reads
it back, prints both sha256, then waits until the unplug takes xvda away
and powers off. dom0 checks the zvol itself afterwards.
"""

import hashlib
import json
import os
import random
import re
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..",
                                "integration"))
sys.path.insert(0, "/usr/lib/xen-4.17/lib/python")

# The integration suite's fixtures: the installed plugins, blank disks, an
# SR on the first one.
from conftest import dp, disks, new_uuid, plugin, sh, sr  # noqa: E402,F401
from conftest import _shared_sr_ends_with_its_module  # noqa: E402,F401
from datapath_util import MiB, dataset, dd_hash, dd_write, new_vdi, \
    states, uri  # noqa: E402
from xapi_flows import domain_of  # noqa: E402

SPAN = 8 * MiB          # the pattern the domU writes, and what dom0 wrote
DEVID = (202 << 8) | 0  # xvda (device_number.ml:56-58 to_xenstore_int)
DOMU_INITRD = "/opt/zfsng-xen/domu-initrd.gz"
CONSOLE_DIR = "/var/log/xen/console"
CLOSED = "6"


def seeded(seed, size=SPAN):
    return random.Random(seed).getrandbits(size * 8).to_bytes(size, "little")


def sha(data):
    return hashlib.sha256(data).hexdigest()


def cpio_newc(files, executable=()):
    """A cpio (newc) archive of regular files, name -> bytes (the names in
    executable with mode 755): appended to the domU's initramfs (the
    kernel unpacks concatenated archives)."""
    out = bytearray()

    def entry(name, mode, data, ino):
        name = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name), 0)
        out.extend(b"070701" + b"".join(b"%08X" % f for f in fields) + name)
        out.extend(b"\0" * (-len(out) % 4) + data)
        out.extend(b"\0" * (-len(out) % 4))

    for ino, (name, data) in enumerate(sorted(files.items()), 1):
        entry(name, 0o100755 if name in executable else 0o100644, data,
              ino)
    entry("TRAILER!!!", 0, b"", 0)
    return bytes(out)


def wait_for(what, check, timeout, step=0.5):
    """check() until it answers something true, at most timeout s."""
    end = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > end:
            raise AssertionError("timed out after %ds waiting for %s"
                                 % (timeout, what))
        time.sleep(step)


class Store(object):
    """xenstore through Xen's own Python binding (xen.lowlevel.xs): one
    transaction with ACLs, as xenopsd's Xs.transaction (the xenstore-*
    tools cannot set permissions inside a transaction)."""

    def __init__(self):
        from xen.lowlevel import xs
        self.xs = xs.xs()

    def read(self, path):
        value = self.xs.read("", path)
        return None if value is None else value.decode()

    def rm(self, path):
        self.xs.rm("", path)

    def transaction(self, body):
        """body(t) in a transaction, retried while it conflicts (EAGAIN)."""
        for _ in range(50):
            t = self.xs.transaction_start()
            body(t)
            if self.xs.transaction_end(t, False):
                return
        raise AssertionError("xenstore transaction kept conflicting")

    def mkdirperms(self, t, path, owner, other_read=None):
        """xenopsd's mkdirperms: owner, others none, one domain's READ."""
        self.xs.mkdir(t, path)
        acl = [{"dom": owner, "read": False, "write": False}]
        if other_read is not None:
            acl.append({"dom": other_read, "read": True, "write": False})
        self.xs.set_permissions(t, path, acl)

    def writev(self, t, path, pairs):
        for key, value in pairs:
            self.xs.write(t, path + "/" + key, value.encode())


class Vbd3(object):
    """One vbd3 device of a guest, as xenopsd names its paths
    (device_common.ml:110-145,243-263; hotplug.ml:64-68)."""

    def __init__(self, store, domid, vm_uuid, devid=DEVID):
        self.store, self.domid, self.vm, self.devid = store, domid, \
            vm_uuid, devid
        # xvda, xvdb, ...: the Xen disk scheme (device_number.ml:56-58)
        self.dev = "xvd" + chr(ord("a") + ((devid - DEVID) >> 4))
        self.front = "/local/domain/%d/device/vbd/%d" % (domid, devid)
        self.front_ro = "/xenops/domain/%d/device/vbd/%d" % (domid, devid)
        self.back = "/local/domain/0/backend/vbd3/%d/%d" % (domid, devid)
        self.hotplug = "/xapi/%s/hotplug/%d/vbd3/%d" % (vm_uuid, domid, devid)
        self.private = "/xapi/%s/private/vbd3/%d" % (vm_uuid, devid)
        self.xenserver = "/local/domain/%d/xenserver/device/vbd3/%d" % (
            domid, devid)
        self.error = "/local/domain/%d/error/device/vbd/%d/error" % (
            domid, devid)

    def add(self, tapdev, sm_data, dp_id, vdi_id, vbd_id, mode="w"):
        """Device.Vbd.add's transaction (device.ml:118-164,642-740); mode
        "r" for a read-only VBD (string_of_mode, :401)."""
        back = [("frontend-id", str(self.domid)), ("online", "1"),
                ("removable", "1"), ("state", "1"), ("dev", self.dev),
                ("type", "phy"), ("mode", mode), ("params", tapdev),
                ("polling-duration", "8000"),
                ("polling-idle-threshold", "50")] + \
            [("sm-data/" + k, v) for k, v in sm_data]
        front = [("backend-id", "0"), ("state", "1"),
                 ("virtual-device", str(self.devid)),
                 ("device-type", "disk")]
        private = [("backend-kind", "vbd3"), ("backend-id", "0"),
                   ("dp-id", dp_id), ("vdi-id", vdi_id),
                   ("vbd3-id", vbd_id)]
        s, d = self.store, self.domid

        def body(t):
            if s.xs.read(t, self.front_ro) is not None:
                raise AssertionError("frontend already connected")
            for path in (self.front, self.front_ro, self.back):
                s.xs.rm(t, path)
            s.mkdirperms(t, self.front, d, 0)           # device_frontend
            s.mkdirperms(t, self.front_ro, 0)           # rwperm_for_guest 0
            s.mkdirperms(t, self.back, 0, d)            # device_backend
            s.mkdirperms(t, self.hotplug, 0)            # hotplug
            s.writev(t, self.front, [("backend", self.back)] + front)
            s.writev(t, self.front_ro, [("backend", self.back)])
            s.writev(t, self.back, [("frontend", self.front)] + back)
            s.mkdirperms(t, self.private, 0)
            s.writev(t, self.private, private)
            s.mkdirperms(t, self.xenserver, d)          # rwperm_for_guest d
        s.transaction(body)

    def block_add(self):
        """xapi's block script, ``add`` (v26.1.4 scripts/block:21-49)."""
        params = os.path.realpath(self.store.read(self.back + "/params"))
        st = os.stat(params)
        physical = "%x:%x" % (os.major(st.st_rdev), os.minor(st.st_rdev))
        if self.store.read(self.back + "/physical-device") is None:
            self.store.xs.write("", self.back + "/physical-device",
                                physical.encode())
        self.store.xs.write("", self.hotplug + "/hotplug", b"online")
        self.store.xs.write("", self.back + "/hotplug-status", b"connected")
        return physical

    def state(self, which):
        return self.store.read((self.front if which == "front" else
                                self.back) + "/state")

    def clean_shutdown(self, timeout=300):
        """Device.Generic.clean_shutdown (device.ml:214-232,269-328)."""
        s = self.store

        def body(t):
            s.xs.write(t, self.back + "/online", b"0")
            state = s.xs.read(t, self.back + "/state")
            if state is None or state.decode() != CLOSED:
                s.xs.write(t, self.back + "/state", b"5")
        s.transaction(body)

        def closed_or_unplugged():
            if s.read(self.error) is not None:
                raise AssertionError("the frontend refused the unplug: %s"
                                     % s.read(self.error))
            return s.read(self.front + "/state") in (CLOSED, None) or \
                s.read(self.back + "/hotplug-status") is None
        wait_for("the frontend to close", closed_or_unplugged, timeout)
        s.rm(self.front)
        s.rm(self.front_ro)
        # the unplug watch again: the frontend's state is gone now
        self.rm_device_state()

    def hard_shutdown(self, timeout=60):
        """Device.Generic.hard_shutdown (device.ml:335-366; Classic, since
        tapback offers no feature-shutdown-request, :393-397), as
        xenopsd's VM_shutdown unplugs a VBD: online=0, both frontends
        removed, a wait for the backend to be Closed (xenopsd waits up to
        its hotplug timeout and goes on either way), rm_device_state.
        Returns (the backend's state before, "closed" or "removed"):
        tapback removes the backend itself once the frontend is gone
        (frontend.c:517-541). A removed backend never reads Closed:
        xenopsd, which runs the hotplug scripts itself by default
        (xenopsd.ml:28, device.ml:345-353), would wait for it until its
        hotplug_timeout (300 s, xenopsd.ml:32; device.ml:355-366); this
        play goes on as soon as tapback removed it."""
        s = self.store
        before = s.read(self.back + "/state")
        s.xs.write("", self.back + "/online", b"0")
        s.rm(self.front)
        s.rm(self.front_ro)

        def closed_or_removed():
            state = s.read(self.back + "/state")
            return "closed" if state == CLOSED else \
                "removed" if state is None else None
        outcome = wait_for("the backend closed or removed",
                           closed_or_removed, timeout)
        self.rm_device_state()
        return before, outcome

    def rm_device_state(self):
        """device.ml:184-192."""
        for path in (self.front_ro, self.front, self.back,
                     "/local/domain/0/error/backend/vbd3/%d/%d" % (
                         self.domid, self.devid),
                     os.path.dirname(self.error)):
            self.store.rm(path)

    def release(self):
        """Device.Vbd.release (device.ml:591-604), Hotplug.release
        (hotplug.ml:279-300), and the block script's ``remove``
        (scripts/block:54-60) that the backend's removal fires."""
        self.store.rm(self.back)
        self.store.rm(self.hotplug)
        self.store.rm(self.private)
        self.store.rm(self.xenserver)


def xl(*args, **kwargs):
    return sh("xl", *args, **kwargs)


def domains():
    """``xl list`` rows: (name, domid)."""
    rows = xl("list").splitlines()[1:]
    return [(r.split()[0], int(r.split()[1])) for r in rows if r.strip()]


def tap_list():
    return [line for line in sh("tap-ctl", "list").splitlines()
            if line.strip()]


def tapback_slaves():
    return [int(m.group(1)) for m in
            (re.search(r"tapback .*-x (\d+)", line) for line in
             sh("ps", "-eo", "args").splitlines()) if m]


def console(name):
    path = os.path.join(CONSOLE_DIR, "guest-%s.log" % name)
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def domu_says(name, key):
    m = re.search(r"ZFSNG-DOMU %s ([0-9a-f]{64})" % key, console(name))
    return m and m.group(1)


def kernel_complaints():
    pattern = re.compile(r"\] (WARNING: CPU: \d+ PID:|BUG: |Oops: |"
                         r"general protection fault)")
    return [line for line in sh("dmesg").splitlines()
            if pattern.search(line)]


@pytest.fixture
def xen_host():
    """This guest is a Xen dom0 with its services up (run.sh --xen)."""
    with open("/proc/xen/capabilities") as f:
        assert "control_d" in f.read()
    assert [n for n, _ in domains()] == ["Domain-0"]
    assert sh("pgrep", "-x", "tapback").split()
    store = Store()
    yield store
    # whatever the test left: its domUs and their vbd3 backends (the disks
    # fixture then ends the tapdisks and destroys the pool)
    for name, domid in domains():
        if domid != 0:
            xl("destroy", str(domid), check=False)
            store.rm("/local/domain/0/backend/vbd3/%d" % domid)


def test_a_pv_guest_writes_and_reads_its_zfs_ng_disk_through_tapback(
        xen_host, plugin, dp, sr, tmp_path):
    store = xen_host
    t0 = time.monotonic()
    marks = []

    def mark(what):
        marks.append((what, time.monotonic() - t0))
        print("xen-vm: %-34s +%.1fs" % (what, marks[-1][1]), flush=True)

    vol = new_vdi(plugin, sr)
    zvol = "/dev/zvol/" + dataset(vol)
    sh("udevadm", "settle")
    before, pattern = seeded(1041), seeded(41)
    assert dd_write(zvol, before, offset=SPAN) == (0, "")
    mark("VDI made, dom0 wrote its data")

    # The domU's initramfs: the layer's, then the pattern (4-byte aligned:
    # the kernel reads a following uncompressed archive only there).
    with open(DOMU_INITRD, "rb") as f:
        base = f.read()
    initrd = tmp_path / "domu-initrd"
    initrd.write_bytes(base + b"\0" * (-len(base) % 4) +
                       cpio_newc({"pattern.bin": pattern}))
    name = "zfsng-domu"
    cfg = tmp_path / "domu.cfg"
    cfg.write_text("\n".join([
        'name = "%s"' % name, 'type = "pv"',
        'kernel = "/boot/vmlinuz-%s"' % os.uname().release,
        'ramdisk = "%s"' % initrd, 'extra = "console=hvc0 loglevel=4"',
        "memory = 256", "vcpus = 1", 'on_crash = "preserve"', ""]))
    xl("create", "-p", str(cfg), timeout=300)
    domid = int(xl("domid", name).strip())
    vm_uuid = store.read(store.read("/local/domain/%d/vm" % domid) +
                         "/uuid")
    assert vm_uuid, "no VM uuid for domain %d" % domid
    mark("domU %d built, paused" % domid)

    # xapi's VM.start for the VBD: open, attach, activate (xapi-storage-
    # script), the domain a guest's domid.
    domain = domain_of("vbd/%d/xvda" % domid, str(domid))
    assert domain == str(domid)

    def call(method, **args):
        fresh = plugin("Volume.stat", sr=sr, key=vol["key"])
        return dp(method, uri=uri(fresh), **args)

    call("Datapath.open", persistent=True)
    answer = call("Datapath.attach", domain=domain)
    xendisk, block = answer["implementations"][:2]
    assert xendisk[0] == "XenDisk" and xendisk[1]["backend_type"] == "vbd3"
    tapdev = block[1]["path"]      # xenopsd's params (params_of_backend)
    call("Datapath.activate", domain=domain)
    assert len(tap_list()) == 1
    mark("datapath attached and active")

    vbd = Vbd3(store, domid, vm_uuid)
    sm_data = [("backend-kind", "vbd3")] + sorted(xendisk[1]["extra"].items())
    vbd.add(tapdev, sm_data, dp_id="vbd/%d/xvda" % domid,
            vdi_id=json.dumps(["VDI", "%s/%s" % (sr, vol["key"])]),
            vbd_id=json.dumps(["%s.vbd0" % vm_uuid, "xvda"]))
    store.xs.write("", vbd.back + "/vdi",
                   json.dumps(["VDI", "%s/%s" % (sr, vol["key"])]).encode())
    physical = vbd.block_add()
    assert physical.startswith("%x:" % os.major(os.stat(tapdev).st_rdev))
    # tapback answers hotplug-status with InitWait (frontend.c:441-444)
    wait_for("backend InitWait", lambda: vbd.state("back") == "2", 60)
    mark("vbd3 plugged, backend InitWait")

    xl("unpause", str(domid))
    wait_for("backend and frontend Connected",
             lambda: vbd.state("back") == "4" and vbd.state("front") == "4",
             600, step=1)
    assert store.read(vbd.back + "/sectors") == str(64 * MiB // 512)
    mark("blkfront connected")
    wait_for("the domU's read-back",
             lambda: domu_says(name, "read-back") or
             "ERROR" in console(name), 900, step=2)
    log = console(name)
    print(log, flush=True)
    assert "ERROR" not in log
    mark("domU wrote and read back")
    assert domu_says(name, "read-before") == sha(before)
    assert domu_says(name, "read-back") == sha(pattern)
    # tapback 3.55.5 advertises no feature-discard (frontend.c
    # connect_frontend), so blkfront gives xvda no discard: a guest's
    # fstrim fails (EOPNOTSUPP) and frees nothing on the zvol. It does
    # advertise feature-barrier, so blkfront declares a write-back cache
    # and sends the guest's flushes, as barriers (README "Discard")
    queue = re.search(r"ZFSNG-DOMU queue discard_max_bytes=(\d+) "
                      r"write_cache=(\S+)", log)
    assert queue and queue.groups() == ("0", "write_back"), queue and \
        queue.groups()

    # VBD.unplug: the clean shutdown, then release; the domU sees xvda go
    # and powers off; xl reaps it (on_poweroff destroy).
    vbd.clean_shutdown()
    vbd.release()
    mark("vbd3 unplugged")
    wait_for("the domU to end", lambda: name not in
             [n for n, _ in domains()], 300, step=1)
    assert "xvda unplugged" in console(name)
    # Domain.destroy: the domain's backend dirs (domain.ml:909-926); the
    # tapback slave for it ends (backend.c:1234-1248)
    store.rm("/local/domain/0/backend/vbd3/%d" % domid)
    wait_for("tapback's slave to end", lambda: domid not in tapback_slaves(),
             60)
    mark("domU gone")

    call("Datapath.deactivate", domain=domain)
    call("Datapath.detach", domain=domain)
    call("Datapath.close")
    mark("datapath detached")

    assert [n for n, _ in domains()] == ["Domain-0"]     # no zombie
    assert tap_list() == []                               # tapdisk closed
    assert states() == []
    assert store.read("/local/domain/0/backend/vbd3/%d" % domid) is None
    assert dd_hash(zvol, SPAN, 0) == sha(pattern)
    assert dd_hash(zvol, SPAN, SPAN) == sha(before)
    assert kernel_complaints() == []
    mark("zvol checked")
