"""Disk-bound: the launch benchmark where the disk is the bottleneck.

Vates' launch benchmark of the ZFS SR ran on one cheap SATA SSD, where
the disk bounds every backend: tap-zvol beat a VHD file on a dataset about
2x on sequential writes, 3x on sequential reads and 12-13x on 4k random
I/O. Under QEMU TCG the emulated CPU bounds every backend instead and the
datapath section's ratios collapse towards 1. This section runs with every
pool disk throttled by QEMU (``run.sh --throttle``, limits chosen by the
``ceilings`` section: diskrig), the ARC and dirty data capped and the
caches dropped before each run (diskrig), so the disk bounds again:

1. **launch**: the launch post's experiment on one throttled disk,
   through the real tapdisk, without and with a snapshot (as in the
   datapath section: a ZFS snapshot for the zvol and the raw file, a
   two-deep VHD chain for the VHDs), its four workloads, interleaved
   repeats, per-run paired ratios:
   ``tap-zvol`` (zfs-ng), ``tap-vhd-file`` (SMAPIv1's ZFS SR: a VHD in a
   dataset, O_DIRECT), ``tap-raw-file`` (the "apples to apples" control:
   a raw file in the same kind of dataset) on the pool of disk 1, and
   ``tap-vhd-ext4`` (SMAPIv1's local EXT SR: a VHD on ext4, tapdisk
   opened with -D as SMAPIv1 does, which leaves the writable leaf
   O_DIRECT: diskrig.Ext4Vhd) on disk 2, a disk with the same limits; and
   ``tap-zvol-std``, a zfs-ng VDI on an SR made with sync=standard
   instead of zfs-ng's sync=always (every write in the ZIL before it
   completes, here on the same disk): what the launch post's zvol had,
   and what the SMAPIv1 backends get (none of them makes a write stable
   before it completes). On request (main.py --backends), zfs-ng VDIs on
   SRs with other options, paired with tap-zvol: ``tap-zvol-16k``,
   ``tap-zvol-8k`` and ``tap-zvol-4k`` (volblocksize; tap-zvol has the
   default, 8K on this one-disk pool) and ``tap-zvol-tput``
   (logbias=throughput).
2. **scaling**: 1, 2 and 4 zfs-ng VDIs on the one-disk pool, each
   attached through the datapath plugin and driven by its own fio job at
   once: the total against one VDI's, and how evenly they share it.
3. **layouts**: zfs-ng on two striped 2-way mirrors, raidz1 and raidz2 of
   disks 3-6, against a VHD on ext4 on mdadm RAID 10, 5 and 6 of the same
   disks.
4. **cbt_list**: the CBT section's listing benchmark on the one-disk
   pool: what list_changed_blocks' zdb walk costs against reading the
   changed bytes once when the reading is disk-bound (cbt_list()).
5. **latency**: sync-write latency at queue depth 1 (the one figure the
   throughput runs cannot show): zfs-ng VDIs through the datapath plugin
   and tapdisk on SRs with ``logbias=latency`` and ``logbias=throughput``
   at 16K and 8K blocks, 4k and 64k random writes one at a time, p50 and
   p99 of fio's completion latency, interleaved and paired per run
   (latency()).

6. **redundant**: 8K blocks with and without
   ``redundant_metadata=most`` against the 16K default (and 16K with
   it), the launch part's four workloads, the ARC's cap raised for the
   part (diskrig.ARC_SMALL_BLOCKS: why, there) (redundant()).
7. **slog**: a log device, throttled like the pool's disks: a pool on
   disk 2 with disk 3 added as its log against the one-disk pool,
   logbias latency and throughput on each, 16K blocks, sync=always;
   disk bytes per byte on the data disk and on the log device, and the
   throughput and sync-write latency (slog()).

Every run records the disk's requests and bytes a second (per disk) next
to the limits: ``disk_util`` near 1 is the evidence the disk bound it.

Without main.py --parts only DEFAULT_PARTS run, launch and latency: the
two parts the defaults are judged by, in under two hours with the
ceilings boot. The others answered one question each and stay runnable
by name.
"""

import statistics
import traceback

import common
import diskrig
from bench_datapath import LAUNCH, TARGETS, Backends
from diskrig import Target

