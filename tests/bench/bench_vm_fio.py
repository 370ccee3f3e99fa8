"""fio inside a real Xen PV VM whose disks are zfs-ng VDIs (section
``vm-fio``, ``make bench-vm-fio``): blkfront in the domU, tapback and
tapdisk in dom0, the zvol under them, on a disk QEMU throttles.

Runs in the test guest booted as a Xen 4.17 host (tests/guest/run.sh
--xen --throttle), through tests/bench/main.py. The disk-bound rig's
conditions (diskrig.py, BENCHMARKS.md "Where the disk is the
bottleneck"), as its ``redundant`` part had them: the pool disks marked
non-rotational, the ARC capped at diskrig.ARC_SMALL_BLOCKS (OpenZFS 2.1
stalled with small blocks under 64 MiB), dirty data at 4 s of the
throttled disk, dom0's caches dropped (the ARC to its floor) and the disks
drained before every run; every VDI filled first; runs paired and their
order rotated.

One VM (xenops.Vm, as xenopsd starts one) with one disk per variant
(``VARIANTS``: zfs-ng SRs on the one-disk pool of disk 1 with 16K and 8K
blocks, and the same as sparse 8 GiB VDIs for the random writes;
``vhd-file``, SMAPIv1's ZFS SR, a VHD in a dataset of that pool;
``vhd-ext4``, SMAPIv1's local EXT SR, a VHD on ext4 on disk 2; both
through tapdisk as SMAPIv1 opens them; main.py --backends picks some,
--parts some workloads). The domU's init (tests/xen/vm-fio-domu)
runs what dom0 writes to its console's pty, one fio job at a time on the
raw /dev/xvdX with O_DIRECT (libaio), and prints fio's JSON report on its
console; between two jobs dom0 drains, drops and reads its counters. fio
and its shared libraries (Debian's fio is dynamically linked) are packed
into the domU's initramfs at run time from dom0's own files: no image
rebuild.

Per run: the guest's IOPS and MB/s and completion latency (fio's clat
p50 and p99, in the domU), and dom0's disk bytes read and written per
byte the guest moved (/sys/class/block of the pool's disk). Writes end
with fio's fsync (the guest's flush through blkfront), then dom0 makes
them durable (zpool sync, sync -f), timed: ``durable_iops`` counts that
time. Around each run also OpenZFS's own counters (zfs_counters): the
ZIL's kstat and the pool's txgs, to split the disk bytes of a write into
log blocks and txg syncs. A benchmark: it asserts no timing; under TCG
only ratios within a run count.

    python3 tests/bench/bench_vm_fio.py --report DIR    (the host: DIR's
        results.json -> DIR/report.md)
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "xen"))

# the domU's command loop and fio's files (shared with tests/xen's VM move
# tests)
from domufio import DOMU_MEMORY, OPTION, Console, fio_files, \
    fio_vm_class, verified  # noqa: E402,F401

MIB = 1024 * 1024
GIB = 1024 * MIB
# name, fio rw, block size, iodepth; reads first, on the layout the fill
# made, then writes (randread-4k-qd8 left out: it repeated qd1's ratio in
# the first report, and the guest time went to the writes' queue depths)
WORKLOADS = [
    ("randread-4k-qd1", "randread", "4k", 1),
    ("seqread-1M", "read", "1M", 4),
    ("randwrite-4k-qd1", "randwrite", "4k", 1),
    ("randwrite-4k-qd8", "randwrite", "4k", 8),
    ("randwrite-4k-qd32", "randwrite", "4k", 32),
    ("seqwrite-1M", "write", "1M", 4),
]
# name, SR device-config (zfs-ng's defaults otherwise: sync=always); the
# block size always set, whatever the default for the pool's layout is.
# The -8g ones: sparse 8 GiB VDIs (never filled: the throttled disk
# cannot fill 8 GiB), random writes only, spread over the whole size:
# whether the qd1 write figure is the 48 MiB VDI's (few indirect blocks,
# all rewritten every transaction group) or the block size's.
VARIANTS = [("16k", {"volblocksize": "16K"}), ("8k", {"volblocksize": "8K"}),
            ("16k-8g", {"volblocksize": "16K"}),
            ("8k-8g", {"volblocksize": "8K"})]
BIG = {"16k-8g": 8 * GIB, "8k-8g": 8 * GIB}
BIG_WORKLOADS = [w[0] for w in WORKLOADS if w[1] == "randwrite"]
# SMAPIv1's ZFS SR: a dynamic VHD in a dataset (recordsize 128K) on the
# zvols' pool, opened by tapdisk as SMAPIv1 opens it
# (bench_datapath.Backends.vhd_file)
VHD_FILE = "vhd-file"
EXT4 = "vhd-ext4"
NAMES = [n for n, _ in VARIANTS] + [VHD_FILE, EXT4]


def pairs(default):
    """(numerator, denominator) of the paired ratios: zfs-ng's default
    block size for this pool (default: "8k" or "16k") against the two
    SMAPIv1 SRs, and 8K against 16K at each VDI size."""
    return [(default, VHD_FILE), (default, EXT4), ("8k", "16k"),
            ("8k-8g", "16k-8g")]


def default_variant(version_text):
    """zfs-ng's default volblocksize on this one-disk pool under this
    OpenZFS (``zfs version``'s output: the module's line counts, as for
    the plugin), as the plugin chooses it (devconfig.default_volblocksize):
    "8k" or "16k"."""
    volume = os.path.join(HERE, "..", "..", "volume")
    if volume not in sys.path:
        sys.path.insert(0, volume)
    from zfsng import zfs
    from zfsng_volume import devconfig
    version = zfs.parse_version(version_text or "")
    return "%dk" % (devconfig.default_volblocksize(0, version) // 1024)


EXT4_MNT = "/var/tmp/zfsng-vm-fio-ext4"
FIO_FLAGS = ["--ioengine=libaio", "--direct=1", "--thread",
             "--refill_buffers", "--norandommap", "--randrepeat=0",
             "--percentile_list=50:99"]


def plan(ctx):
    """Sizes: the redundant part's (48 MiB VDIs, 8 MiB sequential runs,
    10 s random runs); 2 runs unless main.py --runs says otherwise."""
    if ctx.quick:
        return {"size_bytes": 16 * MIB, "runtime_s": 3,
                "seq_bytes": 4 * MIB, "runs": ctx.runs}
    return {"size_bytes": 48 * MIB, "runtime_s": 10, "seq_bytes": 8 * MIB,
            "runs": ctx.runs}


def run(ctx):
    import common
    import diskrig
    iops, bps = diskrig.limits(ctx, "vm-fio", "bench-vm-fio")
    plan_ = plan(ctx)
    names = list(NAMES)
    if ctx.backends:
        unknown = set(ctx.backends) - set(names)
        if unknown:
            raise ValueError("unknown vm-fio variants: %s"
                             % ", ".join(sorted(unknown)))
        names = list(ctx.backends)
    workloads = WORKLOADS
    if ctx.parts:
        unknown = set(ctx.parts) - set(w[0] for w in WORKLOADS)
        if unknown:
            raise ValueError("unknown vm-fio workloads: %s"
                             % ", ".join(sorted(unknown)))
        workloads = [w for w in WORKLOADS if w[0] in ctx.parts]
    plan_["workloads"] = workloads
    out = {"tuning": diskrig.tune(bps), "throttle": {"iops": iops,
                                                     "bps": bps},
           "size_mib": plan_["size_bytes"] // MIB,
           "runtime_s": plan_["runtime_s"],
           "seq_mib": plan_["seq_bytes"] // MIB, "runs": plan_["runs"],
           "variants": names, "workloads": workloads,
           "domu_memory_mib": DOMU_MEMORY, "big": BIG,
           "big_workloads": BIG_WORKLOADS,
           "default": default_variant(common.run(["zfs", "version"]))}
    with diskrig.arc_cap(diskrig.ARC_SMALL_BLOCKS) as cap:
        out["tuning"]["zfs_arc_max"] = cap.value
        bench = VmBench(ctx, names, plan_)
        out["runs_list"] = bench.runs
        try:
            bench.setup()
            out["props"] = bench.props
            out["domu"] = bench.boot()
            bench.measure_all()
            bench.halt()
        except Exception:
            # the runs done so far are kept, and the section fails
            import traceback
            traceback.print_exc()
            out["failed_parts"] = ["runs"]
            out["error"] = traceback.format_exc()[-2000:]
        finally:
            bench.close()
    out["ratios"] = pair_ratios(out["runs_list"], out["default"])
    return out


class VmBench(object):
    """The variants' disks, one VM with all of them, and the runs."""

    def __init__(self, ctx, names, plan_):
        self.ctx, self.names, self.plan = ctx, names, plan_
        self.vdis = {}          # name: (sr, vol)
        self.targets = {}       # name: diskrig.Target on dom0's side
        self.props = {}
        self.ext4 = None
        self.files = None       # bench_datapath.Backends: the VHD file
        self.vm = None
        self.console = None     # the domU's command loop (domufio)
        self.devs = {}          # name: the domU's xvdX
        self.runs = []          # each run's figures, as they come

    # --- the disks ---------------------------------------------------------

    def setup(self):
        import bench_disk_bound
        import common
        import diskrig
        size = self.plan["size_bytes"]
        for name, options in VARIANTS:
            if name not in self.names:
                continue
            sr = self.ctx.new_sr("vm-fio-" + name, **options)
            vol = self.ctx.new_volume(BIG.get(name, size),
                                      name="vm-fio-" + name, sr=sr)
            self.vdis[name] = (sr, vol)
            dataset = common.volume_dataset(vol)
            self.targets[name] = diskrig.Target(
                self.ctx.zvol_device(vol),
                diskrig.zpool_syncer(self.ctx.pool), [diskrig.disk(1)],
                dataset=dataset)
            self.props[name] = bench_disk_bound._zvol_props(dataset)
            if name in BIG:
                self.props[name]["sparse, not filled"] = "%d GiB" % (
                    BIG[name] // GIB)
        if VHD_FILE in self.names:
            import bench_datapath
            self.files = bench_datapath.Backends(self.ctx, size)
            self.targets[VHD_FILE] = diskrig.Target(
                self.files.vhd_file(), diskrig.zpool_syncer(self.ctx.pool),
                [diskrig.disk(1)])
            self.props[VHD_FILE] = {"image": "vhd in a dataset, recordsize "
                                    + common.run(["zfs", "get", "-Hpo",
                                                  "value", "recordsize",
                                                  self.files.datasets[0]])
                                    .strip()}
        if EXT4 in self.names:
            self.ext4 = diskrig.Ext4Vhd(diskrig.disk(2), EXT4_MNT, size)
            self.targets[EXT4] = diskrig.Target(
                self.ext4.dev, diskrig.fs_syncer(EXT4_MNT),
                [diskrig.disk(2)])
            self.props[EXT4] = {"image": "vhd on ext4, tapdisk -D"}
        # filled from dom0 before the VM plugs them: the zvols with
        # sync=disabled (diskrig.fill), the VHD through its tapdisk
        diskrig.fill([self.targets[n] for n in self.names if n not in BIG],
                     size)

    # --- the VM --------------------------------------------------------------

    def boot(self):
        """Start the VM with every variant's disk; returns what the domU
        said about itself (fio's version, its disks' sizes)."""
        import common
        vm_cls = fio_vm_class()
        from test_xen_vm import Store
        tmp = pathlib.Path("/var/tmp/zfsng-vm-fio")
        tmp.mkdir(parents=True, exist_ok=True)
        from plugin_client import Plugin
        dp = Plugin(self.ctx.plugin.root,
                    plugin_dir="usr/libexec/xapi-storage-script/datapath/"
                               "zfs-ng",
                    env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})
        self.vm = vm_cls(Store(), self.ctx.plugin, dp, self.ctx.sr,
                         "zfsng-vm-fio", tmp)
        for name in self.names:
            if name in (EXT4, VHD_FILE):
                disk = self.vm.add_disk(None)
                disk.tapdev = self.targets[name].path
            else:
                sr, vol = self.vdis[name]
                disk = self.vm.add_disk(vol, sr=sr)
        files, lib_bytes = fio_files()
        common.log("vm-fio: fio and %d libraries, %.1f MiB, into the "
                   "domU's initramfs", len(files) - 1, lib_bytes / MIB)
        self.console = Console(self.vm, log=lambda text: common.log(
            "%s", text))
        self.vm.start({}, files)
        for name, disk in zip(self.names, self.vm.disks):
            self.devs[name] = disk.vbd.dev
        lines = self.console.wait_line(lambda l: l.startswith("ready 1"),
                                       600)
        self.console.open()
        return {"lines": [l for l in lines if not l.startswith("result")],
                "devices": dict(self.devs),
                "initramfs_extra_mib": lib_bytes / MIB}

    def halt(self):
        """The domU powers itself off ("end"): VM_shutdown, then
        VBD_epoch_end (Datapath.close) as a VM halt leaves it."""
        self.console.command(["end"])
        self.vm.halted_by_guest()
        self.vm.epoch_end()

    # --- the runs ------------------------------------------------------------

    def measure_all(self):
        import bench_disk_bound
        import common
        runs = self.runs
        turn = 0
        for workload in self.plan.get("workloads", WORKLOADS):
            names = [n for n in self.names
                     if n not in BIG or workload[0] in BIG_WORKLOADS]
            for i in range(self.plan["runs"]):
                order = bench_disk_bound.rotated(names, turn)
                turn += 1
                for name in order:
                    m = self.measure(name, workload, i)
                    m.update(variant=name, run=i, workload=workload[0])
                    runs.append(m)
            common.log("vm-fio: %s done", workload[0])
        return runs

    def measure(self, name, workload, k):
        """One fio job in the domU on one variant's disk, cold dom0
        caches, drained disks; dom0's disk counters around it."""
        import diskrig
        from measure import arc_data_counts, disk_counts
        rw = workload[1]
        target = self.targets[name]
        options = fio_options(workload, k, self.plan, BIG.get(name))
        all_disks = sorted(set(d for t in self.targets.values()
                               for d in t.disks))
        every = diskrig.stat_files(all_disks)
        stats = diskrig.stat_files(target.disks)
        quiet_s = diskrig.wait_quiet(every)
        diskrig.drop_caches()
        for t in self.targets.values():
            t.sync()
        quiet_s += diskrig.wait_quiet(every)
        arc0, disk0 = arc_data_counts(), disk_counts(stats)
        zfs0 = zfs_counters(self.ctx.pool)
        tag = "%s-%s-r%d" % (workload[0], name, k)
        self.console.command(["fio", tag, self.devs[name]] + options)
        report = self.console.result(tag)
        start = time.perf_counter()
        if "write" in rw:
            target.sync()
        flush = time.perf_counter() - start
        arc1, disk1 = arc_data_counts(), disk_counts(stats)
        zfs1 = zfs_counters(self.ctx.pool)
        job = report["jobs"][0]
        if job.get("error"):
            raise RuntimeError("fio %s: error %s" % (tag, job["error"]))
        side = job["read" if "read" in rw else "write"]
        d = [b - a for a, b in zip(disk0, disk1)]
        seconds = side["runtime"] / 1000.0
        moved = float(max(side["io_bytes"], 1))
        pct = (side.get("clat_ns") or {}).get("percentile") or {}
        return {"iops": side["total_ios"] / max(seconds, 1e-9),
                "mb_s": moved / 1e6 / max(seconds, 1e-9),
                "durable_iops": side["total_ios"] / (seconds + flush),
                "ios": side["total_ios"], "bytes": side["io_bytes"],
                "seconds": seconds, "flush_s": flush,
                "quiet_wait_s": quiet_s,
                "clat_p50_us": pct.get("50.000000", 0) / 1000.0,
                "clat_p99_us": pct.get("99.000000", 0) / 1000.0,
                "clat_mean_us": (side.get("clat_ns") or {}).get(
                    "mean", 0) / 1000.0,
                "disk_iops": (d[0] + d[2]) / max(seconds + flush, 1e-9),
                "disk_bps": (d[1] + d[3]) / max(seconds + flush, 1e-9),
                "disk_read_per_byte": d[1] / moved,
                "disk_written_per_byte": d[3] / moved,
                "arc_hits": arc1[0] - arc0[0],
                "arc_misses": arc1[1] - arc0[1],
                "domu_util": [u.get("util") for u in
                              report.get("disk_util", [])],
                "zfs": zfs_delta(zfs0, zfs1, moved)}

    def close(self):
        """Whatever happened: the VM gone, its disks detached, the
        variants' VDIs and the VHD's file system gone."""
        import bench_disk_bound
        import common
        if self.console:
            self.console.close()
        if self.vm is not None and self.vm.domid is not None:
            try:
                self.vm.hard_shutdown()
            except Exception as exc:   # noqa: BLE001 -- cleanup goes on
                common.log("vm-fio cleanup: the VM: %s", exc)
        if self.ext4:
            self.ext4.close()
        if self.files:
            self.files.teardown()
        for sr, vol in self.vdis.values():
            bench_disk_bound._destroy_volume(self.ctx, sr, vol)


