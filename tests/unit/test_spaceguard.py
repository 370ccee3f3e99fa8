"""The space guard of a mirrored zvol (zfsng/spaceguard.py) on the fake
host: room to be written whole while tapdisk mirrors it (in mirror mode,
tapdisk answers an ENOSPC by serving the guest zeros) plus ZFS's
worst-case estimate of the writes not yet synced (OpenZFS 2.1 refuses a
write the refreservation does not cover on a full pool), put back after,
refused with nothing changed on a pool without that room, and put back
by the collector when the job that held it is gone and no VBD mirrors."""

import pytest

from conftest import GiB, create_sr, create_volume
from zfsng import collect, errors, lock, meta, pools, spaceguard, zfs

MiB, KiB = 1 << 20, 1 << 10


@pytest.fixture
def sr(fake):
    return create_sr()[0]


def zvol(volume):
    return "tank/" + volume["key"]


def guard_of(fake, name):
    return fake.get(name, meta.MIRROR_GUARD)


@pytest.mark.parametrize("provisioning", ["thin", "thick"])
def test_a_guard_gives_room_and_gives_it_back(fake, provisioning):
    sr, _ = create_sr({"device": "/dev/sdb", "provisioning": provisioning})
    name = zvol(create_volume(sr, size=GiB))
    before = fake.get(name, "refreservation")
    budget = spaceguard.hold(name)
    assert int(fake.get(name, "refreservation")) >= GiB + \
        budget.margin(spaceguard.INFLATION)
    assert guard_of(fake, name) == str(before or 0)
    spaceguard.release(name)
    assert fake.get(name, "refreservation") == before
    assert guard_of(fake, name) is None
    spaceguard.release(name)                   # again: nothing to do
    assert fake.get(name, "refreservation") == before


def test_a_pool_without_room_refuses_and_nothing_changes(fake, sr):
    name = zvol(create_volume(sr, size=20 * GiB))     # thin, pool 10 GiB
    with pytest.raises(errors.OutOfSpace) as err:
        spaceguard.hold(name)
    assert "move the VM halted" in err.value.message
    assert fake.get(name, "refreservation") in (None, 0, "0")
    assert guard_of(fake, name) is None


def test_the_collector_puts_back_a_dead_jobs_guard_only(fake, sr):
    """A guard left by a job that died (dom0 crashed mid-move, or between
    the record and the reservation) is put back by the collector; one a
    live job holds is kept."""
    name = zvol(create_volume(sr, size=GiB))
    fake.inject("zfs set refreservation=auto", "cannot set property: "
                "I/O error")
    with pytest.raises(errors.StorageError):
        spaceguard.hold(name)               # the record made, then a cut
    assert guard_of(fake, name) == "0"
    spaceguard.hold(name)
    with lock.reading(spaceguard.lock_name(name)):
        collect.collect(sr)
        assert guard_of(fake, name) == "0"
        assert int(fake.get(name, "refreservation")) >= GiB
    collect.collect(sr)
    assert guard_of(fake, name) is None
    assert fake.get(name, "refreservation") in (None, 0, "0")


def auto(name):
    """What refreservation=auto gives the zvol (the fake's estimate)."""
    row = zfs.get_one(name, ["volsize", "volblocksize"])
    return int(row["volsize"]) + int(row["volsize"]) // int(
        row["volblocksize"]) * 256 + 64 * KiB


def test_the_guard_covers_zfss_estimate_of_the_writes_in_flight(fake, sr):
    """refreservation=auto is the disk written whole; ZFS reserves 24
    times each byte dirtied and not yet synced, and charges the pool
    what the refreservation leaves out: the guard adds at least that
    for everything tapdisk can have in flight, and a window."""
    name = zvol(create_volume(sr, size=GiB))
    budget = spaceguard.hold(name)
    margin = int(fake.get(name, "refreservation")) - auto(name)
    assert margin == budget.margin(spaceguard.INFLATION)
    in_flight = spaceguard.TAPDISK_REQUESTS * spaceguard.TAPDISK_SEGMENTS \
        * spaceguard.PAGE
    assert margin >= 24 * (budget.window + 2 * in_flight)
    assert budget.window == spaceguard.WINDOWS[0]    # a 10 GiB pool


