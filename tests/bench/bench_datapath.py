"""Datapath: the zvol zfs-ng hands to tapdisk, against SMAPIv1's files.

Every backend lives on the SAME pool, is filled completely with
incompressible data, then measured with fio (libaio, O_DIRECT) without and
with a snapshot present:

- ``zvol``: a VDI made through the plugin, fio on ``/dev/zvol/<vdi>``: the
  node zfs-ng's datapath gives tapdisk (``tap-ctl open -a aio:``, which
  opens it with O_DIRECT).
- ``raw-file``: a raw file on a filesystem dataset ``<pool>/bench-files``
  with the SR's compression (lz4) and otherwise ZFS defaults (recordsize
  128K, atime on: what the SMAPIv1 ZFS SR gets on the dataset an admin
  makes for it); fio on the file, as tapdisk's aio driver opens a raw VDI.
- ``vhd-nbd``: a dynamic VHD (``qemu-img create -f vpc -o
  subformat=dynamic``, 2 MiB blocks, each behind a 512-byte bitmap, so the
  data is not 4K-aligned in the file) on that dataset, served by ``qemu-nbd
  --cache=none --aio=native`` as ``/dev/nbdN``: SMAPIv1's default format,
  copy-on-write on copy-on-write. qemu's vpc driver maps and allocates
  blocks as tapdisk's vhd driver does, but cannot make differencing VHDs,
  so the snapshot state is a ZFS snapshot of the dataset, not a VHD chain
  (which would add a parent lookup to every read of unwritten blocks).
- ``zvol-nbd``: a second plugin VDI behind the same qemu-nbd with the same
  flags, raw. A control, not a product: on XCP-ng every backend reaches the
  guest through a user-space tapdisk, here only the VHD goes through a
  user-space server. ``ratio_to_zvol_nbd`` (vhd-nbd / zvol-nbd) is the cost
  of the VHD format alone; ``ratio_to_zvol`` also counts the NBD hop, which
  is expensive under TCG. Measured without a snapshot only (its role is
  the transport; the budget is the guest's).

Why O_DIRECT everywhere: tapdisk opens with O_DIRECT unless told not to
(``-D``), and SMAPIv1's blktap2.py only drops it (for read caching) on NFS,
EXT and SMB SRs; the ZFS SR gets O_DIRECT (reason SR_NOT_SUPPORTED), and
zfs-ng's datapath opens the zvol with O_DIRECT. So fio uses ``--direct=1``
on all four, qemu-nbd ``--cache=none`` (O_DIRECT on the image) with
``--aio=native`` (Linux AIO, as tapdisk's). What O_DIRECT does depends on
the ZFS version: OpenZFS 2.1 (what XCP-ng 8.3 ships) accepts it on files
and ignores it (the I/O goes through the ARC, and AIO submission on a ZFS
file is synchronous); 2.3 has real Direct IO on files (``direct=standard``):
page-aligned reads bypass the ARC and read whole records from disk, and
whole-record writes bypass it too. On a zvol O_DIRECT only skips the page
cache: the data always goes through the ARC.

Workloads: 4k random read and write at iodepth 128, 4M sequential read and
write at iodepth 4; fio's random buffers refilled for every I/O, so lz4
compresses nothing. No ramp: the devices are warm from the fill, and
counting every I/O lets fio's bytes be compared with the pool disk's. Write
figures include the ``zpool sync`` that follows the run: without it a short
run only measures how fast ZFS absorbs dirty data in memory. Each run
starts with a ``zpool sync`` so it does not pay for the previous one.
``disk_read_per_byte`` / ``disk_written_per_byte``: bytes the pool's disks
read / wrote (``/sys/class/block/*/stat``) per byte fio moved: read and
write amplification, which does not depend on how slow the emulated CPU is.

Snapshot state: one snapshot of the fully written data before the reads,
and a fresh one before every write run, so every write run starts with all
blocks referenced by a snapshot (copy-on-write of referenced blocks, not
of blocks an earlier run already unshared). zvol snapshots are
``Volume.snapshot`` through the plugin, the files a ZFS snapshot of the
dataset.

Repeats are interleaved (run 1 of every backend, then run 2...) so that a
burst of host load hits all backends alike. Every figure is also given as a
ratio to the zvol's median in the same state and workload. Absolute figures
under QEMU TCG mean nothing; the devices are small, so zvol reads are ARC
hits (``arc`` per read result).
"""

