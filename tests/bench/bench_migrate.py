"""Storage migration out of zfs-ng: what a live migration costs the link
and the guest, through the real tapdisk and in xapi's order (the same
sequence tests/integration/test_migrate_out.py plays as a test).

The source is a volume attached and activated for a guest domain (its
tapdev stands for the guest's disk); the destination a volume of a
second zfs-ng SR on the same pool, attached for the migration's "MIR"
pseudo-domain and served by tapdisk's NBD server (zfs-ng's receive
side), reached through a one-shot proxy as xapi's is. Each migration is
checked: the destination's bytes equal the source's once the VM has
"moved", or the section fails.

* **Against disk size.** Sparse disks (256 MiB, 4 GiB, 8 GiB) holding
  the same DATA bytes (half at the start, half in the middle), no
  writer: the time from Data.mirror to complete, the bytes sent, the
  pause. Target: a disk copies its data, not its size. A running VM's
  disk moves only where its pool has room to write it whole while it is
  mirrored (zfsng/spaceguard.py), hence sizes the bench pool can hold.
* **A halted VM's disk.** Sparse disks of 256 MiB, 64 GiB and 16 TiB, no
  guest: xapi mirrors them with the domid -1 (one snapshot copied, no
  tapdisk, no guard). Target: sent equals allocated, a 16 TiB disk
  copies its data, not its size.
* **A VM with snapshots.** A sparse disk (256 MiB, 1 GiB) with DATA
  bytes, two snapshots with a REWRITE between, the VM running: its disk
  mirrored, then, while the mirror lives on, each snapshot as xapi
  copies it itself (DATA.copy: attached and activated for a "CP" domain,
  its tapdisk's device read whole, as sparse_dd reads it): seconds and
  bytes read against the snapshot's referenced and written bytes, and
  the non-zero bytes sparse_dd would send. Target: none (xapi's cost,
  not zfs-ng's): how much a snapshot's copy reads against its data.
* **A full disk, against a plain copy.** FULL bytes written whole, no
  writer: the migration against a plain full copy of the same disk to a
  fresh destination through the same kind of proxy (every block read from
  the device and written over NBD, as a generic copy does).
* **With a guest writing.** The full disk again, with a writer through
  the tapdev (64 KiB blocks at random, a fifth of them zeros) at several
  rates: rounds, bytes sent against the allocated bytes plus what the
  guest wrote during the copy, the pause as the job timed it and the
  slowest guest write (the guest's view of the pause). Target: sent at
  most 1.05x allocated plus rewritten; the pause at most 1 s of guest time
  at a rate the link carries.
* **While mirrored.** The full disk, the guest writing flat out: HOLD
  seconds with no mirror, then HOLD seconds more between complete and
  the VM's move, while tapdisk mirrors every write. The guest's MB/s in
  each (their ratio: what mirroring costs a busy guest), and the space
  guard's pool syncs in the mirroring (one per window of dirtied bytes):
  their count and seconds, the share of the mirrored time they took.

Under emulation the link (the proxy and the NBD hops) runs at a few MB/s:
the figures to read are the ratios and the pause against the copy time.
"""

import json
import os
import random
import time

import common
from migration_util import BLOCK, Proxy, Writer

MiB, GiB, TiB = 1 << 20, 1 << 30, 1 << 40
DATA = 32 * MiB
FULL = 128 * MiB
SIZES = [256 * MiB, 4 * GiB, 8 * GiB]          # a running VM's
HALTED_SIZES = [256 * MiB, 64 * GiB, 16 * TiB]
SNAPSHOT_SIZES = [256 * MiB, 1 * GiB]
REWRITE = 8 * MiB                 # written between two snapshots
READ = 4 * MiB                    # a snapshot copy's reads (sparse_dd's)
PARTS = ["by_size", "halted", "snapshots", "plain_copy", "full",
         "mirroring"]
HOLD = 30                         # s of flat-out writes, alone and mirrored
RATES = [("idle", None), ("64K/50ms", 0.05), ("64K/5ms", 0.005),
         ("flat out", 0.0)]
