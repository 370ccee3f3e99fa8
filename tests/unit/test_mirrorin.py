"""Datapath.import_activate on the fake host (ZFS, udev, blktap): a
migration's mirror into a leaf VDI goes into the leaf's mirror sink,
which the leaf's tapdisk serves from then on; Volume.compose then makes
the leaf whole. xapi's order (storage_smapiv1_migrate.ml
receive_start_common, storage_migrate.ml nbd_handler, receive_finalize):
create the leaf, snapshot it, attach and activate it in the mirror's
domain ("MIR" and six hex digits), create the parent, import_activate;
at the end deactivate and detach the leaf, compose.
"""

import errno

import pytest

from zfsng import collect, errors, meta

from conftest import call, create_volume
from crashpoint import CrashAfter, CutInside, Killed, commands_run, installed
from test_datapath import dp, host, nothing_left, uri_of, vdi  # noqa: F401
from zfsng_datapath import state
from zfsng_datapath.errors import ComposePending, NotAttached

MIR = "MIRa1b2c3"


def receive(sr, vol):
    """receive_start on the leaf vol: the dummy, the leaf attached and
    activated in the mirror's domain, the parent. Returns the parent."""
    call("Volume.snapshot", sr=sr, key=vol["key"])
    dp("Datapath.attach", uri=uri_of(vol), domain=MIR)
    dp("Datapath.activate", uri=uri_of(vol), domain=MIR)
    return create_volume(sr, size=vol["virtual_size"], name="disk")


def sink_zvol(sr, vol):
    """The zvol of the leaf's (bounded) sink, the mirror's writes."""
    return meta.sink_name(sr, vol["key"]) + "/" + meta.SINK_VOLUME


def served(host, vol=None):
    """The (args, state, pid, minor) of the one VBD of the host (of the
    VDI vol's, when given)."""
    [(pid, minor, args, _)] = [
        v for v in host.tap.vbds() if vol is None or
        (v[2] or "").split("/")[-1].startswith(vol["key"]) or
        ("/%s.in/" % vol["key"]) in (v[2] or "")]
    return args, host.tap.tapdisks[pid][minor]["state"], pid, minor


def test_the_leafs_tapdisk_serves_its_sink(host, vdi):
    sr, vol = vdi
    receive(sr, vol)
    path = dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    args, state, pid, minor = served(host)
    assert path == "/var/run/blktap-control/nbdserver-new%d.%d" % (pid,
                                                                   minor)
    sink, zvol = meta.sink_name(sr, vol["key"]), sink_zvol(sr, vol)
    assert args == "aio:" + host.link(zvol) and state == 0
    ds = host.zfs.dataset(zvol)
    assert (ds.volsize, ds.volblocksize) == (vol["virtual_size"], 512)
    assert host.zfs.get(zvol, "compression") == "off"
    assert host.zfs.get(sink, meta.MIRROR_SINK) == vol["key"]
    assert host.zfs.dataset(sink).kind == "filesystem"
    assert 0 < int(host.zfs.get(sink, "quota"))
    # again: the same answer, nothing changed
    before = len(host.calls)
    assert dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR) == \
        path
    assert not [a for a in host.calls[before:]
                if a[:2] in (["tap-ctl", "pause"], ["tap-ctl", "unpause"],
                             ["zfs", "create"])]
    # the sink is no VDI: the leaf, the dummy and the parent are listed
    listed = call("SR.ls", sr=sr)
    assert len(listed) == 3
    assert all(v["uri"] not in (["zfs-ng:///" + sink], ["zfs-ng:///" + zvol])
               for v in listed)


def test_a_leaf_not_active_here_is_refused_and_nothing_is_made(host, vdi):
    sr, vol = vdi
    with pytest.raises(NotAttached):
        dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    assert not host.zfs.exists(meta.sink_name(sr, vol["key"]))


@pytest.mark.parametrize("domain", ["0", "u0_vbd_0_xvda"])
def test_dom0_has_no_tapdisk_to_serve_a_mirror(host, vdi, domain):
    sr, vol = vdi
    with pytest.raises(errors.InvalidArgument):
        dp("Datapath.import_activate", uri=uri_of(vol), domain=domain)


