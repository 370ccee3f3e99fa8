"""Disks that come into zfs-ng offline, as xapi writes them (xen-api
v26.1.4), through the datapath's dom0 attach:

- Xen Orchestra's import of a raw disk (`/import_raw_vdi?format=raw`,
  import_raw_vdi.ml): VDI.create; a dom0 VBD plugged, which
  xapi-storage-script turns into Volume.stat, Datapath.attach,
  Volume.stat, Datapath.activate (domain ``u0_vbd_0_xvd…``); vhd-tool
  writes every byte, zeros included, in 2 MiB chunks with O_DIRECT, then
  fsyncs; the VBD unplugged: Volume.stat, Datapath.deactivate, detach.
- Xen Orchestra's continuous replication (IncrementalXapiWriter): the
  replica's snapshot cloned (VDI.clone), the delta written onto the clone
  as a VHD (`format=vhd`: only the sector runs the delta's block bitmaps
  mark), then VDI.snapshot of the replica.
- `xe vdi-copy` from a SMAPIv1 SR (Sm_fs_ops.copy_vdi): VDI.create, the
  same dom0 attach, sparse_dd -prezeroed: only the source's allocated
  extents are written (zeros inside them too), with O_DIRECT.

What must come out: the bytes the source held, and a disk that keeps
only what holds data (the zeros of a raw import cost nothing: the SR
compresses, and ZFS stores an all-zero block as a hole).
"""

import hashlib
import os
import random

import pytest

from conftest import one_disk_sr
from datapath_util import uri, write_direct
from test_cbt import content
from xapi_flows import domain_of, vdi_clone, vdi_create, vdi_snapshot

MiB = 1 << 20
DISK = 16 * MiB
CHUNK = 2 * MiB          # vhd-tool's raw copy
DOM0 = domain_of("vbd/0/xvdb", "0")


@pytest.fixture
def sr(plugin, disks, new_uuid):
    yield from one_disk_sr(plugin, disks, new_uuid, "importsr")


def plugged(plugin, dp, sr, vdi):
    """VBD.plug of a dom0 VBD, as xapi-storage-script calls it: the
    device path."""
    plugin("Volume.stat", sr=sr, key=vdi["key"])
    answer = dp("Datapath.attach", uri=uri(vdi), domain=DOM0)
    plugin("Volume.stat", sr=sr, key=vdi["key"])
    dp("Datapath.activate", uri=uri(vdi), domain=DOM0)
    (impl,) = answer["implementations"]
    assert impl[0] == "BlockDevice" and impl[1]["path"].startswith("/dev/")
    return impl[1]["path"]


def unplugged(plugin, dp, sr, vdi):
    plugin("Volume.stat", sr=sr, key=vdi["key"])
    dp("Datapath.deactivate", uri=uri(vdi), domain=DOM0)
    dp("Datapath.detach", uri=uri(vdi), domain=DOM0)


def image(seed, extents):
    """A disk image: random bytes in extents [(offset, length)], zeros
    elsewhere."""
    rng = random.Random(seed)
    data = bytearray(DISK)
    for offset, length in extents:
        data[offset:offset + length] = rng.getrandbits(8 * length).to_bytes(
            length, "little")
    return bytes(data)


def sha(data):
    return hashlib.sha256(data).hexdigest()


def used(plugin, sr, vdi):
    return plugin("Volume.stat", sr=sr, key=vdi["key"])[
        "physical_utilisation"]


def raw_import(plugin, dp, sr, data, name):
    """XO's raw import into a new VDI: every byte written."""
    vdi = vdi_create(plugin, sr, name, len(data))
    path = plugged(plugin, dp, sr, vdi)
    write_direct(path, [(at, data[at:at + CHUNK])
                        for at in range(0, len(data), CHUNK)])
    unplugged(plugin, dp, sr, vdi)
    return vdi


def test_a_raw_import_reads_back_and_keeps_its_zeros_free(plugin, dp, sr):
    data = image(1, [(2 * MiB, 3 * MiB)])
    vdi = raw_import(plugin, dp, sr, data, "imported")
    assert sha(content(dp, vdi)) == sha(data)
    # 16 MiB written, 3 MiB of it data: the zeros took no space
    assert used(plugin, sr, vdi) < 5 * MiB, used(plugin, sr, vdi)


def test_a_replication_delta_lands_on_a_clone_of_the_replica(plugin, dp,
                                                             sr):
    base = image(2, [(0, 4 * MiB), (10 * MiB, MiB)])
    replica = raw_import(plugin, dp, sr, base, "replica")
    snap = vdi_snapshot(plugin, sr, replica["key"])
    # the next run: the replica's snapshot cloned, the delta's sector
    # runs (a VHD's block bitmaps: whole sectors, not whole blocks)
    clone = vdi_clone(plugin, sr, snap["key"])
    rng = random.Random(3)
    runs = [(1 * MiB + 512, 1536), (6 * MiB, 64 * 1024),
            (10 * MiB + 4096, 512), (DISK - 512, 512)]
    delta = [(at, bytes(rng.getrandbits(8) for _ in range(n)))
             for at, n in runs]
    path = plugged(plugin, dp, sr, clone)
    write_direct(path, delta)
    unplugged(plugin, dp, sr, clone)
    vdi_snapshot(plugin, sr, clone["key"])
    want = bytearray(base)
    for at, piece in delta:
        want[at:at + len(piece)] = piece
    assert sha(content(dp, clone)) == sha(bytes(want))
    assert sha(content(dp, snap)) == sha(base)      # the replica's point


def test_a_vdi_copy_from_a_file_sr_writes_its_extents(plugin, dp, sr,
                                                      tmp_path):
    """The source: a sparse raw file (an ext SR's), read as sparse_dd
    reads an aio tapdisk's file, extent by extent (SEEK_DATA)."""
    source = str(tmp_path / "source.raw")
    data = image(4, [(MiB, 2 * MiB), (9 * MiB, 512 * 1024)])
    with open(source, "wb") as f:
        f.truncate(DISK)
        for at, n in ((MiB, 2 * MiB), (9 * MiB, 512 * 1024)):
            f.seek(at)
            f.write(data[at:at + n])
    vdi = vdi_create(plugin, sr, "copied", DISK)
    path = plugged(plugin, dp, sr, vdi)
    write_direct(path, list(_extents(source)))
    unplugged(plugin, dp, sr, vdi)
    assert sha(content(dp, vdi)) == sha(data)
    assert used(plugin, sr, vdi) < 4 * MiB, used(plugin, sr, vdi)


def _extents(path):
    """(offset, bytes) of the file's data extents, in 1 MiB pieces."""
    with open(path, "rb") as f:
        fd, end, at = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while at < end:
            try:
                at = os.lseek(fd, at, os.SEEK_DATA)
            except OSError:          # no data past at
                return
            stop = os.lseek(fd, at, os.SEEK_HOLE)
            while at < stop:
                n = min(MiB, stop - at)
                yield at, os.pread(fd, n, at)
                at += n
