"""Volume.compose on the fake host: a migration's leaf onto its parent.

xapi's receive side (storage_smapiv1_migrate.ml) makes the leaf,
snapshots it (the dummy), makes the parent; the mirror writes the leaf,
the copy writes the parent; receive_finalize calls Volume.compose(sr,
key=leaf, key2=parent). The fake keeps each block's birth txg, so a test
sees which blocks the compose rewrote: exactly the leaf's changes, and
the leaf's own data where the leaf wrote, the parent's elsewhere.
"""

import pytest

from zfsng import collect, errors, inventory, lock, meta, rangecopy, zdb

import fakezfs
from conftest import call
from crashpoint import CrashAfter, Killed, commands_run, installed
from test_vdi_semantics import (
    assert_only_the_sr_is_left, destroy_everything, garbage, listed,
    vdi_create, zvol)
from conftest import create_sr

MiB = fakezfs.MiB


S = 512     # a sector


def received(fake, sr, parent_writes, mirror_writes, mirror_frees=()):
    """xapi's receive_start, the mirror and the copy: (leaf, dummy,
    parent, block). The mirror writes into the leaf's sink, made as
    Datapath.import_activate makes it; parent writes are (first block,
    blocks), mirror writes and frees (first sector, sectors)."""
    leaf = vdi_create(sr, name="web01 disk", description="migrated")["key"]
    call("Volume.set", sr=sr, key=leaf, k="content_id", v="cid-1")
    dummy = call("Volume.snapshot", sr=sr, key=leaf)["key"]
    parent = vdi_create(sr, name="web01 disk", description="copy")["key"]
    size = fake.dataset(zvol(sr, leaf)).volsize
    sink = meta.sink_name(sr, leaf)
    fake.admin("zfs create -s -V %d -o volblocksize=512 -o compression=off "
               "-o %s=%s %s" % (size, meta.MIRROR_SINK, leaf, sink))
    block = fake.dataset(zvol(sr, leaf)).volblocksize
    for first, count in parent_writes:
        fake.guest_write(zvol(sr, parent), first * block, count * block)
    for first, count in mirror_writes:
        fake.guest_write(sink, first * S, count * S)
    for first, count in mirror_frees:
        fake.guest_free(sink, first * S, count * S)
    return leaf, dummy, parent, block


def blocks(fake, name):
    return dict(fake.dataset(name).blocks)


def compose(sr, leaf, parent):
    return call("Volume.compose", sr=sr, key=leaf, key2=parent)


@pytest.fixture
def sr(fake):
    fake.user_value_cap = None
    return create_sr()[0]


def expected(before_parent, before_leaf, changed):
    """blkid -> holds data, after the compose: the leaf's where it
    changed, the parent's elsewhere."""
    out = dict((b, d) for b, (_, d) in before_parent.items())
    for b in changed:
        out[b] = before_leaf.get(b, (0, False))[1]
    return dict((b, d) for b, d in out.items() if d)


def test_the_leaf_keeps_its_identity_with_the_parent_under_its_writes(
        fake, sr):
    leaf, dummy, parent, block = received(fake, sr, parent_writes=[(0, 64)],
                                          mirror_writes=[(3, 1)])
    # sector 3 (above) is in block 0; whole blocks 5-7; a sector in 60;
    # 61 written then discarded: not carried
    fake.guest_write(meta.sink_name(sr, leaf), 5 * block, 3 * block)
    fake.guest_write(meta.sink_name(sr, leaf), 60 * block + S, S)
    fake.guest_write(meta.sink_name(sr, leaf), 61 * block, block)
    fake.guest_free(meta.sink_name(sr, leaf), 61 * block, block)
    p_before = blocks(fake, zvol(sr, parent))
    parent_id = listed(sr)[parent]["keys"]["content_id"]
    assert compose(sr, leaf, parent) is None
    vdis = listed(sr)
    assert sorted(vdis) == [leaf]            # no parent, no dummy
    assert vdis[leaf]["name"] == "web01 disk"
    assert vdis[leaf]["description"] == "migrated"
    # its data changed: neither the leaf's id nor the parent's (what
    # xapi's copy claimed) is true of it any more
    assert vdis[leaf]["keys"]["content_id"] not in ("cid-1", parent_id)
    assert vdis[leaf]["uri"] == ["zfs-ng:///%s" % zvol(sr, leaf)]
    after = blocks(fake, zvol(sr, leaf))
    # exactly the written blocks were rewritten, every other one is the
    # parent's; block 3, written in part, keeps the parent's data
    rewritten = set(b for b, (t, _) in after.items() if p_before[b][0] != t)
    assert rewritten == {0, 5, 6, 7, 60}
    assert after[0][1]           # written in part: keeps the parent's data
    assert after[61] == p_before[61]     # the parent's
    assert all(d for _, d in after.values())
    with pytest.raises(errors.Volume_does_not_exist):
        call("Volume.stat", sr=sr, key=parent)
    with pytest.raises(errors.Volume_does_not_exist):
        call("Volume.stat", sr=sr, key=dummy)
    assert not fake.exists(meta.sink_name(sr, leaf))
    assert fake.get(zvol(sr, leaf), meta.COMPOSE_INTO) is None
    assert garbage(fake, sr) == []
    destroy_everything(sr)
    assert_only_the_sr_is_left(fake, sr)


