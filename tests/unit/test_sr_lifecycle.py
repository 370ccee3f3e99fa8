"""SR.attach / detach / destroy / probe.

Ownership rule: zfs-ng exports, destroys and cleans only pools it created;
on adopted storage it touches nothing but the SR's own child dataset.
"""

import io
import json
import sys
import threading

import pytest

from zfsng import errors, meta, wire, zfs
from zfsng_volume import cleanup

from conftest import SR_UUID, SR_UUID2, call, create_sr, create_volume, \
    handlers
from crashpoint import Killed


def adopted(fake, uuid=SR_UUID, config=None):
    """An SR on the admin's pool "data" (/dev/sdc): (sr, config)."""
    fake.admin("zpool create -m none data /dev/sdc")
    return create_sr(config or {"zpool": "data"}, uuid=uuid, name="adopted")


# --- attach / detach ---------------------------------------------------------

def test_attach_returns_the_dataset_and_is_repeatable(fake):
    sr, stored = create_sr()
    assert sr == "tank"
    assert call("SR.attach", configuration=stored) == "tank"
    assert call("SR.stat", sr=sr)["uuid"] == SR_UUID
    assert not fake.ran("zpool", "import")


def test_detach_exports_an_owned_pool(fake):
    sr, stored = create_sr()
    call("SR.detach", sr=sr)
    assert fake.ran("zpool", "export") == [["zpool", "export", "--", "tank"]]
    assert fake.imported() == []
    with pytest.raises(errors.Sr_not_attached):
        call("SR.stat", sr=sr)


@pytest.mark.parametrize("method", ["SR.detach", "SR.destroy"])
def test_detach_and_destroy_are_repeatable(fake, method):
    sr, _ = create_sr()
    call(method, sr=sr)
    mark = len(fake.calls)
    assert call(method, sr=sr) is None
    assert fake.mutations(since=mark) == []


def test_attach_detach_attach(fake):
    sr, stored = create_sr(description="kept")
    guid = stored["pool-guid"]
    call("SR.detach", sr=sr)
    assert call("SR.attach", configuration=stored) == "tank"
    [argv] = fake.ran("zpool", "import")
    assert argv[-2:] == ["--", guid]
    assert "cachefile=none" in argv and "readonly=on" not in argv
    assert fake.pool("tank").props["cachefile"] == "none"
    assert not fake.pool("tank").readonly
    stat = call("SR.stat", sr=sr)
    assert (stat["uuid"], stat["description"]) == (SR_UUID, "kept")
    call("SR.detach", sr=sr)
    assert call("SR.attach", configuration=stored) == "tank"
    assert fake.imported() == ["tank"]


def test_attach_finds_a_renamed_pool_by_guid(fake):
    sr, stored = create_sr()
    call("SR.detach", sr=sr)
    fake.admin("zpool import %s renamed" % stored["pool-guid"])
    fake.admin("zpool export renamed")
    assert call("SR.attach", configuration=stored) == "renamed"
    assert call("SR.stat", sr="renamed")["uuid"] == SR_UUID


def test_detach_of_an_adopted_sr_never_exports(fake):
    sr, stored = adopted(fake)
    assert sr == "data/zfsng-" + SR_UUID
    mark = len(fake.calls)
    call("SR.detach", sr=sr)
    assert fake.mutations(since=mark) == []
    assert fake.imported() == ["data"]
    assert call("SR.attach", configuration=stored) == sr


def test_attach_of_an_adopted_sr_never_imports(fake):
    sr, stored = adopted(fake)
    fake.admin("zpool export data")
    with pytest.raises(errors.SrNotFound) as info:
        call("SR.attach", configuration=stored)
    assert "import it" in info.value.message
    assert not fake.ran("zpool", "import")


def test_attach_adopted_without_guid(fake):
    sr, _ = adopted(fake)
    assert call("SR.attach", configuration={"zpool": "data"}) == sr
    assert call("SR.attach", configuration={
        "zpool": "data", "sr_uuid": SR_UUID}) == sr


def test_attach_needs_to_know_which_sr(fake):
    adopted(fake, uuid=SR_UUID)
    call("SR.create", uuid=SR_UUID2, configuration={"zpool": "data"},
         name="second", description="")
    with pytest.raises(errors.InvalidConfiguration) as info:
        call("SR.attach", configuration={"zpool": "data"})
    assert "sr_uuid" in info.value.message
    assert call("SR.attach", configuration={
        "zpool": "data", "sr_uuid": SR_UUID2}) == "data/zfsng-" + SR_UUID2


