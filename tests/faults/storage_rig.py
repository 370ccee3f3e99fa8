"""The storage scenarios' tools: device-mapper maps over the guest's spare
disks whose tables are switched at run time, an SR built on them through
the plugin, zvols written and hashed, a recording fake ``xe``, and a
clean-up that leaves the disks blank whatever the scenario did.

Everything here runs inside the test guest as root; every command has a
bound, so a scenario on a dead pool ends instead of hanging the campaign.
"""

import glob
import hashlib
import mmap
import os
import re
import subprocess
import threading
import time
import uuid

MiB = 1 << 20
DM_PREFIX = "zfsng-fault-"
RUN_DIR = "/tmp/zfsng-faults-run"     # the plugin's locks and health files
XE = "/opt/xensource/bin/xe"

# A fake xe: records its arguments (tab-separated, one line a call) and
# returns at once; the plugin starts it detached and never waits for it.
FAKE_XE = """#!/bin/sh
(IFS='\t'; printf '%%s\\n' "$*") >> %(log)s
exit 0
"""


def sh(*argv, check=True, timeout=120):
    """Run a command for the scenario itself; return its stdout.

    A command past its bound is killed and, if the kill does not end it
    (a zpool command stuck in the kernel on a wedged pool), abandoned, so
    that the scenario goes on: it raises AssertionError (with the kernel
    stack of the stuck command) unless check is False."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            STUCK.append((" ".join(argv), proc.pid, kernel_stack(proc.pid)))
            if check:
                raise AssertionError("%s: no answer within %d s, stuck in "
                                     "the kernel: %s" % (
                                         " ".join(argv), timeout,
                                         STUCK[-1][2]))
            return ""
        if check:
            raise AssertionError("%s: no answer within %d s" % (
                " ".join(argv), timeout))
        return ""
    if check and proc.returncode != 0:
        raise AssertionError("%s failed (%d): %s" % (
            " ".join(argv), proc.returncode, err.decode().strip()))
    return out.decode()


STUCK = []      # (command, pid, kernel stack) of commands left stuck
# Why this guest's ZFS can no longer be used ("" while it can): a pool
# that zpool clear could not resume holds its disk and blocks zpool.
WEDGED = ""


def kernel_stack(pid):
    try:
        with open("/proc/%d/stack" % pid) as f:
            # "[<0>] txg_wait_synced+0x10/0x40 [zfs]": the function
            return " < ".join(line.split()[1].split("+")[0]
                              for line in f.read().splitlines()[:8]
                              if len(line.split()) > 1)
    except (IOError, OSError, IndexError):
        return "?"


def leaf_state(pool, path):
    """The state zpool status gives the leaf path (None if not listed)."""
    for line in sh("zpool", "status", "-P", pool, check=False,
                   timeout=60).splitlines():
        words = line.split()
        if len(words) >= 2 and (words[0] == path or words[-1] == path):
            return words[1]
    return None


def spare_disks():
    disks = sorted((p for p in glob.glob("/dev/disk/by-id/virtio-zfsng-d*")
                    if re.match(r".*-d[0-9]+$", p)),
                   key=lambda p: int(p.rsplit("d", 1)[1]))
    return disks


def sectors_of(device):
    return int(sh("blockdev", "--getsz", device).strip())


class Dm(object):
    """/dev/mapper/<DM_PREFIX><name>: a linear map of part of a disk, whose
    table can be swapped for the error target, a delay, or removed."""

    def __init__(self, name, disk, sectors=None, start=0):
        self.name = DM_PREFIX + name
        self.disk = os.path.realpath(disk)
        self.start = start
        self.sectors = sectors or sectors_of(disk) - start
        self.path = "/dev/mapper/" + self.name
        self.table = None
        _MAPS[self.name] = self

    def linear_table(self):
        return "0 %d linear %s %d" % (self.sectors, self.disk, self.start)

    def create(self):
        sh("dmsetup", "create", self.name, "--table", self.linear_table())
        self.table = "linear"
        sh("udevadm", "settle", timeout=60, check=False)
        return self

    def exists(self):
        return subprocess.call(["dmsetup", "info", self.name],
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=60) == 0

    def load(self, table, kind):
        sh("dmsetup", "suspend", self.name, timeout=60)
        try:
            sh("dmsetup", "load", self.name, "--table", table, timeout=60)
        finally:
            sh("dmsetup", "resume", self.name, timeout=60)
        self.table = kind

    def linear(self):
        self.load(self.linear_table(), "linear")

    def error(self):
        self.load("0 %d error" % self.sectors, "error")

    def delay(self, ms):
        """Every read and write waits ms milliseconds (dm-delay)."""
        self.load("0 %d delay %s %d %d" % (self.sectors, self.disk,
                                            self.start, ms), "delay")

    def pull(self):
        """Take the device away as a pulled disk goes: its table fails
        every I/O and its node is removed once its last opener closes it
        (at once if nobody holds it)."""
        sh("dmsetup", "remove", "--force", self.name, check=False,
           timeout=60)
        if self.exists():
            sh("dmsetup", "remove", "--deferred", self.name, check=False,
               timeout=60)
        self.table = "pulled"


_MAPS = {}      # name -> Dm: every map made in this process


def our_maps():
    """Names of our maps that exist now."""
    return [line.split()[0] for line in
            sh("dmsetup", "ls", check=False, timeout=60).splitlines()
            if line.startswith(DM_PREFIX)]


def pools_of(paths):
    """Imported pools with a leaf among paths (real paths compared)."""
    real = set(os.path.realpath(p) for p in paths)
    found = []
    for pool in sh("zpool", "list", "-H", "-o", "name",
                   check=False, timeout=60).split():
        for leaf in leaves(pool):
            path = os.path.realpath(leaf)
            if any(path == r or path.startswith(r) for r in real) or \
                    leaf.startswith("/dev/mapper/" + DM_PREFIX):
                found.append(pool)
                break
    return found


def leaves(pool):
    """Leaf vdev paths of a pool, as zpool names them (-P)."""
    rows = sh("zpool", "list", "-v", "-H", "-P", "-o", "name", pool,
              check=False, timeout=60)
    return [line.strip().split("\t")[0] for line in rows.splitlines()
            if line.strip().startswith("/")]


def pool_health(pool):
    return sh("zpool", "list", "-H", "-o", "health", pool, check=False,
              timeout=60).strip()


def wait_health(pool, wanted, bound, poke=None):
    """Wait (at most bound seconds) until the pool's health is one of
    wanted; poke() is called between two looks (to make I/O happen).
    Returns (health, seconds)."""
    start = time.monotonic()
    health = pool_health(pool)
    while health not in wanted and time.monotonic() - start < bound:
        if poke:
            poke()
        time.sleep(1)
        health = pool_health(pool)
    return health, time.monotonic() - start


def wipe_all(disks):
    """Leave the disks blank: our pools destroyed, our maps removed,
    labels and signatures wiped. Every step bounded and allowed to fail."""
    names = our_maps()
    for name in names:      # a faulted map gets its disk back first
        if name in _MAPS and _MAPS[name].table != "linear":
            try:
                _MAPS[name].linear()
            except AssertionError:
                pass
    for pool in pools_of(disks + ["/dev/mapper/" + n for n in names]):
        sh("zpool", "clear", pool, check=False, timeout=120)
        sh("zpool", "destroy", "-f", pool, check=False, timeout=180)
    for name in names:
        sh("dmsetup", "remove", "--retry", "--force", name, check=False,
           timeout=60)
    for disk in disks:
        real = os.path.realpath(disk)
        for part in glob.glob(real + "[0-9]*"):
            sh("zpool", "labelclear", "-f", part, check=False, timeout=60)
        sh("zpool", "labelclear", "-f", real, check=False, timeout=60)
        sh("wipefs", "-a", real, check=False, timeout=60)
    sh("udevadm", "settle", check=False, timeout=60)


class FakeXe(object):
    """A recording /opt/xensource/bin/xe for the scenario's span (none if
    a real one exists: then messages() is None)."""

    def __init__(self, log):
        self.log = log
        self.mine = not os.path.exists(XE)
        if self.mine:
            os.makedirs(os.path.dirname(XE), exist_ok=True)
            with open(XE, "w") as f:
                f.write(FAKE_XE % {"log": log})
            os.chmod(XE, 0o755)

    def messages(self, count=0, wait=20.0):
        """The messages sent so far ({arg: value} each), waiting up to
        wait seconds for count of them."""
        if not self.mine:
            return None
        deadline = time.monotonic() + wait
        while True:
            lines = open(self.log).read().splitlines() \
                if os.path.exists(self.log) else []
            if len(lines) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return [dict(a.split("=", 1) for a in line.split("\t")[1:]
                     if "=" in a) for line in lines]

    def remove(self):
        if self.mine and os.path.exists(XE):
            os.remove(XE)


def zvol(sr, key):
    return "/dev/zvol/%s/%s" % (sr, key)


def wait_zvol(sr, key, bound=90.0):
    path = zvol(sr, key)
    deadline = time.monotonic() + bound
    sh("udevadm", "settle", check=False, timeout=60)
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError("%s did not appear in %.0f s" % (path,
                                                                   bound))
        time.sleep(0.5)
    return path


def drop_caches():
    sh("sync", check=False, timeout=120)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def sha(path, length):
    """sha256 of the first length bytes of a block device (None if it
    cannot be read)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb", buffering=0) as f:
            left = length
            while left:
                chunk = f.read(min(left, 4 * MiB))
                if not chunk:
                    return None
                digest.update(chunk)
                left -= len(chunk)
    except OSError:
        return None
    return digest.hexdigest()