def test_an_unpause_that_failed_is_finished_by_the_next_call(host, vdi):
    """A failed unpause onto the sink leaves the VBD running on the
    leaf, never paused; the next call serves the sink."""
    sr, vol = vdi
    receive(sr, vol)
    host.tap.inject("tap-ctl unpause", errno.EIO)
    with pytest.raises(errors.StorageError):
        dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    args, state, _, _ = served(host)
    assert state == 0 and args.endswith(vol["key"])
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    args, state, _, _ = served(host)
    assert state == 0 and args.endswith(sink_zvol(sr, vol))


def test_an_unmarked_sink_is_made_again_a_foreign_zvol_refused(host, vdi):
    sr, vol = vdi
    receive(sr, vol)
    sink = meta.sink_name(sr, vol["key"])
    host.zfs.admin("zfs create -s -V 1G -o volblocksize=512 %s" % sink)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    assert host.zfs.get(sink, meta.MIRROR_SINK) == vol["key"]
    assert host.zfs.dataset(sink).kind == "filesystem"   # the bounded form
    assert served(host)[0].endswith(sink_zvol(sr, vol))
    other = create_volume(sr, size=vol["virtual_size"], name="other")
    call("Volume.snapshot", sr=sr, key=other["key"])
    dp("Datapath.attach", uri=uri_of(other), domain=MIR)
    dp("Datapath.activate", uri=uri_of(other), domain=MIR)
    host.zfs.admin("zfs create -s -V 1G %s" % meta.sink_name(
        sr, other["key"]))
    host.zfs.guest_write(meta.sink_name(sr, other["key"]), 0, 4096)
    with pytest.raises(errors.InvalidArgument):
        dp("Datapath.import_activate", uri=uri_of(other), domain=MIR)


def test_receive_cancel_leaves_nothing(host, vdi):
    """receive_cancel: the leaf's datapath destroyed, then VDI.destroy of
    the dummy, the leaf and the parent."""
    sr, vol = vdi
    before = set(n for p in host.zfs.pools for n in p.datasets)
    parent = receive(sr, vol)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    host.zfs.guest_write(sink_zvol(sr, vol), 512, 1024)
    dp("Datapath.deactivate", uri=uri_of(vol), domain=MIR)
    dp("Datapath.detach", uri=uri_of(vol), domain=MIR)
    for key in [v["key"] for v in call("SR.ls", sr=sr)
                if v["key"] not in (vol["key"], parent["key"])] + \
            [vol["key"], parent["key"]]:
        call("Volume.destroy", sr=sr, key=key)
    after = set(n for p in host.zfs.pools for n in p.datasets)
    assert after == before - {meta.vdi_dataset(sr, vol["key"])}


def test_the_whole_receive_composes_the_leaf(host, vdi):
    sr, vol = vdi
    parent = receive(sr, vol)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    block = host.zfs.dataset(meta.vdi_dataset(sr, parent["key"])).volblocksize
    host.zfs.guest_write(meta.vdi_dataset(sr, parent["key"]), 0, 8 * block)
    host.zfs.guest_write(sink_zvol(sr, vol), 2 * block, 512)
    dp("Datapath.deactivate", uri=uri_of(vol), domain=MIR)
    dp("Datapath.detach", uri=uri_of(vol), domain=MIR)
    call("Volume.compose", sr=sr, key=vol["key"], key2=parent["key"])
    assert [v["key"] for v in call("SR.ls", sr=sr)] == [vol["key"]]
    with pytest.raises(errors.Volume_does_not_exist):   # no VDI any more
        call("Volume.stat", sr=sr, key=parent["key"])
    # receive_finalize's last call: remove_from_sm_config, a key never set
    call("Volume.unset", sr=sr, key=vol["key"], k="_sm_config_base_mirror")
    blocks = host.zfs.dataset(meta.vdi_dataset(sr, vol["key"])).blocks
    assert sorted(blocks) == list(range(8)) and \
        all(d for _, d in blocks.values())
    assert not host.zfs.exists(meta.sink_name(sr, vol["key"]))


