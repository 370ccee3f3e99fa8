"""volblocksize sweep: the evidence for zfs-ng's block size defaults (8K,
16K on raidz).

For each of 4K, 8K, 16K, 64K and 128K, an SR is made through the plugin on the
bench pool by adoption (``device-config:zpool=<pool>``,
``volblocksize=<size>``: child dataset ``<pool>/zfsng-<uuid>``, lz4 as
zfs-ng sets it), with one VDI the size of the source image. The four
exist side by side and every repeat is interleaved across them (run 1 of
each size, then run 2...), so that a burst of host load hits all sizes
alike. Measured:

- space and time of an import: ``qemu-img convert -S 4k -n -O raw -f raw
  src /dev/zvol/<vdi>`` of a half-sparse image, timed with the ``zpool
  sync`` that gets it onto the disk; then ``used``, ``logicalused``,
  ``referenced`` and ``compressratio`` of the zvol. The VDI is emptied
  with ``blkdiscard`` (and synced) before every run, so each run copies
  into an empty zvol, as an import does.
- 4k random read and write IOPS (fio, libaio, O_DIRECT, iodepth 128, the
  flags of bench_datapath) after one full write of incompressible data,
  with the bytes the pool's disks read and wrote per byte fio moved (read
  and write amplification). Small blocks win random I/O (a 4K write into
  a 128K block reads and rewrites the whole block, a 4K read reads all of
  it), large blocks win space (metadata per block, compression per
  block). Write figures include the ``zpool sync`` after the run: the
  rewrite is paid when the transaction group is written.

The VDI's ``primarycache`` is set to ``metadata`` (a zfs set on the bench
VDI, not a zfs-ng setting): the ARC keeps none of its data, so 4k reads and
partial-block writes go to the disk, as on a host whose VMs' working set
exceeds the ARC. Under TCG everything would otherwise be served from
memory, and volblocksize would not show in the IOPS at all.

The source image is built once per section in ctx.scratch (off the pool)
from a fixed seed, to look like a used VM disk: extents of 4 KiB to 1 MiB
(log-uniform, 4 KiB aligned, as filesystems allocate) alternating with
holes of the same distribution, so about half is data. Data extents are
text-like (words from a fixed vocabulary: lz4 compresses them about 2x),
incompressible (random: media, archives, encrypted data) or binary-like
(records of a few random bytes padded with zeros: tables, executables).
The field note it reproduces in miniature: a sparse 16 GiB image used 14.6
GiB on 4K blocks against 8.4 GiB on 128K.

The pool's ashift is recorded: the test guest's virtio disks report 512-byte
sectors (ashift 9), where a compressed 4K block can still shrink by
512-byte steps; on 4K-sector disks (ashift 12) a 4K block cannot shrink at
all, so the space cost of 4K blocks here is a lower bound.

Everything made is destroyed at the end (Volume.destroy, SR.detach,
SR.destroy), leaving the pool as it was.
"""

import os
import random
import time

import common
from measure import (MIB, fill, io_run, pool_disks, pool_leaves, pool_sync,
                     zfs_props)

SIZES = ["4K", "8K", "16K", "64K", "128K"]
SEED = 20240517
KIB = 1024


def plan(ctx):
    """Image size and run lengths: ~3.5 min in full mode, ~1.3 in quick
    (TCG guest with the host to itself; twice that when it is shared)."""
    if ctx.quick:
        return {"image_bytes": 16 * MIB, "runtime_s": 1, "runs": 1}
    return {"image_bytes": 64 * MIB, "runtime_s": 2, "runs": ctx.runs}


# --- the source image ------------------------------------------------------------

def build_source(path, size, seed=SEED):
    """A VM-disk-like sparse image; returns how many bytes are data."""
    rng = random.Random(seed)
    corpus = _text_corpus(rng, 256 * KIB)
    data = 0
    pos = 0                     # boot sector and partition table
    with open(path, "wb") as f:
        f.truncate(size)
        while pos < size:
            length = min(_extent(rng), size - pos)
            f.seek(pos)
            f.write(_content(rng, corpus, length))
            data += length
            pos += length + _extent(rng)
    return data


def _extent(rng):
    """4 KiB .. 1 MiB, log-uniform, in whole 4 KiB blocks."""
    return 4 * KIB * int(2 ** rng.uniform(0, 8))


def _text_corpus(rng, size):
    """Word soup from a fixed vocabulary: compresses like text does."""
    syllables = ["ka", "lo", "mi", "ne", "su", "tar", "vel", "qu", "ri",
                 "on", "est", "ber", "dra", "ix", "ul", "pen", "sto", "ght"]
    vocab = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
             for _ in range(1500)]
    words, length = [], 0
    while length < size:
        word = rng.choice(vocab)
        word += rng.choice([" ", " ", " ", " ", " ", ", ", ".\n", "\n"])
        words.append(word)
        length += len(word)
    return "".join(words).encode()[:size]


