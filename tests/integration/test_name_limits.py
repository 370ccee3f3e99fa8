"""Names at ZFS's limit on real OpenZFS: an SR adopting a dataset whose
longest derived name (a live clone's internal snapshot) is exactly 255
characters works for every kind of name zfs-ng makes, the datapath's
state file of its snapshot VDI included; one character more is refused
by SR.create before anything is made."""

import pytest

from conftest import PluginError, sh
from datapath_util import DOM0, attach_dom0, detach_dom0, once

MiB = 1 << 20
POOL = "nlpool"
# namelimits.longest_name: <sr>/<uuid>@zfsng-clone-<uuid>, the SR dataset
# <parent>/zfsng-<uuid>: 255 - 86 - 43 characters of parent
PARENT = POOL + "/" + "d" * (255 - 86 - 43 - len(POOL) - 1)


@pytest.fixture
def pool(disks):
    sh("zpool", "create", "-o", "cachefile=none", "-m", "none", POOL,
       disks[0])
    sh("zfs", "create", PARENT)
    yield POOL
    sh("zpool", "destroy", "-f", POOL, check=False)


def test_one_character_too_long_is_refused(plugin, pool, new_uuid):
    sh("zfs", "create", PARENT + "x")
    with pytest.raises(PluginError) as info:
        plugin("SR.create", uuid=new_uuid(), name="long", description="",
               configuration={"dataset": PARENT + "x"})
    assert info.value.name == "InvalidConfiguration"
    assert "at most %d characters" % len(PARENT) in info.value.params[1]
    assert sh("zfs", "list", "-H", "-r", "-o", "name",
              PARENT + "x").split() == [PARENT + "x"]


def test_at_the_limit_every_name_works(plugin, dp, pool, new_uuid):
    stored = plugin("SR.create", uuid=new_uuid(), name="long",
                    description="", configuration={"dataset": PARENT})
    sr = plugin("SR.attach", configuration=stored)
    vol = plugin("Volume.create", sr=sr, name="d", description="",
                 size=4 * MiB, sharable=False)
    key = vol["key"]
    plugin("Volume.enable_cbt", sr=sr, key=key)
    snap = plugin("Volume.snapshot", sr=sr, key=key)
    live_clone = plugin("Volume.clone", sr=sr, key=key)
    plugin("Volume.clone", sr=sr, key=snap["key"])
    longest = max(len(n) for n in sh("zfs", "list", "-H", "-r", "-t", "all",
                                     "-o", "name", POOL).split())
    assert longest == 255
    attach_dom0(dp, snap, readonly=True, domain=DOM0, call=once)
    detach_dom0(dp, snap, domain=DOM0, call=once)
    plugin("Volume.list_changed_blocks", sr=sr, key=snap["key"], key2=key,
           offset=0, length=-1)
    plugin("Volume.data_destroy", sr=sr, key=snap["key"])
    assert len(plugin("SR.ls", sr=sr)) == 4
    for k in (live_clone["key"], key, snap["key"]):
        plugin("Volume.destroy", sr=sr, key=k)
