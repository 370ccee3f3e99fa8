"""Changed block tracking on real ZFS, as Xen Orchestra drives it through
xapi: enable CBT, snapshot, read the snapshot whole (the full backup), then
rounds of guest writes, a new snapshot, Volume.list_changed_blocks(previous,
new), the changed blocks read from the new snapshot's dom0 attach and
applied to the backup copy, and Volume.data_destroy of the snapshot just
backed up ("purge snapshot data": XO's backup runner data-destroys the
exported snapshot's disks), so that every list starts from a bookmark.
The reads go as XO's do: the snapshot's dom0 attach (the datapath plugin) served read-only over NBD with TLS by a
real server (qemu-nbd, standing for xapi's), read by XO's own client,
@vates/nbd-client (nbd_util). After every round the backup copy must
equal the new snapshot, byte for byte; the blocks that really changed
(both snapshots compared 64 KiB block by block) must all be reported; what
is reported beyond them is printed.
"""

import hashlib
import os
import random
import subprocess
import time

import pytest

import nbd_util
from conftest import sh
from datapath_util import attach_dom0, detach_dom0, once
from plugin_client import marked_blocks

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
G = 64 * KiB
DISK = 16 * MiB    # 256 blocks: big enough for every case below, small
                   # enough that the full reads stay cheap under emulation
DATA = 4 * MiB     # what the first backup finds written


@pytest.fixture
def sr(plugin, disks, new_uuid):
    from conftest import one_disk_sr
    yield from one_disk_sr(plugin, disks, new_uuid, "cbtsr")


