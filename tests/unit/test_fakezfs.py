"""The fake itself: the output layouts and error texts the plugin's parsers
rely on, and that unknown argv forms fail loudly."""

import pytest

import fakezfs
from fakezfs import CommandError


@pytest.fixture
def host():
    return fakezfs.FakeZfs.with_disks()


def run(host, command):
    return host(command.split())


def refusal(host, command):
    """The error text of an admin command that must fail (CommandError)."""
    with pytest.raises(CommandError) as info:
        host.admin(command)
    return info.value.err


def test_unknown_argv_raises_and_is_remembered(host):
    forms = (["zfs", "frobnicate"], ["zpool", "list", "-x"],
             ["mkfs.ext4", "/dev/sdb"], ["zfs", "list", "-o", "name"],
             ["lsblk", "/dev/sdb"],
             # forms zfs-ng never sends, taken out of the fake
             # (tests/integration/test_fakezfs_contract.py)
             ["lsblk", "-n", "-l", "-p", "-o", "NAME", "/dev/sdb"],
             ["zfs", "create", "-b", "8K", "-V", "1G", "--", "tank/v"],
             ["zfs", "get", "-Hp", "-d", "1", "-o", "name", "type", "tank"],
             ["zfs", "list", "-Hp", "-t", "all", "tank"],
             ["zfs", "get", "-Hp", "type", "tank"])
    for argv in forms:
        with pytest.raises(AssertionError) as info:
            host(argv)
        assert repr(argv) in str(info.value)
    assert len(host.unknown) == len(forms)
    assert len(host.calls) == len(forms)


def test_calls_are_recorded_and_mutations_picked_out(host):
    run(host, "zpool list -Hp -o name")
    run(host, "zpool create -m none -- tank /dev/sdb")
    run(host, "zpool import")
    run(host, "wipefs -a /dev/sdc")
    assert host.calls[0] == ["zpool", "list", "-Hp", "-o", "name"]
    assert host.mutations() == [
        ["zpool", "create", "-m", "none", "--", "tank", "/dev/sdb"],
        ["wipefs", "-a", "/dev/sdc"]]
    assert host.mutations(since=3) == [["wipefs", "-a", "/dev/sdc"]]


def test_zpool_list_verbose_vdev_lines_carry_statistics(host):
    host.admin("zpool create tank mirror /dev/sdb /dev/sdc log /dev/sdd")
    lines = host.admin("zpool list -v -H -P -o name -- tank").splitlines()
    assert lines[0] == "tank"
    assert lines[1].startswith("\tmirror-0\t")
    assert lines[2].startswith("\t/dev/sdb1\t-\t-\t")
    assert lines[2].endswith("\tONLINE")
    assert len(lines[2].split("\t")) == 11
    assert lines[4].startswith("logs ") and "\t" not in lines[4]
    assert lines[5].startswith("\t/dev/sdd1\t")


def test_whole_disks_are_partitioned(host):
    host.admin("zpool create tank /dev/sdb")
    out = host.admin("lsblk -n -p -P -o NAME,TYPE,MOUNTPOINT /dev/sdb")
    assert out.splitlines() == [
        'NAME="/dev/sdb" TYPE="disk" MOUNTPOINT=""',
        'NAME="/dev/sdb1" TYPE="part" MOUNTPOINT=""',
        'NAME="/dev/sdb9" TYPE="part" MOUNTPOINT=""']
    assert "PTTYPE=gpt" in host.admin("blkid -p -o export /dev/sdb")
    member = host.admin("blkid -p -o export /dev/sdb1")
    assert "TYPE=zfs_member" in member and "LABEL=tank" in member


def test_block_device_tools(host):
    result = run(host, "lsblk -n -p -P -o NAME,TYPE,MOUNTPOINT /dev/sdx")
    assert (result.rc, result.err) == (32, "lsblk: /dev/sdx: not a block "
                                           "device\n")
    result = run(host, "blkid -p -o export /dev/sdb")
    assert (result.rc, result.out, result.err) == (2, "", "\n")
    host.add_partition("/dev/sdb", 1, fs="ext4", mountpoint="/mnt")
    out = host.admin("lsblk -n -p -P -o NAME,TYPE,MOUNTPOINT /dev/sdb")
    assert out.splitlines() == [
        'NAME="/dev/sdb" TYPE="disk" MOUNTPOINT=""',
        'NAME="/dev/sdb1" TYPE="part" MOUNTPOINT="/mnt"']
    assert run(host, "wipefs -a /dev/sdb").rc == 1      # busy: mounted
    assert run(host, "udevadm settle --timeout=5").rc == 0


