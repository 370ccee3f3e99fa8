"""Raw file against zvol, no tapdisk: why a file can beat the zvol.

An earlier quick run on OpenZFS 2.1 found fio on a raw file in a dataset
(recordsize 128K) faster than fio on zfs-ng's zvol (volblocksize 16K) for
writes. The two differ in more than the request path, so this section
varies one thing at a time, fio directly on each device (libaio,
O_DIRECT, the datapath section's workloads and accounting):

- ``zvol-16K``: a VDI of the bench SR (zfs-ng's defaults: volblocksize
  16K, lz4).
- ``zvol-128K``: a VDI of an SR made with ``volblocksize=128K``: the
  file's block size on the zvol's request path.
- ``zvol-16K-nocomp``: a VDI of an SR with ``compression=off``: what lz4
  costs on incompressible data (every block is tried, then stored raw).
- ``zvol-16K-reqsync``: the zvol-16K VDI with the module parameter
  ``zvol_request_sync=1`` for its runs: requests served in the submitting
  thread instead of through the zvol taskq (its dispatch cost).
- ``file-128K``: a raw file on a dataset with ZFS defaults (recordsize
  128K) and lz4: what the earlier run measured.
- ``file-16K``: the same with ``recordsize=16K``: the zvol's block size
  on the file's request path.

``zil_commits`` per run shows whether anything on a path waits for the
ZIL (none of these O_DIRECT paths should). Runs are interleaved and each
ratio to zvol-16K is computed per run and summarised.
"""

import os
import time

import common
from measure import MIB, fill, io_run, pool_disks, zfs_props

WORKLOADS = [
    ("randread-4k", "randread", "4k", 128),
    ("seqread-4M", "read", "4M", 4),
    ("randwrite-4k", "randwrite", "4k", 128),
    ("seqwrite-4M", "write", "4M", 4),
]
CONFIGS = ["zvol-16K", "zvol-128K", "zvol-16K-nocomp", "zvol-16K-reqsync",
           "file-128K", "file-16K"]
REQSYNC = "/sys/module/zfs/parameters/zvol_request_sync"


def plan(ctx):
    if ctx.quick:
        return {"size_bytes": 32 * MIB, "runtime_s": 1, "runs": ctx.runs}
    return {"size_bytes": 128 * MIB, "runtime_s": 2, "runs": ctx.runs}


class Targets(object):
    def __init__(self, ctx, size):
        self.ctx, self.size = ctx, size
        self.paths, self.datasets, self.srs, self.vols = {}, {}, [], []
        self.made = []

    def setup(self):
        ctx = self.ctx
        self._vol("zvol-16K", ctx.sr)
        self.paths["zvol-16K-reqsync"] = self.paths["zvol-16K"]
        self.datasets["zvol-16K-reqsync"] = self.datasets["zvol-16K"]
        for name, opts in (("zvol-128K", {"volblocksize": "128K"}),
                           ("zvol-16K-nocomp", {"compression": "off"})):
            sr = ctx.new_sr("bench-" + name, **opts)
            self.srs.append(sr)
            self._vol(name, sr)
        compression = common.run(["zfs", "get", "-Hpo", "value",
                                  "compression", ctx.sr]).strip()
        for name, rs in (("file-128K", None), ("file-16K", "16K")):
            dataset = "%s/bench-%s" % (ctx.pool, name)
            mnt = os.path.join(ctx.scratch, "bench-" + name)
            argv = ["zfs", "create", "-o", "compression=" + compression,
                    "-o", "mountpoint=" + mnt]
            if rs:
                argv += ["-o", "recordsize=" + rs]
            common.run(argv + [dataset])
            self.made.append(dataset)
            path = os.path.join(mnt, "raw.img")
            with open(path, "wb") as f:
                f.truncate(self.size)
            self.paths[name], self.datasets[name] = path, dataset

    def _vol(self, name, sr):
        vol = self.ctx.new_volume(self.size, name=name, sr=sr)
        self.vols.append((sr, vol))
        self.paths[name] = self.ctx.zvol_device(vol)
        self.datasets[name] = common.volume_dataset(vol)

    def teardown(self):
        for dataset in self.made:
            _quiet(lambda: common.run(["zfs", "destroy", "-r", dataset]))
        for sr, vol in self.vols:
            _quiet(lambda: self.ctx.plugin("Volume.destroy", sr=sr,
                                           key=vol["key"]))
        for sr in self.srs:
            for method in ("SR.detach", "SR.destroy"):
                _quiet(lambda: self.ctx.plugin(method, sr=sr))


def _quiet(fn):
    try:
        fn()
    except Exception as exc:   # noqa: BLE001 -- cleanup goes on
        common.log("rawfile cleanup: %s", exc)


def _set_reqsync(value):
    with open(REQSYNC, "w") as f:
        f.write(str(value))


def run(ctx):
    plan_ = plan(ctx)
    disks = pool_disks(ctx.pool)
    targets = Targets(ctx, plan_["size_bytes"])
    has_reqsync = os.path.exists(REQSYNC)
    configs = [c for c in CONFIGS if has_reqsync or c != "zvol-16K-reqsync"]
    raw = {}
    reqsync0 = None
    if has_reqsync:
        with open(REQSYNC) as f:
            reqsync0 = int(f.read().strip())
    try:
        targets.setup()
        for name in configs:
            if name != "zvol-16K-reqsync":
                start = time.time()
                fill(targets.paths[name], plan_["size_bytes"], ctx.pool)
                common.log("rawfile: filled %s in %.0fs", name,
                           time.time() - start)
        props = dict((name, zfs_props(
            targets.datasets[name],
            ["volblocksize" if name.startswith("zvol") else "recordsize",
             "compression"])) for name in configs)
        for workload in WORKLOADS:
            for _ in range(plan_["runs"]):
                for name in configs:
                    if name == "zvol-16K-reqsync":
                        _set_reqsync(1)
                    try:
                        m = io_run(targets.paths[name], plan_["size_bytes"],
                                   workload, plan_["runtime_s"], ctx.pool,
                                   disks)
                    finally:
                        if name == "zvol-16K-reqsync":
                            _set_reqsync(reqsync0)
                    raw.setdefault((name, workload[0]), []).append(m)
            common.log("rawfile: %s done", workload[0])
    finally:
        targets.teardown()
    results = []
    for (name, workload), runs in sorted(raw.items()):
        base = raw[("zvol-16K", workload)]
        r = {"config": name, "workload": workload,
             "ratio_to_zvol_16k": common.summary(
                 m["iops"] / b["iops"] for m, b in zip(runs, base)
                 if b["iops"])}
        for field in ("iops", "mib_s", "disk_read_per_byte",
                      "disk_written_per_byte", "zil_commits",
                      "cpu_busy", "cpu_us_per_io", "flush_s"):
            r[field] = common.summary(m[field] for m in runs)
        r["arc"] = dict((k, sum(m[k] for m in runs))
                        for k in ("arc_hits", "arc_misses", "ios"))
        results.append(r)
    return {"config": {"size_mib": plan_["size_bytes"] // MIB,
                       "runs": plan_["runs"],
                       "runtime_s": plan_["runtime_s"],
                       "zvol_request_sync_default": reqsync0,
                       "properties": props},
            "configs": configs, "results": results}