class DirectFile(object):
    """A zvol opened for O_DIRECT writes of whole MiB from one aligned
    buffer: each write reaches ZFS (no page cache), and a write ZFS
    refuses fails at once with its errno."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        self.buf = mmap.mmap(-1, MiB)

    def write(self, offset, data):
        assert len(data) == MiB
        self.buf.seek(0)
        self.buf.write(data)
        written = os.pwrite(self.fd, self.buf, offset)
        if written != MiB:
            raise OSError(5, "short write (%d)" % written)

    def close(self):
        os.close(self.fd)
        self.buf.close()


class Image(object):
    """A VDI's expected content, kept in memory as it is written."""

    def __init__(self, sr, key, size):
        self.sr, self.key, self.size = sr, key, size
        self.data = bytearray(size)

    def digest(self):
        return hashlib.sha256(self.data).hexdigest()

    def fill(self, rnd):
        """Write the whole VDI with rnd's bytes."""
        f = DirectFile(wait_zvol(self.sr, self.key))
        try:
            for off in range(0, self.size, MiB):
                data = rnd.randbytes(MiB)
                f.write(off, data)
                self.data[off:off + MiB] = data
        finally:
            f.close()

    def read_digest(self):
        return sha(zvol(self.sr, self.key), self.size)


class Writer(threading.Thread):
    """Rewrites random MiB blocks of the images until stopped; the images
    follow every write that returned. A failed write is kept (errors)."""

    def __init__(self, images, rnd, pause=0.0):
        threading.Thread.__init__(self, daemon=True)
        self.images, self.rnd, self.pause = images, rnd, pause
        self.stop = threading.Event()
        self.writes = 0
        self.errors = []

    def run(self):
        files = {}
        try:
            while not self.stop.is_set():
                image = self.rnd.choice(self.images)
                off = self.rnd.randrange(image.size // MiB) * MiB
                data = self.rnd.randbytes(MiB)
                try:
                    if image.key not in files:
                        files[image.key] = DirectFile(
                            zvol(image.sr, image.key))
                    files[image.key].write(off, data)
                except OSError as exc:
                    self.errors.append("%s@%d: %s" % (image.key, off, exc))
                    # the block's content is now unknown
                    image.data[off:off + MiB] = b"?" * MiB
                    time.sleep(1)
                    continue
                image.data[off:off + MiB] = data
                self.writes += 1
                if self.pause:
                    time.sleep(self.pause)
        finally:
            for f in files.values():
                f.close()

    def finish(self, bound=120.0):
        self.stop.set()
        self.join(bound)
        return not self.is_alive()


def new_uuid():
    return str(uuid.uuid4())


def timed(book, method, **args):
    """(result, error name or None, seconds) of one plugin call; a call
    that escaped the ledger's bound is ("hung", seconds)."""
    start = time.monotonic()
    try:
        result, error = book.attempt(method, **args)
    except AssertionError:
        result, error = None, "hung"
    return result, error, time.monotonic() - start