# --- where the disk bytes go: OpenZFS's own counters ----------------------

# the module-wide named kstats zfs_counters reads and zfs_delta subtracts
KSTATS = ("zil", "dmu_tx")


def zfs_counters(pool):
    """What OpenZFS counted so far, for zfs_delta: the ZIL's kstat
    (/proc/spl/kstat/zfs/zil, every numeric field: the names differ
    between 2.1 and 2.3), the DMU's transactions' (dmu_tx: why a write
    waited for a new txg, e.g. dmu_tx_quota, dmu_tx_group, the dirty
    throttle's), the pool's transaction groups
    (/proc/spl/kstat/zfs/<pool>/txgs: the last zfs_txg_history of them:
    each one's dirty bytes when its sync began, the pool's bytes read
    and written while it synced, and how long it was open and synced).
    A counter that cannot be read is left out, never fatal: the run's
    own figures do not depend on it."""
    out = {}
    for name in KSTATS:
        try:
            out[name] = _kstat("/proc/spl/kstat/zfs/" + name)
        except (OSError, ValueError):
            pass
    try:
        out["txgs"] = _txgs("/proc/spl/kstat/zfs/%s/txgs" % pool)
    except (OSError, ValueError):
        pass
    return out


def _kstat(path):
    """{name: value} of a named kstat (header lines skipped)."""
    out = {}
    with open(path) as f:
        for line in f.read().splitlines()[2:]:
            row = line.split()
            if len(row) == 3 and row[2].lstrip("-").isdigit():
                out[row[0]] = int(row[2])
    return out


