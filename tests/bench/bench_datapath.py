"""Datapath: zfs-ng's zvol through tapdisk, against SMAPIv1's VHD files.

Vates' launch benchmark of the ZFS SR compared, on one host, tapdisk in
raw mode (``aio:``) on a zvol with tapdisk in VHD mode on a file in a ZFS
dataset (what SMAPIv1's file-based ZFS SR does), and found the zvol about
2x faster for sequential writes, 3x for sequential reads and 12-13x for 4k
random IOPS, with no penalty for having snapshots. This section runs that
comparison through XCP-ng's real tapdisk (blktap v3.55.5 in the test
guest), every backend on the SAME pool, filled completely with
incompressible data, then measured with fio (libaio, O_DIRECT) on the
device a guest would get, without and with a snapshot:

- ``tap-zvol``: a VDI made by the volume plugin, attached through the
  installed datapath plugin as xapi attaches a guest's disk
  (``Datapath.open`` persistent, ``Datapath.attach`` with a guest domain:
  ``tap-ctl spawn``, ``allocate``, ``attach``; ``Datapath.activate``:
  ``tap-ctl open -a aio:/dev/zvol/<vdi>``, O_DIRECT); fio on the tapdev the
  XenDisk names. zfs-ng's product.
- ``zvol``: fio on ``/dev/zvol/<vdi>`` of that same VDI, no tapdisk: the
  ratio zvol / tap-zvol is the cost of the tapdisk hop (blktap ring,
  user-space tapdisk, its aio on the zvol).
- ``tap-vhd-file``: a dynamic VHD made as SMAPIv1's FileSR makes one
  (``vhd-util create -n disk.vhd -s <MiB>``: 2 MiB blocks, each behind a
  512-byte sector bitmap) on a filesystem dataset ``<pool>/bench-vhd``
  with the SR's compression (lz4) and otherwise ZFS defaults (recordsize
  128K, atime on: what the SMAPIv1 ZFS SR gets on the dataset an admin
  makes for it; on OpenZFS 2.3 also ``direct=disabled``, without which
  ``vhd-util create`` fails with EINVAL: see notes()), served by
  ``tap-ctl spawn/allocate/attach`` and
  ``tap-ctl open -a vhd:<file>`` (O_DIRECT, as SMAPIv1's blktap2.py opens
  a ZFS SR's VDIs: it asks for no O_DIRECT, ``-D``, only on NFS, EXT and
  SMB SRs, and for a VHD that reaches only the read-only parents).
- ``tap-raw-file``: a raw file on ``<pool>/bench-files`` (same
  properties) through ``tap-ctl open -a aio:<file>``: a control. Against
  tap-vhd-file it is the VHD format's cost; against tap-zvol, file against
  zvol under the same tapdisk driver.

Snapshot state. The zvol gets a ZFS snapshot (``Volume.snapshot`` through
the plugin), as zfs-ng snapshots a VDI. The VHD gets what SMAPIv1's ZFS SR
does on VDI.snapshot: a VHD snapshot chain, not a ZFS snapshot (the ZFS SR
is a FileSR and never snapshots its dataset): ``vhd-util snapshot -n
leaf.vhd -p disk.vhd``, and tapdisk reopened on the empty leaf, which
reads every block it has not written from the parent. The raw file, which
SMAPIv1 cannot snapshot, sits under a ZFS snapshot of its dataset: what a
ZFS snapshot costs a file. Reads run after one snapshot of the fully
written data; before every write run each backend gets a fresh one (a new
ZFS snapshot; for the VHD a new empty leaf on the same parent, the
previous leaf deleted, so the chain stays two deep), so every write run
starts with all data in the snapshot (first writes after a snapshot, not
rewrites of blocks an earlier run already unshared or allocated).

Why O_DIRECT everywhere: tapdisk opens its images with O_DIRECT unless told
not to (``-D``; the vhd driver keeps a writable leaf O_DIRECT even then,
drivers/block-vhd.c:802-807), and fio uses ``--direct=1`` on the devices.
What O_DIRECT does below tapdisk depends on the ZFS version: OpenZFS 2.1
(what XCP-ng 8.3 ships) accepts it on files and ignores it (the I/O goes
through the ARC, and AIO submission on a ZFS file is synchronous); 2.3
has real Direct IO on files (``direct=standard``): page-aligned I/O
bypasses the ARC and reads or writes whole records on disk. On a zvol
O_DIRECT only skips the page cache: the data always goes through the ARC.

Workloads: 4k random read and write at iodepth 128, 4M sequential read and
write at iodepth 4; fio's random buffers refilled for every I/O, so lz4
compresses nothing. No ramp: the devices are warm from the fill, and
counting every I/O lets fio's bytes be compared with the pool disk's. Write
figures include the ``zpool sync`` that follows the run: without it a short
run only measures how fast ZFS absorbs dirty data in memory. Each run
starts with a ``zpool sync`` so it does not pay for the previous one.
``disk_read_per_byte`` / ``disk_written_per_byte``: bytes the pool's disks
read / wrote (``/sys/class/block/*/stat``) per byte fio moved: read and
write amplification, which does not depend on how slow the emulated CPU
is. ``zil_commits``: ZIL commits during the run (a flush, FUA or fsync
somewhere on the path).

Repeats are interleaved (run 1 of every backend, then run 2...) so that a
burst of host load hits all backends alike, and every ratio is computed
per run (backend A's run i against backend B's run i) and summarised
(median, min-max) like the figures. Absolute figures under QEMU TCG mean
nothing; the devices are small, so zvol reads are ARC hits (``arc`` per
read result).
"""

