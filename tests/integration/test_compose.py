"""Volume.compose on real ZFS, in xapi's receive order (xen-api
storage_smapiv1_migrate.ml: receive_start_common, receive_finalize):
Volume.create of the leaf, Volume.snapshot of it (the dummy),
Volume.create of the parent, the parent copied (sparse_dd's part), the
mirror's writes, Volume.compose(sr, key=leaf, key2=parent).

The mirror writes here as the leaf's tapdisk will once
Datapath.import_activate serves it: into the leaf's mirror sink, made as
the datapath will make it (512-byte blocks, no compression, marked).
What must come out, byte for byte through the datapath's attach: the
parent's copy with every write on top, a write of part of a block, zeros
over the parent's data included; a sector written then discarded keeps
the parent's data (discards are not carried). A compose
killed after each command that changes something is finished by xapi's
next call with the same bytes.
"""

import hashlib
import random

import pytest

from conftest import one_disk_sr, played, sh, traced_points
from plugin_client import PluginError
from datapath_util import write_direct
from test_cbt import content, dataset_of, discard, write

KiB, MiB = 1 << 10, 1 << 20
DISK = 4 * MiB
SINK_MARK = "org.xcp-ng.zfs-ng:mirror-sink"


@pytest.fixture
def sr(plugin, disks, new_uuid):
    yield from one_disk_sr(plugin, disks, new_uuid, "composesr")


def received(plugin, sr, seed):
    """receive_start and the parent's copy: (leaf, parent, the parent's
    bytes)."""
    leaf = plugin("Volume.create", sr=sr, name="web01", description="moved",
                  size=DISK, sharable=False)
    plugin("Volume.set", sr=sr, key=leaf["key"], k="vdi-type", v="user")
    plugin("Volume.snapshot", sr=sr, key=leaf["key"])
    parent = plugin("Volume.create", sr=sr, name="web01", description="",
                    size=DISK, sharable=False)
    sh("zfs", "create", "-s", "-V", str(DISK), "-o", "volblocksize=512",
       "-o", "compression=off", "-o", "%s=%s" % (SINK_MARK, leaf["key"]),
       dataset_of(leaf) + ".in")
    sh("udevadm", "settle")
    rng = random.Random(seed)
    data = bytearray(rng.getrandbits(8 * DISK).to_bytes(DISK, "little"))
    data[3 * MiB:3 * MiB + 256 * KiB] = bytes(256 * KiB)  # a hole's copy
    write(dataset_of(parent), 0, bytes(data))
    return leaf, parent, data


def mirror(leaf, data, seed, copied):
    """The mirror's writes into the sink; data becomes what the guest
    sees after them."""
    sink = dataset_of(leaf) + ".in"
    rng = random.Random(seed + 1)
    writes = [(12 * KiB + 512, 4 * KiB),        # part of a block
              (1 * MiB, 64 * KiB, b"\0"),       # zeros over the parent's
              (2 * MiB, 16 * KiB),              # half discarded
              (3 * MiB + 4 * KiB, 1 * KiB),     # into the parent's hole
              (DISK - 512, 512)]                # the last sector
    for offset, length, *fill in writes:
        chunk = (fill[0] * length if fill else
                 rng.getrandbits(8 * length).to_bytes(length, "little"))
        write_direct("/dev/zvol/" + sink, [(offset, chunk)])
        data[offset:offset + length] = chunk
    discard(sink, 2 * MiB, 8 * KiB)      # not carried: the parent's
    data[2 * MiB:2 * MiB + 8 * KiB] = copied[2 * MiB:2 * MiB + 8 * KiB]


def sha(data):
    return hashlib.sha256(bytes(data)).hexdigest()


def differ(got, want, unit=512):
    """The (offset, end) runs of units where got and want differ."""
    runs = []
    for i in range(0, len(want), unit):
        if got[i:i + unit] != want[i:i + unit]:
            if runs and runs[-1][1] == i:
                runs[-1][1] = i + unit
            else:
                runs.append([i, i + unit])
    return runs


def check_composed(plugin, dp, sr, leaf, parent, data, parent_bytes=None):
    listed = dict((v["key"], v) for v in plugin("SR.ls", sr=sr))
    assert leaf["key"] in listed and parent["key"] not in listed
    vdi = listed[leaf["key"]]
    assert (vdi["name"], vdi["description"]) == ("web01", "moved")
    composed = vdi["keys"].pop("content_id")
    assert vdi["keys"] == {"vdi-type": "user"}
    # its data changed: an id of its own, neither disk's (xapi's copies
    # pick a base by it: zfsng/contentid.py)
    assert composed not in ("", leaf["keys"]["content_id"],
                            parent["keys"]["content_id"]), composed
    assert vdi["uri"] == leaf["uri"]
    assert [k for k in listed if k != leaf["key"]] == []   # dummy gone
    got = content(dp, vdi)
    runs = differ(got, data)
    assert not runs, [(a, b, bytes(got[a:a + 8]), bytes(data[a:a + 8]),
                       bytes(parent_bytes[a:a + 8]) if parent_bytes else None)
                      for a, b in runs]
    left = sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r",
              sr).split()
    assert [n for n in left if leaf["key"] in n] == [dataset_of(leaf)]
    plugin("Volume.destroy", sr=sr, key=leaf["key"])


def test_the_leaf_reads_as_the_parent_under_the_mirrors_writes(
        plugin, dp, sr):
    leaf, parent, data = received(plugin, sr, 1)
    mirror(leaf, data, 1, bytes(data))
    plugin("Volume.compose", sr=sr, key=leaf["key"], key2=parent["key"])
    check_composed(plugin, dp, sr, leaf, parent, data)


def test_a_compose_killed_after_each_change_is_finished_by_the_retry(
        plugin, dp, sr, tmp_path):
    leaf, parent, data = received(plugin, sr, 2)
    mirror(leaf, data, 2, bytes(data))
    points, argvs = traced_points(plugin, "Volume.compose", tmp_path, sr=sr,
                                  key=leaf["key"], key2=parent["key"])
    assert any(a[1:3] == ["-m", "zfsng.rangecopy"] for a in argvs), argvs
    check_composed(plugin, dp, sr, leaf, parent, data)
    kills = 0
    for n in played(points):
        leaf, parent, data = received(plugin, sr, 3 + n)
        copied = bytes(data)
        mirror(leaf, data, 3 + n, copied)
        killed = plugin.__class__(plugin.root, env=dict(
            plugin.env, ZFSNG_CRASH_AFTER=str(n)))
        args = dict(sr=sr, key=leaf["key"], key2=parent["key"])
        try:
            killed("Volume.compose", **args)  # fewer commands this time:
        except (PluginError, AssertionError):  # a zfs busy retry less
            kills += 1
        try:                                  # xapi's call again
            plugin("Volume.compose", **args)
        except PluginError as exc:            # past the commit: done
            assert exc.name == "Volume_does_not_exist", (n, exc)
        try:
            check_composed(plugin, dp, sr, leaf, parent, data, copied)
        except AssertionError as exc:
            raise AssertionError("killed after command %d of %s: %s"
                                 % (n, points, exc))
    assert kills >= len(played(points)) - 1, (kills, points)
