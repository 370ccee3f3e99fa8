"""Volume.revert on the fake host: a VDI back to one of its snapshots.

xapi's VM.revert (v26.1.14 and later) halts the VM, then calls
VDI.revert for each disk, which xapi-storage-script turns into
Volume.revert(sr, snapshot=<snapshot key>, key=<the VDI's uuid>); it
calls nothing after it. The fake keeps each block's birth txg and
whether it holds data, so a test sees what each VDI holds.
"""

import pytest

from zfsng import errors, meta, zvoldev

import fakezfs
from conftest import call, create_sr, plain_keys
from crashpoint import CrashAfter, CrashAfterCommand, CutInside, Killed, \
    commands_run, installed
from test_vdi_semantics import (
    assert_only_the_sr_is_left, clone, datasets, destroy_everything, garbage,
    listed, snapshot_name, vdi_create, vdi_snapshot, zvol)

MiB = fakezfs.MiB


@pytest.fixture
def sr(fake):
    fake.user_value_cap = None
    return create_sr()[0]


def revert(sr, snapshot, key):
    return call("Volume.revert", sr=sr, snapshot=snapshot, key=key)


def data(fake, name):
    """blkid -> birth txg of the blocks name holds data in."""
    return dict((b, t) for b, (t, d) in fake.dataset(name).blocks.items()
                if d)


def history(fake, sr):
    """A disk with CBT, three snapshots and a clone of the newest, written
    between each, grown after the second: (vdi, [s1, s2, s3], clone)."""
    vdi = vdi_create(sr, name="web01 disk", description="system")["key"]
    call("Volume.set", sr=sr, key=vdi, k="owner", v="alice")
    call("Volume.enable_cbt", sr=sr, key=vdi)
    block = fake.dataset(zvol(sr, vdi)).volblocksize
    snaps = []
    for i in range(3):
        fake.guest_write(zvol(sr, vdi), (10 * i) * block, 4 * block)
        snaps.append(vdi_snapshot(sr, vdi)["key"])
        if i == 1:
            size = fake.dataset(zvol(sr, vdi)).volsize
            call("Volume.resize", sr=sr, key=vdi, new_size=size + 64 * MiB)
    copy = clone(sr, snaps[2])["key"]
    fake.guest_write(zvol(sr, vdi), 50 * block, 2 * block)
    return vdi, snaps, copy


def test_a_vdi_reverts_to_a_middle_snapshot_and_keeps_everything(fake, sr):
    vdi, (s1, s2, s3), copy = history(fake, sr)
    before = listed(sr)
    held = dict((k, data(fake, snapshot_name(fake, sr, k)))
                for k in (s1, s2, s3))
    held[copy] = data(fake, zvol(sr, copy))
    assert revert(sr, s2, vdi) is None
    after = listed(sr)
    assert sorted(after) == sorted(before)            # every VDI is there
    for field in ("name", "description", "uri", "cbt_enabled",
                  "sharable", "read_write"):
        assert after[vdi][field] == before[vdi][field], field
    assert plain_keys(after[vdi]["keys"]) == plain_keys(before[vdi]["keys"])
    # its data changed: a content_id no VDI had (xapi's copies match by it)
    assert after[vdi]["keys"]["content_id"] not in set(
        v["keys"]["content_id"] for v in before.values())
    assert after[vdi]["cbt_enabled"] is True
    assert after[vdi]["virtual_size"] == before[s2]["virtual_size"] < \
        before[vdi]["virtual_size"]
    assert data(fake, zvol(sr, vdi)) == held[s2]       # its content
    for key in (s1, s2, s3):                           # theirs unchanged
        assert data(fake, snapshot_name(fake, sr, key)) == held[key]
        for field in ("name", "keys", "virtual_size", "cbt_enabled"):
            assert after[key][field] == before[key][field], (key, field)
    assert data(fake, zvol(sr, copy)) == held[copy]
    # s1 and s2 are the disk's again; s3 is on the zvol set aside, hidden
    assert snapshot_name(fake, sr, s2) == zvol(sr, vdi) + "@" + s2
    assert snapshot_name(fake, sr, s1) == zvol(sr, vdi) + "@" + s1
    assert fake.get(snapshot_name(fake, sr, s3).split("@")[0],
                    meta.VDI_UUID) == meta.HIDDEN
    assert not any(fake.get(n, meta.REVERTING) for n in datasets(fake)
                   if "@" not in n)
    # the disk lives on: written, snapshotted, reverted again
    block = fake.dataset(zvol(sr, vdi)).volblocksize
    fake.guest_write(zvol(sr, vdi), 70 * block, block)
    s4 = vdi_snapshot(sr, vdi)["key"]
    assert revert(sr, s1, vdi) is None
    assert data(fake, zvol(sr, vdi)) == held[s1]
    assert garbage(fake, sr) == []
    destroy_everything(sr)
    assert garbage(fake, sr) == []
    assert_only_the_sr_is_left(fake, sr)
    assert s4