def test_attach_without_guid_or_source(fake):
    create_sr()
    with pytest.raises(errors.InvalidConfiguration) as info:
        call("SR.attach", configuration={"device": "/dev/sdb"})
    assert "pool-guid" in info.value.message


def test_attach_an_unknown_sr_uuid(fake):
    sr, stored = create_sr()
    with pytest.raises(errors.SrNotFound) as info:
        call("SR.attach", configuration=dict(stored, sr_uuid=SR_UUID2))
    assert "xe sr-forget uuid=" + SR_UUID2 in info.value.message


def test_attach_a_pool_that_is_gone(fake):
    sr, stored = create_sr()
    fake.admin("zpool destroy tank")
    with pytest.raises(errors.SrNotFound) as info:
        call("SR.attach", configuration=stored)
    assert stored["pool-guid"] in info.value.message
    assert info.value.message.endswith("xe sr-forget uuid=" + SR_UUID)
    assert fake.imported() == []


def test_attach_refuses_bad_configuration_before_running_anything(fake):
    with pytest.raises(errors.InvalidConfiguration):
        call("SR.attach", configuration={"pool-guid": "1; reboot"})
    assert fake.calls == []


def test_volumes_come_back_after_detach(fake):
    """The zvols of an exported SR come back with their metadata (the pool
    is imported by hand here: SR.attach stalls, see the next test)."""
    sr, stored = create_sr()
    volume = create_volume(sr, name="keep me")
    call("SR.detach", sr=sr)
    fake.admin("zpool import -o cachefile=none %s" % stored["pool-guid"])
    assert [v["name"] for v in call("SR.ls", sr=sr)] == ["keep me"]
    assert call("Volume.stat", sr=sr, key=volume["key"]) == volume


def test_attach_with_volumes_does_not_stall(fake):
    sr, stored = create_sr()
    create_volume(sr)
    call("SR.detach", sr=sr)
    done = threading.Event()

    def attach():
        try:
            call("SR.attach", configuration=stored)
        finally:
            done.set()

    thread = threading.Thread(target=attach)
    thread.daemon = True
    thread.start()
    assert done.wait(1.0), "SR.attach still waiting after 1 s"


# --- destroy -----------------------------------------------------------------

def test_destroy_refuses_while_vdis_exist(fake):
    sr, _ = create_sr()
    create_volume(sr)
    create_volume(sr)
    mark = len(fake.calls)
    with pytest.raises(errors.SrNotEmpty) as info:
        call("SR.destroy", sr=sr)
    assert info.value.code == "SR_NOT_EMPTY"
    assert "2 VDI" in info.value.message
    assert fake.mutations(since=mark) == []
    assert fake.imported() == ["tank"]


def test_destroy_owned_pool(fake):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    call("SR.destroy", sr=sr)
    assert fake.ran("zpool", "destroy") == [["zpool", "destroy", "--",
                                             "tank"]]
    assert fake.imported() == []
    assert fake.pool("tank", state="DESTROYED")


def test_destroy_owned_pool_wipes_the_disks(fake):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    call("SR.destroy", sr=sr)
    assert fake.ran("wipefs") == [["wipefs", "-a", "/dev/sdb"],
                                  ["wipefs", "-a", "/dev/sdc"]]
    for disk in ("/dev/sdb", "/dev/sdc"):
        dev = fake.devices[disk]
        assert (dev.signatures, dev.children, dev.label) == ([], [], None)


def test_destroy_owned_pool_clears_every_leaf_label(fake):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc log /dev/sdd"})
    call("SR.destroy", sr=sr)
    assert fake.ran("zpool", "labelclear") == [
        ["zpool", "labelclear", "-f", "--", "/dev/sdb1"],
        ["zpool", "labelclear", "-f", "--", "/dev/sdc1"],
        ["zpool", "labelclear", "-f", "--", "/dev/sdd1"]]


def test_destroyed_disks_are_reusable_without_force(fake):
    sr, _ = create_sr()
    call("SR.destroy", sr=sr)
    sr, _ = create_sr(uuid=SR_UUID2, name="again")
    assert sr == "again"
    assert [leaf.path for leaf in fake.pool("again").leaves()] == ["/dev/sdb1"]


def test_destroy_survives_a_failing_wipe(fake):
    sr, _ = create_sr()
    fake.inject("wipefs", "wipefs: error: /dev/sdb: probing initialization "
                "failed: Device or resource busy\n", times=-1)
    assert call("SR.destroy", sr=sr) is None
    assert fake.imported() == []


