"""VDI semantics as xapi drives them, through the wire layer.

Every test plays a sequence xapi-storage-script really sends (xen-api's
ocaml/xapi-storage-script/main.ml): VDI.create is Volume.create then
Volume.set of vdi-type; VDI.snapshot is Volume.snapshot then Volume.set on
the new volume of snapshot_time, is_a_snapshot, snapshot_of, content_id and
vdi-type, and one Volume.set per tag on the source; VM revert clones the
snapshot, destroys the original, later destroys the snapshot while the
clone lives; VDI.destroy with clone-on-boot destroys the same key twice.

What is checked is what xapi sees (SR.ls, Volume.stat) and what is left in
the pool (the fake's datasets): nothing a user destroyed stays listed, and
nothing stays in the pool once nothing needs it.

The first section pins the ZFS behaviour these tests lean on, as the fake
models it after OpenZFS 2.1/2.3.
"""

import json
import random
import shlex

import pytest

from zfsng import errors, meta, values

import fakezfs
from fakezfs import CommandError
from conftest import call, create_sr, create_volume

GiB, MiB, KiB = fakezfs.GiB, fakezfs.MiB, fakezfs.KiB
SNAPSHOT_TIME = "20240517T10:11:12Z"


# --- helpers: xapi's sequences ---------------------------------------------

@pytest.fixture
def sr(fake):
    # Only the limits OpenZFS itself enforces (see fakezfs.user_value_cap).
    fake.user_value_cap = None
    name, fake.sr_config = create_sr()
    return name


@pytest.fixture
def thick(fake):
    fake.user_value_cap = None
    name, fake.sr_config = create_sr({"device": "/dev/sdb",
                                      "provisioning": "thick"})
    return name


def vdi_create(sr, vdi_type="user", **kwargs):
    """VDI.create: Volume.create, then Volume.set(vdi-type)."""
    volume = create_volume(sr, **kwargs)
    call("Volume.set", sr=sr, key=volume["key"], k="vdi-type", v=vdi_type)
    return call("Volume.stat", sr=sr, key=volume["key"])


def vdi_snapshot(sr, key, content_id=None, tags=()):
    """VDI.snapshot: Volume.snapshot, then Volume.set on the new volume of
    the snapshot's own keys, then one Volume.set per tag on the source.
    content_id: what xapi passes, by default the source's location, its
    key (xapi_vdi.ml:836-840, main.ml:1442)."""
    content_id = key if content_id is None else content_id
    snap = call("Volume.snapshot", sr=sr, key=key)
    for k, v in [("snapshot_time", SNAPSHOT_TIME), ("is_a_snapshot", "true"),
                 ("snapshot_of", key), ("content_id", content_id),
                 ("vdi-type", "user")]:
        assert call("Volume.set", sr=sr, key=snap["key"], k=k, v=v) is None
    for tag in tags:
        call("Volume.set", sr=sr, key=key, k="tag-" + tag, v=tag)
    return call("Volume.stat", sr=sr, key=snap["key"])


def plain(keys):
    """keys without content_id, which every VDI reports (never "")."""
    assert keys["content_id"]
    return dict((k, v) for k, v in keys.items() if k != "content_id")


def clone(sr, key):
    return call("Volume.clone", sr=sr, key=key)


def destroy(sr, key):
    assert call("Volume.destroy", sr=sr, key=key) is None


def listed(sr):
    return dict((v["key"], v) for v in call("SR.ls", sr=sr))


def datasets(fake, pool="tank"):
    return sorted(fake.pool(pool).datasets)


def zvol(sr, key):
    return "%s/%s" % (sr, key)


def snapshot_name(fake, sr, key):
    """The pool name of snapshot VDI key (parent@key)."""
    [name] = [n for n in datasets(fake, sr.split("/")[0])
              if n.startswith(sr + "/") and n.endswith("@" + key)]
    return name


def is_internal(name):
    return "@" in name and \
        name.split("@", 1)[1].startswith(meta.INTERNAL_SNAPSHOT)


def garbage(fake, sr):
    """What nothing needs any more but is still in the pool: internal
    snapshots without a clone (or not marked for deferred destroy), and
    hidden zvols none of whose snapshots is needed (a VDI, a snapshot with
    clones, an admin's own)."""
    pool = fake.pool(sr.split("/")[0])
    found = []
    for name, ds in sorted(pool.datasets.items()):
        if ds.kind == "snapshot" and is_internal(name):
            if not ds.clones:
                found.append("internal snapshot without a clone: " + name)
            elif not ds.defer_destroy:
                found.append("internal snapshot not deferred: " + name)
        elif ds.kind == "volume" and \
                ds.props.get(meta.VDI_UUID) == meta.HIDDEN:
            needed = [s for s in pool.datasets.values()
                      if s.kind == "snapshot" and
                      s.name.startswith(name + "@") and
                      not (is_internal(s.name) and not s.clones)]
            if not needed:
                found.append("hidden zvol nothing needs: " + name)
    return found


def destroy_everything(sr, order=None):
    """Destroy every listed VDI (in order, else as listed) until none is
    left; each destroy is repeated, as xapi may."""
    for _ in range(20):
        keys = list(listed(sr))
        if not keys:
            return
        if order is not None:
            keys = [k for k in order if k in keys] + \
                [k for k in keys if k not in order]
        for key in keys:
            destroy(sr, key)
            destroy(sr, key)
    raise AssertionError("VDIs still listed: %s" % list(listed(sr)))


def assert_only_the_sr_is_left(fake, sr):
    assert datasets(fake, sr.split("/")[0]) == [sr]


# --- the ZFS behaviour the plugin relies on (the fake's fidelity) ----------

@pytest.fixture
def pool(fake):
    fake.user_value_cap = None
    fake.admin("zpool create -m none tank /dev/sdc")
    fake.admin("zfs create -s -V 1G -o com.x:k=vol tank/v")
    return fake


def run(fake, argv):
    return fake(argv)


