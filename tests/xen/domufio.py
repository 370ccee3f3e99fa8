"""fio inside a Xen PV domU, driven from dom0 over the domU's console:
what the VM fio benchmark (tests/bench/bench_vm_fio.py) and the tests
of a VM moved while fio runs (test_xen_vm_migrate.py) share.

The domU's init is tests/xen/vm-fio-domu, a command loop: it prints
"ready <n>" and reads one line from hvc0, which dom0 writes to the
console's pty (Console.command). fio and its shared libraries (Debian's
fio is dynamically linked) are packed into the domU's initramfs at run
time from dom0's own files (fio_files): no image rebuild.

Nothing here imports Xen's bindings at import time (the unit tests load
it without Xen); fio_vm_class() does.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import termios
import time
import tty

HERE = os.path.dirname(os.path.abspath(__file__))
DOMU_MEMORY = 768     # MiB: the initramfs holds fio and its libraries
RESULT_TIMEOUT = 900
OPTION = re.compile(r"^[A-Za-z0-9=_.:,/-]+$")


def xen_paths():
    """tests/xen's modules (and the integration suite's, which they
    import) and Xen's Python bindings on sys.path."""
    for path in (HERE, os.path.join(HERE, "..", "integration"),
                 "/usr/lib/xen-4.17/lib/python"):
        if path not in sys.path:
            sys.path.insert(0, path)


def fio_vm_class(memory=DOMU_MEMORY):
    """xenops.Vm booting tests/xen/vm-fio-domu with memory MiB, and able
    to plug a bare tapdev (the VHDs: SMAPIv1's, no zfs-ng Datapath
    calls) the way it plugs a zfs-ng VDI's."""
    xen_paths()
    import xenops
    from test_xen_vm import Vbd3, wait_for

    class FioVm(xenops.Vm):
        INIT = os.path.join(HERE, "vm-fio-domu")
        MEMORY = memory

        def call(self, disk, method, **args):
            if getattr(disk, "tapdev", None):
                return None     # not a zfs-ng VDI: no Datapath call
            return xenops.Vm.call(self, disk, method, **args)

        def _plug(self, disk, epoch_begin=True):
            if not getattr(disk, "tapdev", None):
                return xenops.Vm._plug(self, disk, epoch_begin)
            vbd = Vbd3(self.store, self.domid, self.uuid, disk.devid)
            # one VDI id per tapdev: vhd-file and vhd-ext4 in one VM
            vdi = "vhd-" + os.path.basename(disk.tapdev)
            vdi_id = json.dumps(["VDI", vdi])
            vbd.add(disk.tapdev, [("backend-kind", "vbd3"),
                                  ("vdi-uuid", vdi)],
                    dp_id="vbd/%d/%s" % (self.domid, vbd.dev),
                    vdi_id=vdi_id,
                    vbd_id=json.dumps(["%s.vbd%d" % (
                        self.uuid, self.disks.index(disk)), vbd.dev]))
            self.store.xs.write("", vbd.back + "/vdi", vdi_id.encode())
            vbd.block_add()
            wait_for("%s's backend InitWait or on" % vbd.dev,
                     lambda: vbd.state("back") in ("2", "3", "4"), 60)
            disk.vbd = vbd
    return FioVm


def fio_files():
    """{initramfs name: bytes} of dom0's fio and every shared library ldd
    finds for it (into /lib: the domU's init sets LD_LIBRARY_PATH; the
    dynamic loader is the domU initramfs's own, busybox's), and the
    libraries' bytes."""
    fio = shutil.which("fio")
    if not fio:
        raise RuntimeError("no fio in dom0 (the guest image's)")
    out = subprocess.run(["ldd", fio], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, timeout=60, check=True)
    libs = re.findall(r"(/\S+) \(0x[0-9a-f]+\)", out.stdout.decode())
    files = {}
    with open(fio, "rb") as f:
        files["bin/fio"] = f.read()
    total = 0
    for lib in libs:
        if os.path.basename(lib).startswith("ld-linux"):
            continue
        with open(os.path.realpath(lib), "rb") as f:
            data = f.read()
        files["lib/" + os.path.basename(lib)] = data
        total += len(data)
    return files, total


def verified(text):
    """fio's report from "<sha256> <json>" if the json's sha256 is the
    one printed with it, else None."""
    sha, _, body = text.partition(" ")
    if hashlib.sha256(body.encode()).hexdigest() != sha:
        return None
    try:
        return json.loads(body[body.index("{"):])
    except ValueError:
        return None


