"""The guest's flush through a power cut of the whole machine, with a real
Xen PV VM on a zfs-ng disk: the test guest's part (dom0), in two boots of
the same machine. tests/xen/powercut.py, on the host, runs them and cuts
the power between them; run alone, each phase fails.

``phase1`` (run.sh --xen --state S --cut-on power-cut-now): an SR with
zfs-ng's defaults (``sync=always``), a VDI attached the XCP-ng way for a
PV domU (the datapath calls, the vbd3 nodes, tapback and tapdisk: see
test_xen_vm.py), and a domU (tests/xen/powercut-domu) that writes through
blkfront (a) MiB after MiB with O_DIRECT and fsync, acknowledging each,
(b) one MiB with O_DIRECT and no fsync, (c) one MiB through its page cache
and no fsync, then says it is ready. dom0 writes what the domU
acknowledged and what the second boot needs to /results/powercut/
phase1.json, then makes /results/power-cut-now: run.sh kills QEMU with
SIGKILL. Nothing shuts down: no unplug, no export, no sync.

The cut lands before any transaction group has written the domU's data:
zfs_txg_timeout is raised for the phase (the transaction groups' own
timer, 5 s by default, would otherwise race the cut) after the zvol's log
has its first block (its creation waits for a transaction group) and a
``zpool sync``; the last committed transaction group is read from the
pool's txgs kstat then and when the domU is ready, and must not have
moved. What survives then survives through the ZFS intent log alone. A
control shows that the cut loses what was not in the log: a second VDI
set to ``sync=standard`` gets a dom0 write with O_DIRECT and no flush
(the device held open meanwhile: a zvol's last close commits its log and
waits for its transaction group).

``phase2`` (the same --state: the same disks and root file system, the
host booting again): SR.attach with the configuration SR.create returned
(what xapi keeps in the PBD), whose import replays the log; every MiB the
domU acknowledged after its fsync must read back as written (sha256),
the control must be gone, and what (b) and (c) left is reported as found,
not asserted: /results/powercut/phase2.json.
"""

import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..",
                                "integration"))

from conftest import disks, new_uuid, plugin, sh, dp  # noqa: E402,F401
from datapath_util import MiB, dataset, dd_hash, dd_write, new_vdi, \
    uri  # noqa: E402
from xapi_flows import domain_of  # noqa: E402
from test_xen_vm import DOMU_INITRD, Vbd3, console, cpio_newc, \
    kernel_complaints, seeded, sha, wait_for, xen_host, xl  # noqa: E402,F401

RESULTS = "/results/powercut"
PHASE1 = os.path.join(RESULTS, "phase1.json")
PHASE2 = os.path.join(RESULTS, "phase2.json")
CUT = "/results/power-cut-now"      # run.sh --cut-on's file
DOMU_INIT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         "powercut-domu")
POOL = "cutxen"
# The domU's disk, in MiB: (a) SYNCED MiB from 0, (b) at DIRECT, (c) at
# BUFFERED; dom0's own fsynced write at BEFORE (it makes the zvol's log).
SYNCED, DIRECT, BUFFERED, BEFORE = 6, 8, 10, 12
SEEDS = {"synced": 4101, "direct": 4102, "buffered": 4103, "before": 4104,
         "control": 4105}
TXG_TIMEOUT = "/sys/module/zfs/parameters/zfs_txg_timeout"
CUT_WAIT = 120      # s: the host cuts within a second of CUT


def data(name, size=MiB):
    return seeded(SEEDS[name], size)


def last_committed_txg(pool):
    """The highest transaction group the pool's txgs kstat marks
    committed (state C)."""
    with open("/proc/spl/kstat/zfs/%s/txgs" % pool) as f:
        rows = [line.split() for line in f]
    done = [int(r[0]) for r in rows if len(r) > 2 and r[0].isdigit() and
            r[2] == "C"]
    assert done, "no committed txg in the %s txgs kstat" % pool
    return max(done)


def domu_lines(name):
    return re.findall(r"ZFSNG-DOMU (.*?)\r?$", console(name), re.M)