def test_fake_snapshot_props_local_else_inherited(pool):
    run(pool, ["zfs", "snapshot", "-o", "com.x:k=snap", "--", "tank/v@a"])
    run(pool, ["zfs", "snapshot", "--", "tank/v@b"])
    assert pool.local_props("tank/v@a") == {"com.x:k": "snap"}
    assert pool.local_props("tank/v@b") == {}
    assert pool.get("tank/v@b", "com.x:k") == "vol"     # inherited
    out = pool.admin("zfs get -Hp -t snapshot -o name,value,source "
                     "com.x:k tank/v@b")
    assert out == "tank/v@b\tvol\tinherited from tank/v\n"
    result = run(pool, ["zfs", "snapshot", "-o", "compression=lz4", "--",
                        "tank/v@c"])
    assert "can not be modified for snapshots" in result.err


def test_fake_clone_origin_clones_and_size(pool):
    pool.admin("zfs set volsize=2G tank/v")
    pool.admin("zfs snapshot tank/v@s")
    result = run(pool, ["zfs", "clone", "-o", "com.x:c=1", "--", "tank/v@s",
                        "tank/c1"])
    assert result.rc == 0, result.err
    pool.admin("zfs clone tank/v@s tank/c2")
    out = pool.admin("zfs list -Hp -o name,origin,clones,volsize,"
                     "volblocksize,defer_destroy -t all -r tank")
    rows = [line.split("\t") for line in out.splitlines()]
    assert rows == [
        ["tank", "-", "-", "-", "-", "-"],
        ["tank/c1", "tank/v@s", "-", str(2 * GiB), "8192", "-"],
        ["tank/c2", "tank/v@s", "-", str(2 * GiB), "8192", "-"],
        ["tank/v", "-", "-", str(2 * GiB), "8192", "-"],
        # a snapshot has no volblocksize on OpenZFS 2.1 and 2.3
        ["tank/v@s", "-", "tank/c1,tank/c2", str(2 * GiB), "-", "off"]]
    # a clone carries its own local properties, not its origin's
    assert pool.local_props("tank/c1") == {"com.x:c": "1"}
    assert pool.get("tank/c2", "com.x:k") is None


def test_fake_snapshot_without_clones_shows_a_dash(pool):
    pool.admin("zfs snapshot tank/v@s")
    out = pool.admin("zfs list -Hp -o clones -t snapshot tank/v")
    assert out == "-\n"                      # get_clones_string(): none


def test_fake_long_clones_list_is_cut_at_the_property_buffer(pool):
    pool.admin("zfs snapshot tank/v@s")
    names = ["tank/%s" % ("c%03d" % i + "x" * 60) for i in range(80)]
    for name in names:
        pool.admin("zfs clone tank/v@s %s" % name)
    value = pool.get("tank/v@s", "clones")
    assert len(value) == fakezfs.ZFS_MAXPROPLEN - 1
    assert ",".join(names).startswith(value)


def test_fake_destroy_refusals(pool):
    pool.admin("zfs snapshot tank/v@s")
    pool.admin("zfs clone tank/v@s tank/c")
    with pytest.raises(CommandError) as info:
        pool.admin("zfs destroy -- tank/v")
    assert info.value.err == ("cannot destroy 'tank/v': volume has children"
                              "\nuse '-r' to destroy the following datasets:"
                              "\ntank/v@s\n")
    with pytest.raises(CommandError) as info:
        pool.admin("zfs destroy -- tank/v@s")
    assert info.value.err == ("cannot destroy 'tank/v@s': snapshot has "
                              "dependent clones\nuse '-R' to destroy the "
                              "following datasets:\ntank/c\n")
    with pytest.raises(CommandError) as info:
        pool.admin("zfs destroy -r -- tank/v")
    assert info.value.err.startswith(
        "cannot destroy 'tank/v': volume has dependent clones\n")
    assert pool.exists("tank/v@s") and pool.exists("tank/c")


def test_fake_deferred_destroy_goes_with_the_last_clone(pool):
    pool.admin("zfs snapshot tank/v@s")
    pool.admin("zfs clone tank/v@s tank/c1")
    pool.admin("zfs clone tank/v@s tank/c2")
    pool.admin("zfs destroy -d -- tank/v@s")
    assert pool.get("tank/v@s", "defer_destroy") == "on"
    pool.admin("zfs destroy -- tank/c1")
    assert pool.exists("tank/v@s")
    pool.admin("zfs destroy -- tank/c2")
    assert not pool.exists("tank/v@s")
    pool.admin("zfs destroy -- tank/v")   # no snapshot left: no -r needed
    # -d on a snapshot without clones destroys it at once
    pool.admin("zfs create -s -V 1G tank/w")
    pool.admin("zfs snapshot tank/w@s")
    pool.admin("zfs destroy -d -- tank/w@s")
    assert not pool.exists("tank/w@s")


def test_fake_volsize_must_be_a_multiple_of_the_block_size(pool):
    result = run(pool, ["zfs", "set", "volsize=%d" % (GiB + 512), "tank/v"])
    assert (result.rc, result.err) == (
        1, "cannot set property for 'tank/v': 'volsize' must be a multiple "
           "of volume block size (8K)\n")
    result = run(pool, ["zfs", "set", "volsize=0", "tank/v"])
    assert result.err == ("cannot set property for 'tank/v': 'volsize' "
                          "cannot be zero\n")
    result = run(pool, ["zfs", "create", "-V", str(GiB + 512), "--",
                        "tank/w"])
    assert result.err == ("cannot create 'tank/w': volume size must be a "
                          "multiple of volume block size\n")
    assert int(pool.get("tank/v", "volsize")) == GiB


def test_fake_thick_volsize_follows_its_refreservation(pool):
    pool.admin("zfs create -V 1G tank/thick")
    before = int(pool.get("tank/thick", "refreservation"))
    pool.admin("zfs set volsize=2G tank/thick")        # synthetic resv
    assert int(pool.get("tank/thick", "refreservation")) > 2 * GiB > before
    pool.admin("zfs set refreservation=auto volsize=3G tank/thick")
    assert int(pool.get("tank/thick", "refreservation")) > 3 * GiB


