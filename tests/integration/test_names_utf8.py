# -*- coding: utf-8 -*-
"""Non-ASCII names, descriptions and keys on real OpenZFS.

The guest runs the installed executables with CPython 3.6 in the C locale,
as dom0 does (``make guest-install``): Python 3.6's standard streams are
ASCII there. xapi sends names as UTF-8 bytes; they must be stored as the
real characters (JSON text in the ZFS user property) and come back as the
same UTF-8, never as surrogate escapes.
"""

import json

import pytest

from conftest import sh

NAME = u"Données ✓ 日本"
WIDE = u"\U0001f4be disque"      # outside the BMP
GiB = 1 << 30


@pytest.fixture
def sr(plugin, disks, new_uuid):
    stored = plugin("SR.create", uuid=new_uuid(), name=NAME,
                    description=WIDE, configuration={"device": disks[0]})
    sr = plugin("SR.attach", configuration=stored)
    yield sr
    sh("zpool", "destroy", "-f", sr.split("/")[0], check=False)


def prop(dataset, name):
    return sh("zfs", "get", "-Hp", "-o", "value",
              "org.xcp-ng.zfs-ng:" + name, dataset)[:-1]


def test_the_plugin_runs_python36_in_the_c_locale(plugin):
    with open(plugin.dir + "/volume.py") as f:
        interpreter = f.readline()[2:].strip()
    out = sh(interpreter, "-c", "import sys; print(sys.version_info[:2], "
             "sys.stdin.encoding)", env=plugin.env)
    assert out == "(3, 6) ANSI_X3.4-1968\n"


def test_names_and_keys_round_trip(plugin, sr):
    stat = plugin("SR.stat", sr=sr)
    assert (stat["name"], stat["description"]) == (NAME, WIDE)
    vol = plugin("Volume.create", sr=sr, name=NAME, description=WIDE,
                 size=GiB, sharable=False)
    key = vol["key"]
    plugin("Volume.set", sr=sr, key=key, k=NAME, v=WIDE)
    plugin("Volume.set_name", sr=sr, key=key, new_name=WIDE + NAME)
    snap = plugin("Volume.snapshot", sr=sr, key=key)
    want = (WIDE + NAME, WIDE, {NAME: WIDE})
    for got in (plugin("Volume.stat", sr=sr, key=key),
                [v for v in plugin("SR.ls", sr=sr) if v["key"] == key][0]):
        assert (got["name"], got["description"], got["keys"]) == want
    assert plugin("Volume.stat", sr=sr, key=snap["key"])["name"] == \
        WIDE + NAME
    dataset = "%s/%s" % (sr, key)
    assert json.loads(prop(dataset, "name")) == WIDE + NAME
    assert json.loads(prop(dataset, "keys")) == {NAME: WIDE}
    assert json.loads(prop(sr, "sr-name")) == NAME