# otime, qtime, wtime, stime: nanoseconds open, quiescing, waiting to
# sync and syncing
TXG_FIELDS = ("ndirty", "nread", "nwritten", "reads", "writes", "otime",
              "qtime", "wtime", "stime")


def _txgs(path):
    """{txg: {state, ndirty, nread, nwritten, reads, writes}}."""
    with open(path) as f:
        lines = f.read().splitlines()
    head = [i for i, l in enumerate(lines) if l.split()[:1] == ["txg"]]
    if not head:
        raise ValueError("no txg header in " + path)
    names = lines[head[0]].split()
    out = {}
    for line in lines[head[0] + 1:]:
        row = dict(zip(names, line.split()))
        if "txg" not in row or not row["txg"].isdigit():
            continue
        out[row["txg"]] = dict([("state", row.get("state"))] + [
            (k, int(row[k])) for k in TXG_FIELDS if k in row])
    return out


def zfs_delta(before, after, moved):
    """The counters' change over one run (and its flush): the ZIL's
    bytes and commits, the DMU's transaction counts, and the sums over
    the txgs that synced in the run (count, dirty bytes, bytes written
    and read, nanoseconds open and syncing). moved: the guest's
    bytes."""
    out = {}
    for name in KSTATS:
        if name in before and name in after:
            out[name] = dict((k, after[name][k] - before[name].get(k, 0))
                             for k in after[name])
    if "txgs" in before and "txgs" in after:
        synced = [t for t, row in after["txgs"].items()
                  if row["state"] == "C"
                  and before["txgs"].get(t, {}).get("state") != "C"]
        out["txgs"] = dict((k, sum(after["txgs"][t].get(k, 0)
                                   for t in synced)) for k in TXG_FIELDS)
        out["txgs"]["count"] = len(synced)
        # a txg older than the history kept before the run would not be
        # told apart from a new one: say if the window was too short
        out["txgs"]["history_overrun"] = bool(before["txgs"]) and min(
            int(t) for t in after["txgs"]) > max(
            int(t) for t in before["txgs"])
    out["guest_bytes"] = moved
    return out


