# -*- coding: utf-8 -*-
"""Non-ASCII names on dom0's real interpreter: CPython 3.6 in the C locale.

XCP-ng 8.3 runs the plugin with Python 3.6, and xapi-storage-script's
environment has the C locale: there Python's stdin, stdout and stderr are
ASCII (3.7+ coerce the C locale to UTF-8, so a test on a newer Python
cannot see this). xapi writes names and keys as UTF-8 bytes, and reads
UTF-8 back. These tests install the plugin with its executables run by
CPython 3.6 (``tests/guest/python36.sh``), call them with LC_ALL=C and no
LANG or PYTHONIOENCODING, and check that names, descriptions and keys come
back byte for byte. ZFS is fakezfs behind real ``zfs``/``zpool`` programs
on PATH (``fakezfs_cmd``).
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import fakezfs_cmd  # noqa: E402
from plugin_client import Plugin, install  # noqa: E402

SR_UUID = "5d0a2f4e-3b1c-4e6f-9a8b-7c6d5e4f3a2b"
NAME = u"Données ✓ 日本"
WIDE = u"\U0001f4be disque"          # outside the BMP
GiB = 1024 ** 3
# what must not be set for the C locale to be the one Python 3.6 sees
LOCALE_VARS = ("LANG", "LANGUAGE", "LC_CTYPE", "LC_ALL", "LC_MESSAGES",
               "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONCOERCECLOCALE")


def python36():
    """dom0's interpreter: CPython 3.6 (the guest tests use the same)."""
    prefix = subprocess.check_output(
        ["bash", os.path.join(TOP, "tests", "guest", "python36.sh")])
    return os.path.join(prefix.decode().strip(), "bin", "python3.6")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(plugin, state file): the installed plugin run by CPython 3.6 in the
    C locale, on a fake host with an imported pool "tank" (the SR adopts
    it: what is tested here is the wire, not pool creation)."""
    root = install(str(tmp_path_factory.mktemp("root")), python=python36())
    bin_dir = str(tmp_path_factory.mktemp("bin"))
    state = os.path.join(bin_dir, "host.pickle")
    host = fakezfs_cmd.install(bin_dir, state)
    host.add_disk("/dev/sdb")
    host.admin("zpool create -m none tank /dev/sdb")
    fakezfs_cmd.save(host, state)
    # the SR's statistics file where the hooks say, and no writer: never
    # the host's own /dev/shm/metrics
    plugin = Plugin(root, env={
        "ZFSNG_RUN_DIR": str(tmp_path_factory.mktemp("run")),
        "ZFSNG_METRICS_DIR": str(tmp_path_factory.mktemp("metrics")),
        "ZFSNG_METRICS_PERIOD": "0",
        "PATH": bin_dir + ":/usr/bin:/bin"})
    for var in LOCALE_VARS:
        plugin.env.pop(var, None)
    plugin.env["LC_ALL"] = "C"
    return plugin, state


@pytest.fixture(scope="module")
def sr(world):
    plugin, _ = world
    config = plugin("SR.create", uuid=SR_UUID,
                    configuration={"zpool": "tank"},
                    name=NAME + " SR", description=WIDE)
    return plugin("SR.attach", configuration=config)


def test_the_executables_really_run_python36_in_the_c_locale(world):
    plugin, _ = world
    script = os.path.join(plugin.dir, "volume.py")
    with open(script) as f:
        interpreter = f.readline()[2:].split()     # python3.6 -S
    code = ("import sys; print(sys.version_info[:2], sys.stdin.encoding, "
            "sys.flags.no_site)")
    out = subprocess.check_output(interpreter + ["-c", code], env=plugin.env)
    assert out.decode() == "(3, 6) ANSI_X3.4-1968 1\n"   # ASCII stdin


def test_the_sr_statistics_file_stays_in_the_test_directory(world, sr):
    plugin, _ = world
    made = os.listdir(plugin.env["ZFSNG_METRICS_DIR"])
    assert made == ["zfs-ng-" + SR_UUID]


def test_sr_name_and_description_round_trip(world, sr):
    plugin, _ = world
    stat = plugin("SR.stat", sr=sr)
    assert (stat["name"], stat["description"]) == (NAME + " SR", WIDE)


def test_a_snapshot_as_xapi_makes_it_has_a_content_id_of_its_own(world,
                                                                  sr):
    """main.ml's VDI.snapshot: Volume.snapshot, then Volume.set of
    content_id to the source's key; the snapshot reports neither that
    key, nor "", nor its source's id (xapi's copies pick a base by it)."""
    plugin, _ = world
    vol = plugin("Volume.create", sr=sr, name=NAME, description="",
                 size=GiB, sharable=False)
    snap = plugin("Volume.snapshot", sr=sr, key=vol["key"])
    plugin("Volume.set", sr=sr, key=snap["key"], k="content_id",
           v=vol["key"])
    got = dict((v["key"], v["keys"]["content_id"])
               for v in plugin("SR.ls", sr=sr))
    assert got[snap["key"]] not in ("", vol["key"], got[vol["key"]])
    assert got[vol["key"]] == vol["keys"]["content_id"] != ""


def test_volume_names_and_keys_round_trip(world, sr):
    plugin, state = world
    vol = plugin("Volume.create", sr=sr, name=NAME, description=WIDE,
                 size=GiB, sharable=False)
    assert (vol["name"], vol["description"]) == (NAME, WIDE)
    key = vol["key"]
    assert plugin("Volume.stat", sr=sr, key=key)["name"] == NAME

    plugin("Volume.set_name", sr=sr, key=key, new_name=WIDE + NAME)
    plugin("Volume.set_description", sr=sr, key=key, new_description=NAME)
    plugin("Volume.set", sr=sr, key=key, k=NAME, v=WIDE)
    plugin("Volume.set", sr=sr, key=key, k="ascii", v=NAME)
    plugin("Volume.unset", sr=sr, key=key, k="ascii")

    want = (WIDE + NAME, NAME, {NAME: WIDE, "content_id": vol["keys"][
        "content_id"]})
    stat = plugin("Volume.stat", sr=sr, key=key)
    assert (stat["name"], stat["description"], stat["keys"]) == want
    [listed] = [v for v in plugin("SR.ls", sr=sr) if v["key"] == key]
    assert (listed["name"], listed["description"], listed["keys"]) == want

    # on the pool: JSON text of the real characters, never surrogates
    host = fakezfs_cmd.load(state)
    dataset = "%s/%s" % (sr, key)
    assert json.loads(host.get(dataset, "org.xcp-ng.zfs-ng:name")) == \
        WIDE + NAME
    assert json.loads(host.get(dataset, "org.xcp-ng.zfs-ng:keys")) == \
        {NAME: WIDE}


def test_results_are_utf8_bytes_as_xapi_writes_them(world, sr):
    plugin, _ = world
    rc, out, err = plugin.raw("SR.stat", {"dbg": NAME, "sr": sr,
                                          NAME: "an argument xapi added"})
    assert rc == 0
    assert (NAME + " SR") in out         # raw UTF-8, not \u escapes
    assert "Traceback" not in err


def test_non_ascii_errors_and_log_lines_are_utf8(world, sr):
    plugin, _ = world
    rc, out, err = plugin.raw("Volume.stat", {"dbg": NAME, "sr": sr,
                                              "key": NAME})
    assert rc == 1
    assert json.loads(out)["params"] == ["Volume_does_not_exist", NAME]
    assert NAME in err                   # the SMlog line on stderr
    assert "Traceback" not in err
