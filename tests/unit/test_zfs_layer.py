"""zfsng.zfs and zfsng.runner against the fake: argv conventions, output
parsing, typed errors and the bounded retry on "busy"."""

import pytest

from zfsng import errors, meta, pools, runner, zfs

from conftest import create_sr

BUSY = "cannot destroy 'tank/v': dataset is busy\n"


@pytest.fixture
def pool(fake):
    fake.admin("zpool create -m none -O org.test:color=blue tank "
               "mirror /dev/sdb /dev/sdc log /dev/sdd cache /dev/sde")
    return "tank"


# --- runner ------------------------------------------------------------------

def test_runner_refuses_a_shell_string(fake):
    with pytest.raises(TypeError):
        runner.run("zpool list")
    with pytest.raises(TypeError):
        runner.run(["zpool", 1])
    assert fake.calls == []


def test_runner_reports_a_missing_program(monkeypatch):
    def missing(argv, stdin_text=None):
        raise OSError(2, "No such file or directory")
    runner.set_runner(missing)
    result = runner.run(["zfs", "version"])
    assert result.rc == 127 and "zfs" in result.err


def test_non_string_arguments_are_a_bug(fake):
    with pytest.raises(errors.InternalError):
        zfs.zfs("list", 3)
    assert fake.calls == []


# --- parsing -----------------------------------------------------------------

def test_parse_table():
    rows = zfs.parse_table("a\t-\t1\nb\t\t2\n\n", ["n", "v", "x"])
    assert rows == [{"n": "a", "v": None, "x": "1"},
                    {"n": "b", "v": "", "x": "2"}]
    with pytest.raises(errors.ZfsError):
        zfs.parse_table("a\tb\n", ["n"])


def test_user_properties_inherit_and_dash_is_none(fake, pool):
    fake.admin("zfs create tank/a")
    fake.admin("zfs create -s -V 1G tank/a/v")
    fake.admin("zfs snapshot tank/a/v@s")
    rows = zfs.list_datasets("tank", ["name", "org.test:color",
                                      "org.test:unset", "volsize"],
                             types="all")
    assert [r["name"] for r in rows] == ["tank", "tank/a", "tank/a/v",
                                         "tank/a/v@s"]
    assert all(r["org.test:color"] == "blue" for r in rows)
    assert all(r["org.test:unset"] is None for r in rows)
    assert [r["volsize"] for r in rows] == [None, None, str(2 ** 30),
                                            str(2 ** 30)]


def test_find_local_sees_only_local_values(fake, pool):
    fake.admin("zfs create tank/a")
    fake.admin("zfs create -o org.test:color=red tank/a/b")
    assert zfs.find_local("org.test:color") == [("tank", "blue"),
                                                ("tank/a/b", "red")]
    assert zfs.find_local("org.test:color", "tank") == [
        ("tank", "blue"), ("tank/a/b", "red")]
    assert zfs.find_local("org.test:none") == []


def test_get_one_and_exists(fake, pool):
    assert zfs.get_one("tank", ["name"])["name"] == "tank"
    assert zfs.exists("tank")
    assert not zfs.exists("tank/nope")
    assert not zfs.exists("nopool")
    with pytest.raises(errors.DatasetNotFound):
        zfs.get_one("tank/nope", ["name"])


def test_list_pools(fake, pool):
    [row] = pools.list_pools()
    assert row["name"] == "tank"
    assert row["health"] == "ONLINE"
    assert int(row["size"]) > int(row["free"]) > 0
    assert pools.pool_by_guid(row["guid"])["name"] == "tank"
    assert pools.pool_by_name("nope") is None


def test_pool_leaf_devices(fake, pool):
    assert pools.pool_leaf_devices("tank") == [
        "/dev/sdb1", "/dev/sdc1", "/dev/sdd1", "/dev/sde1"]


def test_pool_leaf_devices_finds_every_leaf_line(fake, pool):
    leaves = pools.pool_leaf_devices("tank")
    assert [line.split("\t")[0] for line in leaves] == [
        "/dev/sdb1", "/dev/sdc1", "/dev/sdd1", "/dev/sde1"]


def test_importable_pools(fake):
    assert pools.importable_pools() == []
    for name, disk in (("one", "/dev/sdb"), ("two", "/dev/sdc")):
        fake.admin("zpool create -m none %s %s" % (name, disk))
        fake.admin("zpool export %s" % name)
    found = pools.importable_pools()
    assert [(p["name"], p["state"]) for p in found] == [
        ("one", "ONLINE"), ("two", "ONLINE")]
    assert all(p["guid"].isdigit() for p in found)
    assert [p["name"] for p in pools.importable_pools(["/dev/sdc1"])] == \
        ["two"]


def test_version(fake):
    assert zfs.version() == "zfs-2.1.15-1"


# --- errors ------------------------------------------------------------------

def test_errors_are_typed(fake, pool):
    with pytest.raises(errors.DatasetNotFound) as info:
        zfs.destroy("tank/nope")
    assert "tank/nope" in info.value.message
    zfs.create_filesystem("tank/a", {})
    with pytest.raises(errors.DatasetExists):
        zfs.create_filesystem("tank/a", {})
    with pytest.raises(errors.PoolNotFound):
        pools.export_pool("nope")
    with pytest.raises(errors.OutOfSpace):
        zfs.create_volume("tank/big", 100 * 2 ** 30, {}, sparse=False)
    with pytest.raises(errors.ZfsError) as info:
        zfs.set_props("tank", {"compression": "brotli"})
    assert "zfs set failed (exit 1)" in info.value.message
    assert "compression" in info.value.message