import os
import time

import common
from measure import (FIO_FLAGS, MIB, arcstats, fill, io_run, pool_disks,
                     zfs_props)

# name, fio rw, block size, iodepth
WORKLOADS = [
    ("randread-4k", "randread", "4k", 128),
    ("seqread-4M", "read", "4M", 4),
    ("randwrite-4k", "randwrite", "4k", 128),
    ("seqwrite-4M", "write", "4M", 4),
]

FILES_DATASET = "bench-files"


def plan(ctx):
    """Sizes and run lengths: ~6 min in full mode, ~2 in quick (TCG
    guest with the host to itself; up to 1.5x that when it is shared)."""
    if ctx.quick:
        return {"size_bytes": 32 * MIB, "runtime_s": 1, "runs": 1}
    return {"size_bytes": 128 * MIB, "runtime_s": 2, "runs": ctx.runs}


# --- backends ------------------------------------------------------------------

class Backends(object):
    """The devices under test and everything needed to undo them."""

    def __init__(self, ctx, size):
        self.ctx = ctx
        self.size = size
        self.all = []           # dicts: name, path, [volume]
        self.volumes = []       # plugin volume dicts, destroyed last
        self.snapshots = []     # plugin snapshot keys, destroyed first
        self.nbds = []
        self.files = "%s/%s" % (ctx.pool, FILES_DATASET)
        self.files_made = False
        self.file_snaps = 0

    def setup(self):
        """Make zvol, raw-file, vhd-nbd and the zvol-nbd control."""
        ctx = self.ctx
        vol = self._volume("datapath-zvol")
        self.all.append({"name": "zvol", "path": ctx.zvol_device(vol),
                         "volume": vol})
        mnt = self._files_dataset()
        raw = os.path.join(mnt, "raw.img")
        with open(raw, "wb") as f:
            f.truncate(self.size)
        self.all.append({"name": "raw-file", "path": raw})
        vhd = os.path.join(mnt, "disk.vhd")
        common.run(["qemu-img", "create", "-q", "-f", "vpc", "-o",
                    "subformat=dynamic,force_size=on", vhd, str(self.size)])
        self.all.append({"name": "vhd-nbd", "path": self._nbd(vhd, "vpc")})
        vol2 = self._volume("datapath-zvol-nbd")
        self.all.append({"name": "zvol-nbd", "volume": vol2,
                         "path": self._nbd(ctx.zvol_device(vol2), "raw")})

    def _volume(self, name):
        vol = self.ctx.new_volume(self.size, name=name)
        self.volumes.append(vol)
        return vol

    def _files_dataset(self):
        """<pool>/bench-files, mounted off the pool, compression as the SR."""
        compression = common.run(["zfs", "get", "-Hpo", "value",
                                  "compression", self.ctx.sr]).strip()
        mnt = os.path.join(self.ctx.scratch, FILES_DATASET)
        common.run(["zfs", "create", "-o", "compression=" + compression,
                    "-o", "mountpoint=" + mnt, self.files])
        self.files_made = True
        return mnt

    def _nbd(self, image, fmt):
        """Serve image through qemu-nbd on a free /dev/nbdN; returns it."""
        # max_part=0: no partition scan, which fails noisily at disconnect
        common.run(["modprobe", "nbd", "max_part=0"])
        dev = _free_nbd(self.nbds)
        # -k: qemu-nbd's default socket dir (/var/lock) may not exist
        sock = os.path.join(self.ctx.scratch, os.path.basename(dev) + ".sock")
        common.run(["qemu-nbd", "-c", dev, "-k", sock, "-f", fmt,
                    "--cache=none", "--aio=native", image])
        self.nbds.append(dev)
        _wait(lambda: _nbd_size(dev) > 0, "%s to connect" % dev)
        return dev

    def snapshot(self, names):
        """Snapshot the data of the named backends: plugin or ZFS."""
        for b in self.all:
            if b["name"] in names and "volume" in b:
                snap = self.ctx.plugin("Volume.snapshot", sr=self.ctx.sr,
                                       key=b["volume"]["key"])
                self.snapshots.append(snap["key"])
        if "raw-file" in names or "vhd-nbd" in names:
            self.file_snaps += 1
            common.run(["zfs", "snapshot",
                        "%s@bench-%d" % (self.files, self.file_snaps)])

    def teardown(self):
        """Undo everything, whatever failed: nbd, files, snapshots, VDIs."""
        for dev in self.nbds:
            _quiet(["qemu-nbd", "-d", dev])
            _wait(lambda: not _nbd_connected(dev), dev + " to disconnect",
                  fail=False)
        if self.files_made:
            _quiet(["zfs", "destroy", "-r", self.files])
        for key in self.snapshots:
            _quiet_plugin(self.ctx, "Volume.destroy", key)
        for vol in self.volumes:
            _quiet_plugin(self.ctx, "Volume.destroy", vol["key"])