def test_destroy_adopted_sr_touches_only_its_dataset(fake):
    sr, _ = adopted(fake)
    fake.admin("zfs create data/backups")
    fake.admin("zfs create -V 1G data/adminvol")
    mark = len(fake.calls)
    call("SR.destroy", sr=sr)
    assert fake.mutations(since=mark) == [["zfs", "destroy", "-r", "--", sr]]
    assert not fake.exists(sr)
    assert fake.imported() == ["data"]
    assert fake.exists("data/backups") and fake.exists("data/adminvol")


# --- a destroy whose answer was lost ---------------------------------------

def _sr_of(fake, kind):
    """(sr, config) of an SR on its own pool, or on the admin's pool."""
    return create_sr() if kind == "pool" else adopted(fake)


@pytest.mark.parametrize("kind", ["pool", "adopted"])
def test_the_retry_of_a_destroy_whose_answer_was_lost_succeeds(fake, kind):
    """SR.destroy did all its work, but xapi never got its answer: it
    detaches the SR (as after any failed destroy), and the admin's retry
    (SR.attach, the daemon's SR.stat of its answer, SR.destroy) succeeds,
    so xapi forgets the SR. The retry changes nothing."""
    sr, config = _sr_of(fake, kind)
    call("SR.destroy", sr=sr)                       # the answer lost
    call("SR.detach", sr=sr)
    mark = len(fake.calls)
    left = call("SR.attach", configuration=config)
    assert left == sr + "#destroyed-" + SR_UUID
    record = call("SR.stat", sr=left)
    assert record["health"][0] == "Unavailable"
    assert "sr-destroy" in record["health"][1]
    with pytest.raises(errors.Sr_not_attached):
        call("SR.ls", sr=left)
    assert call("SR.destroy", sr=left) is None
    assert call("SR.detach", sr=left) is None
    assert [m for m in fake.mutations(since=mark)     # but a failed import
            if m[:2] != ["zpool", "import"]] == []
    with pytest.raises(errors.Sr_not_attached):     # no record, no SR
        call("SR.stat", sr=sr + "#destroyed-" + SR_UUID2)


def _gone_by_hand(fake, kind, sr):
    fake.admin("zpool destroy tank" if kind == "pool" else
               "zfs destroy -r " + sr)


@pytest.mark.parametrize("kind", ["pool", "adopted"])
def test_a_missing_sr_no_destroy_of_which_is_recorded_says_what_to_do(
        fake, kind):
    """Its pool or dataset destroyed by hand: zfs-ng cannot tell that from
    storage lost; the error says how to check, and to forget the SR."""
    sr, config = _sr_of(fake, kind)
    _gone_by_hand(fake, kind, sr)
    with pytest.raises(errors.SrNotFound) as info:
        call("SR.attach", configuration=config)
    assert info.value.message.endswith("xe sr-forget uuid=" + SR_UUID)
    assert "really gone" in info.value.message


@pytest.mark.parametrize("kind", ["pool", "adopted"])
def test_a_failed_destroy_leaves_no_record_that_it_was_done(fake, kind):
    """A destroy refused by ZFS leaves the SR as it was: its storage lost
    later is not taken for destroyed."""
    sr, config = _sr_of(fake, kind)
    fake.inject("zpool destroy" if kind == "pool" else "zfs destroy",
                "cannot destroy '%s': Input/output error" % sr)
    with pytest.raises(errors.ZfsError):
        call("SR.destroy", sr=sr)
    assert call("SR.stat", sr=sr)["uuid"] == SR_UUID
    _gone_by_hand(fake, kind, sr)
    with pytest.raises(errors.SrNotFound):
        call("SR.attach", configuration=config)


def test_a_destroy_killed_before_it_destroyed_anything_is_forgotten(
        fake, monkeypatch):
    """Killed before ``zfs destroy -r`` did anything, its record saved:
    the next attach finds the SR, and the record goes with it (the
    dataset lost later is not taken for destroyed)."""
    sr, config = adopted(fake)

    def killed(*args, **kwargs):
        raise Killed("killed inside zfs destroy")
    with monkeypatch.context() as patch:
        patch.setattr(zfs, "destroy", killed)
        with pytest.raises(Killed):
            call("SR.destroy", sr=sr)
    assert cleanup.destroy_record(SR_UUID)
    assert call("SR.attach", configuration=config) == sr
    assert cleanup.destroy_record(SR_UUID) is None
    _gone_by_hand(fake, "adopted", sr)
    with pytest.raises(errors.SrNotFound):
        call("SR.attach", configuration=config)


