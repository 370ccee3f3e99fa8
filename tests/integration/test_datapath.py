"""The datapath plugin on real OpenZFS, through the installed executables:
every dom0 path (the BlockDevice a dom0 attach hands out is the zvol
itself), snapshot VDIs through their read-only clone, reset-on-boot
(open/close) on real zvols, and the proof that the device node is the zvol
(udev, zvol_id). Data is written and read back with O_DIRECT, as tapdisk
does, and compared by sha256.

A guest's disk, through the real tapdisk: test_tapdisk.py. What both
share is in datapath_util.py.
"""

import json
import os
import shutil
import time

import pytest

from conftest import DATAPATH_PLUGIN, ROOT, PluginError, \
    played, sh
from datapath_util import DOM0, DOM0_VBD, MiB, SIZE, attach_dom0, \
    dataset, dd_hash, dd_write, detach_dom0, new_vdi, once, pattern, sha, \
    states, twice, uri, zfs_names
from plugin_client import Plugin


@pytest.fixture
def vdi(plugin, sr):
    return new_vdi(plugin, sr)


# --- dom0 --------------------------------------------------------------------

def test_dom0_gets_the_zvol_and_reads_back_what_it_wrote(dp, plugin, sr,
                                                         vdi):
    path = attach_dom0(dp, vdi)
    assert path == "/dev/zvol/" + dataset(vdi)
    real = os.path.realpath(path)
    assert real.startswith("/dev/zd"), real
    data = pattern(1)
    rc, err = dd_write(path, data)
    assert rc == 0, err
    assert dd_hash(path) == sha(data)
    detach_dom0(dp, vdi)
    assert states() == []
    # the data is on the zvol, not in a cache of the datapath
    path = attach_dom0(dp, vdi)
    assert dd_hash(path) == sha(data)
    detach_dom0(dp, vdi)


@pytest.mark.parametrize("domain", [DOM0_VBD, "0"])
def test_every_dom0_domain_gets_the_zvol_without_tapdisk(dp, vdi, domain):
    """The other forms of dom0 xapi sends (DOM0 is tested above): the zvol
    itself, no XenDisk, whether or not this host has tap-ctl."""
    assert domain in ("u0_vbd_0_xvda", "0")
    path = attach_dom0(dp, vdi, domain=domain)
    assert path == "/dev/zvol/" + dataset(vdi)
    data = pattern(7)
    assert dd_write(path, data)[0] == 0
    assert dd_hash(path) == sha(data)
    detach_dom0(dp, vdi, domain=domain)
    assert states() == []


def test_fio_through_the_block_device(dp, vdi):
    if not shutil.which("fio"):
        pytest.skip("fio not installed")
    path = attach_dom0(dp, vdi)
    out = sh("fio", "--name=verify", "--filename=" + path, "--direct=1",
             "--ioengine=libaio", "--iodepth=16", "--rw=randwrite",
             "--bs=4k", "--size=8M", "--verify=crc32c", "--do_verify=1",
             "--output-format=terse")
    assert out.strip(), out
    detach_dom0(dp, vdi)


def test_the_device_is_proved_to_be_the_zvol(dp, vdi):
    path = attach_dom0(dp, vdi)
    helper = [p for p in ("/usr/lib/udev/zvol_id", "/lib/udev/zvol_id")
              if os.path.exists(p)]
    assert helper, "zvol_id, the udev helper the datapath checks with"
    assert sh(helper[0], os.path.realpath(path)).strip() == dataset(vdi)
    detach_dom0(dp, vdi)


# --- snapshot VDIs -----------------------------------------------------------

def test_snapshot_vdi_attaches_read_only_with_its_point_in_time_data(
        dp, plugin, sr, vdi):
    path = attach_dom0(dp, vdi)
    first, second = pattern(2), pattern(3)
    assert dd_write(path, first)[0] == 0
    snap = plugin("Volume.snapshot", sr=sr, key=vdi["key"])
    assert dd_write(path, second)[0] == 0
    detach_dom0(dp, vdi)

    spath = attach_dom0(dp, snap, readonly=True)
    clone = "%s/%s.ro" % (sr, snap["key"])
    assert spath == "/dev/zvol/" + clone
    assert sh("zfs", "get", "-H", "-o", "value", "readonly",
              clone).strip() == "on"
    assert sh("zfs", "get", "-H", "-o", "value", "origin",
              clone).strip() == dataset(snap)
    assert dd_hash(spath) == sha(first)
    rc, err = dd_write(spath, pattern(4))
    assert rc != 0, "a snapshot VDI must not be writable"
    assert dd_hash(spath) == sha(first)
    # the volume plugin does not list the clone
    listed = set(v["key"] for v in plugin("SR.ls", sr=sr))
    assert listed == {vdi["key"], snap["key"]}
    detach_dom0(dp, snap)
    assert clone not in zfs_names(sr)
    assert states() == []

    path = attach_dom0(dp, vdi)
    assert dd_hash(path) == sha(second)
    detach_dom0(dp, vdi)


