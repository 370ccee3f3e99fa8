"""VDI semantics on real OpenZFS: data, dependents, keys, resize, crashes.

Data is written to and read from the zvols' block devices, so a snapshot or
clone is checked for what it holds, not only for existing.
"""

import hashlib
import os
import random
import subprocess

import pytest

import xapi_flows as xapi
from conftest import (PluginError, default_volblocksize, one_disk_sr,
                      played, sh, traced_points)

MiB = 1 << 20


@pytest.fixture
def sr(plugin, disks, new_uuid):
    yield from one_disk_sr(plugin, disks, new_uuid, "vdis")


def device(sr, key):
    path = "/dev/zvol/%s/%s" % (sr, key)
    sh("udevadm", "settle")
    assert os.path.exists(path), path
    return path


def write_pattern(path, seed, size=8 * MiB):
    """Write reproducible pseudo-random data; return its sha256."""
    rnd = random.Random(seed)
    data = bytes(rnd.getrandbits(8) for _ in range(4096)) * (size // 4096)
    with open(path, "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def read_hash(path, size=8 * MiB):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(size)).hexdigest()


def zfs_names(sr):
    return sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r",
              sr).split()


def test_point_in_time_data_of_snapshots_and_clones(plugin, sr):
    vdi = xapi.vdi_create(plugin, sr, "data", 32 * MiB)
    first = write_pattern(device(sr, vdi["key"]), 1)
    snap = xapi.vdi_snapshot(plugin, sr, vdi["key"], content_id="c1",
                             tags=["gold"])
    assert snap["read_write"] is False
    assert snap["keys"]["is_a_snapshot"] == "true"
    assert snap["keys"]["snapshot_of"] == vdi["key"]
    assert snap["keys"]["content_id"] == "c1"
    second = write_pattern(device(sr, vdi["key"]), 2)
    assert first != second

    of_snap = xapi.vdi_clone(plugin, sr, snap["key"])
    of_live = xapi.vdi_clone(plugin, sr, vdi["key"])
    assert read_hash(device(sr, of_snap["key"])) == first
    assert read_hash(device(sr, of_live["key"])) == second
    assert read_hash(device(sr, vdi["key"])) == second
    assert of_live["read_write"] and of_snap["read_write"]
    keys = plugin("Volume.stat", sr=sr, key=vdi["key"])["keys"]
    assert keys == {"vdi-type": "user", "tags-gold": "gold",
                    "content_id": vdi["keys"]["content_id"]}
    # a clone holds its source's data: it keeps its id (xapi's base)
    assert of_snap["keys"]["content_id"] == "c1"
    assert of_live["keys"]["content_id"] == vdi["keys"]["content_id"]
    # the internal snapshot of the live clone is not a VDI
    listed = set(v["key"] for v in plugin("SR.ls", sr=sr))
    assert listed == {vdi["key"], snap["key"], of_snap["key"],
                      of_live["key"]}


def test_vm_revert(plugin, sr):
    vdi = xapi.vdi_create(plugin, sr, "os", 16 * MiB)
    before = write_pattern(device(sr, vdi["key"]), 3)
    snap = xapi.vdi_snapshot(plugin, sr, vdi["key"])
    write_pattern(device(sr, vdi["key"]), 4)
    # revert: clone the snapshot, destroy the original VDI
    reverted = xapi.vdi_clone(plugin, sr, snap["key"])
    xapi.vdi_destroy(plugin, sr, vdi["key"])
    # later the snapshot is destroyed while the clone still depends on it
    xapi.vdi_destroy(plugin, sr, snap["key"])
    assert [v["key"] for v in plugin("SR.ls", sr=sr)] == [reverted["key"]]
    assert read_hash(device(sr, reverted["key"])) == before
    xapi.vdi_destroy(plugin, sr, reverted["key"])
    assert zfs_names(sr) == [sr]


def test_rolling_snapshots_with_clones(plugin, sr):
    vdi = xapi.vdi_create(plugin, sr, "rolling", 16 * MiB)
    snaps, hashes = [], {}
    for i in range(5):
        hashes[i] = write_pattern(device(sr, vdi["key"]), 10 + i)
        snaps.append(xapi.vdi_snapshot(plugin, sr, vdi["key"])["key"])
    clones = {1: xapi.vdi_clone(plugin, sr, snaps[1])["key"],
              3: xapi.vdi_clone(plugin, sr, snaps[3])["key"]}
    gone = random.Random(7).sample(range(5), 3)
    for i in gone:
        xapi.vdi_destroy(plugin, sr, snaps[i])
    for i, key in clones.items():
        assert read_hash(device(sr, key)) == hashes[i]
    # a snapshot made before content_ids were kept (none of its own)
    # inherits its zvol's user property: it must not report the disk's
    kept = [snaps[i] for i in range(5) if i not in gone]
    sh("zfs", "inherit", "org.xcp-ng.zfs-ng:content-id", "%s/%s@%s" % (
        sr, vdi["key"], kept[0]))
    vols = plugin("SR.ls", sr=sr)
    listed = set(v["key"] for v in vols)
    assert set(clones.values()) <= listed and vdi["key"] in listed
    # content_id (xapi's copies pick a base by it): never "" or a key,
    # the snapshots' their own, a clone's its snapshot's (same data)
    ids = dict((v["key"], v["keys"]["content_id"]) for v in vols)
    assert "" not in ids.values() and not set(ids.values()) & listed
    assert len(set(ids[k] for k in kept + [vdi["key"]])) == len(kept) + 1
    for i, key in clones.items():
        assert i in gone or ids[key] == ids[snaps[i]]
    for key in list(listed):
        xapi.vdi_destroy(plugin, sr, key)
    assert zfs_names(sr) == [sr]


def test_nothing_leaks(plugin, sr):
    sh("zpool", "sync", "vdis")
    baseline = int(sh("zpool", "list", "-Hp", "-o", "allocated", "vdis"))
    vdi = xapi.vdi_create(plugin, sr, "leak", 64 * MiB)
    write_pattern(device(sr, vdi["key"]), 5, size=32 * MiB)
    snap = xapi.vdi_snapshot(plugin, sr, vdi["key"])
    clone = xapi.vdi_clone(plugin, sr, snap["key"])
    live = xapi.vdi_clone(plugin, sr, vdi["key"])
    write_pattern(device(sr, clone["key"]), 6, size=16 * MiB)
    for key in (vdi["key"], snap["key"], live["key"], clone["key"]):
        xapi.vdi_destroy(plugin, sr, key)
    assert zfs_names(sr) == [sr]
    sh("zpool", "sync", "vdis")
    for _ in range(50):  # frees are asynchronous (the pool's 'freeing')
        if sh("zpool", "get", "-Hp", "-o", "value", "freeing",
              "vdis").strip() == "0":
            break
        sh("sleep", "0.2")
    sh("zpool", "sync", "vdis")
    after = int(sh("zpool", "list", "-Hp", "-o", "allocated", "vdis"))
    assert after - baseline < 2 * MiB, (baseline, after)


def test_reset_on_boot_and_scan_filter(plugin, sr):
    vdi = xapi.vdi_create(plugin, sr, "rob", 8 * MiB)
    clone = xapi.reset_on_boot_start(plugin, sr, vdi["key"])
    scanned = [v["key"] for v in xapi.sr_scan(plugin, sr)]
    assert scanned == [vdi["key"]]
    xapi.vdi_destroy(plugin, sr, vdi["key"])  # destroys the clone twice
    assert clone["key"] not in [v["key"] for v in plugin("SR.ls", sr=sr)]
    assert zfs_names(sr) == [sr]


KEYS = {
    "UPPER.Case_key:x": "V",
    "sm-config:_sm_config_vhd-parent": "",
    "tags-\u00e9t\u00e9": "\u2603 snow\tman\nline",
    "empty": "",
    "long": "x" * 6000,
}


def test_keys_round_trip_and_survive_export_import(plugin, sr):
    vdi = xapi.vdi_create(plugin, sr, "keys", 8 * MiB)
    for k, v in KEYS.items():
        plugin("Volume.set", sr=sr, key=vdi["key"], k=k, v=v)
    plugin("Volume.unset", sr=sr, key=vdi["key"], k="empty")
    plugin("Volume.set_name", sr=sr, key=vdi["key"], new_name="n\u00e4me")
    plugin("Volume.set_description", sr=sr, key=vdi["key"],
           new_description="d\u00e9sc")
    with pytest.raises(PluginError) as err:
        plugin("Volume.set", sr=sr, key=vdi["key"], k="huge", v="y" * 9000)
    assert err.value.name == "MetadataTooLarge"
    want = dict(KEYS, **{"vdi-type": "user"})
    del want["empty"]
    guid = sh("zpool", "get", "-Hp", "-o", "value", "guid", "vdis").strip()
    sh("zpool", "export", "vdis")
    sh("zpool", "import", "-o", "cachefile=none", guid)
    stat = plugin("Volume.stat", sr=sr, key=vdi["key"])
    assert stat["keys"] == dict(want, content_id=vdi["keys"]["content_id"])
    assert (stat["name"], stat["description"]) == ("n\u00e4me", "d\u00e9sc")


def test_resize_grows_and_refuses_shrink(plugin, sr):
    vdi = xapi.vdi_create(plugin, sr, "grow", 8 * MiB)
    data = write_pattern(device(sr, vdi["key"]), 8)
    plugin("Volume.resize", sr=sr, key=vdi["key"], new_size=20 * MiB + 1)
    size = plugin("Volume.stat", sr=sr, key=vdi["key"])["virtual_size"]
    assert size == 20 * MiB + default_volblocksize()   # whole blocks
    assert read_hash(device(sr, vdi["key"])) == data
    with pytest.raises(PluginError) as err:
        plugin("Volume.resize", sr=sr, key=vdi["key"], new_size=8 * MiB)
    assert err.value.code == "SR_BACKEND_FAILURE_79"
    plugin("Volume.resize", sr=sr, key=vdi["key"], new_size=size)  # no-op


def _consistent(plugin, sr, expected):
    """Every expected VDI listed with its keys; nothing internal left."""
    listed = dict((v["key"], v) for v in plugin("SR.ls", sr=sr))
    for key, keys in expected.items():
        assert key in listed, key
        assert listed[key]["keys"] == keys
    props = sh("zfs", "list", "-H", "-t", "all", "-r", "-o",
               "name,org.xcp-ng.zfs-ng:vdi,clones,defer_destroy", sr)
    for line in props.splitlines():
        name, vdi, clones, defer = line.split("\t")
        if "@zfsng-clone-" in name:
            assert clones != "-" and defer == "on", line
        if vdi == "destroyed":
            assert any(r.startswith(name + "@") for r in props.split()), line
    return listed


CRASH_OPS = {  # op -> (method, target, objects it needs)
    "snapshot": ("Volume.snapshot", "base", ("base",)),
    "clone-live": ("Volume.clone", "base", ("base",)),
    "clone-snap": ("Volume.clone", "snap", ("base", "snap")),
    "resize": ("Volume.resize", "base", ("base",)),
    "destroy-parent": ("Volume.destroy", "base", ("base", "snap", "clone")),
    "destroy-last": ("Volume.destroy", "clone", ("base", "snap", "clone")),
}


def _crash_setup(plugin, sr, op):
    """The VDIs op works on ({name: key}); for destroy-last the parent and
    the snapshot are destroyed first, so the clone is the last thing
    keeping them. Their content_ids, as made, in CONTENT_IDS."""
    made = {}
    needs = CRASH_OPS[op][2]
    vols = [xapi.vdi_create(plugin, sr, "crash", 8 * MiB)]
    made["base"] = vols[0]["key"]
    plugin("Volume.set", sr=sr, key=made["base"], k="keep", v="me")
    if "snap" in needs:
        vols.append(plugin("Volume.snapshot", sr=sr, key=made["base"]))
        made["snap"] = vols[-1]["key"]
    if "clone" in needs:
        vols.append(plugin("Volume.clone", sr=sr, key=made["snap"]))
        made["clone"] = vols[-1]["key"]
    CONTENT_IDS.update((v["key"], v["keys"]["content_id"]) for v in vols)
    if op == "destroy-last":
        plugin("Volume.destroy", sr=sr, key=made.pop("base"))
        plugin("Volume.destroy", sr=sr, key=made.pop("snap"))
    return made


CONTENT_IDS = {}     # {key: content_id} of the VDIs _crash_setup made


def _crash_args(sr, op, made):
    method, target, _ = CRASH_OPS[op]
    args = {"sr": sr, "key": made[target]}
    if op == "resize":
        args["new_size"] = 16 * MiB
    return method, args


def _kept(op, made):
    """{key: its keys} of the VDIs in made that op leaves in place: they
    must still be listed with those keys after any crash, the content_id
    each had (none of these ops changes a VDI's data) among them."""
    target = CRASH_OPS[op][1]
    return dict((key, dict({"keep": "me", "vdi-type": "user"}
                           if name == "base" else {},
                           content_id=CONTENT_IDS[key]))
                for name, key in made.items()
                if name != target or not op.startswith("destroy"))


@pytest.mark.parametrize("op", sorted(CRASH_OPS))
def test_crash_at_every_command_is_repaired(plugin, sr, op, tmp_path):
    """Kill the call right after each command that changes ZFS (and right
    before the first; this run's share of them, conftest.plays and
    traced_points); the next calls (xapi attaching the SR again, the next
    destroy) leave a consistent SR: every other VDI there with its keys,
    no internal snapshot or hidden parent left, and nothing at all once
    everything is destroyed. (The unit tests kill it after every single
    command, on the fake.)"""
    made = _crash_setup(plugin, sr, op)
    method, args = _crash_args(sr, op, made)
    points, _ = traced_points(plugin, method, tmp_path, **args)
    expected = _kept(op, made)
    for n in played(points):
        made = _crash_setup(plugin, sr, op)
        method, args = _crash_args(sr, op, made)
        crashing = plugin.__class__(plugin.root, env=dict(
            plugin.env, ZFSNG_CRASH_AFTER=str(n)))
        rc, out, _ = crashing.raw(method, dict(args, dbg="crash"))
        assert rc == 137, (n, rc, out)
        expected.update(_kept(op, made))
        plugin("SR.attach", configuration=attach_config(sr))
        _consistent(plugin, sr, expected)
    for key in [v["key"] for v in plugin("SR.ls", sr=sr)]:
        plugin("Volume.destroy", sr=sr, key=key)
    assert zfs_names(sr) == [sr]


def attach_config(sr):
    """What xapi keeps for attach: pool-guid and sr_uuid are enough."""
    guid = sh("zpool", "get", "-Hp", "-o", "value", "guid", sr).strip()
    uuid = sh("zfs", "get", "-H", "-o", "value",
              "org.xcp-ng.zfs-ng:sr-uuid", sr).strip()
    return {"pool-guid": guid, "sr_uuid": uuid}


def _worker(root, env, sr, seconds, seed):
    """One of the concurrent xapi callers: its own loop of operations."""
    code = r"""
import random, sys, time
sys.path.insert(0, "tests")
from plugin_client import Plugin, PluginError
plugin = Plugin(sys.argv[1], env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})
sr, end, rnd = sys.argv[2], time.time() + float(sys.argv[3]), random.Random(int(sys.argv[4]))
ops = errors = 0
while time.time() < end:
    try:
        vol = plugin("Volume.create", sr=sr, name="c", description="", size=1 << 20, sharable=False)
        snap = plugin("Volume.snapshot", sr=sr, key=vol["key"])
        clone = plugin("Volume.clone", sr=sr, key=rnd.choice([vol, snap])["key"])
        keys = [vol["key"], snap["key"], clone["key"]]
        rnd.shuffle(keys)
        for key in keys:
            plugin("Volume.destroy", sr=sr, key=key)
        ops += 6
    except PluginError as exc:
        errors += 1
        print("typed error:", exc.code, exc.params)
print("ops", ops, "errors", errors)
"""
    return subprocess.Popen(["python3", "-c", code, root, sr, str(seconds),
                             str(seed)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env,
                            cwd=os.path.join(os.path.dirname(__file__),
                                             "..", ".."))


def test_eight_concurrent_callers(plugin, sr):
    procs = [_worker(plugin.root, plugin.env, sr, 30, seed)
             for seed in range(8)]
    outputs = [p.communicate() for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        text = out.decode()
        assert proc.returncode == 0, err.decode()[-2000:]
        assert "Traceback" not in text and "AssertionError" not in text
        assert "errors 0" in text, text[-2000:]
    assert plugin("SR.ls", sr=sr) == []
    assert zfs_names(sr) == [sr]
