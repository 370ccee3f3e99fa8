"""The largest VDI, and an SR listing that one odd dataset cannot break.

xapi holds sizes in int64: a zvol of 2^63 bytes (what 2^63 - 1 rounds up
to) made its Volume.stat and every SR.ls of its SR fail to unmarshal in
xapi, so the SR could no longer be scanned. Sizes are now refused before
anything is created or grown if, rounded up, they exceed 2^63 - 1; and
SR.ls lists every other VDI whatever one dataset holds (a zvol grown by
hand, keys or names set by hand with tabs, newlines or no JSON).
"""

import json

import pytest

from zfsng import errors, inventory, meta, wire, zfs
from zfsng_volume import volume

import fakezfs
from conftest import call, create_sr, create_volume, plain_keys

GiB, KiB = fakezfs.GiB, fakezfs.KiB
TiB = 1024 * GiB
INT64_MAX = 2 ** 63 - 1


@pytest.fixture
def sr(fake):
    return create_sr()[0]


def zvol(vol):
    return "tank/" + vol["key"]


# --- the size limit ----------------------------------------------------------

def test_the_limit_is_8_eib_less_one_block():
    assert volume.max_size(16 * KiB) == 2 ** 63 - 16 * KiB
    assert volume.max_size(128 * KiB) == 2 ** 63 - 128 * KiB
    assert volume.max_size(4 * KiB) == 2 ** 63 - 4 * KiB


@pytest.mark.parametrize("size", [INT64_MAX, 2 ** 63 - 16 * KiB + 1])
def test_create_beyond_the_limit_is_refused_before_anything(fake, sr, size):
    before = len(fake.calls)
    with pytest.raises(errors.VolumeTooLarge) as err:
        create_volume(sr, size=size)
    assert str(2 ** 63 - 16 * KiB) in err.value.message    # names the limit
    assert fake.mutations(before) == []
    assert call("SR.ls", sr=sr) == []


def test_create_at_the_limit(fake, sr):
    vol = create_volume(sr, size=2 ** 63 - 16 * KiB)
    assert vol["virtual_size"] == 2 ** 63 - 16 * KiB
    assert call("SR.ls", sr=sr)[0]["virtual_size"] == 2 ** 63 - 16 * KiB


def test_the_limit_follows_the_srs_volblocksize(fake):
    sr, _ = create_sr({"device": "/dev/sdb", "volblocksize": "128K"})
    with pytest.raises(errors.VolumeTooLarge):
        create_volume(sr, size=2 ** 63 - 128 * KiB + 1)
    vol = create_volume(sr, size=2 ** 63 - 128 * KiB)
    assert vol["virtual_size"] == 2 ** 63 - 128 * KiB


def test_a_16_tib_sparse_volume(fake, sr):
    vol = create_volume(sr, size=16 * TiB)
    assert vol["virtual_size"] == 16 * TiB
    call("Volume.resize", sr=sr, key=vol["key"], new_size=32 * TiB)
    assert call("Volume.stat", sr=sr, key=vol["key"])["virtual_size"] == \
        32 * TiB


def test_resize_beyond_the_limit_changes_nothing(fake, sr):
    vol = create_volume(sr, size=GiB)
    before = len(fake.calls)
    with pytest.raises(errors.VolumeTooLarge):
        call("Volume.resize", sr=sr, key=vol["key"], new_size=INT64_MAX)
    assert fake.mutations(before) == []
    assert int(fake.get(zvol(vol), "volsize")) == GiB
    call("Volume.resize", sr=sr, key=vol["key"], new_size=2 ** 63 - 16 * KiB)
    assert call("SR.ls", sr=sr)[0]["virtual_size"] == 2 ** 63 - 16 * KiB


def test_sizes_beyond_int64_never_reach_a_handler(fake, sr):
    with pytest.raises(errors.InvalidArgument):
        create_volume(sr, size=2 ** 64)


# --- SR.ls: one odd dataset never breaks the listing -----------------------

def _volumes(sr):
    return dict((v["key"], v) for v in call("SR.ls", sr=sr))


@pytest.fixture
def two(fake, sr):
    """(odd, good): two VDIs; a test makes the first one odd by hand."""
    odd = create_volume(sr, name="odd", size=GiB)
    good = create_volume(sr, name="good", size=2 * GiB)
    call("Volume.set", sr=sr, key=good["key"], k="k", v="v")
    return odd, call("Volume.stat", sr=sr, key=good["key"])


def _the_good_one_is_intact(sr, good):
    assert _volumes(sr)[good["key"]] == good


def test_a_zvol_grown_by_hand_past_int64_is_clamped(fake, sr, two, capsys):
    odd, good = two
    fake.admin("zfs set volsize=%d %s" % (2 ** 63, zvol(odd)))
    assert _volumes(sr)[odd["key"]]["virtual_size"] == INT64_MAX
    assert call("Volume.stat", sr=sr, key=odd["key"])["virtual_size"] == \
        INT64_MAX
    _the_good_one_is_intact(sr, good)
    assert "beyond what xapi can hold" in capsys.readouterr().err   # SMlog


