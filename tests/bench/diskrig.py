"""The disk-bound rig: slow disks, small caches, the backends on them.

Shared by the ``ceilings`` and ``disk-bound`` sections. Under QEMU TCG the
emulated CPU bounds every backend, so the disk-bound benchmark boots the
guest twice (``make bench-disk-bound``): once on unthrottled RAM-backed
disks to measure each backend's CPU-bound ceiling (``ceilings``), and once
with every pool disk throttled by QEMU well below those ceilings
(``run.sh --throttle``), where the disk is the bottleneck as on a real
host (``disk-bound``).

What stands for the launch benchmark's host here:

- The disk: a cheap QLC SATA SSD. Vates' post does not name its model in
  any text this project could read; its limits keep the proportions of the
  Samsung 870 QVO 1 TB's rated figures (``SSD``): random 4k IOPS against
  sequential bandwidth, so a 4k random workload and a 4M sequential one
  meet the same kind of wall they meet on that disk. How low: a quarter
  of what each backend and workload asks of the disk at its CPU-bound
  ceiling (``throttle_from``). The disks are also marked non-rotational
  (``as_ssds``), as ZFS sees an SSD.
- The caches: the launch post wrote 10 GiB through a 4 GiB guest on an
  8 GiB dom0, so its reads reached the disk. Here the ARC is capped
  (``ARC_MAX``, OpenZFS's lowest cap) at half of every backend's working
  set, the guest's page cache and the ARC are dropped before every run
  (``drop_caches``: the ARC goes down to its 32 MiB floor), and dirty
  data is capped alike for ZFS and for ext4's page cache (``dirty_cap``),
  so writes meet the disk within a run instead of memory absorbing them.

Every run records what the disks did (requests and bytes, from
/sys/class/block) so the report can show, per run, how close to its
limit the disk was: that is the evidence the disk, not the CPU, bound it.
"""

import os
import subprocess
import time

import bench_datapath
import common
from measure import (MIB, arc_data_counts, arcstats, cpu_times, disk_counts,
                     fio)

# A cheap QLC SATA SSD's rated figures (1 TB model): what the throttle's
# proportions come from.
SSD = {"model": "Samsung 870 QVO 1 TB (QLC, SATA)",
       "seq_read_mb_s": 560, "seq_write_mb_s": 530,
       "rand_read_iops": 98000, "rand_write_iops": 88000}
# Bytes a second the disk moves per random IOPS it can do (5714): the
# throttle's bps = its iops x this.
BYTES_PER_IOPS = SSD["seq_read_mb_s"] * 1000 * 1000 // SSD["rand_read_iops"]
# The throttle: this share of the least any ceilings run asked of its disk.
SHARE = 0.25

ARC_MIN = 32 * MIB     # OpenZFS's floors: 32 MiB and 64 MiB
ARC_MAX = 64 * MIB
# The cap for parts that weigh small blocks (bench_disk_bound.redundant):
# OpenZFS 2.1 stalled at 8K and 4K under ARC_MAX (archive/
# 2.1-small-block-stall: the ARC at 173 MiB, 120 MiB of it metadata,
# over a 48 MiB metadata limit, its readers waiting for an eviction that
# could not come). 512 MiB is about 3x that ARC and 4x that metadata
# (2.1's metadata limit, 3/4 of the cap: 384 MiB), a sixth of the
# guest's 2972 MiB (2.1's own default would be half). drop_caches still
# takes it to its floor before every run, and no run reads more than a
# few MiB: the data a run finds in memory is what it was under ARC_MAX.
ARC_SMALL_BLOCKS = 512 * MIB
DIRTY = 32 * MIB       # unthrottled; on a throttled disk DIRTY_SECONDS of it
DIRTY_SECONDS = 4      # at least 8 MiB, at most DIRTY

# name, fio rw, block size, iodepth: the launch post's four workloads
WORKLOADS = bench_datapath.WORKLOADS


def disk(n):
    """The guest's n-th blank disk (run.sh names them d1..dN)."""
    return "/dev/disk/by-id/virtio-zfsng-d%d" % n


