"""Volume.revert on real ZFS, as xapi's VM.revert calls it (xen-api
v26.1.14 and later: the VM halted, then Volume.revert(sr, snapshot, key)
for each disk, nothing after it).

A disk with changed block tracking, three snapshots taken as xapi takes
them, a clone of the newest, guest writes between each: reverted to the
middle snapshot, it holds that snapshot's bytes and keeps its uuid,
labels, keys and CBT state; every other snapshot and the clone keep
theirs; Xen Orchestra's next delta (from the newest snapshot before the
revert, and from an older one) lists exactly the blocks that differ. A
snapshot a revert moved aside reverts too. A disk a VM
holds open through its tapdisk is refused. Killed after each command
that changes something, xapi's call again gives the same bytes and
leaves nothing behind.
"""

import hashlib
import os

import pytest

from conftest import PluginError, one_disk_sr, played, sh, traced_points
from test_cbt import changed, content, dataset_of, truth, write
from test_tapdisk import Xapi, nothing_left
from xapi_flows import vdi_snapshot

MiB = 1 << 20
DISK = 8 * MiB


@pytest.fixture
def sr(plugin, disks, new_uuid):
    yield from one_disk_sr(plugin, disks, new_uuid, "revertsr")


def sha(data):
    return hashlib.sha256(data).hexdigest()


