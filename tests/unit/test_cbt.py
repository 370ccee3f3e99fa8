"""Changed block tracking (cbt.py) through the plugin's methods:
Volume.enable_cbt, disable_cbt, list_changed_blocks and data_destroy, and
what they do to the other Volume methods.

What a guest wrote is declared to the fake (``guest_write``,
``guest_free``); the fake answers ``zfs send -i`` with a real stream of
the blocks born since the base (fakezfs._zfs_send), so the whole chain,
stream reader and allocation maps included, runs as on a host.
"""

import base64
import fcntl
import os

import pytest

from zfsng import collect, errors, lock, meta, runner
from zfsng_volume import cbt

import fakezfs
from conftest import call, check_fake_host, create_sr
from crashpoint import CrashAfter, CrashAfterCommand, Killed, commands_run, \
    installed
from test_vdi_semantics import datasets, destroy, listed, vdi_create, \
    vdi_snapshot

KiB, MiB = fakezfs.KiB, fakezfs.MiB
G = 64 * KiB             # the bitmap's granularity
B = 16 * KiB             # the SR's volblocksize
SIZE = 64 * MiB


@pytest.fixture
def sr(fake):
    fake.user_value_cap = None
    return create_sr()[0]


def tracked(sr, size=SIZE, cbt=True):
    key = vdi_create(sr, size=size, name="tracked",
                     description="backed up")["key"]
    call("Volume.set", sr=sr, key=key, k="vdi-type", v="user")
    if cbt:
        call("Volume.enable_cbt", sr=sr, key=key)
    return key


def zvol(sr, key):
    return "%s/%s" % (sr, key)


def snap(sr, key):
    return vdi_snapshot(sr, key)["key"]


def lcb(sr, key, key2, offset=0, length=-1):
    return call("Volume.list_changed_blocks", sr=sr, key=key, key2=key2,
                offset=offset, length=length)


