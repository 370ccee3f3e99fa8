"""Changed block tracking: what an incremental backup reads, and what
Volume.list_changed_blocks costs.

* **Bytes read against bytes changed.** A disk written whole, then rounds
  as Xen Orchestra runs them: random writes over a fraction of the disk,
  a snapshot, list_changed_blocks(previous, new), data_destroy. XO
  data-destroys each snapshot once backed up; here the previous one goes
  after the round instead, so that the whole-read comparison can still
  read it: the list is the same (a send from a bookmark carries the same
  records as one from its snapshot, and the map is the same). The first
  round's list also makes the first snapshot's map (a full send of it).
  *changed* is the 64 KiB blocks the round's writes touched
  (random data: every one differs); *read* is the blocks the bitmap
  marks, what XO reads over NBD. Target: read at most 1.1x changed.
  Beside it, the incremental done without CBT: both snapshots read whole
  and compared (bytes read, seconds).
* **After a revert.** Xen Orchestra's flow, with a revert in it: a disk
  written whole, snapshot S1, random 48 KiB writes over 5% of it,
  snapshot S2, its delta listed and its data destroyed (backed up), the
  disk reverted to S1, 5% more written, snapshot S3: the next delta,
  list_changed_blocks(S2, S3), from S2's bookmark on the zvol the revert
  set aside. *read*: the 64 KiB blocks the bitmap marks; *differ*: the
  blocks whose bytes differ between S2 and S3 (S2 hashed per block
  before its data went). Target: read at most 1.1x differ.
* **Listing: block births against zfs send.** A 2 GiB disk written
  whole, 1%, 10%, 50% of its 64 KiB blocks rewritten: the time to list
  the changes from the block pointers' birth times (zdb, what
  list_changed_blocks uses) and from an incremental zfs send (which reads
  the changed data), against reading the changed bytes once (caches
  dropped, primarycache=metadata). Target: zdb at most 0.25x the read
  at 10% changed.
* **list_changed_blocks against disk size.** Sparse disks of 64 MiB up to
  16 TiB, 1 MiB of data, a snapshot, 1 MiB more in the middle of the
  disk, a snapshot: the call's time as xapi waits for it, the plugin's
  process with its whole answer read (its first run also makes the base's
  map). Target: 16 TiB at most 1.5x 64 MiB.
"""

import hashlib
import json
import os
import random
import time

import common
from plugin_client import marked_blocks

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
G = 64 * KiB
SIZES = [64 * MiB, GiB, 64 * GiB, TiB, 16 * TiB]
FRACTIONS = [0.01, 0.05, 0.25]


def _write(path, offset, data):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def _blocks(result):
    """Blocks a bitmap marks, counted in its non-zero bytes only (a 16 TiB
    disk's bitmap is 32 MiB, nearly all zeros)."""
    return len(marked_blocks(result))


def _lcb(ctx, a, b):
    """(seconds, result) of Volume.list_changed_blocks(a, b). The seconds
    are the call as xapi waits for it: the plugin's process, its whole
    answer read; not this bench's own parsing and counting after it (a
    16 TiB disk's answer is 44 MB of JSON)."""
    args = {"dbg": "bench", "sr": ctx.sr, "key": a["key"], "key2": b["key"],
            "offset": 0, "length": -1}
    start = time.perf_counter()
    rc, out, err = ctx.plugin.raw("Volume.list_changed_blocks", args)
    seconds = time.perf_counter() - start
    if rc != 0:
        raise RuntimeError("list_changed_blocks failed: %s %s" % (out, err))
    result = json.loads(out)
    ctx.plugin.wire.METHODS["Volume.list_changed_blocks"][1].check(
        result, "result")
    return seconds, result


def _read_whole(ctx, vol):
    """sha256 of a snapshot read whole through its dom0 device."""
    path = "/dev/zvol/" + common.volume_dataset(vol)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(4 * MiB), b""):
            digest.update(chunk)
    return digest.hexdigest()