def fio_options(workload, k, plan_, size=None):
    """fio's options for the k-th run of a workload (FIO_FLAGS after
    them): a random run lasts plan_["runtime_s"] over the whole VDI; a
    sequential one moves plan_["seq_bytes"] from diskrig.seq_offset(k)
    and is timed to its last completion, as the disk-bound rig's; a
    write ends with an fsync (the guest's flush through blkfront). size:
    the VDI's, if not plan_'s (a random run spreads over all of it)."""
    import diskrig
    _, rw, bs, iodepth = workload
    size = size or plan_["size_bytes"]
    options = ["--rw=" + rw, "--bs=" + bs, "--iodepth=%d" % iodepth]
    if rw.startswith("rand"):
        options += ["--size=%d" % size, "--time_based",
                    "--runtime=%d" % plan_["runtime_s"]]
    else:
        offset = diskrig.seq_offset(k, size)
        options += ["--offset=%d" % offset,
                    "--size=%d" % min(plan_["seq_bytes"], size - offset)]
    if "write" in rw:
        options.append("--end_fsync=1")
    return options + FIO_FLAGS


# --- the ratios and the report ---------------------------------------------

FIGURES = [("iops", "IOPS"), ("mb_s", "MB/s"),
           ("clat_p50_us", "p50 clat"), ("clat_p99_us", "p99 clat"),
           ("durable_iops", "durable IOPS")]