def test_other_calls_go_on_while_the_writes_are_copied(fake, sr,
                                                       monkeypatch):
    """The copy runs outside the SR lock: another call takes the lock
    meanwhile, and its collector leaves the sink's snapshot alone."""
    leaf, _, parent, _ = received(fake, sr, parent_writes=[(0, 8)],
                                  mirror_writes=[(3, 1), (40, 8)])
    snap = meta.compose_snapshot(meta.sink_name(sr, leaf))
    monkeypatch.setattr(lock, "WAIT", 0.2)
    seen = []
    real = rangecopy.copy

    def copy(source, target, ranges):
        with lock.sr_lock(sr):              # SrBusy if compose held it
            collect.collect(sr, inventory.rows(sr))
            seen.append(fake.exists(snap))
        return real(source, target, ranges)

    monkeypatch.setattr(rangecopy, "copy", copy)
    assert compose(sr, leaf, parent) is None
    assert seen == [True]
    assert sorted(listed(sr)) == [leaf]


def test_a_snapshot_gone_during_the_copy_stops_the_commit(fake, sr,
                                                          monkeypatch):
    """Destroyed by hand while the writes were copied: nothing is
    committed, and the next compose copies again."""
    leaf, _, parent, _ = received(fake, sr, parent_writes=[(0, 8)],
                                  mirror_writes=[(3, 1)])
    snap = meta.compose_snapshot(meta.sink_name(sr, leaf))
    real = rangecopy.copy

    def copy(source, target, ranges):
        real(source, target, ranges)
        fake.admin("zfs destroy %s" % snap)

    monkeypatch.setattr(rangecopy, "copy", copy)
    with pytest.raises(errors.DatasetNotFound):
        compose(sr, leaf, parent)
    assert {leaf, parent} <= set(listed(sr))
    monkeypatch.setattr(rangecopy, "copy", real)
    assert compose(sr, leaf, parent) is None
    assert sorted(listed(sr)) == [leaf]


def test_without_zdb_the_written_sectors_come_from_a_full_send(
        fake, sr, monkeypatch):
    """zdb past its bound fails the call (a send takes longer still) and
    commits nothing; zdb failing otherwise (a pool it cannot open): the
    WRITE records of a full send of the sink's snapshot are the same
    sectors (no compression, a block a sector)."""
    leaf, _, parent, block = received(fake, sr, parent_writes=[(0, 64)],
                                      mirror_writes=[(3, 1)])
    sink = meta.sink_name(sr, leaf)
    fake.guest_write(sink, 5 * block, 3 * block)
    fake.guest_write(sink, 60 * block + S, S)
    copied, real = [], rangecopy.copy

    def copy(source, target, ranges):
        copied.append(list(ranges))
        return real(source, target, ranges)

    def stuck(*args):
        raise errors.CommandTimeout("zdb did not finish within 6 s")

    with monkeypatch.context() as patched:
        patched.setattr(zdb, "born_since", stuck)
        since = len(fake.calls)
        with pytest.raises(errors.CommandTimeout):
            compose(sr, leaf, parent)
    assert fake.ran("zfs", "send", since=since) == []
    assert {leaf, parent} <= set(listed(sr))
    monkeypatch.setattr(rangecopy, "copy", copy)
    fake.inject("zdb -e", "zdb: can't open 'tank': I/O error", times=1)
    p_before = blocks(fake, zvol(sr, parent))
    since = len(fake.calls)
    assert compose(sr, leaf, parent) is None
    after = blocks(fake, zvol(sr, leaf))
    assert set(b for b, (t, _) in after.items()
               if p_before[b][0] != t) == {0, 5, 6, 7, 60}
    assert len(fake.ran("zfs", "send", since=since)) == 1
    assert copied == [[(3 * S, 4 * S), (5 * block, 8 * block),
                       (60 * block + S, 60 * block + 2 * S)]]
    assert sorted(listed(sr)) == [leaf]