def test_a_recorded_destroy_of_a_dataset_needs_its_pool_to_prove_it(fake):
    """The adopted SR's dataset destroyed, then the admin's pool exported:
    the dataset's absence cannot be seen, so it is not taken for proved."""
    sr, config = adopted(fake)
    call("SR.destroy", sr=sr)
    fake.admin("zpool export data")
    with pytest.raises(errors.SrNotFound):
        call("SR.attach", configuration=config)
    fake.admin("zpool import data")
    assert call("SR.attach", configuration=config) == \
        sr + "#destroyed-" + SR_UUID


@pytest.mark.parametrize("method", ["SR.destroy", "SR.detach"])
def test_a_dataset_inside_an_sr_is_no_sr(fake, method):
    sr, _ = create_sr()
    create_volume(sr)
    fake.admin("zfs create tank/plain")
    mark = len(fake.calls)
    try:
        call(method, sr="tank/plain")
    except errors.Sr_not_attached:
        pass
    assert fake.mutations(since=mark) == []
    assert fake.imported() == ["tank"]


def test_destroy_adopted_with_vdis_refused(fake):
    sr, _ = adopted(fake)
    create_volume(sr)
    mark = len(fake.calls)
    with pytest.raises(errors.SrNotEmpty):
        call("SR.destroy", sr=sr)
    assert fake.mutations(since=mark) == []


# --- probe -------------------------------------------------------------------

def _check_probe(results):
    for result in results:
        if "sr_uuid" in result["configuration"]:
            assert result["complete"] is True
            assert result["sr"]["uuid"] == result["configuration"]["sr_uuid"]
    return results


def test_probe_exported_pool_by_device(fake):
    sr, stored = create_sr(description="probe me")
    call("SR.detach", sr=sr)
    mark = len(fake.calls)
    [result] = _check_probe(call("SR.probe",
                                 configuration={"device": "/dev/sdb"}))
    assert result["configuration"] == stored
    assert result["complete"] is True
    assert result["sr"]["sr"] == "tank"
    assert result["sr"]["description"] == "probe me"
    assert result["extra_info"] == {}
    assert fake.imported() == []                 # exported again
    [imp] = [a for a in fake.ran("zpool", "import", since=mark)
             if "--" in a]
    assert imp[imp.index("readonly=on") - 1] == "-o"
    assert "-N" in imp and "cachefile=none" in imp
    assert imp[imp.index("/dev/sdb1") - 1] == "-d"
    writes = [a for a in fake.mutations(since=mark)
              if a[:2] not in (["zpool", "import"], ["zpool", "export"])]
    assert writes == []


def test_probe_result_attaches(fake):
    sr, _ = create_sr()
    call("SR.detach", sr=sr)
    [result] = call("SR.probe", configuration={"device": "/dev/sdb"})
    assert call("SR.attach", configuration=result["configuration"]) == sr


def test_probe_imported_pool_by_device(fake):
    sr, stored = create_sr()
    results = _check_probe(call("SR.probe",
                                configuration={"device": "/dev/sdb"}))
    assert [r["configuration"] for r in results] == [stored]


def test_probe_imported_pool_leaves_it_imported(fake):
    sr, stored = create_sr()
    call("SR.probe", configuration={"device": "/dev/sdb"})
    assert fake.imported() == ["tank"]
    assert not fake.ran("zpool", "export")


def test_probe_adopted_pool_by_name(fake):
    sr, stored = adopted(fake)
    [result] = _check_probe(call("SR.probe",
                                 configuration={"zpool": "data"}))
    assert result["configuration"] == stored
    assert result["sr"]["sr"] == sr


def test_probe_everything(fake):
    create_sr()
    call("SR.create", uuid=SR_UUID2, configuration={
        "device": "/dev/sdc", "pool-name": "second"}, name="second",
        description="")
    call("SR.detach", sr="second")
    results = _check_probe(call("SR.probe", configuration={}))
    assert sorted(r["sr"]["sr"] for r in results) == ["second", "tank"]
    assert sorted(r["configuration"]["sr_uuid"] for r in results) == \
        sorted([SR_UUID, SR_UUID2])
    assert fake.imported() == ["tank"]