def test_fake_thick_grow_past_the_pool_changes_nothing(pool):
    """A refreservation the pool cannot hold fails the command, and the
    volsize set with it does not stay: what OpenZFS 2.1 and 2.3 do
    (tests/integration/test_fakezfs_contract.py)."""
    pool.admin("zfs create -V 1G tank/thick")
    old = pool.get("tank/thick", "refreservation")
    result = run(pool, ["zfs", "set", "refreservation=auto",
                        "volsize=%d" % (40 * GiB), "tank/thick"])
    assert (result.rc, result.err) == (
        1, "cannot set property for 'tank/thick': size is greater than "
           "available space\n")
    assert int(pool.get("tank/thick", "volsize")) == GiB
    assert pool.get("tank/thick", "refreservation") == old


def test_fake_user_property_values_up_to_zap_maxvaluelen(pool):
    """OpenZFS 2.1 and 2.3: the kernel refuses a user property value of
    ZAP_MAXVALUELEN (8192) bytes or more with E2BIG; libzfs does not check
    the value's length for datasets."""
    fits = "v" * (fakezfs.ZAP_MAXVALUELEN - 1)
    big = fits + "v"
    pool.admin("zfs set com.x:k=%s tank/v" % fits)
    assert pool.get("tank/v", "com.x:k") == fits
    mark = len(pool.calls)
    result = run(pool, ["zfs", "set", "com.x:k=" + big, "tank/v"])
    assert (result.rc, result.err) == (
        1, "cannot set property for 'tank/v': property value too long\n")
    # create, clone, snapshot: E2BIG reaches zfs_standard_error(), which
    # has no case for it: "internal error" and abort()
    result = run(pool, ["zfs", "snapshot", "-o", "com.x:k=" + big, "--",
                        "tank/v@s"])
    assert (result.rc, result.err) == (
        -6, "internal error: cannot create snapshots : Argument list too "
            "long\n")
    result = run(pool, ["zfs", "create", "-s", "-V", "1G", "-o",
                        "com.x:k=" + big, "--", "tank/w"])
    assert (result.rc, result.err) == (
        -6, "internal error: cannot create 'tank/w': Argument list too "
            "long\n")
    pool.admin("zfs snapshot tank/v@t")
    result = run(pool, ["zfs", "clone", "-o", "com.x:k=" + big, "--",
                        "tank/v@t", "tank/c"])
    assert result.rc == -6
    assert pool.mutations(since=mark) and datasets(pool) == [
        "tank", "tank/v", "tank/v@t"]
    assert pool.get("tank/v", "com.x:k") == fits


def test_fake_user_value_cap_is_optional(fake):
    """The fake's own 4 KiB cap (not OpenZFS's) applies only when set."""
    fake.admin("zpool create -m none tank /dev/sdc")
    fake.user_value_cap = fakezfs.MAX_PROP_VALUE + 1
    result = run(fake, ["zfs", "set", "com.x:k=" + "v" * 4096, "tank"])
    assert "is too long" in result.err
    fake.user_value_cap = None
    assert run(fake, ["zfs", "set", "com.x:k=" + "v" * 4096, "tank"]).rc == 0


# --- VDI.create, keys, names -------------------------------------------------

def test_vdi_create_sets_the_vdi_type(fake, sr):
    volume = create_volume(sr, name="disk 0", description="root disk")
    assert plain(volume["keys"]) == {}
    assert call("Volume.set", sr=sr, key=volume["key"], k="vdi-type",
                v="user") is None
    stat = call("Volume.stat", sr=sr, key=volume["key"])
    assert stat["keys"] == {"vdi-type": "user",
                            "content_id": volume["keys"]["content_id"]}
    assert stat["read_write"] is True
    assert listed(sr) == {volume["key"]: stat}


KEYS = [
    ("vdi-type", "user"),
    ("UPPER_Case", "MiXeD"),
    ("dotted.key.name", "a.b.c"),
    ("under_score", "_"),
    ("colon:key", "a:b:c"),
    ("_sm_config_host_OpaqueRef:3e1f", "OpaqueRef:9a8b-7c6d"),
    (u"cl\u00e9 \u65e5\u672c", u"valeur \u00e9t\u00e9 \U0001F600"),
    ("tab\tkey", "tab\tvalue"),
    ("new\nline", "line 1\nline 2\r\n"),
    ("content-id", ""),
    ("", "empty key"),
    ("quote\"s", "back\\slash '\"` $(id) ;"),
    ("json", '{"a": [1, 2], "b": null}'),
    ("nul", "a\x00b"),
    ("spaces ", "  leading and trailing  "),
]


@pytest.mark.parametrize("k,v", KEYS)
def test_keys_round_trip_byte_for_byte(fake, sr, k, v):
    volume = vdi_create(sr)
    call("Volume.set", sr=sr, key=volume["key"], k=k, v=v)
    expected = dict(volume["keys"], **{k: v})
    assert call("Volume.stat", sr=sr, key=volume["key"])["keys"] == expected
    assert listed(sr)[volume["key"]]["keys"] == expected
    # what is in the pool is JSON in UTF-8: control characters escaped
    # (zfs list -H's tabs and newlines cannot split it), every other
    # character as itself (zfs list shows what xapi set)
    raw = fake.local_props(zvol(sr, volume["key"]))[meta.VDI_KEYS]
    assert raw.encode("utf-8") and not any(ord(c) < 0x20 for c in raw)
    assert all(c in raw for c in k + v if ord(c) > 0x7f)
    assert json.loads(raw) == plain(expected)


