"""A real Xen PV VM that runs fio with verification while it is suspended
and resumed, and while its disk moves live to another zfs-ng SR and the
VM to a new domain on it. Run by ``make test-xen`` in the test guest
booted as a Xen host.

Real: Xen 4.17, the domU's kernel (its suspend, and blkfront's resume
onto a new backend), fio 3.33 in the domU (O_DIRECT, libaio, crc32c
verification), xl's save and restore of the domain's memory, tapback,
tapdisk (its mirror mode towards the destination's NBD server), ZFS,
both plugins as installed. Played from xen-api v26.1.4's source: xapi's
and xenopsd's order of calls (xenops.Vm.suspend, resume and migrate cite
each step; the storage side is test_migrate_out's send_start,
Data.stat until complete, receive_start3 and receive_finalize3), and
the memory going through a file rather than xenopsd's socket.

fio in the domU (domufio, tests/xen/vm-fio-domu) writes every 4 KiB
block of its span once, in random order, with a crc32c and a header in
each, reads back each 64 written blocks as it goes (verify_backlog) and
the rest at the end; a mismatch fails the run (verify_fatal). Its writes
are paced so that they go on through the switch: the new domain's
tapdisk must see writes, and the verify phase reads through it. After
the run the domU prints the sha256 of its whole disk, and dom0 checks
the VDI the VM ended on against it.
"""

import json
import os
import subprocess
import time

import pytest

from test_xen_vm import kernel_complaints, tap_list, wait_for, \
    xen_host  # noqa: F401
from conftest import dp, disks, new_uuid, plugin, sh, sr  # noqa: F401
from conftest import _shared_sr_ends_with_its_module  # noqa: F401
from datapath_util import dataset, dd_hash, states
from test_migrate_out import MIG_SIZE, ZfsNgDestination, datapath_states, \
    job_gone, released, send_start, wait_complete  # noqa: F401
from test_migrate_into import MIRROR_VM
import domufio

MiB = 1 << 20
SIZE = MIG_SIZE             # the VM's disk (ZfsNgDestination's leaf size)
SPAN = 8 * MiB              # what fio writes and verifies
MOVE_SPAN = 4 * MiB         # in the move, whose mirror alone takes 140 s
BS = 4096
MEMORY = 512                # MiB: fio and its libraries in the initramfs


def fio_job(span, rate):
    """Random 4 KiB writes over span, each block once, at most rate a
    second (reads unpaced), verified as described above."""
    return ["--rw=randwrite", "--bs=%d" % BS, "--size=%d" % span,
            "--ioengine=libaio", "--direct=1", "--iodepth=4",
            "--verify=crc32c", "--verify_backlog=64", "--do_verify=1",
            "--verify_fatal=1", "--rate_iops=,%d" % rate]


def tap_stats(vol, domid):
    """tapdisk's own counters (tap-ctl stats) of vol's tapdisk for
    domain domid: {"secs": [read, written], ...} in sectors."""
    (st,) = [s for s in datapath_states()
             if s["dataset"] == dataset(vol) and s["domain"] == str(domid)]
    out = subprocess.run(["tap-ctl", "stats", "-p", str(st["pid"]), "-m",
                          str(st["minor"])], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout.decode())


def written(vol, domid):
    return tap_stats(vol, domid)["secs"][1] * 512


def fio_vm(xen_host, plugin, dp, sr, name, tmp_path):
    """A VM of domufio's kind with its console driver."""
    vm = domufio.fio_vm_class(MEMORY)(xen_host, plugin, dp, sr, name,
                                      tmp_path)
    return vm, domufio.Console(vm)


def boot(vm, console):
    files, _ = domufio.fio_files()
    vm.start({}, files)
    console.wait_line(lambda l: l.startswith("ready 1"), 600)
    console.open()


def checked(report, span):
    """fio's job, asserted whole: every block of span written once and
    read back once by the verification, no error."""
    (job,) = report["jobs"]
    assert job["error"] == 0, job
    assert job["write"]["io_bytes"] == span, job["write"]
    assert job["read"]["io_bytes"] == span, job["read"]
    return job


def halt(vm, console):
    console.command(["end"])
    vm.halted_by_guest()
    vm.epoch_end()