RATIOS = {
    "zvol_vs_vhd": ("tap-zvol", "tap-vhd-file"),      # the launch benchmark
    "raw_vs_vhd": ("tap-raw-file", "tap-vhd-file"),   # apples to apples
    "zvol_vs_raw": ("tap-zvol", "tap-raw-file"),
    "zvol_vs_ext4_vhd": ("tap-zvol", "tap-vhd-ext4"),  # SMAPIv1's EXT SR
    "zvolstd_vs_vhd": ("tap-zvol-std", "tap-vhd-file"),  # sync=standard
    # the volblocksize question, against the default (8K on one disk;
    # 16K until it was chosen by these figures)
    "zvol16k_vs_zvol": ("tap-zvol-16k", "tap-zvol"),
    "zvol8k_vs_zvol": ("tap-zvol-8k", "tap-zvol"),
    "zvol4k_vs_zvol": ("tap-zvol-4k", "tap-zvol"),
    # sync writes straight to their blocks instead of through the ZIL
    "zvoltput_vs_zvol": ("tap-zvol-tput", "tap-zvol"),
    "zvoltput_vs_vhd": ("tap-zvol-tput", "tap-vhd-file"),
}
LAYOUTS = [
    # name, zpool vdev arguments (on disks 3-6), mdadm level
    ("mirror-2x2", ["mirror", 3, 4, "mirror", 5, 6], "10"),
    ("raidz1", ["raidz1", 3, 4, 5, 6], "5"),
    ("raidz2", ["raidz2", 3, 4, 5, 6], "6"),
]
SCALE = [1, 2, 4]
# The latency part's VDIs: name, SR device-config (zfs-ng's own options;
# sync=always, the default, on all of them; the block size always given,
# since the default follows the pool's layout), and its sync workloads.
LATENCY_VARIANTS = [
    ("16k-latency", {"volblocksize": "16K", "logbias": "latency"}),
    ("16k-throughput", {"volblocksize": "16K", "logbias": "throughput"}),
    ("8k-latency", {"volblocksize": "8K", "logbias": "latency"}),
    ("8k-throughput", {"volblocksize": "8K", "logbias": "throughput"}),
]
LATENCY_WORKLOADS = [("syncwrite-4k-qd1", "randwrite", "4k", 1),
                     ("syncwrite-64k-qd1", "randwrite", "64k", 1)]
EXT4_MNT = "/var/tmp/zfsng-bench/ext4"
# The redundant part's VDIs: name, SR device-config, ZFS properties set
# on the SR's dataset (its zvols inherit them).
REDUNDANT_VARIANTS = [
    ("16k", {"volblocksize": "16K"}, {}),
    ("16k-most", {"volblocksize": "16K"}, {"redundant_metadata": "most"}),
    ("8k", {"volblocksize": "8K"}, {}),
    ("8k-most", {"volblocksize": "8K"}, {"redundant_metadata": "most"}),
]
# (numerator, denominator) of the redundant part's paired ratios
REDUNDANT_PAIRS = [("8k", "16k"), ("8k-most", "16k"), ("16k-most", "16k"),
                   ("8k-most", "8k")]
# The slog part's VDIs: name, on the pool with a log device or not, the
# SR's device-config (16K blocks, as the reports were made with, and
# sync=always).
SLOG_VARIANTS = [
    ("nolog-latency", False, {"volblocksize": "16K", "logbias": "latency"}),
    ("nolog-throughput", False, {"volblocksize": "16K",
                                 "logbias": "throughput"}),
    ("log-latency", True, {"volblocksize": "16K", "logbias": "latency"}),
    ("log-throughput", True, {"volblocksize": "16K",
                              "logbias": "throughput"}),
]
SLOG_PAIRS = [("log-latency", "nolog-latency"),
              ("log-throughput", "nolog-latency"),
              ("nolog-throughput", "nolog-latency"),
              ("log-throughput", "log-latency")]
SLOG_WORKLOADS = [("randwrite-4k", "randwrite", "4k", 128),
                  ("seqwrite-4M", "write", "4M", 4),
                  ("syncwrite-4k-qd1", "randwrite", "4k", 1)]
SLOG_POOL = "slog"


def plan(ctx):
    """Sizes and run lengths: each device twice the ARC's cap (the launch
    post: 10 GiB written through a 4 GiB ARC at most). Full: about 100
    minutes with 3 runs."""
    if ctx.quick:
        return {"size_bytes": 64 * diskrig.MIB, "runtime_s": 3,
                "seq_bytes": 4 * diskrig.MIB, "ceiling_runtime_s": 2,
                "ceiling_seq_bytes": 16 * diskrig.MIB,
                "runs": ctx.runs, "layout_runs": ctx.runs,
                "latency_size_bytes": 8 * diskrig.MIB,
                "latency_runtime_s": 3,
                "defaults_size_bytes": 16 * diskrig.MIB,
                "slog_size_bytes": 16 * diskrig.MIB,
                "defaults_seq_bytes": 4 * diskrig.MIB}
    return {"size_bytes": 2 * diskrig.ARC_MAX, "runtime_s": 10,
            "seq_bytes": 16 * diskrig.MIB, "ceiling_runtime_s": 4,
            "ceiling_seq_bytes": 64 * diskrig.MIB,
            "runs": ctx.runs, "layout_runs": max(1, ctx.runs - 1),
            "latency_size_bytes": 32 * diskrig.MIB,
            "latency_runtime_s": 10,
            # redundant and slog: four VDIs each, filled on the slow
            # disk, within about 15 minutes a version at 2 runs (the
            # slog part reads nothing: half the size)
            "defaults_size_bytes": 48 * diskrig.MIB,
            "slog_size_bytes": 32 * diskrig.MIB,
            "defaults_seq_bytes": 8 * diskrig.MIB}