import os
import re
import subprocess
import time

import common
from measure import (FIO_FLAGS, MIB, arcstats, fill, io_run, pool_disks,
                     zfs_props)
from plugin_client import Plugin

# name, fio rw, block size, iodepth
WORKLOADS = [
    ("randread-4k", "randread", "4k", 128),
    ("seqread-4M", "read", "4M", 4),
    ("randwrite-4k", "randwrite", "4k", 128),
    ("seqwrite-4M", "write", "4M", 4),
]

BACKENDS = ["tap-zvol", "zvol", "tap-vhd-file", "tap-raw-file"]

# The ratios the report shows: name -> (numerator, denominator), each a
# per-run IOPS ratio. Above 1: the numerator is faster.
RATIOS = {
    "zvol_vs_vhd": ("tap-zvol", "tap-vhd-file"),   # the launch benchmark
    "hop": ("zvol", "tap-zvol"),                   # slowdown by tapdisk
    "raw_vs_vhd": ("tap-raw-file", "tap-vhd-file"),  # the VHD format
    "zvol_vs_raw": ("tap-zvol", "tap-raw-file"),   # zvol vs file, raw
}

# Vates' launch benchmark of the ZFS SR: tapdisk raw on a zvol against
# tapdisk VHD on a file in a dataset, same host (zvol / VHD).
LAUNCH = {"seqwrite-4M": "about 2x", "seqread-4M": "about 3x",
          "randread-4k": "12-13x", "randwrite-4k": "12-13x"}
TARGETS = {"seqwrite-4M": 2.0, "seqread-4M": 3.0, "randread-4k": 12.0,
           "randwrite-4k": 12.0}
HOP_TARGET = 1.2

FILES_DATASET = "bench-files"
VHD_DATASET = "bench-vhd"
DATAPATH_PLUGIN = "usr/libexec/xapi-storage-script/datapath/zfs-ng"
GUEST_DOMAIN = "5"     # a guest's domain id, as xapi-storage-script sends it


def plan(ctx):
    """Sizes and run lengths: ~12 min with 5 runs, ~2 in quick mode (TCG
    guest with the host to itself; up to 1.5x that when it is shared)."""
    if ctx.quick:
        return {"size_bytes": 32 * MIB, "runtime_s": 1, "runs": ctx.runs}
    return {"size_bytes": 128 * MIB, "runtime_s": 2, "runs": ctx.runs}