GUEST = "5"                       # a guest's domid, as xapi sends it
HALTED = "-1"                     # a halted or suspended VM's
DOM0 = "u0-" + "0b1c2d3e_4f5a_4b6c_8d7e_9f0a1b2c3d4e"   # main.ml domain_of
MIRROR_VM = "MIR0b0e0c"
COPY_VM = "CP4d2a9f"              # xapi's copy_vm: CP, 3 + 3 hex digits
PROXY_DIR = "/var/run/nbdproxy/export"
JOBS = "/var/run/nonpersistent/zfs-ng-datapath-mirror"
DATAPATH_PLUGIN = "usr/libexec/xapi-storage-script/datapath/zfs-ng"


class Migration(object):
    """One VDI migrated out: source attached for the guest, destination
    received, and everything undone in the end."""

    def __init__(self, ctx, dp, dest_sr, size):
        self.ctx, self.dp, self.size, self.dest_sr = ctx, dp, size, dest_sr
        self.src = ctx.new_volume(size, name="mig-src")
        self.dst = ctx.new_volume(size, name="mig-dst", sr=dest_sr)
        self.steps = []
        self.opened = False

    def call(self, method, vol, domain, undo=None):
        result = self.dp(method, uri=vol["uri"][0], domain=domain)
        if undo:
            self.steps.append((undo, vol, domain))
        return result

    def activated(self, vol, domain, kind):
        """attach and activate vol for domain (both undone at the end);
        the attach answer's implementation of that kind."""
        got = self.call("Datapath.attach", vol, domain, "Datapath.detach")
        self.call("Datapath.activate", vol, domain, "Datapath.deactivate")
        (impl,) = [i[1] for i in got["implementations"] if i[0] == kind]
        return impl

    def receive(self):
        """receive_start3: the destination attached and activated for the
        mirror's pseudo-domain; its Nbd answer."""
        uri = self.activated(self.dst, MIRROR_VM, "Nbd")["uri"]
        _, _, sock, name = uri.split(":")
        return sock, name[len("exportname="):]

    def start_guest(self):
        """The VM's start: open, attach, activate; returns its tapdev."""
        self.dp("Datapath.open", uri=self.src["uri"][0], persistent=True)
        self.opened = True
        return self.activated(self.src, GUEST, "XenDisk")["params"]

    def mirror(self, writer=None, domain=GUEST, inside=None):
        """send_start to mirror_wait, then the VM's move; returns the
        job's record and the seconds to complete. domain HALTED: a halted
        VM's disk, never attached for a guest. inside: run once complete,
        before the VM moves (its result in the record's "inside")."""
        sock, export = self.receive()
        self.call("Datapath.attach", self.src, DOM0, "Datapath.detach")
        proxy = Proxy(os.path.join(PROXY_DIR, MIRROR_VM), sock)
        remote = "nbd+unix:///%s?socket=%s/%s" % (export, PROXY_DIR,
                                                  MIRROR_VM)
        started = time.monotonic()
        kind, key = self.dp("Data.mirror", uri=self.src["uri"][0],
                            domain=domain, remote=remote)
        while True:
            got = self.dp("Data.stat", operation=[kind, key])
            if got["failed"]:
                raise RuntimeError("the mirror failed: %r" % _job(key))
            if got["complete"]:
                break
            time.sleep(0.05)
        seconds = time.monotonic() - started
        within = inside() if inside else None
        if inside and _job(key)["phase"] in ("done", "failed"):
            raise RuntimeError("the mirror ended early: %r" % _job(key))
        written = writer.written if writer else 0
        if writer:
            time.sleep(1)
            writer.stop.set()
            writer.join(60)
        moves = (("Datapath.deactivate", GUEST),             # the VM
                 ("Datapath.detach", GUEST)) if domain == GUEST else ()
        for method, vm in moves + (("Datapath.detach", DOM0),):  # moves
            self.undo_one(method, self.src, vm)
        proxy.join(60)
        job = _wait_job(key)
        job["written_during_copy"] = written
        if inside:
            job["inside"] = within
        return job, seconds

    def undo_one(self, method, vol, domain):
        self.dp(method, uri=vol["uri"][0], domain=domain)
        self.steps.remove((method, vol, domain))

    def undo(self):
        """Every datapath call not yet undone, undone in reverse; then the
        VM's epoch ends (close)."""
        for method, vol, domain in reversed(list(self.steps)):
            self.undo_one(method, vol, domain)
        if self.opened:
            self.dp("Datapath.close", uri=self.src["uri"][0])
            self.opened = False

    def same(self, ranges):
        """Whether both devices hold the same bytes over ranges."""
        src = self.ctx.zvol_device(self.src)
        dst = self.ctx.zvol_device(self.dst)
        return all(_read(src, a, n) == _read(dst, a, n) for a, n in ranges)

    def destroy(self):
        self.undo()
        for vol, sr in ((self.src, self.ctx.sr), (self.dst, self.dest_sr)):
            self.ctx.plugin("Volume.destroy", sr=sr, key=vol["key"])


