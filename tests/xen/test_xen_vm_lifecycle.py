"""A real Xen PV VM on zfs-ng disks through its life: reboots with a
reset-on-boot disk, a snapshot and a delta backup while it writes, a
revert while it is halted, a forced halt while it writes, VBDs plugged
into and unplugged from it while it runs (one of them read-only). The
VM is run as xapi and xenopsd run it
(xenops.py cites each step in xen-api v26.1.4); the disks go through
blkfront, tapback and tapdisk as in test_xen_vm.py. Run by ``make
test-xen`` in the test guest booted as a Xen host.
"""

import re
import subprocess
import time

import pytest

from test_xen_vm import kernel_complaints, seeded, sha, tap_list, \
    tapback_slaves, wait_for, xen_host  # noqa: F401
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
          "then), seconds): %s" % vm.unplugs, flush=True)


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


def start_streaming(vm, p):
    """Start the VM with its domU rewriting the region of xvda from the
    patterns p in turn, acking each write after its fsync."""
    vm.start({"STREAM": "xvda", "STREAM_BLOCKS": STREAM_BLOCKS,
              "STREAM_PATTERNS": PATTERNS, "STREAM_MAX": 100000},
             dict(("p%d.bin" % i, p[i]) for i in range(PATTERNS)))


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
    start_streaming(vm, p)
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