class Launch(object):
    """The launch experiment's backends (module docstring) as diskrig
    Targets; ``snapshot(name)`` gives one a fresh snapshot. ``names``:
    the backends run, NAMES unless main.py --backends chose others."""

    NAMES = ["tap-zvol", "tap-vhd-file", "tap-raw-file", "tap-vhd-ext4",
             "tap-zvol-std"]
    # zfs-ng VDIs on SRs made with other device-config options than the
    # defaults (8K blocks on one disk, sync=always): what an admin can
    # choose; and
    # ZFS properties set on the SR's dataset, which its zvols inherit.
    # All but the first run on request only (--backends), to weigh the
    # defaults against them.
    VARIANTS = {"tap-zvol-std": ({"sync": "standard"}, {}),
                "tap-zvol-16k": ({"volblocksize": "16K"}, {}),
                "tap-zvol-8k": ({"volblocksize": "8K"}, {}),
                "tap-zvol-4k": ({"volblocksize": "4K"}, {}),
                "tap-zvol-tput": ({}, {"logbias": "throughput"})}

    def __init__(self, ctx, size):
        self.names = list(ctx.backends or self.NAMES)
        known = [n for n in self.NAMES if n not in self.VARIANTS] + \
            sorted(self.VARIANTS)
        unknown = set(self.names) - set(known)
        if unknown:
            raise ValueError("unknown backends: %s (known: %s)" % (
                ", ".join(sorted(unknown)), ", ".join(known)))
        self.ctx = ctx
        self.size = size
        self.zfs = Backends(ctx, size)
        self.ext4 = None
        self.variants = {}      # name: (SR, DatapathDisk)
        self.snapshots = []     # (SR, key) of the variants' snapshots
        self.targets = {}

    def setup(self):
        self.zfs.setup()
        pool = diskrig.zpool_syncer(self.ctx.pool)
        for name in self.NAMES[:3]:
            if name in self.names:
                self.targets[name] = Target(self.zfs.paths[name], pool,
                                            [diskrig.disk(1)])
        if "tap-zvol" in self.targets:
            self.targets["tap-zvol"].dataset = common.volume_dataset(
                self.zfs.vol)
        if "tap-vhd-ext4" in self.names:
            self.ext4 = diskrig.Ext4Vhd(diskrig.disk(2), EXT4_MNT,
                                        self.size)
            self.targets["tap-vhd-ext4"] = Target(
                self.ext4.dev, diskrig.fs_syncer(EXT4_MNT),
                [diskrig.disk(2)])
        for name, (options, props) in sorted(self.VARIANTS.items()):
            if name not in self.names:
                continue
            sr = self.ctx.new_sr("bench-" + name, **options)
            for prop in sorted(props.items()):
                common.run(["zfs", "set", "%s=%s" % prop, sr])
            vdi = diskrig.DatapathDisk(self.ctx, sr, self.size, name)
            self.variants[name] = (sr, vdi)
            self.targets[name] = Target(
                vdi.dev, pool, [diskrig.disk(1)],
                dataset=common.volume_dataset(vdi.vol))

    def snapshot(self, name):
        if name == "tap-vhd-ext4":
            self.ext4.snapshot()
        elif name in self.variants:
            sr, vdi = self.variants[name]
            snap = self.ctx.plugin("Volume.snapshot", sr=sr,
                                   key=vdi.vol["key"])
            self.snapshots.append((sr, snap["key"]))
        else:
            self.zfs.snapshot(name)

    def close(self):
        if self.ext4:
            self.ext4.close()
        for sr, vdi in self.variants.values():
            vdi.close()
        for sr, key in self.snapshots:
            _destroy_volume(self.ctx, sr, {"key": key})
        for sr, vdi in self.variants.values():
            _destroy_volume(self.ctx, sr, vdi.vol)
        self.zfs.teardown()


