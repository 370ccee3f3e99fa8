"""content_id: what xapi's storage copies match a base by (xen-api
v26.1.4, storage_smapiv1_migrate.ml:153-392). Every zfs-ng VDI reports
one of its own, never ""; two VDIs report one only when they hold the
same data (zfsng/contentid.py). Played as xapi makes the calls:
main.ml's VDI.snapshot (Volume.snapshot, then Volume.set of content_id to
the source's key), copy_into_sr's nearest and clone, copy_into_vdi's
read, activate and claim."""

import errno
import json
import os

import pytest

from zfsng import attachstate, contentid, meta, zvoldev

from conftest import call
from test_datapath import (GUEST, DOM0, create_sr, create_volume,  # noqa
                           dataset_of, dp, host, uri_of)
# after test_datapath, which puts the datapath package on the path
from zfsng_datapath.errors import TapdiskError  # noqa: E402

GiB = 1 << 30


def stat(sr, key):
    return call("Volume.stat", sr=sr, key=key)


def cid(sr, key):
    return stat(sr, key)["keys"]["content_id"]


def ids(sr):
    """{key: content_id} of every VDI SR.ls lists."""
    return dict((v["key"], v["keys"]["content_id"])
                for v in call("SR.ls", sr=sr))


def xapi_snapshot(sr, key, content_id=None):
    """main.ml:1425-1450: Volume.snapshot, then the snapshot's keys, its
    content_id the vdi_info's: by default the source's location, its key
    (xapi_vdi.ml:836-840)."""
    snap = call("Volume.snapshot", sr=sr, key=key)["key"]
    for k, v in [("is_a_snapshot", "true"), ("snapshot_of", key),
                 ("content_id", key if content_id is None else content_id)]:
        call("Volume.set", sr=sr, key=snap, k=k, v=v)
    return snap


def set_cid(sr, key, value):
    assert call("Volume.set", sr=sr, key=key, k="content_id", v=value) \
        is None


def nearest(similars, vdis, size):
    """copy_into_sr's choice (storage_smapiv1_migrate.ml:327-352): the
    first VDI whose content_id is one of similars, in their order, and
    not larger; "" is not filtered out there."""
    for content_id in similars:
        for v in vdis:
            if v["keys"]["content_id"] == content_id and \
                    v["virtual_size"] <= size:
                return v
    return None


@pytest.fixture
def sr(host):
    return create_sr({"device": "/dev/sdb"})[0]


def disk(sr, size=GiB):
    return create_volume(sr, size=size)["key"]


# --- every VDI has one of its own ------------------------------------------

def test_every_vdi_reports_an_id_of_its_own_never_empty(sr):
    a, b = disk(sr), disk(sr)
    s1, s2 = xapi_snapshot(sr, a), xapi_snapshot(sr, a)
    c = call("Volume.clone", sr=sr, key=a)["key"]
    got = ids(sr)
    assert sorted(got) == sorted([a, b, s1, s2, c])
    assert "" not in got.values()
    # no id is any VDI's key (main.ml's snapshot passes the source's)
    assert not set(got.values()) & set(got)
    # each its own, but the clone of a disk nobody holds open: same data
    assert len(set(got.values())) == 4 and got[c] == got[a]


def test_a_snapshot_never_reports_its_parents_key_or_id(sr):
    """The bug: every snapshot of disk K reported K (main.ml:1442)."""
    k = disk(sr)
    snaps = [xapi_snapshot(sr, k) for _ in range(3)]
    got = ids(sr)
    for s in snaps:
        assert got[s] not in (k, got[k], "")
    assert len(set(got[s] for s in snaps)) == 3


def test_nothing_matches_an_empty_or_shared_id_of_an_smapiv1_sr(sr):
    """Case 4: an SMAPIv1 SR that holds copies made before (content_id ""
    or a zfs-ng key) offers them as similar: no zfs-ng VDI is then the
    nearest, so copy_into_sr makes a blank VDI and copies all of it."""
    k = disk(sr)
    xapi_snapshot(sr, k)
    disk(sr)
    call("Volume.clone", sr=sr, key=xapi_snapshot(sr, k))
    vdis = call("SR.ls", sr=sr)
    assert nearest(["", k], vdis, 2 * GiB) is None