def test_line_separators_stay_escaped_on_the_pool(fake, sr):
    """U+2028, U+2029 and NEL end a line for some readers of zfs -H
    output: kept as JSON escapes, they round-trip."""
    volume = vdi_create(sr)
    text = u"a\u2028b\u2029c\x85d \u00e9"
    call("Volume.set", sr=sr, key=volume["key"], k=text, v=text)
    call("Volume.set_name", sr=sr, key=volume["key"], new_name=text)
    got = call("Volume.stat", sr=sr, key=volume["key"])
    assert got["keys"][text] == text and got["name"] == text
    props = fake.local_props(zvol(sr, volume["key"]))
    for prop in (meta.VDI_KEYS, meta.VDI_NAME):
        assert len(props[prop].splitlines()) == 1
        assert u"\u00e9" in props[prop]


def test_text_older_versions_wrote_reads_the_same(fake, sr):
    """Before names were stored as UTF-8 characters they were JSON
    \\u escapes: read the same."""
    volume = vdi_create(sr)
    name = zvol(sr, volume["key"])
    fake.admin(u"zfs set %s='\"Disque syst\\u00e8me\"' %s"
               % (meta.VDI_NAME, name))
    fake.admin(u"zfs set %s='{\"cl\\u00e9\": \"\\u65e5\"}' %s"
               % (meta.VDI_KEYS, name))
    got = call("Volume.stat", sr=sr, key=volume["key"])
    assert (got["name"], plain(got["keys"])) == (u"Disque syst\u00e8me",
                                          {u"cl\u00e9": u"\u65e5"})


def test_all_keys_together_and_overwrite(fake, sr):
    volume = vdi_create(sr)
    for k, v in KEYS:
        call("Volume.set", sr=sr, key=volume["key"], k=k, v=v)
    call("Volume.set", sr=sr, key=volume["key"], k="vdi-type", v="system")
    expected = dict(KEYS, **{"vdi-type": "system"})
    assert plain(call("Volume.stat", sr=sr, key=volume["key"])["keys"]) == \
        expected


def test_unset(fake, sr):
    volume = vdi_create(sr)
    call("Volume.set", sr=sr, key=volume["key"], k="a.b", v="1")
    call("Volume.set", sr=sr, key=volume["key"], k="", v="")
    assert call("Volume.unset", sr=sr, key=volume["key"], k="a.b") is None
    assert plain(call("Volume.stat", sr=sr, key=volume["key"])["keys"]) == {
        "vdi-type": "user", "": ""}
    call("Volume.unset", sr=sr, key=volume["key"], k="")
    call("Volume.unset", sr=sr, key=volume["key"], k="never-set")
    assert plain(call("Volume.stat", sr=sr, key=volume["key"])["keys"]) == {
        "vdi-type": "user"}


@pytest.mark.parametrize("method", ["Volume.set", "Volume.unset",
                                    "Volume.set_name",
                                    "Volume.set_description"])
def test_metadata_calls_on_an_unknown_key(fake, sr, method):
    vdi_create(sr)
    args = {"Volume.set": {"k": "a", "v": "b"}, "Volume.unset": {"k": "a"},
            "Volume.set_name": {"new_name": "n"},
            "Volume.set_description": {"new_description": "d"}}[method]
    mark = len(fake.calls)
    with pytest.raises(errors.Volume_does_not_exist):
        call(method, sr=sr, key="2f6b2e1c-0000-4000-8000-000000000000",
             **args)
    assert fake.mutations(since=mark) == []


def test_set_name_and_description(fake, sr):
    volume = vdi_create(sr, name="a", description="b")
    snap = vdi_snapshot(sr, volume["key"])
    for key in (volume["key"], snap["key"]):
        name, text = u"n\u00e9w\tname %s" % key[:4], u"line 1\nline \"2\""
        assert call("Volume.set_name", sr=sr, key=key, new_name=name) is None
        assert call("Volume.set_description", sr=sr, key=key,
                    new_description=text) is None
        stat = call("Volume.stat", sr=sr, key=key)
        assert (stat["name"], stat["description"]) == (name, text)
        assert listed(sr)[key] == stat
    # the other one kept its own
    assert call("Volume.stat", sr=sr, key=snap["key"])["keys"][
        "snapshot_of"] == volume["key"]


def test_keys_that_do_not_fit_change_nothing(fake, sr):
    volume = vdi_create(sr)
    mark = len(fake.calls)
    with pytest.raises(errors.MetadataTooLarge):
        call("Volume.set", sr=sr, key=volume["key"], k="big",
             v="x" * (2 * fakezfs.ZAP_MAXVALUELEN))
    assert fake.mutations(since=mark) == []
    assert call("Volume.stat", sr=sr, key=volume["key"]) == volume


def test_keys_up_to_what_zfs_accepts(fake, sr):
    volume = vdi_create(sr)
    encoded = len(values.encode_keys({"vdi-type": "user", "big": ""}))
    fits = "x" * (fakezfs.ZAP_MAXVALUELEN - 1 - encoded)
    call("Volume.set", sr=sr, key=volume["key"], k="big", v=fits)
    assert call("Volume.stat", sr=sr, key=volume["key"])["keys"]["big"] == \
        fits
    with pytest.raises(errors.MetadataTooLarge):
        call("Volume.set", sr=sr, key=volume["key"], k="big", v=fits + "x")


# --- VDI.snapshot ------------------------------------------------------------

@pytest.mark.parametrize("content_id", [None, "", "9a3bb1b0-7c52-4a3e-"
                                        "8f2f-0c9d1e2f3a4b"])