def test_destroying_an_attached_snapshot_vdi_waits_for_detach(dp, plugin,
                                                              sr, vdi):
    snap = plugin("Volume.snapshot", sr=sr, key=vdi["key"])
    attach_dom0(dp, snap, readonly=True)
    plugin("Volume.destroy", sr=sr, key=snap["key"])
    assert [v["key"] for v in plugin("SR.ls", sr=sr)] == [vdi["key"]]
    assert dataset(snap) in zfs_names(sr)          # deferred by ZFS
    detach_dom0(dp, snap)
    assert dataset(snap) not in zfs_names(sr)      # freed with the clone
    assert zfs_names(sr) == [sr, dataset(vdi)]


# --- reset on boot -----------------------------------------------------------

def test_nonpersistent_close_restores_the_content_exactly(dp, plugin, sr,
                                                         vdi):
    path = attach_dom0(dp, vdi)
    before = pattern(5)
    assert dd_write(path, before)[0] == 0
    whole = dd_hash(path, SIZE)
    detach_dom0(dp, vdi)

    twice(dp, "Datapath.open", uri=uri(vdi), persistent=False)
    reset = dataset(vdi) + "@zfsng-nonpersistent"
    assert reset in zfs_names(sr)
    assert [v["key"] for v in plugin("SR.ls", sr=sr)] == [vdi["key"]]
    path = attach_dom0(dp, vdi)
    after = pattern(6)
    assert dd_write(path, after)[0] == 0
    assert dd_hash(path) == sha(after)
    detach_dom0(dp, vdi)
    twice(dp, "Datapath.close", uri=uri(vdi))
    assert reset not in zfs_names(sr)

    path = attach_dom0(dp, vdi)
    assert dd_hash(path, SIZE) == whole
    detach_dom0(dp, vdi)


def test_persistent_open_changes_nothing(dp, plugin, sr, vdi):
    names = zfs_names(sr)
    twice(dp, "Datapath.open", uri=uri(vdi), persistent=True)
    twice(dp, "Datapath.close", uri=uri(vdi))
    assert zfs_names(sr) == names


def stat(plugin, sr, vol):
    return plugin("Volume.stat", sr=sr, key=vol["key"])


def sr_used(sr):
    return int(sh("zfs", "get", "-Hp", "-o", "value", "used", sr))


def settled_used(sr, want, slack=MiB):
    """The SR's used space, once ZFS has freed what it frees in the
    background (bounded wait): within slack of want, if it gets there."""
    used = sr_used(sr)
    for _ in range(30):
        if abs(used - want) <= slack:
            break
        sh("zpool", "sync", sr.split("/")[0])
        time.sleep(1)
        used = sr_used(sr)
    return used