def test_a_snapshot_an_earlier_revert_moved_reverts_too(fake, sr):
    """Issue 39, item 1. A revert to s1 moves s2 and s3 (newer) with the
    zvol set aside; xapi still lists them as the disk's snapshots and
    reverts to them: each revert gives the disk exactly that snapshot's
    data, wherever ZFS keeps it, and keeps every VDI and its data. Once
    the snapshots go, nothing is left behind."""
    vdi, (s1, s2, s3), copy = history(fake, sr)
    block = fake.dataset(zvol(sr, vdi)).volblocksize
    held = dict((k, data(fake, snapshot_name(fake, sr, k)))
                for k in (s1, s2, s3))
    held[copy] = data(fake, zvol(sr, copy))
    before = listed(sr)
    revert(sr, s1, vdi)
    assert snapshot_name(fake, sr, s2).split("@")[0] != zvol(sr, vdi)
    fake.guest_write(zvol(sr, vdi), 90 * block, block)
    s4 = vdi_snapshot(sr, vdi)["key"]
    held[s4] = data(fake, snapshot_name(fake, sr, s4))
    for target in (s2, s3, s4, s1, s3, s2):
        assert revert(sr, target, vdi) is None, target
        assert data(fake, zvol(sr, vdi)) == held[target], target
        after = listed(sr)
        assert sorted(after) == sorted(list(before) + [s4])
        assert after[vdi]["virtual_size"] == after[target]["virtual_size"]
        for key in (s1, s2, s3, s4):
            assert data(fake, snapshot_name(fake, sr, key)) == held[key]
        assert data(fake, zvol(sr, copy)) == held[copy]
        for field in ("name", "description", "cbt_enabled"):
            assert after[vdi][field] == before[vdi][field], field
        assert plain_keys(after[vdi]["keys"]) == \
            plain_keys(before[vdi]["keys"])
        assert _marked(fake) == []
        # the disk is no clone of the zvols set aside for it
        origin = fake.get(zvol(sr, vdi), "origin") or ""
        assert not origin or fake.get(origin.split("@")[0],
                                      meta.ASIDE_OF) != vdi
        fake.guest_write(zvol(sr, vdi), 100 * block, block)
    assert garbage(fake, sr) == []
    destroy_everything(sr)
    assert garbage(fake, sr) == []
    assert_only_the_sr_is_left(fake, sr)


def test_disabling_cbt_drops_the_maps_of_snapshots_set_aside(fake, sr):
    """The maps of a disk's snapshots are CBT's only: disable_cbt drops
    them, those a revert moved aside too."""
    vdi, (s1, s2, s3), _ = history(fake, sr)
    for a, b in ((s1, s2), (s2, s3)):
        call("Volume.list_changed_blocks", sr=sr, key=a, key2=b, offset=0,
             length=-1)
    revert(sr, s1, vdi)
    names = [snapshot_name(fake, sr, k) for k in (s1, s2, s3)]
    assert all(fake.get(n, meta.CBT_MAP) for n in names)
    call("Volume.disable_cbt", sr=sr, key=vdi)
    assert [n for n in names if fake.get(n, meta.CBT_MAP)] == []


def test_another_disks_set_aside_snapshot_is_still_refused(fake, sr):
    """A snapshot moved by a revert of another disk is that disk's: the
    revert is refused, nothing changed."""
    vdi, (s1, s2, _), _ = history(fake, sr)
    other = vdi_create(sr)["key"]
    vdi_snapshot(sr, other)
    revert(sr, s1, vdi)
    state = _state(fake, sr)
    with pytest.raises(errors.InvalidArgument):
        revert(sr, s2, other)
    assert _state(fake, sr) == state