def _free_nbd(taken):
    """The first /dev/nbdN with no server attached and not already ours."""
    n = 0
    while os.path.exists("/sys/block/nbd%d" % n):
        dev = "/dev/nbd%d" % n
        if dev not in taken and not _nbd_connected(dev):
            return dev
        n += 1
    raise RuntimeError("no free /dev/nbdN")


def _nbd_connected(dev):
    return os.path.exists("/sys/block/%s/pid" % os.path.basename(dev))


def _nbd_size(dev):
    with open("/sys/block/%s/size" % os.path.basename(dev)) as f:
        return int(f.read())


def _wait(cond, what, timeout=30, fail=True):
    """Poll cond (bounded): kernel devices settle asynchronously."""
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            if fail:
                raise RuntimeError("timed out waiting for " + what)
            common.log("datapath: timed out waiting for %s", what)
            return
        time.sleep(0.1)


def _quiet(argv):
    """Cleanup step: log a failure, do not hide the original error."""
    try:
        common.run(argv)
    except Exception as exc:   # noqa: BLE001 -- cleanup goes on
        common.log("datapath cleanup: %s: %s", " ".join(argv), exc)


def _quiet_plugin(ctx, method, key):
    try:
        ctx.plugin(method, sr=ctx.sr, key=key)
    except Exception as exc:   # noqa: BLE001 -- cleanup goes on
        common.log("datapath cleanup: %s %s: %s", method, key, exc)


# --- the section ----------------------------------------------------------------