def test_vdi_snapshot_sequence(fake, sr, content_id):
    """As xapi snapshots a VDI (main.ml:1425-1450): the content_id it
    passes (the source's key, "", or a claim) is the snapshot's only if
    it is a true and new one; the snapshot never reports the source's
    key, "", or the id of another VDI."""
    source = vdi_create(sr, name="db", description="data", size=3 * GiB,
                        sharable=True)
    call("Volume.set", sr=sr, key=source["key"], k="mine", v="kept")
    snap = vdi_snapshot(sr, source["key"], content_id=content_id,
                        tags=["backup", "w\u00e9ekly"])
    assert snap["key"] != source["key"] and snap["uuid"] == snap["key"]
    assert snap["read_write"] is False
    assert (snap["name"], snap["description"], snap["sharable"],
            snap["virtual_size"]) == ("db", "data", True, 3 * GiB)
    assert plain(snap["keys"]) == {
        "snapshot_time": SNAPSHOT_TIME, "is_a_snapshot": "true",
        "snapshot_of": source["key"], "vdi-type": "user"}
    if content_id is None or content_id == "":
        assert snap["keys"]["content_id"] not in (
            "", source["key"], snap["key"], source["keys"]["content_id"])
    else:       # a claim no VDI of the SR makes: kept
        assert snap["keys"]["content_id"] == content_id
    assert snap["uri"] == ["zfs-ng:///%s/%s@%s" % (sr, source["key"],
                                                   snap["key"])]
    now = listed(sr)
    assert set(now) == set([source["key"], snap["key"]])
    assert now[snap["key"]] == snap
    assert plain(now[source["key"]]["keys"]) == {
        "vdi-type": "user", "mine": "kept", "tag-backup": "backup",
        u"tag-w\u00e9ekly": u"w\u00e9ekly"}
    # the source's own is left as it was
    assert now[source["key"]]["keys"]["content_id"] == \
        source["keys"]["content_id"]
    assert now[source["key"]]["read_write"] is True


def test_snapshot_keys_start_empty(fake, sr):
    """control.ml: snapshot and clone do not copy keys; xapi sets the
    snapshot's own."""
    source = vdi_create(sr)
    call("Volume.set", sr=sr, key=source["key"], k="clone-on-boot",
         v="3e1f0000-0000-4000-8000-000000000000")
    snap = call("Volume.snapshot", sr=sr, key=source["key"])
    assert plain(snap["keys"]) == {}
    assert plain(call("Volume.stat", sr=sr, key=snap["key"])["keys"]) == {}
    copy = clone(sr, snap["key"])
    assert plain(copy["keys"]) == {}
    assert plain(clone(sr, source["key"])["keys"]) == {}


def test_stat_of_a_snapshot_key(fake, sr):
    source = vdi_create(sr)
    snap = vdi_snapshot(sr, source["key"])
    assert call("Volume.stat", sr=sr, key=snap["key"]) == snap
    assert listed(sr)[snap["key"]] == snap


def test_snapshots_of_snapshots_are_refused(fake, sr):
    source = vdi_create(sr)
    snap = vdi_snapshot(sr, source["key"])
    mark = len(fake.calls)
    with pytest.raises(errors.InvalidArgument):
        call("Volume.snapshot", sr=sr, key=snap["key"])
    assert fake.mutations(since=mark) == []


def test_snapshot_keys_resolve_inside_the_sr_only(fake, sr):
    # the copy must sort before the real one: a key from c to f does
    for _ in range(100):
        source = vdi_create(sr)
        if source["key"][0] in "cdef":
            break
        destroy(sr, source["key"])
    snap = vdi_snapshot(sr, source["key"])
    real = snapshot_name(fake, sr, snap["key"])
    fake.admin("zfs create %s/backup" % sr)
    copy = "%s/backup/%s" % (sr, source["key"])

    def options(name):
        return " ".join("-o %s" % shlex.quote("%s=%s" % kv) for kv in sorted(
            fake.local_props(name).items()) if ":" in kv[0])
    fake.admin("zfs create -s -V 1G %s %s" % (
        options(zvol(sr, source["key"])), copy))
    fake.admin("zfs snapshot %s %s@%s" % (options(real), copy, snap["key"]))
    assert sorted(listed(sr)) == sorted([source["key"], snap["key"]])
    stat = call("Volume.stat", sr=sr, key=snap["key"])
    assert stat["uri"] == ["zfs-ng:///" + real]
    call("Volume.set", sr=sr, key=snap["key"], k="x", v="1")
    assert json.loads(fake.get(real, meta.VDI_KEYS))["x"] == "1"
    assert "x" not in json.loads(fake.get(copy + "@" + snap["key"],
                                          meta.VDI_KEYS))


# --- VDI.clone ---------------------------------------------------------------

def test_clone_of_a_snapshot(fake, sr):
    source = vdi_create(sr, name="tmpl", size=2 * GiB)
    snap = vdi_snapshot(sr, source["key"])
    copy = clone(sr, snap["key"])
    assert copy["read_write"] is True and plain(copy["keys"]) == {}
    assert (copy["name"], copy["virtual_size"]) == ("tmpl", 2 * GiB)
    assert fake.get(zvol(sr, copy["key"]), "origin") == \
        snapshot_name(fake, sr, snap["key"])
    assert set(listed(sr)) == set([source["key"], snap["key"], copy["key"]])
    # no internal snapshot for a snapshot's clone
    assert not [n for n in datasets(fake) if is_internal(n)]
    assert garbage(fake, sr) == []


def test_clone_of_a_live_volume(fake, sr):
    source = vdi_create(sr, name="vm disk", size=GiB)
    call("Volume.set", sr=sr, key=source["key"], k="keep", v="me")
    fake.write(zvol(sr, source["key"]), 100 * MiB)
    mark = len(fake.calls)
    copy = clone(sr, source["key"])
    assert copy["read_write"] is True and plain(copy["keys"]) == {}
    assert copy["virtual_size"] == GiB
    [internal] = [n for n in datasets(fake) if is_internal(n)]
    assert internal == "%s/%s@%s%s" % (sr, source["key"],
                                       meta.INTERNAL_SNAPSHOT, copy["key"])
    # marked for deferred destroy by the call itself, not later
    assert fake.get(internal, "defer_destroy") == "on"
    assert fake.get(internal, "clones") == zvol(sr, copy["key"])
    assert ["zfs", "destroy", "-d", "--", internal] in fake.calls[mark:]
    now = listed(sr)
    assert set(now) == set([source["key"], copy["key"]])
    assert plain(now[source["key"]]["keys"]) == {"vdi-type": "user",
                                                 "keep": "me"}
    assert garbage(fake, sr) == []
    destroy(sr, copy["key"])
    assert not fake.exists(internal)          # gone with its clone
    assert datasets(fake) == [sr, zvol(sr, source["key"])]


