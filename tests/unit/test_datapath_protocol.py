"""The installed datapath tree, called as xapi-storage-script calls it.

``make install DESTDIR=...`` then ``<root>/datapath/zfs-ng/<method> --json``
with the arguments on stdin: layout, JSON contract, typed errors for calls
that fail before any command runs (an empty PATH: nothing may run).
"""

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from plugin_client import Plugin, PluginError, install  # noqa: E402

DATAPATH_PLUGIN = "usr/libexec/xapi-storage-script/datapath/zfs-ng"
URI = ("zfs-ng:///tank/3f1d0c1e-7a52-4e3b-9c55-0a9e1d2b7c61")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return install(str(tmp_path_factory.mktemp("root")))


@pytest.fixture(scope="module")
def dpplugin(root, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("run"))
    return Plugin(root, plugin_dir=DATAPATH_PLUGIN,
                  env={"ZFSNG_RUN_DIR": run, "ZFSNG_DATAPATH_DIR": run,
                       "PATH": "/nonexistent"})


def test_layout(root, dpplugin):
    directory = os.path.join(root, DATAPATH_PLUGIN)
    names = sorted(os.listdir(directory))
    methods = [m for m in dpplugin.wire.methods_of(
        dpplugin.wire.DATAPATH_INTERFACES) if m.startswith("Data")]
    assert names == sorted(["datapath.py", "Plugin.Query"] + methods)
    for name in names:
        path = os.path.join(directory, name)
        assert os.access(path, os.X_OK), name
        if name != "datapath.py":
            assert os.readlink(path) == "datapath.py"
    site = os.path.join(root, "usr/lib/python3.6/site-packages")
    assert os.path.isfile(os.path.join(site, "zfsng_datapath",
                                       "datapath.py"))
    assert os.path.isfile(os.path.join(site, "zfsng", "wire.py"))


def test_query(dpplugin):
    query = dpplugin("Plugin.Query")
    assert query["plugin"] == "zfs-ng"
    assert query["features"] == ["NONPERSISTENT", "VDI_MIRROR_IN"]


@pytest.mark.parametrize("method,args", [
    ("Datapath.attach", {"uri": "tapdisk:///x", "domain": "1"}),
    ("Datapath.activate", {"uri": URI, "domain": "a b"}),
    ("Datapath.open", {"uri": URI + "@zfsng-nonpersistent",
                       "persistent": False}),
    ("Datapath.close", {"uri": 5}),
])
def test_bad_arguments_are_typed_errors(dpplugin, method, args):
    with pytest.raises(PluginError) as err:
        dpplugin(method, **args)
    assert err.value.code == "SR_BACKEND_FAILURE"
    assert err.value.name == "InvalidArgument"


def test_activate_before_attach(dpplugin):
    with pytest.raises(PluginError) as err:
        dpplugin("Datapath.activate", uri=URI, domain="3")
    assert err.value.name == "NotAttached"


def test_detach_and_deactivate_of_nothing_print_null(dpplugin):
    for method in ("Datapath.deactivate", "Datapath.detach"):
        rc, out, err = dpplugin.raw(method, {"dbg": "t", "uri": URI,
                                             "domain": "u0_vbd_0_xvda"})
        assert (rc, json.loads(out)) == (0, None), err


def test_unimplemented_plugin_methods_are_not_installed(root):
    directory = os.path.join(root, DATAPATH_PLUGIN)
    assert not os.path.exists(os.path.join(directory, "Plugin.diagnostics"))