@pytest.mark.parametrize("value,keys", [
    ("not json", {}), ("[1, 2]", {}), ('"text"', {}), ("{", {}),
    ('{"a": 1, "b": "x", "c": null}', {"b": "x"}),
])
def test_keys_set_by_hand_are_logged_not_fatal(fake, sr, two, capsys, value,
                                               keys):
    odd, good = two
    fake._run(["zfs", "set", "%s=%s" % (meta.VDI_KEYS, value), zvol(odd)])
    assert plain_keys(_volumes(sr)[odd["key"]]["keys"]) == keys
    assert plain_keys(call("Volume.stat", sr=sr, key=odd["key"])["keys"]) \
        == keys
    _the_good_one_is_intact(sr, good)
    assert zvol(odd) in capsys.readouterr().err


def test_volume_set_on_unreadable_keys_is_refused_typed(fake, sr, two):
    odd, _ = two
    fake._run(["zfs", "set", "%s=not json" % meta.VDI_KEYS, zvol(odd)])
    before = len(fake.calls)
    with pytest.raises(errors.MetadataUnreadable) as err:
        call("Volume.set", sr=sr, key=odd["key"], k="a", v="b")
    assert zvol(odd) in err.value.message and meta.VDI_KEYS in \
        err.value.message
    assert fake.mutations(before) == []


@pytest.mark.parametrize("value", [
    "a\tb", "a\nb", "tab\tand\nnewline\t", "\n", "\t", "a\n\n\tb\n",
    # a piece that looks like a row of another dataset
    "x\ntank/00000000-0000-4000-8000-000000000000\ty",
])
def test_names_with_tabs_and_newlines(fake, sr, two, value):
    odd, good = two
    fake._run(["zfs", "set", "%s=%s" % (meta.VDI_NAME, value), zvol(odd)])
    fake._run(["zfs", "set", "%s=%s" % (meta.VDI_DESCRIPTION, value),
               zvol(odd)])
    listed = _volumes(sr)
    assert sorted(listed) == sorted([odd["key"], good["key"]])
    assert listed[odd["key"]]["name"] == value      # set by hand: as it is
    assert listed[odd["key"]]["description"] == value
    assert call("Volume.stat", sr=sr, key=odd["key"])["name"] == value
    _the_good_one_is_intact(sr, good)


def test_keys_with_tabs_and_newlines_set_by_hand(fake, sr, two):
    odd, good = two
    keys = '{"a": "1\t2", "b\nc": "x"}'      # JSON with raw control chars
    fake._run(["zfs", "set", "%s=%s" % (meta.VDI_KEYS, keys), zvol(odd)])
    assert plain_keys(_volumes(sr)[odd["key"]]["keys"]) == {}  # json refuses
    _the_good_one_is_intact(sr, good)


def test_an_sr_name_with_a_newline(fake, sr, two):
    odd, good = two
    fake._run(["zfs", "set", "%s=a\nb\tc" % meta.SR_NAME, sr])
    assert sorted(_volumes(sr)) == sorted([odd["key"], good["key"]])
    assert call("SR.stat", sr=sr)["name"] == "a\nb\tc"


def test_a_sound_listing_is_one_command(fake, sr, two):
    before = len(fake.calls)
    call("SR.ls", sr=sr)
    assert [a[:2] for a in fake.calls[before:]] == [["zfs", "list"]]


def test_a_broken_row_is_read_again_alone(fake, sr, two):
    odd, _ = two
    fake._run(["zfs", "set", "%s=a\nb" % meta.VDI_NAME, zvol(odd)])
    before = len(fake.calls)
    call("SR.ls", sr=sr)
    again = [a for a in fake.calls[before + 1:]]
    assert again and all(a[-1] == zvol(odd) for a in again)
    assert all(a[:2] in (["zfs", "list"], ["zfs", "get"]) for a in again)


@pytest.mark.parametrize("change", [
    {"volsize": "x"}, {"volsize": None}, {"usedds": "1.5"},
    {meta.VDI_UUID: None},
])
def test_a_row_that_cannot_be_described_is_left_out(fake, sr, two, change,
                                                    capsys):
    # what zfs itself never prints, but a bug or a future zfs might
    odd, good = two
    rows = inventory.rows(sr)
    for row in rows:
        if row["name"] == zvol(odd):
            row.update(change)
    listed = volume._listed([r for r in rows if meta.is_vdi(r) or
                             r["name"] == zvol(odd)])
    assert [v["key"] for v in listed] == [good["key"]]
    assert "left out" in capsys.readouterr().err


def test_every_listed_volume_is_a_valid_v5_volume(fake, sr, two):
    odd, _ = two
    fake.admin("zfs set volsize=%d %s" % (2 ** 64 - 16 * KiB, zvol(odd)))
    fake._run(["zfs", "set", "%s=[]" % meta.VDI_KEYS, zvol(odd)])
    for vol in call("SR.ls", sr=sr):
        wire.VOLUME.check(vol, "v")
        json.dumps(vol)


def test_reading_one_property_of_a_broken_row(fake, sr, two):
    # get_one with columns that do not start with the name (sr.py does so)
    odd, _ = two
    fake._run(["zfs", "set", "%s=1\t2\n3" % meta.VDI_NAME, zvol(odd)])
    row = zfs.get_one(zvol(odd), [meta.VDI_NAME, "volsize"])
    assert (row[meta.VDI_NAME], row["volsize"]) == ("1\t2\n3", str(GiB))
    fake._run(["zfs", "inherit", meta.VDI_NAME, zvol(odd)])
    assert zfs.get_one(zvol(odd), [meta.VDI_NAME])[meta.VDI_NAME] is None