def test_zfs_list_errors(host):
    host.admin("zpool create -m none tank /dev/sdb")
    host.admin("zfs create -s -V 1G tank/v")
    result = run(host, "zfs list -Hp -o name -t all -- tank/nope")
    assert (result.rc, result.err) == (
        1, "cannot open 'tank/nope': dataset does not exist\n")
    result = run(host, "zfs list -Hp -o name -t filesystem -- tank/v")
    assert result.err == ("cannot open 'tank/v': operation not applicable "
                          "to datasets of this type\n")
    result = run(host, "zfs list -Hp -o name,bogus -t all -- tank")
    assert result.rc == 2 and "invalid property 'bogus'" in result.err


def test_zfs_list_inheritance_and_snapshots(host):
    host.admin("zpool create -m none -O com.x:p=root tank /dev/sdb")
    host.admin("zfs create -s -V 1G -o com.x:q=own tank/v")
    host.admin("zfs snapshot tank/v@s")
    out = host.admin("zfs list -Hp -o name,com.x:p,com.x:q,used,origin "
                     "-t all -r -- tank")
    assert out.splitlines() == [
        "tank\troot\t-\t%s\t-" % host.get("tank", "used"),
        "tank/v\troot\town\t%s\t-" % host.get("tank/v", "used"),
        "tank/v@s\troot\town\t0\t-"]
    out = host.admin("zfs list -Hp -o name -t snapshot -- tank/v")
    assert out == "tank/v@s\n"          # -t snapshot <ds>: its snapshots
    out = host.admin("zfs get -Hp -r -s local -t all -o name,value com.x:q")
    assert out == "tank/v\town\n"


def test_space_accounting(host):
    host.admin("zpool create -m none tank /dev/sdb")
    host.admin("zfs create -V 1G tank/thick")
    host.admin("zfs create -s -V 1G tank/thin")
    host.write("tank/thin", 10 * fakezfs.MiB)
    host.admin("zfs snapshot tank/thin@s")
    host.write("tank/thin", 0, overwrite=fakezfs.MiB)
    for name in ("tank", "tank/thick", "tank/thin"):
        used = int(host.get(name, "used"))
        parts = sum(int(host.get(name, p)) for p in (
            "usedds", "usedsnap", "usedrefreserv", "usedchild"))
        assert used == parts
    assert int(host.get("tank/thin@s", "used")) == fakezfs.MiB
    assert int(host.get("tank/thick", "refreservation")) > fakezfs.GiB
    assert int(host.get("tank/thin", "refreservation")) == 0


def test_zfs_set_is_the_2_1_one(host):
    host.admin("zpool create -m none tank /dev/sdb")
    result = run(host, "zfs set -- com.x:a=1 tank")
    assert result.rc == 2 and "invalid option '-'" in result.err
    host.admin("zfs set com.x:a=1 com.x:b=2 tank")
    assert host.get("tank", "com.x:b") == "2"
    result = run(host, "zfs set com.x:a=%s tank" % ("v" * 8192))
    assert "property value too long" in result.err
    result = run(host, "zfs set volblocksize=4096 tank")
    assert result.rc == 1


def test_destroy_refusals(host):
    host.admin("zpool create -m none tank /dev/sdb")
    host.admin("zfs create -s -V 1G tank/v")
    host.admin("zfs snapshot tank/v@s")
    host.admin("zfs clone tank/v@s tank/c")
    assert refusal(host, "zfs destroy tank/v").startswith(
        "cannot destroy 'tank/v': volume has children\nuse '-r'")
    assert "volume has dependent clones" in refusal(
        host, "zfs destroy -r tank/v")
    assert "snapshot has dependent clones" in refusal(
        host, "zfs destroy tank/v@s")
    assert "operation does not apply to pools" in refusal(
        host, "zfs destroy tank")
    assert "not applicable to datasets of this type" in refusal(
        host, "zfs destroy -d tank/v")
    host.admin("zfs destroy -d tank/v@s")          # deferred: has a clone
    assert host.get("tank/v@s", "defer_destroy") == "on"
    host.admin("zfs destroy tank/c")               # ... freed with it
    assert not host.exists("tank/v@s")