def test_a_clone_of_a_snapshot_keeps_its_id_for_xapis_base(sr):
    """copy_into_sr clones the nearest VDI, then copy_into_vdi takes as
    sparse_dd's base the local VDI whose id is the clone's (171, 183-196):
    without the same id the copy runs with no base and -prezeroed onto
    the clone's data."""
    k = disk(sr)
    s = xapi_snapshot(sr, k)
    set_cid(sr, s, "v1-copy-of-s")      # what a copy into it claimed
    c = call("Volume.clone", sr=sr, key=s)
    assert c["keys"]["content_id"] == "v1-copy-of-s"


def test_a_clone_of_a_disk_in_use_gets_a_fresh_id(sr, monkeypatch):
    k = disk(sr)
    monkeypatch.setattr(zvoldev, "openers", lambda name: [4242])
    c = call("Volume.clone", sr=sr, key=k)["key"]
    assert cid(sr, c) not in (cid(sr, k), "")


@pytest.mark.parametrize("domain,tapdisk_died", [(GUEST, True),
                                                 (GUEST, False),
                                                 (DOM0, False)])
def test_a_clone_of_a_disk_activated_read_write_gets_a_fresh_id(
        sr, host, domain, tapdisk_died):
    """Nothing holds the zvol open at the clone (a VM's tapdisk that died
    and is not replaced yet; the fake opens no device at all), but the
    VM writes on once Datapath.activate replaced it: the source's data
    leaves the id a clone would share."""
    k = disk(sr)
    dp("Datapath.attach", uri=uri_of(stat(sr, k)), domain=domain)
    dp("Datapath.activate", uri=uri_of(stat(sr, k)), domain=domain)
    if tapdisk_died:
        host.tap.kill_tapdisk(list(host.tap.tapdisks)[0])
    assert zvoldev.openers(dataset_of(stat(sr, k))) == []
    c = call("Volume.clone", sr=sr, key=k)["key"]
    assert cid(sr, c) not in (cid(sr, k), "")


def test_a_clone_made_while_an_activate_has_not_opened_the_disk_yet(
        sr, host):
    """Datapath.activate gives the VDI a fresh id, then tapdisk opens it:
    a clone in between (here: the open refused, the retry to come) must
    not keep that id, since the VM writes once the retry opens it."""
    k = disk(sr)
    uri = uri_of(stat(sr, k))
    dp("Datapath.attach", uri=uri, domain=GUEST)
    host.tap.inject("tap-ctl open", errno.EIO)
    with pytest.raises(TapdiskError):
        dp("Datapath.activate", uri=uri, domain=GUEST)
    c = call("Volume.clone", sr=sr, key=k)["key"]
    assert cid(sr, c) not in (cid(sr, k), "")
    dp("Datapath.activate", uri=uri, domain=GUEST)
    dp("Datapath.deactivate", uri=uri, domain=GUEST)
    c2 = call("Volume.clone", sr=sr, key=k)["key"]
    assert cid(sr, c2) == cid(sr, k)       # no writer once deactivated


@pytest.mark.parametrize("then", ["activate_readonly", "deactivate"])
def test_a_clone_of_a_disk_nobody_writes_keeps_its_id(sr, then):
    """A read-only activate, or one a deactivate ended: no writer, the
    clone has the same data."""
    k = disk(sr)
    uri = uri_of(stat(sr, k))
    dp("Datapath.attach", uri=uri, domain=GUEST)
    if then == "deactivate":
        dp("Datapath.activate", uri=uri, domain=GUEST)
    dp("Datapath." + then, uri=uri, domain=GUEST)
    c = call("Volume.clone", sr=sr, key=k)["key"]
    assert cid(sr, c) == cid(sr, k)


