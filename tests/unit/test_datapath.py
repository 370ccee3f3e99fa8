"""The datapath plugin (datapath/zfsng_datapath) on a fake host.

One runner answers for the whole host: fakezfs for zfs/zpool/udevadm (with
``zfs rollback`` added here), faketapctl for tap-ctl and kill, a udev that
makes /dev/zvol links (under a temporary directory) for every zvol, and
zvol_id. Every method goes through ``wire.call``, so arguments and results
are checked against the v5 types. Calls are repeated to prove they are
idempotent; tapdisks are killed, minors freed and processes crashed between
commands to prove every call repairs what it finds.
"""

import errno
import json
import os
import stat as statmod
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "datapath"))
sys.path.append(os.path.join(TOP, "tests", "integration"))  # xapi_flows

from zfsng import attachstate, errors, meta, namelimits, runner, wire, \
    zvoldev  # noqa: E402

from zfsng_datapath import datapath, iostat, snapclone, state, \
    tapctl  # noqa: E402
from zfsng_datapath import main as dpmain  # noqa: E402
from zfsng_datapath import uri as urimod  # noqa: E402
from zfsng.errors import DeviceNotReady  # noqa: E402
from zfsng_datapath.errors import (NonpersistentResetBlocked,  # noqa: E402
                                   NotAttached, NotAVdi, TapdevHeld,
                                   TapdiskError, TapdiskUnavailable)

import fakezfs  # noqa: E402
import faketapctl  # noqa: E402
from conftest import (assert_argv_lists, call, create_sr,  # noqa: E402
                      create_volume, plain_keys)
from crashpoint import (CrashAfter, CrashAfterCommand,  # noqa: E402
                        CutInside, Killed, commands_run, installed)
from xapi_flows import domain_of  # noqa: E402

GiB, MiB = fakezfs.GiB, fakezfs.MiB
# What xapi sends (main.ml domain_of): a guest's domain id; for dom0 a VBD
# plugged into it, or an export/import/copy (a fresh uuid as the dp)
GUEST = domain_of("vbd/7/xvda", "7")
DOM0_VBD = domain_of("vbd/0/xvda", "0")
DOM0 = domain_of("3f0c5a6e-9d1b-4c2a-8e7f-5b6a4c3d2e1f", "0")
PROGRAMS = fakezfs.PROGRAMS + faketapctl.PROGRAMS + ("zvol_id",
                                                     fakezfs.PYTHON)


# --- the fake host ----------------------------------------------------------

class Zfs(fakezfs.FakeZfs):
    """fakezfs, as the datapath's tests have always named it."""


class Host(object):
    """The runner of a whole host: ZFS, udev's /dev/zvol, blktap."""

    def __init__(self, root):
        self.root = root
        self.dev = os.path.join(root, "dev")
        self.zvol_id = os.path.join(root, "zvol_id")
        os.makedirs(os.path.join(self.dev, "zvol"))
        with open(self.zvol_id, "w"):
            pass
        self.zfs = Zfs.with_disks()
        self.tap = faketapctl.FakeTapCtl()
        self.calls = []
        self.zd = {}              # zvol -> its /dev/zd<N>
        self.next_zd = 0
        self.udev = "sync"        # "sync", "lazy" (at settle) or "dead"
        self.missing_tap_ctl = False

    def stream(self, argv, consume, **bound):
        """zdb and zfs send, read as they come (a compose's zdb)."""
        self.calls.append(list(argv))
        return self.zfs.stream(argv, consume, **bound)

    def __call__(self, argv, stdin_text=None, **bound):
        self.calls.append(list(argv))
        if argv[0] in faketapctl.PROGRAMS:
            if self.missing_tap_ctl:
                return runner.Result(argv, 127, "", "%s: [Errno 2] No such "
                                     "file or directory" % argv[0])
            return self.tap(argv, stdin_text)
        if argv[0] == self.zvol_id:
            return self._zvol_id(argv)
        if argv[:3] == ["udevadm", "info", "--query=symlink"]:
            return self._udev_info(argv)
        result = self.zfs(argv, stdin_text, **bound)
        if self.udev == "sync" or (self.udev == "lazy" and
                                   argv[:2] == ["udevadm", "settle"]):
            self.sync_devices()
        return result

    def _zvol_id(self, argv):
        assert len(argv) == 2, argv
        for name, dev in self.zd.items():
            if dev == argv[1]:
                return runner.Result(argv, 0, name + "\n", "")
        return runner.Result(argv, 1, "", "Unable to open %s\n" % argv[1])

    def _udev_info(self, argv):
        """udev's record of a device's links (udevadm info -q symlink)."""
        assert len(argv) == 4 and argv[3].startswith("--name="), argv
        links = ["zvol/" + n for n, d in self.zd.items()
                 if d == argv[3][len("--name="):]]
        return runner.Result(argv, 0, " ".join(links) + "\n", "")

    def zvols(self):
        return set(name for pool in self.zfs.pools if pool.state == "ACTIVE"
                   for name, ds in pool.datasets.items()
                   if ds.kind == "volume")

    def sync_devices(self):
        """What udev does for zvols: a zd node and a /dev/zvol link each."""
        zvols = self.zvols()
        for name in sorted(set(self.zd) - zvols):
            os.unlink(self.zd.pop(name))
            os.unlink(self.link(name))
        for name in sorted(zvols - set(self.zd)):
            dev = os.path.join(self.dev, "zd%d" % self.next_zd)
            self.next_zd += 16
            with open(dev, "w"):
                pass
            self.zd[name] = dev
            link = self.link(name)
            if not os.path.isdir(os.path.dirname(link)):
                os.makedirs(os.path.dirname(link))
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(dev, link)

    def link(self, name):
        return os.path.join(self.dev, "zvol", name)

    def ran(self, *prefix):
        prefix = list(prefix)
        return [a for a in self.calls if a[:len(prefix)] == prefix]


def new_host(root, monkeypatch):
    """A Host under root (a directory that exists), with the plugins'
    device paths, timeouts, state directory and boot id pointed into it:
    nothing a test does reaches the machine's own."""
    h = Host(str(root / "host"))
    monkeypatch.setattr(zvoldev, "DEV_DIR", h.dev)
    monkeypatch.setattr(zvoldev, "DEV_ZVOL", os.path.join(h.dev, "zvol"))
    monkeypatch.setattr(zvoldev, "ZVOL_ID_PATHS", (h.zvol_id,))
    monkeypatch.setattr(zvoldev, "TIMEOUT", 0.3)
    monkeypatch.setattr(zvoldev, "POLL", 0.01)
    monkeypatch.setattr(attachstate, "RUN_DIR", str(root / "dpstate"))
    monkeypatch.setattr(iostat, "PHY_DIR", os.path.join(h.dev, "sm", "phy"))
    boot = root / "boot_id"
    boot.write_text("boot-1\n")
    monkeypatch.setattr(snapclone, "BOOT_ID_PATH", str(boot))
    h.boot_id = boot
    return h


@pytest.fixture
def host(tmp_path, monkeypatch):
    h = new_host(tmp_path, monkeypatch)
    old = runner.set_runner(h)
    yield h
    runner.set_runner(old)
    assert not h.zfs.unknown and not h.tap.unknown
    assert_argv_lists(h.calls, PROGRAMS + (h.zvol_id,))


def dp(method, **args):
    """A datapath method, as xapi-storage-script reaches it (checked)."""
    args.setdefault("dbg", "unit-test")
    return wire.call(method, args, dpmain.handlers())


@pytest.fixture
def vdi(host):
    """An SR with one 1 GiB VDI: (sr, volume)."""
    sr, _ = create_sr({"device": "/dev/sdb"})
    return sr, create_volume(sr, size=GiB, name="disk")


@pytest.fixture
def snap_vdi(vdi):
    """The vdi fixture's SR and VDI, and a snapshot VDI of it: (sr, vol,
    snap)."""
    sr, vol = vdi
    return sr, vol, snapshot_of(sr, vol)


def uri_of(vol):
    return vol["uri"][0]


def dataset_of(vol):
    return uri_of(vol)[len("zfs-ng:///"):]


def snapshot_of(sr, vol):
    return call("Volume.snapshot", sr=sr, key=vol["key"])


def ro_clone(sr, snap):
    """The read-only clone a snapshot VDI is attached through, by the
    name the datapath must give it: <sr>/<key>.ro, beside the VDIs."""
    return "%s/%s.ro" % (sr, snap["key"])


def nothing_left(host):
    """No tapdisk, no minor, no datapath clone, no state file."""
    assert host.tap.tapdisks == {}, host.tap.tapdisks
    assert host.tap.minors == set(), host.tap.minors
    assert [z for z in host.zvols() if z.endswith(meta.CLONE_SUFFIX)] \
        == []
    assert state.all_states() == []


def full_cycle(uri, domain, readonly=False, twice=False):
    """attach, activate, deactivate, detach; each twice if asked."""
    n = 2 if twice else 1
    for _ in range(n):
        result = dp("Datapath.attach", uri=uri, domain=domain)
    for _ in range(n):
        dp("Datapath.activate_readonly" if readonly else "Datapath.activate",
           uri=uri, domain=domain)
    for _ in range(n):
        dp("Datapath.deactivate", uri=uri, domain=domain)
    for _ in range(n):
        dp("Datapath.detach", uri=uri, domain=domain)
    return result


# --- the plugin --------------------------------------------------------------

def test_query_declares_the_datapath_and_nonpersistent():
    q = dp("Plugin.Query")
    assert q["plugin"] == "zfs-ng"
    assert "NONPERSISTENT" in q["features"]
    assert q["required_api_version"] == "5.0"


def test_the_scheme_is_the_volume_plugins_and_no_xcp_ng_datapath():
    assert urimod.SCHEME == meta.URI_SCHEME == "zfs-ng"
    assert urimod.SCHEME not in ("tapdisk", "qdisk", "file", "raw",
                                 "loop+blkback", "nbd")
    # The tree holds the entry script; make install links the methods.
    assert os.listdir(os.path.join(TOP, "plugins/datapath/zfs-ng")) == [
        "datapath.py"]
    assert sorted(wire.SERVED["zfsng_datapath"]) == sorted(["Plugin.Query"] + [
        m for m in wire.methods_of(wire.DATAPATH_INTERFACES)
        if m.startswith(("Datapath.", "Data."))])