def test_zpool_create_refusals(host):
    assert refusal(host, "zpool create tank /dev/sdx") == (
        "cannot open '/dev/sdx': No such file or directory\n")
    host.add_disk("/dev/sdf", fs="ext4")
    assert "use '-f' to override" in refusal(host,
                                             "zpool create tank /dev/sdf")
    host.admin("zpool create data /dev/sdb")
    err = refusal(host, "zpool create -f tank /dev/sdb")
    assert "must be manually repaired" in err
    assert "/dev/sdb1 is part of active pool 'data'" in err
    assert refusal(host, "zpool create data /dev/sdc") == (
        "cannot create 'data': pool already exists\n")
    assert "mirror requires at least 2 devices" in refusal(
        host, "zpool create tank mirror /dev/sdc")


def test_import_listing(host):
    result = run(host, "zpool import")
    assert (result.rc, result.out, result.err) == (
        0, "", "no pools available to import\n")
    host.admin("zpool create tank /dev/sdb")
    host.admin("zpool export tank")
    out = host.admin("zpool import")
    assert out.startswith("   pool: tank\n     id: %s\n  state: ONLINE\n"
                          % host.pool("tank", state="EXPORTED").guid)
    result = run(host, "zpool import -o cachefile=none -- 12345")
    assert result.err == "cannot import '12345': no such pool available\n"


def test_status_shows_bad_leaves(host):
    host.admin("zpool create tank mirror /dev/sdb /dev/sdc /dev/sdd")
    host.offline("/dev/sdb1")
    host.fault("/dev/sdc1")
    host.lose("/dev/sdd1")
    text = host.admin("zpool status -P -- tank")
    assert " state: UNAVAIL" in text
    lines = [line.split() for line in text.splitlines()
             if line.startswith("\t ")]
    assert ["/dev/sdb1", "OFFLINE", "0", "0", "0"] in lines
    assert ["/dev/sdc1", "FAULTED", "3", "41", "0", "too", "many",
            "errors"] in lines
    assert [line for line in lines if line[-2:] == ["was", "/dev/sdd1"]]


# --- changed block tracking: bookmarks, zfs send, zdb -dddd -----------------

@pytest.fixture
def vol(host):
    host.admin("zpool create -m none tank /dev/sdb")
    host.admin("zfs create -s -V 64M -o volblocksize=16K -o volmode=none "
               "tank/v")
    return host


def send(host, base, target):
    from zfsng import sendstream
    return host.stream(["zfs", "send", "-L", "-e", "-c", "-i", base, target],
                       sendstream.writes_and_frees)


END = (1 << 64) - 1
K16 = 16 * 1024


def test_bookmarks_are_listed_and_outlive_their_snapshot(vol):
    vol.admin("zfs snapshot tank/v@a")
    vol.admin("zfs bookmark -- tank/v@a tank/v#a")
    out = vol.admin("zfs list -Hp -o name,type -t all -r tank")
    assert out.splitlines()[-2:] == ["tank/v@a\tsnapshot",
                                     "tank/v#a\tbookmark"]
    vol.admin("zfs destroy tank/v@a")
    assert vol.admin("zfs list -Hp -o name -t bookmark -r tank") == \
        "tank/v#a\n"
    assert vol.admin("zfs list -Hp -o name,createtxg,org.x:p -t all "
                     "tank/v#a").split("\t")[2] == "-\n"


def test_bookmark_refusals_are_zfs_own(vol):
    vol.admin("zfs snapshot tank/v@a")
    vol.admin("zfs bookmark tank/v@a tank/v#a")
    assert refusal(vol, "zfs bookmark tank/v@a tank/v#a") == \
        "cannot create bookmark 'tank/v#a': bookmark exists\n"
    result = vol(["zfs", "bookmark", "--", "tank/v@x", "tank/v#x"])
    assert result.rc == 2
    assert result.err.startswith("cannot open 'tank/v@x': dataset does not "
                                 "exist\nusage:")
    assert refusal(vol, "zfs destroy tank/v#x") == \
        "bookmark 'tank/v#x' does not exist.\n"
    assert "recursive is not supported with bookmark" in \
        refusal(vol, "zfs destroy -r tank/v#a")


def test_a_bookmark_never_blocks_and_goes_with_its_zvol(vol):
    vol.admin("zfs snapshot tank/v@a")
    vol.admin("zfs bookmark tank/v@a tank/v#a")
    vol.admin("zfs destroy tank/v@a")
    vol.admin("zfs destroy tank/v")
    assert not vol.exists("tank/v#a")
    vol.admin("zfs create -s -V 64M tank/w")
    vol.admin("zfs snapshot tank/w@a")
    vol.admin("zfs bookmark tank/w@a tank/w#a")
    vol.admin("zfs destroy -r tank/w")
    assert vol.admin("zfs list -Hp -o name -t all -r tank") == "tank\n"