def fill_all(backends, size, pool):
    """Write every byte of every device once: reads of holes mean nothing."""
    for b in backends.all:
        start = time.time()
        fill(b["path"], size, pool)
        common.log("datapath: filled %s (%d MiB) in %.0fs", b["name"],
                   size // MIB, time.time() - start)


def run_state(backends, snapshot, plan_, pool, disks):
    """All workloads x runs x backends in one state; raw per-run records."""
    names = [b["name"] for b in backends.all
             if not (snapshot and b["name"] == "zvol-nbd")]
    if snapshot:
        backends.snapshot(names)
    raw = {}
    for workload in WORKLOADS:
        for i in range(plan_["runs"]):
            if snapshot and "write" in workload[1]:
                backends.snapshot(names)
            for b in backends.all:
                if b["name"] in names:
                    m = io_run(b["path"], plan_["size_bytes"], workload,
                               plan_["runtime_s"], pool, disks)
                    raw.setdefault((b["name"], workload[0]), []).append(m)
        common.log("datapath: %s%s done", workload[0],
                   " (snapshot)" if snapshot else "")
    return raw


def summarise(raw, snapshot):
    """Per (backend, workload): summaries, and ratios to the zvols."""
    results = []
    for (name, workload), runs in sorted(raw.items()):
        r = {"backend": name, "snapshot": snapshot, "workload": workload}
        for field in ("iops", "mib_s", "disk_read_per_byte",
                      "disk_written_per_byte"):
            r[field] = common.summary(m[field] for m in runs)
        if "write" in workload:
            r["flush_s"] = common.summary(m["flush_s"] for m in runs)
        else:
            r["arc"] = dict((k, sum(m[k] for m in runs))
                            for k in ("arc_hits", "arc_misses", "ios"))
        results.append(r)
    by_key = dict(((r["backend"], r["workload"]), r) for r in results)
    for r in results:
        r["ratio_to_zvol"] = _ratio(r, by_key.get(("zvol", r["workload"])))
        if r["backend"] == "vhd-nbd":
            ref = by_key.get(("zvol-nbd", r["workload"]))
            if ref:
                r["ratio_to_zvol_nbd"] = _ratio(r, ref)
    return results


def _ratio(r, ref):
    base = ref["iops"]["median"] if ref else 0
    return r["iops"]["median"] / base if base else None


def config(ctx, plan_, backends):
    """Everything the figures depend on, recorded beside them."""
    files_props = ["compression", "recordsize", "atime"]
    if "direct" in common.run(["zfs", "get", "-H", "-o", "property", "all",
                               backends.files]).split():
        files_props.append("direct")
    zvol = [b for b in backends.all if b["name"] == "zvol"][0]
    return {
        "size_mib": plan_["size_bytes"] // MIB, "runs": plan_["runs"],
        "runtime_s": plan_["runtime_s"],
        "workloads": ["%s: rw=%s bs=%s iodepth=%d" % w for w in WORKLOADS],
        "fio": " ".join([common.run(["fio", "--version"]).strip()]
                        + FIO_FLAGS + ["--time_based"]),
        "qemu_nbd": "--cache=none --aio=native (" + common.run(
            ["qemu-nbd", "--version"]).splitlines()[0] + ")",
        "vhd": "qemu-img create -f vpc -o subformat=dynamic,force_size=on",
        "zvol": zfs_props(common.volume_dataset(zvol["volume"]),
                          ["volblocksize", "compression"]),
        "files_dataset": zfs_props(backends.files, files_props),
        "arc_c_max_mib": arcstats()["c_max"] // MIB,
    }


def notes(results, cfg):
    """What a reader needs to read the ratios right."""
    out = [
        "zvol-nbd is a control: the zvol behind the same qemu-nbd as the "
        "VHD. vhd-nbd against it (ratio_to_zvol_nbd) is the VHD format's "
        "cost; on XCP-ng every backend pays a user-space tapdisk hop.",
        "With a snapshot, raw-file and vhd-nbd sit under a ZFS snapshot of "
        "their dataset: qemu's vpc driver cannot make differencing VHDs.",
        "Write figures include the zpool sync after the run. Writes that "
        "land in the same block or record within one transaction group "
        "are merged: on these small devices disk_written_per_byte is "
        "below what scattered writes cost on a large disk, the more so "
        "the more writes a backend completes.",
    ]
    bypass = sorted(set(r["backend"] for r in results if "arc" in r and
                        r["arc"]["arc_hits"] + r["arc"]["arc_misses"]
                        < 0.1 * r["arc"]["ios"]))
    if bypass:
        out.append("Reads of %s bypassed the ARC (OpenZFS Direct IO): they "
                   "read whole records from disk (disk_read_per_byte)."
                   % ", ".join(bypass))
    if cfg["files_dataset"].get("direct", "disabled") != "disabled":
        out.append("This OpenZFS has Direct IO, which wants page-aligned "
                   "I/O; VHD data starts 512 bytes past each block's start "
                   "(its bitmap), so qemu widens every request to whole "
                   "pages (reading them first for a write), each page read "
                   "costing a whole record from disk. How tapdisk's vhd "
                   "driver fares on Direct IO is not measured here; XCP-ng "
                   "8.3 ships OpenZFS 2.1, which has none.")
    return out


def run(ctx):
    plan_ = plan(ctx)
    backends = Backends(ctx, plan_["size_bytes"])
    disks = pool_disks(ctx.pool)
    try:
        backends.setup()
        cfg = config(ctx, plan_, backends)
        fill_all(backends, plan_["size_bytes"], ctx.pool)
        results = []
        for snapshot in (False, True):
            raw = run_state(backends, snapshot, plan_, ctx.pool, disks)
            results += summarise(raw, snapshot)
    finally:
        backends.teardown()
    return {"config": cfg, "results": results, "notes": notes(results, cfg)}