def test_records_that_are_no_writer_are_ignored_never_fatal(sr, host):
    """The volume plugin reads what the datapath wrote: a torn, foreign or
    unknown file, or a read-only one, is no writer, and no clone fails."""
    k = disk(sr)
    dataset = dataset_of(stat(sr, k))
    os.makedirs(attachstate.RUN_DIR, exist_ok=True)
    for name, text in [("torn.json", '{"dataset": "%s", "act' % dataset),
                       ("list.json", json.dumps([dataset])),
                       ("bytes.json", b"\xff\xfe".decode("latin-1")),
                       ("ro.json", json.dumps({
                           "dataset": dataset, "domain": "9",
                           "active": True, "readonly": True})),
                       ("other.json", json.dumps({
                           "dataset": dataset + "x", "domain": "9",
                           "active": True, "readonly": False})),
                       ("rw.json.tmp", json.dumps({
                           "dataset": dataset, "domain": "9",
                           "active": True, "readonly": False}))]:
        with open(os.path.join(attachstate.RUN_DIR, name), "w",
                  encoding="latin-1") as f:
            f.write(text)
    os.makedirs(os.path.join(attachstate.RUN_DIR, "dir.json"))
    assert attachstate.writers(dataset) == []
    c = call("Volume.clone", sr=sr, key=k)["key"]
    assert cid(sr, c) == cid(sr, k)


# --- Volume.set ----------------------------------------------------------

@pytest.mark.parametrize("what", ["empty", "own key", "another key",
                                  "another id"])
def test_a_set_that_would_match_another_vdi_stores_a_fresh_one(sr, what):
    k, other = disk(sr), disk(sr)
    before = ids(sr)
    value = {"empty": "", "own key": k, "another key": other,
             "another id": before[other]}[what]
    set_cid(sr, k, value)
    after = ids(sr)
    assert after[k] not in (value, before[k], "") and \
        after[k] not in set(after[o] for o in after if o != k)
    assert after[other] == before[other]


def test_xapis_claim_after_a_copy_is_kept(sr):
    """copy_into_vdi with zfs-ng as the destination (153-297): the id is
    read (171) before the activate, the copy, then the claim (285)."""
    k = disk(sr)
    read = cid(sr, k)
    dp("Datapath.attach", uri=uri_of(stat(sr, k)), domain=DOM0)
    dp("Datapath.activate", uri=uri_of(stat(sr, k)), domain=DOM0)
    assert cid(sr, k) != read          # its data is about to change
    dp("Datapath.deactivate", uri=uri_of(stat(sr, k)), domain=DOM0)
    dp("Datapath.detach", uri=uri_of(stat(sr, k)), domain=DOM0)
    set_cid(sr, k, "9f1d0c6e-smapiv1-source")
    assert cid(sr, k) == "9f1d0c6e-smapiv1-source"
    set_cid(sr, k, "9f1d0c6e-smapiv1-source")       # 288, and retries
    assert cid(sr, k) == "9f1d0c6e-smapiv1-source"


def test_copy_into_sr_keeps_the_sources_id_on_the_snapshot(sr):
    """copy_into_sr: the copy claims the source's id (285), xapi
    snapshots it with that id (main.ml:1442, from the copy's vdi_info)
    and destroys the copy; SR.update_snapshot_info_dest then wants the
    snapshot to report the source's id (storage_mux.ml:389-408). The id
    moves to the snapshot, the copy gets a fresh one."""
    copy = disk(sr)
    set_cid(sr, copy, "src-snapshot-id")
    snap = xapi_snapshot(sr, copy, content_id="src-snapshot-id")
    got = ids(sr)
    assert got[snap] == "src-snapshot-id"
    assert got[copy] not in ("src-snapshot-id", "")
    call("Volume.destroy", sr=sr, key=copy)
    assert ids(sr)[snap] == "src-snapshot-id"


def test_an_old_content_id_in_the_keys_is_not_reported(sr, host):
    """Before this version the id was the key "content_id" of the JSON
    keys: "" or the parent's key on snapshots, maybe a stale claim."""
    k = disk(sr)
    s = call("Volume.snapshot", sr=sr, key=k)["key"]
    name = "%s/%s" % (sr, k)
    for dataset in (name, "%s@%s" % (name, s)):
        host.zfs.admin("zfs set %s=%s %s" % (
            meta.VDI_KEYS, json.dumps(json.dumps({"content_id": k})),
            dataset))
    assert "" != cid(sr, s) != k and cid(sr, k) != k
    set_cid(sr, k, "claimed")
    assert json.loads(host.zfs.get(name, meta.VDI_KEYS)) == {}