def test_clones_of_a_clone_of_a_live_volume(fake, sr):
    source = vdi_create(sr)
    first = clone(sr, source["key"])
    second = clone(sr, first["key"])
    third = clone(sr, source["key"])
    assert len([n for n in datasets(fake) if is_internal(n)]) == 3
    assert set(listed(sr)) == set(v["key"] for v in (source, first, second,
                                                     third))
    destroy_everything(sr, [source["key"], first["key"], third["key"]])
    assert_only_the_sr_is_left(fake, sr)


def test_thick_clones_are_thick(fake, thick):
    source = vdi_create(thick, size=GiB)
    snap = vdi_snapshot(thick, source["key"])
    for copy in (clone(thick, snap["key"]), clone(thick, source["key"])):
        assert int(fake.get(zvol(thick, copy["key"]), "refreservation")) > \
            GiB
        assert copy["physical_utilisation"] >= GiB


def test_a_refused_live_clone_leaves_nothing(fake, thick):
    source = vdi_create(thick, size=GiB)
    free = call("SR.stat", sr=thick)["free_space"]
    filler = vdi_create(thick, size=int((free - 512 * MiB) * 0.96))
    assert call("SR.stat", sr=thick)["free_space"] < GiB
    before = datasets(fake)
    with pytest.raises(errors.OutOfSpace):
        clone(thick, source["key"])
    assert datasets(fake) == before
    assert set(listed(thick)) == set([source["key"], filler["key"]])


# --- destroy: hide, defer, collect -------------------------------------------

def test_destroy_of_a_volume_with_snapshots_hides_it(fake, sr):
    source = vdi_create(sr)
    first = vdi_snapshot(sr, source["key"])
    second = vdi_snapshot(sr, source["key"])
    destroy(sr, source["key"])
    assert set(listed(sr)) == set([first["key"], second["key"]])
    assert fake.exists(zvol(sr, source["key"]))        # still in the pool
    assert fake.get(zvol(sr, source["key"]), meta.VDI_UUID) == meta.HIDDEN
    with pytest.raises(errors.Volume_does_not_exist):
        call("Volume.stat", sr=sr, key=source["key"])
    for op in ("Volume.snapshot", "Volume.clone"):
        with pytest.raises(errors.Volume_does_not_exist):
            call(op, sr=sr, key=source["key"])
    # its snapshots still work: stat, clone
    assert call("Volume.stat", sr=sr, key=first["key"]) == first
    copy = clone(sr, first["key"])
    destroy(sr, first["key"])                   # deferred: has a clone
    assert set(listed(sr)) == set([second["key"], copy["key"]])
    destroy(sr, second["key"])                   # the last snapshot VDI
    assert fake.exists(zvol(sr, source["key"]))   # the clone needs it
    destroy(sr, copy["key"])
    assert_only_the_sr_is_left(fake, sr)


def test_destroy_of_the_last_snapshot_frees_the_hidden_volume(fake, sr):
    source = vdi_create(sr)
    snap = vdi_snapshot(sr, source["key"])
    destroy(sr, source["key"])
    assert garbage(fake, sr) == []
    destroy(sr, snap["key"])
    assert_only_the_sr_is_left(fake, sr)
    assert listed(sr) == {}


def test_destroy_of_a_snapshot_with_a_clone_is_deferred(fake, sr):
    source = vdi_create(sr)
    snap = vdi_snapshot(sr, source["key"])
    copy = clone(sr, snap["key"])
    destroy(sr, snap["key"])
    name = snapshot_name(fake, sr, snap["key"])
    assert fake.get(name, "defer_destroy") == "on"
    assert set(listed(sr)) == set([source["key"], copy["key"]])
    with pytest.raises(errors.Volume_does_not_exist):
        call("Volume.stat", sr=sr, key=snap["key"])
    with pytest.raises(errors.Volume_does_not_exist):
        clone(sr, snap["key"])
    destroy(sr, snap["key"])                     # again: already gone
    destroy(sr, copy["key"])
    assert not fake.exists(name)
    assert datasets(fake) == [sr, zvol(sr, source["key"])]


def test_vm_revert(fake, sr):
    """Clone the snapshot, destroy the original; the snapshot is destroyed
    later while the clone lives; then the clone goes: nothing is left."""
    original = vdi_create(sr, name="vm")
    snap = vdi_snapshot(sr, original["key"])
    reverted = clone(sr, snap["key"])
    call("Volume.set", sr=sr, key=reverted["key"], k="vdi-type", v="user")
    destroy(sr, original["key"])
    assert set(listed(sr)) == set([snap["key"], reverted["key"]])
    destroy(sr, snap["key"])
    assert set(listed(sr)) == set([reverted["key"]])
    assert garbage(fake, sr) == []
    assert plain(call("Volume.stat", sr=sr, key=reverted["key"])["keys"]) \
        == {"vdi-type": "user"}
    destroy(sr, reverted["key"])
    assert_only_the_sr_is_left(fake, sr)


ROLLING_ORDERS = [(0, 1, 2), (4, 3, 2), (1, 3, 0), (2, 0, 4), ("v", 0, 1),
                  (3, "v", 1), (1, 4, "v")]


@pytest.mark.parametrize("order", ROLLING_ORDERS,
                         ids=["-".join(map(str, o)) for o in ROLLING_ORDERS])