def _job(key):
    with open(os.path.join(JOBS, key + ".json")) as f:
        return json.load(f)


def _wait_job(key, bound=300):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        job = _job(key)
        if job["phase"] in ("done", "failed"):
            if job["phase"] == "failed":
                raise RuntimeError("the mirror job failed: %r" % job)
            return job
        time.sleep(0.2)
    raise RuntimeError("the mirror job did not end: %r" % _job(key))


def _read(path, offset, length):
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def _fill(device, ranges, seed):
    rnd = random.Random(seed)
    fd = os.open(device, os.O_WRONLY)
    try:
        for at, length in ranges:
            for off in range(at, at + length, MiB):
                n = min(MiB, at + length - off)
                os.pwrite(fd, rnd.getrandbits(8 * n).to_bytes(n, "little"),
                          off)
        os.fsync(fd)
    finally:
        os.close(fd)


def _figures(job, seconds, writer=None):
    rounds = job.get("rounds", [])
    return {"seconds": seconds, "sent_bytes": job["copied"],
            "allocated_bytes": job["total"],
            "mirrored_bytes": job.get("mirrored", 0),
            "written_during_copy": job["written_during_copy"],
            "rounds": [r["bytes"] for r in rounds],
            "round_seconds": [r["seconds"] for r in rounds],
            "pause_s": job.get("pause_seconds"),
            "slowest_guest_write_s": writer.slowest if writer else None}


