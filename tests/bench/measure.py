"""Measuring I/O: one fio run, and the pool, disk and ARC counters around it.

Shared by the datapath and volblocksize sections. A run starts on a synced
pool and, for writes, includes the ``zpool sync`` after it, so the figure
counts getting the data to disk, not ZFS absorbing it in memory. The disk
counters give read/write amplification, which does not depend on how slow
the emulated CPU is.
"""

import json
import os
import tempfile
import time

import common

MIB = 1024 * 1024

FIO_FLAGS = ["--ioengine=libaio", "--direct=1", "--refill_buffers",
             "--norandommap", "--randrepeat=0", "--fallocate=none",
             "--output-format=json"]


def fio(path, size, rw, bs, iodepth, runtime_s=None, offset=0):
    """One fio job; returns its read or write stats from the JSON report.

    runtime_s None means one full pass over size bytes (a fill); the job
    covers size bytes from offset."""
    argv = ["fio", "--name=bench", "--filename=" + path,
            "--size=%d" % size, "--rw=" + rw, "--bs=" + bs,
            "--iodepth=%d" % iodepth] + FIO_FLAGS
    if offset:
        argv.append("--offset=%d" % offset)
    if runtime_s is not None:
        argv += ["--time_based", "--runtime=%d" % runtime_s]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        common.run(argv + ["--output=" + out.name])
        with open(out.name) as f:
            text = f.read()
    job = json.loads(text[text.index("{"):])["jobs"][0]
    if job.get("error"):
        raise RuntimeError("fio %s on %s: error %s" % (rw, path, job["error"]))
    return job["read" if "read" in rw else "write"]


def pool_sync(pool):
    """zpool sync, timed: the cost of getting dirty data onto the disks."""
    start = time.perf_counter()
    common.run(["zpool", "sync", pool])
    return time.perf_counter() - start


def pool_leaves(pool):
    """The pool's leaf devices, as zpool names them (full paths)."""
    out = common.run(["zpool", "list", "-vHP", pool])
    return [field for line in out.splitlines()
            for field in line.split("\t") if field.startswith("/dev/")]


def pool_disks(pool):
    """The /sys/class/block stat files of the pool's leaf devices."""
    return ["/sys/class/block/%s/stat" % os.path.basename(os.path.realpath(p))
            for p in pool_leaves(pool)]


def disk_bytes(stat_files):
    """(bytes read, bytes written) so far by these block devices."""
    read = written = 0
    for path in stat_files:
        with open(path) as f:
            fields = f.read().split()
        read += int(fields[2]) * 512       # sectors are always 512 here
        written += int(fields[6]) * 512
    return read, written


def disk_counts(stat_files):
    """(reads, bytes read, writes, bytes written) so far by these block
    devices: requests as the guest sent them to the (virtual) disks,
    which is what QEMU's request throttling counts."""
    out = [0, 0, 0, 0]
    for path in stat_files:
        with open(path) as f:
            fields = f.read().split()
        for i, field in enumerate((0, 2, 4, 6)):
            out[i] += int(fields[field]) * (512 if field in (2, 6) else 1)
    return tuple(out)


def arcstats():
    """The ARC's kstats (name: value), as /proc shows them now."""
    with open("/proc/spl/kstat/zfs/arcstats") as f:
        rows = [line.split() for line in f]
    return dict((r[0], int(r[2])) for r in rows
                if len(r) == 3 and r[2].isdigit())


def arc_data_counts():
    """ARC demand-data (hits, misses) so far."""
    stats = arcstats()
    return stats["demand_data_hits"], stats["demand_data_misses"]


def zil_commits():
    """ZIL commits so far (``zil_commit_count``): a write path that asks
    for synchronous semantics (FUA, flush, fsync) commits the ZIL; 0 in a
    run means nothing waited for the log."""
    with open("/proc/spl/kstat/zfs/zil") as f:
        for line in f:
            row = line.split()
            if len(row) == 3 and row[0] == "zil_commit_count":
                return int(row[2])
    return 0


def cpu_times():
    """(busy, total) jiffies of all CPUs so far (/proc/stat): busy is
    everything but idle and iowait."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    total = sum(fields)
    return total - fields[3] - fields[4], total


def io_run(path, size, workload, runtime_s, pool, disks):
    """One timed fio run on a synced pool; writes include the flush.

    Returns iops, mib_s, flush_s, disk amplification, ARC counts, ZIL
    commits, guest CPU use, ios."""
    name, rw, bs, iodepth = workload
    pool_sync(pool)
    arc0, disk0, zil0 = arc_data_counts(), disk_bytes(disks), zil_commits()
    cpu0 = cpu_times()
    stats = fio(path, size, rw, bs, iodepth, runtime_s)
    cpu1 = cpu_times()
    zil1 = zil_commits()
    flush = pool_sync(pool) if "write" in rw else 0.0
    arc1, disk1 = arc_data_counts(), disk_bytes(disks)
    seconds = stats["runtime"] / 1000.0 + flush
    moved = float(max(stats["io_bytes"], 1))
    return {"iops": stats["total_ios"] / seconds,
            "mib_s": stats["io_bytes"] / float(MIB) / seconds,
            "flush_s": flush, "ios": stats["total_ios"],
            "disk_read_per_byte": (disk1[0] - disk0[0]) / moved,
            "disk_written_per_byte": (disk1[1] - disk0[1]) / moved,
            "arc_hits": arc1[0] - arc0[0], "arc_misses": arc1[1] - arc0[1],
            "zil_commits": zil1 - zil0,
            # the guest's CPUs during fio (its start and exit included):
            # near 1.0, the run was CPU-bound, as everything is under TCG
            "cpu_busy": (cpu1[0] - cpu0[0]) / float(max(cpu1[1] - cpu0[1],
                                                        1)),
            "cpu_us_per_io": (cpu1[0] - cpu0[0]) * 1e6 / float(
                os.sysconf("SC_CLK_TCK")) / max(stats["total_ios"], 1)}


def fill(path, size, pool):
    """Write every byte once, synced: reads of holes mean nothing."""
    fio(path, size, "write", "4M", 4)
    pool_sync(pool)


def zfs_props(dataset, names):
    """{property: value} of one dataset, parsable (-p) values."""
    out = common.run(["zfs", "get", "-Hpo", "property,value",
                      ",".join(names), dataset])
    return dict(line.split("\t") for line in out.splitlines())
