"""Large VDIs on real OpenZFS, through the installed executables.

Large disks are a reason to come to zvols (a VHD stops at 2 TiB): a sparse
16 TiB VDI goes through its whole life here (create, snapshot, clone,
grow, dom0 attach with the domain string xapi really sends, data at its
last block). Then the largest size zfs-ng takes, 8 EiB less one block, and
one byte more, refused before anything is made: a zvol of 2^63 bytes would
not fit xapi's int64 and break every SR.ls of its SR. Last, SR.ls against
datasets an admin changed by hand (a size beyond int64, a tab and a
newline in a name, keys that are no JSON): the listing goes on.

The guest's disks are 1 GiB: every VDI here is thin and only a few blocks
are written.
"""

import random
import subprocess

import pytest

import xapi_flows as xapi
from conftest import PluginError, default_volblocksize, one_disk_sr, sh

TiB = 1 << 40
GiB = 1 << 30
MiB = 1 << 20
BLOCK = default_volblocksize()  # the one-disk SR's volblocksize
LIMIT = 2 ** 63 - BLOCK        # the largest VDI on such an SR
# What xapi-storage-script sends for a VBD plugged into dom0 (main.ml
# domain_of: "u0-" ^ dp with every '/' and '-' mapped to '_')
DOM0_VBD = xapi.domain_of("vbd/0/xvda", "0")


@pytest.fixture
def sr(plugin, disks, new_uuid):
    yield from one_disk_sr(plugin, disks, new_uuid, "large")


def block(seed):
    rnd = random.Random(seed)
    return bytes(rnd.getrandbits(8) for _ in range(BLOCK))


