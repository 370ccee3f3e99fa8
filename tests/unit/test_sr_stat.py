"""SR.stat (space and health), SR.set_name and SR.set_description."""

import json

import pytest

from zfsng import errors, meta, values

import fakezfs
from conftest import SR_UUID, call, create_sr, create_volume

GiB, MiB = fakezfs.GiB, fakezfs.MiB


def space(sr):
    stat = call("SR.stat", sr=sr)
    return stat["free_space"], stat["total_space"]


# --- the record --------------------------------------------------------------

def test_stat_record(fake):
    sr, _ = create_sr(name="tank", description="VM disks")
    stat = call("SR.stat", sr=sr)
    assert stat["sr"] == "tank"
    assert stat["uuid"] == SR_UUID
    assert stat["name"] == "tank"
    assert stat["description"] == "VM disks"
    assert stat["datasources"] == [
        "xeno+shm:///zfs-ng-" + SR_UUID]     # test_srmetrics.py
    assert stat["clustered"] is False
    assert stat["health"] == ["Healthy", ""]


@pytest.mark.parametrize("sr", ["nosuchpool", "tank/nope", "tank;id", "-f",
                                "", "tank@snap", "tank/../x"])
def test_stat_of_an_unknown_sr(fake, sr):
    create_sr()
    with pytest.raises(errors.Sr_not_attached):
        call("SR.stat", sr=sr)


def test_stat_of_a_dataset_inside_an_sr(fake):
    create_sr()
    fake.admin("zfs create tank/plain")
    with pytest.raises(errors.Sr_not_attached):
        call("SR.stat", sr="tank/plain")   # inherits sr-uuid, not local


def test_stat_of_a_volume_name(fake):
    sr, _ = create_sr()
    volume = create_volume(sr)
    with pytest.raises(errors.Sr_not_attached):
        call("SR.stat", sr="%s/%s" % (sr, volume["key"]))


# --- space -------------------------------------------------------------------

def test_space_is_the_datasets_own(fake):
    sr, _ = create_sr()
    free, total = space(sr)
    used = int(fake.get(sr, "used"))
    available = int(fake.get(sr, "available"))
    assert free == available
    assert total == used + available
    pool_size = int(fake.admin("zpool list -Hp -o size").strip())
    assert free < total < pool_size   # slop space is not offered


def test_thick_volume_reserves_its_space(fake):
    sr, _ = create_sr({"device": "/dev/sdb", "provisioning": "thick"})
    free, total = space(sr)
    volume = create_volume(sr, size=GiB)
    reservation = int(fake.get("tank/" + volume["key"], "refreservation"))
    assert reservation >= GiB
    free2, total2 = space(sr)
    assert total2 == total
    assert free - free2 == reservation
    fake.write("tank/" + volume["key"], 512 * MiB)   # inside the reservation
    assert space(sr) == (free2, total2)


def test_thin_volume_takes_what_it_writes(fake):
    sr, _ = create_sr()
    free, total = space(sr)
    volume = create_volume(sr, size=4 * GiB)
    free2, total2 = space(sr)
    assert total2 == total
    assert 0 < free - free2 < MiB
    fake.write("tank/" + volume["key"], 100 * MiB)
    free3, total3 = space(sr)
    assert total3 == total
    assert free2 - free3 == 100 * MiB


def test_adopted_sr_space_follows_the_pool(fake):
    fake.admin("zpool create -m none data /dev/sdc")
    fake.admin("zfs create -s -V 1G data/other")
    sr, _ = create_sr({"zpool": "data"}, name="a")
    free, total = space(sr)
    assert free == int(fake.get("data", "available"))
    assert total == int(fake.get(sr, "used")) + free
    fake.write("data/other", 512 * MiB)        # the admin's data elsewhere
    free2, total2 = space(sr)
    assert free - free2 == 512 * MiB
    assert total - total2 == 512 * MiB


def test_mirror_and_raidz_space(fake):
    sr, _ = create_sr({"vdev": "raidz2 /dev/sdb /dev/sdc /dev/sdd /dev/sde"})
    free, total = space(sr)
    assert 18 * GiB < total < 20 * GiB


# --- health ------------------------------------------------------------------
#
# xapi (v24.29.0+) fails SR.scan with SR_UNHEALTHY for any health but
# Healthy: a pool that still serves every block must be Healthy, with its
# problem as the text; only a pool that cannot serve data is Unavailable.

