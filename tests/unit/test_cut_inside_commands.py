"""Power cuts inside ``zfs create -o`` and ``zfs clone -o`` (volume plugin).

ZFS makes the dataset in one transaction group and sets the -o properties
in later ones (zfs_ioc_create, zfs_ioc_clone: zfs_set_prop_nvlist after
the creation; only a zvol's volsize and volblocksize go with it). A power
cut between them leaves the dataset without zfs-ng's properties; the
fake plays it with ``CutInside`` (crashpoint.py, FakeZfs.cut_next).

Volume.create: a bare <sr>/<uuid> could be an admin's zvol, so the zvol is
made as <sr>/<uuid>.new and renamed once whole; the collector frees a
.new a cut left. The datapath's windows (a reset's new zvol, the .ro
clone of a snapshot VDI) are in test_datapath.py.
"""

import uuid

import pytest

from zfsng import meta, ownership

import fakezfs
from conftest import call, check_fake_host, create_sr
from crashpoint import CrashAfter, CrashAfterCommand, CutInside, Killed, \
    commands_run, installed
from test_vdi_semantics import (  # noqa: F401 (sr is a fixture)
    GiB, datasets, garbage, listed, sr, vdi_create, vdi_snapshot, zvol)

CREATE = dict(name="new disk", description="d", size=GiB, sharable=False)


def killed_create(host, sr, runner_):
    with installed(runner_):
        with pytest.raises(Killed):
            call("Volume.create", sr=sr, **CREATE)


def left_volumes(fake, sr):
    return [n for n in datasets(fake) if n != sr and "@" not in n]


@pytest.mark.parametrize("keep", [(), ("refreservation",)],
                         ids=["bare", "reserved"])
def test_a_create_cut_before_its_properties_is_zfs_ngs_and_freed(fake, keep):
    sr, config = create_sr({"device": "/dev/sdb", "provisioning": "thick"})
    other = vdi_create(sr, name="other")["key"]
    killed_create(fake, sr, CutInside(fake, fake, ["zfs", "create"], keep))
    (left,) = [n for n in left_volumes(fake, sr) if n != zvol(sr, other)]
    # never a bare <sr>/<uuid>: a name only zfs-ng's create uses
    assert left.endswith(meta.CREATE_SUFFIX)
    assert meta.VDI_UUID not in fake.local_props(left)
    assert list(listed(sr)) == [other]
    call("SR.attach", configuration=config)        # the PBD plug: collects
    assert left_volumes(fake, sr) == [zvol(sr, other)]
    assert list(listed(sr)) == [other]


def test_a_create_cut_is_freed_by_any_later_destroy(fake, sr):
    other = vdi_create(sr, name="other")["key"]
    killed_create(fake, sr, CutInside(fake, fake, ["zfs", "create"]))
    call("Volume.destroy", sr=sr, key=other)
    assert datasets(fake) == [sr]


def test_create_makes_its_zvol_whole_before_it_has_the_vdis_name(fake, sr):
    vdi = vdi_create(sr, name="disk")
    creates = fake.ran("zfs", "create")
    assert creates[-1][-1] == meta.creating_name(sr, vdi["key"])
    assert fake.ran("zfs", "rename")[-1][-2:] == [
        meta.creating_name(sr, vdi["key"]), zvol(sr, vdi["key"])]
    assert datasets(fake) == [sr, zvol(sr, vdi["key"])]


def _create_killed_at(n):
    """Volume.create killed after its n-th command, then the PBD plug and
    xapi's retry; whether it was killed."""
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, config = create_sr()
        other = vdi_create(sr, name="other")["key"]
        runner_ = CrashAfter(host, n)
        with installed(runner_):
            try:
                call("Volume.create", sr=sr, **CREATE)
            except Killed:
                pass
        call("SR.attach", configuration=config)
        made = call("Volume.create", sr=sr, **CREATE)["key"]
        keys = set(listed(sr))
        assert set([other, made]) <= keys
        # a create killed after its rename made a whole VDI: listed
        for key in keys:
            call("Volume.destroy", sr=sr, key=key)
        assert datasets(host) == [sr]
        assert garbage(host, sr) == []
    check_fake_host(host)
    return runner_.dead


def test_a_create_killed_after_any_command_leaves_nothing_unlisted():
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, _ = create_sr()
        total = commands_run(host, lambda: call("Volume.create", sr=sr,
                                                **CREATE))
    assert total >= 3
    for n in range(1, total + 1):
        assert _create_killed_at(n), n