def granules(result, size=SIZE):
    """The blocks a list_changed_blocks result marks (checked: the
    granularity, and one bit per block of size bytes, rounded to bytes)."""
    assert result["granularity"] == G
    raw = bytearray(base64.b64decode(result["bitmap"]))
    assert len(raw) == ((size + G - 1) // G + 7) // 8
    return [i for i in range(len(raw) * 8) if raw[i // 8] & (0x80 >> i % 8)]


def stat(sr, key):
    return call("Volume.stat", sr=sr, key=key)


def snapshot_of(fake, sr, key):
    [name] = [n for n in datasets(fake) if n.endswith("@" + key)]
    return name


def data_destroyed(fake, sr, key):
    """Snapshot VDI key of a tracked VDI, its data destroyed."""
    name = snapshot_of(fake, sr, key)
    call("Volume.data_destroy", sr=sr, key=key)
    return name


# --- enable / disable ----------------------------------------------------------

def test_query_lists_vdi_config_cbt():
    assert "VDI_CONFIG_CBT" in call("Plugin.Query")["features"]


def test_enable_and_disable_show_in_stat_and_ls(fake, sr):
    key = tracked(sr, cbt=False)
    assert stat(sr, key)["cbt_enabled"] is False
    call("Volume.enable_cbt", sr=sr, key=key)
    assert stat(sr, key)["cbt_enabled"] is True
    assert listed(sr)[key]["cbt_enabled"] is True
    call("Volume.disable_cbt", sr=sr, key=key)
    assert stat(sr, key)["cbt_enabled"] is False
    assert listed(sr)[key]["cbt_enabled"] is False


def test_snapshots_keep_cbt_after_disable_on_their_vdi(fake, sr):
    key = tracked(sr)
    before = snap(sr, key)
    assert stat(sr, before)["cbt_enabled"] is True
    call("Volume.disable_cbt", sr=sr, key=key)
    after = snap(sr, key)
    assert stat(sr, before)["cbt_enabled"] is True
    assert listed(sr)[before]["cbt_enabled"] is True
    assert stat(sr, after)["cbt_enabled"] is False


def test_disable_drops_the_maps_of_the_snapshots(fake, sr):
    key = tracked(sr)
    a, b = snap(sr, key), snap(sr, key)
    lcb(sr, a, b)
    assert meta.CBT_MAP in fake.local_props(snapshot_of(fake, sr, b))
    call("Volume.disable_cbt", sr=sr, key=key)
    for k in (a, b):
        assert meta.CBT_MAP not in fake.local_props(snapshot_of(fake, sr, k))


# --- list_changed_blocks ---------------------------------------------------------

def test_changes_between_snapshots_are_exactly_the_written_blocks(fake, sr):
    key = tracked(sr)
    fake.guest_write(zvol(sr, key), 0, B)
    a = snap(sr, key)
    fake.guest_write(zvol(sr, key), 1 * MiB, 100)           # block 16
    fake.guest_write(zvol(sr, key), 3 * MiB + G - 1, 2)     # blocks 48, 49
    b = snap(sr, key)
    assert granules(lcb(sr, a, b)) == [16, 48, 49]


def test_a_free_counts_only_where_the_base_may_have_data(fake, sr):
    key = tracked(sr)
    fake.guest_write(zvol(sr, key), 0, 4 * G)
    a = snap(sr, key)
    fake.guest_free(zvol(sr, key), G, G)             # data: a change
    fake.guest_free(zvol(sr, key), 32 * MiB, MiB)    # never written
    b = snap(sr, key)
    assert granules(lcb(sr, a, b)) == [1]


def test_the_first_list_of_a_chain_is_exact_from_its_bases_block_tree(
        fake, sr):
    key = tracked(sr)
    fake.guest_write(zvol(sr, key), 0, B)
    fake.guest_write(zvol(sr, key), 10 * MiB, B)    # a's last block
    a = snap(sr, key)
    fake.guest_write(zvol(sr, key), 5 * B, B)
    b = snap(sr, key)
    fake.guest_write(zvol(sr, key), 7 * B, B)
    c = snap(sr, key)
    since = len(fake.calls)
    # a's map, from a's block tree (zdb, metadata only), is exact
    assert granules(lcb(sr, a, b)) == [1]
    trees = [argv[-2] for argv in fake.ran("zdb", since=since)
             if "-ddddd" in argv]
    assert trees == [snapshot_of(fake, sr, a), snapshot_of(fake, sr, b)]
    assert fake.ran("zfs", "send", since=since) == []
    assert meta.CBT_MAP in fake.local_props(snapshot_of(fake, sr, a))
    assert meta.CBT_MAP in fake.local_props(snapshot_of(fake, sr, b))
    since = len(fake.calls)
    assert granules(lcb(sr, b, c)) == [1]
    assert len(fake.ran("zdb", since=since)) == 1   # b has a map


def test_changes_to_the_live_disk_leave_no_snapshot_behind(fake, sr):
    key = tracked(sr)
    fake.guest_write(zvol(sr, key), 0, G)
    a = snap(sr, key)
    fake.guest_write(zvol(sr, key), 2 * G, 1)
    before = datasets(fake)
    since = len(fake.calls)
    assert granules(lcb(sr, a, key)) == [2]
    assert datasets(fake) == before
    taken = [argv[-1] for argv in fake.ran("zfs", "snapshot", since=since)]
    assert len(taken) == 1 and "@" + meta.CBT_SNAPSHOT in taken[0]
    assert fake.ran("zfs", "destroy", "--", taken[0], since=since)


def _sr_lock_free(sr):
    """Whether the SR lock can be had now (one non-blocking try)."""
    fd = os.open(lock._path("sr-" + sr), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _while_listing(fake, monkeypatch, check):
    """check(argv) run while each streamed command of the call runs."""
    real = fake.stream

    def stream(argv, consume, **bound):
        check(argv)
        return real(argv, consume, **bound)
    monkeypatch.setattr(fake, "stream", stream)


def test_a_list_to_the_live_disk_reads_without_the_sr_lock(
        fake, sr, monkeypatch):
    """Reading may take minutes: VM starts on the SR must not wait."""
    key = tracked(sr)
    fake.guest_write(zvol(sr, key), 0, G)
    a = snap(sr, key)
    lcb(sr, a, key)                       # a's map made
    fake.guest_write(zvol(sr, key), 2 * G, 1)
    seen = []
    _while_listing(fake, monkeypatch,
                   lambda argv: seen.append((argv[0], _sr_lock_free(sr))))
    assert granules(lcb(sr, a, key)) == [2]
    assert seen == [("zdb", True)]


def test_the_collector_leaves_a_snapshot_being_listed(fake, sr,
                                                      monkeypatch):
    key = tracked(sr)
    fake.guest_write(zvol(sr, key), 0, G)
    a = snap(sr, key)
    lcb(sr, a, key)
    fake.guest_write(zvol(sr, key), 2 * G, 1)

    def collect_now(argv):
        collect.collect(sr)
        assert [n for n in datasets(fake) if meta.CBT_SNAPSHOT in n]
    _while_listing(fake, monkeypatch, collect_now)
    assert granules(lcb(sr, a, key)) == [2]
    assert not [n for n in datasets(fake) if meta.CBT_SNAPSHOT in n]
    assert not [f for f in os.listdir(lock.RUN_DIR) if "reading-" in f]


def test_the_bound_of_a_list_grows_with_the_data_not_a_fixed_cap(fake, sr):
    """A list of a disk holding much data must not be killed at the bound
    of a plain command (120 s): that capped the size of a delta, and once
    over it every later, larger delta failed too. The bound covers the
    block pointers zdb may print, and the call's deadline is raised to
    hold it."""
    key = tracked(sr, size=2 * fakezfs.TiB)
    fake.write(zvol(sr, key), 8 * fakezfs.GiB)   # data, as a count
    fake.guest_write(zvol(sr, key), 0, G)
    a = snap(sr, key)
    fake.guest_write(zvol(sr, key), fakezfs.TiB, G)
    b = snap(sr, key)
    runner.start_call()
    try:
        assert granules(lcb(sr, a, b), 2 * fakezfs.TiB) == [16 * 1024 * 1024]
        bounds = [bound for argv, bound in fake.bounds if argv[0] == "zdb"]
        least = runner.DEFAULT_TIMEOUT + 8 * fakezfs.GiB / B / cbt.ZDB_RATE
        assert bounds and min(bounds) >= least
        assert runner.remaining() > least
    finally:
        runner._deadline["at"] = None


def test_changes_from_a_data_destroyed_base_use_its_bookmark(fake, sr):
    key = tracked(sr)
    fake.guest_write(zvol(sr, key), 0, 4 * G)
    a = snap(sr, key)
    fake.guest_write(zvol(sr, key), 6 * G, 1)
    fake.guest_free(zvol(sr, key), 0, G)
    b = snap(sr, key)
    name = data_destroyed(fake, sr, a)
    since = len(fake.calls)
    assert granules(lcb(sr, a, b)) == [0, 6]
    assert fake.ran("zfs", "get", "-Hp", "-o", "value", "-t", "all",
                    "createtxg", "--", meta.bookmark(name), since=since)
    [tree] = fake.ran("zdb", since=since)
    assert tree[-3:] == ["-ddddd", snapshot_of(fake, sr, b), "1"]


def test_the_window_is_offset_and_length(fake, sr):
    key = tracked(sr)
    a = snap(sr, key)
    for block in (0, 3, 4, 9):
        fake.guest_write(zvol(sr, key), block * G, 1)
    b = snap(sr, key)
    result = lcb(sr, a, b, offset=3 * G, length=2 * G)
    assert granules(result, 2 * G) == [0, 1]
    assert granules(lcb(sr, a, b, offset=SIZE - G, length=-1), G) == []


@pytest.mark.parametrize("case,error", [
    ("base is the live disk", errors.InvalidArgument),
    ("unknown base", errors.Volume_does_not_exist),
    ("unknown target", errors.Volume_does_not_exist),
    ("target data-destroyed", errors.DataDestroyed),
    ("offset not on a block", errors.InvalidArgument),
])
def test_bad_keys_give_typed_errors_and_change_nothing(fake, sr, case,
                                                       error):
    key = tracked(sr)
    a, b = snap(sr, key), snap(sr, key)
    gone = snap(sr, key)
    call("Volume.data_destroy", sr=sr, key=gone)
    missing = "00000000-0000-4000-8000-000000000001"
    args = {"base is the live disk": (key, b, 0),
            "unknown base": (missing, b, 0),
            "unknown target": (a, missing, 0),
            "target data-destroyed": (a, gone, 0),
            "offset not on a block": (a, b, 512)}[case]
    since = len(fake.calls)
    with pytest.raises(error):
        lcb(sr, args[0], args[1], offset=args[2])
    assert fake.mutations(since) == []


def test_a_failed_zdb_is_sent_instead_and_both_failed_keeps_no_map(
        fake, sr):
    key = tracked(sr)
    fake.guest_write(zvol(sr, key), 0, G)
    a = snap(sr, key)
    fake.guest_write(zvol(sr, key), 2 * G, 1)
    b = snap(sr, key)
    fake.inject("zdb -e", "zdb: can't open 'tank': I/O error", times=1)
    since = len(fake.calls)
    assert granules(lcb(sr, a, b)) == [2]
    assert len(fake.ran("zfs", "send", since=since)) == 1
    c = snap(sr, key)
    fake.inject("zdb -e", "zdb: can't open 'tank': I/O error", times=-1)
    fake.inject("zfs send", "warning: cannot send 'x': Input/output error",
                times=-1)
    b = c
    with pytest.raises(errors.ZfsError) as err:
        lcb(sr, a, b)
    assert "Input/output error" in str(err.value)
    assert meta.CBT_MAP not in fake.local_props(snapshot_of(fake, sr, b))


def test_a_base_of_another_disk_is_refused_typed(fake, sr):
    one, two = tracked(sr), tracked(sr)
    a, b = snap(sr, one), snap(sr, two)
    with pytest.raises(errors.ZfsError) as err:
        lcb(sr, a, b)
    assert "not an earlier snapshot" in str(err.value)
    with pytest.raises(errors.ZfsError):
        lcb(sr, b, a)


def test_without_a_full_send_or_zdb_the_first_list_is_bounded_by_the_size(
        fake, sr):
    key = tracked(sr, size=4 * MiB)
    fake.guest_write(zvol(sr, key), 0, B)
    a = snap(sr, key)
    fake.guest_write(zvol(sr, key), G, B)
    b = snap(sr, key)
    fake.inject("zfs send -L -e -c " + snapshot_of(fake, sr, a),
                "warning: cannot send 'x': Input/output error")
    fake.inject("zdb -e", "failed to hold dataset: I/O error", rc=2,
                times=-1)
    # never-written holes of a's indirect block count up to its size
    assert granules(lcb(sr, a, b), 4 * MiB) == list(range(64))


# --- data_destroy ---------------------------------------------------------------

def test_data_destroy_refuses_a_live_vdi_and_an_untracked_snapshot(fake,
                                                                   sr):
    key = tracked(sr, cbt=False)
    plain = snap(sr, key)
    since = len(fake.calls)
    with pytest.raises(errors.InvalidArgument):
        call("Volume.data_destroy", sr=sr, key=key)
    with pytest.raises(errors.CbtNotEnabled):
        call("Volume.data_destroy", sr=sr, key=plain)
    assert fake.mutations(since) == []
    assert set(listed(sr)) == {key, plain}


def test_data_destroy_leaves_a_bookmark_and_an_empty_zvol(fake, sr):
    key = tracked(sr)
    fake.guest_write(zvol(sr, key), 0, MiB)
    a = snap(sr, key)
    call("Volume.set", sr=sr, key=a, k="vdi-type", v="user")
    b = snap(sr, key)
    lcb(sr, a, b)                                 # b gets a map
    name = data_destroyed(fake, sr, b)
    assert not fake.exists(name)
    assert fake.dataset(meta.bookmark(name)).kind == "bookmark"
    stub = fake.dataset(zvol(sr, b))
    assert stub.kind == "volume" and stub.props["volmode"] == "none"
    was = fake.local_props(snapshot_of(fake, sr, a))   # a's twin
    for prop in (meta.VDI_NAME, meta.VDI_DESCRIPTION, meta.CBT_ENABLED):
        assert stub.props[prop] == was[prop]
    assert stub.props[meta.VDI_UUID] == b
    assert stub.props[meta.CBT_BOOKMARK] == meta.bookmark(name)
    assert meta.CBT_MAP in stub.props
    assert stub.refer < MiB


def test_a_data_destroyed_vdi_stays_listed_read_only(fake, sr):
    key = tracked(sr)
    s = snap(sr, key)
    before = stat(sr, s)
    call("Volume.data_destroy", sr=sr, key=s)
    after = listed(sr)[s]
    assert after["read_write"] is False
    for field in ("name", "description", "keys", "virtual_size",
                  "cbt_enabled"):
        assert after[field] == before[field], field
    assert stat(sr, s) == after


def test_set_and_unset_work_on_a_data_destroyed_vdi(fake, sr):
    key = tracked(sr)
    s = snap(sr, key)
    call("Volume.data_destroy", sr=sr, key=s)
    call("Volume.set", sr=sr, key=s, k="vdi-type", v="cbt_metadata")
    call("Volume.unset", sr=sr, key=s, k="snapshot_time")
    call("Volume.set_name", sr=sr, key=s, new_name="metadata only")
    keys = stat(sr, s)["keys"]
    assert keys["vdi-type"] == "cbt_metadata"
    assert "snapshot_time" not in keys and keys["snapshot_of"] == key
    assert stat(sr, s)["name"] == "metadata only"


def test_data_destroy_twice_is_fine(fake, sr):
    key = tracked(sr)
    s = snap(sr, key)
    call("Volume.data_destroy", sr=sr, key=s)
    before = sorted(datasets(fake))
    since = len(fake.calls)
    assert call("Volume.data_destroy", sr=sr, key=s) is None
    assert fake.mutations(since) == []
    assert sorted(datasets(fake)) == before


def test_data_destroy_of_a_snapshot_with_clones_is_deferred(fake, sr):
    key = tracked(sr)
    s = snap(sr, key)
    copy = call("Volume.clone", sr=sr, key=s)["key"]
    name = data_destroyed(fake, sr, s)
    assert fake.dataset(name).defer_destroy
    assert set(listed(sr)) == {key, s, copy}
    assert listed(sr)[s]["read_write"] is False
    destroy(sr, copy)
    assert not fake.exists(name)
    assert set(listed(sr)) == {key, s}


def test_destroy_of_a_data_destroyed_vdi_removes_bookmark_and_zvol(fake,
                                                                  sr):
    key = tracked(sr)
    s = snap(sr, key)
    name = data_destroyed(fake, sr, s)
    destroy(sr, s)
    assert not fake.exists(meta.bookmark(name))
    assert not fake.exists(zvol(sr, s))
    assert set(listed(sr)) == {key}
    destroy(sr, s)          # xapi repeats destroys


def test_the_live_vdi_is_hidden_until_its_last_metadata_snapshot_goes(
        fake, sr):
    key = tracked(sr)
    s1, s2 = snap(sr, key), snap(sr, key)
    for s in (s1, s2):
        call("Volume.data_destroy", sr=sr, key=s)
    destroy(sr, key)
    assert set(listed(sr)) == {s1, s2}
    assert fake.get(zvol(sr, key), meta.VDI_UUID) == meta.HIDDEN
    destroy(sr, s1)
    assert fake.exists(zvol(sr, key))
    destroy(sr, s2)
    assert fake.admin("zfs list -Hp -o name -t all -r tank") == "tank\n"


@pytest.mark.parametrize("method,args,error", [
    ("Volume.clone", {}, errors.DataDestroyed),
    ("Volume.resize", {"new_size": 2 * SIZE}, errors.DataDestroyed),
    ("Volume.snapshot", {}, errors.InvalidArgument),
    ("Volume.enable_cbt", {}, errors.DataDestroyed),
    ("Volume.disable_cbt", {}, errors.DataDestroyed),
])
def test_a_data_destroyed_vdi_refuses_what_needs_data(fake, sr, method,
                                                      args, error):
    key = tracked(sr)
    s = snap(sr, key)
    call("Volume.data_destroy", sr=sr, key=s)
    since = len(fake.calls)
    with pytest.raises(error):
        call(method, sr=sr, key=s, **args)
    assert fake.mutations(since) == []


def _during_the_map(fake, monkeypatch, then):
    """[what then() returned, or raised], then() run once in the middle
    of data_destroy's map: after its zdb read of the snapshot, before the
    call goes on. Another call waits at most 0.2 s for the SR lock
    (SrBusy past that: kept, else zdb's fallback would hide it)."""
    monkeypatch.setattr(lock, "WAIT", 0.2)
    real, done = fake.stream, []

    def stream(argv, consume, **bound):
        result = real(argv, consume, **bound)
        if argv[0] == "zdb" and not done:
            try:
                done.append(then())
            except errors.StorageError as exc:
                done.append(exc)
        return result
    monkeypatch.setattr(fake, "stream", stream)
    return done


def _mapped_snapshot(fake, sr):
    """A tracked VDI with data and its snapshot VDI, which has no map
    yet (data_destroy reads it whole): (key, s, the snapshot's name)."""
    key = tracked(sr)
    fake.guest_write(zvol(sr, key), 0, MiB)
    s = snap(sr, key)
    return key, s, snapshot_of(fake, sr, s)


def test_data_destroy_maps_without_the_sr_lock(fake, sr, monkeypatch):
    """The map may take an hour (a full zdb read): VM starts, stops and
    snapshots on the SR go on meanwhile instead of failing SrBusy."""
    key, s, name = _mapped_snapshot(fake, sr)
    other = tracked(sr)
    done = _during_the_map(fake, monkeypatch, lambda: snap(sr, other))
    call("Volume.data_destroy", sr=sr, key=s)
    assert len(done) == 1 and done[0] in listed(sr)
    assert not fake.exists(name)
    assert listed(sr)[s]["read_write"] is False
    assert meta.CBT_MAP in fake.local_props(zvol(sr, s))


def test_the_collector_leaves_a_snapshot_being_mapped(fake, sr,
                                                      monkeypatch):
    """The VDI destroyed while its snapshot is mapped (its zvol hidden,
    the collector run) and the collector run again under the SR lock: the
    snapshot stays, held (lock.reading), and its data_destroy ends."""
    key, s, name = _mapped_snapshot(fake, sr)

    def collect_now():
        destroy(sr, key)
        with lock.sr_lock(sr):
            collect.collect(sr)
        return fake.exists(name), lock.being_read(name)
    done = _during_the_map(fake, monkeypatch, collect_now)
    call("Volume.data_destroy", sr=sr, key=s)
    assert done == [(True, True)]
    assert set(listed(sr)) == {s}
    assert fake.exists(meta.bookmark(name)) and not fake.exists(name)
    assert not [f for f in os.listdir(lock.RUN_DIR) if "reading-" in f]
    destroy(sr, s)
    assert fake.admin("zfs list -Hp -o name -t all -r tank") == "tank\n"


def test_a_snapshot_destroyed_during_the_map_fails_typed(fake, sr,
                                                         monkeypatch):
    key, s, name = _mapped_snapshot(fake, sr)
    done = _during_the_map(fake, monkeypatch,
                           lambda: (destroy(sr, s), len(fake.calls))[1])
    with pytest.raises(errors.Volume_does_not_exist):
        call("Volume.data_destroy", sr=sr, key=s)
    assert len(done) == 1 and fake.mutations(done[0]) == []
    assert not fake.exists(meta.bookmark(name))
    assert set(listed(sr)) == {key}
    with pytest.raises(errors.Volume_does_not_exist):   # xapi: done
        call("Volume.data_destroy", sr=sr, key=s)


def _revert_to_older(fake, sr, key, s):
    """Volume.revert of key to a snapshot older than s: s moves with the
    zvol set aside (another name)."""
    older = [k for k in listed(sr) if k not in (key, s)][0]
    call("Volume.revert", sr=sr, snapshot=older, key=key)
    return snapshot_of(fake, sr, s)


def _taken_again(fake, sr, key, s):
    """s destroyed and another snapshot taken by its name, made the VDI
    (a later createtxg)."""
    name = snapshot_of(fake, sr, s)
    fake.admin("zfs destroy %s" % name)
    fake.guest_write(zvol(sr, key), 2 * MiB, MiB)
    fake.admin("zfs snapshot %s" % name)
    fake.admin("zfs set %s=%s %s" % (meta.VDI_UUID, s, name))
    return name


@pytest.mark.parametrize("change", [_revert_to_older, _taken_again],
                         ids=["reverted", "taken-again"])
def test_a_snapshot_changed_during_the_map_fails_typed_then_retries(
        fake, sr, monkeypatch, change):
    """Nothing is changed (the map is not even kept on the snapshot), and
    a retry data-destroys the snapshot the VDI has then."""
    key = tracked(sr)
    snap(sr, key)                                   # what a revert takes
    fake.guest_write(zvol(sr, key), 0, MiB)
    s = snap(sr, key)
    done = _during_the_map(fake, monkeypatch, lambda: (
        change(fake, sr, key, s), len(fake.calls)))
    with pytest.raises(errors.SnapshotChanged) as err:
        call("Volume.data_destroy", sr=sr, key=s)
    assert "changed while its allocation map was read" in str(err.value)
    [(now, since)] = done
    assert fake.mutations(since) == []
    assert not fake.exists(meta.bookmark(now))
    assert meta.CBT_MAP not in fake.local_props(now)
    assert listed(sr)[s]["read_write"] is False     # a snapshot, as before
    call("Volume.data_destroy", sr=sr, key=s)
    assert not fake.exists(now) and fake.exists(meta.bookmark(now))
    assert fake.get(zvol(sr, s), meta.CBT_BOOKMARK) == meta.bookmark(now)


# --- crash points ---------------------------------------------------------------

def _fresh(with_clone=False):
    """A host with an SR (its stored device-config in host.sr_config), a
    tracked VDI with keys and a snapshot VDI s (cloned if with_clone):
    (host, sr, key, s, keys of s)."""
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, host.sr_config = create_sr()
        key = tracked(sr)
        host.guest_write(zvol(sr, key), 0, MiB)
        s = snap(sr, key)
        if with_clone:
            call("Volume.clone", sr=sr, key=s)
        return host, sr, key, s, stat(sr, s)["keys"]


def _killed(host, n, method, **args):
    """method killed after its n-th command: whether it was."""
    counter = CrashAfter(host, n)
    with installed(counter):
        try:
            call(method, **args)
        except Killed:
            return True
    return False


def _every_point(total, check):
    failures = []
    for n in range(1, total + 1):
        try:
            check(n)
        except (AssertionError, errors.StorageError) as exc:
            failures.append("killed after command %d of %d: %s: %s"
                            % (n, total, type(exc).__name__, exc))
    assert not failures, "\n".join(failures)


def _count(method, with_clone=False, prepare=None):
    host, sr, key, s, _ = _fresh(with_clone)
    with installed(host):
        if prepare:
            prepare(sr, s)
        return commands_run(host, lambda: call(method, sr=sr, key=s))


def _finish_everything(host, sr, keys_left):
    """Destroy every VDI left (each twice, as xapi may); nothing stays."""
    for _ in range(3):
        for k in keys_left:
            destroy(sr, k)
        keys_left = list(listed(sr))
    assert not keys_left
    assert sorted(host.pool("tank").datasets) == ["tank"]


@pytest.mark.parametrize("with_clone", [False, True],
                         ids=["plain", "with-clone"])
def test_data_destroy_killed_anywhere_loses_no_vdi(with_clone):
    """Killed after any command, then the VDI's keys and name changed
    (xapi goes on using it), then retried: one VDI, with what was set."""
    total = _count("Volume.data_destroy", with_clone)
    assert total >= 4

    def check(n):
        host, sr, key, s, keys = _fresh(with_clone)
        with installed(host):
            assert _killed(host, n, "Volume.data_destroy", sr=sr, key=s)
            assert listed(sr)[s]["keys"] == keys
            # what xapi stores between the kill and its retry is kept
            call("Volume.set", sr=sr, key=s, k="between", v=str(n))
            call("Volume.set_name", sr=sr, key=s, new_name="set %d" % n)
            call("Volume.data_destroy", sr=sr, key=s)
            vdi = listed(sr)[s]
            assert vdi["keys"] == dict(keys, between=str(n))
            assert vdi["name"] == "set %d" % n
            assert vdi["read_write"] is False
            assert len([k for k in listed(sr) if k == s]) == 1
            _finish_everything(host, sr, [s] + list(listed(sr)))
        check_fake_host(host)
    _every_point(total, check)


def test_data_destroy_killed_anywhere_then_destroyed_leaks_nothing():
    total = _count("Volume.data_destroy")

    def check(n):
        host, sr, key, s, keys = _fresh()
        with installed(host):
            assert _killed(host, n, "Volume.data_destroy", sr=sr, key=s)
            destroy(sr, s)
            assert s not in listed(sr)
            _finish_everything(host, sr, list(listed(sr)))
        check_fake_host(host)
    _every_point(total, check)


def test_destroy_of_a_data_destroyed_vdi_killed_anywhere_is_finished():
    prepare = lambda sr, s: call("Volume.data_destroy", sr=sr,  # noqa
                                 key=s)
    total = _count("Volume.destroy", prepare=prepare)

    def check(n):
        host, sr, key, s, keys = _fresh()
        with installed(host):
            prepare(sr, s)
            assert _killed(host, n, "Volume.destroy", sr=sr, key=s)
            if s in listed(sr):
                assert listed(sr)[s]["keys"] == keys
            destroy(sr, s)
            assert s not in listed(sr)
            _finish_everything(host, sr, list(listed(sr)))
        check_fake_host(host)
    _every_point(total, check)


@pytest.mark.parametrize("recovery", ["SR.attach", "Volume.destroy"])
def test_a_list_to_the_live_disk_killed_after_its_snapshot_is_collected(
        recovery):
    host, sr, key, s, _ = _fresh()
    with installed(host):
        other = tracked(sr)
        with installed(CrashAfterCommand(host, ["zfs", "snapshot"])):
            with pytest.raises(Killed):
                lcb(sr, s, key)
        left = [n for n in datasets(host) if meta.CBT_SNAPSHOT in n]
        assert len(left) == 1
        assert set(listed(sr)) == {key, s, other}
        if recovery == "SR.attach":
            assert call("SR.attach", configuration=host.sr_config) == sr
        else:
            destroy(sr, other)
        assert not [n for n in datasets(host) if meta.CBT_SNAPSHOT in n]
        assert set(listed(sr)) >= {key, s}
    check_fake_host(host)