def pool_avail(sr):
    return int(zfs.get_one(sr, ["available"])["available"])


@pytest.mark.parametrize("room", ["disk-only", "smallest-window"])
def test_the_largest_window_the_pool_has_room_for(fake, room):
    """A pool with room for the disk whole but not ZFS's estimate too
    refuses, nothing changed (before, such a disk was mirrored and 2.1
    could refuse its writes); with room for a smaller window only, that
    one is taken (more syncs, the same guarantee)."""
    block = 16 * KiB     # the sizes below are worked out for 16K blocks
    sr, _ = create_sr({"device": "/dev/sdb", "volblocksize": "16K"})
    factor = spaceguard.INFLATION
    small = spaceguard.Budget(GiB, block, spaceguard.WINDOWS[-1])
    extra = small.margin(factor) // 2 if room == "disk-only" else \
        small.margin(factor) + 4 * MiB
    size = (pool_avail(sr) - 64 * KiB - extra) // (block + 256) * block
    name = zvol(create_volume(sr, size=size))
    if room == "disk-only":
        with pytest.raises(errors.OutOfSpace) as err:
            spaceguard.hold(name)
        assert "move the VM halted" in err.value.message
        assert fake.get(name, "refreservation") in (None, 0, "0")
        assert guard_of(fake, name) is None
        return
    budget = spaceguard.hold(name)
    assert budget.window == spaceguard.WINDOWS[-1]
    assert int(fake.get(name, "refreservation")) == auto(name) + \
        budget.margin(factor)


def test_the_margin_follows_the_modules_inflation(fake, sr, tmp_path,
                                                  monkeypatch):
    parameter = tmp_path / "spa_asize_inflation"
    parameter.write_text("6\n")
    monkeypatch.setattr(spaceguard, "INFLATION_PARAMETER", str(parameter))
    name = zvol(create_volume(sr, size=GiB))
    budget = spaceguard.hold(name)
    assert int(fake.get(name, "refreservation")) - auto(name) == \
        budget.margin(6)


def test_a_writes_dirtied_blocks_are_counted_whole():
    """ZFS dirties whole blocks, and an indirect block at every level
    above them (each 128 KiB): a sector write counts a block and one
    indirect block a level; one across two blocks two blocks; a window's
    indirect blocks never more than the disk has."""
    budget = spaceguard.Budget(32 * MiB, 16 * KiB, 4 * MiB)
    assert budget.spans == [16 * MiB, 16 * GiB]          # L1, L2
    assert budget.indirect_total == 3 * 128 * KiB        # two L1, one L2
    assert budget.dirtied(0, 512) == (16 * KiB, 2 * 128 * KiB)
    assert budget.dirtied(16 * KiB - 512, 1024) == (32 * KiB, 2 * 128 * KiB)
    assert budget.dirtied(16 * MiB - 4 * KiB, 8 * KiB) == \
        (32 * KiB, 3 * 128 * KiB)                         # two L1s
    full = [budget.add(at, 44 * KiB) for at in range(0, 8 * MiB, 64 * KiB)]
    # three blocks a write, the disk's three indirect blocks at most:
    # 48 KiB * 78 + 384 KiB reaches the 4 MiB window
    assert full.index(True) == 77
    assert budget.indirect > budget.indirect_total      # capped when summed
    budget.reset()
    assert not budget.add(0, 512)


# --- the pool's sector ------------------------------------------------------

def guarded_margin(fake, config):
    sr, _ = create_sr(config)
    name = zvol(create_volume(sr, size=GiB))
    budget = spaceguard.hold(name)
    return int(fake.get(name, "refreservation")) - auto(name), budget