def pair_ratios(runs, default="8k"):
    """{num/den: {workload: {figure: summary}}}: per run, num's figure
    over den's (the same run index), then min/median/max; the pairs are
    pairs(default)."""
    by = {}
    for r in runs:
        by[(r["variant"], r["workload"], r["run"])] = r
    variants = set(r["variant"] for r in runs)
    out = {}
    for num, den in pairs(default):
        if num not in variants or den not in variants:
            continue
        table = {}
        for w in [w[0] for w in WORKLOADS
                  if any(r["workload"] == w[0] for r in runs)]:
            figs = {}
            for key, _ in FIGURES + [("disk_read_per_byte", ""),
                                     ("disk_written_per_byte", "")]:
                vals = [by[(num, w, i)][key] / by[(den, w, i)][key]
                        for (v, ww, i) in sorted(by)
                        if v == num and ww == w and (den, w, i) in by
                        and by[(den, w, i)][key]]
                if vals:
                    figs[key] = {"median": statistics.median(vals),
                                 "min": min(vals), "max": max(vals),
                                 "runs": vals}
            table[w] = figs
        out["%s/%s" % (num, den)] = table
    return out


def _med(runs, variant, workload, key):
    vals = [r[key] for r in runs
            if r["variant"] == variant and r["workload"] == workload]
    return statistics.median(vals) if vals else None


