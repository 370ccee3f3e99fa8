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
   without O_DIRECT) on disk 2, a disk with the same limits; and
   ``tap-zvol-8k``, a zfs-ng VDI on an SR made with volblocksize=8K
   (OpenZFS 2.1's default) beside zfs-ng's default 16K.
2. **scaling**: 1, 2 and 4 zfs-ng VDIs on the one-disk pool, each
   attached through the datapath plugin and driven by its own fio job at
   once: the total against one VDI's, and how evenly they share it.
3. **layouts**: zfs-ng on two striped 2-way mirrors, raidz1 and raidz2 of
   disks 3-6, against a VHD on ext4 on mdadm RAID 10, 5 and 6 of the same
   disks.
4. **cbt_list**: the CBT section's listing benchmark on the one-disk
   pool: what list_changed_blocks' zdb walk costs against reading the
   changed bytes once when the reading is disk-bound (cbt_list()).

Every run records the disk's requests and bytes a second (per disk) next
to the limits: ``disk_util`` near 1 is the evidence the disk bound it.
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
    "zvol8k_vs_vhd": ("tap-zvol-8k", "tap-vhd-file"),  # volblocksize 8K
}
LAYOUTS = [
    # name, zpool vdev arguments (on disks 3-6), mdadm level
    ("mirror-2x2", ["mirror", 3, 4, "mirror", 5, 6], "10"),
    ("raidz1", ["raidz1", 3, 4, 5, 6], "5"),
    ("raidz2", ["raidz2", 3, 4, 5, 6], "6"),
]
SCALE = [1, 2, 4]
EXT4_MNT = "/var/tmp/zfsng-bench/ext4"


def plan(ctx):
    """Sizes and run lengths. Full: about 70 minutes with 3 runs."""
    if ctx.quick:
        return {"size_bytes": 64 * diskrig.MIB, "runtime_s": 3,
                "ceiling_runtime_s": 2, "runs": ctx.runs,
                "layout_runs": ctx.runs}
    return {"size_bytes": 256 * diskrig.MIB, "runtime_s": 8,
            "ceiling_runtime_s": 4, "runs": ctx.runs,
            "layout_runs": max(1, ctx.runs - 1)}


class Launch(object):
    """The launch experiment's four backends (module docstring) as
    diskrig Targets; ``snapshot(name)`` gives one a fresh snapshot."""

    NAMES = ["tap-zvol", "tap-vhd-file", "tap-raw-file", "tap-vhd-ext4",
             "tap-zvol-8k"]

    def __init__(self, ctx, size):
        self.ctx = ctx
        self.size = size
        self.zfs = Backends(ctx, size)
        self.ext4 = None
        self.zvol8k = None
        self.sr8k = None
        self.snapshots8k = []
        self.targets = {}

    def setup(self):
        self.zfs.setup()
        pool = diskrig.zpool_syncer(self.ctx.pool)
        for name in self.NAMES[:3]:
            self.targets[name] = Target(self.zfs.paths[name], pool,
                                        [diskrig.disk(1)])
        self.ext4 = diskrig.Ext4Vhd(diskrig.disk(2), EXT4_MNT, self.size)
        self.targets["tap-vhd-ext4"] = Target(
            self.ext4.dev, diskrig.fs_syncer(EXT4_MNT), [diskrig.disk(2)])
        # volblocksize 8K, OpenZFS 2.1's default, against zfs-ng's 16K: an
        # SR option (device-config:volblocksize) an admin can choose
        self.sr8k = self.ctx.new_sr("bench-8k", volblocksize="8K")
        self.zvol8k = diskrig.DatapathDisk(self.ctx, self.sr8k, self.size,
                                           "zvol-8k")
        self.targets["tap-zvol-8k"] = Target(self.zvol8k.dev, pool,
                                             [diskrig.disk(1)])

    def snapshot(self, name):
        if name == "tap-vhd-ext4":
            self.ext4.snapshot()
        elif name == "tap-zvol-8k":
            snap = self.ctx.plugin("Volume.snapshot", sr=self.sr8k,
                                   key=self.zvol8k.vol["key"])
            self.snapshots8k.append(snap["key"])
        else:
            self.zfs.snapshot(name)

    def close(self):
        if self.ext4:
            self.ext4.close()
        if self.zvol8k:
            self.zvol8k.close()
            for key in self.snapshots8k:
                _destroy_volume(self.ctx, self.sr8k, {"key": key})
            _destroy_volume(self.ctx, self.sr8k, self.zvol8k.vol)
        self.zfs.teardown()


