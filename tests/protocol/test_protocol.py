"""Protocol tests: the installed tree, called as xapi-storage-script calls it.

These run on any host (no ZFS needed): they install with ``make install
DESTDIR=...`` and check the layout, the JSON contract and the error paths
that fail before ZFS is reached. The same calls against a real pool run in
the guest (tests/integration).
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from plugin_client import (Plugin, PluginError, VOLUME_PLUGIN,  # noqa: E402
                           check_error_object, install)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return install(str(tmp_path_factory.mktemp("root")))


@pytest.fixture(scope="module")
def plugin(root, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("run"))
    # An empty PATH for zfs/zpool: these tests must never reach ZFS.
    return Plugin(root, env={"ZFSNG_RUN_DIR": run,
                             "PATH": "/nonexistent:/usr/bin:/bin"})


def test_every_method_is_installed_as_an_executable(root, plugin):
    directory = os.path.join(root, VOLUME_PLUGIN)
    wanted = plugin.wire.SERVED["zfsng_volume"]
    assert set(m.split(".")[0] for m in wanted) == {"Plugin", "SR", "Volume"}
    for method in wanted:
        path = os.path.join(directory, method)
        assert os.path.islink(path), method
        assert os.access(path, os.X_OK), method
    # and nothing else: every executable is a declared method
    assert sorted(os.listdir(directory)) == sorted(wanted + ["volume.py"])
    site = os.path.join(root, "usr/lib/python3.6/site-packages/zfsng")
    assert os.path.isfile(os.path.join(site, "wire.py"))


def test_query_describes_the_plugin(plugin):
    query = plugin("Plugin.Query")
    assert query["plugin"] == "zfs-ng"
    assert query["required_api_version"] == "5.0"
    for key in ("device", "file-uri", "vdev", "zpool", "dataset",
                "compression", "volblocksize", "ashift", "provisioning",
                "sync", "dedup", "force", "pool-name"):
        assert key in query["configuration"], key


def test_unimplemented_method_answers_the_typed_error(plugin):
    with pytest.raises(PluginError) as err:
        plugin("Volume.compare", sr="p", key="a", key2="b")
    assert err.value.code == "SR_BACKEND_FAILURE"
    assert err.value.params == ["Unimplemented", "Volume.compare"]


@pytest.mark.parametrize("stdin,reason", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"dbg": "t"}', "missing argument 'sr'"),
    ('{"dbg": "t", "sr": 5}', "expected string"),
])
def test_bad_arguments_are_typed_errors(plugin, stdin, reason):
    proc = subprocess.run([os.path.join(plugin.dir, "SR.stat"), "--json"],
                          input=stdin.encode(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=plugin.env)
    assert proc.returncode == 1
    obj = json.loads(proc.stdout.decode())
    check_error_object(obj)
    assert obj["params"][0] == "InvalidArgument"
    assert reason in obj["params"][1]


def test_without_json_flag_prints_usage_on_stderr_only(plugin):
    rc, out, err = plugin.raw("SR.stat", {}, argv_extra=())
    assert rc == 2 and out == "" and "usage" in err


def test_lookup_ignores_case(root, plugin, tmp_path):
    link = tmp_path / "plugin.query"
    os.symlink(os.path.join(root, VOLUME_PLUGIN, "volume.py"), str(link))
    proc = subprocess.run([str(link), "--json"], input=b'{"dbg": "t"}',
                          stdout=subprocess.PIPE, env=plugin.env)
    assert json.loads(proc.stdout.decode())["plugin"] == "zfs-ng"


def test_bad_device_config_fails_before_any_command(plugin):
    with pytest.raises(PluginError) as err:
        plugin("SR.create", uuid="0b6f7c1e-8a0e-4c55-9a39-2f1f1d0f9e11",
               configuration={"device": "/dev/sdb; rm -rf /"}, name="x",
               description="")
    assert err.value.name == "InvalidConfiguration"
    assert "device-config:device" in err.value.params[1]


def test_missing_zfs_tools_is_a_typed_error_not_a_traceback(plugin):
    rc, out, err = plugin.raw("SR.stat", {"dbg": "t", "sr": "tank"})
    assert rc == 1
    obj = json.loads(out)
    assert obj["params"][0] == "ZfsError"
    assert "Traceback" not in out


def test_internal_bug_never_reaches_stdout_as_traceback(plugin):
    # A bad SR uuid reaches validation; a wrong argument type is caught by
    # the wire layer: neither may print anything but one JSON object.
    rc, out, _ = plugin.raw("SR.create", {
        "dbg": "t", "uuid": "NOT-A-UUID", "configuration": {},
        "name": "x", "description": ""})
    assert rc == 1
    assert json.loads(out)["params"][0] == "InvalidArgument"