def write_at(path, offset, data):
    """One block at offset, O_DIRECT and synced (as tapdisk writes)."""
    proc = subprocess.run(
        ["dd", "of=" + path, "bs=%d" % BLOCK, "seek=%d" % (offset // BLOCK),
         "count=1", "iflag=fullblock", "oflag=direct",
         "conv=fsync,notrunc", "status=none"],
        input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()


def read_at(path, offset):
    proc = subprocess.run(
        ["dd", "if=" + path, "bs=%d" % BLOCK, "skip=%d" % (offset // BLOCK),
         "count=1", "iflag=direct", "status=none"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout


def volsize(dataset):
    return int(sh("zfs", "get", "-Hp", "-o", "value", "volsize", dataset))


def uri(vol):
    (u,) = vol["uri"]
    return u


def attach_dom0(dp, vol, readonly=False):
    """The dom0 path xapi takes for a VBD in dom0: the zvol itself."""
    result = dp("Datapath.attach", uri=uri(vol), domain=DOM0_VBD)
    dp("Datapath.activate_readonly" if readonly else "Datapath.activate",
       uri=uri(vol), domain=DOM0_VBD)
    (impl,) = result["implementations"]
    assert impl[0] == "BlockDevice", result
    return impl[1]["path"]


def detach_dom0(dp, vol):
    dp("Datapath.deactivate", uri=uri(vol), domain=DOM0_VBD)
    dp("Datapath.detach", uri=uri(vol), domain=DOM0_VBD)


def listed(plugin, sr):
    return dict((v["key"], v) for v in plugin("SR.ls", sr=sr))


def test_the_domain_is_what_xapi_sends():
    assert DOM0_VBD == "u0_vbd_0_xvda"


def test_a_sparse_16_tib_vdi_through_its_whole_life(plugin, dp, sr):
    size, grown = 16 * TiB, 17 * TiB
    vdi = xapi.vdi_create(plugin, sr, "big", size)
    assert vdi["virtual_size"] == size
    assert volsize("%s/%s" % (sr, vdi["key"])) == size

    # dom0 attach; the first and the last block
    path = attach_dom0(dp, vdi)
    assert int(sh("blockdev", "--getsize64", path)) == size
    first, last = block(1), block(2)
    write_at(path, 0, first)
    write_at(path, size - BLOCK, last)
    assert read_at(path, size - BLOCK) == last
    detach_dom0(dp, vdi)

    snap = xapi.vdi_snapshot(plugin, sr, vdi["key"])
    clone = xapi.vdi_clone(plugin, sr, snap["key"])
    assert snap["virtual_size"] == clone["virtual_size"] == size

    # grow the live one; its old last block stays, its new one works
    plugin("Volume.resize", sr=sr, key=vdi["key"], new_size=grown)
    assert plugin("Volume.stat", sr=sr, key=vdi["key"])["virtual_size"] == \
        grown
    path = attach_dom0(dp, vdi)
    assert int(sh("blockdev", "--getsize64", path)) == grown
    assert read_at(path, size - BLOCK) == last
    end = block(3)
    write_at(path, grown - BLOCK, end)
    assert read_at(path, grown - BLOCK) == end
    assert read_at(path, 0) == first
    detach_dom0(dp, vdi)

    # the clone and the snapshot hold what was there when it was taken
    path = attach_dom0(dp, clone)
    assert read_at(path, size - BLOCK) == last
    write_at(path, size - BLOCK, end)
    assert read_at(path, size - BLOCK) == end
    detach_dom0(dp, clone)
    path = attach_dom0(dp, snap, readonly=True)
    assert int(sh("blockdev", "--getsize64", path)) == size
    assert read_at(path, size - BLOCK) == last
    assert read_at(path, 0) == first
    detach_dom0(dp, snap)

    sizes = dict((k, v["virtual_size"]) for k, v in
                 listed(plugin, sr).items())
    assert sizes == {vdi["key"]: grown, snap["key"]: size,
                     clone["key"]: size}
    # thin: a few blocks and metadata on a 1 GiB disk
    assert int(sh("zfs", "get", "-Hp", "-o", "value", "used", sr)) < \
        64 * MiB
    for key in (clone["key"], snap["key"], vdi["key"]):
        plugin("Volume.destroy", sr=sr, key=key)
    assert listed(plugin, sr) == {}


def test_the_largest_vdi_and_one_byte_more(plugin, sr):
    datasets = sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r", sr)
    for size in (2 ** 63 - 1, LIMIT + 1):
        with pytest.raises(PluginError) as err:
            plugin("Volume.create", sr=sr, name="too big", description="",
                   size=size, sharable=False)
        assert err.value.name == "VolumeTooLarge"
        assert str(LIMIT) in err.value.params[1]       # names the limit
    assert sh("zfs", "list", "-H", "-o", "name", "-t", "all", "-r",
              sr) == datasets

    big = plugin("Volume.create", sr=sr, name="largest", description="",
                 size=LIMIT, sharable=False)
    assert big["virtual_size"] == LIMIT
    assert volsize("%s/%s" % (sr, big["key"])) == LIMIT

    small = plugin("Volume.create", sr=sr, name="small", description="",
                   size=GiB, sharable=False)
    with pytest.raises(PluginError) as err:
        plugin("Volume.resize", sr=sr, key=small["key"],
               new_size=2 ** 63 - 1)
    assert err.value.name == "VolumeTooLarge"
    assert volsize("%s/%s" % (sr, small["key"])) == GiB
    plugin("Volume.resize", sr=sr, key=small["key"], new_size=LIMIT)
    sizes = dict((k, v["virtual_size"]) for k, v in
                 listed(plugin, sr).items())
    assert sizes == {big["key"]: LIMIT, small["key"]: LIMIT}
    for vol in (big, small):
        plugin("Volume.destroy", sr=sr, key=vol["key"])


def test_sr_ls_survives_what_an_admin_sets_by_hand(plugin, sr):
    odd = plugin("Volume.create", sr=sr, name="odd", description="",
                 size=GiB, sharable=False)
    good = plugin("Volume.create", sr=sr, name="good", description="",
                  size=GiB, sharable=False)
    plugin("Volume.set", sr=sr, key=good["key"], k="k", v="v")
    good = plugin("Volume.stat", sr=sr, key=good["key"])
    dataset = "%s/%s" % (sr, odd["key"])
    weird = "a\tb\nc\n"
    # zfs takes these; the size is beyond int64 (no I/O is done on it)
    sh("zfs", "set", "volsize=%d" % 2 ** 63, dataset)
    sh("zfs", "set", "org.xcp-ng.zfs-ng:name=" + weird, dataset)
    sh("zfs", "set", "org.xcp-ng.zfs-ng:keys=not json", dataset)
    sh("zfs", "set", "org.xcp-ng.zfs-ng:sr-name=x\ny", sr)

    vols = listed(plugin, sr)
    assert sorted(vols) == sorted([odd["key"], good["key"]])
    assert vols[good["key"]] == good
    seen = vols[odd["key"]]
    # keys unreadable: none, but the content_id kept apart (contentid.py)
    assert (seen["virtual_size"], seen["name"], seen["keys"]) == \
        (2 ** 63 - 1, weird, {"content_id": odd["keys"]["content_id"]})
    assert plugin("Volume.stat", sr=sr, key=odd["key"]) == seen
    assert plugin("SR.stat", sr=sr)["name"] == "x\ny"
    with pytest.raises(PluginError) as err:
        plugin("Volume.set", sr=sr, key=odd["key"], k="a", v="b")
    assert err.value.name == "MetadataUnreadable"
    assert sh("zfs", "get", "-Hp", "-o", "value",
              "org.xcp-ng.zfs-ng:keys", dataset) == "not json\n"

    # back to sizes xapi can hold; the VDI can go as any other
    sh("zfs", "set", "volsize=%d" % GiB, dataset)
    plugin("Volume.destroy", sr=sr, key=odd["key"])
    assert sorted(listed(plugin, sr)) == [good["key"]]
