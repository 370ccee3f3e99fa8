"""A real Xen PV VM on zfs-ng disks through its life: reboots with a
reset-on-boot disk, a snapshot and a delta backup while it writes, a
revert while it is halted. The VM is run as xapi and xenopsd run it
(xenops.py cites each step in xen-api v26.1.4); the disks go through
blkfront, tapback and tapdisk as in test_xen_vm.py. Run by ``make
test-xen`` in the test guest booted as a Xen host.
"""

import re
import time

import pytest

from test_xen_vm import kernel_complaints, seeded, sha, tap_list, \
    wait_for, xen_host  # noqa: F401
from conftest import PluginError, dp, disks, new_uuid, plugin, sh, sr  # noqa: E501,F401
from conftest import _shared_sr_ends_with_its_module  # noqa: F401
from datapath_util import dataset, dd_hash, dd_write, new_vdi, states
from test_cbt import backup_over_nbd, changed, content, truth
from xapi_flows import vdi_snapshot
from xenops import BLOCK, MiB, Vm

SPAN = 4 * MiB                  # what each boot reads and writes
SPAN_BLOCKS = SPAN // BLOCK
SECTOR = 512


def snapshots(under):
    return sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-r",
              under).split()


def report(vm):
    print("xen-lifecycle: datapath calls (method, devid, boot): %s"
          % vm.calls, flush=True)
    print("xen-lifecycle: unplugs (boot, dev, (backend state before, "
          "then)): %s" % vm.unplugs, flush=True)


def test_a_reset_on_boot_disk_is_back_at_every_start_a_persistent_one_keeps(
        xen_host, plugin, dp, sr, tmp_path):
    """on_boot=reset reaches zfs-ng as Datapath.open(persistent=false) at
    each start (VBD_epoch_begin); Datapath.close at xe vm-reboot and xe
    vm-shutdown (VBD_epoch_end) resets the disk; a guest's own poweroff
    gets no close, and the next start's open resets it."""
    t0 = time.monotonic()
    reset, kept = new_vdi(plugin, sr), new_vdi(plugin, sr)
    zvols = ["/dev/zvol/" + dataset(v) for v in (reset, kept)]
    sh("udevadm", "settle")
    orig = [seeded(4100, SPAN), seeded(4101, SPAN)]
    for zvol, data in zip(zvols, orig):
        assert dd_write(zvol, data) == (0, "")
    a, b, c = seeded(4102, SPAN), seeded(4103, SPAN), seeded(4104, SPAN)
    vm = Vm(xen_host, plugin, dp, sr, "zfsng-reset", tmp_path)
    vm.add_disk(reset, persistent=False)
    vm.add_disk(kept, persistent=True)
    read = {"READ": "xvda xvdb", "SPAN_BLOCKS": SPAN_BLOCKS}
    point = dataset(reset) + "@zfsng-nonpersistent"

    # xe vm-start; the guest finds what dom0 wrote and writes both disks
    vm.start(dict(read, WRITE="xvda:/a.bin xvdb:/b.bin"),
             {"a.bin": a, "b.bin": b})
    vm.wait_said("ready")
    assert vm.said("read") == {"xvda": sha(orig[0]), "xvdb": sha(orig[1])}
    assert vm.said("wrote") == {"xvda": sha(a), "xvdb": sha(b)}
    assert snapshots(sr) == [point]
    print("xen-lifecycle: boot 1 done +%.1fs" % (time.monotonic() - t0))

    # xe vm-reboot: the reset disk is back, the persistent one kept b;
    # the guest writes the reset disk again, then powers itself off
    vm.reboot(dict(read, WRITE="xvda:/c.bin", END="poweroff"),
              {"c.bin": c})
    vm.wait_said("powering off")
    assert vm.said("read") == {"xvda": sha(orig[0]), "xvdb": sha(b)}
    assert vm.said("wrote") == {"xvda": sha(c)}
    vm.halted_by_guest()
    # no Datapath.close after a guest's own poweroff: the reset is pending
    assert dd_hash(zvols[0], SPAN, 0) == sha(c)
    assert snapshots(sr) == [point]
    assert tap_list() == []
    print("xen-lifecycle: boot 2 done +%.1fs" % (time.monotonic() - t0))

    # xe vm-start: open(persistent=false) finds the reset point and resets
    vm.start(read)
    vm.wait_said("ready")
    assert vm.said("read") == {"xvda": sha(orig[0]), "xvdb": sha(b)}
    vm.shutdown()
    print("xen-lifecycle: boot 3 done +%.1fs" % (time.monotonic() - t0))
    report(vm)
    assert [m for m, _, _ in vm.calls if m in (
        "Datapath.open", "Datapath.close")] == [
        "Datapath.open"] * 2 + ["Datapath.close"] * 2 + \
        ["Datapath.open"] * 4 + ["Datapath.close"] * 2
    assert dd_hash(zvols[0], SPAN, 0) == sha(orig[0])
    assert dd_hash(zvols[1], SPAN, 0) == sha(b)
    assert snapshots(sr) == []
    assert tap_list() == [] and states() == []
    assert kernel_complaints() == []