def scan(sr):
    """SR.scan as xapi-storage-script's stat_with_retry does it: SR.stat,
    then SR.ls only if the SR is Healthy."""
    state, _ = call("SR.stat", sr=sr)["health"]
    if state != "Healthy":
        raise AssertionError("SR_UNHEALTHY: %s" % state)
    return call("SR.ls", sr=sr)


# A pool with one bad leaf that still serves every block: Healthy, and the
# text says what is wrong (what it must say, what it must not).
DAMAGED_BUT_SERVING = [
    pytest.param("mirror /dev/sdb /dev/sdc", "offline", "/dev/sdc1",
                 ["tank is DEGRADED", "/dev/sdc1 OFFLINE"], ["/dev/sdb1"],
                 id="names-the-offline-device"),
    pytest.param("raidz1 /dev/sdb /dev/sdc /dev/sdd", "fault", "/dev/sdd1",
                 ["/dev/sdd1 FAULTED", "persistent errors"], [],
                 id="names-the-faulted-device"),
    pytest.param("mirror /dev/sdb /dev/sdc", "lose", "/dev/sdc1",
                 ["DEGRADED", "/dev/sdc1"], [],
                 id="names-the-missing-device"),
    pytest.param("mirror /dev/sdb /dev/sdc log /dev/sdd", "offline",
                 "/dev/sdd1", ["DEGRADED", "/dev/sdd1"], [],
                 id="degraded-log-device"),
    pytest.param("mirror /dev/sdb /dev/sdc cache /dev/sdd", "fault",
                 "/dev/sdd1", ["tank is ONLINE", "/dev/sdd1 FAULTED"], [],
                 id="faulted-cache-device-leaves-the-pool-online"),
]


@pytest.mark.parametrize("vdev,damage,device,said,unsaid",
                         DAMAGED_BUT_SERVING)
def test_damaged_pool_that_serves_every_block_is_healthy_saying_why(
        fake, vdev, damage, device, said, unsaid):
    sr, _ = create_sr({"vdev": vdev})
    getattr(fake, damage)(device)
    state, reason = call("SR.stat", sr=sr)["health"]
    assert state == "Healthy"
    for text in said:
        assert text in reason
    for text in unsaid:
        assert text not in reason


def test_resilvering_pool_says_so(fake):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    fake.resilver("tank")
    state, reason = call("SR.stat", sr=sr)["health"]
    assert state == "Healthy"
    assert "tank is ONLINE" in reason and "resilvered" in reason
    fake.resilver("tank", running=False)
    assert call("SR.stat", sr=sr)["health"] == ["Healthy", ""]


def test_unusable_spare_is_no_problem(fake):
    # libzfs's status ignores spares: zpool status -x says healthy
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc spare /dev/sdd"})
    fake.offline("/dev/sdd1")
    assert call("SR.stat", sr=sr)["health"] == ["Healthy", ""]


def test_online_pool_asks_zpool_status_for_problems(fake):
    sr, _ = create_sr()
    mark = len(fake.calls)
    assert call("SR.stat", sr=sr)["health"] == ["Healthy", ""]
    assert fake.ran("zpool", "status", since=mark) == [
        ["zpool", "status", "-x", "-P", "--", "tank"]]


@pytest.mark.parametrize("damage", ["offline", "fault", "lose"])
def test_degraded_pool_can_be_scanned(fake, damage):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    volume = create_volume(sr)
    getattr(fake, damage)("/dev/sdc1")
    assert [v["key"] for v in scan(sr)] == [volume["key"]]


@pytest.mark.parametrize("health", ["FAULTED", "SUSPENDED", "UNAVAIL",
                                    "OFFLINE", "REMOVED", "SPLIT"])
def test_pool_that_cannot_serve_data_is_unavailable(fake, health):
    sr, _ = create_sr()
    fake.set_health("tank", health)
    state, reason = call("SR.stat", sr=sr)["health"]
    assert state == "Unavailable"
    assert "tank" in reason and health in reason
    with pytest.raises(AssertionError, match="SR_UNHEALTHY"):
        scan(sr)


def test_unavailable_pool_names_the_device(fake):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    fake.offline("/dev/sdb1")
    fake.offline("/dev/sdc1")
    state, reason = call("SR.stat", sr=sr)["health"]
    assert state == "Unavailable"
    assert "/dev/sdb1" in reason and "/dev/sdc1" in reason