def test_send_carries_the_blocks_born_since_the_base(vol):
    vol.guest_write("tank/v", 0, 2 * K16)
    vol.admin("zfs snapshot tank/v@a")
    vol.admin("zfs bookmark tank/v@a tank/v#a")
    vol.guest_write("tank/v", 4 * K16 + 1, 10)
    vol.guest_free("tank/v", 0, K16)
    vol.admin("zfs snapshot tank/v@b")
    for base in ("tank/v@a", "tank/v#a"):
        result, (writes, frees) = send(vol, base, "tank/v@b")
        assert result.rc == 0 and result.err == ""
        assert writes == [(4 * K16, 5 * K16)]
        # the freed block; never-written holes under the rewritten
        # indirect block (1024 blocks); the tail from the last block ever
        # written (maxblkid 4); the dnode's two other, empty pointers
        assert frees == [(0, K16), (2 * K16, 4 * K16), (5 * K16, END)]


def test_send_of_nothing_new_has_no_data_records(vol):
    vol.guest_write("tank/v", 0, K16)
    vol.admin("zfs snapshot tank/v@a")
    vol.admin("zfs snapshot tank/v@b")
    assert send(vol, "tank/v@a", "tank/v@b")[1] == ([], [])


def test_send_refusals_are_zfs_own(vol):
    vol.admin("zfs create -s -V 64M tank/w")
    for snap in ("tank/v@a", "tank/v@b", "tank/w@c"):
        vol.admin("zfs snapshot " + snap)
    cases = [
        ("tank/v@a", "tank/v@x", "cannot open 'tank/v@x': dataset does "
         "not exist\n"),
        ("tank/v@x", "tank/v@b", "cannot open 'tank/v@x': dataset does "
         "not exist\n"),
        ("tank/v@b", "tank/v@a", "warning: cannot send 'tank/v@a': not "
         "an earlier snapshot from the same fs\n"),
        ("tank/v@a", "tank/w@c", "warning: cannot send 'tank/w@c': not "
         "an earlier snapshot from the same fs\n"),
        ("tank/v#x", "tank/v@b", "warning: cannot send 'tank/v@b': "
         "incremental source (tank/v#x) does not exist\n"),
    ]
    for base, target, err in cases:
        result, value = send(vol, base, target)
        assert (result.rc, result.err, value) == (1, err, None)


def test_a_send_from_the_origin_of_a_clone_is_incremental(vol):
    vol.guest_write("tank/v", 0, K16)
    vol.admin("zfs snapshot tank/v@a")
    vol.admin("zfs clone tank/v@a tank/c")
    vol.guest_write("tank/c", K16, K16)
    vol.admin("zfs snapshot tank/c@b")
    assert send(vol, "tank/v@a", "tank/c@b")[1][0] == [(K16, 2 * K16)]


def test_send_is_only_read_as_a_stream(vol):
    vol.admin("zfs snapshot tank/v@a")
    vol.admin("zfs snapshot tank/v@b")
    with pytest.raises(AssertionError):
        vol(["zfs", "send", "-L", "-e", "-c", "-i", "tank/v@a", "tank/v@b"])
    vol.unknown[:] = []


def test_zdb_prints_the_maxblkid_of_a_snapshot(vol):
    vol.admin("zfs snapshot tank/v@empty")
    vol.guest_write("tank/v", 40 * K16, 1)
    vol.admin("zfs snapshot tank/v@a")
    argv = ["zdb", "-e", "-p", "/dev", "-dddd"]
    assert "\tdnode maxblkid: 0\n" in vol(argv + ["tank/v@empty", "1"]).out
    assert "\tdnode maxblkid: 40\n" in vol(argv + ["tank/v@a", "1"]).out
    missing = vol(argv + ["tank/v@x", "1"])
    assert missing.rc != 0 and "failed to hold dataset 'tank/v@x'" in \
        missing.err


def test_user_props_of_a_snapshot_can_be_inherited(vol):
    vol.admin("zfs snapshot -o org.x:map=1 tank/v@a")
    vol.admin("zfs inherit org.x:map tank/v@a")
    assert vol.local_props("tank/v@a") == {}
    assert vol.get("tank/v", "volmode") == "none"