def read_direct(path, size):
    """The first size bytes (whole MiB) of path, read with O_DIRECT: what
    the zvol holds, not dom0's page cache."""
    proc = subprocess.run(["dd", "if=" + path, "bs=1M", "iflag=direct",
                           "count=%d" % (size // MiB), "status=none"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(proc.stdout) == size
    return proc.stdout


# Writes the console may still hold when the domain goes: acknowledged
# in the guest, their "acked" line in the console ring xenconsoled had
# not read yet (2 KiB, 25 bytes a line), plus the write in flight.
CONSOLE_SLACK = 96


def test_a_vm_halted_by_force_mid_write_keeps_what_it_acked_and_boots(
        xen_host, plugin, dp, sr, tmp_path):
    """``xe vm-shutdown --force`` (xenops.Vm.hard_shutdown: VM_poweroff
    with no timeout, xenops_server.ml:1823-1853) while the guest writes
    block after block, each with O_DIRECT then fsync: no request reaches
    the guest; the domain is paused mid-stream, its VBD unplugged by
    force (Device.hard_shutdown, device.ml:335-366), its datapath
    deactivated and detached, the domain destroyed, then Datapath.close.
    Every datapath call must succeed and leave no tapdisk, minor or
    record; the disk, read from dom0, must hold every write the guest saw
    acknowledged (a state of its sequence, the write in flight allowed in
    part); and the VM must start again on it and read the same."""
    t0 = time.monotonic()
    vol = new_vdi(plugin, sr)
    zvol = "/dev/zvol/" + dataset(vol)
    sh("udevadm", "settle")
    orig = seeded(4400, REGION)
    p = [seeded(4401 + i, REGION) for i in range(PATTERNS)]
    assert dd_write(zvol, orig) == (0, "")
    vm = Vm(xen_host, plugin, dp, sr, "zfsng-force", tmp_path)
    vm.add_disk(vol)
    start_streaming(vm, p)
    wait_for("the guest's writes", lambda: acked(vm) >= 16, 600)
    before = acked(vm)
    domid = vm.domid
    halt_s = vm.hard_shutdown()
    total = acked(vm)       # what reached the console: acknowledged
    assert total >= before
    report(vm)
    assert [m for m, _, _ in vm.calls] == [
        "Datapath.open", "Datapath.attach", "Datapath.activate",
        "Datapath.deactivate", "Datapath.detach", "Datapath.close"]
    (_, _, unplug, unplug_s), = vm.unplugs
    print("xen-lifecycle: forced halt in %.1fs after %d acks seen (%d at "
          "its start): backend %s, played in %.1fs; deactivate %.1fs, "
          "detach %.1fs, close %.1fs +%.1fs" % (
              halt_s, total, before, unplug, unplug_s,
              vm.took("Datapath.deactivate")[0],
              vm.took("Datapath.detach")[0], vm.took("Datapath.close")[0],
              time.monotonic() - t0), flush=True)
    assert tap_list() == [] and states() == []
    assert domid not in tapback_slaves()
    assert xen_host.read("/local/domain/0/backend/vbd3/%d" % domid) is None

    live = read_direct(zvol, REGION)
    held = writes_held(live, orig, p, total, total + CONSOLE_SLACK)
    assert held is not None, "the disk lost a write the guest saw " \
        "acknowledged (%d seen on its console)" % total
    print("xen-lifecycle: the disk holds the guest's first %d writes, %d "
          "of them acknowledged on its console +%.1fs" % (
              held, total, time.monotonic() - t0), flush=True)

    # xe vm-start on the same disk: the guest reads what dom0 read
    vm.start({"READ": "xvda", "SPAN_BLOCKS": STREAM_BLOCKS})
    vm.wait_said("ready")
    assert vm.said("read") == {"xvda": sha(live)}
    vm.shutdown()
    assert dd_hash(zvol, REGION, 0) == sha(live)
    assert tap_list() == [] and states() == []
    assert kernel_complaints() == []
    print("xen-lifecycle: booted again on it +%.1fs"
          % (time.monotonic() - t0), flush=True)


HOT_SPAN = 1 * MiB
HOT_BLOCKS = HOT_SPAN // BLOCK
VDISK_READONLY = 4      # blkif.h; tapback's "info" for mode "r"


def test_vbds_plugged_into_and_unplugged_from_a_running_vm(
        xen_host, plugin, dp, sr, tmp_path):
    """``xe vbd-plug`` and ``xe vbd-unplug`` on a running VM (xenops.Vm
    hotplug and hotunplug: VBD_hotplug and VBD_hotunplug,
    xenops_server.ml:1945-1948): Datapath.attach and activate, then the
    device; the clean device removal, then deactivate and detach; never
    open nor close (no epoch). The guest writes a pattern to the plugged
    disk; the disk is unplugged (the pattern is on the zvol, no tapdisk
    or record is left), plugged again, and the guest reads the pattern
    back. A second VDI is plugged read-only (mode RO): blkfront makes it
    a read-only disk, the guest reads it and its write fails, and the
    VDI is unchanged."""
    t0 = time.monotonic()
    hot, ro = new_vdi(plugin, sr), new_vdi(plugin, sr)
    zvols = ["/dev/zvol/" + dataset(v) for v in (hot, ro)]
    sh("udevadm", "settle")
    base, ro_data, h = (seeded(4500, HOT_SPAN), seeded(4501, HOT_SPAN),
                        seeded(4502, HOT_SPAN))
    assert dd_write(zvols[0], base) == (0, "")
    assert dd_write(zvols[1], ro_data) == (0, "")
    vm = Vm(xen_host, plugin, dp, sr, "zfsng-hotplug", tmp_path)
    vm.start({"SPAN_BLOCKS": HOT_BLOCKS, "STEPS": " ".join([
        "appear:xvda", "read:xvda", "write:xvda:/h.bin", "gone:xvda",
        "appear:xvda", "read:xvda", "appear:xvdb", "ro:xvdb"])},
        {"h.bin": h})
    vm.wait_said("waiting for xvda")        # up, blkfront loaded, idle
    print("xen-lifecycle: the VM runs, no disk +%.1fs"
          % (time.monotonic() - t0), flush=True)

    # xe vbd-plug: the guest finds the disk, reads it, writes h
    disk = vm.add_disk(hot)
    vm.hotplug(disk)
    vm.wait_said("wrote")
    assert vm.said("read") == {"xvda": sha(base)}
    assert vm.said("wrote") == {"xvda": sha(h)}
    print("xen-lifecycle: plugged, the guest wrote +%.1fs"
          % (time.monotonic() - t0), flush=True)

    # xe vbd-unplug: blkfront lets the disk go; what it wrote is there
    vm.hotunplug(disk)
    vm.wait_said("gone")
    assert tap_list() == [] and states() == []
    assert dd_hash(zvols[0], HOT_SPAN, 0) == sha(h)
    print("xen-lifecycle: unplugged +%.1fs" % (time.monotonic() - t0),
          flush=True)

    # xe vbd-plug again, and a read-only VBD of the other VDI
    vm.hotplug(disk)
    ro_disk = vm.add_disk(ro, readonly=True)
    ro_id = plugin("Volume.stat", sr=sr, key=ro["key"])["keys"].get(
        "content_id")
    vm.hotplug(ro_disk)
    assert xen_host.read(ro_disk.vbd.back + "/mode") == "r"
    assert int(xen_host.read(ro_disk.vbd.back + "/info")) & VDISK_READONLY
    lines = vm.wait_said("ro ")
    assert vm.said("read") == {"xvda": sha(h)}
    seen = [m.groups() for m in (re.match(
        r"ro xvdb (\S+) ([0-9a-f]{64}) ?(.*)$", line) for line in lines)
        if m]
    assert len(seen) == 1, lines
    flag, got, error = seen[0]
    assert (flag, got) == ("1", sha(ro_data))
    # zfs-ng declares VDI_ACTIVATE_READONLY: storage_mux activates the RO
    # VBD with activate_readonly, tapdisk opens the zvol read-only (dom0
    # cannot write through the tapdev either) and the id is kept
    assert vm.activate_method(ro_disk) == "Datapath.activate_readonly"
    tapdev = xen_host.read(ro_disk.vbd.back + "/params")
    assert dd_write(tapdev, seeded(4503, MiB))[0] != 0
    assert plugin("Volume.stat", sr=sr, key=ro["key"])["keys"].get(
        "content_id") == ro_id
    print("xen-lifecycle: plugged again and read back; read-only xvdb "
          "(%s): the guest's write failed: %s; dom0's through %s too; "
          "content_id kept +%.1fs" % (
              vm.activate_method(ro_disk), error, tapdev,
              time.monotonic() - t0), flush=True)

    vm.shutdown()
    report(vm)
    methods = [m for m, _, _ in vm.calls]
    assert "Datapath.open" not in methods
    assert methods == [
        "Datapath.attach", "Datapath.activate",
        "Datapath.deactivate", "Datapath.detach",
        "Datapath.attach", "Datapath.activate",
        "Datapath.attach", vm.activate_method(ro_disk),
        "Datapath.deactivate", "Datapath.detach",
        "Datapath.deactivate", "Datapath.detach",
        "Datapath.close", "Datapath.close"]
    assert dd_hash(zvols[0], HOT_SPAN, 0) == sha(h)
    assert dd_hash(zvols[1], HOT_SPAN, 0) == sha(ro_data)
    assert tap_list() == [] and states() == []
    assert kernel_complaints() == []