def test_a_leaf_tapdisk_that_stays_up_after_detach_is_ended(host, vdi):
    """A tapdisk that served a passed NBD connection may stay up with no
    VBD: detach ends it, as it ends one it spawned and never attached."""
    sr, vol = vdi
    receive(sr, vol)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    pid = served(host)[2]
    host.tap.lingering.add(pid)
    dp("Datapath.deactivate", uri=uri_of(vol), domain=MIR)
    dp("Datapath.detach", uri=uri_of(vol), domain=MIR)
    assert pid not in host.tap.tapdisks
    assert ["kill", "-TERM", str(pid)] in host.calls


# --- a leaf before its compose is never served ------------------------------

def mirrored(host, sr, vol):
    """receive, the mirror and the copy, then the mirror's VBD gone, as
    xapi leaves them before its compose: (parent, the written blocks of
    the composed disk). The parent holds blocks 0-7, the sink a sector
    of block 2 and block 9."""
    parent = receive(sr, vol)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    pzvol = meta.vdi_dataset(sr, parent["key"])
    block = host.zfs.dataset(pzvol).volblocksize
    host.zfs.guest_write(pzvol, 0, 8 * block)
    sink = sink_zvol(sr, vol)
    host.zfs.guest_write(sink, 2 * block + 512, 512)
    host.zfs.guest_write(sink, 9 * block, block)
    dp("Datapath.deactivate", uri=uri_of(vol), domain=MIR)
    dp("Datapath.detach", uri=uri_of(vol), domain=MIR)
    return parent, list(range(8)) + [9]


def data_blocks(host, name):
    return sorted(b for b, (_, d) in host.zfs.dataset(name).blocks.items()
                  if d)


def runs_on_the_composed_disk(host, sr, vol, want):
    """attach and activate for a guest serve the leaf's name, which holds
    the composed data: the parent's and the mirror's."""
    leaf = meta.vdi_dataset(sr, vol["key"])
    dp("Datapath.attach", uri=uri_of(vol), domain="7")
    dp("Datapath.activate", uri=uri_of(vol), domain="7")
    args, opened = served(host)[:2]
    assert args == "aio:" + host.link(leaf) and opened == 0
    assert data_blocks(host, leaf) == want
    assert not host.zfs.exists(meta.sink_name(sr, vol["key"]))
    assert [v["key"] for v in call("SR.ls", sr=sr)] == [vol["key"]]


def test_a_leaf_whose_compose_failed_is_refused_not_served_empty(host, vdi):
    """xapi ignores a failed compose and starts the VM on the leaf: its
    own zvol is empty (the writes are in the sink, the base on the
    parent). Every attach is refused, leaving nothing; the mirror's own
    VBD was served all along; a compose then makes the leaf whole."""
    sr, vol = vdi
    parent = receive(sr, vol)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    dp("Datapath.activate", uri=uri_of(vol), domain=MIR)   # its own: fine
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    assert served(host)[0].endswith(sink_zvol(sr, vol))
    dp("Datapath.deactivate", uri=uri_of(vol), domain=MIR)
    dp("Datapath.detach", uri=uri_of(vol), domain=MIR)
    sink = meta.sink_name(sr, vol["key"])
    host.zfs.guest_write(sink_zvol(sr, vol), 0, 4096)
    for domain in ("7", "0"):
        before = len(host.calls)
        with pytest.raises(ComposePending) as err:
            dp("Datapath.attach", uri=uri_of(vol), domain=domain)
        assert sink in err.value.message
        assert host.tap.vbds() == [] and state.all_states() == []
        assert not [a for a in host.calls[before:] if a[:2] in (
            ["zfs", "snapshot"], ["zfs", "rename"], ["zfs", "destroy"])]
        with pytest.raises(NotAttached):
            dp("Datapath.activate", uri=uri_of(vol), domain=domain)
    nothing_left(host)
    call("Volume.compose", sr=sr, key=vol["key"], key2=parent["key"])
    runs_on_the_composed_disk(host, sr, vol, [0])


