"""Fixtures for the unit tests.

The ZFS layer is faked at one seam only: the command runner. ``fake``
installs a ``fakezfs.FakeZfs`` with ``runner.set_runner``; every other test
gets a runner that fails loudly, so no unit test can ever run a real zfs,
zpool, lsblk or wipefs on the machine running the tests. Locks go to the
test session's own directory.

Handlers are called as the wire calls them: ``call("SR.create", uuid=...,
...)`` goes through ``wire.call`` with ``dbg`` first, so arguments and
results are type-checked against the v5 interface on every call.
"""

import json
import os
import struct
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
VOLUME_DIR = os.path.abspath(os.path.join(HERE, os.pardir, os.pardir,
                                          "volume"))
# The repository's zfsng, unless PYTHONPATH names another one on purpose.
if not [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if p and os.path.isdir(os.path.join(p, "zfsng"))]:
    sys.path.insert(0, VOLUME_DIR)

from zfsng import abandoned, arc, attachstate, hostid, lock, runner, \
    wire  # noqa: E402
from zfsng_volume import alert, cleanup, main, srmetrics  # noqa: E402

import fakezfs  # noqa: E402

GiB = fakezfs.GiB
SR_UUID = "3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61"
SR_UUID2 = "b7e4a9d2-1c3f-4d5e-8f60-718293a4b5c6"
PROGRAMS = fakezfs.PROGRAMS + (fakezfs.PYTHON,)


def _refuse(argv, stdin_text=None):
    raise AssertionError("a unit test ran a real command: %r" % (argv,))


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("run"))


@pytest.fixture
def writers():
    """The SR statistics writers SR.attach and SR.stat started (argv)."""
    return []


@pytest.fixture(autouse=True)
def isolated(run_dir, monkeypatch, tmp_path, writers):
    """No real command; locks in the session's own directory, SR.destroy's
    saved clean-up plans, records of failed calls and the datapath's
    records in the test's own;
    SR statistics files in the test's own, their writers never started."""
    monkeypatch.setattr(lock, "RUN_DIR", run_dir)
    monkeypatch.setattr(cleanup, "PLAN_DIR", str(tmp_path / "destroy"))
    monkeypatch.setattr(abandoned, "DIR", str(tmp_path / "abandoned"))
    monkeypatch.setattr(attachstate, "RUN_DIR", str(tmp_path / "dpstate"))
    monkeypatch.setattr(alert, "XE", os.path.join(run_dir, "no-xe"))
    monkeypatch.setattr(srmetrics, "DIR", str(tmp_path / "metrics"))
    monkeypatch.setattr(srmetrics, "_spawn", writers.append)
    # This host's ZFS hostid, as zgenhostid writes it (multihost needs one)
    hostid_file = os.path.join(run_dir, "hostid")
    with open(hostid_file, "wb") as f:
        f.write(struct.pack("=I", 0x5eed1d05))
    monkeypatch.setattr(hostid, "HOSTID_FILE", hostid_file)
    monkeypatch.setattr(hostid, "SPL_PARAM", os.path.join(run_dir, "no-spl"))
    # No ARC floor unless a test writes one (arcstats_floor)
    monkeypatch.setattr(arc, "ARCSTATS", str(tmp_path / "arcstats"))
    old = runner.set_runner(_refuse)
    yield
    runner.set_runner(old)


def arcstats_floor(mib):
    """Give the module's arcstats a floor (c_min) of mib MiB, as the
    kernel prints it among other rows."""
    with open(arc.ARCSTATS, "w") as f:
        f.write("13 1 0x01 147 39984 1 2\nname type data\n"
                "c 4 %d\nc_min 4 %d\nc_max 4 %d\n"
                % (mib << 21, mib << 20, mib << 22))


def assert_argv_lists(calls, programs):
    """Every command ran as an argv list, never through a shell: a bare
    program name from programs first, and after "--", where only names
    belong, no word that looks like an option."""
    for argv in calls:
        assert argv[0] in programs, argv
        if "--" in argv:
            after = argv[argv.index("--") + 1:]
            assert not [a for a in after if a.startswith("-")], argv


def check_fake_host(host):
    """The checks the ``fake`` fixture makes when its test ends, for the
    tests that make hosts of their own: only argv forms the fake knows
    (any other would pass untested), and argv lists only."""
    assert not host.unknown, "argv forms the fake does not know: %r" % (
        host.unknown,)
    assert_argv_lists(host.calls, PROGRAMS)


@pytest.fixture
def fake():
    """A FakeZfs host with four blank 10 GiB disks /dev/sdb../dev/sde."""
    host = fakezfs.FakeZfs.with_disks()
    old = runner.set_runner(host)
    yield host
    runner.set_runner(old)
    check_fake_host(host)


RECORDING_XE = """#!/bin/sh
# one line per message: the arguments, tab-separated
(IFS='\t'; printf '%%s\\n' "$*") >> %(log)s
echo "junk on stdout"; echo "junk on stderr" >&2
"""


@pytest.fixture
def xe(tmp_path, monkeypatch):
    """A recording fake xe, a fresh run dir; returns messages(count)."""
    monkeypatch.setattr(lock, "RUN_DIR", str(tmp_path / "run"))
    log = tmp_path / "xe.log"
    script = tmp_path / "xe"
    script.write_text(RECORDING_XE % {"log": log})
    script.chmod(0o755)
    monkeypatch.setattr(alert, "XE", str(script))

    def messages(count, wait=10.0):
        """The messages once count have arrived (xe runs in the
        background), checking a moment longer that no other comes."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            lines = log.read_text().splitlines() if log.exists() else []
            if len(lines) >= count:
                break
            time.sleep(0.02)
        time.sleep(0.2)
        lines = log.read_text().splitlines() if log.exists() else []
        return [dict(arg.split("=", 1) for arg in line.split("\t")[1:])
                for line in lines]
    return messages


def handlers():
    """The volume plugin's dispatch table, as its executables build it."""
    return main.handlers()


def call(method, **args):
    """Run a method as xapi-storage-script would reach it (checked), and
    return its result as xapi reads it: the JSON the wire writes. An
    SR.attach is followed by SR.stat of its answer, as the daemon's
    sr_attach_impl does before it records the SR as attached: a stat that
    fails fails the attach."""
    result = _call(method, args)
    if method == "SR.attach":
        _call("SR.stat", {"dbg": args.get("dbg"), "sr": result})
    return result


def _call(method, args):
    args = dict(args)
    if args.get("dbg") is None:
        args["dbg"] = "unit-test"
    result = wire.call(method, args, handlers())
    return json.loads(b"".join(wire.dump(result)).decode("utf-8"))


def create_sr(config=None, uuid=SR_UUID, name="tank", description=""):
    """SR.create, then SR.attach with what create returned: (sr, config).
    The default device-config is device=/dev/sdb."""
    stored = call("SR.create", uuid=uuid,
                  configuration=dict(config or {"device": "/dev/sdb"}),
                  name=name, description=description)
    return call("SR.attach", configuration=stored), stored


def create_volume(sr_name, size=GiB, name="disk", description="",
                  sharable=False):
    return call("Volume.create", sr=sr_name, name=name,
                description=description, size=size, sharable=sharable)


def plain_keys(keys):
    """A volume's keys without its content_id, which every VDI reports,
    never "" (zfsng/contentid.py): for tests about the other keys."""
    assert keys["content_id"]
    return dict((k, v) for k, v in keys.items() if k != "content_id")