def run(ctx):
    iops, bps = diskrig.limits(ctx, "disk-bound", "bench-disk-bound")
    plan_ = plan(ctx)
    out = {"tuning": diskrig.tune(bps), "ssd": diskrig.SSD,
           "throttle": {"iops": iops, "bps": bps},
           "size_mib": plan_["size_bytes"] // diskrig.MIB,
           "runtime_s": plan_["runtime_s"], "runs": plan_["runs"],
           "layout_runs": plan_["layout_runs"],
           "latency_size_mib": plan_["latency_size_bytes"] // diskrig.MIB,
           "latency_runtime_s": plan_["latency_runtime_s"],
           "defaults_size_mib": plan_["defaults_size_bytes"] // diskrig.MIB,
           "slog_size_mib": plan_["slog_size_bytes"] // diskrig.MIB,
           "defaults_seq_mib": plan_["defaults_seq_bytes"] // diskrig.MIB,
           "launch": LAUNCH, "targets": TARGETS}
    out["failed_parts"] = []
    for name, part in PARTS:
        out[name] = []
        if name not in (ctx.parts or DEFAULT_PARTS):
            continue
        try:
            out[name] = part(ctx, plan_)
        except Exception:   # keep the other parts' figures
            traceback.print_exc()
            out["failed_parts"].append(name)
    for name in ("launch_runs", "scaling", "layouts", "latency",
                 "redundant", "slog"):
        for m in out[name]:
            m["disk_util"] = max(m["disk_iops"] / iops, m["disk_bps"] / bps)
            for p in m.get("per_disk", []):
                p["util"] = max(p["iops"] / iops, p["bps"] / bps)
    out["ratios"] = ratios(out["launch_runs"])
    out["latency_ratios"] = latency_ratios(out["latency"])
    out["redundant_ratios"] = pair_ratios(out["redundant"],
                                          REDUNDANT_PAIRS)
    out["slog_ratios"] = pair_ratios(out["slog"], SLOG_PAIRS)
    out["snapshot_penalty"] = snapshot_penalty(out["launch_runs"])
    return out


def _record(m, **labels):
    m.update(labels)
    return m


def launch(ctx, plan_):
    """The launch experiment: every run, labelled."""
    exp = Launch(ctx, plan_["size_bytes"])
    runs = []
    try:
        exp.setup()
        diskrig.fill(list(exp.targets.values()), plan_["size_bytes"])
        for snapshot in (False, True):
            if snapshot:
                for name in exp.names:
                    exp.snapshot(name)
            for workload in diskrig.WORKLOADS:
                for i in range(plan_["runs"]):
                    for name in exp.names:
                        if snapshot and "write" in workload[1]:
                            exp.snapshot(name)
                        m = diskrig.measure(
                            [exp.targets[name]], plan_["size_bytes"],
                            workload, plan_["runtime_s"],
                            k=i + (plan_["runs"] if snapshot else 0),
                            seq_bytes=plan_["seq_bytes"])
                        runs.append(_record(m, backend=name, run=i,
                                            workload=workload[0],
                                            snapshot=snapshot))
                common.log("disk-bound: launch %s%s done", workload[0],
                           " (snapshot)" if snapshot else "")
    finally:
        exp.close()
    return runs