def by_size(ctx, dp, dest_sr, sizes, domain=GUEST):
    """Sparse disks holding DATA bytes, moved without a writer: a running
    VM's (domain GUEST), or a halted VM's (HALTED: no guest started)."""
    rows = []
    for size in sizes:
        mig = Migration(ctx, dp, dest_sr, size)
        try:
            ranges = [(0, DATA // 2), (size // 2, DATA // 2)]
            _fill(ctx.zvol_device(mig.src), ranges, size % 997)
            if domain == GUEST:
                mig.start_guest()
            job, seconds = mig.mirror(domain=domain)
            if not mig.same(ranges):
                raise RuntimeError("destination differs at %d (domain %s)"
                                   % (size, domain))
            rows.append(dict(_figures(job, seconds), size=size))
            common.log("migrate %d bytes, domain %s: %.1f s, sent %d", size,
                       domain, seconds, job["copied"])
        finally:
            mig.destroy()
    return rows


def snapshot_copies(ctx, dp, dest_sr, sizes):
    """A running VM with two snapshots: its disk mirrored, then each
    snapshot read as xapi's DATA.copy reads it while the mirror lives."""
    rows = []
    for size in sizes:
        mig = Migration(ctx, dp, dest_sr, size)
        snaps = []
        try:
            ranges = [(0, DATA // 2), (size // 2, DATA // 2)]
            _fill(ctx.zvol_device(mig.src), ranges, size % 991)
            for n in (1, 2):
                snaps.append(_snapshot(ctx, mig.src))
                rewritten = [(n * REWRITE, REWRITE // 2),
                             (size // 2 + n * REWRITE, REWRITE // 2)]
                _fill(ctx.zvol_device(mig.src), rewritten, n)
                ranges += rewritten
            mig.start_guest()
            # the job stays "mirroring" until the VM moves (mirror()'s
            # end): the copies run inside it, as xapi nests them
            job, seconds = mig.mirror(domain=GUEST, inside=lambda: [
                _copy_read(ctx, dp, snap) for snap in snaps])
            reads = job.pop("inside")
            if not mig.same(ranges):
                raise RuntimeError("destination differs at %d" % size)
            rows.append(dict(_figures(job, seconds), size=size,
                             snapshots=reads))
            common.log("snapshots of %d bytes: mirror %.1f s, reads %s",
                       size, seconds, [r["seconds"] for r in reads])
        finally:
            mig.undo()
            for snap in snaps:
                ctx.plugin("Volume.destroy", sr=ctx.sr, key=snap["key"])
            mig.destroy()
    return rows


def _snapshot(ctx, vol):
    """VDI.snapshot as xapi-storage-script makes it (the keys it sets)."""
    snap = ctx.plugin("Volume.snapshot", sr=ctx.sr, key=vol["key"])
    for k, v in (("is_a_snapshot", "true"), ("snapshot_of", vol["key"]),
                 ("vdi-type", "user")):
        ctx.plugin("Volume.set", sr=ctx.sr, key=snap["key"], k=k, v=v)
    return snap


def _copy_read(ctx, dp, snap):
    """with_activated_disk and sparse_dd's read of one snapshot: attach
    and activate for the CP domain, the BlockDevice read whole (its
    non-zero 64 KiB blocks counted: what sparse_dd sends), deactivate,
    detach. Its seconds and bytes, and the snapshot's own figures."""
    uri = snap["uri"][0]
    props = common.run(["zfs", "get", "-Hp", "-o", "value",
                        "referenced,written,used",
                        _snapshot_dataset(snap)]).split()
    started = time.monotonic()
    got = dp("Datapath.attach", uri=uri, domain=COPY_VM)
    (path,) = [i[1]["path"] for i in got["implementations"]
               if i[0] == "BlockDevice"]
    try:
        # read-only attach: activate_readonly (VDI_ACTIVATE_READONLY)
        dp("Datapath.activate_readonly", uri=uri, domain=COPY_VM)
        ready = time.monotonic()
        read = nonzero = 0
        zero = bytes(BLOCK)
        with open(path, "rb", buffering=0) as f:
            for chunk in iter(lambda: f.read(READ), b""):
                read += len(chunk)
                nonzero += sum(BLOCK for at in range(0, len(chunk), BLOCK)
                               if chunk[at:at + BLOCK] != zero)
        reading = time.monotonic() - ready
        dp("Datapath.deactivate", uri=uri, domain=COPY_VM)
    finally:
        dp("Datapath.detach", uri=uri, domain=COPY_VM)
    return {"seconds": time.monotonic() - started, "read_seconds": reading,
            "read_bytes": read, "nonzero_bytes": nonzero,
            "referenced_bytes": int(props[0]), "written_bytes": int(props[1]),
            "used_bytes": int(props[2])}


def _snapshot_dataset(snap):
    """pool/.../parent@snapshot, from the snapshot VDI's URI."""
    from zfsng_datapath import uri
    return uri.parse(snap["uri"][0]).dataset


def plain_copy(ctx, dp, dest_sr, size):
    """A generic full copy of a full disk over the same kind of link:
    every block read from the device, written over NBD."""
    from zfsng_datapath import nbd        # the installed copy
    mig = Migration(ctx, dp, dest_sr, size)
    try:
        _fill(ctx.zvol_device(mig.src), [(0, size)], 7)
        sock, export = mig.receive()
        path = os.path.join(PROXY_DIR, MIRROR_VM)
        proxy = Proxy(path, sock)
        started = time.monotonic()
        client = nbd.Client.connect(path, export)
        with open(ctx.zvol_device(mig.src), "rb") as f:
            for at in range(0, size, nbd.MAX_REQUEST):
                client.write(at, f.read(nbd.MAX_REQUEST))
        client.flush()
        seconds = time.monotonic() - started
        client.close()
        proxy.join(60)
        if not mig.same([(0, size)]):
            raise RuntimeError("the plain copy differs")
        return {"seconds": seconds, "sent_bytes": size}
    finally:
        mig.destroy()


def with_writer(ctx, dp, dest_sr, size, rates):
    rows = []
    for label, interval in rates:
        mig = Migration(ctx, dp, dest_sr, size)
        try:
            _fill(ctx.zvol_device(mig.src), [(0, size)], 11)
            tapdev = mig.start_guest()
            writer = None
            if interval is not None:
                writer = Writer(tapdev, 3, size, interval)
                writer.start()
            job, seconds = mig.mirror(writer)
            if writer and writer.error:
                raise RuntimeError("the guest's write failed: %s"
                                   % writer.error)
            if not mig.same([(0, size)]):
                raise RuntimeError("destination differs (%s)" % label)
            rows.append(dict(_figures(job, seconds, writer), rate=label))
            common.log("migrate with writer %s: %.1f s, rounds %s, "
                       "pause %s", label, seconds, rows[-1]["rounds"],
                       job.get("pause_seconds"))
        finally:
            mig.destroy()
    return rows


def while_mirrored(ctx, dp, dest_sr, size):
    """The guest's flat-out writes alone, then while mirrored; the space
    guard's pool syncs over the mirrored time."""
    mig = Migration(ctx, dp, dest_sr, size)
    try:
        _fill(ctx.zvol_device(mig.src), [(0, size)], 13)
        tapdev = mig.start_guest()
        alone = _flat_out(Writer(tapdev, 17, size, 0.0))
        writer = Writer(tapdev, 19, size, 0.0)
        writer.start()

        def hold():
            before, started = writer.written, time.monotonic()
            writer.slowest = 0.0
            time.sleep(HOLD)
            return {"bytes": writer.written - before,
                    "seconds": time.monotonic() - started,
                    "slowest_s": writer.slowest}
        job, _ = mig.mirror(writer, inside=hold)
        if writer.error:
            raise RuntimeError("the guest's write failed: %s" % writer.error)
        if not mig.same([(0, size)]):
            raise RuntimeError("destination differs (while mirrored)")
        mirrored = job["inside"]
        common.log("while mirrored: alone %.2f MB/s, mirrored %.2f MB/s, "
                   "%s syncs in %.1f s", alone["bytes"] / alone["seconds"]
                   / 1e6, mirrored["bytes"] / mirrored["seconds"] / 1e6,
                   job.get("settles"), job.get("settle_seconds") or 0)
        return {"alone": alone, "mirrored": mirrored,
                "mirrored_bytes": job.get("mirrored", 0),
                "settles": job.get("settles"),
                "settle_seconds": job.get("settle_seconds"),
                "window": job.get("window")}
    finally:
        mig.destroy()


def _flat_out(writer):
    """HOLD seconds of a writer on its own: its bytes, seconds and
    slowest write."""
    started = time.monotonic()
    writer.start()
    time.sleep(HOLD)
    writer.stop.set()
    writer.join(60)
    if writer.error:
        raise RuntimeError("the guest's write failed: %s" % writer.error)
    return {"bytes": writer.written, "seconds": time.monotonic() - started,
            "slowest_s": writer.slowest}


def run(ctx):
    from plugin_client import Plugin
    dp = Plugin(ctx.plugin.root, plugin_dir=DATAPATH_PLUGIN,
                env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})
    dest_sr = ctx.new_sr("migrate-dest")
    full = FULL // 2 if ctx.quick else FULL
    sizes = [SIZES[0], SIZES[-1]] if ctx.quick else SIZES
    rates = RATES[:2] if ctx.quick else RATES
    halted = [HALTED_SIZES[0], HALTED_SIZES[-1]] if ctx.quick else \
        HALTED_SIZES
    snapshots = SNAPSHOT_SIZES[:1] if ctx.quick else SNAPSHOT_SIZES
    parts = {"by_size": lambda: by_size(ctx, dp, dest_sr, sizes),
             "halted": lambda: by_size(ctx, dp, dest_sr, halted, HALTED),
             "snapshots": lambda: snapshot_copies(ctx, dp, dest_sr,
                                                  snapshots),
             "plain_copy": lambda: plain_copy(ctx, dp, dest_sr, full),
             "full": lambda: with_writer(ctx, dp, dest_sr, full, rates),
             "mirroring": lambda: while_mirrored(ctx, dp, dest_sr, full)}
    chosen = [p for p in PARTS if p in (ctx.parts or PARTS)]
    result = {"data_bytes": DATA, "full_bytes": full, "block": BLOCK,
              "rewrite_bytes": REWRITE, "parts": chosen}
    for name in chosen:       # ctx.parts (main.py --parts): some only,
        result[name] = parts[name]()     # merged by report.py --merge
    return result