def stat_files(devices):
    """/sys/class/block stat files of block devices (paths or links)."""
    return ["/sys/class/block/%s/stat"
            % os.path.basename(os.path.realpath(p)) for p in devices]


def wait_quiet(stats, bound=600, poll=0.5):
    """Wait, at most ``bound`` seconds, until no request has been in
    flight on these disks (the stat files' in_flight field) for two polls
    running; returns the seconds waited.

    A sequential read's prefetch runs megabytes ahead of it, and on a
    throttled disk those reads keep it busy long after fio ends: the
    next run would count them as its own (a first random-write run after
    the sequential reads read 230-320 disk bytes per byte, the next 3-4).
    """
    start = time.time()
    quiet_polls = 0
    while time.time() - start < bound:
        busy = sum(int(_read(p).split()[8]) for p in stats)
        quiet_polls = 0 if busy else quiet_polls + 1
        if quiet_polls == 2:
            break
        time.sleep(poll)
    return time.time() - start


def _write(path, value):
    with open(path, "w") as f:
        f.write("%s\n" % value)


def _read(path):
    with open(path) as f:
        return f.read().strip()


def dirty_cap(bps=None):
    """Dirty data allowed (ZFS's and the page cache's): DIRTY_SECONDS of
    a throttled disk's bandwidth (8-32 MiB), so a write run meets the
    disk within its time, as the launch post's 10 GiB met its SSD."""
    if not bps:
        return DIRTY
    return min(DIRTY, max(8 * MIB, DIRTY_SECONDS * bps // MIB * MIB))


def limits(ctx, section, target):
    """(iops, bps): the disks' limits main.py --throttle was given, as
    run.sh --throttle got them; a section bound by the disk needs them."""
    if not ctx.throttle:
        raise RuntimeError("%s needs the disks' limits: main.py --throttle "
                           "IOPS:BPS, as run.sh --throttle got (make %s)"
                           % (section, target))
    iops, bps = (int(x) for x in ctx.throttle.split(":"))
    return iops, bps


def arc_limits(environ=None):
    """The ARC's floor and cap for a run: ARC_MIN and ARC_MAX, or the cap
    in MiB from ZFSNG_BENCH_ARC_MAX_MIB (at least ARC_MAX) over the same
    floor, so the cap is the one thing changed, or None for "module": the
    module's own limits, untouched (a dom0's; the ARC then shrinks only
    under memory pressure). For experiments only
    (archive/2.1-small-block-stall varies the cap under one workload);
    plan() keeps sizing the devices
    by ARC_MAX, so the workload stays what it is at the rig's cap."""
    env = os.environ if environ is None else environ
    text = env.get("ZFSNG_BENCH_ARC_MAX_MIB", "")
    if not text:
        return ARC_MIN, ARC_MAX
    if text == "module":
        return None
    if not text.isdigit() or int(text) * MIB < ARC_MAX:
        raise ValueError("ZFSNG_BENCH_ARC_MAX_MIB: a whole number of MiB, "
                         "at least %d, not %r" % (ARC_MAX // MIB, text))
    return ARC_MIN, int(text) * MIB


def tune(bps=None):
    """Cap the ARC and dirty data (ZFS's and the page cache's); returns
    the values as the kernel reads them back."""
    params = "/sys/module/zfs/parameters/"
    dirty = dirty_cap(bps)
    limits = arc_limits()
    if limits:
        _write(params + "zfs_arc_min", limits[0])
        _write(params + "zfs_arc_max", limits[1])
    _write(params + "zfs_dirty_data_max", dirty)
    _write("/proc/sys/vm/dirty_bytes", dirty)
    _write("/proc/sys/vm/dirty_background_bytes", dirty // 2)
    return {"rotational": [_read(_rotational(n)) for n in range(1, 7)
                           if os.path.exists(disk(n))],
            "zfs_arc_min": int(_read(params + "zfs_arc_min")),
            "zfs_arc_max": int(_read(params + "zfs_arc_max")),
            "zfs_dirty_data_max": int(_read(params + "zfs_dirty_data_max")),
            "vm.dirty_bytes": int(_read("/proc/sys/vm/dirty_bytes")),
            "vm.dirty_background_bytes": int(
                _read("/proc/sys/vm/dirty_background_bytes"))}


class arc_cap(object):
    """``with arc_cap(n):`` the ARC's cap at n bytes, then back to what
    it was (whatever failed); ``value`` is the cap as the kernel reads it
    back."""

    PARAM = "/sys/module/zfs/parameters/zfs_arc_max"

    def __init__(self, cap):
        self.cap = cap
        self.old = None
        self.value = None

    def __enter__(self):
        self.old = int(_read(self.PARAM))
        _write(self.PARAM, self.cap)
        self.value = int(_read(self.PARAM))
        return self

    def __exit__(self, *exc):
        _write(self.PARAM, self.old)
        return False


def as_ssds(count=6):
    """Mark the guest's disks non-rotational, as the SSD they stand for
    (virtio disks report rotational): ZFS reads it when it opens a vdev
    and sizes its I/O aggregation and allocation by it. Before any pool
    is made on them."""
    for n in range(1, count + 1):
        if os.path.exists(disk(n)):
            _write(_rotational(n), 0)


def _rotational(n):
    return "/sys/block/%s/queue/rotational" % os.path.basename(
        os.path.realpath(disk(n)))


def drop_caches():
    """Write back, then drop the page cache and what the kernel's shrinkers
    give up (the ARC among them): every run starts cold."""
    common.run(["sync"])
    _write("/proc/sys/vm/drop_caches", 3)


def throttle_from(runs):
    """The per-disk limits from the ceilings' runs (each with the disk
    requests and bytes a second it caused at its CPU-bound ceiling): the
    highest IOPS limit, with bytes in the SSD's proportion, that is at
    most a quarter of every run's demand on the disk in requests or in
    bytes. So no backend can reach more than a quarter of its ceiling:
    the disk bounds all of them, with a 4x margin. Runs that never
    reached the disk (all cache hits) cannot be bound by it; they are
    named, not counted."""
    counted = [r for r in runs if r["disk_bps"] > 0]
    allowed = [(SHARE * max(r["disk_iops"], r["disk_bps"] / BYTES_PER_IOPS),
                r) for r in counted]
    limit, binding = min(allowed, key=lambda a: a[0])
    iops = max(1, int(limit))
    bps = iops * BYTES_PER_IOPS
    return {"iops": iops, "bps": bps, "arg": "%d:%d" % (iops, bps),
            "share": SHARE, "bytes_per_iops": BYTES_PER_IOPS,
            "set_by": "%s %s" % (binding["backend"], binding["workload"]),
            "never_on_disk": ["%s %s" % (r["backend"], r["workload"])
                              for r in runs if r["disk_bps"] <= 0]}


# --- one measured run ----------------------------------------------------

class Target(object):
    """One device under test: what fio runs on, how its writes are made
    durable (``sync``: zpool sync, or sync -f on a mounted file system),
    the physical disks under it, and its zvol (``dataset``) if any."""

    def __init__(self, path, sync, disks, dataset=None):
        self.path = path
        self.sync = sync
        self.disks = disks
        self.dataset = dataset


def zpool_syncer(pool):
    return lambda: common.run(["zpool", "sync", pool])


def fs_syncer(mountpoint):
    return lambda: common.run(["sync", "-f", mountpoint])


def seq_offset(k, size):
    """Where the k-th sequential run of a device starts: runs in turn
    start 1/8 of the device further on, within its first 3/4, so that a
    run does not read what the ones before it left in a cache (what
    drop_caches leaves of the ARC: its minimum)."""
    step = max(size // 8 // (4 * MIB), 1) * 4 * MIB
    return (k * step) % (size * 3 // 4)


def measure(targets, size, workload, runtime_s, k=0, seq_bytes=None):
    """One run of a workload on one or more targets at once (one fio job
    each), cold caches, writes made durable inside the time; the k-th of
    its kind (sequential runs start at seq_offset(k)). Returns the
    totals and the per-target IOPS.

    ``seq_bytes``: a sequential run moves this many bytes per target and
    is timed to its last completion, instead of running runtime_s. On a
    slow disk a 4M request at iodepth 4 takes seconds, so a timed run
    would count a handful of completions and leave 16 MiB in flight
    uncounted (while the disk counters see them)."""
    _, rw, bs, iodepth = workload
    sequential = not rw.startswith("rand")
    offset = seq_offset(k, size) if sequential else 0
    length = size - offset
    if sequential and seq_bytes:
        length, runtime_s = min(seq_bytes, length), None
    disks = sorted(set(d for t in targets for d in t.disks))
    stats = stat_files(disks)
    # drain first: prefetch reads still in flight from the run before
    # land in the ARC after a drop (a random write after sequential reads
    # found 46 MiB there and read 0.2x the bytes of its pair)
    quiet_s = wait_quiet(stats)
    drop_caches()
    for t in targets:
        t.sync()
    quiet_s += wait_quiet(stats)
    arc_size = arcstats()["size"]
    arc0, disk0, cpu0 = arc_data_counts(), disk_counts(stats), cpu_times()
    each0 = [disk_counts([s]) for s in stats]
    jobs = fio_jobs([t.path for t in targets], length, rw, bs,
                    iodepth, runtime_s, offset)
    cpu1 = cpu_times()
    start = time.perf_counter()
    if "write" in rw:
        for t in targets:
            t.sync()
    flush = time.perf_counter() - start
    arc1, disk1 = arc_data_counts(), disk_counts(stats)
    each1 = [disk_counts([s]) for s in stats]
    seconds = max(j["runtime"] for j in jobs) / 1000.0 + flush
    ios = sum(j["total_ios"] for j in jobs)
    moved = float(max(sum(j["io_bytes"] for j in jobs), 1))
    d = [b - a for a, b in zip(disk0, disk1)]
    return {"iops": ios / seconds, "mib_s": moved / MIB / seconds,
            "per_target_iops": [j["total_ios"] / seconds for j in jobs],
            "flush_s": flush, "seconds": seconds, "ios": ios,
            "quiet_wait_s": quiet_s,
            "disk_iops": (d[0] + d[2]) / seconds / len(disks),
            "disk_bps": (d[1] + d[3]) / seconds / len(disks),
            "disk_read_per_byte": d[1] / moved,
            "disk_written_per_byte": d[3] / moved,
            "arc_hits": arc1[0] - arc0[0], "arc_misses": arc1[1] - arc0[1],
            "arc_mib_at_start": arc_size / float(MIB),
            "clat_us": [j["clat_us"] for j in jobs],
            "cpu_busy": (cpu1[0] - cpu0[0]) / float(max(cpu1[1] - cpu0[1],
                                                        1)),
            "per_disk": per_disk(disks, each0, each1, moved, seconds)}


def per_disk(disks, before, after, moved, seconds):
    """Each disk's share of a run (disk_counts of each, before and
    after): bytes read and written per byte fio moved, and requests and
    bytes a second, so that a pool's data disk and its log device are
    told apart (the totals above sum over the disks)."""
    out = []
    for name, a, b in zip(disks, before, after):
        d = [y - x for x, y in zip(a, b)]
        out.append({"disk": os.path.basename(name),
                    "read_per_byte": d[1] / moved,
                    "written_per_byte": d[3] / moved,
                    "iops": (d[0] + d[2]) / seconds,
                    "bps": (d[1] + d[3]) / seconds})
    return out


def fio_jobs(paths, size, rw, bs, iodepth, runtime_s, offset=0):
    """fio with one job per path, all at once; one stats dict per job."""
    if len(paths) == 1:
        return [_job(fio(paths[0], size, rw, bs, iodepth, runtime_s,
                         offset))]
    import json
    import tempfile
    from measure import FIO_FLAGS
    argv = ["fio", "--size=%d" % size, "--rw=" + rw, "--bs=" + bs,
            "--iodepth=%d" % iodepth, "--offset=%d" % offset] + FIO_FLAGS
    if runtime_s is not None:
        argv += ["--time_based", "--runtime=%d" % runtime_s]
    for i, path in enumerate(paths):
        argv += ["--name=job%d" % i, "--filename=" + path]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        common.run(argv + ["--output=" + out.name])
        with open(out.name) as f:
            text = f.read()
    jobs = json.loads(text[text.index("{"):])["jobs"]
    side = "read" if "read" in rw else "write"
    for job in jobs:
        if job.get("error"):
            raise RuntimeError("fio %s: error %s" % (rw, job["error"]))
    return [_job(job[side]) for job in jobs]


CLAT_PERCENTILES = ("50", "99")


def _job(stats):
    """What a run keeps of fio's stats: totals, and the completion
    latency (fio's clat: submission to completion, in microseconds) at
    the median and the 99th percentile, and its mean."""
    clat = stats.get("clat_ns") or {}
    pct = clat.get("percentile") or {}
    lat = dict(("p" + p, pct["%s.000000" % p] / 1000.0)
               for p in CLAT_PERCENTILES if "%s.000000" % p in pct)
    if "mean" in clat:
        lat["mean"] = clat["mean"] / 1000.0
    return {"runtime": stats["runtime"], "total_ios": stats["total_ios"],
            "io_bytes": stats["io_bytes"], "clat_us": lat}


def fill(targets, size):
    """Write every byte of every target once (4M sequential), durably. A
    zvol is filled with sync=disabled, then given back its own setting:
    the fill lays the data out, it is not measured, and under zfs-ng's
    sync=always each write would also go through the ZIL on the slow
    disk (the same blocks in the end, at half the speed)."""
    for t in targets:
        start = time.time()
        restore = _sync_off(t.dataset) if t.dataset else None
        try:
            fio(t.path, size, "write", "4M", 4)
        finally:
            if restore:
                common.run(restore)
        t.sync()
        common.log("disk-bound: filled %s (%d MiB) in %.0fs", t.path,
                   size // MIB, time.time() - start)


def _sync_off(dataset):
    """zfs set sync=disabled; returns the argv that puts it back."""
    value, source = common.run(["zfs", "get", "-Hp", "-o", "value,source",
                                "sync", dataset]).strip().split("\t")
    common.run(["zfs", "set", "sync=disabled", dataset])
    if source == "local":
        return ["zfs", "set", "sync=" + value, dataset]
    return ["zfs", "inherit", "sync", dataset]


def quiet(argv, timeout=300):
    """A cleanup step: log a failure, never raise."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        common.log("disk-bound cleanup: %s: no end in %d s",
                   " ".join(argv), timeout)
        return
    if proc.returncode:
        common.log("disk-bound cleanup: %s: %s", " ".join(argv),
                   proc.stdout.strip()[-200:])


# --- backends beyond bench_datapath's ----------------------------------------

DATAPATH_PLUGIN = "usr/libexec/xapi-storage-script/datapath/zfs-ng"
GUEST_DOMAIN = "5"


class DatapathDisk(object):
    """A zfs-ng VDI on an SR, attached as xapi attaches a guest's disk
    (Datapath.open, attach with a guest domain, activate): ``dev`` is the
    tapdev its XenDisk names. ``close()`` undoes it."""

    def __init__(self, ctx, sr, size, name):
        from plugin_client import Plugin
        self.ctx, self.sr = ctx, sr
        self.dp = Plugin(ctx.plugin.root, plugin_dir=DATAPATH_PLUGIN,
                         env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})
        self.steps = []
        self.vol = ctx.new_volume(size, name=name, sr=sr)
        self.uri = self.vol["uri"][0]
        self.dp("Datapath.open", uri=self.uri, persistent=True)
        self.steps.append("Datapath.close")
        result = self.dp("Datapath.attach", uri=self.uri,
                         domain=GUEST_DOMAIN)
        self.steps.append("Datapath.detach")
        xendisk = [i for i in result["implementations"] if i[0] == "XenDisk"]
        if not xendisk:
            raise RuntimeError("Datapath.attach gave no XenDisk: %r" % result)
        self.dp("Datapath.activate", uri=self.uri, domain=GUEST_DOMAIN)
        self.steps.append("Datapath.deactivate")
        self.dev = xendisk[0][1]["params"]
        _wait_size(self.dev)

    def close(self):
        for method in reversed(self.steps):
            args = {"uri": self.uri}
            if method != "Datapath.close":
                args["domain"] = GUEST_DOMAIN
            try:
                self.dp(method, **args)
            except Exception as exc:   # noqa: BLE001 -- cleanup goes on
                common.log("disk-bound cleanup: %s: %s", method, exc)
        self.steps = []


def _wait_size(dev, timeout=30):
    deadline = time.time() + timeout
    while True:
        try:
            if int(common.run(["blockdev", "--getsize64", dev])) > 0:
                return
        except Exception:   # noqa: BLE001 -- not there yet
            pass
        if time.time() > deadline:
            raise RuntimeError("timed out waiting for " + dev)
        time.sleep(0.1)


class Ext4Vhd(object):
    """SMAPIv1's local EXT SR on a block device: ext4 (mkfs defaults),
    a dynamic VHD on it (``vhd-util create``), tapdisk ``vhd:`` opened
    with ``-D``, as SMAPIv1 opens an EXT SR's VDIs. In blktap 3.55.5
    ``-D`` only reaches read-only images: the writable leaf is opened
    O_DIRECT whatever it says (drivers/block-vhd.c:802-807,
    vhd/lib/libvhd.c:2743-2744), the parent under a snapshot is read
    through the page cache.
    ``snapshot()`` is SMAPIv1's VDI.snapshot: an empty leaf on the
    filled parent, tapdisk reopened on it. SMAPIv1 puts LVM under the
    file system; a linear LV adds nothing measurable and is left out."""

    def __init__(self, device, mountpoint, size):
        from bench_datapath import Tapdisk
        self.mnt = mountpoint
        self.mounted = False
        self.tap = None
        self.leaf = None
        self.leaves = 0
        common.run(["mkfs.ext4", "-q", "-F", device])
        os.makedirs(mountpoint, exist_ok=True)
        # noinit_itable: no background zeroing of inode tables, which
        # would take the slow disk's bandwidth from the runs for minutes
        common.run(["mount", "-o", "noinit_itable", device, mountpoint])
        self.mounted = True
        self.parent = os.path.join(mountpoint, "disk.vhd")
        common.run(["vhd-util", "create", "-n", self.parent,
                    "-s", str(size // MIB)])
        self.tap = Tapdisk("vhd:" + self.parent, no_direct=True)
        self.dev = self.tap.dev
        _wait_size(self.dev)

    def snapshot(self):
        old = self.leaf
        self.leaves += 1
        self.leaf = os.path.join(self.mnt, "leaf-%d.vhd" % self.leaves)
        common.run(["vhd-util", "snapshot", "-n", self.leaf,
                    "-p", self.parent])
        self.tap.reopen("vhd:" + self.leaf)
        if old:
            os.unlink(old)

    def close(self):
        if self.tap:
            self.tap.close()
            self.tap = None
        if self.mounted:
            quiet(["umount", self.mnt])
            self.mounted = False


class MdRaid(object):
    """Linux software RAID over whole disks, made with ``--assume-clean``:
    the disks are blank, so parity already matches, and no resync eats
    the throttled disks' bandwidth during the runs."""

    DEV = "/dev/md/bench"

    def __init__(self, level, devices):
        self.devices = devices
        settle()
        common.run(["mdadm", "--create", self.DEV, "--run", "--quiet",
                    "--assume-clean", "--metadata=1.2",
                    "--level=%s" % level,
                    "--raid-devices=%d" % len(devices)] + list(devices))
        self.dev = os.path.realpath(self.DEV)

    def close(self):
        quiet(["mdadm", "--stop", self.DEV])
        for d in self.devices:
            quiet(["mdadm", "--zero-superblock", d])
            quiet(["wipefs", "-a", d])


def nice_tapdisks():
    """Every tapdisk at the lowest CPU priority (see bench_disk_bound's
    scaling: their spinning on the tapdev's ring is the rig's)."""
    pids = common.run(["pgrep", "-x", "tapdisk"]).split()
    common.run(["renice", "-n", "19", "-p"] + pids)


def settle():
    """Wait (bounded) for udev to finish with the disks, before a pool or
    an array is made on them: its probes after a wipe or an array's stop
    hold them open for a moment, and a zpool create then finds them
    "currently unavailable"."""
    quiet(["udevadm", "settle", "--timeout=60"])