def test_health_of_an_adopted_sr_is_its_pools(fake):
    fake.admin("zpool create -m none data mirror /dev/sdc /dev/sdd")
    sr, _ = create_sr({"zpool": "data"}, name="a")
    fake.offline("/dev/sdd1")
    state, reason = call("SR.stat", sr=sr)["health"]
    assert state == "Healthy" and "data is DEGRADED" in reason


# --- name and description ----------------------------------------------------

TEXTS = [
    "", "Plain", u"Donn\u00e9es \u2014 \u65e5\u672c\u8a9e \U0001F680",
    "tab\there", "new\nline", "\r\n", 'quote " and \\ backslash',
    "-starts-with-dash", "$(reboot); `id` | rm -rf /", "=", "a=b",
    "  spaces  ", "-", "null", '"quoted"', "x" * 1000,
]


@pytest.mark.parametrize("text", TEXTS)
def test_set_name_round_trips(fake, text):
    sr, _ = create_sr()
    assert call("SR.set_name", sr=sr, new_name=text) is None
    assert call("SR.stat", sr=sr)["name"] == text
    assert call("SR.stat", sr=sr)["description"] == ""


@pytest.mark.parametrize("text", TEXTS)
def test_set_description_round_trips(fake, text):
    sr, _ = create_sr(name="kept")
    assert call("SR.set_description", sr=sr, new_description=text) is None
    stat = call("SR.stat", sr=sr)
    assert (stat["name"], stat["description"]) == ("kept", text)


def test_names_are_stored_as_utf8_json(fake):
    """Control characters escaped (one line of zfs -H output), the rest
    as the characters themselves: zfs list shows the name."""
    sr, _ = create_sr()
    call("SR.set_name", sr=sr, new_name=u"a\tb\n\u00e9")
    [argv] = fake.ran("zfs", "set")
    assert argv == ["zfs", "set", meta.SR_NAME + u'="a\\tb\\n\u00e9"', "tank"]
    value = fake.local_props("tank")[meta.SR_NAME]
    assert json.loads(value) == u"a\tb\n\u00e9"


def test_set_name_on_an_adopted_sr(fake):
    fake.admin("zpool create -m none data /dev/sdc")
    sr, _ = create_sr({"zpool": "data"}, name="a")
    call("SR.set_name", sr=sr, new_name="renamed")
    assert call("SR.stat", sr=sr)["name"] == "renamed"
    assert meta.SR_NAME not in fake.local_props("data")


def test_set_name_too_large(fake):
    sr, _ = create_sr()
    mark = len(fake.calls)
    with pytest.raises(errors.MetadataTooLarge):
        call("SR.set_name", sr=sr, new_name=u"\u65e5" * 2800)  # 8.4 kB
    assert fake.mutations(since=mark) == []
    assert call("SR.stat", sr=sr)["name"] == "tank"


def test_largest_name_that_fits(fake):
    sr, _ = create_sr()
    name = "n" * (values.MAX_VALUE - 2)        # plus two quotes
    call("SR.set_name", sr=sr, new_name=name)
    assert call("SR.stat", sr=sr)["name"] == name


@pytest.mark.parametrize("method,arg", [("SR.set_name", "new_name"),
                                        ("SR.set_description",
                                         "new_description")])
def test_set_on_an_unknown_sr(fake, method, arg):
    create_sr()
    mark = len(fake.calls)
    with pytest.raises(errors.Sr_not_attached):
        call(method, sr="nosuchpool", **{arg: "x"})
    assert fake.mutations(since=mark) == []


def test_a_suspended_multihost_pool_says_to_reboot(fake):
    # zpool clear of a suspended multihost pool (every pool zfs-ng makes)
    # hung in the kernel on OpenZFS 2.3 (fault campaign, disk-loss): the
    # admin is told to reboot instead of what zpool status suggests
    sr, _ = create_sr()
    fake.set_health("tank", "SUSPENDED")
    state, reason = call("SR.stat", sr=sr)["health"]
    assert state == "Unavailable"
    assert "tank is SUSPENDED" in reason
    assert "multihost on" in reason and "reboot the host" in reason


def test_a_suspended_pool_without_multihost_says_nothing_of_reboots(fake):
    fake.admin("zpool create -m none data /dev/sdc")
    sr, _ = create_sr({"zpool": "data"}, name="a")
    fake.set_health("data", "SUSPENDED")
    state, reason = call("SR.stat", sr=sr)["health"]
    assert state == "Unavailable" and "data is SUSPENDED" in reason
    assert "reboot" not in reason
