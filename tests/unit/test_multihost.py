"""Shared disks: pools zfs-ng creates carry multihost protection, which
needs this host's hostid; a pool another host holds is a typed refusal."""

import struct

import pytest

from zfsng import errors, hostid

from conftest import call, create_sr


def test_pools_are_created_with_multihost_protection(fake):
    create_sr()
    [argv] = fake.ran("zpool", "create")
    assert "multihost=on" in argv
    assert argv[argv.index("multihost=on") - 1] == "-o"


def test_no_hostid_refuses_before_touching_a_disk(fake, monkeypatch,
                                                   tmp_path):
    monkeypatch.setattr(hostid, "HOSTID_FILE", str(tmp_path / "absent"))
    with pytest.raises(errors.HostIdMissing) as info:
        create_sr()
    assert "zgenhostid" in info.value.message
    assert fake.mutations() == []


def test_a_zero_hostid_is_no_hostid(fake, monkeypatch, tmp_path):
    zero = tmp_path / "hostid"
    zero.write_bytes(b"\0\0\0\0")
    monkeypatch.setattr(hostid, "HOSTID_FILE", str(zero))
    with pytest.raises(errors.HostIdMissing):
        create_sr()


def test_hostid_is_read_as_zgenhostid_writes_it(tmp_path, monkeypatch):
    path = tmp_path / "hostid"
    path.write_bytes(struct.pack("=I", 0x00bc614e))
    monkeypatch.setattr(hostid, "HOSTID_FILE", str(path))
    monkeypatch.setattr(hostid, "SPL_PARAM", str(tmp_path / "none"))
    assert hostid.text() == "00bc614e"
    # the spl module parameter wins when it is set
    spl = tmp_path / "spl_hostid"
    spl.write_text("0\n")
    monkeypatch.setattr(hostid, "SPL_PARAM", str(spl))
    assert hostid.current() == 0x00bc614e
    spl.write_text("305419896\n")
    assert hostid.text() == "12345678"


def test_adopting_a_pool_needs_no_hostid(fake, monkeypatch, tmp_path):
    # zfs-ng never imports adopted pools: their protection is the admin's
    monkeypatch.setattr(hostid, "HOSTID_FILE", str(tmp_path / "absent"))
    fake.admin("zpool create -m none data /dev/sdc")
    call("SR.create", uuid="3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61",
         configuration={"zpool": "data"}, name="x", description="")


@pytest.mark.parametrize("message", [
    # OpenZFS's own words: multihost saw the other host's writes ...
    "cannot import 'tank': pool is imported on host 'xcp2' "
    "(hostid=1a2b3c4d).\nExport the pool on the other system, then run "
    "'zpool import'.",
    # (OpenZFS 2.1, importing by guid, says it this way)
    "cannot import 'shared': pool is imported on xcp2 (hostid: 0xa0a0a0a)"
    "\nExport the pool on the other system, then run 'zpool import'.",
    # ... or the labels name another host (no multihost)
    "cannot import 'tank': pool was previously in use from another "
    "system.\nLast accessed by xcp2 (hostid=1a2b3c4d) at Tue Nov 24 "
    "10:00:00 2026\nThe pool can be imported, use 'zpool import -f' to "
    "import the pool.",
])
def test_attach_of_a_pool_another_host_holds_is_typed(fake, message):
    sr, stored = create_sr()
    call("SR.detach", sr=sr)
    fake.inject("zpool import", message)
    with pytest.raises(errors.PoolImportedElsewhere) as info:
        call("SR.attach", configuration=stored)
    assert "another host" in info.value.message
    assert fake.imported() == []
    # and once the other host lets go, the same call attaches
    assert call("SR.attach", configuration=stored) == sr


def test_attach_never_forces_an_import(fake):
    sr, stored = create_sr()
    call("SR.detach", sr=sr)
    call("SR.attach", configuration=stored)
    [argv] = fake.ran("zpool", "import")
    assert "-f" not in argv




def test_diagnostics_show_the_hostid(fake, monkeypatch, tmp_path):
    assert "hostid ==\n5eed1d05" in call("Plugin.diagnostics")
    monkeypatch.setattr(hostid, "HOSTID_FILE", str(tmp_path / "absent"))
    assert "zgenhostid" in call("Plugin.diagnostics")


# --- cloned hosts: one hostid, two hosts -------------------------------------

def _held_by(fake, stored, host):
    """The SR's pool as another host left it imported (its labels)."""
    call("SR.detach", sr="tank")
    fake.pool("tank", state="EXPORTED").elsewhere = host


def test_a_pool_held_by_a_host_with_our_hostid_is_refused(fake):
    # Multihost cannot tell two hosts with one hostid apart, and the fake
    # imports such a pool as OpenZFS before 2.3.6 does: zfs-ng must not.
    sr, stored = create_sr()
    _held_by(fake, stored, (fake.hostid, "xcp-clone"))
    mark = len(fake.calls)
    with pytest.raises(errors.PoolImportedElsewhere) as info:
        call("SR.attach", configuration=stored)
    assert "xcp-clone" in info.value.message
    assert "zgenhostid" in info.value.message
    assert fake.mutations(since=mark) == []
    assert fake.imported() == []


def test_our_own_pool_after_a_crash_is_imported(fake):
    # Same hostid, same name: this host, before it crashed
    sr, stored = create_sr()
    _held_by(fake, stored, (fake.hostid, fake.hostname))
    assert call("SR.attach", configuration=stored) == sr


def test_a_pool_held_by_a_host_with_another_hostid_is_zfs_own_refusal(fake):
    sr, stored = create_sr()
    _held_by(fake, stored, (0x0b0b0b0b, "xcp2"))
    with pytest.raises(errors.PoolImportedElsewhere) as info:
        call("SR.attach", configuration=stored)
    assert "xcp2" in info.value.message
    assert fake.imported() == []