def run(ctx):
    if not ctx.throttle:
        raise RuntimeError("disk-bound needs the disks' limits: main.py "
                           "--throttle IOPS:BPS, as run.sh --throttle got "
                           "(make bench-disk-bound)")
    plan_ = plan(ctx)
    iops, bps = (int(x) for x in ctx.throttle.split(":"))
    out = {"tuning": diskrig.tune(), "ssd": diskrig.SSD,
           "throttle": {"iops": iops, "bps": bps},
           "size_mib": plan_["size_bytes"] // diskrig.MIB,
           "runtime_s": plan_["runtime_s"], "runs": plan_["runs"],
           "layout_runs": plan_["layout_runs"],
           "launch": LAUNCH, "targets": TARGETS}
    out["failed_parts"] = []
    for name, part in PARTS:
        out[name] = []
        if ctx.parts and name not in ctx.parts:
            continue
        try:
            out[name] = part(ctx, plan_)
        except Exception:   # keep the other parts' figures
            traceback.print_exc()
            out["failed_parts"].append(name)
    for name in ("launch_runs", "scaling", "layouts"):
        for m in out[name]:
            m["disk_util"] = max(m["disk_iops"] / iops, m["disk_bps"] / bps)
    out["ratios"] = ratios(out["launch_runs"])
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
                for name in exp.NAMES:
                    exp.snapshot(name)
            for workload in diskrig.WORKLOADS:
                for i in range(plan_["runs"]):
                    for name in exp.NAMES:
                        if snapshot and "write" in workload[1]:
                            exp.snapshot(name)
                        m = diskrig.measure(
                            [exp.targets[name]], plan_["size_bytes"],
                            workload, plan_["runtime_s"],
                            k=i + (plan_["runs"] if snapshot else 0))
                        runs.append(_record(m, backend=name, run=i,
                                            workload=workload[0],
                                            snapshot=snapshot))
                common.log("disk-bound: launch %s%s done", workload[0],
                           " (snapshot)" if snapshot else "")
    finally:
        exp.close()
    return runs


def scaling(ctx, plan_):
    """1, 2, 4 VDIs at once on the one-disk pool; each VDI a quarter of
    the working set, so the pool's data stays the same size."""
    size = plan_["size_bytes"] // max(SCALE)
    disks, runs = [], []
    try:
        for i in range(max(SCALE)):
            disks.append(diskrig.DatapathDisk(ctx, ctx.sr, size,
                                              "scale-%d" % i))
        targets = [Target(d.dev, diskrig.zpool_syncer(ctx.pool),
                          [diskrig.disk(1)]) for d in disks]
        diskrig.fill(targets, size)
        for workload in diskrig.WORKLOADS:
            for i in range(plan_["runs"]):
                for n in SCALE:
                    m = diskrig.measure(targets[:n], size, workload,
                                        plan_["runtime_s"], k=i)
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
                                plan_["runtime_s"], k=i)
            runs.append(_record(m, run=i, workload=workload[0], **labels))
    return runs


POOL = "layout"


def _zfs_layout(ctx, plan_, name, vdevs):
    disks = [diskrig.disk(v) for v in vdevs if isinstance(v, int)]
    argv = [v if isinstance(v, str) else diskrig.disk(v) for v in vdevs]
    common.run(["zpool", "create", "-f", "-o", "cachefile=none",
                "-o", "ashift=12", "-m", "none", POOL] + argv)
    vdi = sr = None
    try:
        config = ctx.plugin("SR.create", uuid=common.new_uuid(),
                            name="layout-" + name, description="",
                            configuration={"zpool": POOL})
        sr = ctx.plugin("SR.attach", configuration=config)
        vdi = diskrig.DatapathDisk(ctx, sr, plan_["size_bytes"], name)
        target = Target(vdi.dev, diskrig.zpool_syncer(POOL), disks)
        return _layout_runs(target, disks, plan_, layout=name, kind="zfs",
                            backend="tap-zvol")
    finally:
        if vdi:
            vdi.close()
        if sr:
            try:
                ctx.plugin("SR.detach", sr=sr)
            except Exception as exc:   # noqa: BLE001 -- cleanup goes on
                common.log("disk-bound cleanup: SR.detach: %s", exc)
        diskrig.quiet(["zpool", "destroy", "-f", POOL])
        for d in disks:
            diskrig.quiet(["wipefs", "-a", d])


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
    incremental zfs send against reading the changed bytes once) on the
    throttled one-disk pool, where reading the changes costs what it
    costs on a real disk and not what the emulated CPU allows."""
    import bench_cbt
    rows = bench_cbt.list_methods(ctx)
    common.log("disk-bound: cbt listing done")
    return rows


PARTS = [("launch_runs", launch), ("scaling", scaling),
         ("layouts", layouts), ("cbt_list", cbt_list)]


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


def snapshot_penalty(runs):
    """Per (backend, workload): median IOPS with a snapshot / without."""
    out = []
    for name in Launch.NAMES:
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