def plug_domu(store, plugin, dp, sr, vol, name, initrd):
    """A paused PV domU whose xvda is vol, attached as xapi and xenopsd
    do (test_xen_vm.py cites each step): (domid, the Vbd3, the zvol)."""
    cfg = os.path.join(os.path.dirname(initrd), "domu.cfg")
    with open(cfg, "w") as f:
        f.write("\n".join([
            'name = "%s"' % name, 'type = "pv"',
            'kernel = "/boot/vmlinuz-%s"' % os.uname().release,
            'ramdisk = "%s"' % initrd,
            'extra = "console=hvc0 loglevel=4 rdinit=/powercut-init"',
            "memory = 256", "vcpus = 1", 'on_crash = "preserve"', ""]))
    xl("create", "-p", cfg, timeout=300)
    domid = int(xl("domid", name).strip())
    vm_uuid = store.read(store.read("/local/domain/%d/vm" % domid) + "/uuid")
    domain = domain_of("vbd/%d/xvda" % domid, str(domid))

    def call(method, **args):
        fresh = plugin("Volume.stat", sr=sr, key=vol["key"])
        return dp(method, uri=uri(fresh), **args)

    call("Datapath.open", persistent=True)
    xendisk, block = call("Datapath.attach",
                          domain=domain)["implementations"][:2]
    assert xendisk[1]["backend_type"] == "vbd3"
    call("Datapath.activate", domain=domain)
    vbd = Vbd3(store, domid, vm_uuid)
    vdi_id = json.dumps(["VDI", "%s/%s" % (sr, vol["key"])])
    vbd.add(block[1]["path"],
            [("backend-kind", "vbd3")] + sorted(xendisk[1]["extra"].items()),
            dp_id="vbd/%d/xvda" % domid, vdi_id=vdi_id,
            vbd_id=json.dumps(["%s.vbd0" % vm_uuid, "xvda"]))
    store.xs.write("", vbd.back + "/vdi", vdi_id.encode())
    vbd.block_add()
    wait_for("backend InitWait", lambda: vbd.state("back") == "2", 60)
    return domid, vbd, "/dev/zvol/" + dataset(vol)