def blocks_of(result, size):
    """The block numbers a list_changed_blocks answer marks."""
    assert result["granularity"] == G
    return set(marked_blocks(result, nbytes=(size // G + 7) // 8))


def changed(plugin, sr, key, key2, size):
    return blocks_of(plugin("Volume.list_changed_blocks", sr=sr, key=key,
                            key2=key2, offset=0, length=-1), size)


def content(dp, vol):
    """A VDI's bytes, read from its dom0 attach (read-only)."""
    path = attach_dom0(dp, vol, readonly=True, call=once)
    try:
        with open(path, "rb") as f:
            data = f.read()
    finally:
        detach_dom0(dp, vol, call=once)
    assert len(data) == vol["virtual_size"]
    return data


def truth(old, new):
    """The 64 KiB blocks that differ (old padded with zeros: a grown disk
    reads zeros past its old end)."""
    old = old + b"\0" * (len(new) - len(old))
    return set(i for i in range(len(new) // G)
               if old[i * G:(i + 1) * G] != new[i * G:(i + 1) * G])


def write(dataset, offset, data):
    fd = os.open("/dev/zvol/" + dataset, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(dataset, offset, length):
    sh("blkdiscard", "-o", str(offset), "-l", str(length),
       "/dev/zvol/" + dataset)


def dataset_of(vol):
    (uri,) = vol["uri"]
    return uri[len("zfs-ng:///"):]


def backup_over_nbd(dp, vol, blocks, path):
    """Read blocks ("all": the full backup) of a snapshot VDI as XO does:
    its dom0 attach served over NBD, read by XO's client into the backup
    file at path (sized to the VDI). Returns (the bytes the client read,
    the VDI's whole content read from the same attach, for the truth)."""
    device = attach_dom0(dp, vol, readonly=True, call=once)
    try:
        with open(device, "rb") as f:
            whole = f.read()
        with nbd_util.serve(device) as server:
            done = nbd_util.read_blocks(server, path, blocks,
                                        size=vol["virtual_size"])
    finally:
        detach_dom0(dp, vol, call=once)
    assert len(whole) == vol["virtual_size"]
    return done["bytes"], whole


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def sha(data):
    return hashlib.sha256(data).hexdigest()


ROUNDS = 2     # the first from the first snapshot's map, the next from
               # a bookmark


def guest_round(plugin, sr, vol, rnd, n):
    """One round of what a guest does between two backups: unaligned
    writes crossing 64 KiB boundaries, zeros over data, a discard, a
    write into never-written space; the last round grows the disk first and
    writes past the old end."""
    ds = dataset_of(vol)
    size = plugin("Volume.stat", sr=sr, key=vol["key"])["virtual_size"]
    if n == ROUNDS - 1:
        plugin("Volume.resize", sr=sr, key=vol["key"], new_size=size + 8 * MiB)
        sh("udevadm", "settle")
        write(ds, size + 3 * MiB + 3, os.urandom(100 * KiB))
        size += 8 * MiB
    for _ in range(6):
        at = rnd.randrange(0, size - 200 * KiB)
        write(ds, at, os.urandom(rnd.randrange(1, 150 * KiB)))
    write(ds, rnd.randrange(0, DATA // G) * G - 4 * KiB + 8 * KiB,
          b"\0" * (70 * KiB))                      # zeros over data
    discard(ds, rnd.randrange(0, DATA // G) * G, 128 * KiB)
    write(ds, 10 * MiB + n * MiB, os.urandom(16 * KiB))  # fresh space


def test_incremental_backups_read_only_the_changed_blocks(plugin, dp, sr,
                                                           tmp_path):
    rnd = random.Random(14)
    vol = plugin("Volume.create", sr=sr, name="vm disk", description="",
                 size=DISK, sharable=False)
    key = vol["key"]
    plugin("Volume.enable_cbt", sr=sr, key=key)
    assert plugin("Volume.stat", sr=sr, key=key)["cbt_enabled"] is True
    ds = dataset_of(vol)
    write(ds, 0, os.urandom(DATA))
    write(ds, DISK - MiB, os.urandom(MiB))        # a GPT backup at the end
    prev = plugin("Volume.snapshot", sr=sr, key=key)
    assert prev["cbt_enabled"] is True
    copy = str(tmp_path / "backup.raw")
    read, whole = backup_over_nbd(dp, prev, "all", copy)
    assert read == DISK
    backup = file_bytes(copy)                     # the full backup
    assert sha(backup) == sha(whole)
    first, first_content = prev, backup
    purge(plugin, sr, prev)
    report = []
    for n in range(ROUNDS):
        guest_round(plugin, sr, vol, rnd, n)
        new = plugin("Volume.snapshot", sr=sr, key=key)
        size = new["virtual_size"]
        # from the previous snapshot, data-destroyed: its bookmark
        got = changed(plugin, sr, prev["key"], new["key"], size)
        read, now = backup_over_nbd(dp, new, sorted(got), copy)
        assert read == len(got) * G
        want = truth(backup, now)
        assert want <= got, sorted(want - got)    # never a missed block
        backup = file_bytes(copy)
        assert sha(backup) == sha(now)
        report.append((n, len(want), len(got)))
        purge(plugin, sr, new)
        prev = new
    print("rounds (round, blocks changed, blocks reported):", report)
    # the first snapshot's map came from a full send of it before its data
    # went: the report is the change, from the first round on
    for n, want, got in report:
        assert got == want, report
    # from the first (data-destroyed) snapshot to a new one
    write(ds, 3 * MiB + 5, os.urandom(10))
    latest_vol = plugin("Volume.snapshot", sr=sr, key=key)
    latest = content(dp, latest_vol)
    got = changed(plugin, sr, first["key"], latest_vol["key"], len(latest))
    want = truth(first_content, latest)
    assert want == got, (sorted(want - got), sorted(got - want))
    # and to the live disk, through a snapshot taken for the call
    write(ds, 5 * MiB + 5, os.urandom(10))
    got = changed(plugin, sr, latest_vol["key"], key, len(latest))
    assert got == {(5 * MiB + 5) // G}, sorted(got)
    assert "zfsng-cbt-" not in sh("zfs", "list", "-H", "-t", "all", "-r",
                                  "-o", "name", sr)
    # everything goes: the disk is hidden while data-destroyed snapshots
    # hold bookmarks on it, freed with the last of them
    keys = [v["key"] for v in plugin("SR.ls", sr=sr)]
    plugin("Volume.destroy", sr=sr, key=key)
    for k in keys:
        plugin("Volume.destroy", sr=sr, key=k)
    assert plugin("SR.ls", sr=sr) == []
    assert sh("zfs", "list", "-H", "-t", "all", "-r", "-o", "name",
              sr).split() == [sr]


def purge(plugin, sr, snap):
    """What XO's "purge snapshot data" does once a snapshot is backed up:
    VDI.data_destroy, after which xapi marks it cbt_metadata. The VDI
    stays, with its keys, read-only; its data is gone."""
    plugin("Volume.data_destroy", sr=sr, key=snap["key"])
    plugin("Volume.set", sr=sr, key=snap["key"], k="vdi-type",
           v="cbt_metadata")                      # what xapi does next
    kept = plugin("Volume.stat", sr=sr, key=snap["key"])
    # the id it had with its data (zfsng/contentid.py)
    assert kept["keys"] == {"vdi-type": "cbt_metadata",
                            "content_id": snap["keys"]["content_id"]}
    assert kept["read_write"] is False and kept["cbt_enabled"] is True
    assert kept["virtual_size"] == snap["virtual_size"]
    assert "@" + snap["key"] not in " ".join(
        sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-r",
           sr).split())                           # its data is gone


def test_a_data_destroyed_snapshot_cannot_be_attached_or_cloned(
        plugin, dp, sr):
    vol = plugin("Volume.create", sr=sr, name="d", description="",
                 size=16 * MiB, sharable=False)
    plugin("Volume.enable_cbt", sr=sr, key=vol["key"])
    snap = plugin("Volume.snapshot", sr=sr, key=vol["key"])
    plugin("Volume.data_destroy", sr=sr, key=snap["key"])
    kept = plugin("Volume.stat", sr=sr, key=snap["key"])  # as xapi does
    with pytest.raises(Exception) as err:
        attach_dom0(dp, kept, readonly=True, call=once)
    assert "DataDestroyed" in str(err.value)
    with pytest.raises(Exception) as err:
        plugin("Volume.clone", sr=sr, key=snap["key"])
    assert "DataDestroyed" in str(err.value)


_HELD_ZDB = """#!/bin/sh
# zdb held until the test says go: a map that takes as long as needed
touch "$HOLD/started"
n=0
while [ ! -e "$HOLD/go" ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n + 1)); done
exec %s "$@"
"""


def test_the_sr_serves_other_calls_while_data_destroy_maps(
        plugin, dp, sr, tmp_path):
    """Volume.data_destroy reads the snapshot's map (zdb, up to an hour a
    TiB) outside the SR lock: meanwhile a VM starts on another VDI of the
    SR (Datapath.attach, activate, open) and another VDI is snapshotted,
    instead of waiting the SR lock's 300 s and failing SrBusy. The map is
    held by a zdb that waits for the test's word (a script first on the
    call's PATH), so that "meanwhile" is certain, not a race."""
    import shutil
    import threading
    from conftest import ROOT, QUIET_METRICS
    from plugin_client import Plugin
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "zdb").write_text(_HELD_ZDB % shutil.which("zdb"))
    (hold / "zdb").chmod(0o755)
    held = Plugin(ROOT, env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run",
                             "ZFSNG_METRICS_PERIOD": QUIET_METRICS,
                             "HOLD": str(hold), "PATH": "%s:%s" % (
                                 hold, os.environ["PATH"])})
    vol = plugin("Volume.create", sr=sr, name="d", description="",
                 size=DISK, sharable=False)
    plugin("Volume.enable_cbt", sr=sr, key=vol["key"])
    write(dataset_of(vol), 0, os.urandom(DATA))
    snap = plugin("Volume.snapshot", sr=sr, key=vol["key"])
    other = plugin("Volume.create", sr=sr, name="vm", description="",
                   size=DISK, sharable=False)
    outcome = []
    mapper = threading.Thread(target=lambda: outcome.append(held(
        "Volume.data_destroy", sr=sr, key=snap["key"])))
    mapper.start()
    try:
        for _ in range(600):
            if (hold / "started").exists() or not mapper.is_alive():
                break
            time.sleep(0.2)
        assert (hold / "started").exists(), "data_destroy ran no zdb"
        vm = dict(uri=other["uri"][0], domain="7")    # a VM's start
        dp("Datapath.open", uri=vm["uri"], persistent=True)
        dp("Datapath.attach", **vm)
        dp("Datapath.activate", **vm)
        plugin("Volume.snapshot", sr=sr, key=other["key"])
        assert mapper.is_alive() and not (hold / "go").exists()
        dp("Datapath.deactivate", **vm)                 # and its stop
        dp("Datapath.detach", **vm)
        dp("Datapath.close", uri=vm["uri"])
    finally:
        (hold / "go").touch()
        mapper.join(300)
    assert not mapper.is_alive() and outcome == [None]
    kept = plugin("Volume.stat", sr=sr, key=snap["key"])
    assert kept["key"] == snap["key"]
    with pytest.raises(Exception) as err:       # its data is gone
        plugin("Volume.clone", sr=sr, key=snap["key"])
    assert "DataDestroyed" in str(err.value)
    new = plugin("Volume.snapshot", sr=sr, key=vol["key"])
    assert changed(plugin, sr, snap["key"], new["key"], DISK) == set()


def test_a_sparse_16_tib_disk_lists_only_what_was_written(plugin, sr):
    vol = plugin("Volume.create", sr=sr, name="big", description="",
                 size=16 * TiB, sharable=False)
    key, ds = vol["key"], dataset_of(vol)
    plugin("Volume.enable_cbt", sr=sr, key=key)
    write(ds, 0, os.urandom(MiB))
    a = plugin("Volume.snapshot", sr=sr, key=key)
    write(ds, 8 * TiB, os.urandom(MiB))
    b = plugin("Volume.snapshot", sr=sr, key=key)
    got = changed(plugin, sr, a["key"], b["key"], 16 * TiB)
    assert got == set(range(8 * TiB // G, (8 * TiB + MiB) // G))


_WORKER = r"""
import os, random, sys, time
sys.path.insert(0, "tests")
from plugin_client import Plugin, PluginError, marked_blocks
plugin = Plugin(sys.argv[1], env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})
sr, end = sys.argv[2], time.time() + float(sys.argv[3])
rnd = random.Random(int(sys.argv[4]))
G = 65536


def write(vol, offset, data):
    path = "/dev/zvol/" + vol["uri"][0][len("zfs-ng:///"):]
    deadline = time.time() + 30
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.1)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def marked(result):
    return set(marked_blocks(result))


ops = errors = wrong = 0
while time.time() < end:
    try:
        vol = plugin("Volume.create", sr=sr, name="c", description="",
                     size=4 << 20, sharable=False)
        plugin("Volume.enable_cbt", sr=sr, key=vol["key"])
        write(vol, 0, os.urandom(1 << 20))
        a = plugin("Volume.snapshot", sr=sr, key=vol["key"])
        at = rnd.randrange(0, 60) * G
        write(vol, at, b"\0" * G if rnd.random() < 0.5 else os.urandom(G))
        b = plugin("Volume.snapshot", sr=sr, key=vol["key"])
        got = marked(plugin("Volume.list_changed_blocks", sr=sr,
                            key=a["key"], key2=b["key"], offset=0,
                            length=-1))
        live = marked(plugin("Volume.list_changed_blocks", sr=sr,
                             key=a["key"], key2=vol["key"], offset=0,
                             length=-1))
        # the block written, and nothing else; zeros over never-written
        # space (past the first MiB) may count as no change
        if not (got <= {at // G} and live == got and
                (at < (1 << 20)) <= (got == {at // G})):
            wrong += 1
            print("wrong:", at, sorted(got), sorted(live))
        plugin("Volume.data_destroy", sr=sr, key=a["key"])
        keys = [vol["key"], a["key"], b["key"]]
        rnd.shuffle(keys)
        for key in keys:
            plugin("Volume.destroy", sr=sr, key=key)
        ops += 9
    except PluginError as exc:
        errors += 1
        print("typed error:", exc.code, exc.params)
print("ops", ops, "errors", errors, "wrong", wrong)
"""


def test_three_concurrent_backup_chains(plugin, sr):
    """Three callers at once, each its own disk's backup chain: lists (to
    a snapshot, and to the live disk through a snapshot of the call's own),
    the reads of the previous snapshot's frees (a clone each), data_destroy
    and destroys in any order, with the collector running meanwhile. Every
    answer right, no error, nothing left."""
    procs = [subprocess.Popen(
        ["python3", "-c", _WORKER, plugin.root, sr, "20", str(seed)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=plugin.env,
        cwd=os.path.join(os.path.dirname(__file__), "..", ".."))
        for seed in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        text = out.decode()
        assert proc.returncode == 0, err.decode()[-2000:]
        assert "errors 0 wrong 0" in text, text[-2000:]
    assert plugin("SR.ls", sr=sr) == []
    assert sh("zfs", "list", "-H", "-t", "all", "-r", "-o", "name",
              sr).split() == [sr]


def _zfsng():
    """The plugin's own modules (this checkout's), to call the two ways of
    listing directly."""
    import sys
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                        "..", "volume")
    if path not in sys.path:
        sys.path.insert(0, path)
    from zfsng import blockmap, zdb, zfs
    return blockmap, zdb, zfs


def _granules(ranges):
    return set(i for a, b in ranges for i in range(a // G, (b + G - 1) // G))


def test_block_births_list_exactly_what_both_snapshots_compared_show(
        plugin, dp, sr):
    """The list from the block pointers' birth times (zdb, metadata only)
    against both snapshots read and compared 64 KiB block by block, and
    against the incremental send it replaces: random data, zeros over data
    (holes under compression), a discard, a few bytes in a zeroed block (an
    embedded block pointer), writes into never-written space, zeros into
    never-written space (no change)."""
    blockmap, zdb, zfs = _zfsng()
    rnd = random.Random(21)
    size = 96 * MiB
    vol = plugin("Volume.create", sr=sr, name="births", description="",
                 size=size, sharable=False)
    plugin("Volume.enable_cbt", sr=sr, key=vol["key"])
    ds = dataset_of(vol)
    write(ds, 0, os.urandom(24 * MiB))
    write(ds, 40 * MiB + 100, b"tiny")             # an embedded block
    a = plugin("Volume.snapshot", sr=sr, key=vol["key"])
    for _ in range(40):
        write(ds, rnd.randrange(0, size - 200 * KiB),
              os.urandom(rnd.randrange(1, 150 * KiB)))
    write(ds, 2 * MiB + 3 * KiB, b"\0" * (200 * KiB))   # zeros over data
    discard(ds, 8 * MiB, 256 * KiB)
    write(ds, 30 * MiB + 7, b"small")               # embedded, fresh space
    write(ds, 41 * MiB, os.urandom(64 * KiB))       # fresh space
    write(ds, 60 * MiB, b"\0" * MiB)                # zeros on zeros
    b = plugin("Volume.snapshot", sr=sr, key=vol["key"])
    want = truth(content(dp, a), content(dp, b))
    got = changed(plugin, sr, a["key"], b["key"], size)
    assert got == want, (sorted(want - got), sorted(got - want))
    # the method itself, on the two snapshots' datasets
    names = [n for n in sh("zfs", "list", "-H", "-t", "snapshot", "-o",
                           "name", "-s", "createtxg", "-r", ds).split()]
    snap_a, snap_b = [n for n in names if n.endswith(("@" + a["key"],
                                                      "@" + b["key"]))]
    block = int(sh("zfs", "get", "-Hp", "-o", "value", "volblocksize",
                   ds).strip())
    born, data_b = zdb.born_since(zfs.createtxg(snap_a), snap_b, block, 600)
    _, data_a = zdb.born_since(0, snap_a, block, 600)
    by_births = _granules(blockmap.union(
        born, blockmap.subtract(data_a, data_b)))
    assert by_births == want, (sorted(want - by_births),
                               sorted(by_births - want))
    writes, frees = zfs.send_changes(snap_a, snap_b)
    by_send = _granules(blockmap.union(writes,
                                       blockmap.intersect(frees, data_a)))
    assert by_send == by_births
    # a snapshot's data blocks are where it reads non-zero, and only there
    # may it read non-zero (a block of zeros may be stored: no compression)
    whole = content(dp, b)
    nonzero = set(i for i in range(size // G)
                  if whole[i * G:(i + 1) * G].strip(b"\0"))
    assert nonzero <= _granules(data_b)
    # the list to the live disk while a guest keeps writing elsewhere
    stop = []

    def writer():
        while not stop:
            write(ds, 80 * MiB + rnd.randrange(0, 8 * MiB), os.urandom(4096))
    import threading
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        write(ds, 50 * MiB + 5, b"live")
        got = changed(plugin, sr, b["key"], vol["key"], size)
    finally:
        stop.append(True)
        thread.join()
    assert (50 * MiB + 5) // G in got
    assert got - set(range(80 * MiB // G, 88 * MiB // G + 1)) == \
        {(50 * MiB + 5) // G}
    for key in (b["key"], a["key"], vol["key"]):
        plugin("Volume.destroy", sr=sr, key=key)