# --- tapdisk, by hand for the files ------------------------------------------

class Tapdisk(object):
    """One tapdisk serving one image on a tapdev, made with the sequence
    SMAPIv1 (blktap2.py) and zfs-ng's datapath use: spawn, allocate,
    attach, open. ``close()`` undoes what was done, whatever failed.
    ``no_direct``: ``tap-ctl open -D``, as SMAPIv1 opens an EXT SR's VHDs
    (for a VHD only its read-only parents then go through the page cache:
    the writable leaf stays O_DIRECT, drivers/block-vhd.c:802-807)."""

    def __init__(self, image, no_direct=False):
        self.pid = self.minor = self.dev = None
        self.no_direct = no_direct
        self.attached = self.opened = False
        self.pid = int(common.run(["tap-ctl", "spawn"]).strip())
        self.dev = common.run(["tap-ctl", "allocate"]).strip()
        match = re.search(r"tapdev(\d+)$", self.dev)
        if not match:
            raise RuntimeError("tap-ctl allocate printed %r" % self.dev)
        self.minor = int(match.group(1))
        self._ctl("attach")
        self.attached = True
        self.open(image)

    def _ctl(self, verb, *extra):
        common.run(["tap-ctl", verb, "-p", str(self.pid),
                    "-m", str(self.minor)] + list(extra))

    def open(self, image):
        """tap-ctl open -a <driver>:<path> (O_DIRECT unless no_direct)."""
        self._ctl("open", "-a", image, *(["-D"] if self.no_direct else []))
        self.opened = True
        self.image = image
        _wait(lambda: _blk_size(self.dev) > 0, self.dev + " to open")

    def reopen(self, image):
        self._ctl("close")
        self.opened = False
        self.open(image)

    def close(self):
        if self.opened:
            _quiet(["tap-ctl", "close", "-p", str(self.pid),
                    "-m", str(self.minor)])
        if self.attached:
            _quiet(["tap-ctl", "detach", "-p", str(self.pid),
                    "-m", str(self.minor)])
        if self.minor is not None:
            _quiet(["tap-ctl", "free", "-m", str(self.minor)])


def _direct_probe(directory):
    """On a dataset with ZFS's default direct=standard: what vhd-util
    create and a 512-byte O_DIRECT write answer (the evidence for the
    VHD dataset's direct=disabled)."""
    out = {}
    for name, argv in (
            ("vhd-util create", ["vhd-util", "create", "-n",
                                 os.path.join(directory, "probe.vhd"),
                                 "-s", "8"]),
            ("dd bs=512 oflag=direct", ["dd", "if=/dev/zero", "of=" +
                                        os.path.join(directory, "probe.img"),
                                        "bs=512", "count=1",
                                        "oflag=direct"]),
            ("dd bs=4096 oflag=direct", ["dd", "if=/dev/zero", "of=" +
                                         os.path.join(directory,
                                                      "probe.img"),
                                         "bs=4096", "count=1",
                                         "oflag=direct"])):
        proc = subprocess.run(argv, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              universal_newlines=True)
        out[name] = {"rc": proc.returncode,
                     "output": proc.stdout.strip()[-300:]}
    for f in ("probe.vhd", "probe.img"):
        if os.path.exists(os.path.join(directory, f)):
            os.unlink(os.path.join(directory, f))
    return out