def _content(rng, corpus, n):
    """One extent's bytes: text-like, incompressible or binary-like."""
    kind = rng.random()
    if kind < 0.45:
        start = rng.randrange(len(corpus))
        return ((corpus[start:] + corpus) * (n // len(corpus) + 1))[:n]
    if kind < 0.80:
        return rng.getrandbits(8 * n).to_bytes(n, "little")
    out = bytearray(n)           # 16-byte records: 4 random bytes, 12 zeros
    for i in range(4):
        count = len(range(i, n, 16))
        out[i::16] = rng.getrandbits(8 * count).to_bytes(count, "little")
    return bytes(out)


# --- the block sizes ----------------------------------------------------------------

def space(dataset):
    """The zvol's space figures, as zfs reports them after a sync."""
    props = zfs_props(dataset, ["used", "logicalused", "referenced",
                                "compressratio"])
    return {"space_used_bytes": int(props["used"]),
            "logical_bytes": int(props["logicalused"]),
            "referenced_bytes": int(props["referenced"]),
            "compressratio": float(props["compressratio"].rstrip("x"))}


class Target(object):
    """One volblocksize: its SR and VDI, made through the plugin."""

    def __init__(self, ctx, vbs, size):
        self.ctx, self.vbs, self.size = ctx, vbs, size
        self.sr = ctx.new_sr("bench-vbs-" + vbs, volblocksize=vbs)
        self.vol = self.dev = self.dataset = self.bytes = None
        self.runs = {}          # measurement name: [per-run records]

    def setup(self):
        """The VDI, uncached (see the module docstring)."""
        self.vol = self.ctx.new_volume(self.size, name="vbs-" + self.vbs,
                                       sr=self.sr)
        self.dev = self.ctx.zvol_device(self.vol)
        self.dataset = common.volume_dataset(self.vol)
        common.run(["zfs", "set", "primarycache=metadata", self.dataset])
        self.bytes = int(common.run(["zfs", "get", "-Hpo", "value",
                                     "volblocksize", self.dataset]))

    def destroy(self):
        """Volume.destroy, SR.detach, SR.destroy: the pool as before.
        A failure is logged, so it hides neither the others nor the
        error that got us here."""
        calls = [("SR.detach", {}), ("SR.destroy", {})]
        if self.vol is not None:
            calls.insert(0, ("Volume.destroy", {"key": self.vol["key"]}))
        for method, args in calls:
            try:
                self.ctx.plugin(method, sr=self.sr, **args)
            except Exception as exc:   # noqa: BLE001 -- cleanup goes on
                common.log("volblocksize cleanup: %s %s: %s", method,
                           self.sr, exc)

    def convert(self, src):
        """One import into the emptied zvol: its time and the space used."""
        common.run(["blkdiscard", self.dev])
        pool_sync(self.ctx.pool)
        start = time.perf_counter()
        common.run(["qemu-img", "convert", "-S", "4k", "-n", "-O", "raw",
                    "-f", "raw", src, self.dev])
        pool_sync(self.ctx.pool)
        record = space(self.dataset)
        record["seconds"] = time.perf_counter() - start
        self.runs.setdefault("convert", []).append(record)

    def fill(self):
        """Write every block once, so random reads never hit holes."""
        fill(self.dev, self.size, self.ctx.pool)

    def random_io(self, name, runtime_s, disks):
        """One 4k random run (randread or randwrite), iodepth 128."""
        self.runs.setdefault(name, []).append(
            io_run(self.dev, self.size, (name, name, "4k", 128), runtime_s,
                   self.ctx.pool, disks))

    def result(self, data_bytes, isolated):
        """The figures of this volblocksize, repeats summarised.

        ``*_ios_per_block``: I/Os per block of the device in one run.
        Writes to one block within a transaction group are merged, so on
        a small device the write amplification stays far below that of a
        large one, where a 4k write rarely shares its block."""
        conv = self.runs["convert"]
        used = [c["space_used_bytes"] for c in conv]
        out = {"volblocksize": self.bytes, "source_data_bytes": data_bytes,
               "convert_s": common.summary(c["seconds"] for c in conv),
               "space_used_spread_bytes": max(used) - min(used),
               "other_sr_ls_excludes_it": isolated}
        out.update(dict((k, v) for k, v in conv[-1].items()
                        if k != "seconds"))
        for name in ("randread", "randwrite"):
            runs = self.runs[name]
            out[name + "_iops"] = common.summary(m["iops"] for m in runs)
            for field in ("disk_read_per_byte", "disk_written_per_byte"):
                out["%s_%s" % (name, field)] = common.summary(
                    m[field] for m in runs)
            out[name + "_ios_per_block"] = common.summary(
                m["ios"] * self.bytes / float(self.size) for m in runs)
        return out


def measure(targets, src, plan_, disks):
    """Every measurement, repeats interleaved across the block sizes so
    that a burst of host load hits them all alike."""
    for i in range(plan_["runs"]):
        for t in targets:
            t.convert(src)
        common.log("volblocksize: import run %d/%d done", i + 1,
                   plan_["runs"])
    for t in targets:
        t.fill()
    for name in ("randread", "randwrite"):
        for _ in range(plan_["runs"]):
            for t in targets:
                t.random_io(name, plan_["runtime_s"], disks)
        common.log("volblocksize: %s done", name)


def _other_sr_ignores(ctx, key):
    """SRs side by side in one pool: the bench SR's SR.ls must not list
    this SR's VDI (a cheap check, recorded, not asserted)."""
    return all(v["key"] != key for v in ctx.plugin("SR.ls", sr=ctx.sr))


# --- the section ------------------------------------------------------------------

def _pool_ashift(ctx):
    """The ashift ZFS chose, from a leaf's label (``zpool get`` says 0,
    auto, and ``zdb -C`` needs a cachefile the bench pool does not have)."""
    for leaf in pool_leaves(ctx.pool):
        try:
            out = common.run(["zdb", "-l", leaf])
        except Exception:   # noqa: BLE001 -- recorded, not needed
            continue
        for line in out.splitlines():
            if line.strip().startswith("ashift:"):
                return int(line.split(":")[1])
    return None


def run(ctx):
    plan_ = plan(ctx)
    src = os.path.join(ctx.scratch, "vbs-source.img")
    start = time.time()
    data_bytes = build_source(src, plan_["image_bytes"])
    common.log("volblocksize: source image %d MiB, %d MiB data, built in "
               "%.0fs", plan_["image_bytes"] // MIB, data_bytes // MIB,
               time.time() - start)
    disks = pool_disks(ctx.pool)
    targets = []
    try:
        for vbs in SIZES:
            targets.append(Target(ctx, vbs, plan_["image_bytes"]))
            targets[-1].setup()
        isolated = [_other_sr_ignores(ctx, t.vol["key"]) for t in targets]
        measure(targets, src, plan_, disks)
        results = [t.result(data_bytes, ok)
                   for t, ok in zip(targets, isolated)]
    finally:
        os.unlink(src)
        for t in targets:
            t.destroy()
    return {"config": {"image_mib": plan_["image_bytes"] // MIB,
                       "runs": plan_["runs"],
                       "runtime_s": plan_["runtime_s"], "seed": SEED,
                       "ashift": _pool_ashift(ctx),
                       "primarycache": "metadata",
                       "fio": "randread/randwrite bs=4k iodepth=128 "
                              "libaio direct=1, after a full 4M write"},
            "results": results, "notes": notes(results)}


def notes(results):
    """The comparisons a reader looks for first."""
    by_size = dict((r["volblocksize"], r) for r in results)
    out = []
    small, eight, sixteen, large = (by_size.get(4096), by_size.get(8192),
                                    by_size.get(16384), by_size.get(131072))
    if small and large:
        out.append("4K blocks use %.2fx the space of 128K for the same "
                   "image" % (small["space_used_bytes"]
                              / float(large["space_used_bytes"])))
    if eight and sixteen:
        out.append("8K blocks use %.2fx the space of 16K for the same "
                   "image" % (eight["space_used_bytes"]
                              / float(sixteen["space_used_bytes"])))
    for r in (small, eight, sixteen, large):
        if r:
            out.append("%dK: a 4k random read costs %.1fx its size in disk "
                       "reads; a 4k random write %.1fx in disk writes and "
                       "%.1fx in reads, with %.1f writes per block merged "
                       "in a run" % (
                           r["volblocksize"] // 1024,
                           r["randread_disk_read_per_byte"]["median"],
                           r["randwrite_disk_written_per_byte"]["median"],
                           r["randwrite_disk_read_per_byte"]["median"],
                           r["randwrite_ios_per_block"]["median"]))
    out.append("On a device this small the random writes of a run merge "
               "within a block (writes per block above), and IOPS reward "
               "the sizes with fewer distinct blocks to read and rewrite; "
               "the per-byte disk figures are what carries over to a large "
               "disk, where a 4k write rarely shares its block.")
    if any(r["space_used_spread_bytes"] > 0.01 * r["space_used_bytes"]
           for r in results):
        out.append("space used differed by over 1% between runs: the last "
                   "run is reported (space_used_spread_bytes)")
    return out