@pytest.mark.parametrize("bad", [
    "tapdisk:///tank/3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61",
    "zfs-ng://tank/3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61",
    "zfs-ng:///tank",
    "zfs-ng:///tank/notauuid",
    "zfs-ng:///tank/../3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61",
    "zfs-ng:///-o/3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61",
    "zfs-ng:///tank/3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61@zfsng-nonpersistent",
    "zfs-ng:///tank/3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61@a@b",
    "zfs-ng:///tank/x y/3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61",
])
def test_bad_uris_are_refused_before_any_command(host, bad):
    for method, extra in (("Datapath.attach", {"domain": GUEST}),
                          ("Datapath.open", {"persistent": False}),
                          ("Datapath.detach", {"domain": DOM0})):
        with pytest.raises(errors.InvalidArgument):
            dp(method, uri=bad, **extra)
    assert host.calls == []


@pytest.mark.parametrize("domain", ["", "7;rm", "../x", "u0_a/b", "x" * 200])
def test_bad_domains_are_refused(host, domain):
    with pytest.raises(errors.InvalidArgument):
        dp("Datapath.attach",
           uri="zfs-ng:///tank/3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61",
           domain=domain)
    assert host.calls == []


def test_uri_parsing():
    t = urimod.parse("zfs-ng:///tank/zfsng-3f1d0c1e-7a52-4e3b-9c55-"
                     "0a9e1d2b7c61/b7e4a9d2-1c3f-4d5e-8f60-718293a4b5c6"
                     "@3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61")
    assert t.sr == "tank/zfsng-3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61"
    assert t.head == t.sr + "/b7e4a9d2-1c3f-4d5e-8f60-718293a4b5c6"
    assert t.snapshot == "3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61"



def test_domains_as_xapi_sends_them():
    """domain_of's real strings; "0" was dom0 before xen-api v24.40.0."""
    assert (GUEST, DOM0_VBD, DOM0) == (
        "7", "u0_vbd_0_xvda", "u0_3f0c5a6e_9d1b_4c2a_8e7f_5b6a4c3d2e1f")
    for domain in (DOM0_VBD, DOM0, "0"):
        assert urimod.is_dom0(urimod.check_domain(domain)), domain
    for domain in (GUEST, "12", "u0-x"):   # "u0-" never reaches a plugin
        assert not urimod.is_dom0(urimod.check_domain(domain)), domain


def test_state_file_names_are_unambiguous(tmp_path, monkeypatch):
    monkeypatch.setattr(attachstate, "RUN_DIR", str(tmp_path))
    assert state.path("a.b", "c") != state.path("a", "b.c")
    assert "/" not in os.path.basename(state.path("p/q@r", DOM0))
    # the names running hosts already have: an upgrade must find them
    assert os.path.basename(state.path("tank/v-1@s_2", "u0_vbd")) == \
        "tank%2Fv-1%40s_2.u0_vbd.json"


def test_state_files_of_the_longest_names_zfs_allows(tmp_path, monkeypatch):
    """A snapshot VDI's name may be 255 characters (ZFS's limit, the SR
    checked at SR.create), each '/' escaped to three: its state file is
    still a file name the file system takes, one per (dataset, domain)."""
    monkeypatch.setattr(attachstate, "RUN_DIR", str(tmp_path))
    sr = "p" * (namelimits.room_for("p") + 1)
    longest = namelimits.longest_name(sr)
    assert len(longest) == namelimits.MAX_NAME
    snapshot = "%s/%s@%s" % (sr, "a" * 36, "b" * 36)
    paths = set()
    for dataset in (longest, snapshot, snapshot[:-1] + "c"):
        for domain in (DOM0, DOM0_VBD, GUEST):
            st = {"uri": "zfs-ng:///" + dataset, "dataset": dataset,
                  "domain": domain}
            state.save(st)
            assert state.load(dataset, domain) == st
            paths.add(state.path(dataset, domain))
    assert len(paths) == 9
    assert all(len(os.path.basename(p)) <= 255 for p in paths)


# --- dom0 --------------------------------------------------------------------

@pytest.mark.parametrize("domain", [DOM0_VBD, DOM0, "0"])
def test_dom0_gets_the_zvol_itself_and_no_tapdisk(host, vdi, domain):
    """Every form xapi sends for dom0, on a host without blktap at all."""
    sr, vol = vdi
    host.missing_tap_ctl = True
    snap = snapshot_of(sr, vol)
    for v, device in ((vol, dataset_of(vol)),
                      (snap, ro_clone(sr, snap))):
        result = dp("Datapath.attach", uri=uri_of(v), domain=domain)
        assert result == {"implementations": [
            ["BlockDevice", {"path": host.link(device)}]]}
        dp("Datapath.activate", uri=uri_of(v), domain=domain)
        dp("Datapath.deactivate", uri=uri_of(v), domain=domain)
        dp("Datapath.detach", uri=uri_of(v), domain=domain)
    assert host.ran("tap-ctl") == []
    nothing_left(host)


def test_a_dom0_tapdisk_an_older_zfs_ng_made_is_released(host, vdi,
                                                         monkeypatch):
    """Before this fix u0_ domains got a tapdisk: after an upgrade, their
    deactivate and detach still close and free it."""
    sr, vol = vdi
    with monkeypatch.context() as m:
        m.setattr(urimod, "is_dom0", lambda domain: False)
        dp("Datapath.attach", uri=uri_of(vol), domain=DOM0)
        dp("Datapath.activate", uri=uri_of(vol), domain=DOM0)
    assert len(host.tap.vbds()) == 1
    dp("Datapath.deactivate", uri=uri_of(vol), domain=DOM0)
    dp("Datapath.detach", uri=uri_of(vol), domain=DOM0)
    nothing_left(host)


def test_dom0_every_call_twice(host, vdi):
    sr, vol = vdi
    result = full_cycle(uri_of(vol), DOM0, twice=True)
    assert result["implementations"][0][1]["path"] == \
        host.link(dataset_of(vol))
    nothing_left(host)


def test_the_device_is_checked_with_zvol_id(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=DOM0)
    assert host.ran(host.zvol_id) == [[host.zvol_id,
                                       host.zd[dataset_of(vol)]]]


# --- a guest: tapdisk --------------------------------------------------------

@pytest.mark.parametrize("persistent", [True, False])
def test_xenopsd_puts_tapdisks_device_into_the_vbd(host, snap_vdi,
                                                  persistent):
    """xenopsd writes a VBD's params from the answer's first BlockDevice
    (or File), not from the XenDisk (xenops_server_xen.ml
    params_of_backend), and tapback serves the device at params: for a
    guest it must be tapdisk's, for a VDI, a snapshot (its read-only
    clone) and a reset-on-boot disk alike."""
    sr, vol, snap = snap_vdi
    dp("Datapath.open", uri=uri_of(vol), persistent=persistent)
    for v, domain in ((vol, GUEST), (snap, "7")):
        got = dp("Datapath.attach", uri=uri_of(v), domain=domain)
        params = [i[1]["path"] for i in got["implementations"]
                  if i[0] in ("BlockDevice", "File")][0]
        (xendisk,) = [i[1] for i in got["implementations"]
                      if i[0] == "XenDisk"]
        assert params == xendisk["params"]
        assert params.startswith("/dev/xen/blktap-2/tapdev")


def test_guest_attach_spawns_allocates_attaches(host, vdi):
    sr, vol = vdi
    result = dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    (pid,) = host.tap.tapdisks
    assert result == {"implementations": [
        ["XenDisk", {"params": "/dev/xen/blktap-2/tapdev0",
                     "extra": {"vdi-uuid": vol["key"]},
                     "backend_type": "vbd3"}],
        ["BlockDevice", {"path": "/dev/xen/blktap-2/tapdev0"}],
        ["Nbd", {"uri": "nbd:unix:/var/run/blktap-control/nbd%d.0:"
                        "exportname=%s" % (pid, vol["key"])}]]}
    assert [a[1] for a in host.ran("tap-ctl") if a[1] != "list"] == \
        ["spawn", "allocate", "attach"]
    assert host.ran("tap-ctl", "attach") == [
        ["tap-ctl", "attach", "-p", str(pid), "-m", "0"]]
    assert host.tap.vbds() == [(pid, 0, None, False)]