def test_reservation_beyond_free_space_is_out_of_space(fake, pool):
    fake.admin("zfs create -V 1G tank/thick")
    with pytest.raises(errors.OutOfSpace):
        zfs.set_props("tank/thick", {"volsize": str(50 * 2 ** 30)})


def test_set_props_is_one_command_without_double_dash(fake, pool):
    zfs.set_props("tank", {"org.test:a": "1", "org.test:b": "x y\tz"})
    [argv] = fake.ran("zfs", "set")
    assert argv == ["zfs", "set", "org.test:a=1", "org.test:b=x y\tz",
                    "tank"]
    assert fake.get("tank", "org.test:b") == "x y\tz"
    zfs.set_props("tank", {})
    assert len(fake.ran("zfs", "set")) == 1
    with pytest.raises(errors.InternalError):
        zfs.set_props("-tank", {"org.test:a": "1"})


def test_destroy_refusals_reach_the_caller(fake, pool):
    fake.admin("zfs create -s -V 1G tank/v")
    fake.admin("zfs snapshot tank/v@s")
    with pytest.raises(errors.ZfsError) as info:
        zfs.destroy("tank/v")
    assert "has children" in info.value.message
    zfs.destroy("tank/v", recursive=True)
    assert not fake.exists("tank/v")


def test_busy_is_retried_a_bounded_number_of_times(fake, pool, monkeypatch):
    monkeypatch.setattr(zfs, "BUSY_DELAY", 0.0)
    fake.admin("zfs create -s -V 1G tank/v")
    fake.inject("zfs destroy", BUSY, times=2)
    zfs.destroy("tank/v")
    assert len(fake.ran("zfs", "destroy")) == 3
    assert not fake.exists("tank/v")


def test_busy_gives_up(fake, pool, monkeypatch):
    monkeypatch.setattr(zfs, "BUSY_DELAY", 0.0)
    fake.admin("zfs create -s -V 1G tank/v")
    fake.inject("zfs destroy", BUSY, times=-1)
    with pytest.raises(errors.DatasetBusy):
        zfs.destroy("tank/v")
    assert len(fake.ran("zfs", "destroy")) == zfs.BUSY_RETRIES
    assert fake.exists("tank/v")


def test_busy_without_retry(fake, pool):
    fake.inject("zfs version", "dataset is busy\n", times=-1)
    with pytest.raises(errors.DatasetBusy):
        zfs.version()
    assert len(fake.ran("zfs", "version")) == 1


def test_other_errors_are_not_retried(fake, pool, monkeypatch):
    monkeypatch.setattr(zfs, "BUSY_DELAY", 0.0)
    fake.inject("zfs destroy", "cannot destroy 'tank/v': permission "
                "denied\n", times=-1)
    with pytest.raises(errors.ZfsError):
        zfs.destroy("tank/v")
    assert len(fake.ran("zfs", "destroy")) == 1


def test_sr_props_are_set_at_creation(fake):
    """One zpool create carries every property: no window where the pool
    exists without its SR marks."""
    create_sr()
    [argv] = fake.ran("zpool", "create")
    props = [argv[i + 1] for i, a in enumerate(argv) if a == "-O"]
    assert any(p.startswith(meta.SR_UUID + "=") for p in props)
    assert fake.ran("zfs", "set") == []


@pytest.mark.parametrize("err", [
    # zpool's own check (OpenZFS 2.1, a pool without multihost)
    "cannot import '3734564193816588715': a pool with that name already "
    "exists\nuse the form 'zpool import <pool | id> <newpool>' to give it "
    "a new name\n",
    # the kernel's EEXIST (OpenZFS 2.1, a multihost pool, by guid)
    "cannot import 'twin': pool already exists\n",
    "cannot import '3734564193816588715' as 'zfsng-1': pool already exists\n"])
def test_an_import_whose_name_is_taken_is_a_name_collision(fake, err):
    fake.inject("zpool import", err)
    with pytest.raises(errors.PoolNameCollision):
        pools.import_pool("3734564193816588715")


def test_a_create_whose_name_is_taken_is_still_dataset_exists(fake, pool):
    fake.add_disk("/dev/sdf")
    with pytest.raises(errors.DatasetExists):
        pools.create_pool(pool, ["/dev/sdf"], {}, {})


def test_pool_leaves_pairs_paths_and_guids(fake):
    fake.add_disk("/dev/sdf")
    fake.admin("zpool create -m none p mirror /dev/sdb /dev/sdc log /dev/sdd"
               " cache /dev/sde spare /dev/sdf")
    pool = fake.pool("p")
    assert pools.pool_leaves("p") == [(leaf.path, leaf.guid)
                                    for leaf in pool.leaves()]


def test_a_suspended_pool_is_pool_suspended(fake, pool):
    # libzfs's EZFS_POOLUNAVAIL, as every command on a SUSPENDED pool says
    fake.inject("zfs snapshot", "cannot create snapshot 'tank/v@s': pool "
                "I/O is currently suspended\n")
    with pytest.raises(errors.PoolSuspended) as info:
        zfs.snapshot("tank/v@s")
    assert isinstance(info.value, errors.ZfsError)
    assert len(fake.ran("zfs", "snapshot")) == 1   # no retry: not busy


@pytest.mark.parametrize("text,found", [
    ("zfs-2.1.15-1\nzfs-kmod-2.1.15-1\n", (2, 1)),
    ("zfs-2.3.2-1\nzfs-kmod-2.2.0-rc1\n", (2, 2)),    # the module's
    ("zfs-2.3.2-1\n", (2, 3)),                       # no module line
    ("zfs-unknown\n", None)])
def test_kernel_version(fake, text, found):
    fake.version_text = text
    assert zfs.kernel_version() == found