def test_a_vm_suspended_and_resumed_mid_fio_verifies_every_block(
        xen_host, plugin, dp, sr, tmp_path):
    """``xe vm-suspend`` then ``xe vm-resume`` (xenops.Vm.suspend and
    resume) while fio writes: the VBD deactivated and detached with the
    domain saved, attached and activated for the new domain before it
    runs, no open nor close; fio goes on in the new domain, writing and
    verifying through its tapdisk, and every block verifies. dom0 reads
    the zvol the domU hashed."""
    t0 = time.monotonic()
    vol = plugin("Volume.create", sr=sr, name="suspended", description="",
                 size=SIZE, sharable=False)
    vm, console = fio_vm(xen_host, plugin, dp, sr, "zfsng-suspend",
                         tmp_path)
    vm.add_disk(vol)
    boot(vm, console)
    console.command(["fio", "suspended", "xvda"] + fio_job(SPAN, 40))
    wait_for("fio's first MiB", lambda: written(vol, vm.domid) >= MiB,
             600, step=1)
    first = vm.domid
    before = written(vol, first)
    print("xen-migrate: fio wrote %d KiB, suspending +%.1fs" % (
        before // 1024, time.monotonic() - t0), flush=True)
    image, save_s, suspend_s = vm.suspend()
    assert not [l for l in vm.lines() if l.startswith("result ")]
    assert tap_list() == [] and states() == []
    resume_s = vm.resume(image)
    os.unlink(image)
    assert vm.domid != first
    console.open()
    job = checked(console.result("suspended"), SPAN)
    after = tap_stats(vol, vm.domid)["secs"]
    print("xen-migrate: suspend %.1fs (save %.1fs), resume %.1fs; the new "
          "domain's tapdisk: %d KiB written, %d KiB read; fio: %s +%.1fs"
          % (suspend_s, save_s, resume_s, after[1] // 2, after[0] // 2,
             job["write"]["runtime"], time.monotonic() - t0), flush=True)
    assert after[1] > 0, "fio wrote nothing after the resume"
    assert after[0] > 0, "fio verified nothing after the resume"
    seen = console.sha("xvda", SIZE)
    halt(vm, console)
    assert [m for m, _, _ in vm.calls] == [
        "Datapath.open", "Datapath.attach", "Datapath.activate",
        "Datapath.deactivate", "Datapath.detach",
        "Datapath.attach", "Datapath.activate",
        "Datapath.deactivate", "Datapath.detach", "Datapath.close"]
    assert dd_hash("/dev/zvol/" + dataset(vol), SIZE, 0) == seen
    assert tap_list() == [] and states() == []
    assert kernel_complaints() == []
    print("xen-migrate: suspend and resume done +%.1fs"
          % (time.monotonic() - t0), flush=True)


@pytest.fixture
def dest_sr(plugin, disks, new_uuid):
    """A second zfs-ng SR, on the second disk."""
    stored = plugin("SR.create", uuid=new_uuid(), name="destsr",
                    description="", configuration={"device": disks[1]})
    yield plugin("SR.attach", configuration=stored)
    sh("zpool", "destroy", "-f", "destsr", check=False)


def test_a_vm_running_fio_moves_live_to_another_zfs_ng_sr(
        xen_host, plugin, dp, sr, dest_sr, tmp_path, released):
    """``xe vm-migrate ... vdi:<vdi>=<other sr> live=true`` within the
    host while fio writes and verifies in the VM: receive_start3 on the
    destination SR, send_start on the source (the dom0 attach, xapi's
    proxy, Data.mirror for the VM's domain), Data.stat until complete,
    the dom0 attach destroyed (xapi_vm_migrate.ml:1575-1586), one more
    Data.stat, then xenopsd's VM_migrate (xenops.Vm.migrate): the VM
    saved, restored into a new domain on the destination VDI, its
    source VBD deactivated (then receive_finalize3) and detached; then
    the source VDI destroyed (xapi_vm_migrate.ml:1097-1110). fio's
    writes go on through the switch, every block verifies, and dom0
    finds on the destination what the domU hashed, the part fio never
    touched being what dom0 wrote before the VM started."""
    t0 = time.monotonic()
    src = plugin("Volume.create", sr=sr, name="moving", description="",
                 size=SIZE, sharable=False)
    rest = os.urandom(SIZE - MOVE_SPAN)      # a used disk beyond fio's span
    with open("/dev/zvol/" + dataset(src), "r+b") as f:
        f.seek(MOVE_SPAN)
        f.write(rest)
    vm, console = fio_vm(xen_host, plugin, dp, sr, "zfsng-move", tmp_path)
    (disk,) = [vm.add_disk(src)]
    boot(vm, console)
    console.command(["fio", "moving", "xvda"] + fio_job(MOVE_SPAN, 4))
    wait_for("fio's first 256 KiB", lambda: written(src, vm.domid) >=
             256 * 1024, 600, step=1)
    first = vm.domid
    print("xen-migrate: fio runs in domain %d +%.1fs" % (
        first, time.monotonic() - t0), flush=True)

    # the mirror, as xapi runs it for the VM's VBD
    dest = ZfsNgDestination(dp, plugin, dest_sr)        # receive_start3

    def source(method, **args):
        return vm.call(disk, method, **args)
    mirror_dp = "mirror_vbd/%d/xvda" % first
    dom0, proxy, op = send_start(source, dest, domain=str(first),
                                 dp=mirror_dp)
    seen = wait_complete(dp, op[1])
    source("Datapath.detach", domain=dom0)      # DP.destroy of mirror_...
    assert not dp("Data.stat", operation=["MirrorV1", op[1]])["failed"]
    before = written(src, first)
    print("xen-migrate: mirror complete after %d stats, fio wrote %d KiB "
          "on the source +%.1fs" % (len(seen), before // 1024,
                                    time.monotonic() - t0), flush=True)
    assert before < MOVE_SPAN * 9 // 10, "fio had nearly done writing " \
        "before the move (%d of %d bytes): slow it down" % (before,
                                                             MOVE_SPAN)
    assert not [l for l in vm.lines() if l.startswith("result ")]

    def finalized(old):
        """receive_finalize3 (storage_smapiv3_migrate.ml:281-295), from
        the source's post_deactivate_hook: the leaf's datapath for the
        mirror's pseudo-domain destroyed."""
        dest.xapi("Datapath.deactivate", domain=MIRROR_VM)
        dest.xapi("Datapath.detach", domain=MIRROR_VM)

    steps = vm.migrate({disk: (dest.leaf, dest_sr)}, deactivated=finalized)
    assert vm.domid != first
    console.open()
    proxy.join(60)
    done = dp("Data.stat", operation=["MirrorV1", op[1]])
    assert done == {"failed": False, "complete": True, "progress": 1.0}
    assert job_gone(op[1])["phase"] == "done"
    plugin("Volume.destroy", sr=sr, key=src["key"])     # post_mirror
    assert src["key"] not in [v["key"] for v in plugin("SR.ls", sr=sr)]
    print("xen-migrate: moved to domain %d: %s +%.1fs" % (
        vm.domid, ", ".join("%s %.1fs" % kv for kv in sorted(steps.items())),
        time.monotonic() - t0), flush=True)

    job = checked(console.result("moving"), MOVE_SPAN)
    after = tap_stats(dest.leaf, vm.domid)["secs"]
    print("xen-migrate: the destination's tapdisk for domain %d: %d KiB "
          "written, %d KiB read; fio's write phase %d ms +%.1fs" % (
              vm.domid, after[1] // 2, after[0] // 2,
              job["write"]["runtime"], time.monotonic() - t0), flush=True)
    assert after[1] > 0, "fio wrote nothing after the move"
    assert after[0] > 0, "fio verified nothing after the move"
    hashed = console.sha("xvda", SIZE)
    halt(vm, console)
    methods = [(m, b) for m, _, b in vm.calls]
    assert [m for m, _ in methods] == [
        "Datapath.open", "Datapath.attach", "Datapath.activate",
        "Datapath.attach", "Data.mirror", "Datapath.detach",
        "Datapath.attach", "Datapath.activate",
        "Datapath.deactivate", "Datapath.detach",
        "Datapath.deactivate", "Datapath.detach", "Datapath.close"]
    leaf = "/dev/zvol/" + dataset(dest.leaf)
    assert dd_hash(leaf, SIZE, 0) == hashed
    with open(leaf, "rb") as f:
        f.seek(MOVE_SPAN)
        assert f.read(SIZE - MOVE_SPAN) == rest
    assert tap_list() == [] and states() == []
    assert kernel_complaints() == []
    print("xen-migrate: the move done +%.1fs" % (time.monotonic() - t0),
          flush=True)
