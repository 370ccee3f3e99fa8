"""Volume.create / stat / destroy, and what SR.ls shows.

A VDI is a zvol <sr>/<uuid> whose own uuid is in its local ``vdi``
property; anything else in the pool (an admin's zvol or snapshot, even one
that inherits the property) is never listed.
"""

import json

import pytest

from zfsng import errors, meta

import fakezfs
from conftest import SR_UUID, call, create_sr, create_volume

GiB, MiB, KiB = fakezfs.GiB, fakezfs.MiB, fakezfs.KiB


@pytest.fixture
def sr(fake):
    return create_sr()[0]


def zvol(volume):
    return "tank/" + volume["key"]


def created(fake):
    """The one 'zfs create -V' argv that ran."""
    [argv] = [a for a in fake.ran("zfs", "create") if "-V" in a]
    return argv


# --- create ------------------------------------------------------------------

@pytest.mark.parametrize("size,expected", [
    (1, 16 * KiB), (512, 16 * KiB), (16 * KiB - 1, 16 * KiB),
    (16 * KiB, 16 * KiB), (16 * KiB + 1, 32 * KiB), (GiB, GiB),
    (GiB + 1, GiB + 16 * KiB), (10 * GiB - 4096, 10 * GiB),
])
def test_size_is_rounded_up_to_the_volblocksize(fake, sr, size, expected):
    volume = create_volume(sr, size=size)
    assert volume["virtual_size"] == expected
    assert int(fake.get(zvol(volume), "volsize")) == expected
    argv = created(fake)
    assert argv[argv.index("-V") + 1] == str(expected)


def test_volblocksize_of_the_sr(fake):
    sr, _ = create_sr({"device": "/dev/sdb", "volblocksize": "64K"})
    volume = create_volume(sr, size=100 * KiB)
    assert volume["virtual_size"] == 128 * KiB
    assert fake.get(zvol(volume), "volblocksize") == str(64 * KiB)


def test_thin_volume(fake, sr):
    volume = create_volume(sr, size=4 * GiB)
    argv = created(fake)
    assert "-s" in argv
    assert fake.get(zvol(volume), "refreservation") == "0"
    assert volume["physical_utilisation"] == \
        int(fake.get(zvol(volume), "usedds"))
    assert volume["physical_utilisation"] < MiB
    fake.write(zvol(volume), 300 * MiB)
    stat = call("Volume.stat", sr=sr, key=volume["key"])
    assert stat["physical_utilisation"] == volume["physical_utilisation"] + \
        300 * MiB


def test_thick_volume(fake):
    sr, _ = create_sr({"device": "/dev/sdb", "provisioning": "thick"})
    volume = create_volume(sr, size=GiB)
    argv = created(fake)
    assert "-s" not in argv
    reservation = int(fake.get(zvol(volume), "refreservation"))
    assert reservation >= GiB
    assert volume["physical_utilisation"] == reservation
    fake.write(zvol(volume), 300 * MiB)
    assert call("Volume.stat", sr=sr, key=volume["key"])[
        "physical_utilisation"] == reservation


def test_thick_volume_larger_than_the_pool(fake):
    sr, _ = create_sr({"device": "/dev/sdb", "provisioning": "thick"})
    with pytest.raises(errors.OutOfSpace):
        create_volume(sr, size=20 * GiB)
    assert call("SR.ls", sr=sr) == []


def test_thin_volume_larger_than_the_pool(fake, sr):
    volume = create_volume(sr, size=20 * GiB)
    assert volume["virtual_size"] == 20 * GiB


def test_volume_record(fake, sr):
    name = u"Disque syst\u00e8me\t\u65e5\u672c"
    description = u"line\nline \"2\" $(id)"
    volume = create_volume(sr, name=name, description=description,
                           sharable=True)
    key = volume["key"]
    assert volume == {
        "key": key, "uuid": key, "name": name, "description": description,
        "read_write": True, "sharable": True, "virtual_size": GiB,
        "physical_utilisation": volume["physical_utilisation"],
        "uri": ["zfs-ng:///tank/" + key],
        "keys": {"content_id": volume["keys"]["content_id"]},
        "cbt_enabled": False}
    props = fake.local_props("tank/" + key)
    # a content_id of its own, set locally, out of the keys' JSON
    assert json.loads(props[meta.CONTENT_ID]) == {
        "id": volume["keys"]["content_id"], "of": key}
    assert volume["keys"]["content_id"] not in ("", key)
    assert props[meta.VDI_UUID] == key
    assert json.loads(props[meta.VDI_NAME]) == name
    assert json.loads(props[meta.VDI_DESCRIPTION]) == description
    assert props[meta.VDI_SHARABLE] == "true"
    assert json.loads(props[meta.VDI_KEYS]) == {}