def test_rolling_snapshots(fake, sr, order):
    """Five snapshots, clones of two of them; three destroyed (and the VDI
    itself when 'v' says so), then everything: nothing is left."""
    source = vdi_create(sr)
    snaps = [vdi_snapshot(sr, source["key"])["key"] for _ in range(5)]
    clones = [clone(sr, snaps[1])["key"], clone(sr, snaps[3])["key"]]
    alive = set([source["key"]] + snaps + clones)
    for which in order:
        key = source["key"] if which == "v" else snaps[which]
        destroy(sr, key)
        alive.discard(key)
        assert set(listed(sr)) == alive
        assert garbage(fake, sr) == []
        for other in alive:
            call("Volume.stat", sr=sr, key=other)
    destroy_everything(sr)
    assert_only_the_sr_is_left(fake, sr)


def _chain(sr):
    """V0 -> S0 -> C1 (clone) -> S1 -> C2 -> live clone C3 -> S3, plus a
    live clone C4 of V0: every kind of dependency zfs-ng makes."""
    v0 = vdi_create(sr)["key"]
    s0 = vdi_snapshot(sr, v0)["key"]
    c1 = clone(sr, s0)["key"]
    s1 = vdi_snapshot(sr, c1)["key"]
    c2 = clone(sr, s1)["key"]
    c3 = clone(sr, c2)["key"]
    s3 = vdi_snapshot(sr, c3)["key"]
    c4 = clone(sr, v0)["key"]
    return [v0, s0, c1, s1, c2, c3, s3, c4]


def _orders():
    rng = random.Random(20240517)
    orders = [list(range(8)), list(reversed(range(8))),
              [0, 2, 4, 1, 3, 5, 7, 6], [5, 0, 1, 2, 3, 4, 6, 7],
              [7, 6, 5, 4, 3, 2, 1, 0]]
    for _ in range(8):
        order = list(range(8))
        rng.shuffle(order)
        orders.append(order)
    return orders


@pytest.mark.parametrize("order", _orders(),
                         ids=["".join(map(str, o)) for o in _orders()])
def test_chains_are_fully_collected(fake, sr, order):
    keys = _chain(sr)
    alive = set(keys)
    for index in order:
        destroy(sr, keys[index])
        alive.discard(keys[index])
        assert set(listed(sr)) == alive
        assert garbage(fake, sr) == []
    assert_only_the_sr_is_left(fake, sr)


def test_a_hidden_chain_keeps_serving_its_last_clone(fake, sr):
    keys = _chain(sr)
    for key in keys[:5] + keys[6:]:           # all but C3
        destroy(sr, key)
    assert set(listed(sr)) == set([keys[5]])
    # C3 still reads through every hidden parent
    c3 = zvol(sr, keys[5])
    names = []
    while c3:
        names.append(c3)
        origin = fake.get(c3.split("@")[0], "origin")
        c3 = origin and origin.split("@")[0]
    assert len(names) == 4                    # C3 <- C2 <- C1 <- V0
    assert all(fake.exists(n) for n in names)
    destroy(sr, keys[5])
    assert_only_the_sr_is_left(fake, sr)


# --- repeated and clone-on-boot destroys -------------------------------------

def test_repeated_destroy_of_a_key_already_gone(fake, sr):
    volume = vdi_create(sr)
    snap = vdi_snapshot(sr, volume["key"])
    for key in (snap["key"], volume["key"]):
        destroy(sr, key)
        mark = len(fake.calls)
        destroy(sr, key)
        assert fake.mutations(since=mark) == []
    assert_only_the_sr_is_left(fake, sr)


def test_vdi_destroy_with_clone_on_boot(fake, sr):
    """Reset-on-boot without NONPERSISTENT: xapi clones the VDI, records the
    clone under clone-on-boot; VDI.destroy then calls Volume.destroy on the
    VDI's own key twice (main.ml), and the transient clone stays listed
    until destroyed on its own."""
    vdi = vdi_create(sr)
    transient = clone(sr, vdi["key"])
    call("Volume.set", sr=sr, key=vdi["key"], k="clone-on-boot",
         v=transient["key"])
    destroy(sr, vdi["key"])
    destroy(sr, vdi["key"])
    assert set(listed(sr)) == set([transient["key"]])
    assert garbage(fake, sr) == []
    destroy(sr, transient["key"])
    destroy(sr, transient["key"])
    assert_only_the_sr_is_left(fake, sr)


def test_admin_snapshots_are_never_destroyed_nor_listed(fake, sr):
    vdi = vdi_create(sr)
    snap = vdi_snapshot(sr, vdi["key"])
    admin = "%s@before-upgrade" % zvol(sr, vdi["key"])
    fake.admin("zfs snapshot %s" % admin)
    copy = clone(sr, vdi["key"])
    assert set(listed(sr)) == set([vdi["key"], snap["key"], copy["key"]])
    with pytest.raises(errors.Volume_does_not_exist):
        call("Volume.stat", sr=sr, key="before-upgrade")
    destroy_everything(sr)
    assert listed(sr) == {}
    assert fake.exists(admin)
    # the hidden zvol stays for the admin's snapshot, nothing else does
    assert datasets(fake) == [sr, zvol(sr, vdi["key"]), admin]
    assert call("SR.attach", configuration=fake.sr_config) == sr
    assert fake.exists(admin)


def test_a_pending_reset_point_does_not_keep_a_destroyed_vdi(fake, sr):
    """The datapath's @zfsng-nonpersistent snapshot is zfs-ng's own: a VDI
    destroyed while a reset-on-boot is pending is freed, not hidden."""
    vdi = vdi_create(sr)
    fake.admin("zfs snapshot %s@zfsng-nonpersistent" % zvol(sr, vdi["key"]))
    call("Volume.destroy", sr=sr, key=vdi["key"])
    assert datasets(fake) == [sr]


# --- resize ------------------------------------------------------------------

def test_resize_grows_rounded_to_the_volblocksize(fake, sr):
    volume = vdi_create(sr, size=GiB)
    block = int(fake.get(zvol(sr, volume["key"]), "volblocksize"))
    assert call("Volume.resize", sr=sr, key=volume["key"],
                new_size=2 * GiB + 1) is None
    stat = call("Volume.stat", sr=sr, key=volume["key"])   # as xapi does
    assert stat["virtual_size"] == 2 * GiB + block
    assert stat["keys"] == volume["keys"]
    assert int(fake.get(zvol(sr, volume["key"]), "volsize")) == \
        2 * GiB + block