def _has_direct():
    """Whether this OpenZFS has the ``direct`` property (2.3 and later)."""
    return subprocess.run(["zfs", "get", "-H", "direct", "-o", "value"],
                          stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def _blk_size(dev):
    try:
        return int(common.run(["blockdev", "--getsize64", dev]))
    except Exception:   # noqa: BLE001 -- not there yet
        return 0


# --- backends ----------------------------------------------------------------

class Backends(object):
    """The devices under test and everything needed to undo them."""

    def __init__(self, ctx, size):
        self.ctx = ctx
        self.size = size
        self.paths = {}         # backend name: device fio runs on
        self.dp = Plugin(ctx.plugin.root, plugin_dir=DATAPATH_PLUGIN,
                         env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})
        self.vol = None
        self.dp_steps = []      # datapath calls done, undone in reverse
        self.snapshots = []     # plugin snapshot keys, destroyed first
        self.taps = {}          # backend name: Tapdisk
        self.datasets = []
        self.vhd_dir = None
        self.vhd_leaf = None
        self.vhd_leaves = 0
        self.direct_probe = None
        self.zfs_snaps = 0

    def setup(self):
        ctx = self.ctx
        self.vol = ctx.new_volume(self.size, name="datapath-zvol")
        self.paths["zvol"] = ctx.zvol_device(self.vol)
        uri = self.vol["uri"][0]
        self.dp("Datapath.open", uri=uri, persistent=True)
        self.dp_steps.append("open")
        result = self.dp("Datapath.attach", uri=uri, domain=GUEST_DOMAIN)
        self.dp_steps.append("attach")
        xendisk = [i for i in result["implementations"]
                   if i[0] == "XenDisk"]
        if not xendisk:
            raise RuntimeError("Datapath.attach gave no XenDisk: %r"
                               % result)
        self.dp("Datapath.activate", uri=uri, domain=GUEST_DOMAIN)
        self.dp_steps.append("activate")
        tapdev = xendisk[0][1]["params"]
        _wait(lambda: _blk_size(tapdev) > 0, tapdev + " to open")
        self.paths["tap-zvol"] = tapdev

        self.vhd_file()

        files_dir = self._dataset(FILES_DATASET)
        if _has_direct():
            self.direct_probe = _direct_probe(files_dir)
        raw = os.path.join(files_dir, "raw.img")
        with open(raw, "wb") as f:
            f.truncate(self.size)
        self.taps["tap-raw-file"] = Tapdisk("aio:" + raw)
        self.paths["tap-raw-file"] = self.taps["tap-raw-file"].dev
        for name in BACKENDS:
            got = _blk_size(self.paths[name])
            if got != self.size:
                raise RuntimeError("%s (%s) is %d bytes, not %d"
                                   % (name, self.paths[name], got,
                                      self.size))

    def vhd_file(self):
        """SMAPIv1's ZFS SR's disk: a dynamic VHD (``vhd-util create``)
        in a dataset of the pool (recordsize left at ZFS's 128K), opened
        by tapdisk ``vhd:`` as SMAPIv1 opens it; its tapdev, also in
        paths["tap-vhd-file"]. teardown() undoes it. The VM benchmark
        (bench_vm_fio) makes only this one."""
        # OpenZFS 2.3's Direct IO refuses (EINVAL) an O_DIRECT request
        # that is not page-aligned; vhd-util and tapdisk's vhd driver
        # open with O_DIRECT and write 512-byte footers, headers and
        # bitmaps, so on the default direct=standard `vhd-util create`
        # itself fails. A VHD SR on 2.3 needs direct=disabled (O_DIRECT
        # ignored, as on 2.1); the raw file keeps ZFS's default.
        self.vhd_dir = self._dataset(
            VHD_DATASET, ["direct=disabled"] if _has_direct() else [])
        vhd = os.path.join(self.vhd_dir, "disk.vhd")
        common.run(["vhd-util", "create", "-n", vhd,
                    "-s", str(self.size // MIB)])
        self.taps["tap-vhd-file"] = Tapdisk("vhd:" + vhd)
        self.paths["tap-vhd-file"] = self.taps["tap-vhd-file"].dev
        _wait(lambda: _blk_size(self.paths["tap-vhd-file"]) > 0,
              self.paths["tap-vhd-file"] + " to open")
        return self.paths["tap-vhd-file"]

    def _dataset(self, name, props=()):
        """<pool>/<name>, mounted off the pool, compression as the SR,
        more properties as "key=value" strings."""
        compression = common.run(["zfs", "get", "-Hpo", "value",
                                  "compression", self.ctx.sr]).strip()
        mnt = os.path.join(self.ctx.scratch, name)
        dataset = "%s/%s" % (self.ctx.pool, name)
        argv = ["zfs", "create", "-o", "compression=" + compression,
                "-o", "mountpoint=" + mnt]
        for prop in props:
            argv += ["-o", prop]
        common.run(argv + [dataset])
        self.datasets.append(dataset)
        return mnt

    def snapshot(self, name):
        """A fresh snapshot of one backend's data (module docstring)."""
        if name in ("zvol", "tap-zvol"):
            snap = self.ctx.plugin("Volume.snapshot", sr=self.ctx.sr,
                                   key=self.vol["key"])
            self.snapshots.append(snap["key"])
        elif name == "tap-raw-file":
            self.zfs_snaps += 1
            common.run(["zfs", "snapshot", "%s/%s@bench-%d" % (
                self.ctx.pool, FILES_DATASET, self.zfs_snaps)])
        elif name == "tap-vhd-file":
            # SMAPIv1's VDI.snapshot: the data becomes a read-only parent,
            # the disk a new empty leaf on it
            old = self.vhd_leaf
            self.vhd_leaves += 1
            self.vhd_leaf = os.path.join(self.vhd_dir,
                                         "leaf-%d.vhd" % self.vhd_leaves)
            common.run(["vhd-util", "snapshot", "-n", self.vhd_leaf, "-p",
                        os.path.join(self.vhd_dir, "disk.vhd")])
            self.taps["tap-vhd-file"].reopen("vhd:" + self.vhd_leaf)
            if old:
                os.unlink(old)
        else:
            raise ValueError(name)

    def vhd_chain(self):
        """What tapdisk reads through: vhd-util's view of the leaf."""
        if not self.vhd_leaf:
            return None
        return common.run(["vhd-util", "query", "-n", self.vhd_leaf,
                           "-d"]).strip()

    def teardown(self):
        """Undo everything, whatever failed: tapdisks, the datapath,
        datasets, snapshots, the VDI."""
        for tap in self.taps.values():
            tap.close()
        uri = self.vol["uri"][0] if self.vol else None
        for step, method in (("activate", "Datapath.deactivate"),
                             ("attach", "Datapath.detach")):
            if step in self.dp_steps:
                try:
                    self.dp(method, uri=uri, domain=GUEST_DOMAIN)
                except Exception as exc:   # noqa: BLE001 -- cleanup
                    common.log("datapath cleanup: %s: %s", method, exc)
        if "open" in self.dp_steps:
            try:
                self.dp("Datapath.close", uri=uri)
            except Exception as exc:   # noqa: BLE001 -- cleanup goes on
                common.log("datapath cleanup: Datapath.close: %s", exc)
        for dataset in self.datasets:
            _quiet(["zfs", "destroy", "-r", dataset])
        for key in self.snapshots:
            _quiet_plugin(self.ctx, "Volume.destroy", key)
        if self.vol:
            _quiet_plugin(self.ctx, "Volume.destroy", self.vol["key"])
        left = common.run(["tap-ctl", "list"]).strip()
        if left:
            common.log("datapath: tap-ctl list after cleanup: %s", left)


def _wait(cond, what, timeout=30):
    """Poll cond (bounded): kernel devices settle asynchronously."""
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise RuntimeError("timed out waiting for " + what)
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
    """Write every byte of every device once: reads of holes mean nothing.
    zvol and tap-zvol are one VDI: filled once, through the tapdev."""
    for name in BACKENDS:
        if name == "zvol":
            continue
        start = time.time()
        fill(backends.paths[name], size, pool)
        common.log("datapath: filled %s (%d MiB) in %.0fs", name,
                   size // MIB, time.time() - start)


def run_state(backends, snapshot, plan_, pool, disks):
    """All workloads x runs x backends in one state; raw per-run records."""
    if snapshot:
        for name in ("tap-zvol", "tap-vhd-file", "tap-raw-file"):
            backends.snapshot(name)
    raw = {}
    for workload in WORKLOADS:
        for _ in range(plan_["runs"]):
            for name in BACKENDS:
                if snapshot and "write" in workload[1]:
                    backends.snapshot(name)
                m = io_run(backends.paths[name], plan_["size_bytes"],
                           workload, plan_["runtime_s"], pool, disks)
                raw.setdefault((name, workload[0]), []).append(m)
        common.log("datapath: %s%s done", workload[0],
                   " (snapshot)" if snapshot else "")
    return raw


def summarise(raw, snapshot):
    """Per (backend, workload): summaries of every figure."""
    results = []
    for (name, workload), runs in sorted(raw.items()):
        r = {"backend": name, "snapshot": snapshot, "workload": workload}
        for field in ("iops", "mib_s", "disk_read_per_byte",
                      "disk_written_per_byte", "zil_commits",
                      "cpu_busy", "cpu_us_per_io"):
            r[field] = common.summary(m[field] for m in runs)
        if "write" in workload:
            r["flush_s"] = common.summary(m["flush_s"] for m in runs)
        else:
            r["arc"] = dict((k, sum(m[k] for m in runs))
                            for k in ("arc_hits", "arc_misses", "ios"))
        results.append(r)
    return results


def ratios(raw, snapshot):
    """Per (ratio, workload): per-run IOPS ratios, summarised."""
    out = []
    for name, (num, den) in sorted(RATIOS.items()):
        for workload in [w[0] for w in WORKLOADS]:
            a, b = raw[(num, workload)], raw[(den, workload)]
            values = [x["iops"] / y["iops"] for x, y in zip(a, b)
                      if y["iops"]]
            if values:
                out.append({"ratio": name, "of": [num, den],
                            "snapshot": snapshot, "workload": workload,
                            "value": common.summary(values)})
    return out


def snapshot_penalty(raw_by_state):
    """Per (backend, workload): IOPS with a snapshot / without (medians:
    the two states' runs are not paired)."""
    import statistics
    out = []
    plain, snap = raw_by_state[False], raw_by_state[True]
    for key in sorted(plain):
        if key in snap:
            a = statistics.median(m["iops"] for m in snap[key])
            b = statistics.median(m["iops"] for m in plain[key])
            out.append({"backend": key[0], "workload": key[1],
                        "with_over_without": a / b if b else None})
    return out


def config(ctx, plan_, backends):
    """Everything the figures depend on, recorded beside them."""
    files_props = ["compression", "recordsize", "atime"]
    ds = "%s/%s" % (ctx.pool, VHD_DATASET)
    if "direct" in common.run(["zfs", "get", "-H", "-o", "property", "all",
                               ds]).split():
        files_props.append("direct")
    vhd = os.path.join(backends.vhd_dir, "disk.vhd")
    return {
        "size_mib": plan_["size_bytes"] // MIB, "runs": plan_["runs"],
        "runtime_s": plan_["runtime_s"],
        "workloads": ["%s: rw=%s bs=%s iodepth=%d" % w for w in WORKLOADS],
        "fio": " ".join([common.run(["fio", "--version"]).strip()]
                        + FIO_FLAGS + ["--time_based"]),
        "tapdisk": "tap-ctl spawn/allocate/attach/open -a aio:|vhd: "
                   "(O_DIRECT); tap-zvol through the installed datapath "
                   "plugin (Datapath.open/attach/activate, domain %s)"
                   % GUEST_DOMAIN,
        "tap_list": common.run(["tap-ctl", "list"]).strip().splitlines(),
        "vhd": "vhd-util create -n disk.vhd -s %d; snapshot: vhd-util "
               "snapshot -n leaf.vhd -p disk.vhd" % (plan_["size_bytes"]
                                                     // MIB),
        "vhd_block_size": _vhd_field(vhd, "Block size"),
        "queue_limits": dict((name, _queue_limits(backends.paths[name]))
                             for name in BACKENDS),
        "zvol": zfs_props(common.volume_dataset(backends.vol),
                          ["volblocksize", "compression", "sync"]),
        "direct_io_probe": backends.direct_probe,
        "vhd_dataset": zfs_props(ds, files_props),
        "raw_file_dataset": zfs_props("%s/%s" % (ctx.pool, FILES_DATASET),
                                      files_props),
        "arc_c_max_mib": arcstats()["c_max"] // MIB,
    }


def _queue_limits(dev):
    """The largest request the block layer sends this device (KiB) and
    its segments: a tapdev's ring caps both, so a 4M read arrives at
    tapdisk as many small requests."""
    rdev = os.stat(dev).st_rdev
    base = "/sys/dev/block/%d:%d/queue/" % (os.major(rdev), os.minor(rdev))
    out = {}
    for name in ("max_sectors_kb", "max_segments", "max_segment_size"):
        try:
            with open(base + name) as f:
                out[name] = int(f.read())
        except (IOError, OSError, ValueError):
            out[name] = None
    return out


def _vhd_field(vhd, field):
    """One field of vhd-util's header dump (None if it has no such line)."""
    try:
        text = common.run(["vhd-util", "read", "-n", vhd, "-p"])
    except Exception as exc:   # noqa: BLE001 -- a recorded condition only
        return "vhd-util read failed: %s" % exc
    for line in text.splitlines():
        if line.strip().startswith(field):
            return line.split(":", 1)[1].strip()
    return None


def notes(results, cfg):
    """What a reader needs to read the ratios right."""
    out = [
        "tap-zvol and zvol are one VDI: zvol / tap-zvol is the tapdisk hop.",
        "With a snapshot: the zvol under a ZFS snapshot (Volume.snapshot), "
        "the VHD as a two-deep VHD chain (empty leaf on the filled parent, "
        "what SMAPIv1's VDI.snapshot makes), the raw file under a ZFS "
        "snapshot of its dataset.",
        "Write figures include the zpool sync after the run. Writes that "
        "land in the same block or record within one transaction group "
        "are merged: on these small devices disk_written_per_byte is "
        "below what scattered writes cost on a large disk, the more so "
        "the more writes a backend completes.",
    ]
    if cfg.get("vhd_dataset", {}).get("direct") == "disabled":
        out.append("The VHD's dataset has direct=disabled: on OpenZFS 2.3 "
                   "with the default direct=standard, vhd-util create "
                   "fails with EINVAL (its O_DIRECT writes of 512-byte "
                   "headers are not page-aligned, which 2.3's Direct IO "
                   "refuses), and tapdisk's vhd driver writes 512-byte "
                   "bitmaps the same way. The raw file keeps the default.")
    bypass = sorted(set(r["backend"] for r in results if "arc" in r and
                        r["arc"]["arc_hits"] + r["arc"]["arc_misses"]
                        < 0.1 * r["arc"]["ios"]))
    if bypass:
        out.append("Reads of %s bypassed the ARC (OpenZFS Direct IO): they "
                   "read whole records from disk (disk_read_per_byte)."
                   % ", ".join(bypass))
    return out


def run(ctx):
    plan_ = plan(ctx)
    backends = Backends(ctx, plan_["size_bytes"])
    disks = pool_disks(ctx.pool)
    try:
        backends.setup()
        cfg = config(ctx, plan_, backends)
        fill_all(backends, plan_["size_bytes"], ctx.pool)
        results, ratio_list, raw_by_state = [], [], {}
        for snapshot in (False, True):
            raw = run_state(backends, snapshot, plan_, ctx.pool, disks)
            raw_by_state[snapshot] = raw
            results += summarise(raw, snapshot)
            ratio_list += ratios(raw, snapshot)
        cfg["vhd_chain"] = backends.vhd_chain()
    finally:
        backends.teardown()
    return {"config": cfg, "results": results, "ratios": ratio_list,
            "snapshot_penalty": snapshot_penalty(raw_by_state),
            "launch": LAUNCH, "targets": TARGETS, "hop_target": HOP_TARGET,
            "notes": notes(results, cfg)}