def test_volume_inherits_the_sr_tuning(fake, sr):
    volume = create_volume(sr)
    props = fake.local_props(zvol(volume))
    assert "volmode" not in props and "compression" not in props
    assert fake.get(zvol(volume), "volmode") == "dev"
    assert fake.get(zvol(volume), "compression") == "lz4"


def test_volumes_get_distinct_keys(fake, sr):
    keys = set(create_volume(sr)["key"] for _ in range(5))
    assert len(keys) == 5
    assert set(v["key"] for v in call("SR.ls", sr=sr)) == keys


@pytest.mark.parametrize("size", [0, -1, -GiB])
def test_size_must_be_positive(fake, sr, size):
    mark = len(fake.calls)
    with pytest.raises(errors.InvalidArgument):
        create_volume(sr, size=size)
    assert fake.calls[mark:] == []


def test_create_on_an_unknown_sr(fake, sr):
    mark = len(fake.calls)
    with pytest.raises(errors.Sr_not_attached):
        create_volume("nosuchpool")
    assert fake.mutations(since=mark) == []


def test_create_with_too_much_metadata(fake, sr):
    mark = len(fake.calls)
    with pytest.raises(errors.MetadataTooLarge):
        create_volume(sr, description="d" * 9000)
    assert fake.mutations(since=mark) == []


def test_create_on_an_adopted_sr(fake):
    fake.version_text = "zfs-2.3.2-1\nzfs-kmod-2.3.2-1\n"
    fake.admin("zpool create -m none data /dev/sdc")
    stored = call("SR.create", uuid=SR_UUID, configuration={
        "zpool": "data", "volblocksize": "8K"}, name="a", description="")
    sr = call("SR.attach", configuration=stored)
    volume = create_volume(sr, size=1)
    assert volume["virtual_size"] == 8 * KiB
    assert volume["uri"] == ["zfs-ng:///%s/%s" % (sr, volume["key"])]


# --- stat --------------------------------------------------------------------

def test_stat_equals_create(fake, sr):
    volume = create_volume(sr)
    assert call("Volume.stat", sr=sr, key=volume["key"]) == volume


@pytest.mark.parametrize("key", [
    "2f6b2e1c-0000-4000-8000-000000000000", "not-a-uuid", "", "../tank",
    "-r", "x@y"])
def test_stat_of_an_unknown_key(fake, sr, key):
    create_volume(sr)
    mark = len(fake.calls)
    with pytest.raises(errors.Volume_does_not_exist) as info:
        call("Volume.stat", sr=sr, key=key)
    assert info.value.params() == ["Volume_does_not_exist", key]
    for argv in fake.calls[mark:]:
        assert key not in argv or key == "", argv


def test_stat_on_an_unknown_sr(fake, sr):
    volume = create_volume(sr)
    with pytest.raises(errors.Sr_not_attached):
        call("Volume.stat", sr="nosuchpool", key=volume["key"])


# --- destroy -----------------------------------------------------------------

def test_destroy(fake, sr):
    volume = create_volume(sr)
    assert call("Volume.destroy", sr=sr, key=volume["key"]) is None
    assert not fake.exists(zvol(volume))
    assert call("SR.ls", sr=sr) == []
    with pytest.raises(errors.Volume_does_not_exist):
        call("Volume.stat", sr=sr, key=volume["key"])


def test_destroy_is_repeatable(fake, sr):
    volume = create_volume(sr)
    call("Volume.destroy", sr=sr, key=volume["key"])
    mark = len(fake.calls)
    assert call("Volume.destroy", sr=sr, key=volume["key"]) is None
    assert fake.mutations(since=mark) == []


@pytest.mark.parametrize("key", [
    "2f6b2e1c-0000-4000-8000-000000000000", "not-a-uuid", "-r"])
def test_destroy_of_an_unknown_key_succeeds(fake, sr, key):
    other = create_volume(sr)
    mark = len(fake.calls)
    assert call("Volume.destroy", sr=sr, key=key) is None
    assert fake.mutations(since=mark) == []
    assert call("SR.ls", sr=sr) == [other]