@pytest.mark.parametrize("sink", ["compressed", "none", "unmarked"])
def test_a_leaf_without_a_sink_compose_can_read_is_refused(fake, sr, sink):
    leaf, _, parent, _ = received(fake, sr, [(0, 4)], [(1, 1)])
    name = meta.sink_name(sr, leaf)
    if sink == "compressed":
        fake.admin("zfs set compression=lz4 %s" % name)
    elif sink == "none":
        fake.admin("zfs destroy %s" % name)
    else:
        fake.admin("zfs inherit %s %s" % (meta.MIRROR_SINK, name))
    before = len(fake.calls)
    with pytest.raises(errors.InvalidArgument) as err:
        compose(sr, leaf, parent)
    assert name in err.value.message
    assert fake.mutations(since=before) == []


@pytest.mark.parametrize("case", ["same", "snapshot", "parent-snapshot",
                                  "size", "cbt", "two-snapshots"])
def test_pairs_compose_cannot_join_are_refused_and_nothing_changes(
        fake, sr, case):
    leaf, dummy, parent, _ = received(fake, sr, [(0, 4)], [(1, 1)])
    key, key2 = leaf, parent
    if case == "same":
        key2 = leaf
    elif case == "snapshot":
        key = dummy
    elif case == "parent-snapshot":
        call("Volume.snapshot", sr=sr, key=parent)
    elif case == "size":
        call("Volume.resize", sr=sr, key=parent, new_size=2 * fakezfs.GiB)
    elif case == "cbt":
        call("Volume.enable_cbt", sr=sr, key=leaf)
    elif case == "two-snapshots":
        call("Volume.snapshot", sr=sr, key=leaf)
    before_ls = listed(sr)
    before = len(fake.calls)
    with pytest.raises(errors.InvalidArgument):
        compose(sr, key, key2)
    assert fake.mutations(since=before) == []
    assert listed(sr) == before_ls


def test_unknown_vdis_are_refused_typed(fake, sr):
    leaf, _, parent, _ = received(fake, sr, [(0, 4)], [(1, 1)])
    with pytest.raises(errors.Volume_does_not_exist):
        compose(sr, leaf, "0b0e0e0e-0000-4000-8000-000000000000")


# --- crash points ------------------------------------------------------------

def _scenario(host):
    """(sr, its stored device-config, leaf, parent)."""
    sr, config = create_sr()
    leaf, dummy, parent, _ = received(host, sr, [(0, 64)], [(5, 40), (500, 2)],
                                      [(501, 1)])
    return sr, config, leaf, parent


def _final(host, sr, leaf):
    return dict((b, d) for b, (_, d) in blocks(host, zvol(sr, leaf)).items()
                if d)


def _expected_final():
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, _, leaf, parent = _scenario(host)
        compose(sr, leaf, parent)
        return _final(host, sr, leaf)


@pytest.mark.parametrize("next_call", ["compose", "attach", "destroy"])
def test_a_compose_killed_after_any_command_is_finished_or_undone(next_call):
    """xapi retries the compose; a reboot attaches the SR; or its
    receive_cancel destroys what it made. Either the composed leaf is
    there, with the right blocks, or (cancel) nothing is."""
    want = _expected_final()
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, _, leaf, parent = _scenario(host)
        total = commands_run(host, lambda: compose(sr, leaf, parent))
    failures = []
    for n in range(1, total + 1):
        host = fakezfs.FakeZfs.with_disks()
        with installed(host):
            sr, config, leaf, parent = _scenario(host)
            with installed(CrashAfter(host, n)):
                try:
                    compose(sr, leaf, parent)
                    failures.append("%d: not killed" % n)
                except Killed:
                    pass
            try:
                _next(next_call, host, sr, leaf, parent, config)
                _check(host, sr, leaf, parent, want, next_call)
            except AssertionError as exc:
                failures.append("killed after %d of %d: %s" % (n, total, exc))
    assert not failures, "\n".join(failures)


def _next(next_call, host, sr, leaf, parent, config):
    if next_call == "compose":         # xapi's call again
        committed = parent not in listed(sr)
        try:
            compose(sr, leaf, parent)
        except errors.Volume_does_not_exist as exc:
            assert committed and parent in exc.message, exc
    elif next_call == "attach":
        call("SR.detach", sr=sr)
        call("SR.attach", configuration=config)
    else:                              # receive_cancel: dummy, leaf, parent
        for key in listed(sr):
            call("Volume.destroy", sr=sr, key=key)


def _check(host, sr, leaf, parent, want, next_call):
    vdis = listed(sr)
    assert garbage(host, sr) == []
    if next_call == "destroy":
        destroy_everything(sr)
        assert_only_the_sr_is_left(host, sr)
        return
    if parent in vdis:                 # cut before the commit
        assert next_call == "attach", sorted(vdis)
        compose(sr, leaf, parent)
        vdis = listed(sr)
    assert sorted(vdis) == [leaf]
    assert vdis[leaf]["keys"]["content_id"] != "cid-1"   # data changed
    assert _final(host, sr, leaf) == want
    destroy_everything(sr)
    assert_only_the_sr_is_left(host, sr)