def report(result):
    """report.md's text from results.json."""
    c = result.get("conditions", {})
    s = result["vm-fio"]
    runs = s["runs_list"]
    lines = ["# fio inside a Xen PV VM, zfs-ng VDIs (%s)" %
             c.get("zfs_version", "?"), "",
             "Section `vm-fio` (tests/bench/bench_vm_fio.py), "
             "`make bench-vm-fio`, %s. QEMU TCG: absolute figures mean "
             "nothing, only ratios within this run count." %
             c.get("date", "?"), "",
             "One PV domU (Xen 4.17, %d MiB, 1 vCPU), one disk per "
             "variant: blkfront -> tapback -> tapdisk -> zvol (or a VHD on "
             "ZFS or ext4). %s in the domU, O_DIRECT, libaio, on the raw "
             "disk. Pool disk throttled by QEMU to %d requests/s and "
             "%.2f MB/s; ARC capped at %d MiB and dropped before every "
             "run; %d MiB per VDI, filled first; random runs %d s, "
             "sequential runs %d MiB; %d runs, order rotated." % (
                 s["domu_memory_mib"], _fio_version(s),
                 s["throttle"]["iops"], s["throttle"]["bps"] / 1e6,
                 s["tuning"]["zfs_arc_max"] // MIB, s["size_mib"],
                 s["runtime_s"], s["seq_mib"], s["runs"]), "",
             "zfs-ng's default block size on this pool and OpenZFS: "
             "`%s`; the ratios pair it with the VHDs. `-8g`: sparse "
             "8 GiB VDIs, never filled, random writes only, spread over "
             "the whole size." % s.get("default", "?"), "",
             "Variants: " + "; ".join(
                 "%s (%s)" % (v, ", ".join("%s=%s" % kv for kv in
                                           sorted(s["props"][v].items())))
                 for v in s["variants"]) + ".", "",
             "## Per variant (medians)", "",
             "| workload | variant | IOPS | MB/s | p50 clat us | p99 clat "
             "us | durable IOPS | disk bytes read / guest byte | written "
             "/ guest byte | disk MB/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for w in [w[0] for w in s["workloads"]]:
        for v in s["variants"]:
            m = dict((k, _med(runs, v, w, k)) for k in (
                "iops", "mb_s", "clat_p50_us", "clat_p99_us",
                "durable_iops", "disk_read_per_byte",
                "disk_written_per_byte", "disk_bps"))
            if m["iops"] is None:
                continue
            lines.append("| %s | %s | %.1f | %.2f | %.0f | %.0f | %.1f | "
                         "%.2f | %.2f | %.2f |" % (
                             w, v, m["iops"], m["mb_s"], m["clat_p50_us"],
                             m["clat_p99_us"], m["durable_iops"],
                             m["disk_read_per_byte"],
                             m["disk_written_per_byte"],
                             m["disk_bps"] / 1e6))
    for pair, table in sorted(s["ratios"].items()):
        lines += ["", "## %s, per-run ratios: median (min-max)" % pair, "",
                  "| workload | IOPS | p50 clat | p99 clat | durable IOPS "
                  "| disk read / byte | disk written / byte |",
                  "|---|---|---|---|---|---|---|"]
        for w in [w[0] for w in s["workloads"] if table.get(w[0])]:
            f = table.get(w, {})
            lines.append("| %s | %s |" % (w, " | ".join(
                _ratio(f.get(k)) for k in (
                    "iops", "clat_p50_us", "clat_p99_us", "durable_iops",
                    "disk_read_per_byte", "disk_written_per_byte"))))
    lines += breakdown(s)
    lines += ["", "Disk MB/s is dom0's pool disk over the run and its "
              "flush, against the %.2f MB/s limit: near it, the disk "
              "bound the run; well below, the emulated CPU did." %
              (s["throttle"]["bps"] / 1e6), "",
              "Section wall time: %.0f s." % s.get("wall_s", 0), ""]
    return "\n".join(lines)


BREAKDOWN = [
    ("ios", "guest writes"), ("txgs", "txgs synced"),
    ("per_txg", "guest writes / txg"),
    ("dirty_per_txg", "dirty KiB / txg at sync"),
    ("written", "disk written / guest byte"),
    ("zil", "of which ZIL blocks"), ("rest", "the rest (txg syncs)"),
    ("rest_per_txg", "the rest, KiB / txg"),
    ("open_ms", "ms open / txg"), ("sync_ms", "ms syncing / txg"),
    ("read", "disk read / guest byte"),
]


def breakdown_of(run):
    """One write run's disk bytes split by what wrote them: the ZIL's
    blocks (its kstat: zil_itx_metaslab_normal_write on 2.3, the bytes
    it issued; _bytes on 2.1, the bytes it used) and the rest, which is
    what the txg syncs wrote (data, indirect blocks, the pool's own
    metadata); per guest byte, and per txg synced in the run and its
    flush, with how many guest writes each txg carried and its dirty
    bytes when its sync began. None where a counter is missing. (The
    txgs kstat's own nwritten is the pool's bytes while a txg synced,
    the ZIL's included: the syncs follow each other, so it is not the
    sync's alone.)"""
    z = run.get("zfs") or {}
    moved = float(z.get("guest_bytes") or run["bytes"] or 1)
    zil = z.get("zil") or {}
    txgs = z.get("txgs") or {}
    zil_bytes = zil.get("zil_itx_metaslab_normal_write",
                        zil.get("zil_itx_metaslab_normal_bytes"))
    written = run["disk_written_per_byte"] * moved
    rest = written - zil_bytes if zil_bytes is not None else None
    count = txgs.get("count")
    return {"ios": run["ios"], "txgs": count,
            "per_txg": run["ios"] / float(count) if count else None,
            "dirty_per_txg": _per_txg(txgs, "ndirty", 1024.0),
            "written": run["disk_written_per_byte"],
            "zil": zil_bytes / moved if zil_bytes is not None else None,
            "rest": rest / moved if rest is not None else None,
            "rest_per_txg": (rest / 1024.0 / count
                             if count and rest is not None else None),
            "open_ms": _per_txg(txgs, "otime", 1e6),
            "sync_ms": _per_txg(txgs, "stime", 1e6),
            "read": run["disk_read_per_byte"]}


def _per_txg(txgs, field, unit):
    """A txgs kstat field's mean over the run's txgs, in units (1024.0:
    bytes to KiB; 1e6: ns to ms); None if no txg synced or the field was
    not kept (results taken before it was)."""
    if not txgs.get("count") or field not in txgs:
        return None
    return txgs[field] / unit / txgs["count"]


def breakdown(s):
    """report.md's lines: the random writes' disk bytes split into ZIL
    and txg syncs, medians per variant."""
    runs = [r for r in s["runs_list"] if r["workload"].startswith(
        "randwrite") and r.get("zfs") and r["variant"] != EXT4]
    if not runs:
        return []
    lines = ["", "## Random writes: where the disk bytes go (medians)", "",
             "The pool disk's bytes written per guest byte, split into "
             "the ZIL's blocks (/proc/spl/kstat/zfs/zil) and the rest "
             "(what the txg syncs wrote); the txgs that synced during "
             "the run and its flush (the pool's txgs kstat), the guest "
             "writes each carried, the dirty bytes each had when its "
             "sync began (every dirtied block counts its full size, a "
             "128K indirect block too), the rest's KiB per txg and how "
             "long a txg was open and synced (a txg sync that starts "
             "before zfs_txg_timeout and below zfs_dirty_data_sync_"
             "percent was started by something else: results.json "
             "keeps the dmu_tx kstat's counts per run). The "
             "VHD file is on the same pool (no ZIL: its dataset keeps "
             "sync=standard and tapdisk never flushes); the VHD on ext4 "
             "has no ZFS counters.", "",
             "| workload | variant | " + " | ".join(
                 t for _, t in BREAKDOWN) + " |",
             "|---|---|" + "---|" * len(BREAKDOWN)]
    for w in [w[0] for w in s["workloads"]]:
        for v in s["variants"]:
            rows = [breakdown_of(r) for r in runs
                    if r["workload"] == w and r["variant"] == v]
            if not rows:
                continue
            cells = []
            for key, _ in BREAKDOWN:
                vals = [r[key] for r in rows if r[key] is not None]
                if not vals:
                    cells.append("-")
                    continue
                m = statistics.median(vals)
                cells.append("%.0f" % m if key in (
                    "ios", "txgs", "dirty_per_txg", "rest_per_txg",
                    "open_ms", "sync_ms")
                    else "%.1f" % m if key == "per_txg" else "%.2f" % m)
            lines.append("| %s | %s | %s |" % (w, v, " | ".join(cells)))
    return lines


def _fio_version(s):
    for line in s.get("domu", {}).get("lines", []):
        if line.startswith("fio "):
            return line.split(" ", 1)[1]
    return "?"


def _ratio(f):
    if not f:
        return "-"
    return "%.2fx (%.2f-%.2f)" % (f["median"], f["min"], f["max"])


def main():
    parser = argparse.ArgumentParser(description="vm-fio's report")
    parser.add_argument("--report", required=True, metavar="DIR")
    args = parser.parse_args()
    with open(os.path.join(args.report, "results.json")) as f:
        result = json.load(f)
    text = report(result)
    with open(os.path.join(args.report, "report.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
