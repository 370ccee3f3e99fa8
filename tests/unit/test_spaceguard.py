"""The space guard of a mirrored zvol (zfsng/spaceguard.py) on the fake
host: room to be written whole while tapdisk mirrors it (in mirror mode,
tapdisk answers an ENOSPC by serving the guest zeros), put back after,
refused with nothing changed on a pool without that room, and put back
by the collector when the job that held it is gone."""

import pytest

from conftest import GiB, create_sr, create_volume
from zfsng import collect, errors, lock, meta, spaceguard


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
    spaceguard.hold(name)
    assert int(fake.get(name, "refreservation")) >= GiB
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
