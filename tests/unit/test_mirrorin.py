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


def served(host):
    """The (args, state) of the one VBD of the host."""
    [(pid, minor, args, _)] = host.tap.vbds()
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