def test_probe_without_source_gives_an_attachable_configuration(fake):
    sr, _ = create_sr()
    call("SR.detach", sr=sr)
    [result] = call("SR.probe", configuration={})
    assert call("SR.attach", configuration=result["configuration"]) == sr


def test_probe_without_source_then_attach_answers_json(
        fake, monkeypatch, capsys):
    """Whatever the bug above does, the wire answers one JSON value."""
    sr, _ = create_sr()
    call("SR.detach", sr=sr)
    [result] = call("SR.probe", configuration={})
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(
        {"dbg": "x", "configuration": result["configuration"]})))
    rc = wire.main(["SR.attach", "--json"], wire.VOLUME_INTERFACES,
                   handlers())
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    answer = json.loads(out)
    assert answer == sr if rc == 0 else answer["code"] == "SR_BACKEND_FAILURE"


def test_probe_blank_device(fake):
    assert call("SR.probe", configuration={"device": "/dev/sde"}) == []
    assert fake.mutations() == []


def test_probe_pool_without_sr(fake):
    fake.admin("zpool create -m none other /dev/sdc")
    fake.admin("zpool export other")
    assert call("SR.probe", configuration={"device": "/dev/sdc"}) == []
    assert fake.imported() == []


def test_probe_exports_again_when_reading_fails(fake):
    sr, _ = create_sr()
    call("SR.detach", sr=sr)
    fake.inject("zfs get", "internal error: Invalid exchange\n")
    with pytest.raises(errors.ZfsError):
        call("SR.probe", configuration={"device": "/dev/sdb"})
    assert fake.imported() == []


def test_probe_reads_a_pool_whose_name_is_taken(fake):
    """An imported pool has the exported SR's pool name: probe reads it
    under a temporary name, read-only, which its labels never keep."""
    sr, stored = create_sr()
    call("SR.detach", sr=sr)
    fake.admin("zpool create -m none tank /dev/sdd")   # same name, imported
    [result] = call("SR.probe", configuration={"device": "/dev/sdb"})
    assert result["configuration"] == stored
    assert result["sr"]["uuid"] == SR_UUID
    assert fake.imported() == ["tank"]
    assert meta.SR_UUID not in fake.local_props("tank")
    assert fake.pool("tank", state="EXPORTED").guid == stored["pool-guid"]
    assert fake.devices["/dev/sdb1"].label["pool"] == "tank"


def test_probe_skips_a_pool_it_cannot_import(fake):
    sr, _ = create_sr()
    call("SR.detach", sr=sr)
    fake.inject("zpool import -o cachefile=none -o readonly=on",
                "cannot import 'tank': I/O error\n")
    assert call("SR.probe", configuration={"device": "/dev/sdb"}) == []
    assert fake.imported() == []


def test_two_srs_named_alike_both_attach(fake):
    """SR "tank" created while another SR "tank" was detached took the
    pool name: attaching the first imports its pool under another name,
    for good, and both SRs work side by side."""
    first, stored1 = create_sr(name="tank")
    call("SR.detach", sr=first)
    second, stored2 = create_sr({"device": "/dev/sdc"}, uuid=SR_UUID2,
                                name="tank")
    assert second == "tank"
    renamed = call("SR.attach", configuration=stored1)
    assert renamed == "zfsng-" + SR_UUID[:8]
    assert fake.imported() == sorted(["tank", renamed])
    assert call("SR.stat", sr=renamed)["uuid"] == SR_UUID
    assert call("SR.stat", sr="tank")["uuid"] == SR_UUID2
    create_volume(renamed, name="one")
    create_volume("tank", name="two")
    call("SR.detach", sr=renamed)
    assert call("SR.attach", configuration=stored1) == renamed   # kept
    assert [v["name"] for v in call("SR.ls", sr=renamed)] == ["one"]


def test_renaming_import_falls_back_to_the_guid(fake):
    first, stored = create_sr(name="tank")
    call("SR.detach", sr=first)
    fake.admin("zpool create -m none tank /dev/sdc")
    fake.admin("zpool create -m none zfsng-%s /dev/sdd" % SR_UUID[:8])
    name = call("SR.attach", configuration=stored)
    assert name == "zfsng-" + stored["pool-guid"]
    assert call("SR.stat", sr=name)["uuid"] == SR_UUID


def test_probe_refuses_bad_configuration(fake):
    with pytest.raises(errors.InvalidConfiguration):
        call("SR.probe", configuration={"device": "/dev/sdb;id"})
    assert fake.calls == []


