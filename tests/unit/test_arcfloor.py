"""SR.attach warns the admin of an OpenZFS 2.1 host whose ARC floor is
under 256 MiB, where 2.1 can stop a zvol's reads for good: SMlog at every
attach, a XenAPI message once per SR per boot, nothing refused.

The messages go to conftest's recording fake ``xe``, started for real in
the background as on a host.
"""

import pytest

from zfsng import arc, lock
from zfsng_volume import arcfloor

from conftest import SR_UUID, SR_UUID2, arcstats_floor, call, create_sr

OPENZFS_21 = "zfs-2.1.15-1\nzfs-kmod-2.1.15-1\n"
OPENZFS_23 = "zfs-2.3.2-1\nzfs-kmod-2.3.2-1\n"


def test_a_low_floor_on_2_1_is_told_once_per_boot(fake, xe, capsys,
                                                   monkeypatch, tmp_path):
    arcstats_floor(64)
    sr, stored = create_sr()                # the create's attach
    err = capsys.readouterr().err
    assert "OpenZFS 2.1 with the ARC's floor at 64 MiB" in err
    assert "zfs_arc_min=268435456" in err and "warning:" in err
    [sent] = xe(1)
    assert sent["name"] == "ZFSNG_ARC_FLOOR_LOW"
    assert sent["priority"] == "3"
    assert sent["sr-uuid"] == SR_UUID
    assert "echo 268435456 > /sys/module/zfs/parameters/zfs_arc_min" \
        in sent["body"]

    call("SR.detach", sr=sr)                # a PBD unplug and plug
    assert call("SR.attach", configuration=stored) == sr
    assert "floor at 64 MiB" in capsys.readouterr().err   # SMlog again
    assert len(xe(1, wait=0.5)) == 1                      # no new message

    # a reboot empties /run: the next attach tells the admin again
    monkeypatch.setattr(lock, "RUN_DIR", str(tmp_path / "run-after-boot"))
    call("SR.attach", configuration=stored)
    assert len(xe(2)) == 2


def test_each_sr_gets_its_own_message(fake, xe):
    arcstats_floor(128)
    create_sr({"device": "/dev/sdb"})
    create_sr({"device": "/dev/sdc"}, uuid=SR_UUID2, name="other")
    assert sorted(m["sr-uuid"] for m in xe(2)) == sorted([SR_UUID, SR_UUID2])


@pytest.mark.parametrize("version,floor_mib", [
    (OPENZFS_21, 256), (OPENZFS_21, 1024), (OPENZFS_23, 64),
    ("zfs-2.1.15-1\nzfs-kmod-2.2.0-1\n", 64)])   # the module is what runs
def test_a_floor_high_enough_or_openzfs_2_2_says_nothing(
        fake, xe, capsys, version, floor_mib):
    fake.version_text = version
    arcstats_floor(floor_mib)
    since = len(fake.calls)
    sr, stored = create_sr()
    call("SR.attach", configuration=stored)
    assert "ARC's floor" not in capsys.readouterr().err
    assert xe(0, wait=0.3) == []
    if floor_mib >= 256:                    # one file read, no command
        attaches = fake.ran("zfs", "version", since=since)
        assert len(attaches) <= 1           # SR.create's own, if any


def test_an_unreadable_release_still_warns_and_attaches(fake, xe, capsys):
    arcstats_floor(64)
    fake.inject("zfs version", "zfs: module not ready", times=-1)
    sr, _ = create_sr({"device": "/dev/sdb", "volblocksize": "16K"})
    assert sr == "tank"
    err = capsys.readouterr().err
    assert "cannot tell the OpenZFS release" in err
    assert "an unknown release with the ARC's floor at 64 MiB" in err
    assert len(xe(1)) == 1


def test_without_arcstats_the_floor_is_unknown_and_told(fake, xe, capsys):
    assert arc.floor() is None
    create_sr()
    assert "the ARC's floor at unknown" in capsys.readouterr().err
    assert len(xe(1)) == 1


def test_a_mark_that_cannot_be_made_sends_nothing_and_fails_nothing(
        fake, xe, capsys, monkeypatch, tmp_path):
    arcstats_floor(64)
    blocker = tmp_path / "file"
    blocker.write_text("")
    run_file = lock.run_file
    monkeypatch.setattr(lock, "run_file", lambda name, suffix: str(
        blocker / name) if name.startswith("arcfloor-") else
        run_file(name, suffix))
    sr, _ = create_sr()
    assert sr == "tank"
    err = capsys.readouterr().err
    assert "cannot mark the ARC floor message sent" in err
    assert xe(0, wait=0.3) == []


def test_the_text_names_the_release_the_floor_and_both_ways_out():
    text = arcfloor.text((2, 1), 96 << 20)
    assert "OpenZFS 2.1 with the ARC's floor at 96 MiB" in text
    assert "256 MiB" in text and "zfs_arc_max" in text
    assert "options zfs zfs_arc_min=268435456" in text
    assert "2.2 and later" in text