def test_guest_activate_opens_the_zvol_raw_with_o_direct(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    (pid,) = host.tap.tapdisks
    path = host.link(dataset_of(vol))
    assert host.ran("tap-ctl", "open") == [
        ["tap-ctl", "open", "-p", str(pid), "-m", "0", "-a", "aio:" + path]]
    assert host.tap.vbds() == [(pid, 0, "aio:" + path, False)]


def test_activate_readonly_opens_with_R(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate_readonly", uri=uri_of(vol), domain=GUEST)
    assert host.ran("tap-ctl", "open")[0][-1] == "-R"
    assert host.tap.vbds()[0][3] is True


def test_guest_full_cycle_leaves_nothing(host, vdi):
    sr, vol = vdi
    full_cycle(uri_of(vol), GUEST)
    nothing_left(host)
    assert [a[1] for a in host.ran("tap-ctl") if a[1] != "list"] == \
        ["spawn", "allocate", "attach", "open", "close", "detach", "free"]


def test_guest_every_call_twice_in_a_row(host, vdi):
    sr, vol = vdi
    result = full_cycle(uri_of(vol), GUEST, twice=True)
    assert result["implementations"][0][1]["params"] == \
        "/dev/xen/blktap-2/tapdev0"
    nothing_left(host)
    # the repeats ran no second spawn, allocate, attach, open, close...
    assert [a[1] for a in host.ran("tap-ctl") if a[1] != "list"] == \
        ["spawn", "allocate", "attach", "open", "close", "detach", "free"]


def test_two_guests_get_two_tapdisks(host, vdi):
    sr, vol = vdi
    a = dp("Datapath.attach", uri=uri_of(vol), domain="3")
    b = dp("Datapath.attach", uri=uri_of(vol), domain="4")
    assert a["implementations"][0][1]["params"] != \
        b["implementations"][0][1]["params"]
    assert len(host.tap.tapdisks) == 2
    dp("Datapath.detach", uri=uri_of(vol), domain="3")
    assert len(host.tap.tapdisks) == 1
    dp("Datapath.detach", uri=uri_of(vol), domain="4")
    nothing_left(host)


def test_activate_before_attach_is_a_typed_error(host, vdi):
    sr, vol = vdi
    with pytest.raises(NotAttached):
        dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    assert host.ran("tap-ctl") == []


def test_deactivate_and_detach_of_nothing_are_no_ops(host, vdi):
    sr, vol = vdi
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    assert host.ran("tap-ctl") == []


def test_detach_of_an_active_disk_closes_first(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    nothing_left(host)


def test_attach_of_a_missing_volume(host, vdi):
    sr, vol = vdi
    gone = uri_of(vol)[:-36] + "b7e4a9d2-1c3f-4d5e-8f60-718293a4b5c6"
    with pytest.raises(errors.Volume_does_not_exist):
        dp("Datapath.attach", uri=gone, domain=GUEST)
    nothing_left(host)


def test_switching_read_only_to_read_write_reopens(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate_readonly", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    assert host.tap.vbds()[0][3] is False
    assert len(host.ran("tap-ctl", "close")) == 1


# --- reality wins over the state file ----------------------------------------

def test_tapdisk_died_after_activate(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    (pid,) = host.tap.tapdisks
    host.tap.kill_tapdisk(pid)
    # a repeated attach and activate bring a new tapdisk on the same minor
    result = dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    assert result["implementations"][0][1]["params"] == \
        "/dev/xen/blktap-2/tapdev0"
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    (new,) = host.tap.tapdisks
    assert new != pid
    assert host.tap.vbds() == [
        (new, 0, "aio:" + host.link(dataset_of(vol)), False)]
    full_cycle(uri_of(vol), GUEST)
    nothing_left(host)


class HeldDevices(object):
    """The kernel's side of blktap's dead-tapdisk devices: a tapdev listed
    in ``held`` still has its block device; ``release_after`` looks later
    it is gone (the driver's destroy retry ran)."""

    def __init__(self):
        self.held, self.looks, self.release_after = set(), 0, None

    def __call__(self, tapdev):
        self.looks += 1
        if self.release_after is not None and \
                self.looks > self.release_after:
            self.held.clear()
        return tapdev in self.held


@pytest.fixture
def devices(monkeypatch):
    held = HeldDevices()
    monkeypatch.setattr(tapctl, "device_present", held)
    monkeypatch.setattr(tapctl, "RELEASE_TIMEOUT", 0.3)
    monkeypatch.setattr(tapctl, "RELEASE_POLL", 0.01)
    return held


def test_a_dead_tapdisks_device_still_held_is_not_taken_over(host, vdi,
                                                             devices):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    (pid,) = host.tap.tapdisks
    host.tap.kill_tapdisk(pid)
    devices.held.add("/dev/xen/blktap-2/tapdev0")    # blkback holds it
    for _ in range(2):
        with pytest.raises(TapdevHeld) as err:
            dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
        assert "tapdev0" in str(err.value) and "Unplug" in str(err.value)
        assert host.tap.tapdisks == {}     # no tapdisk spawned on it
        assert host.tap.minors == {0}
    devices.held.clear()                   # the VBD was unplugged
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    (new,) = host.tap.tapdisks
    assert host.tap.vbds() == [
        (new, 0, "aio:" + host.link(dataset_of(vol)), False)]
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    nothing_left(host)


def test_a_dead_tapdisks_device_released_meanwhile_is_waited_for(
        host, vdi, devices):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    host.tap.kill_tapdisk(list(host.tap.tapdisks)[0])
    devices.held.add("/dev/xen/blktap-2/tapdev0")
    devices.release_after = 3              # gone on the fourth look
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    assert devices.looks == 4
    assert len(host.tap.vbds()) == 1 and host.tap.vbds()[0][1] == 0
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    nothing_left(host)


def test_a_fresh_minor_is_never_waited_for(host, vdi, devices):
    sr, vol = vdi
    devices.held.add("/dev/xen/blktap-2/tapdev0")
    full_cycle(uri_of(vol), GUEST)         # allocated now: nothing to wait
    assert devices.looks == 0
    nothing_left(host)


def test_device_present_reads_the_kernels_block_devices(tmp_path,
                                                        monkeypatch):
    monkeypatch.setattr(tapctl, "SYS_DEV_BLOCK", str(tmp_path))
    assert not tapctl.device_present(str(tmp_path / "missing"))
    plain = tmp_path / "file"
    plain.write_text("")
    assert not tapctl.device_present(str(plain))   # not a block device
    null = os.stat("/dev/null")                    # a character device
    (tmp_path / ("%d:%d" % (os.major(null.st_rdev),
                            os.minor(null.st_rdev)))).mkdir()
    assert not tapctl.device_present("/dev/null")
    node = str(tmp_path / "tapdev7")
    try:
        os.mknod(node, statmod.S_IFBLK | 0o600, os.makedev(253, 7))
    except PermissionError:
        pytest.skip("making a block device node needs root")
    assert not tapctl.device_present(node)         # no such disk
    (tmp_path / "253:7").mkdir()                   # the kernel has it
    assert tapctl.device_present(node)


def test_tapdisk_died_between_attach_and_activate(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    host.tap.kill_tapdisk(list(host.tap.tapdisks)[0])
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    assert len(host.tap.vbds()) == 1 and host.tap.vbds()[0][2]
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    nothing_left(host)


def test_deactivate_and_detach_after_the_tapdisk_died(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    host.tap.kill_tapdisk(list(host.tap.tapdisks)[0])
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    nothing_left(host)   # the orphan minor was freed


def test_minor_freed_behind_our_back(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    pid = list(host.tap.tapdisks)[0]
    host.tap.kill_tapdisk(pid)
    host.tap.minors.clear()
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    assert len(host.tap.vbds()) == 1
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    nothing_left(host)


def test_after_a_host_reboot(host, vdi, tmp_path):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    host.tap.reboot()
    for name in os.listdir(attachstate.RUN_DIR):  # a tmpfs: empty again
        os.unlink(os.path.join(attachstate.RUN_DIR, name))
    host.boot_id.write_text("boot-2\n")
    full_cycle(uri_of(vol), GUEST, twice=True)
    nothing_left(host)


def test_stale_state_after_reboot_is_not_trusted(host, vdi):
    """A state file that survived (not a tmpfs) names a pid and minor that
    no longer exist: attach makes new ones."""
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    host.tap.reboot()
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    assert len(host.tap.vbds()) == 1
    full_cycle(uri_of(vol), GUEST)
    nothing_left(host)


def test_a_foreign_tapdisk_with_our_old_pid_is_left_alone(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    st = state.load(dataset_of(vol), GUEST)
    host.tap.kill_tapdisk(st["pid"])
    host.tap.minors.discard(st["minor"])
    # another user's tapdisk now has that pid and serves minor 5
    host.tap.tapdisks[st["pid"]] = {5: {"args": "aio:/x", "readonly": False}}
    host.tap.minors.add(5)
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    assert host.tap.tapdisks[st["pid"]] == {5: {"args": "aio:/x",
                                                "readonly": False}}
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    assert host.tap.vbds() == [(st["pid"], 5, "aio:/x", False)]
    assert host.tap.minors == {5}


# --- failures leave nothing --------------------------------------------------

def test_without_tap_ctl_a_guest_is_refused_and_dom0_works(host, vdi):
    sr, vol = vdi
    host.missing_tap_ctl = True
    snap = snapshot_of(sr, vol)
    for v in (vol, snap):
        with pytest.raises(TapdiskUnavailable) as exc:
            dp("Datapath.attach", uri=uri_of(v), domain=GUEST)
        assert "blktap" in exc.value.message
        nothing_left(host)
    full_cycle(uri_of(snap), DOM0)
    full_cycle(uri_of(vol), DOM0)
    nothing_left(host)


@pytest.mark.parametrize("step", ["spawn", "allocate", "attach"])
def test_a_refused_first_attach_leaves_nothing(host, vdi, step):
    sr, vol = vdi
    host.tap.inject("tap-ctl " + step, errno.EBUSY)
    with pytest.raises(TapdiskError) as exc:
        dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    assert "EBUSY" in exc.value.message
    nothing_left(host)
    full_cycle(uri_of(vol), GUEST)
    nothing_left(host)


def test_a_refused_open_keeps_the_attach_for_a_retry(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    host.tap.inject("tap-ctl open", errno.EIO)
    with pytest.raises(TapdiskError):
        dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    assert host.tap.vbds()[0][2] is not None
    full_cycle(uri_of(vol), GUEST)
    nothing_left(host)


def test_detach_never_fails_and_a_later_detach_finishes(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    host.tap.inject("tap-ctl close", errno.EBUSY)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)   # no error
    assert host.tap.vbds() != []
    assert state.load(dataset_of(vol), GUEST)["detaching"] is True
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    nothing_left(host)


def test_transient_list_and_spawn_failures_are_retried(host, vdi,
                                                       monkeypatch):
    monkeypatch.setattr(tapctl, "RETRY_DELAY", 0)
    sr, vol = vdi
    host.tap.inject("tap-ctl list", errno.EPROTO, times=2)
    host.tap.inject("tap-ctl spawn", 1, times=1)
    full_cycle(uri_of(vol), GUEST)
    nothing_left(host)
    assert len(host.ran("tap-ctl", "spawn")) == 2


def test_detach_survives_a_failing_list(host, vdi, monkeypatch):
    monkeypatch.setattr(tapctl, "RETRY_DELAY", 0)
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    host.tap.inject("tap-ctl list", errno.EPROTO, times=-1)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)   # no error
    assert state.load(dataset_of(vol), GUEST)["detaching"] is True
    host.tap.injected = []
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    nothing_left(host)


# --- the device node ---------------------------------------------------------

def test_waits_for_udev(host, vdi):
    sr, vol = vdi
    for name in list(host.zd):          # links not made yet
        os.unlink(host.zd.pop(name))
        os.unlink(host.link(name))
    host.udev = "lazy"                  # they appear when udev settles
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    assert host.ran("udevadm", "settle")
    assert os.path.exists(host.link(dataset_of(vol)))


def test_no_device_is_a_typed_error_and_leaves_nothing(host, snap_vdi):
    sr, vol, snap = snap_vdi
    host.udev = "dead"
    for name in list(host.zd):
        os.unlink(host.zd.pop(name))
        os.unlink(host.link(name))
    for v in (vol, snap):
        with pytest.raises(DeviceNotReady) as exc:
            dp("Datapath.attach", uri=uri_of(v), domain=GUEST)
        assert "udev" in exc.value.message
        nothing_left(host)


def test_a_link_to_another_zvol_is_refused(host, vdi):
    sr, vol = vdi
    other = create_volume(sr, size=GiB, name="other")
    mine = host.link(dataset_of(vol))
    os.unlink(mine)
    os.symlink(host.zd[dataset_of(other)], mine)   # stale link
    host.udev = "dead"
    with pytest.raises(DeviceNotReady) as exc:
        dp("Datapath.attach", uri=uri_of(vol), domain=DOM0)
    assert "belongs to %r" % dataset_of(other) in exc.value.message
    nothing_left(host)


def test_a_link_to_something_else_is_refused(host, vdi, tmp_path):
    sr, vol = vdi
    mine = host.link(dataset_of(vol))
    os.unlink(mine)
    os.symlink(str(tmp_path), mine)
    host.udev = "dead"
    with pytest.raises(DeviceNotReady) as exc:
        dp("Datapath.attach", uri=uri_of(vol), domain=DOM0)
    assert "not a zvol device" in exc.value.message


def test_udevadm_info_stands_in_for_a_missing_zvol_id(host, vdi,
                                                      monkeypatch):
    sr, vol = vdi
    monkeypatch.setattr(zvoldev, "ZVOL_ID_PATHS", ("/nonexistent/zvol_id",))
    dp("Datapath.attach", uri=uri_of(vol), domain=DOM0)
    # (SR.create asked udev for the pool disk's by-id name too)
    assert [a for a in host.ran("udevadm", "info")
            if a[3].startswith("--name=" + host.dev)] == [
        ["udevadm", "info", "--query=symlink",
         "--name=" + host.zd[dataset_of(vol)]]]
    assert host.ran(host.zvol_id) == []


def xapi_parse_nbd_uri(uri):
    """storage_interface.ml's parse_nbd_uri, as xapi (v26.1.4) reads an Nbd
    implementation: (socket, export) or a failure."""
    parts = uri.split(":")
    assert len(parts) == 4 and parts[:2] == ["nbd", "unix"], uri
    assert parts[3].startswith("exportname="), uri
    export = parts[3].split("exportname=")
    assert [e for e in export if e] == [parts[3][len("exportname="):]], uri
    return parts[2], parts[3][len("exportname="):]


@pytest.mark.parametrize("which", ["vdi", "snapshot"])
def test_a_guest_attach_answers_tapdisks_nbd_server_as_xapi_reads_it(
        host, snap_vdi, which):
    """What receive_start3 and get_nbd_server take (nbd_export_of_attach_
    info, the first Nbd): the socket of this VBD's tapdisk, whatever the
    domain is called (xapi's pseudo-domains MIR... and CP... too); a dom0
    attach has no tapdisk and answers none."""
    sr, vol, snap = snap_vdi
    target = vol if which == "vdi" else snap
    for domain in (GUEST, "MIR1a2b3c"):
        result = dp("Datapath.attach", uri=uri_of(target), domain=domain)
        nbds = [i[1]["uri"] for i in result["implementations"]
                if i[0] == "Nbd"]
        assert len(nbds) == 1
        socket_path, export = xapi_parse_nbd_uri(nbds[0])
        vbd = [v for v in host.tap.vbds()
               if "tapdev%d" % v[1] in result["implementations"][0][1][
                   "params"]]
        assert socket_path == "/var/run/blktap-control/nbd%d.%d" % (
            vbd[0][0], vbd[0][1])
        assert export == dataset_of(target).rsplit("/", 1)[1]
        again = dp("Datapath.attach", uri=uri_of(target), domain=domain)
        assert again == result                        # get_nbd_server
    dom0 = dp("Datapath.attach", uri=uri_of(target), domain=DOM0)
    assert [i[0] for i in dom0["implementations"]] == ["BlockDevice"]


# --- snapshot VDIs -----------------------------------------------------------

def test_snapshot_vdi_attaches_through_a_read_only_clone(host, snap_vdi):
    sr, vol, snap = snap_vdi
    result = dp("Datapath.attach", uri=uri_of(snap), domain=DOM0)
    clone = ro_clone(sr, snap)
    assert result == {"implementations": [
        ["BlockDevice", {"path": host.link(clone)}]]}
    props = host.zfs.local_props(clone)
    assert props["readonly"] == "on"
    assert props[meta.DATAPATH_CLONE] == "boot-1"
    assert host.zfs.dataset(clone).origin == dataset_of(snap)
    # the volume plugin does not see it
    assert sorted(v["key"] for v in call("SR.ls", sr=sr)) == \
        sorted([vol["key"], snap["key"]])
    dp("Datapath.activate", uri=uri_of(snap), domain=DOM0)
    dp("Datapath.detach", uri=uri_of(snap), domain=DOM0)
    assert not host.zfs.exists(clone)
    nothing_left(host)


def test_vdis_of_an_sr_at_the_name_limit_attach(host):
    """An SR whose longest names reach ZFS's 255 characters (the longest
    pool-name SR.create takes): its VDI and snapshot VDI attach and detach
    for a guest and for dom0 (URI check, state files, clone names)."""
    sr, _ = create_sr({"device": "/dev/sdb",
                       "pool-name": "p" * namelimits.room_for("")})
    vol = create_volume(sr, size=GiB, name="disk")
    snap = snapshot_of(sr, vol)
    for uri in (uri_of(vol), uri_of(snap)):
        for domain in (GUEST, DOM0):
            dp("Datapath.attach", uri=uri, domain=domain)
            dp("Datapath.activate", uri=uri, domain=domain)
            dp("Datapath.deactivate", uri=uri, domain=domain)
            dp("Datapath.detach", uri=uri, domain=domain)
    nothing_left(host)


def test_snapshot_vdi_for_a_guest_is_opened_read_only(host, snap_vdi):
    sr, vol, snap = snap_vdi
    dp("Datapath.attach", uri=uri_of(snap), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(snap), domain=GUEST)   # not _readonly
    (vbd,) = host.tap.vbds()
    assert vbd[2] == "aio:" + host.link(ro_clone(sr, snap))
    assert vbd[3] is True
    full_cycle(uri_of(snap), GUEST, twice=True)
    nothing_left(host)


def test_one_clone_serves_every_domain(host, snap_vdi):
    sr, vol, snap = snap_vdi
    clone = ro_clone(sr, snap)
    dp("Datapath.attach", uri=uri_of(snap), domain=DOM0)
    dp("Datapath.attach", uri=uri_of(snap), domain=GUEST)
    assert len(host.ran("zfs", "clone")) == 1
    dp("Datapath.detach", uri=uri_of(snap), domain=DOM0)
    assert host.zfs.exists(clone)
    dp("Datapath.detach", uri=uri_of(snap), domain=GUEST)
    assert not host.zfs.exists(clone)
    nothing_left(host)


def test_destroying_an_attached_snapshot_vdi_is_deferred(host, snap_vdi):
    sr, vol, snap = snap_vdi
    dp("Datapath.attach", uri=uri_of(snap), domain=DOM0)
    call("Volume.destroy", sr=sr, key=snap["key"])
    assert [v["key"] for v in call("SR.ls", sr=sr)] == [vol["key"]]
    assert host.zfs.exists(dataset_of(snap))        # kept for the clone
    dp("Datapath.detach", uri=uri_of(snap), domain=DOM0)
    assert not host.zfs.exists(dataset_of(snap))    # freed with it
    nothing_left(host)


def test_destroying_the_parent_of_an_attached_snapshot(host, snap_vdi):
    sr, vol, snap = snap_vdi
    dp("Datapath.attach", uri=uri_of(snap), domain=DOM0)
    call("Volume.destroy", sr=sr, key=vol["key"])
    call("Volume.destroy", sr=sr, key=snap["key"])
    assert call("SR.ls", sr=sr) == []
    dp("Datapath.detach", uri=uri_of(snap), domain=DOM0)
    assert zfs_all(host, sr) == [sr]      # the hidden parent went too
    nothing_left(host)


def test_a_clone_a_detach_failed_to_destroy_goes_with_the_next_call(
        host, snap_vdi):
    """Same boot: the next datapath call in the SR destroys it, and the
    hidden parent it kept alive goes with it."""
    sr, vol, snap = snap_vdi
    clone = ro_clone(sr, snap)
    dp("Datapath.attach", uri=uri_of(snap), domain=DOM0)
    call("Volume.destroy", sr=sr, key=snap["key"])
    call("Volume.destroy", sr=sr, key=vol["key"])
    host.zfs.inject("zfs destroy -- " + clone,
                    "cannot destroy '%s': Input/output error" % clone)
    dp("Datapath.detach", uri=uri_of(snap), domain=DOM0)   # never fails
    assert host.zfs.exists(clone) and state.all_states() == []
    other = create_volume(sr, size=GiB, name="another")
    dp("Datapath.open", uri=uri_of(other), persistent=True)
    assert zfs_all(host, sr) == [sr, dataset_of(other)]
    nothing_left(host)


@pytest.mark.parametrize("call_", ["attach", "open", "close"])
def test_a_clone_no_state_uses_goes_whatever_its_boot(host, snap_vdi, call_):
    sr, vol, snap = snap_vdi
    clone = ro_clone(sr, snap)
    dp("Datapath.attach", uri=uri_of(snap), domain=DOM0)
    state.remove(dataset_of(snap), DOM0)     # its detach lost track of it
    if call_ == "attach":
        full_cycle(uri_of(vol), DOM0)
    else:
        dp("Datapath." + call_, uri=uri_of(vol),
           **({"persistent": False} if call_ == "open" else {}))
    assert not host.zfs.exists(clone)


def test_a_clone_from_an_earlier_boot_is_swept(host, vdi):
    sr, vol = vdi
    s1, s2 = snapshot_of(sr, vol), snapshot_of(sr, vol)
    dp("Datapath.attach", uri=uri_of(s1), domain=GUEST)
    # the host crashed: no detach; tapdisks, state files and boot id go
    host.tap.reboot()
    for name in os.listdir(attachstate.RUN_DIR):
        os.unlink(os.path.join(attachstate.RUN_DIR, name))
    host.boot_id.write_text("boot-2\n")
    assert host.zfs.exists(ro_clone(sr, s1))
    full_cycle(uri_of(s2), DOM0)
    assert not host.zfs.exists(ro_clone(sr, s1))
    nothing_left(host)


def test_a_clone_from_an_earlier_boot_is_reused_for_its_snapshot(host,
                                                                snap_vdi):
    sr, vol, snap = snap_vdi
    clone = ro_clone(sr, snap)
    dp("Datapath.attach", uri=uri_of(snap), domain=DOM0)
    for name in os.listdir(attachstate.RUN_DIR):
        os.unlink(os.path.join(attachstate.RUN_DIR, name))
    host.boot_id.write_text("boot-2\n")
    dp("Datapath.attach", uri=uri_of(snap), domain=DOM0)
    assert host.zfs.local_props(clone)[meta.DATAPATH_CLONE] == "boot-2"
    assert len(host.ran("zfs", "clone")) == 1
    dp("Datapath.detach", uri=uri_of(snap), domain=DOM0)
    nothing_left(host)


def test_a_dataset_that_is_not_our_clone_is_never_touched(host, snap_vdi):
    sr, vol, snap = snap_vdi
    clone = ro_clone(sr, snap)
    host.zfs.admin("zfs create -V 1G %s" % clone)
    with pytest.raises(errors.DatasetExists):
        dp("Datapath.attach", uri=uri_of(snap), domain=DOM0)
    dp("Datapath.detach", uri=uri_of(snap), domain=DOM0)
    assert host.zfs.exists(clone)
    assert state.all_states() == []


def test_snapshot_of_a_missing_snapshot(host, vdi):
    sr, vol = vdi
    gone = uri_of(vol) + "@b7e4a9d2-1c3f-4d5e-8f60-718293a4b5c6"
    with pytest.raises(errors.Volume_does_not_exist):
        dp("Datapath.attach", uri=gone, domain=DOM0)
    nothing_left(host)


# --- scope: zfs-ng VDIs only -------------------------------------------------

UUID_A = "b7e4a9d2-1c3f-4d5e-8f60-718293a4b5c6"
UUID_B = "3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61"


def not_vdis(host, sr, vol):
    """URIs that parse but name no zfs-ng VDI, each made by an admin."""
    vdi_prop = meta.VDI_UUID
    host.zfs.admin("zfs create -V 1G %s/%s" % (sr, UUID_A))   # no vdi
    host.zfs.admin("zfs create %s/%s" % (sr, UUID_B))          # a filesystem
    host.zfs.admin("zpool create other /dev/sdc")               # no SR
    host.zfs.admin("zfs create -V 1G -o %s=%s other/%s"
                   % (vdi_prop, UUID_A, UUID_A))
    host.zfs.admin("zfs create other/fs")
    host.zfs.admin("zfs create -V 1G -o %s=%s other/fs/%s"
                   % (vdi_prop, UUID_B, UUID_B))
    host.zfs.admin("zfs snapshot %s@%s" % (dataset_of(vol), UUID_A))  # admin's
    host.zfs.admin("zfs snapshot %s/%s@%s" % (sr, UUID_B, UUID_A))
    return ["zfs-ng:///%s/%s" % (sr, UUID_A), "zfs-ng:///%s/%s" % (sr, UUID_B),
            "zfs-ng:///other/" + UUID_A, "zfs-ng:///other/fs/" + UUID_B,
            "%s@%s" % (uri_of(vol), UUID_A),
            "zfs-ng:///%s/%s@%s" % (sr, UUID_B, UUID_A)]


def test_what_is_no_zfs_ng_vdi_is_never_touched(host, vdi):
    sr, vol = vdi
    uris = not_vdis(host, sr, vol)
    mark = len(host.zfs.calls)
    for uri in uris:
        for domain in (GUEST, DOM0):
            with pytest.raises(NotAVdi):
                dp("Datapath.attach", uri=uri, domain=domain)
            dp("Datapath.detach", uri=uri, domain=domain)
        if "@" not in uri:
            for persistent in (False, True):
                with pytest.raises(NotAVdi):
                    dp("Datapath.open", uri=uri, persistent=persistent)
            with pytest.raises(NotAVdi):
                dp("Datapath.close", uri=uri)
    assert host.zfs.mutations(mark) == []
    nothing_left(host)


def test_a_vdi_whose_uuid_was_edited_is_no_vdi(host, vdi):
    sr, vol = vdi
    host.zfs.admin("zfs set %s=%s %s" % (meta.VDI_UUID, UUID_A,
                                         dataset_of(vol)))
    with pytest.raises(NotAVdi) as exc:
        dp("Datapath.open", uri=uri_of(vol), persistent=False)
    assert meta.VDI_UUID in exc.value.message
    assert not host.zfs.exists(reset_point(vol))


# --- NONPERSISTENT -----------------------------------------------------------

def reset_point(vol):
    return dataset_of(vol) + "@" + meta.NONPERSISTENT_SNAPSHOT


def refer(host, vol):
    return host.zfs.dataset(dataset_of(vol)).refer


def test_open_nonpersistent_then_close_resets(host, vdi):
    sr, vol = vdi
    host.zfs.write(dataset_of(vol), 10 * MiB)
    before = refer(host, vol)
    dp("Datapath.open", uri=uri_of(vol), persistent=False)
    assert host.zfs.exists(reset_point(vol))
    # not a VDI: SR.ls and Volume.stat are unchanged
    assert [v["key"] for v in call("SR.ls", sr=sr)] == [vol["key"]]
    full_cycle(uri_of(vol), GUEST)
    host.zfs.write(dataset_of(vol), 50 * MiB)      # the guest wrote
    dp("Datapath.close", uri=uri_of(vol))
    assert refer(host, vol) == before
    assert not host.zfs.exists(reset_point(vol))
    assert host.ran("zfs", "rollback") == [
        ["zfs", "rollback", "--", reset_point(vol)]]


def test_open_and_close_twice(host, vdi):
    sr, vol = vdi
    dp("Datapath.open", uri=uri_of(vol), persistent=False)
    dp("Datapath.open", uri=uri_of(vol), persistent=False)
    assert len(host.ran("zfs", "snapshot")) == 1
    dp("Datapath.close", uri=uri_of(vol))
    dp("Datapath.close", uri=uri_of(vol))
    assert not host.zfs.exists(reset_point(vol))
    assert len(host.ran("zfs", "rollback")) == 2   # open again, then close


def test_persistent_open_and_plain_close_change_nothing(host, vdi):
    sr, vol = vdi
    mark = len(host.zfs.calls)
    for _ in range(2):
        dp("Datapath.open", uri=uri_of(vol), persistent=True)
        dp("Datapath.close", uri=uri_of(vol))
    assert host.zfs.mutations(mark) == []


def test_a_reset_left_pending_is_done_by_the_next_open(host, vdi):
    sr, vol = vdi
    before = refer(host, vol)
    dp("Datapath.open", uri=uri_of(vol), persistent=False)
    host.zfs.write(dataset_of(vol), 20 * MiB)
    # the host crashed while the VM ran: no close. Next start, reset again:
    dp("Datapath.open", uri=uri_of(vol), persistent=False)
    assert refer(host, vol) == before
    assert host.zfs.exists(reset_point(vol))


def test_a_persistent_open_keeps_the_data_of_a_pending_reset(host, vdi):
    """The host crashed while the VM ran (no close), then the admin made
    the disk persistent: its data is what they chose to keep."""
    sr, vol = vdi
    dp("Datapath.open", uri=uri_of(vol), persistent=False)
    host.zfs.write(dataset_of(vol), 20 * MiB)
    written = refer(host, vol)
    dp("Datapath.open", uri=uri_of(vol), persistent=True)
    assert refer(host, vol) == written
    assert not host.zfs.exists(reset_point(vol))
    assert host.ran("zfs", "rollback") == []
    dp("Datapath.close", uri=uri_of(vol))
    assert refer(host, vol) == written


def zfs_all(host, sr):
    return sorted(n for n in host.zfs.pool(sr.split("/")[0]).datasets
                  if n == sr or n.startswith(sr + "/"))


def stat(sr, vol):
    return call("Volume.stat", sr=sr, key=vol["key"])


def rotation_scenario(host, sr, vol):
    """A non-persistent run during which a backup took a snapshot VDI and
    a VM copy took a live clone; what each must keep (refer is content)."""
    host.zfs.write(dataset_of(vol), 10 * MiB)
    call("Volume.set", sr=sr, key=vol["key"], k="vdi-type", v="user")
    vol = stat(sr, vol)
    start = refer(host, vol)
    dp("Datapath.open", uri=uri_of(vol), persistent=False)
    host.zfs.write(dataset_of(vol), 5 * MiB)
    snap = snapshot_of(sr, vol)
    host.zfs.write(dataset_of(vol), 7 * MiB)
    clone = call("Volume.clone", sr=sr, key=vol["key"])
    host.zfs.write(dataset_of(vol), 3 * MiB)
    return vol, snap, clone, {vol["key"]: start,
                              snap["key"]: refer(host, snap),
                              clone["key"]: refer(host, clone)}


def check_kept(host, sr, vol, keep):
    """The VDIs are listed with their keys, the disk is at its reset point,
    the snapshot and the clone hold what they captured."""
    listed = dict((v["key"], v) for v in call("SR.ls", sr=sr))
    assert sorted(listed) == sorted(keep)
    assert plain_keys(listed[vol["key"]]["keys"]) == {"vdi-type": "user"}
    assert uri_of(listed[vol["key"]]) == uri_of(vol)
    for key, content in keep.items():
        assert refer(host, listed[key]) == content, key
    assert not host.zfs.exists(reset_point(vol))


def destroy_all_but(sr, vol):
    for v in call("SR.ls", sr=sr):
        if v["key"] != vol["key"]:
            call("Volume.destroy", sr=sr, key=v["key"])


def test_close_after_a_backup_and_a_copy_resets_and_keeps_them(host, vdi):
    sr, vol = vdi
    vol, snap, clone, keep = rotation_scenario(host, sr, vol)
    dp("Datapath.close", uri=uri_of(vol))
    check_kept(host, sr, vol, keep)
    # the snapshot VDI moved to the hidden zvol: same key, new URI
    moved = stat(sr, snap)
    assert moved["key"] == snap["key"] and uri_of(moved) != uri_of(snap)
    (aside,) = [n for n in zfs_all(host, sr) if n not in (
        sr, dataset_of(vol), dataset_of(clone)) and "@" not in n]
    assert host.zfs.local_props(aside)[meta.VDI_UUID] == meta.HIDDEN
    assert dataset_of(moved) == aside + "@" + snap["key"]
    full_cycle(uri_of(moved), DOM0)
    # the VM starts and resets again, every time
    for _ in range(2):
        dp("Datapath.open", uri=uri_of(vol), persistent=False)
        host.zfs.write(dataset_of(vol), 1 * MiB)
        dp("Datapath.close", uri=uri_of(vol))
        check_kept(host, sr, vol, keep)
    # nothing leaks once the snapshot and the clone go
    destroy_all_but(sr, vol)
    assert zfs_all(host, sr) == [sr, dataset_of(vol)]
    assert refer(host, vol) == keep[vol["key"]]
    nothing_left(host)


def test_a_tracked_disk_stays_tracked_across_a_rotation(host, vdi):
    """The rotation's new zvol carries the VDI's CBT state with its other
    properties: xapi still believes CBT on, and the next delta backup's
    list_changed_blocks from an older snapshot needs it."""
    sr, vol = vdi
    call("Volume.enable_cbt", sr=sr, key=vol["key"])
    vol, snap, clone, keep = rotation_scenario(host, sr, vol)
    dp("Datapath.close", uri=uri_of(vol))
    check_kept(host, sr, vol, keep)
    assert stat(sr, vol)["cbt_enabled"] is True
    assert host.zfs.local_props(dataset_of(vol))[meta.CBT_ENABLED] == "true"


def test_a_snapshot_the_reset_moved_can_be_reverted_to(host, vdi):
    """Issue 39, item 1: the reset moves the backup's snapshot to the
    hidden zvol; it is still the disk's (xapi's snapshot_of), and
    Volume.revert to it gives the disk its data."""
    sr, vol = vdi
    vol, snap, clone, keep = rotation_scenario(host, sr, vol)
    dp("Datapath.close", uri=uri_of(vol))
    assert dataset_of(stat(sr, snap)).split("@")[0] != dataset_of(vol)
    call("Volume.revert", sr=sr, snapshot=snap["key"], key=vol["key"])
    assert refer(host, vol) == keep[snap["key"]]
    assert refer(host, stat(sr, snap)) == keep[snap["key"]]
    assert refer(host, stat(sr, clone)) == keep[clone["key"]]
    assert plain_keys(stat(sr, vol)["keys"]) == {"vdi-type": "user"}
    destroy_all_but(sr, vol)
    assert zfs_all(host, sr) == [sr, dataset_of(vol)]
    assert refer(host, vol) == keep[snap["key"]]
    nothing_left(host)


def test_open_after_a_crash_resets_a_pending_run_with_a_backup(host, vdi):
    """No close (host crash), a backup snapshot newer than the reset
    point: the next non-persistent start resets and keeps the snapshot."""
    sr, vol = vdi
    vol, snap, clone, keep = rotation_scenario(host, sr, vol)
    dp("Datapath.open", uri=uri_of(vol), persistent=False)
    assert host.zfs.exists(reset_point(vol))     # a new run's reset point
    assert refer(host, vol) == keep[vol["key"]]
    host.zfs.write(dataset_of(vol), 1 * MiB)
    dp("Datapath.close", uri=uri_of(vol))
    check_kept(host, sr, vol, keep)
    destroy_all_but(sr, vol)
    assert zfs_all(host, sr) == [sr, dataset_of(vol)]


def test_a_snapshot_attached_across_the_reset_detaches_by_its_new_uri(
        host, vdi):
    sr, vol = vdi
    vol, snap, clone, keep = rotation_scenario(host, sr, vol)
    for domain in (DOM0, GUEST):
        dp("Datapath.attach", uri=uri_of(snap), domain=domain)
        dp("Datapath.activate_readonly", uri=uri_of(snap), domain=domain)
    dp("Datapath.close", uri=uri_of(vol))
    check_kept(host, sr, vol, keep)
    moved = stat(sr, snap)              # xapi stats before every call
    for domain in (DOM0, GUEST):
        dp("Datapath.activate_readonly", uri=uri_of(moved), domain=domain)
        dp("Datapath.deactivate", uri=uri_of(moved), domain=domain)
        dp("Datapath.detach", uri=uri_of(moved), domain=domain)
    nothing_left(host)
    destroy_all_but(sr, vol)
    assert zfs_all(host, sr) == [sr, dataset_of(vol)]


def test_the_reset_of_a_thick_disk_moves_its_reservation(host):
    sr, _ = create_sr({"device": "/dev/sdb", "provisioning": "thick"})
    vol = create_volume(sr, size=GiB, name="disk")
    reserved = host.zfs.local_props(dataset_of(vol))["refreservation"]
    vol, snap, clone, keep = rotation_scenario(host, sr, vol)
    dp("Datapath.close", uri=uri_of(vol))
    check_kept(host, sr, vol, keep)
    assert host.zfs.local_props(dataset_of(vol))["refreservation"] == \
        reserved
    aside = dataset_of(stat(sr, snap)).split("@")[0]
    assert host.zfs.local_props(aside)["refreservation"] == "none"


def test_a_thick_reset_without_the_space_changes_nothing(host):
    """The one case left: the reset disk's reservation does not fit next
    to the kept snapshots. Refused, undone, and done once space frees."""
    sr, _ = create_sr({"device": "/dev/sdb", "provisioning": "thick"})
    vol = create_volume(sr, size=GiB, name="disk")
    vol, snap, clone, keep = rotation_scenario(host, sr, vol)
    names = zfs_all(host, sr)
    host.zfs.inject("zfs clone", "cannot create '%s': out of space"
                    % dataset_of(vol))
    with pytest.raises(NonpersistentResetBlocked) as exc:
        dp("Datapath.close", uri=uri_of(vol))
    assert "free space" in exc.value.message
    assert zfs_all(host, sr) == names
    assert host.zfs.exists(reset_point(vol))
    assert uri_of(stat(sr, vol)) == uri_of(vol)
    dp("Datapath.close", uri=uri_of(vol))
    check_kept(host, sr, vol, keep)


def test_open_of_a_snapshot_vdi_is_a_no_op(host, snap_vdi):
    sr, vol, snap = snap_vdi
    mark = len(host.zfs.calls)
    dp("Datapath.open", uri=uri_of(snap), persistent=False)
    dp("Datapath.close", uri=uri_of(snap))
    assert host.zfs.calls[mark:] == []


def test_open_of_a_missing_volume(host, vdi):
    sr, vol = vdi
    gone = uri_of(vol)[:-36] + "b7e4a9d2-1c3f-4d5e-8f60-718293a4b5c6"
    with pytest.raises(errors.Volume_does_not_exist):
        dp("Datapath.open", uri=gone, persistent=False)


# --- crash points ------------------------------------------------------------

def _count(host, method, args):
    return commands_run(host, lambda: dp(method, **args))


SEQUENCES = {
    "attach": [("Datapath.attach", True)],
    "activate": [("Datapath.attach", False), ("Datapath.activate", True)],
    "deactivate": [("Datapath.attach", False), ("Datapath.activate", False),
                   ("Datapath.deactivate", True)],
    "detach": [("Datapath.attach", False), ("Datapath.activate", False),
               ("Datapath.detach", True)],
}


def _setup(root, monkeypatch, name, snapshot):
    """A fresh host where the sequence ran up to the call under test."""
    h = _fresh_host(root, monkeypatch)
    sr, _ = create_sr({"device": "/dev/sdb"})
    vol = create_volume(sr, size=GiB)
    target = snapshot_of(sr, vol) if snapshot else vol
    args = {"uri": uri_of(target), "domain": GUEST}
    for method, under_test in SEQUENCES[name]:
        if under_test:
            return h, method, args
        dp(method, **args)


@pytest.mark.parametrize("snapshot", [False, True])
@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_every_crash_point_is_repaired(tmp_path, monkeypatch, name,
                                       snapshot):
    """Crash the call under test right after each of its commands; the
    same call again, then the rest of the cycle, must leave nothing behind,
    but for the two windows blktap gives no way to close: killed right
    after `tap-ctl spawn` or `tap-ctl allocate` answered, before the answer
    was saved, that tapdisk or minor is lost (nothing tells whose it is)."""
    h, method, args = _setup(tmp_path / "count", monkeypatch, name, snapshot)
    total = _count(h, method, args)
    assert total > 0
    for n in range(1, total + 1):
        h, method, args = _setup(tmp_path / str(n), monkeypatch, name,
                                 snapshot)
        with installed(CrashAfter(h, n)):
            with pytest.raises(Killed):
                dp(method, **args)
        killed_after = h.calls[-1]
        dp(method, **args)                      # the retry repairs
        full_cycle(args["uri"], GUEST)
        if killed_after[:2] == ["tap-ctl", "spawn"]:
            assert h.tap.minors == set()
            assert [v for v in h.tap.tapdisks.values()] in ([], [{}])
            h.tap.reboot()
        elif killed_after[:2] == ["tap-ctl", "allocate"]:
            assert h.tap.tapdisks == {} and len(h.tap.minors) <= 1
            h.tap.reboot()
        nothing_left(h)


def _fresh_host(root, monkeypatch):
    """One more host in a test that needs several (one per crash point):
    a new directory under the test's own, and the runner from now on."""
    os.makedirs(str(root))
    h = new_host(root, monkeypatch)
    runner.set_runner(h)
    return h


def _reset_setup(root, monkeypatch):
    """A fresh host at the close of a run with a backup and a copy."""
    h = _fresh_host(root, monkeypatch)
    sr, _ = create_sr({"device": "/dev/sdb"})
    vol = create_volume(sr, size=GiB, name="disk")
    return (h, sr) + rotation_scenario(h, sr, vol)


def test_the_set_aside_disk_is_the_vdi_until_the_reset_is_finished(host,
                                                                   vdi):
    """Killed right after `zfs rename` set the disk aside (no zvol by its
    name): the volume plugin lists, stats, renames and snapshots it as the
    VDI, under its own URI; the next datapath call finishes the reset and
    keeps all of it."""
    sr, vol = vdi
    vol, snap, clone, keep = rotation_scenario(host, sr, vol)
    with installed(CrashAfterCommand(host, ["zfs", "rename"])):
        with pytest.raises(Killed):
            dp("Datapath.close", uri=uri_of(vol))
    assert not host.zfs.exists(dataset_of(vol))
    assert stat(sr, vol)["uri"] == vol["uri"]
    call("Volume.set_name", sr=sr, key=vol["key"], new_name="renamed")
    call("Volume.set", sr=sr, key=vol["key"], k="x", v="y")
    late = snapshot_of(sr, vol)                  # the disk as it was
    keep[late["key"]] = refer(host, late)
    dp("Datapath.attach", uri=uri_of(vol), domain=DOM0)    # finishes it
    assert host.zfs.exists(dataset_of(vol))
    dp("Datapath.detach", uri=uri_of(vol), domain=DOM0)
    dp("Datapath.close", uri=uri_of(vol))
    now = stat(sr, vol)
    assert (now["name"], plain_keys(now["keys"])) == (
        "renamed", {"vdi-type": "user", "x": "y"})
    listed = dict((v["key"], v) for v in call("SR.ls", sr=sr))
    assert sorted(listed) == sorted(keep)
    for key, content in keep.items():
        assert refer(host, listed[key]) == content, key
    destroy_all_but(sr, vol)
    assert zfs_all(host, sr) == [sr, dataset_of(vol)]


@pytest.mark.parametrize("then", ["Datapath.close", "Datapath.open",
                                  "Datapath.attach", "Volume.destroy"])
def test_every_crash_point_of_a_reset_is_repaired(tmp_path, monkeypatch,
                                                  then):
    """close killed right after each of its commands (a rotation: see
    reset.py for the states). At every point SR.ls still lists every VDI,
    the disk under its own URI; the next close, open or attach of the disk
    finishes the reset; a Volume.destroy of it frees everything."""
    h, sr, vol, snap, clone, keep = _reset_setup(tmp_path / "count",
                                                 monkeypatch)
    total = _count(h, "Datapath.close", {"uri": uri_of(vol)})
    assert total > 10
    for n in range(1, total + 1):
        h, sr, vol, snap, clone, keep = _reset_setup(tmp_path / str(n),
                                                     monkeypatch)
        close = {"uri": uri_of(vol)}
        with installed(CrashAfter(h, n)):
            with pytest.raises(Killed):
                dp("Datapath.close", **close)
        listed = dict((v["key"], v) for v in call("SR.ls", sr=sr))
        assert sorted(listed) == sorted(keep), h.calls[-1]
        assert uri_of(listed[vol["key"]]) == uri_of(vol)
        assert uri_of(stat(sr, vol)) == uri_of(vol)
        if then == "Volume.destroy":
            call("Volume.destroy", sr=sr, key=vol["key"])
            destroy_all_but(sr, vol)
            assert zfs_all(h, sr) == [sr], (h.calls[-1], zfs_all(h, sr))
            continue
        if then == "Datapath.open":
            dp("Datapath.open", uri=uri_of(vol), persistent=False)
        elif then == "Datapath.attach":
            full_cycle(uri_of(vol), DOM0)
        dp("Datapath.close", **close)
        check_kept(h, sr, vol, keep)
        destroy_all_but(sr, vol)
        assert zfs_all(h, sr) == [sr, dataset_of(vol)], h.calls[-1]
        nothing_left(h)


# --- power cuts inside zfs clone -o ------------------------------------------
#
# ZFS makes a clone, then sets its -o properties in later transaction groups
# (zfs_ioc_clone): CutInside leaves it without them and stops there.

def _cut_reset_setup(root, monkeypatch, thick):
    """_reset_setup, thin or thick, with the SR's stored device-config."""
    h = _fresh_host(root, monkeypatch)
    sr, config = create_sr({"device": "/dev/sdb",
                            "provisioning": "thick" if thick else "thin"})
    vol = create_volume(sr, size=GiB, name="disk")
    return (h, sr, config) + rotation_scenario(h, sr, vol)


@pytest.mark.parametrize("then", ["Datapath.close", "Datapath.open",
                                  "Datapath.attach", "Volume.destroy",
                                  "SR.attach"])
@pytest.mark.parametrize("thick", [False, True], ids=["thin", "thick"])
def test_a_reset_cut_inside_its_clone_keeps_the_vdi_and_its_keys(
        tmp_path, monkeypatch, then, thick):
    """Step 2 of the rotation cut before the new zvol has the VDI's
    properties (thick: after its reservation, before the rest). The
    set-aside zvol stays the VDI, listed under its own URI with its keys;
    the next datapath call finishes the reset; the collector (SR.attach)
    may free the bare clone first; a destroy frees everything."""
    h, sr, config, vol, snap, clone, keep = _cut_reset_setup(
        tmp_path / "h", monkeypatch, thick)
    cut = CutInside(h, h.zfs, ["zfs", "clone"],
                    keep=("refreservation",) if thick else ())
    with installed(cut):
        with pytest.raises(Killed):
            dp("Datapath.close", uri=uri_of(vol))
    assert h.zfs.exists(dataset_of(vol))
    assert meta.VDI_UUID not in h.zfs.local_props(dataset_of(vol))
    listed = dict((v["key"], v) for v in call("SR.ls", sr=sr))
    assert sorted(listed) == sorted(keep)
    assert uri_of(listed[vol["key"]]) == uri_of(vol)
    assert plain_keys(listed[vol["key"]]["keys"]) == {"vdi-type": "user"}
    assert plain_keys(stat(sr, vol)["keys"]) == {"vdi-type": "user"}
    if then == "Volume.destroy":
        call("Volume.destroy", sr=sr, key=vol["key"])
        destroy_all_but(sr, vol)
        assert zfs_all(h, sr) == [sr]
        return
    if then == "SR.attach":             # the collector frees the bare clone
        call("SR.attach", configuration=config)
        assert not h.zfs.exists(dataset_of(vol))
        assert plain_keys(stat(sr, vol)["keys"]) == {"vdi-type": "user"}
    elif then == "Datapath.open":
        dp("Datapath.open", uri=uri_of(vol), persistent=False)
    elif then == "Datapath.attach":
        full_cycle(uri_of(vol), DOM0)
    dp("Datapath.close", uri=uri_of(vol))
    check_kept(h, sr, vol, keep)
    if thick:
        assert h.zfs.local_props(dataset_of(vol))["refreservation"] != "none"
    destroy_all_but(sr, vol)
    assert zfs_all(h, sr) == [sr, dataset_of(vol)]
    nothing_left(h)


def _cut_ro_clone(host, snap, domain=DOM0):
    """Datapath.attach of a snapshot VDI cut inside its zfs clone; the
    host reboots (no state, no tapdisk, a new boot id)."""
    with installed(CutInside(host, host.zfs, ["zfs", "clone"])):
        with pytest.raises(Killed):
            dp("Datapath.attach", uri=uri_of(snap), domain=domain)
    host.tap.reboot()
    for name in os.listdir(attachstate.RUN_DIR):
        os.unlink(os.path.join(attachstate.RUN_DIR, name))
    host.boot_id.write_text("boot-2\n")


def test_a_datapath_clone_cut_before_its_mark_is_marked_by_the_next_attach(
        host, snap_vdi):
    sr, vol, snap = snap_vdi
    clone = ro_clone(sr, snap)
    _cut_ro_clone(host, snap)
    props = host.zfs.local_props(clone)
    assert meta.DATAPATH_CLONE not in props and "readonly" not in props
    full_cycle(uri_of(snap), GUEST)
    (opened,) = host.ran("tap-ctl", "open")
    assert opened[opened.index("-a") + 1] == "aio:" + host.link(clone)
    assert len(host.ran("zfs", "clone")) == 1       # the one cut
    assert not host.zfs.exists(clone)
    nothing_left(host)


def test_a_datapath_clone_cut_before_its_mark_is_freed_by_the_collector(
        host, snap_vdi):
    """Not attached again: the snapshot's destroy is deferred by it, and
    the collector frees it (and the snapshot with it)."""
    sr, vol, snap = snap_vdi
    clone = ro_clone(sr, snap)
    _cut_ro_clone(host, snap)
    call("Volume.destroy", sr=sr, key=snap["key"])
    assert not host.zfs.exists(clone)
    assert zfs_all(host, sr) == [sr, dataset_of(vol)]
    nothing_left(host)


def test_a_written_ro_clone_without_mark_is_not_taken(host, snap_vdi):
    """A .ro of that snapshot that has data of its own was not made by a
    cut clone: refused as before, never changed."""
    sr, vol, snap = snap_vdi
    clone = ro_clone(sr, snap)
    host.zfs.admin("zfs clone %s %s" % (dataset_of(snap), clone))
    host.zfs.write(clone, MiB)
    with pytest.raises(errors.DatasetExists):
        dp("Datapath.attach", uri=uri_of(snap), domain=DOM0)
    call("Volume.destroy", sr=sr, key=vol["key"])      # collects
    assert host.zfs.exists(clone)
    assert meta.DATAPATH_CLONE not in host.zfs.local_props(clone)


# --- faketapctl behaves as tap-ctl ------------------------------------------

@pytest.fixture
def tap(tmp_path):
    image = tmp_path / "image"
    image.write_text("")
    t = faketapctl.FakeTapCtl()
    t.image = str(image)
    return t


def run(t, line):
    return t(line.split())


def test_fake_spawn_allocate_attach_open_list(tap):
    pid = int(run(tap, "tap-ctl spawn").out)
    assert run(tap, "tap-ctl list").out == "pid=%d\n" % pid
    assert run(tap, "tap-ctl allocate").out == "/dev/xen/blktap-2/tapdev0\n"
    assert run(tap, "tap-ctl list").out == "pid=%d\nminor=0\n" % pid
    assert run(tap, "tap-ctl attach -p %d -m 0" % pid).rc == 0
    assert run(tap, "tap-ctl list").out == "pid=%d minor=0 state=0\n" % pid
    assert run(tap, "tap-ctl open -p %d -m 0 -a aio:%s -R"
               % (pid, tap.image)).rc == 0
    assert run(tap, "tap-ctl list").out == \
        "pid=%d minor=0 state=0 args=aio:%s\n" % (pid, tap.image)
    rows = tapctl.parse_list(run(tap, "tap-ctl list").out)
    assert (rows[0].pid, rows[0].minor, rows[0].type, rows[0].path) == \
        (pid, 0, "aio", tap.image)


@pytest.mark.parametrize("line,err", [
    ("tap-ctl attach -p {pid}", errno.EINVAL),          # usage
    ("tap-ctl attach -m 0", errno.EINVAL),
    ("tap-ctl attach -p {pid} -m 3", errno.ENOENT),     # minor not allocated
    ("tap-ctl attach -p 1 -m 0", errno.ENOENT),         # no such tapdisk
    ("tap-ctl open -p {pid} -m 0 -a aio:{image}", errno.EINVAL),  # detached
    ("tap-ctl close -p {pid} -m 0", errno.ENODEV),
    ("tap-ctl detach -p {pid} -m 0", errno.ENODEV),
    ("tap-ctl free -m 7", errno.ENODEV),
    ("tap-ctl free", errno.EINVAL),
])
def test_fake_refuses_calls_out_of_order(tap, line, err):
    pid = int(run(tap, "tap-ctl spawn").out)
    run(tap, "tap-ctl allocate")
    result = run(tap, line.format(pid=pid, image=tap.image))
    assert result.rc == err
    assert result.err == os.strerror(err) + "\n"


def test_fake_state_machine_refusals_once_attached(tap):
    pid = int(run(tap, "tap-ctl spawn").out)
    run(tap, "tap-ctl allocate")
    run(tap, "tap-ctl attach -p %d -m 0" % pid)
    assert run(tap, "tap-ctl attach -p %d -m 0" % pid).rc == errno.EINVAL
    other = int(run(tap, "tap-ctl spawn").out)
    assert run(tap, "tap-ctl attach -p %d -m 0" % other).rc == errno.EINVAL
    assert run(tap, "tap-ctl free -m 0").rc == errno.EBUSY
    assert run(tap, "tap-ctl close -p %d -m 0" % pid).rc == 0   # not open
    assert run(tap, "tap-ctl open -p %d -m 0 -a aio:/nonexistent"
               % pid).rc == errno.ENOENT
    assert run(tap, "tap-ctl open -p %d -m 0 -a aio:%s"
               % (pid, tap.image)).rc == 0
    assert run(tap, "tap-ctl open -p %d -m 0 -a aio:%s"
               % (pid, tap.image)).rc == errno.EALREADY
    assert run(tap, "tap-ctl detach -p %d -m 0" % pid).rc == errno.EINVAL
    assert run(tap, "tap-ctl close -p %d -m 0 -t 120" % pid).rc == 0
    assert run(tap, "tap-ctl detach -p %d -m 0" % pid).rc == 0
    assert pid not in tap.tapdisks           # its last VBD: it exited
    assert run(tap, "tap-ctl list").out == "pid=%d\nminor=0\n" % other
    assert run(tap, "tap-ctl free -m 0").rc == 0
    assert run(tap, "kill -TERM %d" % other).rc == 0
    assert run(tap, "tap-ctl list").out == ""


def test_fake_dead_tapdisk_leaves_an_orphan_minor(tap):
    pid = int(run(tap, "tap-ctl spawn").out)
    run(tap, "tap-ctl allocate")
    run(tap, "tap-ctl attach -p %d -m 0" % pid)
    tap.kill_tapdisk(pid)
    assert run(tap, "tap-ctl list").out == "minor=0\n"
    assert run(tap, "tap-ctl close -p %d -m 0" % pid).rc == \
        errno.ECONNREFUSED                   # its socket stays behind
    assert run(tap, "tap-ctl free -m 0").rc == 0


def test_list_parsing_of_every_line_form():
    rows = tapctl.parse_list(
        "pid=12 minor=0 state=0 args=aio:/dev/zvol/a/b\n"
        "pid=13 minor=1 state=0x20 args=vhd:/run/sr mount/x.vhd\n"
        "pid=14\nminor=3\npid=15 minor=4 state=0\n")
    assert [(r.pid, r.minor, r.state, r.type, r.path) for r in rows] == [
        (12, 0, 0, "aio", "/dev/zvol/a/b"),
        (13, 1, 0x20, "vhd", "/run/sr mount/x.vhd"),
        (14, None, None, None, None), (None, 3, None, None, None),
        (15, 4, 0, None, None)]
    view = tapctl.View(rows)
    assert view.tapdisk_idle(14) and not view.tapdisk_idle(12)
    assert view.minor_orphan(3) and not view.minor_orphan(0)
    assert view.vbd(15, 4) and not view.vbd(15, 0)


def test_allocate_output_forms(monkeypatch):
    for out, minor in (("/dev/xen/blktap-2/tapdev12\n", 12),
                       ("/dev/xen/blktap-2/blktap3\n", 3),
                       ("/run/blktap-control/tapdisk/tapdisk-5\n", 5)):
        monkeypatch.setattr(runner, "_runner", lambda argv, s=None, o=out:
                            runner.Result(argv, 0, o, ""))
        assert tapctl.allocate() == (minor, out.strip())
    monkeypatch.setattr(runner, "_runner", lambda argv, s=None:
                        runner.Result(argv, 0, "oops\n", ""))
    with pytest.raises(TapdiskError):
        tapctl.allocate()


def test_state_files_are_json(host, vdi):
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    with open(state.path(dataset_of(vol), GUEST)) as f:
        st = json.load(f)
    assert st["uri"] == uri_of(vol) and st["domain"] == GUEST
    assert st["attached"] is True and st["minor"] == 0


def test_a_vm_start_after_a_cut_undo_has_its_reservation_back(host):
    """A thick disk's revert whose clone did not fit is undone: the disk
    renamed back, then its reservation set again. Killed between the
    two, the disk is under its name, still marked, without reservation:
    the VM's start (no other call between) must give it back, not run it
    thin until the next collect."""
    sr, _ = create_sr({"device": "/dev/sdb", "provisioning": "thick"})
    vol = create_volume(sr, size=GiB, name="disk")
    snap = snapshot_of(sr, vol)
    reserved = host.zfs.get(dataset_of(vol), "refreservation")
    assert reserved not in (None, "none", "0")
    host.zfs.inject("zfs clone", "cannot create 'tank/x': out of space")
    with installed(CrashAfterCommand(host.zfs, ["zfs", "rename"], nth=2)):
        with pytest.raises(Killed):
            call("Volume.revert", sr=sr, snapshot=snap["key"],
                 key=vol["key"])
    assert host.zfs.get(dataset_of(vol), "refreservation") in ("none", "0")
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    assert host.zfs.get(dataset_of(vol), "refreservation") == reserved
    assert not host.zfs.local_props(dataset_of(vol)).get(meta.REVERTING)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)


# --- a revert a crash cut short ----------------------------------------------

@pytest.mark.parametrize("moved", [False, True])
def test_a_vm_start_after_a_revert_killed_anywhere_finds_its_disk(
        tmp_path, monkeypatch, moved):
    """Volume.revert (zfsng/revertsteps.py) killed after each command,
    then the VM started (no other call between): the datapath undoes a
    revert cut before the VDI's zvol was back under its name, serves the
    disk as it was or as reverted, and leaves nothing behind. moved: the
    snapshot is on the zvol an earlier revert (to an older one) set
    aside."""
    def setup(root):
        h = _fresh_host(root, monkeypatch)
        sr, _ = create_sr({"device": "/dev/sdb"})
        vol = create_volume(sr, size=GiB, name="disk")
        h.zfs.guest_write(dataset_of(vol), 0, MiB)
        older = snapshot_of(sr, vol)
        h.zfs.guest_write(dataset_of(vol), 2 * MiB, MiB)
        snap = snapshot_of(sr, vol)
        h.zfs.guest_write(dataset_of(vol), 4 * MiB, MiB)
        if moved:
            call("Volume.revert", sr=sr, snapshot=older["key"],
                 key=vol["key"])
            h.zfs.guest_write(dataset_of(vol), 6 * MiB, MiB)
        return h, sr, vol, snap

    def revert(sr, vol, snap):
        call("Volume.revert", sr=sr, snapshot=snap["key"], key=vol["key"])

    def held(h, vol):
        return sorted((b, t) for b, (t, d) in
                      h.zfs.dataset(dataset_of(vol)).blocks.items() if d)

    h, sr, vol, snap = setup(tmp_path / "count")
    before = held(h, vol)
    total = commands_run(h, lambda: revert(sr, vol, snap))
    after = held(h, vol)
    assert before != after
    for n in range(1, total + 1):
        h, sr, vol, snap = setup(tmp_path / str(n))
        with installed(CrashAfter(h, n)):
            with pytest.raises(Killed):
                revert(sr, vol, snap)
        full_cycle(uri_of(vol), GUEST)
        assert held(h, vol) in (before, after), n
        nothing_left(h)