def history(plugin, sr, seed):
    """A tracked disk, snapshots s1 s2 s3 and a clone of s3, written
    between each: (vdi, [s1, s2, s3], clone)."""
    vdi = plugin("Volume.create", sr=sr, name="web01", description="sys",
                 size=DISK, sharable=False)
    plugin("Volume.set", sr=sr, key=vdi["key"], k="vdi-type", v="user")
    plugin("Volume.set", sr=sr, key=vdi["key"], k="owner", v="alice")
    plugin("Volume.enable_cbt", sr=sr, key=vdi["key"])
    snaps = []
    for i in range(3):
        write(dataset_of(vdi), (2 * i + seed % 2) * MiB,
              os.urandom(MiB // 2))
        snaps.append(vdi_snapshot(plugin, sr, vdi["key"]))
    copy = plugin("Volume.clone", sr=sr, key=snaps[2]["key"])
    write(dataset_of(vdi), 7 * MiB, os.urandom(64 * 1024))
    return plugin("Volume.stat", sr=sr, key=vdi["key"]), snaps, copy


def listed(plugin, sr):
    return dict((v["key"], v) for v in plugin("SR.ls", sr=sr))


def plain(vol):
    """vol's keys but content_id."""
    return dict((k, v) for k, v in vol["keys"].items() if k != "content_id")


def assert_new_content_id(before, after, key):
    """The reverted disk holds other data than before: a content_id of
    its own, neither its old one nor any other VDI's (xapi's copies pick
    a base by it: zfsng/contentid.py); every other VDI keeps its own."""
    ids = dict((k, v["keys"]["content_id"]) for k, v in before.items())
    assert after[key]["keys"]["content_id"] not in set(ids.values()) | {""}
    assert dict((k, v["keys"]["content_id"]) for k, v in after.items()
                if k != key) == dict((k, i) for k, i in ids.items()
                                     if k != key)


def test_a_disk_reverts_to_its_middle_snapshot_keeping_everything(
        plugin, dp, sr):
    vdi, (s1, s2, s3), copy = history(plugin, sr, 1)
    before = listed(plugin, sr)
    data = dict((v["key"], content(dp, v)) for v in (s1, s2, s3, copy))
    held = dict((k, sha(b)) for k, b in data.items())
    plugin("Volume.revert", sr=sr, snapshot=s2["key"], key=vdi["key"])
    after = listed(plugin, sr)
    assert sorted(after) == sorted(before)
    for field in ("name", "description", "uri", "cbt_enabled"):
        assert after[vdi["key"]][field] == before[vdi["key"]][field], field
    assert plain(after[vdi["key"]]) == plain(before[vdi["key"]])
    assert_new_content_id(before, after, vdi["key"])
    assert sha(content(dp, after[vdi["key"]])) == held[s2["key"]]
    for v in (s1, s2, s3, copy):
        assert sha(content(dp, after[v["key"]])) == held[v["key"]], v
    # the disk lives on; XO's next delta, from s3 (out of the disk's
    # history now: both go back to s2) and from s1, is exact
    write(dataset_of(vdi), 5 * MiB, os.urandom(MiB // 4))
    s4 = vdi_snapshot(plugin, sr, vdi["key"])
    new = content(dp, s4)
    assert truth(data[s3["key"]], new) == changed(plugin, sr, s3["key"],
                                                  s4["key"], DISK)
    assert changed(plugin, sr, s1["key"], s4["key"], DISK) == \
        truth(data[s1["key"]], new)       # s1's bytes: held, checked above
    left = sh("zfs", "list", "-H", "-o", "name,org.xcp-ng.zfs-ng:reverting",
              "-t", "volume", "-r", sr)
    assert "@" not in left, left             # no mark left on any zvol


def test_snapshots_a_revert_moved_revert_and_deltas_stay_exact(
        plugin, dp, sr):
    """Issue 39, items 1 and 2. Reverted to s1, the disk's newer
    snapshots (s2, s3) are on the zvol set aside: Xen Orchestra's next
    delta from s3 (a snapshot, or its bookmark once its data is destroyed)
    lists exactly the blocks that differ, and a revert to s2 or s3 gives
    the disk exactly their bytes."""
    vdi, (s1, s2, s3), copy = history(plugin, sr, 5)
    held = dict((v["key"], content(dp, v)) for v in (s1, s2, s3))
    write(dataset_of(vdi), 6 * MiB, os.urandom(MiB // 4))
    s4 = vdi_snapshot(plugin, sr, vdi["key"])
    held[s4["key"]] = content(dp, s4)
    plugin("Volume.data_destroy", sr=sr, key=s4["key"])   # XO, backed up
    plugin("Volume.revert", sr=sr, snapshot=s1["key"], key=vdi["key"])
    write(dataset_of(vdi), 3 * MiB, os.urandom(MiB // 4))
    s5 = vdi_snapshot(plugin, sr, vdi["key"])
    new = content(dp, s5)
    for base in (s3, s4, s2):
        want = truth(held[base["key"]], new)
        got = changed(plugin, sr, base["key"], s5["key"], DISK)
        print("from %s: %d blocks listed, %d differ"
              % (base["key"], len(got), len(want)))
        assert want and got == want, base["key"]
    before = listed(plugin, sr)
    for snap in (s2, s3, s5, s1, s3):
        plugin("Volume.revert", sr=sr, snapshot=snap["key"], key=vdi["key"])
        assert sha(content(dp, vdi)) == sha(held.get(snap["key"]) or new)
        after = listed(plugin, sr)
        assert sorted(after) == sorted(before)
        assert plain(after[vdi["key"]]) == plain(before[vdi["key"]])
        assert_new_content_id(before, after, vdi["key"])
        before = after
    for v in (s1, s2):
        assert sha(content(dp, after[v["key"]])) == sha(held[v["key"]])
    for key in sorted(before):
        plugin("Volume.destroy", sr=sr, key=key)
    left = sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r", sr)
    assert left.split() == [sr], left


class Backups(object):
    """Xen Orchestra's delta backups of one disk: a snapshot, the blocks
    changed since the last one (checked exact against both snapshots'
    bytes), then the snapshot's data destroyed (its bookmark kept)."""

    def __init__(self, plugin, dp, sr, vdi):
        self.plugin, self.dp, self.sr, self.vdi = plugin, dp, sr, vdi
        self.last = None      # (snapshot, its bytes)

    def run(self):
        snap = vdi_snapshot(self.plugin, self.sr, self.vdi["key"])
        data = content(self.dp, snap)
        if self.last is not None:
            want = truth(self.last[1], data)
            got = changed(self.plugin, self.sr, self.last[0]["key"],
                          snap["key"], DISK)
            print("delta: %d blocks listed, %d differ" % (len(got),
                                                         len(want)))
            assert got == want
        self.plugin("Volume.data_destroy", sr=self.sr, key=snap["key"])
        self.last = (snap, data)
        return snap


def test_an_admins_weeks_of_reverts_resets_and_backups(plugin, dp, sr):
    """Issue 39: what an admin does with a disk over weeks, on real ZFS:
    nightly delta backups, snapshots kept by hand, a reset-on-boot run
    with a backup and a snapshot taken while it ran, reverts to a
    snapshot the reset set aside and to an older one; every delta lists
    exactly the blocks that differ, every revert gives the snapshot's
    bytes, and destroying everything leaves nothing."""
    vdi = plugin("Volume.create", sr=sr, name="db01", description="",
                 size=DISK, sharable=False)
    plugin("Volume.enable_cbt", sr=sr, key=vdi["key"])
    ds, uri = dataset_of(vdi), vdi["uri"][0]
    nightly = Backups(plugin, dp, sr, vdi)
    write(ds, 0, os.urandom(2 * MiB))
    nightly.run()                                      # week 1: full
    write(ds, 1 * MiB, os.urandom(MiB // 4))
    kept_a = vdi_snapshot(plugin, sr, vdi["key"])      # before an upgrade
    bytes_a = content(dp, kept_a)
    write(ds, 3 * MiB, os.urandom(MiB // 2))
    nightly.run()                                      # week 2
    dp("Datapath.open", uri=uri, persistent=False)     # week 3: a kiosk run
    write(ds, 5 * MiB, os.urandom(MiB // 4))
    kept_b = vdi_snapshot(plugin, sr, vdi["key"])      # taken while it ran
    bytes_b = content(dp, kept_b)
    nightly.run()
    dp("Datapath.close", uri=uri)                      # reset: rotation
    nightly.run()                                      # the reset's delta
    plugin("Volume.revert", sr=sr, snapshot=kept_b["key"], key=vdi["key"])
    assert content(dp, vdi) == bytes_b                 # set aside by reset
    nightly.run()
    write(ds, 6 * MiB, os.urandom(MiB // 4))
    nightly.run()
    plugin("Volume.revert", sr=sr, snapshot=kept_a["key"], key=vdi["key"])
    assert content(dp, vdi) == bytes_a
    nightly.run()
    assert plugin("Volume.stat", sr=sr, key=vdi["key"])["cbt_enabled"]
    for key in sorted(listed(plugin, sr)):
        if key != vdi["key"]:
            plugin("Volume.destroy", sr=sr, key=key)
    left = sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r", sr)
    assert left.split() == [sr, ds], left
    plugin("Volume.destroy", sr=sr, key=vdi["key"])


def test_a_disk_a_vm_holds_open_is_not_reverted(plugin, dp, sr):
    """A disk and one snapshot (the history above adds nothing to the
    refusal); the snapshot's bytes read from the zvol as it is taken.
    xapi's repeated calls are played elsewhere (test_tapdisk.py)."""
    vdi = plugin("Volume.create", sr=sr, name="web01", description="",
                 size=DISK, sharable=False)
    write(dataset_of(vdi), MiB, os.urandom(MiB // 2))
    with open("/dev/zvol/" + dataset_of(vdi), "rb") as f:
        want = sha(f.read())
    snap = vdi_snapshot(plugin, sr, vdi["key"])
    write(dataset_of(vdi), 3 * MiB, os.urandom(MiB // 2))
    xapi = Xapi(dp, plugin, sr, vdi, repeat=False)
    xapi.start()
    with pytest.raises(PluginError) as err:
        plugin("Volume.revert", sr=sr, snapshot=snap["key"], key=vdi["key"])
    assert err.value.name == "VdiInUse"
    xapi.stop()
    nothing_left(sr)
    plugin("Volume.revert", sr=sr, snapshot=snap["key"], key=vdi["key"])
    assert sha(content(dp, vdi)) == want


def test_a_revert_killed_after_each_change_is_finished_by_the_retry(
        plugin, dp, sr, tmp_path):
    vdi, (_, s2, _), _ = history(plugin, sr, 3)
    points, _ = traced_points(plugin, "Volume.revert", tmp_path, sr=sr,
                              snapshot=s2["key"], key=vdi["key"])
    for n in played(points):
        vdi, (_, s2, _), _ = history(plugin, sr, 4 + n)
        want = sha(content(dp, s2))
        keys = sorted(listed(plugin, sr))
        killed = plugin.__class__(plugin.root, env=dict(
            plugin.env, ZFSNG_CRASH_AFTER=str(n)))
        try:
            killed("Volume.revert", sr=sr, snapshot=s2["key"],
                   key=vdi["key"])
        except (PluginError, AssertionError):
            pass
        assert sorted(listed(plugin, sr)) == keys, n   # the VDI stays
        plugin("Volume.revert", sr=sr, snapshot=s2["key"], key=vdi["key"])
        assert sha(content(dp, vdi)) == want, n
        for key in keys:
            plugin("Volume.destroy", sr=sr, key=key)
        left = sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r", sr)
        assert left.split() == [sr], (n, left)