def test_destroy_frees_the_space(fake):
    sr, _ = create_sr({"device": "/dev/sdb", "provisioning": "thick"})
    free = call("SR.stat", sr=sr)["free_space"]
    volume = create_volume(sr, size=2 * GiB)
    assert call("SR.stat", sr=sr)["free_space"] < free - 2 * GiB
    call("Volume.destroy", sr=sr, key=volume["key"])
    assert call("SR.stat", sr=sr)["free_space"] == free


def test_destroy_leaves_other_volumes(fake, sr):
    first, second = create_volume(sr, name="1"), create_volume(sr, name="2")
    call("Volume.destroy", sr=sr, key=first["key"])
    assert call("SR.ls", sr=sr) == [second]


def test_destroy_with_an_admin_snapshot_never_fails(fake, sr):
    """ARCHITECTURE.md, decision 4: dependents never make a destroy fail, and an
    admin's snapshot is never touched."""
    volume = create_volume(sr)
    fake.admin("zfs snapshot %s@before-upgrade" % zvol(volume))
    assert call("Volume.destroy", sr=sr, key=volume["key"]) is None
    assert call("SR.ls", sr=sr) == []
    assert fake.exists(zvol(volume) + "@before-upgrade")
    assert call("Volume.destroy", sr=sr, key=volume["key"]) is None


def test_destroy_on_an_unknown_sr(fake, sr):
    volume = create_volume(sr)
    with pytest.raises(errors.Sr_not_attached):
        call("Volume.destroy", sr="nosuchpool", key=volume["key"])
    assert fake.exists(zvol(volume))


# --- SR.ls -------------------------------------------------------------------

def test_ls_lists_every_vdi(fake, sr):
    volumes = [create_volume(sr, name=str(i), size=(i + 1) * GiB)
               for i in range(3)]
    listed = call("SR.ls", sr=sr)
    assert sorted(listed, key=lambda v: v["name"]) == volumes


def test_ls_hides_what_zfs_ng_did_not_make(fake, sr):
    volume = create_volume(sr, name="mine")
    key = volume["key"]
    other = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
    fake.admin("zfs create -V 1G tank/adminvol")            # no vdi property
    fake.admin("zfs create -V 1G tank/%s" % other)            # uuid name
    fake.admin("zfs snapshot tank/%s@manual" % key)           # inherits vdi
    fake.admin("zfs snapshot tank/%s@%s" % (key, other))      # uuid name
    fake.admin("zfs snapshot tank@root")                      # the SR's own
    fake.admin("zfs create tank/admin")
    fake.admin("zfs create -V 1G tank/admin/vol")
    assert fake.get("tank/%s@manual" % key, meta.VDI_UUID) == key
    assert call("SR.ls", sr=sr) == [volume]
    for hidden in (other, "manual", "adminvol"):
        with pytest.raises(errors.Volume_does_not_exist):
            call("Volume.stat", sr=sr, key=hidden)


def test_ls_lists_only_vdis_directly_under_the_sr(fake, sr):
    volume = create_volume(sr)
    key = volume["key"]
    fake.admin("zfs create tank/backup")
    props = " ".join("-o %s=%s" % (k, v.replace('"', '\\"'))
                     for k, v in sorted(fake.local_props(zvol(volume))
                                        .items()) if ":" in k)
    fake.admin("zfs create -s -V 1G %s tank/backup/%s" % (props, key))
    assert [v["key"] for v in call("SR.ls", sr=sr)] == [key]


def test_ls_of_an_adopted_sr_shows_only_its_own(fake):
    fake.admin("zpool create -m none data /dev/sdc")
    sr, _ = create_sr({"zpool": "data"}, name="a")
    fake.admin("zfs create -V 1G data/adminvol")
    volume = create_volume(sr)
    assert call("SR.ls", sr=sr) == [volume]


def test_ls_costs_the_same_for_one_or_many_vdis(fake, sr):
    create_volume(sr)
    mark = len(fake.calls)
    call("SR.ls", sr=sr)
    one = len(fake.calls) - mark
    for _ in range(9):
        create_volume(sr)
    mark = len(fake.calls)
    assert len(call("SR.ls", sr=sr)) == 10
    assert len(fake.calls) - mark == one
    assert one <= 2


def test_ls_of_an_unknown_sr(fake, sr):
    with pytest.raises(errors.Sr_not_attached):
        call("SR.ls", sr="nosuchpool")


def test_volumes_survive_export_and_import(fake, sr):
    volume = create_volume(sr, name=u"\u00e9t\u00e9", sharable=True)
    fake.admin("zpool export tank")
    fake.admin("zpool import tank")
    assert call("SR.ls", sr=sr) == [volume]
