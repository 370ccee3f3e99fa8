# -*- coding: utf-8 -*-
"""Non-ASCII names, descriptions and keys on real OpenZFS.

The guest runs the installed executables with CPython 3.6 in the C locale,
as dom0 does (``make guest-install``): Python 3.6's standard streams are
ASCII there. xapi sends names as UTF-8 bytes; they must be stored as the
real characters (JSON text in the ZFS user property) and come back as the
same UTF-8, never as surrogate escapes.
"""

import json
import subprocess

import pytest

from conftest import sh
from datapath_util import MiB, dataset, uri

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
        interpreter = f.readline()[2:].split()     # python3.6 -S
    out = sh(*interpreter, "-c", "import sys; print(sys.version_info[:2], "
             "sys.stdin.encoding, sys.flags.no_site)", env=plugin.env)
    assert out == "(3, 6) ANSI_X3.4-1968 1\n"


def test_names_and_keys_round_trip(plugin, sr):
    stat = plugin("SR.stat", sr=sr)
    assert (stat["name"], stat["description"]) == (NAME, WIDE)
    vol = plugin("Volume.create", sr=sr, name=NAME, description=WIDE,
                 size=GiB, sharable=False)
    key = vol["key"]
    plugin("Volume.set", sr=sr, key=key, k=NAME, v=WIDE)
    plugin("Volume.set_name", sr=sr, key=key, new_name=WIDE + NAME)
    snap = plugin("Volume.snapshot", sr=sr, key=key)
    want = (WIDE + NAME, WIDE, {NAME: WIDE,
                                "content_id": vol["keys"]["content_id"]})
    for got in (plugin("Volume.stat", sr=sr, key=key),
                [v for v in plugin("SR.ls", sr=sr) if v["key"] == key][0]):
        assert (got["name"], got["description"], got["keys"]) == want
    of_snap = plugin("Volume.stat", sr=sr, key=snap["key"])
    assert of_snap["name"] == WIDE + NAME
    assert of_snap["keys"]["content_id"] not in ("", key,
                                                 vol["keys"]["content_id"])
    dataset = "%s/%s" % (sr, key)
    assert json.loads(prop(dataset, "name")) == WIDE + NAME
    assert json.loads(prop(dataset, "keys")) == {NAME: WIDE}
    assert json.loads(prop(sr, "sr-name")) == NAME
    # zfs list shows the characters themselves, not \u escapes
    assert prop(dataset, "name") == json.dumps(WIDE + NAME,
                                               ensure_ascii=False)
    assert prop(sr, "sr-name") == json.dumps(NAME, ensure_ascii=False)


# --- values an admin set by hand ---------------------------------------------
# zfs set org.xcp-ng.zfs-ng:name=Données: plain UTF-8, not zfs-ng's JSON.
# The calls that copy a VDI's properties verbatim into zfs clone -o or zfs
# create -o (the reset rotation, data_destroy's stub) pass it as an
# argument, which Python 3.6 in the C locale would encode as ASCII.

BY_HAND = u"Données"


def set_by_hand(dataset):
    sh("zfs", "set", u"org.xcp-ng.zfs-ng:name=" + BY_HAND, dataset)


def raw_name(dataset):
    """The property's bytes, as ZFS holds them."""
    return subprocess.run(
        ["zfs", "get", "-Hp", "-o", "value", "org.xcp-ng.zfs-ng:name",
         dataset], stdout=subprocess.PIPE, check=True, timeout=60).stdout


def test_a_reset_rotation_copies_a_name_set_by_hand(plugin, dp, sr):
    vol = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=16 * MiB, sharable=False)
    set_by_hand(dataset(vol))
    dp("Datapath.open", uri=uri(vol), persistent=False)      # VM start
    snap = plugin("Volume.snapshot", sr=sr, key=vol["key"])  # a backup
    dp("Datapath.close", uri=uri(vol))   # shutdown: the reset rotates
    moved = plugin("Volume.stat", sr=sr, key=snap["key"])
    assert moved["uri"] != snap["uri"]   # it did rotate
    assert raw_name(dataset(vol)) == BY_HAND.encode("utf-8") + b"\n"
    assert plugin("Volume.stat", sr=sr, key=vol["key"])["name"] == BY_HAND
    dp("Datapath.open", uri=uri(vol), persistent=False)      # starts again
    dp("Datapath.close", uri=uri(vol))


def test_data_destroy_keeps_a_name_set_by_hand(plugin, sr):
    vol = plugin("Volume.create", sr=sr, name="disk", description="",
                 size=16 * MiB, sharable=False)
    plugin("Volume.enable_cbt", sr=sr, key=vol["key"])
    snap = plugin("Volume.snapshot", sr=sr, key=vol["key"])
    set_by_hand(dataset(snap))
    plugin("Volume.data_destroy", sr=sr, key=snap["key"])
    stub = "%s/%s" % (sr, snap["key"])
    assert raw_name(stub) == BY_HAND.encode("utf-8") + b"\n"
    assert plugin("Volume.stat", sr=sr, key=snap["key"])["name"] == BY_HAND