@pytest.mark.parametrize("config", [
    {"device": "/dev/sdx"}, {"device": "/dev/sdb,/dev/sdx"},
    {"vdev": "mirror /dev/sdx /dev/sdy"},
    {"file-uri": "file:///dev/disk/by-id/gone"}])
def test_probe_of_a_missing_device_reports_no_sr(fake, config):
    """Without a device to look in, zpool import scans every disk: a
    missing device must not report every exported SR of the host."""
    sr, _ = create_sr()
    call("SR.detach", sr=sr)
    mark = len(fake.calls)
    with pytest.raises(errors.DeviceNotFound) as info:
        call("SR.probe", configuration=config)
    assert "/dev/sd" in info.value.message or "gone" in info.value.message
    assert fake.mutations(since=mark) == []
    assert not fake.ran("zpool", "import", since=mark)


# --- locks -------------------------------------------------------------------

@pytest.mark.parametrize("method", ["SR.destroy", "SR.detach"])
def test_destroy_and_detach_wait_for_the_sr_lock(fake, monkeypatch, method):
    """A Volume call holds the SR lock: destroying or exporting the pool
    under it must wait (here: give up, SrBusy) and change nothing."""
    from zfsng import lock
    sr, _ = create_sr()
    monkeypatch.setattr(lock, "WAIT", 0.2)
    mark = len(fake.calls)
    with lock.sr_lock(sr):
        with pytest.raises(errors.SrBusy):
            call(method, sr=sr)
    assert fake.mutations(since=mark) == []
    assert fake.imported() == ["tank"]
    call(method, sr=sr)          # once the lock is free, it goes on
    assert fake.imported() == []


def test_one_lock_order_everywhere():
    """The global lock before an SR lock, never the other way round: sr.py
    nests them only as "global_lock(), sr_lock(...)", probe.py takes the
    global lock alone (never an SR lock), and nothing else in the volume
    plugin takes the global lock."""
    import os
    import re
    from zfsng_volume import sr as srmod
    here = os.path.dirname(srmod.__file__)
    for name in os.listdir(here):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(here, name)) as f:
            text = f.read()
        takes_global = re.findall(r"with [^\n]*global_lock\(\)[^\n]*", text)
        if name == "probe.py":
            assert "sr_lock" not in text
        elif name != "sr.py":
            assert not takes_global, (name, takes_global)
        for line in takes_global:
            assert line.index("global_lock") < line.find("sr_lock") or \
                "sr_lock" not in line, line


# --- destroy wipes only the pool's own members ---------------------------------

def blank(fake, disk):
    dev = fake.devices[disk]
    return (dev.signatures, dev.children, dev.label) == ([], [], None)


def test_destroy_never_wipes_a_disk_that_took_a_members_name(fake):
    """After a reboot the pool's second disk is /dev/sdg, and a new disk
    (the admin's, with a filesystem) is /dev/sdc, the name SR.create was
    given: it is no member, and keeps its data."""
    sr, stored = create_sr({"device": "/dev/sdb,/dev/sdc"})
    call("SR.detach", sr=sr)
    fake.rename_disk("/dev/sdc", "/dev/sdg")
    fake.add_disk("/dev/sdc", fs="ext4")
    sr = call("SR.attach", configuration=stored)
    mark = len(fake.calls)
    call("SR.destroy", sr=sr)
    assert fake.devices["/dev/sdc"].signatures == [
        {"TYPE": "ext4", "USAGE": "filesystem"}]
    assert not [a for a in fake.mutations(since=mark)
                if "/dev/sdc" in a or "/dev/sdc1" in a]
    assert blank(fake, "/dev/sdb")
    # the renamed member loses its label; its partition table, which
    # SR.create was not given under this name, stays
    assert fake.devices["/dev/sdg1"].label is None


def test_destroy_after_zpool_replace_spares_the_replaced_disk(fake):
    """The admin replaced /dev/sdc by /dev/sdd and put a filesystem on
    /dev/sdc: SR.destroy leaves it; /dev/sdd, a member now, loses its ZFS
    label (its partition table stays: zfs-ng was not given it)."""
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    fake.replace("tank", "/dev/sdc1", "/dev/sdd")
    fake.admin("wipefs -a /dev/sdc")
    fake.devices["/dev/sdc"].signatures = [{"TYPE": "xfs"}]
    mark = len(fake.calls)
    call("SR.destroy", sr=sr)
    assert fake.devices["/dev/sdc"].signatures == [{"TYPE": "xfs"}]
    assert not [a for a in fake.mutations(since=mark)
                if a[-1].startswith("/dev/sdc")]
    assert blank(fake, "/dev/sdb")
    assert fake.devices["/dev/sdd1"].label is None
    assert fake.devices["/dev/sdd"].signatures[0]["PTTYPE"] == "gpt"