def test_a_vbd_attached_before_the_mirror_is_not_activated(host, vdi):
    """A guest's VBD attached while the leaf was still empty and without
    a sink: its activate is refused until the compose."""
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain="7")
    parent, want = mirrored(host, sr, vol)
    with pytest.raises(ComposePending):
        dp("Datapath.activate", uri=uri_of(vol), domain="7")
    [(_, _, args, _)] = host.tap.vbds()
    assert args is None                   # attached, never opened
    dp("Datapath.detach", uri=uri_of(vol), domain="7")
    call("Volume.compose", sr=sr, key=vol["key"], key2=parent["key"])
    runs_on_the_composed_disk(host, sr, vol, want)


def test_a_compose_cut_after_its_commit_is_finished_by_the_attach(
        host, vdi, monkeypatch):
    """The parent took the leaf's uuid (compose's commit), the leaf's
    empty zvol and the sink are still there: the attach finishes the
    compose and serves the composed disk, the parent under the leaf's
    name."""
    sr, vol = vdi
    parent, want = mirrored(host, sr, vol)

    def cut(row, rows):
        raise errors.StorageError("killed")

    with monkeypatch.context() as patched:
        patched.setattr(collect, "finish_compose", cut)
        with pytest.raises(errors.StorageError):
            call("Volume.compose", sr=sr, key=vol["key"],
                 key2=parent["key"])
    pzvol = meta.vdi_dataset(sr, parent["key"])
    assert host.zfs.get(pzvol, meta.COMPOSE_INTO) == vol["key"]
    assert host.zfs.exists(meta.vdi_dataset(sr, vol["key"]))
    runs_on_the_composed_disk(host, sr, vol, want)
    assert not host.zfs.exists(pzvol)


def test_the_mirrors_vbd_attached_again_keeps_serving_its_sink(host, vdi):
    """xapi may repeat the leaf's attach and activate in the mirror's
    domain (a retry): the VBD goes on serving the sink, not the leaf."""
    sr, vol = vdi
    receive(sr, vol)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    dp("Datapath.attach", uri=uri_of(vol), domain=MIR)
    dp("Datapath.activate", uri=uri_of(vol), domain=MIR)
    args, state, _, _ = served(host)
    assert state == 0 and args.endswith(sink_zvol(sr, vol))


# --- the sink's bound ---------------------------------------------------------

MiB = 1 << 20


def available(host, name):
    return int(host.zfs.get(name, "available"))


def hold_all_but(host, sr, keep):
    """Another dataset's reservation takes the SR's free space but keep
    bytes (as thick VDIs hold theirs)."""
    size = (available(host, sr) - keep) // MiB * MiB
    host.zfs.admin("zfs create -s -V %d %s/held" % (size, sr))
    host.zfs.admin("zfs set refreservation=%d %s/held" % (
        available(host, sr) - keep, sr))
    assert abs(available(host, sr) - keep) < MiB


def leaf_mirrored(host, sr, name="disk"):
    """A new leaf, received, its mirror activated: (the leaf's volume,
    the SR's free space before the activate)."""
    vol = create_volume(sr, size=64 * MiB, name=name)
    receive(sr, vol)
    free = available(host, sr)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    return vol, free


def test_the_sink_takes_half_the_room_the_other_sinks_leave(host, vdi):
    """A sink's quota is half the SR's free space, less what the other
    sinks may still take (their quota not used yet): two moves in at
    once never take more than the pool had."""
    sr, _ = vdi
    first, free = leaf_mirrored(host, sr, "first")
    sink1 = meta.sink_name(sr, first["key"])
    assert int(host.zfs.get(sink1, "quota")) == free // 2
    host.zfs.guest_write(sink_zvol(sr, first), 0, 4 * MiB)
    used1 = int(host.zfs.get(sink1, "used"))
    open1 = int(host.zfs.get(sink1, "quota")) - used1
    second, free2 = leaf_mirrored(host, sr, "second")
    sink2 = meta.sink_name(sr, second["key"])
    assert int(host.zfs.get(sink2, "quota")) == (free2 - open1) // 2
    # both full at once: the pool keeps a quarter of what it had
    assert open1 + int(host.zfs.get(sink2, "quota")) <= \
        free2 - (free2 - open1) // 2


