"""Volume.compose: what finishing a migration into zfs-ng costs.

A VM moving in from a SMAPIv1 SR leaves two volumes on the destination:
the parent, a copy of the source's snapshot, and the leaf's mirror sink,
where tapdisk's mirror wrote every guest write made during the copy.
Volume.compose puts the sink's writes on top of the parent. It lists the
sink's data blocks from their birth times (zdb, metadata only) and copies
exactly those bytes, so its cost must follow what the mirror wrote, not
the disk's size.

* **Against disk size.** Sparse disks of 64 MiB to 1 TiB, the parent
  holding 1 MiB, the sink 1 MiB written as 256 scattered 4 KiB writes:
  compose's time as xapi waits for it (the plugin's process). Target: the
  largest disk at most 1.5x the smallest.
* **Against what the mirror wrote.** A 1 GiB disk, 1, 8 and 64 MiB
  written into the sink in 64 KiB writes at random offsets: seconds, and
  MiB composed per second.

The sink is made as Datapath.import_activate makes it (512-byte blocks,
no compression, marked) and written with O_DIRECT, as tapdisk writes it.
"""

import mmap
import os
import random
import time

import common

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
SIZES = [64 * MiB, GiB, 64 * GiB, TiB]
WRITTEN = [MiB, 8 * MiB, 64 * MiB]
SINK_MARK = "org.xcp-ng.zfs-ng:mirror-sink"


def _write_direct(path, writes):
    """(offset, bytes) writes with O_DIRECT, then one fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        for offset, data in writes:
            buf = mmap.mmap(-1, len(data))
            buf.write(data)
            os.pwrite(fd, buf, offset)
            buf.close()
        os.fsync(fd)
    finally:
        os.close(fd)


def _received(ctx, size):
    """xapi's receive_start on the destination, and the sink: (leaf,
    parent, the sink's device)."""
    leaf = ctx.new_volume(size, name="compose-leaf")
    ctx.plugin("Volume.snapshot", sr=ctx.sr, key=leaf["key"])
    parent = ctx.new_volume(size, name="compose-parent")
    sink = common.volume_dataset(leaf) + ".in"
    common.run(["zfs", "create", "-s", "-V", str(size), "-o",
                "volblocksize=512", "-o", "compression=off", "-o",
                "%s=%s" % (SINK_MARK, leaf["key"]), sink])
    _write_direct(ctx.zvol_device(parent), [(0, os.urandom(MiB))])
    return leaf, parent, _device(sink)


def _device(dataset):
    """The dataset's zvol device, once udev has made it."""
    path = "/dev/zvol/" + dataset
    deadline = time.time() + 30
    while not os.path.exists(path) and time.time() < deadline:
        common.run(["udevadm", "settle"])
        time.sleep(0.2)
    return path


def _compose(ctx, leaf, parent):
    """Seconds of Volume.compose(sr, key=leaf, key2=parent) as xapi waits
    for it; the composed VDI is destroyed after."""
    args = {"dbg": "bench", "sr": ctx.sr, "key": leaf["key"],
            "key2": parent["key"]}
    start = time.perf_counter()
    rc, out, err = ctx.plugin.raw("Volume.compose", args)
    seconds = time.perf_counter() - start
    if rc != 0:
        raise RuntimeError("Volume.compose failed: %s %s" % (out, err))
    ctx.plugin("Volume.destroy", sr=ctx.sr, key=leaf["key"])
    return seconds


def by_size(ctx):
    rows = []
    rnd = random.Random(1)
    for size in SIZES[:2] + SIZES[-1:] if ctx.quick else SIZES:
        times = []
        for _ in range(ctx.runs):
            leaf, parent, sink = _received(ctx, size)
            writes = [(i * 4 * KiB, os.urandom(4 * KiB))
                      for i in rnd.sample(range(size // (4 * KiB)), 256)]
            _write_direct(sink, writes)
            times.append(_compose(ctx, leaf, parent))
        rows.append({"size": size, "written": 256 * 4 * KiB,
                     "compose_s": common.summary(times)})
        common.log("compose: %d MiB disk, 1 MiB written: %.2fs",
                   size // MiB, rows[-1]["compose_s"]["median"])
    return rows


def by_written(ctx):
    rows = []
    rnd = random.Random(2)
    size = GiB
    for written in WRITTEN[:2] if ctx.quick else WRITTEN:
        times = []
        for _ in range(ctx.runs):
            leaf, parent, sink = _received(ctx, size)
            writes = [(i * 64 * KiB, os.urandom(64 * KiB))
                      for i in rnd.sample(range(size // (64 * KiB)),
                                          written // (64 * KiB))]
            _write_direct(sink, writes)
            times.append(_compose(ctx, leaf, parent))
        s = common.summary(times)
        rows.append({"size": size, "written": written, "compose_s": s,
                     "mib_per_s": written / MiB / s["median"]})
        common.log("compose: %d MiB written on a 1 GiB disk: %.2fs "
                   "(%.1f MiB/s)", written // MiB, s["median"],
                   rows[-1]["mib_per_s"])
    return rows


def run(ctx):
    return {"by_size": by_size(ctx), "by_written": by_written(ctx)}