@pytest.mark.parametrize("provisioning", ["thin", "thick"])
def test_a_backup_and_a_copy_never_block_the_reset(dp, plugin, disks,
                                                   new_uuid, provisioning):
    """A non-persistent run during which a backup snapshots the disk (and
    reads the snapshot across the VM's shutdown) and a VM copy clones it
    live: the disk resets at close, the snapshot and the clone keep their
    data, the VM starts again, and once the snapshot and clone are gone
    nothing is left and the space comes back."""
    stored = plugin("SR.create", uuid=new_uuid(), name="dpsr",
                    description="", configuration={
                        "device": disks[0], "provisioning": provisioning})
    sr = plugin("SR.attach", configuration=stored)
    vdi = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=SIZE, sharable=False)
    plugin("Volume.set", sr=sr, key=vdi["key"], k="vdi-type", v="user")
    path = attach_dom0(dp, vdi, call=once)
    base, run, copied = pattern(10), pattern(11), pattern(12)
    assert dd_write(path, base)[0] == 0
    detach_dom0(dp, vdi, call=once)
    used_before = settled_used(sr, sr_used(sr))
    refreservation = sh("zfs", "get", "-Hp", "-o", "value",
                        "refreservation", dataset(vdi)).strip()

    dp("Datapath.open", uri=uri(vdi), persistent=False)
    path = attach_dom0(dp, vdi, domain=DOM0_VBD, call=once)  # the VM
    assert dd_write(path, run)[0] == 0
    snap = plugin("Volume.snapshot", sr=sr, key=vdi["key"])     # backup
    assert dd_write(path, copied)[0] == 0
    clone = plugin("Volume.clone", sr=sr, key=vdi["key"])       # VM copy
    assert dd_write(path, pattern(13))[0] == 0
    detach_dom0(dp, vdi, domain=DOM0_VBD, call=once)
    spath = attach_dom0(dp, snap, readonly=True, call=once)  # backup reads
    ran = stat(plugin, sr, vdi)["keys"]["content_id"]

    twice(dp, "Datapath.close", uri=uri(vdi))       # VM shutdown: reset
    listed = dict((v["key"], v) for v in plugin("SR.ls", sr=sr))
    assert sorted(listed) == sorted([vdi["key"], snap["key"], clone["key"]])
    assert listed[vdi["key"]]["uri"] == vdi["uri"]
    ids = dict((k, v["keys"].pop("content_id")) for k, v in listed.items())
    assert listed[vdi["key"]]["keys"] == {"vdi-type": "user"}
    # content_ids (xapi's copies pick a base by them): the reset disk's
    # is new, not the one it had while its run wrote to it nor its
    # snapshot's or clone's; the snapshot's its own
    mine, snapped, cloned = (ids[v["key"]] for v in (vdi, snap, clone))
    assert mine not in ("", ran, snapped, cloned), (ids, ran)
    assert snapped not in ("", cloned), ids
    moved = listed[snap["key"]]
    assert moved["uri"] != snap["uri"]
    assert dd_hash(spath) == sha(run)        # the backup read on, unharmed
    detach_dom0(dp, moved, call=once)        # by its new URI, as xapi does
    assert states() == []
    assert sh("zfs", "get", "-Hp", "-o", "value", "refreservation",
              dataset(vdi)).strip() == refreservation
    for vol, data in ((vdi, base), (moved, run), (clone, copied)):
        path = attach_dom0(dp, vol, readonly=vol is moved, call=once)
        assert dd_hash(path) == sha(data), vol["key"]
        detach_dom0(dp, vol, call=once)

    dp("Datapath.open", uri=uri(vdi), persistent=False)     # starts again
    path = attach_dom0(dp, vdi, domain=DOM0_VBD, call=once)
    assert dd_write(path, pattern(14))[0] == 0
    assert dd_hash(path) == sha(pattern(14))
    detach_dom0(dp, vdi, domain=DOM0_VBD, call=once)
    dp("Datapath.close", uri=uri(vdi))
    path = attach_dom0(dp, vdi, call=once)
    assert dd_hash(path) == sha(base)
    detach_dom0(dp, vdi, call=once)

    plugin("Volume.destroy", sr=sr, key=snap["key"])
    plugin("Volume.destroy", sr=sr, key=clone["key"])
    assert zfs_names(sr) == [sr, dataset(vdi)]
    assert [v["key"] for v in plugin("SR.ls", sr=sr)] == [vdi["key"]]
    used = settled_used(sr, used_before)
    assert abs(used - used_before) <= MiB, (used, used_before)


def _reset_scenario(dp, plugin, sr):
    """A VDI at the close of a non-persistent run with a backup snapshot;
    returns it, the snapshot and what the disk held before the run."""
    vdi = plugin("Volume.create", sr=sr, name="crash", description="",
                 size=SIZE, sharable=False)
    plugin("Volume.set", sr=sr, key=vdi["key"], k="keep", v="me")
    path = attach_dom0(dp, vdi, call=once)
    base = pattern(20)
    assert dd_write(path, base)[0] == 0
    dp("Datapath.open", uri=uri(vdi), persistent=False)
    assert dd_write(path, pattern(21))[0] == 0
    snap = plugin("Volume.snapshot", sr=sr, key=vdi["key"])
    detach_dom0(dp, vdi, call=once)
    return vdi, snap, base