def test_a_full_sink_refuses_writes_the_pool_keeps_its_room(host, vdi):
    """The mirror's writes past the quota fail (the source then drops the
    mirror); the SR keeps half its free space, other VDIs write on."""
    sr, other = vdi
    hold_all_but(host, sr, 48 * MiB)
    vol, _ = leaf_mirrored(host, sr)
    sink, zvol = meta.sink_name(sr, vol["key"]), sink_zvol(sr, vol)
    quota = int(host.zfs.get(sink, "quota"))
    assert 23 * MiB < quota <= 24 * MiB
    assert int(host.zfs.get(zvol, "available")) <= quota
    with pytest.raises(Exception) as err:
        host.zfs.guest_write(zvol, 0, 30 * MiB)
    assert "quota" in str(err.value)
    host.zfs.guest_write(zvol, 0, quota - 2 * MiB)
    with pytest.raises(Exception):
        host.zfs.guest_write(zvol, quota, 4 * MiB)
    assert available(host, sr) >= 48 * MiB - quota - 2 * MiB
    host.zfs.guest_write(meta.vdi_dataset(sr, other["key"]), 0, 16 * MiB)


def test_a_pool_without_room_for_a_sink_refuses_the_move(host, vdi):
    """Below MIN_BOUND of room the call fails (OutOfSpace) before the
    mirror starts, and leaves the leaf as it was: no sink, served by its
    own tapdisk, not paused."""
    sr, _ = vdi
    hold_all_but(host, sr, 24 * MiB)
    vol = create_volume(sr, size=64 * MiB, name="leaf")
    receive(sr, vol)
    with pytest.raises(errors.OutOfSpace) as err:
        dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    assert "move the VM halted" in err.value.message
    assert not host.zfs.exists(meta.sink_name(sr, vol["key"]))
    args, opened = served(host)[:2]
    assert args.endswith(vol["key"]) and opened == 0


def test_a_crash_at_any_point_is_finished_by_the_next_call(host, vdi):
    """import_activate killed after each of its commands, and inside its
    ``zfs create``s (the dataset made, its properties not, or only the
    quota): the next call serves a bounded, marked sink; a receive_cancel
    instead leaves nothing."""
    sr, _ = vdi
    before = set(n for p in host.zfs.pools for n in p.datasets)

    def activate(vol):
        dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)

    probe = create_volume(sr, size=64 * MiB, name="probe")
    probe_parent = receive(sr, probe)
    count = commands_run(host, lambda: activate(probe))
    cuts = [lambda keep=keep: CutInside(host, host.zfs, ["zfs", "create"],
                                        keep)
            for keep in ((), ("quota",))] + \
        [lambda n=n: CrashAfter(host, n) for n in range(1, count + 1)]
    for cancel in (False, True):
        for crash in cuts:
            vol = create_volume(sr, size=64 * MiB, name="leaf")
            parent = receive(sr, vol)
            with installed(crash()):
                try:
                    activate(vol)
                except Killed:
                    pass
            if cancel:
                receive_cancel(sr, vol, parent)
                continue
            activate(vol)
            sink = meta.sink_name(sr, vol["key"])
            assert host.zfs.get(sink, meta.MIRROR_SINK) == vol["key"]
            assert int(host.zfs.get(sink, "quota")) > 0
            assert host.zfs.get(sink_zvol(sr, vol), "compression") == "off"
            assert served(host, vol)[0].endswith(sink_zvol(sr, vol))
            receive_cancel(sr, vol, parent)
    receive_cancel(sr, probe, probe_parent)
    after = set(n for p in host.zfs.pools for n in p.datasets)
    assert after == before


def receive_cancel(sr, vol, parent):
    """xapi's receive_cancel: the leaf's datapath destroyed, then
    VDI.destroy of the dummy, the leaf and the parent."""
    for method in ("Datapath.deactivate", "Datapath.detach"):
        dp(method, uri=uri_of(vol), domain=MIR)
    dummies = [v["key"] for v in call("SR.ls", sr=sr)
               if v["uri"][0].startswith(uri_of(vol) + "@")]
    for key in dummies + [vol["key"], parent["key"]]:
        call("Volume.destroy", sr=sr, key=key)