# --- volumes made before this version ---------------------------------------

def test_a_vdi_made_before_reports_a_stable_derived_id_without_writes(
        sr, host):
    k = disk(sr)
    s = call("Volume.snapshot", sr=sr, key=k)["key"]
    name = "%s/%s" % (sr, k)
    host.zfs.admin("zfs inherit %s %s" % (meta.CONTENT_ID, name))
    host.zfs.admin("zfs inherit %s %s@%s" % (meta.CONTENT_ID, name, s))
    first = ids(sr)
    mark = len(host.zfs.calls)
    assert ids(sr) == first and cid(sr, k) == first[k]
    assert host.zfs.mutations(since=mark) == []         # a read writes not
    assert "" not in first.values() and first[k] != first[s]
    assert not set(first.values()) & set(first)


def test_a_snapshot_made_before_does_not_report_its_disks_id(sr, host):
    """Snapshots inherit their zvol's user properties: a snapshot taken
    before this version, without an id of its own, would show the disk's."""
    k = disk(sr)
    s = call("Volume.snapshot", sr=sr, key=k)["key"]
    host.zfs.admin("zfs inherit %s %s/%s@%s" % (meta.CONTENT_ID, sr, k, s))
    assert json.loads(host.zfs.get("%s/%s@%s" % (sr, k, s),
                                   meta.CONTENT_ID))["of"] == k
    assert cid(sr, s) not in (cid(sr, k), "")


# --- activate ------------------------------------------------------------------

@pytest.mark.parametrize("domain", [GUEST, DOM0])
def test_a_read_write_activate_gives_a_fresh_id(sr, host, domain):
    k = disk(sr)
    set_cid(sr, k, "claimed-by-a-copy")
    uri = uri_of(stat(sr, k))
    dp("Datapath.attach", uri=uri, domain=domain)
    mark = len(host.zfs.calls)
    dp("Datapath.activate", uri=uri, domain=domain)
    after = cid(sr, k)
    assert after not in ("claimed-by-a-copy", "")
    sets = [a for a in host.zfs.mutations(since=mark)]
    assert sets == [["zfs", "set", "%s=%s" % (
        meta.CONTENT_ID, contentid.encode(after, k)), "%s/%s" % (sr, k)]]


@pytest.mark.parametrize("reader", [DOM0, "CPa1b2c3", "43"])
def test_a_read_only_activate_beside_a_writer_keeps_its_mark_and_id(
        sr, host, reader):
    """What VDI_ACTIVATE_READONLY lets xapi do while a VM writes the VDI
    in its own domain: pygrub's or an export's dom0 read, a migration
    copy's base read in its CP domain (storage_smapiv1_migrate.ml
    with_activated_disk), another VM's read-only VBD. The read neither
    renews the id nor, once deactivated, clears the VM's writer mark: a
    clone after it still gets an id of its own."""
    k = disk(sr)
    uri = uri_of(stat(sr, k))
    dp("Datapath.attach", uri=uri, domain=GUEST)
    dp("Datapath.activate", uri=uri, domain=GUEST)
    written = cid(sr, k)
    dp("Datapath.attach", uri=uri, domain=reader)
    dp("Datapath.activate_readonly", uri=uri, domain=reader)
    assert cid(sr, k) == written
    dp("Datapath.deactivate", uri=uri, domain=reader)
    dp("Datapath.detach", uri=uri, domain=reader)
    assert attachstate.writers(dataset_of(stat(sr, k))) == [GUEST]
    c = call("Volume.clone", sr=sr, key=k)["key"]
    assert cid(sr, c) not in (cid(sr, k), "")
    assert cid(sr, k) == written


def test_a_read_only_activate_keeps_the_id(sr, host):
    k = disk(sr)
    s = xapi_snapshot(sr, k)
    before = ids(sr)
    for key, method in ((k, "Datapath.activate_readonly"),
                        (s, "Datapath.activate")):
        uri = uri_of(stat(sr, key))
        dp("Datapath.attach", uri=uri, domain=GUEST)
        dp(method, uri=uri, domain=GUEST)
    assert ids(sr) == before