def _differ(a, b, block, granule=64 * 1024):
    """The 64 KiB granules where two block maps (blkid -> (birth, data))
    may hold different bytes: a block differs unless both hold the same
    birth's data, or both hold none."""
    out = set()
    for blk in set(a) | set(b):
        x, y = a.get(blk, (0, False)), b.get(blk, (0, False))
        if (x[1] or y[1]) and x != y:
            out.add(blk * block // granule)
    return out


@pytest.mark.parametrize("destroyed", [False, True])
def test_changed_blocks_across_a_revert_are_exact(fake, sr, destroyed):
    """Issue 39, item 2. Xen Orchestra's next delta after a revert lists
    from the snapshot it backed up last (s3), newer than the one reverted
    to (s2), and out of the disk's history since. Both go back to s2:
    the list is what was born after it on either side, as the data shows.
    s3 data-destroyed (its bookmark on the zvol set aside), the blocks of
    that zvol are read instead of s3's: exact but for where the guest
    wrote after s3, before the revert, over data s3 and s4 share. From an
    older snapshot (s1) it is exact as ever."""
    from test_cbt import granules
    vdi, (s1, s2, s3), _ = history(fake, sr)
    block = fake.dataset(zvol(sr, vdi)).volblocksize
    held = dict((k, dict(fake.dataset(snapshot_name(fake, sr, k)).blocks))
                for k in (s1, s3))
    fake.guest_write(zvol(sr, vdi), 0, block)     # over s1's, after s3
    late = _differ({}, {0: (1, True)}, block)
    if destroyed:
        call("Volume.data_destroy", sr=sr, key=s3)
    revert(sr, s2, vdi)
    fake.guest_write(zvol(sr, vdi), 80 * block, block)
    fake.guest_write(zvol(sr, vdi), 20 * block, block)   # over s3's
    s4 = vdi_snapshot(sr, vdi)["key"]
    new = fake.dataset(snapshot_name(fake, sr, s4))
    size = new.volsize                        # s2's, and so the disk's

    def listed_from(base):
        return set(granules(call("Volume.list_changed_blocks", sr=sr,
                                 key=base, key2=s4, offset=0, length=-1),
                            size))

    assert listed_from(s1) == _differ(held[s1], new.blocks, block)
    truth = _differ(held[s3], new.blocks, block)
    assert truth and len(truth) * 4 < size // (64 * 1024)
    assert late and not late & truth
    assert listed_from(s3) == (truth | late if destroyed else truth)


def test_a_bookmark_whose_record_is_stale_is_found_where_it_moved(fake,
                                                                     sr):
    """A record a revert or a reset did not update yet (a crash before
    its step 5b, or a pool from before it) names the bookmark where it
    was: list_changed_blocks finds it by its name, and stays exact."""
    from test_cbt import granules
    vdi, (_, s2, s3), _ = history(fake, sr)
    block = fake.dataset(zvol(sr, vdi)).volblocksize
    held = dict(fake.dataset(snapshot_name(fake, sr, s3)).blocks)
    call("Volume.data_destroy", sr=sr, key=s3)
    stub = zvol(sr, s3)
    was = fake.get(stub, meta.CBT_BOOKMARK)
    revert(sr, s2, vdi)
    assert fake.get(stub, meta.CBT_BOOKMARK) != was
    fake.admin("zfs set %s=%s %s" % (meta.CBT_BOOKMARK, was, stub))
    fake.guest_write(zvol(sr, vdi), 80 * block, block)
    s4 = vdi_snapshot(sr, vdi)["key"]
    new = fake.dataset(snapshot_name(fake, sr, s4))
    got = set(granules(call("Volume.list_changed_blocks", sr=sr, key=s3,
                            key2=s4, offset=0, length=-1), new.volsize))
    assert got == _differ(held, new.blocks, block)


def test_the_newest_snapshot_leaves_nothing_aside(fake, sr):
    vdi, (_, _, s3), copy = history(fake, sr)
    call("Volume.destroy", sr=sr, key=copy)
    want = data(fake, snapshot_name(fake, sr, s3))
    revert(sr, s3, vdi)
    assert data(fake, zvol(sr, vdi)) == want
    assert garbage(fake, sr) == []
    assert [n for n in datasets(fake) if n.count("/") == 1 and
            "@" not in n] == [zvol(sr, vdi)]        # the one set aside: gone


def test_a_thick_disk_keeps_its_reservation(fake):
    fake.user_value_cap = None
    sr, _ = create_sr({"device": "/dev/sdb", "provisioning": "thick"})
    vdi = vdi_create(sr)["key"]
    snap = vdi_snapshot(sr, vdi)["key"]
    revert(sr, snap, vdi)
    reserved = fake.get(zvol(sr, vdi), "refreservation")
    assert reserved not in (None, "none", "0")
    destroy_everything(sr)
    assert_only_the_sr_is_left(fake, sr)


def _state(fake, sr):
    return (datasets(fake), listed(sr))


def test_what_cannot_be_reverted_is_refused_and_nothing_changes(fake, sr):
    vdi, (s1, _, _), copy = history(fake, sr)
    other = vdi_create(sr)["key"]
    theirs = vdi_snapshot(sr, other)["key"]
    cases = [
        (s1, s1, errors.InvalidArgument),          # the same key
        (s1, copy, errors.InvalidArgument),        # not its snapshot
        (theirs, vdi, errors.InvalidArgument),     # another disk's
        (other, vdi, errors.InvalidArgument),      # not a snapshot
        (vdi, s1, errors.InvalidArgument),         # the disk is a snapshot
        ("00000000-0000-0000-0000-000000000000", vdi,
         errors.Volume_does_not_exist),
        (s1, "00000000-0000-0000-0000-000000000000",
         errors.Volume_does_not_exist),
    ]
    for snapshot, key, error in cases:
        state = _state(fake, sr)
        with pytest.raises(error):
            revert(sr, snapshot, key)
        assert _state(fake, sr) == state, (snapshot, key)
    call("Volume.data_destroy", sr=sr, key=s1)
    state = _state(fake, sr)
    with pytest.raises(errors.DataDestroyed):
        revert(sr, s1, vdi)
    assert _state(fake, sr) == state
    with pytest.raises(errors.Sr_not_attached):
        call("Volume.revert", sr="tank/nosuch", snapshot=s1, key=vdi)


def test_a_disk_in_use_is_refused(fake, sr, monkeypatch):
    vdi, (s1, _, _), _ = history(fake, sr)
    monkeypatch.setattr(zvoldev, "openers", lambda dataset: [4242])
    state = _state(fake, sr)
    with pytest.raises(errors.VdiInUse) as err:
        revert(sr, s1, vdi)
    assert "4242" in err.value.message
    assert _state(fake, sr) == state


@pytest.mark.parametrize("step, error", [
    ("zfs rename", "cannot rename: dataset is busy"),
    ("zfs clone", "cannot create: out of space"),
])
def test_a_failed_step_leaves_the_disk_as_it_was(fake, sr, step, error):
    """The rename or the clone refused by ZFS (a thick disk's second
    reservation that does not fit): the error goes to xapi, and the disk
    is as before, no mark left."""
    vdi, (_, s2, _), _ = history(fake, sr)
    state = _state(fake, sr)
    fake.inject(step, error, times=-1)
    with pytest.raises(errors.StorageError):
        revert(sr, s2, vdi)
    fake.injected = []
    assert _state(fake, sr) == state
    assert not fake.get(zvol(sr, vdi), meta.REVERTING)


# --- what fails once the disk is reverted --------------------------------

def _marked(fake):
    return [n for n in datasets(fake) if "@" not in n and
            fake.get(n, meta.REVERTING)]


def test_a_failed_promote_answers_success_and_the_next_revert_ends_it(
        fake, sr):
    """The clone is in place under the disk's name: the disk is reverted,
    and a failed ``zfs promote`` must not fail the call (xapi would stop
    reverting the VM's other disks). The call's own collect tries it again
    (failing too here); the revert of the next disk, which xapi makes at
    once, finishes it: the snapshots are the disk's again."""
    vdi, (s1, s2, _), _ = history(fake, sr)
    other = vdi_create(sr)["key"]
    theirs = vdi_snapshot(sr, other)["key"]
    want = data(fake, snapshot_name(fake, sr, s2))
    fake.inject("zfs promote", "cannot promote 'tank/x': out of space",
                times=2)
    assert revert(sr, s2, vdi) is None
    assert data(fake, zvol(sr, vdi)) == want
    assert listed(sr)[vdi]["virtual_size"] == listed(sr)[s2]["virtual_size"]
    assert _marked(fake)                         # left for the collector
    assert revert(sr, theirs, other) is None     # xapi's next disk
    assert _marked(fake) == []
    assert snapshot_name(fake, sr, s2) == zvol(sr, vdi) + "@" + s2
    assert snapshot_name(fake, sr, s1) == zvol(sr, vdi) + "@" + s1
    assert data(fake, zvol(sr, vdi)) == want
    assert garbage(fake, sr) == []
    destroy_everything(sr)
    assert_only_the_sr_is_left(fake, sr)


def test_a_failed_collect_after_the_revert_answers_success(fake):
    """The collector's failure (here freeing the zvol set aside; any
    garbage's would do) after the disk is reverted is logged; the next
    collect (an SR.attach here) frees what is left."""
    fake.user_value_cap = None
    sr, config = create_sr()
    vdi, (_, _, s3), copy = history(fake, sr)
    call("Volume.destroy", sr=sr, key=copy)
    want = data(fake, snapshot_name(fake, sr, s3))
    fake.inject("zfs destroy", "cannot destroy 'tank/x': Input/output "
                "error", times=-1)
    assert revert(sr, s3, vdi) is None
    fake.injected = []
    assert data(fake, zvol(sr, vdi)) == want
    assert garbage(fake, sr)                     # the zvol set aside
    assert _marked(fake) == []
    sr = _reattached(sr, config)
    assert garbage(fake, sr) == []
    assert data(fake, zvol(sr, vdi)) == want


def test_garbage_that_cannot_be_freed_does_not_stop_another_revert(fake):
    """The zvol a first revert set aside cannot be destroyed (the disk is
    busy, say): xapi's revert of the VM's next disk must still go ahead,
    or the VM is left half reverted (xapi fails VM.revert on any error)."""
    fake.user_value_cap = None
    sr, config = create_sr()
    vdi, (_, _, s3), copy = history(fake, sr)
    call("Volume.destroy", sr=sr, key=copy)
    other = vdi_create(sr)["key"]
    theirs = vdi_snapshot(sr, other)["key"]
    fake.guest_write(zvol(sr, other), 0, 4096)
    want = data(fake, snapshot_name(fake, sr, theirs))
    fake.inject("zfs destroy", "cannot destroy 'tank/x': dataset is busy",
                times=-1)
    assert revert(sr, s3, vdi) is None
    assert garbage(fake, sr)                     # the zvol set aside
    assert revert(sr, theirs, other) is None     # xapi's next disk
    assert data(fake, zvol(sr, other)) == want
    fake.injected = []
    sr = _reattached(sr, config)
    assert garbage(fake, sr) == []


def test_a_cut_revert_of_the_same_disk_that_cannot_be_finished_refuses(
        fake, sr):
    """The other side: the collector cannot finish this disk's own revert
    a crash cut short, so reverting it again is refused with the cause
    (the collector's error), nothing changed."""
    vdi, (s1, s2, _), _ = history(fake, sr)
    with installed(CrashAfterCommand(fake, ["zfs", "rename"], nth=1)):
        with pytest.raises(Killed):
            revert(sr, s2, vdi)
    marked = _marked(fake)
    assert marked
    for command in ("zfs rename", "zfs clone", "zfs promote", "zfs set",
                    "zfs destroy", "zfs inherit"):
        fake.inject(command, "cannot do it: I/O error", times=-1)
    with pytest.raises(Exception) as err:
        revert(sr, s1, vdi)
    assert "I/O error" in str(err.value)
    assert _marked(fake) == marked


def _thick(fake):
    """A thick SR with a disk and its snapshot: (sr, config, vdi, snap,
    the disk's reservation)."""
    fake.user_value_cap = None
    sr, config = create_sr({"device": "/dev/sdb", "provisioning": "thick"})
    vdi = vdi_create(sr)["key"]
    snap = vdi_snapshot(sr, vdi)["key"]
    reserved = fake.get(zvol(sr, vdi), "refreservation")
    assert reserved not in (None, "none", "0")
    return sr, config, vdi, snap, reserved


def _reattached(sr, config):
    call("SR.detach", sr=sr)
    return call("SR.attach", configuration=config)


def test_an_undo_killed_before_the_reservation_is_back_restores_it(fake):
    """The clone does not fit: the undo renames the disk back, and is
    killed before it sets its reservation again. The next collect sets it
    (the disk would otherwise stay thin for good)."""
    sr, config, vdi, snap, reserved = _thick(fake)
    fake.inject("zfs clone", "cannot create 'tank/x': out of space")
    with installed(CrashAfterCommand(fake, ["zfs", "rename"], nth=2)):
        with pytest.raises(Killed):
            revert(sr, snap, vdi)
    assert fake.get(zvol(sr, vdi), "refreservation") in ("none", "0")
    assert vdi in listed(sr)
    sr = _reattached(sr, config)
    assert fake.get(zvol(sr, vdi), "refreservation") == reserved
    assert _marked(fake) == []
    destroy_everything(sr)
    assert_only_the_sr_is_left(fake, sr)


def test_an_undo_without_room_for_the_reservation_ends_at_the_next_call(
        fake):
    """Setting the reservation again fails for lack of space: the revert
    fails (OutOfSpace), the mark is kept, and the next call, with room
    again, sets it."""
    sr, config, vdi, snap, reserved = _thick(fake)
    fake.inject("zfs clone", "cannot create 'tank/x': out of space")
    fake.inject("zfs set refreservation=auto",
                "cannot set property for 'tank/x': out of space")
    with pytest.raises(errors.OutOfSpace):
        revert(sr, snap, vdi)
    assert fake.get(zvol(sr, vdi), meta.REVERTING)
    assert vdi in listed(sr)
    sr = _reattached(sr, config)
    assert fake.get(zvol(sr, vdi), "refreservation") == reserved
    assert _marked(fake) == []


def test_a_pending_reset_is_refused(fake, sr):
    vdi, (s1, _, _), _ = history(fake, sr)
    fake.admin("zfs snapshot %s@%s" % (zvol(sr, vdi),
                                       meta.NONPERSISTENT_SNAPSHOT))
    state = _state(fake, sr)
    with pytest.raises(errors.InvalidArgument) as err:
        revert(sr, s1, vdi)
    assert "non-persistent" in err.value.message
    assert _state(fake, sr) == state


# --- killed after any command ------------------------------------------

def _scenario(host, moved=False):
    """(sr, its stored device-config, the VDIs' keys by role). moved: the
    disk reverted to s1 first, so s2 (the one the tests revert to) is on
    the zvol that revert set aside."""
    sr, config = create_sr()
    vdi, (s1, s2, s3), copy = history(host, sr)
    if moved:
        revert(sr, s1, vdi)
        host.guest_write(zvol(sr, vdi), 0, 2 * host.dataset(
            zvol(sr, vdi)).volblocksize)
    return sr, config, {"vdi": vdi, "s1": s1, "s2": s2, "s3": s3,
                        "copy": copy}


def _contents(host, sr, roles):
    """What each VDI holds, by role: every VDI listed once, no other."""
    vdis = listed(sr)
    assert sorted(vdis) == sorted(roles.values())
    out = {}
    by_key = dict((key, role) for role, key in roles.items())
    for role, key in roles.items():
        vol = vdis[key]
        name = zvol(sr, key) if vol["read_write"] else \
            snapshot_name(host, sr, key)
        keys = dict((k, by_key.get(v, v))
                    for k, v in plain_keys(vol["keys"]).items())
        out[role] = (vol["name"], vol["virtual_size"], keys,
                     sorted(data(host, name).values()))
    return out


def _outcomes(moved=False):
    """What a revert leaves, and what no revert leaves (the fake's txgs
    repeat from one fresh host to the next)."""
    results = []
    for do in (True, False):
        host = fakezfs.FakeZfs.with_disks()
        with installed(host):
            sr, _, roles = _scenario(host, moved)
            if do:
                revert(sr, roles["s2"], roles["vdi"])
            results.append(_contents(host, sr, roles))
    return results


@pytest.mark.parametrize("moved", [False, True])
@pytest.mark.parametrize("next_call", ["revert", "attach", "ls"])
def test_a_revert_killed_after_any_command_is_finished_or_undone(next_call,
                                                                 moved):
    """Killed after each command: SR.ls lists every VDI once meanwhile;
    then xapi's VM.revert again, or a reboot's SR.attach, leaves either
    the reverted disk or the disk as it was, never anything else, and
    nothing behind. moved: to a snapshot an earlier revert set aside."""
    reverted, untouched = _outcomes(moved)
    assert reverted != untouched
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, _, roles = _scenario(host, moved)
        total = commands_run(host, lambda: revert(sr, roles["s2"],
                                                  roles["vdi"]))
    failures = []
    for n in range(1, total + 1):
        host = fakezfs.FakeZfs.with_disks()
        with installed(host):
            sr, config, roles = _scenario(host, moved)
            with installed(CrashAfter(host, n)):
                try:
                    revert(sr, roles["s2"], roles["vdi"])
                    failures.append("%d: not killed" % n)
                except Killed:
                    pass
            try:
                assert sorted(listed(sr)) == sorted(roles.values())
                if next_call == "revert":
                    revert(sr, roles["s2"], roles["vdi"])
                    assert _contents(host, sr, roles) == reverted
                elif next_call == "attach":
                    call("SR.detach", sr=sr)
                    call("SR.attach", configuration=config)
                    assert _contents(host, sr, roles) in (reverted,
                                                          untouched)
                    assert garbage(host, sr) == []
                destroy_everything(sr)
                assert_only_the_sr_is_left(host, sr)
            except AssertionError as exc:
                failures.append("killed after %d of %d: %r" % (n, total, exc))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("moved", [False, True])
@pytest.mark.parametrize("next_call", ["revert", "attach"])
def test_a_power_cut_inside_the_clone_is_undone(next_call, moved):
    """ZFS sets a clone's -o properties in a later transaction group: a
    power cut between leaves the VDI's name on a clone without them. It
    is no VDI (the zvol set aside stands in), and the next call undoes
    the revert (then, for a revert, does it)."""
    reverted, untouched = _outcomes(moved)
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, config, roles = _scenario(host, moved)
        with installed(CutInside(host, host, ["zfs", "clone"])):
            with pytest.raises(Killed):
                revert(sr, roles["s2"], roles["vdi"])
        assert not host.get(zvol(sr, roles["vdi"]), meta.VDI_UUID)
        assert sorted(listed(sr)) == sorted(roles.values())
        if next_call == "revert":
            revert(sr, roles["s2"], roles["vdi"])
            assert _contents(host, sr, roles) == reverted
        else:
            call("SR.detach", sr=sr)
            call("SR.attach", configuration=config)
            assert _contents(host, sr, roles) == untouched
        assert garbage(host, sr) == []
        destroy_everything(sr)
        assert_only_the_sr_is_left(host, sr)


@pytest.mark.parametrize("next_call", ["revert", "attach"])
def test_a_killed_revert_keeps_the_moved_bookmarks_found(next_call):
    """s3's data destroyed (Xen Orchestra), its bookmark moves with the
    zvol the revert to s1 sets aside; killed after any command, the next
    call leaves the record pointing at it (step 5b), the zvol it is on
    kept, and the next delta from s3 exact."""
    from test_cbt import granules

    def setup(host):
        sr, config, roles = _scenario(host)
        held = dict(host.dataset(snapshot_name(host, sr,
                                               roles["s3"])).blocks)
        call("Volume.data_destroy", sr=sr, key=roles["s3"])
        return sr, config, roles, held

    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, _, roles, _ = setup(host)
        total = commands_run(host, lambda: revert(sr, roles["s1"],
                                                  roles["vdi"]))
    failures = []
    for n in range(1, total + 1):
        host = fakezfs.FakeZfs.with_disks()
        with installed(host):
            sr, config, roles, held = setup(host)
            stub = zvol(sr, roles["s3"])
            s3_map = host.get(stub, meta.CBT_MAP)
            with installed(CrashAfter(host, n)):
                with pytest.raises(Killed):
                    revert(sr, roles["s1"], roles["vdi"])
            if next_call == "revert":
                revert(sr, roles["s1"], roles["vdi"])
            else:
                call("SR.detach", sr=sr)
                sr = call("SR.attach", configuration=config)
            try:
                mark = host.get(stub, meta.CBT_BOOKMARK)
                assert host.exists(mark), mark
                assert host.get(stub, meta.CBT_MAP) == s3_map
                block = host.dataset(zvol(sr, roles["vdi"])).volblocksize
                host.guest_write(zvol(sr, roles["vdi"]), 90 * block, block)
                s4 = vdi_snapshot(sr, roles["vdi"])["key"]
                new = host.dataset(snapshot_name(host, sr, s4))
                got = set(granules(call(
                    "Volume.list_changed_blocks", sr=sr, key=roles["s3"],
                    key2=s4, offset=0, length=-1), new.volsize))
                assert got == _differ(held, new.blocks, block), n
                assert garbage(host, sr) == []
                destroy_everything(sr)
                assert_only_the_sr_is_left(host, sr)
            except AssertionError as exc:
                failures.append("killed after %d of %d: %r" % (n, total, exc))
    assert not failures, "\n".join(failures)