def _unbounded_sink(host, sr, vol):
    """The sink a version before the bound made for vol: a bare marked
    512-byte zvol <sr>/<leaf>.in. Its name."""
    sink = meta.sink_name(sr, vol["key"])
    host.zfs.admin("zfs create -s -V %d -o volblocksize=512 -o "
                   "compression=off -o %s=%s %s" % (
                       vol["virtual_size"], meta.MIRROR_SINK, vol["key"],
                       sink))
    return sink


def test_an_unbounded_sink_of_before_is_served_composed_and_freed(host,
                                                                    vdi):
    """A host upgraded in the middle of a move in finds the sink the old
    version made, a bare marked zvol <sr>/<leaf>.in: it is served as it
    is, composed from, and freed with its leaf."""
    sr, vol = vdi
    parent = receive(sr, vol)
    sink = _unbounded_sink(host, sr, vol)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    assert served(host)[0] == "aio:" + host.link(sink)
    assert host.zfs.dataset(sink).kind == "volume"
    pzvol = meta.vdi_dataset(sr, parent["key"])
    block = host.zfs.dataset(pzvol).volblocksize
    host.zfs.guest_write(pzvol, 0, 8 * block)
    host.zfs.guest_write(sink, 9 * block, 512)
    dp("Datapath.deactivate", uri=uri_of(vol), domain=MIR)
    dp("Datapath.detach", uri=uri_of(vol), domain=MIR)
    call("Volume.compose", sr=sr, key=vol["key"], key2=parent["key"])
    runs_on_the_composed_disk(host, sr, vol, list(range(8)) + [9])


def test_an_unbounded_sink_of_before_goes_with_receive_cancel(host, vdi):
    sr, vol = vdi
    before = set(n for p in host.zfs.pools for n in p.datasets)
    parent = receive(sr, vol)
    _unbounded_sink(host, sr, vol)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    receive_cancel(sr, vol, parent)
    after = set(n for p in host.zfs.pools for n in p.datasets)
    assert after == before - {meta.vdi_dataset(sr, vol["key"])}


def test_a_filesystem_in_the_sinks_way_is_refused(host, vdi):
    """An unmarked filesystem by the sink's name that holds anything is
    the admin's: refused, nothing changed (an empty one is what a cut
    inside the sink's create leaves, and is finished)."""
    sr, vol = vdi
    parent = receive(sr, vol)
    sink = meta.sink_name(sr, vol["key"])
    host.zfs.admin("zfs create %s" % sink)
    host.zfs.admin("zfs create %s/mine" % sink)
    with pytest.raises(errors.InvalidArgument):
        dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    assert not host.zfs.get(sink, meta.MIRROR_SINK)
    assert served(host)[0].endswith(vol["key"])
    receive_cancel(sr, vol, parent)        # the collector leaves it too
    assert host.zfs.exists(sink + "/mine")


def test_a_sink_is_zfsngs_own_for_sr_destroy(host, vdi):
    """SR.destroy's check for data zfs-ng did not make: a sink, bounded
    (with its zvol and compose snapshot) or not, is zfs-ng's."""
    from zfsng_volume import sr as srmod
    sr, vol = vdi
    receive(sr, vol)
    dp("Datapath.import_activate", uri=uri_of(vol), domain=MIR)
    host.zfs.admin("zfs snapshot %s@%s" % (sink_zvol(sr, vol),
                                           meta.COMPOSE_SNAPSHOT))
    old = create_volume(sr, size=64 * MiB, name="old")
    host.zfs.admin("zfs create -s -V 64M -o volblocksize=512 -o %s=%s %s" % (
        meta.MIRROR_SINK, old["key"], meta.sink_name(sr, old["key"])))
    assert srmod.other_data(sr) == []
    host.zfs.admin("zfs create %s/admins" % sr)
    assert srmod.other_data(sr) == [sr + "/admins"]
