"""Names zfs-ng derives from what an admin gives must fit ZFS's limits
(255 characters for a dataset, snapshot or bookmark name): SR.create
refuses a pool-name, adopted pool or dataset too long for the names it
will make later, and names a pool after a name-label only if it fits.
At the limit, every kind of name zfs-ng makes works.
"""

import pytest

from zfsng import errors, meta, namelimits

from conftest import SR_UUID, call, create_volume

FALLBACK = "zfsng-" + SR_UUID[:8]


def longest_parent(source):
    """The longest pool or dataset name of source that SR.create takes."""
    if source == "dataset":
        room = namelimits.room_for(namelimits.sample_sr_dataset("tank/"))
        return "tank/" + "d" * room
    if source == "zpool":
        return "z" * (namelimits.room_for(namelimits.sample_sr_dataset("")))
    return "p" * namelimits.room_for("")


def config_for(fake, source, name):
    if source == "dataset":
        fake.admin("zpool create -m none tank /dev/sdc")
        fake.admin("zfs create %s" % name)
        return {"dataset": name}
    if source == "zpool":
        fake.admin("zpool create -m none %s /dev/sdc" % name)
        return {"zpool": name}
    return {"device": "/dev/sdb", "pool-name": name}


def sr_create(config, name="tank"):
    return call("SR.create", uuid=SR_UUID, configuration=config, name=name,
                description="")


SOURCES = ["pool-name", "zpool", "dataset"]


@pytest.mark.parametrize("source", SOURCES)
def test_one_character_too_long_is_refused_before_anything(fake, source):
    name = longest_parent(source) + "x"
    config = config_for(fake, source, name)
    before = len(fake.calls)
    with pytest.raises(errors.InvalidConfiguration) as info:
        sr_create(config)
    assert fake.mutations(since=before) == []
    message = info.value.message
    assert "too long by 1 character" in message
    assert "at most %d characters" % (len(name) - 1) in message


@pytest.mark.parametrize("source", SOURCES)
def test_at_the_limit_every_name_zfs_ng_makes_works(fake, source):
    """The SR, a VDI, its snapshot, a live clone (through the internal
    snapshot, the longest name), a clone of the snapshot, a CBT list to
    the live disk (its own snapshot) and a data_destroy (a bookmark)."""
    fake.user_value_cap = None
    config = config_for(fake, source, longest_parent(source))
    sr = call("SR.attach", configuration=sr_create(config))
    key = create_volume(sr)["key"]
    call("Volume.enable_cbt", sr=sr, key=key)
    snap = call("Volume.snapshot", sr=sr, key=key)["key"]
    call("Volume.clone", sr=sr, key=key)
    call("Volume.clone", sr=sr, key=snap)
    call("Volume.list_changed_blocks", sr=sr, key=snap, key2=key, offset=0,
         length=-1)
    call("Volume.data_destroy", sr=sr, key=snap)
    made = fake.pool(meta.pool_of(sr)).datasets
    assert max(len(n) for n in made) == namelimits.MAX_NAME   # the live clone's
    assert len(call("SR.ls", sr=sr)) == 4


def test_a_name_label_too_long_for_a_pool_name_falls_back(fake):
    label = "n" * (namelimits.room_for("") + 1)
    sr = call("SR.attach", configuration=sr_create({"device": "/dev/sdb"},
                                                   name=label))
    assert sr == FALLBACK
    assert call("SR.stat", sr=sr)["name"] == label


def test_the_longest_name_label_that_fits_names_the_pool(fake):
    label = "n" * namelimits.room_for("")
    sr = call("SR.attach", configuration=sr_create({"device": "/dev/sdb"},
                                                   name=label))
    assert sr == label
    key = create_volume(sr)["key"]
    call("Volume.clone", sr=sr, key=key)