def test_destroy_leaves_a_leaf_whose_label_is_another_vdev(fake):
    """The pool lists /dev/sdc1, but the label there is another vdev's
    (a disk renamed under an imported pool): not cleaned."""
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    fake.replace("tank", "/dev/sdc1", "/dev/sdd")
    leaf = fake.pool("tank").vdevs[0].leaves[1]
    leaf.path = "/dev/sdc1"          # the stale label of the old member
    call("SR.destroy", sr=sr)
    assert fake.devices["/dev/sdc1"].label is not None
    assert not fake.ran("wipefs", "-a", "/dev/sdc")
    assert not fake.ran("zpool", "labelclear", "-f", "--", "/dev/sdc1")
    assert blank(fake, "/dev/sdb")


def test_create_names_disks_by_id(fake):
    """Disks given by kernel name go into the pool and SR_DEVICES by their
    /dev/disk/by-id name; the stored configuration keeps what was given."""
    fake.add_disk("/dev/sdf", by_id="wwn-0x5000c500a1b2c3d4")
    fake.links["/dev/disk/by-id/ata-ST4000_Z1Z2"] = "/dev/sdf"
    fake.add_disk("/dev/sdg", by_id="nvme-Samsung_SSD_970_S1")
    stored = call("SR.create", uuid=SR_UUID, name="tank", description="",
                  configuration={"vdev": "mirror /dev/sdf /dev/sdg"})
    assert stored["vdev"] == "mirror /dev/sdf /dev/sdg"
    [argv] = fake.ran("zpool", "create")
    assert argv[-3:] == ["mirror", "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4",
                         "/dev/disk/by-id/nvme-Samsung_SSD_970_S1"]
    assert json.loads(fake.local_props("tank")[meta.SR_DEVICES]) == [
        "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4",
        "/dev/disk/by-id/nvme-Samsung_SSD_970_S1"]
    assert [leaf.path for leaf in fake.pool("tank").leaves()] == [
        "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4-part1",
        "/dev/disk/by-id/nvme-Samsung_SSD_970_S1-part1"]


def test_by_id_disks_are_wiped_whatever_their_name_now(fake):
    fake.add_disk("/dev/sdf", by_id="ata-DISK_ONE")
    fake.add_disk("/dev/sdg", by_id="ata-DISK_TWO")
    sr, stored = create_sr({"device": "/dev/sdf,/dev/sdg"})
    call("SR.detach", sr=sr)
    fake.rename_disk("/dev/sdf", "/dev/sdh")   # a reboot swaps names
    fake.rename_disk("/dev/sdg", "/dev/sdf")
    fake.add_disk("/dev/sdg", fs="ext4")       # and a new disk arrives
    sr = call("SR.attach", configuration=stored)
    call("SR.destroy", sr=sr)
    assert blank(fake, "/dev/sdh") and blank(fake, "/dev/sdf")
    assert fake.devices["/dev/sdg"].signatures[0]["TYPE"] == "ext4"
    assert sorted(a[-1] for a in fake.ran("wipefs")) == [
        "/dev/disk/by-id/ata-DISK_ONE", "/dev/disk/by-id/ata-DISK_TWO"]


def test_destroy_cleans_log_cache_and_spare_disks(fake):
    """Cache and spare labels name no pool (blkid does not even see them):
    they are proved by their vdev guid."""
    fake.add_disk("/dev/sdf")
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc log /dev/sdd "
                               "cache /dev/sde spare /dev/sdf"})
    call("SR.destroy", sr=sr)
    for disk in ("/dev/sdb", "/dev/sdc", "/dev/sdd", "/dev/sde", "/dev/sdf"):
        assert blank(fake, disk), disk


def test_destroy_of_a_partition_clears_only_its_label(fake):
    part = fake.add_partition("/dev/sdb", 3)
    sr, _ = create_sr({"device": part})
    call("SR.destroy", sr=sr)
    assert fake.devices[part].label is None
    assert not fake.ran("wipefs")
    assert fake.devices["/dev/sdb"].signatures[0]["PTTYPE"] == "gpt"


# --- destroy refuses what zfs-ng did not make -----------------------------------