STREAM_BLOCKS = 64              # the 4 MiB the domU keeps rewriting
PATTERNS = 4                    # one per pass, in turn
PERIOD = STREAM_BLOCKS * PATTERNS   # writes after which the region repeats
REGION = STREAM_BLOCKS * BLOCK


def acked(vm):
    """How many writes the domU has acknowledged so far (its "acked n"
    lines, n from 0 in order; the log's last line may be cut short)."""
    done = [int(m.group(1)) for m in
            (re.match(r"acked (\d+)$", line) for line in vm.lines()) if m]
    n = 0
    while n < len(done) and done[n] == n:
        n += 1
    assert n >= len(done) - 1, done[-5:]
    return n


def block_after(n, b, orig, p):
    """Block b of the region after the domU's first n writes: write w
    goes to block w % STREAM_BLOCKS from p[(w // STREAM_BLOCKS) %
    PATTERNS]."""
    if n <= b:
        src = orig
    else:
        last = b + (n - 1 - b) // STREAM_BLOCKS * STREAM_BLOCKS
        src = p[(last // STREAM_BLOCKS) % PATTERNS]
    return src[b * BLOCK:(b + 1) * BLOCK]


def writes_held(image, orig, p, lo, hi):
    """The largest n in [lo, hi] such that image is the region after the
    first n writes, write n (the one that may have been in flight)
    allowed in part, sector by sector; or None. A crash-consistent image
    of a writer that waits for each write and its flush is one of
    these. The region repeats every PERIOD writes: a window that wide
    could not tell a lost write."""
    assert hi - lo < PERIOD, "window %d..%d too wide" % (lo, hi)
    for n in range(hi, lo - 1, -1):
        torn = n % STREAM_BLOCKS
        ok = True
        for b in range(STREAM_BLOCKS):
            got = image[b * BLOCK:(b + 1) * BLOCK]
            if got == block_after(n, b, orig, p):
                continue
            new = block_after(n + 1, b, orig, p)
            old = block_after(n, b, orig, p)
            if b == torn and all(
                    got[s:s + SECTOR] in (old[s:s + SECTOR], new[s:s + SECTOR])
                    for s in range(0, BLOCK, SECTOR)):
                continue
            ok = False
            break
        if ok:
            return n
    return None


def test_a_snapshot_and_a_delta_backup_of_a_writing_vm_hold_what_it_acked(
        xen_host, plugin, dp, sr, tmp_path):
    """xapi's VDI.snapshot of a running VM's disk (Volume.snapshot while
    attached and active, then Volume.set of snapshot_time, is_a_snapshot
    and snapshot_of: main.ml:1424-1440) while the guest writes block
    after block, each with O_DIRECT then fsync; then Xen Orchestra's
    delta export: the changed blocks since the previous backup's snapshot
    (Volume.list_changed_blocks), read over NBD from the new snapshot's
    dom0 attach (test_cbt.backup_over_nbd). The snapshot, and the backup,
    must be one state of the writer's sequence (crash-consistent),
    holding every write the guest saw acknowledged before the call began
    and none it had not issued when the call returned. (A write
    acknowledged during the call may be in it or not: it may have come
    after the snapshot's point.)"""
    t0 = time.monotonic()
    vol = new_vdi(plugin, sr)
    key, size = vol["key"], vol["virtual_size"]
    zvol = "/dev/zvol/" + dataset(vol)
    sh("udevadm", "settle")
    orig = seeded(4200, REGION)
    p = [seeded(4201 + i, REGION) for i in range(PATTERNS)]
    assert dd_write(zvol, orig) == (0, "")
    plugin("Volume.enable_cbt", sr=sr, key=key)
    base = vdi_snapshot(plugin, sr, key)        # the previous backup's
    base_bytes = orig + bytes(size - REGION)
    vm = Vm(xen_host, plugin, dp, sr, "zfsng-backup", tmp_path)
    vm.add_disk(vol)
    vm.start({"STREAM": "xvda", "STREAM_BLOCKS": STREAM_BLOCKS,
              "STREAM_PATTERNS": PATTERNS, "STREAM_MAX": 100000},
             dict(("p%d.bin" % i, p[i]) for i in range(PATTERNS)))
    wait_for("the guest's first writes", lambda: acked(vm) >= 8, 600)
    before = acked(vm)
    t1 = time.monotonic()
    snap = plugin("Volume.snapshot", sr=sr, key=key)
    snap_s = time.monotonic() - t1
    returned = acked(vm)
    wait_for("the guest writing on after the snapshot",
             lambda: acked(vm) >= returned + 4, 300)
    after = acked(vm)       # bounds what the guest had issued at the return
    for k, v in (("snapshot_time", "20261129T00:00:00Z"),
                 ("is_a_snapshot", "true"), ("snapshot_of", key)):
        plugin("Volume.set", sr=sr, key=snap["key"], k=k, v=v)
    print("xen-lifecycle: snapshot in %.1fs, the guest's acks: %d before "
          "the call, %d when it returned +%.1fs" % (
              snap_s, before, returned, time.monotonic() - t0))

    # the delta backup, while the guest writes on
    blocks = changed(plugin, sr, base["key"], snap["key"], size)
    copy = tmp_path / "backup.raw"
    with open(str(copy), "wb") as f:
        f.write(orig)                           # the previous backup
        f.truncate(size)
    read, whole = backup_over_nbd(dp, snap, sorted(blocks), str(copy))
    assert read == len(blocks) * BLOCK
    assert sha(copy.read_bytes()) == sha(whole)
    want = truth(base_bytes, whole)
    assert want <= blocks, sorted(want - blocks)
    assert blocks <= set(range(STREAM_BLOCKS)), sorted(blocks)
    assert sha(whole[REGION:]) == sha(bytes(size - REGION))
    held = writes_held(whole[:REGION], orig, p, before, after + 1)
    assert held is not None, "the snapshot is no state of the guest's " \
        "writes holding the %d it saw acknowledged before the call" % before
    print("xen-lifecycle: the snapshot holds the guest's first %d writes "
          "(%d acknowledged before the call, %d when it returned); the "
          "backup read %d blocks over NBD +%.1fs" % (
              held, before, returned, len(blocks), time.monotonic() - t0))

    vm.shutdown()                               # while the guest writes
    total = acked(vm)
    with open(zvol, "rb") as f:
        live = f.read(REGION)
    # every acknowledged write is on the disk (the log's last lines may
    # have missed the console at the poweroff: a few more is fine)
    final = writes_held(live, orig, p, total, total + 8)
    assert final is not None, "the disk lost an acknowledged write"
    report(vm)
    # the snapshot is unchanged by the writes after it
    assert sha(content(dp, snap)) == sha(whole)
    assert tap_list() == [] and states() == []
    assert kernel_complaints() == []
    print("xen-lifecycle: %d writes acknowledged in all, the disk holds "
          "%d +%.1fs" % (total, final, time.monotonic() - t0))


def test_a_halted_vm_reverted_to_a_snapshot_starts_on_its_content(
        xen_host, plugin, dp, sr, tmp_path):
    """xe vm-snapshot of the halted VM, a run that writes, then the VM
    halted and its disk reverted in place (Volume.revert, as xapi 26.1.14
    and later call it for VM.revert: README "Reverting a VM to a
    snapshot"); the next start reads the snapshot's content. Refused
    while the VM runs."""
    vol = new_vdi(plugin, sr)
    key = vol["key"]
    zvol = "/dev/zvol/" + dataset(vol)
    sh("udevadm", "settle")
    orig, b = seeded(4300, SPAN), seeded(4301, SPAN)
    assert dd_write(zvol, orig) == (0, "")
    snap = vdi_snapshot(plugin, sr, key)
    vm = Vm(xen_host, plugin, dp, sr, "zfsng-revert", tmp_path)
    vm.add_disk(vol)
    read = {"READ": "xvda", "SPAN_BLOCKS": SPAN_BLOCKS}
    vm.start(dict(read, WRITE="xvda:/b.bin"), {"b.bin": b})
    vm.wait_said("ready")
    assert vm.said("read") == {"xvda": sha(orig)}
    assert vm.said("wrote") == {"xvda": sha(b)}
    with pytest.raises(PluginError) as err:
        plugin("Volume.revert", sr=sr, snapshot=snap["key"], key=key)
    assert err.value.name == "VdiInUse"
    vm.shutdown()
    assert dd_hash(zvol, SPAN, 0) == sha(b)
    stat = plugin("Volume.stat", sr=sr, key=key)
    plugin("Volume.revert", sr=sr, snapshot=snap["key"], key=key)
    again = plugin("Volume.stat", sr=sr, key=key)
    for field in ("key", "uuid", "uri", "virtual_size"):
        assert again.get(field) == stat.get(field), field
    # other data: a content_id of its own (zfsng/contentid.py)
    was, now = stat["keys"].pop("content_id"), again["keys"].pop("content_id")
    assert again["keys"] == stat["keys"]
    assert now not in ("", was, snap["keys"]["content_id"])
    vm.start(read)
    vm.wait_said("ready")
    assert vm.said("read") == {"xvda": sha(orig)}
    vm.shutdown()
    report(vm)
    sh("udevadm", "settle")
    assert dd_hash(zvol, SPAN, 0) == sha(orig)
    assert sha(content(dp, snap)[:SPAN]) == sha(orig)
    assert tap_list() == [] and states() == []
    assert kernel_complaints() == []