def bytes_read(ctx):
    vol, dev, size = _tracked_and_full(ctx, "cbt-backup")
    prev = ctx.plugin("Volume.snapshot", sr=ctx.sr, key=vol["key"])
    rnd = random.Random(6)
    rows = []
    for fraction in FRACTIONS * (1 if ctx.quick else 2):
        touched = _scatter(dev, size, fraction, rnd)
        new = ctx.plugin("Volume.snapshot", sr=ctx.sr, key=vol["key"])
        common.run(["udevadm", "settle"])
        lcb_s, result = _lcb(ctx, prev, new)
        read = _blocks(result)
        start = time.perf_counter()
        _read_whole(ctx, prev)
        _read_whole(ctx, new)
        whole_s = time.perf_counter() - start
        rows.append({"fraction": fraction, "changed_bytes": len(touched) * G,
                     "read_bytes": read * G,
                     "ratio": float(read) / len(touched),
                     "lcb_s": lcb_s, "whole_read_bytes": 2 * size,
                     "whole_read_s": whole_s})
        common.log("cbt: %.0f%% changed: %d blocks changed, %d read "
                   "(%.3fx), lcb %.2fs, whole reads %.1fs", fraction * 100,
                   len(touched), read, rows[-1]["ratio"], lcb_s, whole_s)
        ctx.plugin("Volume.data_destroy", sr=ctx.sr, key=prev["key"])
        prev = new
    return {"disk_bytes": size, "rounds": rows}


