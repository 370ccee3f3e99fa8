"""What the datapath tests share (test_datapath.py, test_tapdisk.py): the
domains xapi sends, URIs, O_DIRECT reads and writes compared by sha256,
and the calls xapi makes for a dom0 attach."""

import hashlib
import mmap
import os
import random
import subprocess

from conftest import DATAPATH_STATE_DIR as STATE_DIR, sh
from xapi_flows import domain_of

MiB = 1 << 20
SIZE = 64 * MiB
DATA = 4 * MiB
# The domains xapi sends (main.ml domain_of): dom0 for an export, import or
# copy (a fresh uuid as the dp), dom0 for a VBD plugged into it, a guest
DOM0 = domain_of("3f0c5a6e-9d1b-4c2a-8e7f-5b6a4c3d2e1f", "0")
DOM0_VBD = domain_of("vbd/0/xvda", "0")
GUEST = domain_of("vbd/5/xvda", "5")


def uri(vol):
    (u,) = vol["uri"]
    assert u.startswith("zfs-ng:///")
    return u


def dataset(vol):
    return uri(vol)[len("zfs-ng:///"):]


def twice(dp, method, **args):
    """Every call twice in a row: the second is no error, same answer."""
    first = dp(method, **args)
    second = dp(method, **args)
    assert first == second, (method, first, second)
    return first


def pattern(seed):
    rnd = random.Random(seed)
    return bytes(rnd.getrandbits(8) for _ in range(64 * 1024)) * \
        (DATA // (64 * 1024))


def dd_write(path, data, offset=0):
    """Write data at offset (whole MiB) with O_DIRECT (as tapdisk
    writes), then fsync."""
    proc = subprocess.run(["dd", "of=" + path, "bs=1M", "iflag=fullblock",
                           "seek=%d" % (offset // MiB), "oflag=direct",
                           "conv=fsync,notrunc", "status=none"],
                          input=data, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=300)
    return proc.returncode, proc.stderr.decode()


def dd_hash(path, size=DATA, offset=0):
    """sha256 of size bytes at offset (whole MiB), read with O_DIRECT."""
    proc = subprocess.run(["dd", "if=" + path, "bs=1M",
                           "skip=%d" % (offset // MiB),
                           "count=%d" % (size // MiB), "iflag=direct",
                           "status=none"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(proc.stdout) == size
    return hashlib.sha256(proc.stdout).hexdigest()


def write_direct(path, writes):
    """(offset, bytes) writes with O_DIRECT, as tapdisk and xapi's copy
    tools write (whole sectors reach the device, not whole 4 KiB pages),
    then fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        for offset, data in writes:
            buf = mmap.mmap(-1, len(data))
            buf.write(data)
            try:
                assert os.pwrite(fd, buf, offset) == len(data)
            finally:
                buf.close()
        os.fsync(fd)
    finally:
        os.close(fd)


def sha(data):
    return hashlib.sha256(data).hexdigest()


def zfs_names(sr):
    return sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r",
              sr).split()


def states():
    return sorted(os.listdir(STATE_DIR)) if os.path.isdir(STATE_DIR) \
        else []


def attach_dom0(dp, vol, readonly=False, domain=DOM0, call=twice):
    result = call(dp, "Datapath.attach", uri=uri(vol), domain=domain)
    call(dp, "Datapath.activate_readonly" if readonly else
         "Datapath.activate", uri=uri(vol), domain=domain)
    (impl,) = result["implementations"]
    assert impl[0] == "BlockDevice"
    return impl[1]["path"]


def detach_dom0(dp, vol, domain=DOM0, call=twice):
    call(dp, "Datapath.deactivate", uri=uri(vol), domain=domain)
    call(dp, "Datapath.detach", uri=uri(vol), domain=domain)


def once(dp, method, **args):
    """One call (where repeating each proves nothing new, and the guest
    is slow)."""
    return dp(method, **args)


def new_vdi(plugin, sr):
    """A VDI of SIZE bytes."""
    return plugin("Volume.create", sr=sr, name="disk", description="",
                  size=SIZE, sharable=False)