def test_a_reset_killed_at_each_step_is_finished_by_the_next_call(
        dp, plugin, sr):
    """close killed (ZFSNG_CRASH_AFTER) right after each command of the
    rotation that changes ZFS (datapath/zfsng_datapath/reset.py; this run's
    share of them, conftest.plays): xapi
    still sees the disk under its URI, the next start finishes the reset,
    and nothing is left once the VDIs are destroyed."""
    trace = "/tmp/zfsng-reset-trace"
    if os.path.exists(trace):
        os.unlink(trace)
    vdi, snap, base = _reset_scenario(dp, plugin, sr)
    Plugin(ROOT, plugin_dir=DATAPATH_PLUGIN, env=dict(
        dp.env, ZFSNG_TRACE=trace))("Datapath.close", uri=uri(vdi))
    with open(trace) as f:
        argvs = [json.loads(line)["argv"] for line in f]
    steps = [n for n, argv in enumerate(argvs, 1) if argv[1] in (
        "rename", "clone", "set", "promote", "destroy")]
    assert [argvs[n - 1][1] for n in steps] == [
        "rename", "clone", "set", "promote", "rename", "destroy"]
    for n in played(steps):
        vdi, snap, base = _reset_scenario(dp, plugin, sr)
        crashing = Plugin(ROOT, plugin_dir=DATAPATH_PLUGIN, env=dict(
            dp.env, ZFSNG_CRASH_AFTER=str(n)))
        rc, out, _ = crashing.raw("Datapath.close",
                                  {"dbg": "crash", "uri": uri(vdi)})
        assert rc == 137, (n, rc, out)
        listed = dict((v["key"], v) for v in plugin("SR.ls", sr=sr))
        assert listed[vdi["key"]]["uri"] == vdi["uri"], n
        keys = listed[vdi["key"]]["keys"]
        was = keys.pop("content_id")    # the run's, or the reset disk's
        assert keys == {"keep": "me"}, n
        assert snap["key"] in listed, n
        assert was not in ("", snap["keys"]["content_id"]), n
        dp("Datapath.open", uri=uri(vdi), persistent=False)  # VM start
        path = attach_dom0(dp, vdi, call=once)
        assert dd_hash(path) == sha(base), n
        detach_dom0(dp, vdi, call=once)
        dp("Datapath.close", uri=uri(vdi))
        keys = plugin("Volume.stat", sr=sr, key=vdi["key"])["keys"]
        assert keys.pop("content_id") not in (
            "", was, snap["keys"]["content_id"]), n    # reset: a new one
        assert keys == {"keep": "me"}, n
        plugin("Volume.destroy", sr=sr, key=snap["key"])
    for vol in plugin("SR.ls", sr=sr):
        plugin("Volume.destroy", sr=sr, key=vol["key"])
    assert zfs_names(sr) == [sr]


def test_a_persistent_open_keeps_what_a_pending_reset_point_holds(
        dp, plugin, sr, vdi):
    """The host crashed during a non-persistent run (no close), then the
    disk was made persistent: open(persistent) keeps the data."""
    twice(dp, "Datapath.open", uri=uri(vdi), persistent=False)
    path = attach_dom0(dp, vdi)
    kept = pattern(15)
    assert dd_write(path, kept)[0] == 0
    detach_dom0(dp, vdi)
    twice(dp, "Datapath.open", uri=uri(vdi), persistent=True)
    assert zfs_names(sr) == [sr, dataset(vdi)]       # reset point dropped
    twice(dp, "Datapath.close", uri=uri(vdi))
    path = attach_dom0(dp, vdi)
    assert dd_hash(path) == sha(kept)
    detach_dom0(dp, vdi)


def test_a_zvol_that_is_no_vdi_is_never_touched(dp, plugin, sr, vdi,
                                                new_uuid):
    other = "%s/%s" % (sr, new_uuid())
    sh("zfs", "create", "-s", "-V", "16M", other)       # an admin's zvol
    admins = "%s@%s" % (dataset(vdi), new_uuid())       # and snapshot
    sh("zfs", "snapshot", admins)
    admins = "zfs-ng:///" + admins
    names = zfs_names(sr)
    for u in ("zfs-ng:///" + other, admins):   # (no tap-ctl: dom0 only)
        with pytest.raises(PluginError) as err:
            dp("Datapath.attach", uri=u, domain=DOM0)
        assert err.value.name == "NotAVdi", err.value.params
    for persistent in (False, True):
        with pytest.raises(PluginError) as err:
            dp("Datapath.open", uri="zfs-ng:///" + other,
               persistent=persistent)
        assert err.value.name == "NotAVdi"
    with pytest.raises(PluginError) as err:
        dp("Datapath.close", uri="zfs-ng:///" + other)
    assert err.value.name == "NotAVdi"
    assert zfs_names(sr) == names
    assert states() == []