def test_resize_to_the_same_size_is_a_no_op(fake, sr):
    volume = vdi_create(sr, size=GiB)
    mark = len(fake.calls)
    call("Volume.resize", sr=sr, key=volume["key"], new_size=GiB)
    assert fake.mutations(since=mark) == []
    assert call("Volume.stat", sr=sr, key=volume["key"]) == volume


@pytest.mark.parametrize("new_size", [GiB - 1, GiB // 2, 1, 0])
def test_shrink_is_refused(fake, sr, new_size):
    volume = vdi_create(sr, size=GiB)
    mark = len(fake.calls)
    with pytest.raises(errors.VdiShrinkNotAllowed) as info:
        call("Volume.resize", sr=sr, key=volume["key"], new_size=new_size)
    assert info.value.code == "SR_BACKEND_FAILURE_79"
    assert fake.mutations(since=mark) == []
    assert call("Volume.stat", sr=sr, key=volume["key"])["virtual_size"] == \
        GiB


def test_resize_of_a_snapshot_is_refused(fake, sr):
    volume = vdi_create(sr, size=GiB)
    snap = vdi_snapshot(sr, volume["key"])
    mark = len(fake.calls)
    with pytest.raises(errors.InvalidArgument):
        call("Volume.resize", sr=sr, key=snap["key"], new_size=2 * GiB)
    assert fake.mutations(since=mark) == []


def test_resize_of_a_hidden_or_unknown_volume(fake, sr):
    volume = vdi_create(sr)
    vdi_snapshot(sr, volume["key"])
    destroy(sr, volume["key"])
    for key in (volume["key"], "2f6b2e1c-0000-4000-8000-000000000000"):
        with pytest.raises(errors.Volume_does_not_exist):
            call("Volume.resize", sr=sr, key=key, new_size=2 * GiB)


def test_thick_resize_keeps_the_reservation(fake, thick):
    volume = vdi_create(thick, size=GiB)
    call("Volume.resize", sr=thick, key=volume["key"], new_size=3 * GiB)
    reserved = int(fake.get(zvol(thick, volume["key"]), "refreservation"))
    assert reserved >= 3 * GiB
    assert call("Volume.stat", sr=thick, key=volume["key"])[
        "physical_utilisation"] == reserved


def test_thin_resize_stays_thin(fake, sr):
    volume = vdi_create(sr, size=GiB)
    call("Volume.resize", sr=sr, key=volume["key"], new_size=30 * GiB)
    assert fake.get(zvol(sr, volume["key"]), "refreservation") == "0"


def test_a_refused_thick_resize_changes_nothing(fake, thick):
    volume = vdi_create(thick, size=GiB)
    with pytest.raises(errors.OutOfSpace):
        call("Volume.resize", sr=thick, key=volume["key"],
             new_size=40 * GiB)
    assert call("Volume.stat", sr=thick, key=volume["key"]) == volume


# --- SR.ls and the numbers ---------------------------------------------------

def _populate(sr, count):
    keys = []
    for _ in range(count):
        key = vdi_create(sr)["key"]
        snap = vdi_snapshot(sr, key)["key"]
        keys += [key, snap, clone(sr, snap)["key"], clone(sr, key)["key"]]
    return keys


def test_ls_costs_the_same_whatever_the_number_of_vdis(fake, sr):
    counts = []
    for _ in range(3):
        _populate(sr, 4)
        destroy(sr, list(listed(sr))[0])        # some hidden ones too
        mark = len(fake.calls)
        call("SR.ls", sr=sr)
        counts.append(len(fake.calls) - mark)
    assert counts[0] == counts[1] == counts[2] <= 2


def test_ls_is_one_zfs_command(fake, sr):
    _populate(sr, 3)
    mark = len(fake.calls)
    volumes = call("SR.ls", sr=sr)
    assert len(volumes) == 12
    [argv] = fake.calls[mark:]
    assert argv[:3] == ["zfs", "list", "-Hp"] and argv[-2:] == ["--", sr]


def test_ls_lists_snapshots_clones_and_hides_the_rest(fake, sr):
    keys = _populate(sr, 2)
    destroy(sr, keys[0])          # hidden: has a snapshot and a clone
    destroy(sr, keys[1])          # deferred: has a clone
    volumes = call("SR.ls", sr=sr)
    assert sorted(v["key"] for v in volumes) == sorted(keys[2:])
    for volume in volumes:
        assert volume == call("Volume.stat", sr=sr, key=volume["key"])
    snaps = [v for v in volumes if not v["read_write"]]
    assert [v["key"] for v in snaps] == [keys[5]]


def test_physical_utilisation_is_plausible(fake, sr):
    volume = vdi_create(sr, size=4 * GiB)
    assert volume["physical_utilisation"] < MiB
    fake.write(zvol(sr, volume["key"]), 300 * MiB)
    used = call("Volume.stat", sr=sr, key=volume["key"])[
        "physical_utilisation"]
    assert 300 * MiB <= used < 301 * MiB
    snap = vdi_snapshot(sr, volume["key"])
    assert snap["physical_utilisation"] == 0     # shares every block
    fake.write(zvol(sr, volume["key"]), 0, overwrite=50 * MiB)
    assert call("Volume.stat", sr=sr, key=snap["key"])[
        "physical_utilisation"] == 50 * MiB      # what only it holds now
    copy = clone(sr, snap["key"])
    assert copy["physical_utilisation"] < MiB    # a clone shares its origin
    fake.write(zvol(sr, copy["key"]), 10 * MiB)
    assert 10 * MiB <= call("Volume.stat", sr=sr, key=copy["key"])[
        "physical_utilisation"] < 11 * MiB
    for v in listed(sr).values():
        assert 0 <= v["physical_utilisation"] <= v["virtual_size"] + 64 * MiB