class Pty(object):
    """The domU's console as dom0 writes to it: xenconsoled's pty (its
    slave side, xenstore console/tty, as ``xl console`` opens it), raw,
    so a line reaches hvc0 as written; what comes back (the domU's
    output, also in xenconsoled's log) is drained and dropped."""

    def __init__(self, store, domid, timeout=60):
        from test_xen_vm import wait_for
        path = wait_for("the console's pty", lambda: store.read(
            "/local/domain/%d/console/tty" % domid), timeout)
        self.fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        tty.setraw(self.fd, termios.TCSANOW)

    def send(self, line):
        data = (line + "\n").encode()
        end = time.monotonic() + 30
        while data:
            self.drain()
            try:
                data = data[os.write(self.fd, data):]
            except BlockingIOError:
                if time.monotonic() > end:
                    raise RuntimeError("the domU's console takes no input")
                time.sleep(0.1)

    def drain(self):
        while True:
            try:
                if not os.read(self.fd, 65536):
                    return
            except (BlockingIOError, OSError):
                return

    def close(self):
        os.close(self.fd)


class Console(object):
    """vm-fio-domu's command loop, seen from dom0: commands written to
    the current domain's pty (open() again once the VM runs in another
    domain: a resumed or moved VM), lines read from the VM's console
    logs of this boot (xenops.Vm.lines). ``log``: where a garbled report
    is told."""

    def __init__(self, vm, log=print):
        self.vm, self.log = vm, log
        self.pty = None
        self.sent = 0

    def open(self):
        """The pty of the VM's current domain."""
        self.close()
        self.pty = Pty(self.vm.store, self.vm.domid)

    def close(self):
        if self.pty:
            self.pty.close()
            self.pty = None

    def wait_line(self, match, timeout, count=1):
        """Until the domU printed count lines match() accepts (or an
        ERROR line: raised); returns this boot's lines."""
        from test_xen_vm import console
        end = time.monotonic() + timeout
        while True:
            if self.pty:
                self.pty.drain()
            lines = self.vm.lines()
            errors = [l for l in lines if l.startswith("ERROR")]
            if errors:
                raise RuntimeError("the domU: %s\n%s" % (
                    "; ".join(errors), console(self.vm.console)[-3000:]))
            if sum(1 for l in lines if match(l)) >= count:
                return lines
            if time.monotonic() > end:
                raise RuntimeError("timed out after %ds waiting for the "
                                   "domU; its console:\n%s" % (
                                       timeout,
                                       console(self.vm.console)[-3000:]))
            time.sleep(0.3)

    def command(self, words):
        """One command to the domU, once it said it is ready for it."""
        for w in words:
            if not OPTION.match(w):
                raise ValueError("not a word for the domU: %r" % w)
        self.sent += 1
        self.wait_line(lambda l: l == "ready %d" % self.sent, 600)
        self.pty.send(" ".join(words))

    def result(self, tag, tries=3, timeout=RESULT_TIMEOUT):
        """fio's JSON report of the run tag, as the domU printed it; a
        line whose sha256 is not the one printed with it (cut or mixed
        on its way through the console) is asked for again."""
        prefix = "result %s " % tag
        for attempt in range(1, tries + 1):
            lines = self.wait_line(lambda l: l.startswith(prefix),
                                   timeout, count=attempt)
            got = [l for l in lines if l.startswith(prefix)][attempt - 1]
            report = verified(got[len(prefix):])
            if report is not None:
                return report
            self.log("domufio: %s's report came through the console "
                     "garbled, asking again" % tag)
            self.command(["show", tag])
        raise RuntimeError("fio's report of %s garbled %d times" % (
            tag, tries))

    def sha(self, disk, size, timeout=600):
        """The sha256 of the first size bytes of the domU's disk, as the
        domU reads them (its page cache dropped first)."""
        tag = "sha%d" % (self.sent + 1)
        self.command(["sha", tag, disk, str(size)])
        lines = self.wait_line(lambda l: l.startswith("sha %s " % tag),
                               timeout)
        (line,) = [l for l in lines if l.startswith("sha %s " % tag)]
        m = re.match(r"sha %s %s ([0-9a-f]{64})$" % (tag, disk), line)
        if not m:
            raise RuntimeError("the domU's sha line: %r" % line)
        return m.group(1)