def _digests(path, size):
    """sha256 of each 64 KiB block of a device."""
    out = []
    with open(path, "rb") as f:
        for _ in range(size // G):
            out.append(hashlib.sha256(f.read(G)).digest())
    return out


def _tracked_and_full(ctx, name):
    """A CBT-enabled VDI written whole, its snapshots visible as devices
    (for the whole-read comparisons): (vol, its device, its size)."""
    size = 64 * MiB if ctx.quick else 256 * MiB
    vol = ctx.new_volume(size, name=name)
    ctx.plugin("Volume.enable_cbt", sr=ctx.sr, key=vol["key"])
    dev = ctx.zvol_device(vol)
    for at in range(0, size, 4 * MiB):
        _write(dev, at, os.urandom(4 * MiB))
    common.run(["zfs", "set", "snapdev=visible",
                common.volume_dataset(vol)])
    return vol, dev, size


def _scatter(dev, size, fraction, rnd):
    """Unaligned 48 KiB writes (1 or 2 blocks each) over fraction of the
    device; returns the 64 KiB blocks they touched."""
    touched = set()
    for _ in range(int(size * fraction / (48 * KiB))):
        at = rnd.randrange(0, size - 48 * KiB)
        _write(dev, at, os.urandom(48 * KiB))
        touched.update(range(at // G, (at + 48 * KiB - 1) // G + 1))
    return touched


def after_revert(ctx):
    """The next delta after a revert (issue 39): read against differ."""
    vol, dev, size = _tracked_and_full(ctx, "cbt-revert")
    rnd = random.Random(39)
    s1 = ctx.plugin("Volume.snapshot", sr=ctx.sr, key=vol["key"])
    _scatter(dev, size, 0.05, rnd)
    s2 = ctx.plugin("Volume.snapshot", sr=ctx.sr, key=vol["key"])
    common.run(["udevadm", "settle"])
    _lcb(ctx, s1, s2)                       # S2's backup: its map
    before = _digests("/dev/zvol/" + common.volume_dataset(s2), size)
    ctx.plugin("Volume.data_destroy", sr=ctx.sr, key=s2["key"])
    ctx.plugin("Volume.revert", sr=ctx.sr, snapshot=s1["key"],
               key=vol["key"])
    common.run(["zfs", "set", "snapdev=visible",   # a new zvol: again
                common.volume_dataset(vol)])
    common.run(["udevadm", "settle"])    # the device is the new zvol's
    dev = ctx.zvol_device(vol)
    _scatter(dev, size, 0.05, rnd)
    s3 = ctx.plugin("Volume.snapshot", sr=ctx.sr, key=vol["key"])
    common.run(["udevadm", "settle"])
    lcb_s, result = _lcb(ctx, s2, s3)
    after = _digests("/dev/zvol/" + common.volume_dataset(s3), size)
    differ = set(i for i in range(size // G) if before[i] != after[i])
    marked = set(marked_blocks(result))
    assert differ <= marked, "a changed block was not listed"
    row = {"disk_bytes": size, "differ_bytes": len(differ) * G,
           "read_bytes": len(marked) * G,
           "ratio": float(len(marked)) / len(differ), "lcb_s": lcb_s}
    common.log("cbt after a revert: %d blocks differ, %d read (%.3fx), "
               "lcb %.2fs", len(differ), len(marked), row["ratio"], lcb_s)
    for key in (s3["key"], s2["key"], s1["key"], vol["key"]):
        ctx.plugin("Volume.destroy", sr=ctx.sr, key=key)
    return row


def by_size(ctx):
    rows = []
    for size in SIZES[:2] + SIZES[-1:] if ctx.quick else SIZES:
        vol = ctx.new_volume(size, name="cbt-size")
        ctx.plugin("Volume.enable_cbt", sr=ctx.sr, key=vol["key"])
        dev = ctx.zvol_device(vol)
        _write(dev, 0, os.urandom(MiB))
        a = ctx.plugin("Volume.snapshot", sr=ctx.sr, key=vol["key"])
        _write(dev, size // 2, os.urandom(MiB))
        b = ctx.plugin("Volume.snapshot", sr=ctx.sr, key=vol["key"])
        calls = [_lcb(ctx, a, b) for _ in range(ctx.runs)]
        times = common.summary([seconds for seconds, _ in calls])
        blocks = [_blocks(result) for _, result in calls[:1]]
        rows.append({"size": size, "lcb_s": times, "blocks": blocks[0]})
        common.log("cbt: %d GiB disk, 1 MiB changed: lcb %.2fs, %d blocks",
                   size // GiB, times["median"], blocks[0])
        for key in (b["key"], a["key"], vol["key"]):
            ctx.plugin("Volume.destroy", sr=ctx.sr, key=key)
    return rows


def _drop_caches():
    """Page cache out (the zvol devices', the disk's): the next reads go
    to the disk (the ARC keeps no data: primarycache=metadata)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _read_ranges(path, ranges):
    """Seconds to read ranges of path once, in order."""
    _drop_caches()
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        for a, b in ranges:
            while a < b:
                a += len(os.pread(fd, min(4 * MiB, b - a), a))
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _timed_cold(fn):
    _drop_caches()
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def list_methods(ctx):
    """The two ways to list the changes between two snapshots, against
    the time to read the changed bytes once: block pointers' birth times
    (zdb -ddddd, metadata only: what list_changed_blocks does) and an
    incremental zfs send (reads the changed data). A disk written whole,
    then 1%, 10%, 50% of its 64 KiB blocks rewritten at random."""
    from zfsng import blockmap, zdb, zfs
    size = 512 * MiB if ctx.quick else 2 * GiB
    vol = ctx.new_volume(size, name="cbt-methods")
    ds = common.volume_dataset(vol)
    common.run(["zfs", "set", "primarycache=metadata", ds])
    common.run(["zfs", "set", "snapdev=visible", ds])
    dev = ctx.zvol_device(vol)
    for at in range(0, size, 16 * MiB):
        _write(dev, at, os.urandom(16 * MiB))
    block = int(common.run(["zfs", "get", "-Hp", "-o", "value",
                            "volblocksize", ds]).strip())
    rows = []
    for n, fraction in enumerate((0.01, 0.10, 0.50)):
        a, b = "%s@before%d" % (ds, n), "%s@after%d" % (ds, n)
        common.run(["zfs", "snapshot", a])
        rnd = random.Random(n)
        picked = sorted(rnd.sample(range(size // G),
                                   int(size // G * fraction)))
        fd = os.open(dev, os.O_WRONLY)
        try:
            for i in picked:
                os.pwrite(fd, os.urandom(G), i * G)
            os.fsync(fd)
        finally:
            os.close(fd)
        common.run(["zfs", "snapshot", b])
        common.run(["udevadm", "settle"])
        zdb_s, (born, _) = _timed_cold(lambda: zdb.born_since(
            zfs.createtxg(a), b, block, 3600))
        send_s, (writes, _) = _timed_cold(lambda: zfs.send_changes(
            a, b, bound=3600))
        exact = blockmap.union([(i * G, (i + 1) * G) for i in picked], [])
        read_s = _read_ranges("/dev/zvol/" + b, exact)
        rows.append({"fraction": fraction, "disk_bytes": size,
                     "changed_bytes": len(picked) * G,
                     "zdb_bytes": blockmap.total(born),
                     "send_bytes": blockmap.total(writes),
                     "zdb_s": zdb_s, "send_s": send_s, "read_s": read_s})
        common.log("cbt methods: %.0f%% changed: zdb %.2fs, send %.2fs, "
                   "read once %.2fs (zdb %.2fx, send %.2fx the read)",
                   fraction * 100, zdb_s, send_s, read_s, zdb_s / read_s,
                   send_s / read_s)
        assert blockmap.union(born, []) == exact, rows[-1]
        assert blockmap.union(writes, []) == exact, rows[-1]
    common.run(["zfs", "destroy", "-r", ds])
    return rows


PARTS = ["list_methods", "bytes_read", "after_revert", "by_size"]


def run(ctx):
    """Every part, or those --parts names."""
    parts = [p for p in PARTS if not ctx.parts or p in ctx.parts]
    return dict((p, globals()[p](ctx)) for p in parts)