def test_phase1_the_domu_writes_and_the_power_is_cut(
        xen_host, plugin, dp, disks, new_uuid, tmp_path):
    assert not os.path.exists(PHASE1), "phase1 ran already on this results dir"
    t0 = time.monotonic()

    def mark(what):
        print("xen-powercut: %-40s +%.1fs" % (what, time.monotonic() - t0),
              flush=True)

    store = xen_host
    stored = plugin("SR.create", uuid=new_uuid(), name=POOL, description="",
                    configuration={"device": disks[0]})
    sr = plugin("SR.attach", configuration=stored)
    assert sh("zfs", "get", "-H", "-o", "value", "sync", sr).strip() == \
        "always", "the SR's default is not sync=always"
    vol, control = new_vdi(plugin, sr), new_vdi(plugin, sr)
    sh("zfs", "set", "sync=standard", dataset(control))  # an admin's choice
    mark("SR and VDIs made")

    with open(DOMU_INITRD, "rb") as f:
        base = f.read()
    layout = "SYNCED_AT=0 DIRECT_AT=%d BUFFERED_AT=%d\n" % (DIRECT, BUFFERED)
    initrd = str(tmp_path / "domu-initrd")
    with open(initrd, "wb") as f:
        with open(DOMU_INIT, "rb") as init:
            f.write(base + b"\0" * (-len(base) % 4) + cpio_newc(
                {"powercut-init": init.read(), "layout": layout.encode(),
                 "synced.bin": data("synced", SYNCED * MiB),
                 "direct.bin": data("direct"),
                 "buffered.bin": data("buffered")},
                executable=("powercut-init",)))
    name = "zfsng-cut"
    domid, vbd, zvol = plug_domu(store, plugin, dp, sr, vol, name, initrd)
    mark("domU %d built, its disk plugged" % domid)

    # The zvol's log gets its first block while tapdisk holds the zvol
    # (zil_create waits for a transaction group); then no transaction
    # group may commit until the cut.
    assert dd_write(zvol, data("before"), offset=BEFORE * MiB) == (0, "")
    with open(TXG_TIMEOUT, "w") as f:
        f.write("3600")
    sh("zpool", "sync", POOL)
    txg_before = last_committed_txg(POOL)
    control_zvol = "/dev/zvol/" + dataset(control)
    held = os.open(control_zvol, os.O_RDONLY)      # until the cut
    assert sh("dd", "of=" + control_zvol, "bs=1M", "iflag=fullblock",
              "oflag=direct",
              "conv=notrunc", "status=none", input=data("control")) == ""
    mark("dom0's writes made, txg %d committed" % txg_before)

    xl("unpause", str(domid))
    wait_for("blkfront connected", lambda: vbd.state("back") == "4" and
             vbd.state("front") == "4", 600, step=1)
    wait_for("the domU ready", lambda: any(
        line.startswith(("ready", "ERROR")) for line in domu_lines(name)),
        900, step=0.5)
    lines = domu_lines(name)
    txg_ready = last_committed_txg(POOL)
    print("\n".join(lines), flush=True)
    assert not [line for line in lines if line.startswith("ERROR")]
    acked = sorted(int(line.split()[1]) for line in lines
                   if re.match(r"synced \d+$", line))
    assert acked == list(range(SYNCED))
    assert "direct written" in lines and "buffered written" in lines
    state = {
        "stored": stored, "sr": sr, "vol": vol["key"], "control":
        control["key"], "zvol": zvol, "control_zvol": control_zvol,
        "acked_synced_mib": acked,
        "expected": {"synced": [sha(data("synced", SYNCED * MiB)
                                    [i * MiB:(i + 1) * MiB])
                                for i in range(SYNCED)],
                     "direct": sha(data("direct")),
                     "buffered": sha(data("buffered")),
                     "before": sha(data("before")),
                     "control": sha(data("control"))},
        "txg_committed": {"before_writes": txg_before, "at_cut": txg_ready},
        "backend_feature_barrier": store.read(vbd.back + "/feature-barrier"),
        "domu": lines,
        "dom0_kernel_complaints": kernel_complaints(),
    }
    os.makedirs(RESULTS, exist_ok=True)
    with open(PHASE1, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    # The premise: no transaction group wrote the writes before the cut.
    assert txg_ready == txg_before, \
        "a transaction group committed before the cut: the test cannot " \
        "tell the intent log from it"
    mark("domU ready; asking the host to cut the power")
    open(CUT, "w").close()
    time.sleep(CUT_WAIT)
    os.close(held)
    raise AssertionError("the host did not cut the power within %ds of %s"
                         % (CUT_WAIT, CUT))


def found(path, offset, expected_sha, size=MiB):
    """What a region holds after the cut: kept, lost (zeros) or other."""
    got = dd_hash(path, size, offset)
    if got == expected_sha:
        return "kept"
    return "lost" if got == sha(bytes(size)) else "other (%s)" % got


def test_phase2_the_host_boots_again_and_the_fsynced_writes_are_there(
        xen_host, plugin):
    with open(PHASE1) as f:
        before = json.load(f)
    assert sh("zpool", "list", "-H", "-o", "name").split() == [], \
        "a pool is imported before the SR's attach"
    t0 = time.monotonic()
    sr = plugin("SR.attach", configuration=before["stored"])
    assert sr == before["sr"]
    sh("udevadm", "settle")
    zvol, control = before["zvol"], before["control_zvol"]
    wait_for("the zvols", lambda: os.path.exists(zvol) and
             os.path.exists(control), 120)
    attach_s = time.monotonic() - t0
    want = before["expected"]
    result = {
        "attach_seconds": round(attach_s, 1),
        "synced": [found(zvol, i * MiB, want["synced"][i])
                   for i in before["acked_synced_mib"]],
        "direct_no_fsync": found(zvol, DIRECT * MiB, want["direct"]),
        "buffered_no_fsync": found(zvol, BUFFERED * MiB, want["buffered"]),
        "dom0_fsynced_before": found(zvol, BEFORE * MiB, want["before"]),
        "control_sync_standard": found(control, 0, want["control"]),
        "health": sh("zpool", "list", "-H", "-o", "health", POOL).strip(),
    }
    with open(PHASE2, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print("xen-powercut: after the cut: %s" % json.dumps(result,
                                                         sort_keys=True),
          flush=True)
    assert result["health"] == "ONLINE"
    assert result["synced"] == ["kept"] * len(before["acked_synced_mib"]), \
        "a write the domU fsynced and saw acknowledged was lost"
    assert result["dom0_fsynced_before"] == "kept"
    assert result["control_sync_standard"] == "lost", \
        "sync=standard kept an unflushed write through the cut: the cut " \
        "did not cut, and the test proves nothing"
    assert kernel_complaints() == []
    plugin("SR.detach", sr=sr)