OTHER_DATA = {
    "filesystem": (["zfs create tank/backups"], ["tank/backups"]),
    "zfs recv copy": (["zfs create -V 1G -o org.xcp-ng.zfs-ng:vdi="
                       "0e7d3f5c-2b1a-4c9d-8e6f-1a2b3c4d5e6f tank/copy"],
                      ["tank/copy"]),
    "admin zvol": (["zfs create -V 1G tank/adminvol",
                    "zfs snapshot tank/adminvol@s"], ["tank/adminvol"]),
    "pool snapshot": (["zfs snapshot tank@before"], ["tank@before"]),
    "nested": (["zfs create tank/a", "zfs create tank/a/b",
                "zfs snapshot tank/a/b@x"], ["tank/a"]),
}


@pytest.mark.parametrize("case", sorted(OTHER_DATA))
def test_destroy_refuses_data_zfsng_did_not_make(fake, case):
    commands, named = OTHER_DATA[case]
    sr, _ = create_sr()
    for command in commands:
        fake.admin(command)
    mark = len(fake.calls)
    with pytest.raises(errors.SrHoldsOtherData) as info:
        call("SR.destroy", sr=sr)
    for name in named:
        assert name in info.value.message
    assert fake.mutations(since=mark) == []
    assert fake.imported() == ["tank"]
    assert info.value.params()[0] == "SrHoldsOtherData"


def test_destroy_refuses_an_admins_snapshot_of_a_hidden_parent(fake):
    """A hidden zvol (its VDI destroyed, a clone still needing it) with
    the admin's own snapshot: the snapshot is the admin's."""
    sr, _ = create_sr()
    vdi = create_volume(sr)
    snap = call("Volume.snapshot", sr=sr, key=vdi["key"])
    clone = call("Volume.clone", sr=sr, key=snap["key"])
    fake.admin("zfs snapshot tank/%s@mine" % vdi["key"])
    for key in (vdi["key"], snap["key"], clone["key"]):
        call("Volume.destroy", sr=sr, key=key)
    with pytest.raises(errors.SrHoldsOtherData) as info:
        call("SR.destroy", sr=sr)
    assert "tank/%s@mine" % vdi["key"] in info.value.message


def test_destroy_of_an_adopted_sr_refuses_data_below_it(fake):
    sr, _ = adopted(fake)
    fake.admin("zfs create %s/keep" % sr)
    mark = len(fake.calls)
    with pytest.raises(errors.SrHoldsOtherData) as info:
        call("SR.destroy", sr=sr)
    assert sr + "/keep" in info.value.message
    assert fake.mutations(since=mark) == []


def test_zfsngs_own_leftovers_do_not_block_destroy(fake):
    """Hidden parents awaiting collection, a datapath clone, a reset point,
    an internal snapshot: zfs-ng's own, destroyed with the pool."""
    sr, _ = create_sr()
    hidden = "tank/0e7d3f5c-2b1a-4c9d-8e6f-1a2b3c4d5e6f"
    fake.admin("zfs create -V 1G -o org.xcp-ng.zfs-ng:vdi=destroyed %s"
               % hidden)
    fake.admin("zfs snapshot %s@zfsng-nonpersistent" % hidden)
    fake.admin("zfs snapshot %s@zfsng-clone-1c2d3e4f-5a6b-4c7d-8e9f-"
               "0a1b2c3d4e5f" % hidden)
    fake.admin("zfs create -V 1G -o org.xcp-ng.zfs-ng:datapath-clone=x "
               "tank/5f6e7d8c-9b0a-4c1d-8e2f-3a4b5c6d7e8f.ro")
    call("SR.destroy", sr=sr)
    assert fake.imported() == []


@pytest.mark.parametrize("exported", [False, True])
def test_probe_finds_a_pool_on_by_id_names_by_kernel_name(fake, exported):
    fake.add_disk("/dev/sdf", by_id="ata-DISK_F")
    sr, stored = create_sr({"device": "/dev/sdf"})
    assert fake.pool("tank").leaves()[0].path == \
        "/dev/disk/by-id/ata-DISK_F-part1"
    if exported:
        call("SR.detach", sr=sr)
    [found] = call("SR.probe", configuration={"device": "/dev/sdf"})
    assert found["configuration"]["sr_uuid"] == SR_UUID
    [found] = call("SR.probe", configuration={
        "device": "/dev/disk/by-id/ata-DISK_F"})
    assert found["configuration"]["sr_uuid"] == SR_UUID