def scaling(ctx, plan_):
    """1, 2, 4 VDIs at once on the one-disk pool.

    Each VDI is as large as the launch part's (twice the ARC's cap): a
    smaller one would fit the ARC's floor, and the runs of one VDI would
    read from memory what those of four read from the disk. The tapdisks
    run at the lowest priority: each spins on its tapdev's ring while a
    request is outstanding (BENCHMARKS.md), and four of them would take
    the one vCPU from ZFS and fio, which a VM's disk, served through its
    Xen ring, never does."""
    size = plan_["size_bytes"]
    disks, runs = [], []
    try:
        for i in range(max(SCALE)):
            disks.append(diskrig.DatapathDisk(ctx, ctx.sr, size,
                                              "scale-%d" % i))
        diskrig.nice_tapdisks()
        targets = [Target(d.dev, diskrig.zpool_syncer(ctx.pool),
                          [diskrig.disk(1)],
                          dataset=common.volume_dataset(d.vol))
                   for d in disks]
        diskrig.fill(targets, size)
        for workload in diskrig.WORKLOADS:
            for i in range(plan_["runs"]):
                for n in SCALE:
                    m = diskrig.measure(targets[:n], size, workload,
                                        plan_["runtime_s"], k=i,
                                        seq_bytes=plan_["seq_bytes"] // n)
                    runs.append(_record(m, vdis=n, run=i,
                                        workload=workload[0]))
            common.log("disk-bound: scaling %s done", workload[0])
    finally:
        for d in disks:
            d.close()
            _destroy_volume(ctx, ctx.sr, d.vol)
    return runs


def layouts(ctx, plan_):
    """Each ZFS layout and its mdadm RAID counterpart on disks 3-6."""
    runs = []
    for name, vdevs, level in LAYOUTS:
        runs += _zfs_layout(ctx, plan_, name, vdevs)
        runs += _md_layout(plan_, name, level)
        common.log("disk-bound: layout %s / RAID %s done", name, level)
    return runs


def _layout_runs(target, disks, plan_, **labels):
    diskrig.fill([target], plan_["size_bytes"])
    runs = []
    for workload in diskrig.WORKLOADS:
        for i in range(plan_["layout_runs"]):
            m = diskrig.measure([target], plan_["size_bytes"], workload,
                                plan_["runtime_s"], k=i,
                                seq_bytes=plan_["seq_bytes"])
            runs.append(_record(m, run=i, workload=workload[0], **labels))
    return runs


class PoolSR(object):
    """A pool made on disks 3-6 (zpool vdev arguments, disk numbers as
    ints) and a zfs-ng SR adopting it, as ``with`` block; on the way out
    the SR is detached, the pool destroyed and the disks wiped, whatever
    failed."""

    def __init__(self, ctx, name, pool, vdevs):
        self.ctx, self.name, self.pool = ctx, name, pool
        self.disks = [diskrig.disk(v) for v in vdevs if isinstance(v, int)]
        self.argv = [v if isinstance(v, str) else diskrig.disk(v)
                     for v in vdevs]
        self.sr = None

    def __enter__(self):
        diskrig.settle()
        common.run(["zpool", "create", "-f", "-o", "cachefile=none",
                    "-o", "ashift=12", "-m", "none", self.pool] + self.argv)
        try:
            config = self.ctx.plugin("SR.create", uuid=common.new_uuid(),
                                     name=self.name, description="",
                                     configuration={"zpool": self.pool})
            self.sr = self.ctx.plugin("SR.attach", configuration=config)
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        if self.sr:
            try:
                self.ctx.plugin("SR.detach", sr=self.sr)
            except Exception as err:   # noqa: BLE001 -- cleanup goes on
                common.log("disk-bound cleanup: SR.detach: %s", err)
        diskrig.quiet(["zpool", "destroy", "-f", self.pool])
        for d in self.disks:
            diskrig.quiet(["wipefs", "-a", d])
        return False


def _zfs_layout(ctx, plan_, name, vdevs):
    with PoolSR(ctx, "layout-" + name, "layout", vdevs) as p:
        vdi = diskrig.DatapathDisk(ctx, p.sr, plan_["size_bytes"], name)
        try:
            target = Target(vdi.dev, diskrig.zpool_syncer(p.pool), p.disks,
                            dataset=common.volume_dataset(vdi.vol))
            return _layout_runs(target, p.disks, plan_, layout=name,
                                kind="zfs", backend="tap-zvol")
        finally:
            vdi.close()


def _md_layout(plan_, name, level):
    disks = [diskrig.disk(n) for n in (3, 4, 5, 6)]
    md = diskrig.MdRaid(level, disks)
    vhd = None
    try:
        vhd = diskrig.Ext4Vhd(md.dev, EXT4_MNT + "-md", plan_["size_bytes"])
        target = Target(vhd.dev, diskrig.fs_syncer(EXT4_MNT + "-md"), disks)
        return _layout_runs(target, disks, plan_, layout=name, kind="md",
                            raid=level, backend="tap-vhd-ext4")
    finally:
        if vhd:
            vhd.close()
        md.close()


def cbt_list(ctx, plan_):
    """The CBT section's listing benchmark (bench_cbt.list_methods: a
    2 GiB disk, 1%, 10%, 50% of it rewritten; zdb's block births and an
    incremental zfs send against reading the changed bytes once) on a
    pool striped over the four throttled disks 3-6, where reading the
    changes costs what it costs on a real disk and not what the emulated
    CPU allows (the stripe: four times one disk's bandwidth, so that
    writing 2 GiB and more takes minutes, not half an hour)."""
    import copy
    import bench_cbt
    with PoolSR(ctx, "cbt-stripe", "cbt", [3, 4, 5, 6]) as p:
        on_stripe = copy.copy(ctx)
        on_stripe.sr, on_stripe.pool = p.sr, p.pool
        rows = bench_cbt.list_methods(on_stripe)
    common.log("disk-bound: cbt listing done")
    return rows


def latency(ctx, plan_):
    """Sync-write latency at queue depth 1, logbias=latency against
    logbias=throughput, at 16K and 8K blocks (LATENCY_VARIANTS: one SR
    each on the one-disk pool, one VDI each, attached as a guest's disk).

    The throughput runs (queue depths 4 and 128) show what logbias does
    to bytes on the disk; a guest that waits for each sync write before
    the next (a database's commit) sees the time of one write instead.
    With latency, no log device and blocks of 32K or less, OpenZFS
    copies the write into the log (one log write); with throughput the
    block is written, then the log record pointing at it. Which is
    faster per write is what this part measures. The VDIs are filled
    first (as the launch part's: a 4k write then rewrites a block that
    holds data), the caches dropped before each run; the order of the
    four rotates from run to run, so that none always follows another."""
    size = plan_["latency_size_bytes"]
    names = [n for n, _ in LATENCY_VARIANTS]
    vdis, runs = {}, []
    try:
        for name, options in LATENCY_VARIANTS:
            sr = ctx.new_sr("bench-lat-" + name, **options)
            vdis[name] = (sr, diskrig.DatapathDisk(ctx, sr, size,
                                                   "lat-" + name))
        targets, props = _variant_targets(ctx, vdis)
        diskrig.fill([targets[n] for n in names], size)
        for workload in LATENCY_WORKLOADS:
            for i in range(plan_["runs"]):
                for name in names[i % len(names):] + names[:i % len(names)]:
                    m = diskrig.measure([targets[name]], size, workload,
                                        plan_["latency_runtime_s"], k=i)
                    m.update(m.pop("clat_us")[0])
                    runs.append(_record(m, variant=name, run=i,
                                        workload=workload[0],
                                        **props[name]))
            common.log("disk-bound: latency %s done", workload[0])
    finally:
        for sr, vdi in vdis.values():
            vdi.close()
            _destroy_volume(ctx, sr, vdi.vol)
    return runs


def _variant_targets(ctx, vdis):
    """The targets of VDIs on the one-disk pool (disk 1), by name, and
    their zvols' properties as ZFS reads them back, by name: what the
    latency and redundant parts measure and label their runs with."""
    targets = dict(
        (name, Target(vdi.dev, diskrig.zpool_syncer(ctx.pool),
                      [diskrig.disk(1)],
                      dataset=common.volume_dataset(vdi.vol)))
        for name, (sr, vdi) in vdis.items())
    props = dict((name, _zvol_props(t.dataset))
                 for name, t in targets.items())
    return targets, props


def _zvol_props(dataset):
    """The zvol's volblocksize, logbias, sync and redundant_metadata as
    ZFS reads them back: the evidence the SR options reached it."""
    out = common.run(["zfs", "get", "-Hp", "-o", "property,value",
                      "volblocksize,logbias,sync,redundant_metadata",
                      dataset])
    return dict(line.split("\t") for line in out.strip().splitlines())


def rotated(names, i):
    """The i-th run's order: names turned by i, so that none always
    follows another (what one leaves on the disk, the prefetch's reads
    or the ZIL's, falls on each in turn)."""
    k = i % len(names) if names else 0
    return names[k:] + names[:k]


def _variant_runs(targets, names, props, size, workloads, runtime_s, runs,
                  seq_bytes, part):
    """Every workload, ``runs`` times, on each target in rotated order;
    each run labelled with its variant, run and the zvol's properties.
    The turn goes on from one workload to the next: restarted at each,
    the last target of a workload's last run was the first of the next
    workload's first run (the 16K VDI's random writes then came right
    after its own reads, with their blocks still in the ARC's floor).
    With three targets or more none ever runs twice in a row."""
    out = []
    turn = 0
    for workload in workloads:
        for i in range(runs):
            order = rotated(names, turn)
            turn += 1
            for name in order:
                m = diskrig.measure([targets[name]], size, workload,
                                    runtime_s, k=i, seq_bytes=seq_bytes)
                m.update(m.pop("clat_us")[0])
                out.append(_record(m, variant=name, run=i,
                                   workload=workload[0], **props[name]))
        common.log("disk-bound: %s %s done", part, workload[0])
    return out


def redundant(ctx, plan_):
    """8K blocks with and without redundant_metadata=most against the
    16K default (REDUNDANT_VARIANTS: one SR each on the one-disk pool,
    one VDI each, attached as a guest's disk), the launch part's four
    workloads, order rotating, with the ARC's cap raised to
    diskrig.ARC_SMALL_BLOCKS for the part (and put back after).

    redundant_metadata=all (the default) writes two copies of every
    indirect block; most keeps one of the lowest indirect level (and of
    dedup, no other metadata), which a random write rewrites every
    transaction group: the fewer bytes per write it saves is what this
    part weighs, with what 8K blocks save on reads."""
    size = plan_["defaults_size_bytes"]
    names = [n for n, _, _ in REDUNDANT_VARIANTS]
    vdis, runs = {}, []
    with diskrig.arc_cap(diskrig.ARC_SMALL_BLOCKS) as cap:
        try:
            for name, options, zprops in REDUNDANT_VARIANTS:
                sr = ctx.new_sr("bench-red-" + name, **options)
                for prop in sorted(zprops.items()):
                    common.run(["zfs", "set", "%s=%s" % prop, sr])
                vdis[name] = (sr, diskrig.DatapathDisk(ctx, sr, size,
                                                       "red-" + name))
            targets, props = _variant_targets(ctx, vdis)
            for n in names:
                props[n]["zfs_arc_max"] = cap.value
            diskrig.fill([targets[n] for n in names], size)
            runs = _variant_runs(targets, names, props, size,
                                 diskrig.WORKLOADS, plan_["runtime_s"],
                                 plan_["runs"], plan_["defaults_seq_bytes"],
                                 "redundant")
        finally:
            for sr, vdi in vdis.values():
                vdi.close()
                _destroy_volume(ctx, sr, vdi.vol)
    return runs


class LogPool(object):
    """A second one-disk pool (disk 2, made as the bench pool is), with
    disk 3 added as its log device (``zpool add POOL log DEV``, as an
    admin adds one), as ``with`` block; ``new_sr(name, **options)`` puts
    zfs-ng SRs on it. On the way out the SRs are detached, the pool
    destroyed and both disks wiped, whatever failed."""

    def __init__(self, ctx, pool=SLOG_POOL, data=2, log=3):
        self.ctx, self.pool = ctx, pool
        self.data, self.log = diskrig.disk(data), diskrig.disk(log)
        self.srs = []

    def __enter__(self):
        diskrig.settle()
        common.run(["zpool", "create", "-o", "cachefile=none",
                    "-o", "ashift=12", "-m", "none", self.pool, self.data])
        try:
            common.run(["zpool", "add", self.pool, "log", self.log])
        except Exception:
            self.__exit__()
            raise
        return self

    def new_sr(self, name, **options):
        config = self.ctx.plugin(
            "SR.create", uuid=common.new_uuid(), name=name,
            description="zfs-ng benchmark",
            configuration=dict(options, zpool=self.pool))
        sr = self.ctx.plugin("SR.attach", configuration=config)
        self.srs.append(sr)
        return sr

    def __exit__(self, *exc):
        for sr in self.srs:
            try:
                self.ctx.plugin("SR.detach", sr=sr)
            except Exception as err:   # noqa: BLE001 -- cleanup goes on
                common.log("disk-bound cleanup: SR.detach: %s", err)
        diskrig.quiet(["zpool", "destroy", "-f", self.pool])
        for d in (self.data, self.log):
            diskrig.quiet(["wipefs", "-a", d])
        return False


def slog(ctx, plan_):
    """A log device (SLOG_VARIANTS): zfs-ng SRs with logbias latency and
    throughput on the one-disk pool (disk 1) and on a pool of disk 2
    with disk 3 as its log, every disk under the same limits; 16K
    blocks, sync=always. Random and sequential writes (the launch
    part's) and sync writes one at a time: what a log device changes
    for each is where the ZIL's copies go. Reads never touch the log,
    so none are run. Each run records each disk's bytes per byte
    (diskrig.per_disk): data disk against log device."""
    size = plan_["slog_size_bytes"]
    names = [n for n, _, _ in SLOG_VARIANTS]
    vdis, runs = {}, []
    with LogPool(ctx) as lp:
        try:
            for name, with_log, options in SLOG_VARIANTS:
                sr = (lp.new_sr if with_log else ctx.new_sr)(
                    "bench-slog-" + name, **options)
                vdis[name] = (sr, diskrig.DatapathDisk(ctx, sr, size,
                                                       "slog-" + name))
            targets = {}
            for name, with_log, _ in SLOG_VARIANTS:
                vdi = vdis[name][1]
                pool, disks = ((lp.pool, [lp.data, lp.log]) if with_log
                               else (ctx.pool, [diskrig.disk(1)]))
                targets[name] = Target(
                    vdi.dev, diskrig.zpool_syncer(pool), disks,
                    dataset=common.volume_dataset(vdi.vol))
            props = dict((n, _zvol_props(targets[n].dataset))
                         for n in names)
            for name, with_log, _ in SLOG_VARIANTS:
                props[name]["log_device"] = with_log
            diskrig.fill([targets[n] for n in names], size)
            runs = _variant_runs(targets, names, props, size,
                                 SLOG_WORKLOADS, plan_["runtime_s"],
                                 plan_["runs"], plan_["defaults_seq_bytes"],
                                 "slog")
        finally:
            for sr, vdi in vdis.values():
                vdi.close()
                _destroy_volume(ctx, sr, vdi.vol)
    return runs


PARTS = [("launch_runs", launch), ("scaling", scaling),
         ("layouts", layouts), ("cbt_list", cbt_list),
         ("latency", latency), ("slog", slog), ("redundant", redundant)]
DEFAULT_PARTS = ("launch_runs", "latency")


def _destroy_volume(ctx, sr, vol):
    try:
        ctx.plugin("Volume.destroy", sr=sr, key=vol["key"])
    except Exception as exc:   # noqa: BLE001 -- cleanup goes on
        common.log("disk-bound cleanup: Volume.destroy: %s", exc)


# --- summaries -----------------------------------------------------------

def ratios(runs):
    """Per (ratio, workload, snapshot): per-run IOPS ratios (run i of one
    backend against run i of the other), summarised."""
    by = dict(((m["backend"], m["workload"], m["snapshot"], m["run"]), m)
              for m in runs)
    out = []
    for name, (num, den) in sorted(RATIOS.items()):
        for workload in [w[0] for w in diskrig.WORKLOADS]:
            for snapshot in (False, True):
                values = []
                for (b, w, s, i), m in sorted(by.items()):
                    if (b, w, s) != (num, workload, snapshot):
                        continue
                    other = by.get((den, w, s, i))
                    if other and other["iops"]:
                        values.append(m["iops"] / other["iops"])
                if values:
                    out.append({"ratio": name, "of": [num, den],
                                "workload": workload, "snapshot": snapshot,
                                "value": common.summary(values)})
    return out


def latency_ratios(runs):
    """Per (block size, workload): logbias=throughput over
    logbias=latency, run i against run i, for the p50 and p99 completion
    latencies (above 1: throughput is slower per write) and for IOPS."""
    by = dict(((m["variant"], m["workload"], m["run"]), m) for m in runs)
    out = []
    for size in ("16k", "8k"):
        for workload in [w[0] for w in LATENCY_WORKLOADS]:
            values = {"p50": [], "p99": [], "iops": []}
            for (v, w, i), m in sorted(by.items()):
                if (v, w) != (size + "-throughput", workload):
                    continue
                other = by.get((size + "-latency", w, i))
                for key in values:
                    if other and other.get(key) and m.get(key) is not None:
                        values[key].append(m[key] / other[key])
            if values["p50"]:
                out.append(dict(
                    [("volblocksize", size), ("workload", workload),
                     ("of", ["throughput", "latency"])] +
                    [(k, common.summary(v)) for k, v in values.items()
                     if v]))
    return out


PAIR_KEYS = ("iops", "disk_read_per_byte", "disk_written_per_byte",
             "p50", "p99")


def pair_ratios(runs, pairs):
    """Per (numerator, denominator, workload): run i of one variant over
    run i of the other, for IOPS, disk bytes read and written per byte,
    and the p50 and p99 completion latencies; summarised. A key either
    run lacks or has at zero is left out."""
    by = dict(((m["variant"], m["workload"], m["run"]), m) for m in runs)
    workloads = []
    for m in runs:
        if m["workload"] not in workloads:
            workloads.append(m["workload"])
    out = []
    for num, den in pairs:
        for workload in workloads:
            values = dict((k, []) for k in PAIR_KEYS)
            for (v, w, i), m in sorted(by.items()):
                other = by.get((den, w, i))
                if (v, w) != (num, workload) or not other:
                    continue
                for k in PAIR_KEYS:
                    if other.get(k) and m.get(k) is not None:
                        values[k].append(m[k] / other[k])
            if values["iops"]:
                out.append(dict(
                    [("of", [num, den]), ("workload", workload)] +
                    [(k, common.summary(v)) for k, v in values.items()
                     if v]))
    return out


def snapshot_penalty(runs):
    """Per (backend, workload): median IOPS with a snapshot / without."""
    out = []
    names = []
    for m in runs:
        if m["backend"] not in names:
            names.append(m["backend"])
    for name in names:
        for workload in [w[0] for w in diskrig.WORKLOADS]:
            med = {}
            for snapshot in (False, True):
                vals = [m["iops"] for m in runs if
                        (m["backend"], m["workload"], m["snapshot"]) ==
                        (name, workload, snapshot)]
                med[snapshot] = statistics.median(vals) if vals else None
            if med[False] and med[True] is not None:
                out.append({"backend": name, "workload": workload,
                            "with_over_without": med[True] / med[False]})
    return out