def test_a_pool_of_64k_sectors_gets_the_margin_of_64k_sectors(fake):
    """ZFS counts each write, and each block it dirties, at least one
    sector of the pool's largest ashift (spa_get_worst_case_asize):
    ashift=16 (which sr-create accepts) makes each 16 KiB block count
    64 KiB, and the margin must follow, window and writes assigned."""
    margin, budget = guarded_margin(fake, {"device": "/dev/sdb",
                                           "ashift": "16"})
    assert budget.sector == 64 * KiB
    assert margin == budget.margin(spaceguard.INFLATION)
    small = spaceguard.Budget(GiB, 16 * KiB, budget.window)
    # 352 writes assigned at once, each a sector more; 8 KiB assumed before
    segments = spaceguard.TAPDISK_REQUESTS * spaceguard.TAPDISK_SEGMENTS
    assert margin - small.margin(spaceguard.INFLATION) >= \
        spaceguard.INFLATION * segments * (64 - 8) * KiB
    # a 512-byte write dirties one 16 KiB block: counted as 64 KiB
    assert budget.dirtied(0, 512)[0] == 64 * KiB
    assert small.dirtied(0, 512)[0] == 16 * KiB


@pytest.mark.parametrize("config,detected,sector", [
    ({"device": "/dev/sdb", "ashift": "12"}, {}, 8 * KiB),
    ({"device": "/dev/sdb"}, {"/dev/sdb": 12}, 8 * KiB),
    ({"device": "/dev/sdb"}, {"/dev/sdb": 14}, 16 * KiB),
    # the largest of the pool's vdevs, a log device's counted too
    ({"device": "/dev/sdb,/dev/sdc"}, {"/dev/sdc": 15}, 32 * KiB),
    ({"vdev": "/dev/sdb log /dev/sdc"}, {"/dev/sdc": 13}, 8 * KiB),
    ({"vdev": "/dev/sdb log /dev/sdc"}, {"/dev/sdc": 14}, 16 * KiB),
])
def test_the_sector_is_the_largest_of_the_vdevs_ashifts(fake, config,
                                                        detected, sector):
    """What the vdevs have, as their labels say: the pool property is 0
    ("detected") unless sr-create was given an ashift."""
    for disk, ashift in detected.items():
        fake.devices[disk].ashift = ashift
    _, budget = guarded_margin(fake, config)
    assert budget.sector == sector


def test_an_unreadable_ashift_takes_the_largest_sector(fake, sr):
    """No label read (zdb fails on every leaf): the sector of ASHIFT_MAX,
    64 KiB. Larger than the pool's can only refuse a move (OutOfSpace,
    the VM stays put); smaller could let ZFS refuse a mirrored write."""
    fake.inject("zdb -l", "failed to unpack label 0", rc=2, times=-1)
    name = zvol(create_volume(sr, size=GiB))
    budget = spaceguard.hold(name)
    assert budget.sector == 64 * KiB
    assert int(fake.get(name, "refreservation")) - auto(name) == \
        budget.margin(spaceguard.INFLATION)


def test_an_unreadable_pool_takes_the_largest_sector(fake, sr):
    fake.inject("zpool get", "internal error: I/O error", times=1)
    assert spaceguard.sector("tank") == 64 * KiB
    assert spaceguard.sector("tank") == 8 * KiB    # the pool read again


def test_another_pools_label_counts_nothing(fake, sr):
    """A leaf path whose label names another pool (a disk renamed under
    the imported pool) says nothing of this pool's ashift."""
    fake.devices["/dev/sdc"].ashift = 12
    create_sr({"device": "/dev/sdc"}, uuid="0f6a1e3c-2b4d-4e5f-8a9b-"
              "0c1d2e3f4a5b", name="other")
    assert spaceguard.sector("other") == 8 * KiB
    fake.devices["/dev/sdb1"].label = fake.devices["/dev/sdc1"].label
    assert pools.read_label("/dev/sdb1")["name"] == "other"
    assert spaceguard.sector("tank") == 64 * KiB
