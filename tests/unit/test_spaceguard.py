"""The space guard of a mirrored zvol (zfsng/spaceguard.py) on the fake
host: room to be written whole while tapdisk mirrors it (in mirror mode,
tapdisk answers an ENOSPC by serving the guest zeros) plus ZFS's
worst-case estimate of the writes not yet synced (OpenZFS 2.1 refuses a
write the refreservation does not cover on a full pool), put back after,
refused with nothing changed on a pool without that room, and put back
by the collector when the job that held it is gone and no VBD mirrors."""

import pytest

from conftest import GiB, create_sr, create_volume
from zfsng import collect, errors, lock, meta, spaceguard, zfs

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
def test_the_largest_window_the_pool_has_room_for(fake, sr, room):
    """A pool with room for the disk whole but not ZFS's estimate too
    refuses, nothing changed (before, such a disk was mirrored and 2.1
    could refuse its writes); with room for a smaller window only, that
    one is taken (more syncs, the same guarantee)."""
    factor = spaceguard.INFLATION
    small = spaceguard.Budget(GiB, 16 * KiB, spaceguard.WINDOWS[-1])
    extra = small.margin(factor) // 2 if room == "disk-only" else \
        small.margin(factor) + 4 * MiB
    size = (pool_avail(sr) - 64 * KiB - extra) // (16 * KiB + 256) * \
        (16 * KiB)
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