def row(name, **props):
    base = {"name": name, "type": "volume", "origin": None, "usedds": "0",
            meta.VDI_UUID: None, meta.DATAPATH_CLONE: None}
    base.update(props)
    return base


def test_what_counts_as_an_unfinished_create():
    sr, key = "tank", str(uuid.uuid4())
    new = meta.creating_name(sr, key)
    assert meta.is_unfinished_create(row(new, usedds="12288"))
    assert meta.is_unfinished_create(row(new, **{meta.VDI_UUID: key}))
    assert ownership.made_by_zfsng(row(new), sr)
    # not a name zfs-ng makes, not a plain zvol, not a clone, not a VDI
    # of another name, not a filesystem: an admin's
    for other in (row(sr + "/mine.new"), row(sr + "/" + key),
                  row(new, origin=sr + "/" + key + "@x"),
                  row(new, **{meta.VDI_UUID: str(uuid.uuid4())}),
                  row(new, **{meta.VDI_UUID: meta.HIDDEN}),
                  row(new, type="filesystem")):
        assert not meta.is_unfinished_create(other), other


def test_a_datapath_clone_is_unmarked_only_if_the_listing_says_so():
    """A listing without the DATAPATH_CLONE column cannot prove a .ro
    clone lost its mark: never taken for garbage."""
    sr, vol, snap = "tank", str(uuid.uuid4()), str(uuid.uuid4())
    ro = row(meta.clone_name(sr, snap), origin="%s/%s@%s" % (sr, vol, snap))
    assert meta.is_unmarked_clone(ro)
    assert ownership.made_by_zfsng(ro, sr)
    assert not meta.is_unmarked_clone(dict(ro, **{meta.DATAPATH_CLONE:
                                                  "boot-1"}))
    without = dict(ro)
    del without[meta.DATAPATH_CLONE]
    assert not meta.is_unmarked_clone(without)
    # of another snapshot than its name says, or written: not ours
    assert not meta.is_unmarked_clone(dict(
        ro, origin="%s/%s@%s" % (sr, vol, uuid.uuid4())))
    assert not meta.is_unmarked_clone(dict(ro, usedds="4096"))


# --- data_destroy's stub: the same window as Volume.create --------------------

def _tracked_snapshot(sr):
    key = vdi_create(sr, name="tracked")["key"]
    call("Volume.enable_cbt", sr=sr, key=key)
    snap = vdi_snapshot(sr, key)["key"]
    call("Volume.set", sr=sr, key=snap, k="vdi-type", v="user")
    return snap


def test_a_data_destroy_cut_inside_its_stub_keeps_the_vdi(fake):
    fake.user_value_cap = None
    sr, config = create_sr()
    snap = _tracked_snapshot(sr)
    before = listed(sr)[snap]
    with installed(CutInside(fake, fake, ["zfs", "create"])):
        with pytest.raises(Killed):
            call("Volume.data_destroy", sr=sr, key=snap)
    # no bare <sr>/<uuid> a retry would take for the stub: the snapshot
    # is still the VDI, with everything xapi set on it
    assert zvol(sr, snap) not in datasets(fake)
    assert listed(sr)[snap] == before
    call("SR.attach", configuration=config)        # the PBD plug: collects
    assert meta.creating_name(sr, snap) not in datasets(fake)
    assert call("Volume.data_destroy", sr=sr, key=snap) is None  # a retry
    after = listed(sr)[snap]
    assert after["read_write"] is False
    for field in ("name", "description", "keys", "virtual_size"):
        assert after[field] == before[field], field


def test_a_data_destroy_killed_before_its_rename_is_made_again(fake):
    fake.user_value_cap = None
    sr, _ = create_sr()
    snap = _tracked_snapshot(sr)
    before = listed(sr)[snap]
    with installed(CrashAfterCommand(fake, ["zfs", "create"])):
        with pytest.raises(Killed):
            call("Volume.data_destroy", sr=sr, key=snap)
    assert meta.creating_name(sr, snap) in datasets(fake)
    assert listed(sr)[snap] == before        # a whole .new is no VDI yet
    assert call("Volume.data_destroy", sr=sr, key=snap) is None
    assert meta.creating_name(sr, snap) not in datasets(fake)
    assert listed(sr)[snap]["keys"] == before["keys"]
