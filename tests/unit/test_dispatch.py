"""One declaration per method: wire.METHODS and wire.SERVED name what each
plugin serves; @wire.method ties each function to its method; the entry
points' tables and `make install`'s executables follow from them.

A served method with no function and not declared in wire.UNIMPLEMENTED
fails here: without this test it would only answer Unimplemented at run
time.
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "datapath"))

from zfsng import wire  # noqa: E402
from zfsng_volume import main as volmain, plugin  # noqa: E402
from zfsng_datapath import main as dpmain  # noqa: E402
from zfsng_datapath import plugin as dpplugin  # noqa: E402

# package -> (its entry point's table, the interfaces it resolves names in)
PLUGINS = {
    "zfsng_volume": (volmain.handlers, wire.VOLUME_INTERFACES),
    "zfsng_datapath": (dpmain.handlers, wire.DATAPATH_INTERFACES),
}


def test_the_declaration_names_both_plugins():
    assert sorted(wire.SERVED) == sorted(PLUGINS)


@pytest.mark.parametrize("package", sorted(PLUGINS))
def test_every_served_method_is_implemented_or_declared_unimplemented(
        package):
    table, _ = PLUGINS[package]
    implemented = set(table())
    served = set(wire.SERVED[package])
    missing = served - implemented - wire.UNIMPLEMENTED
    assert not missing, "%s: no @wire.method function for %s" % (
        package, sorted(missing))
    assert not implemented & wire.UNIMPLEMENTED, \
        "implemented yet declared in wire.UNIMPLEMENTED"
    assert not implemented - served, "implemented but not in wire.SERVED"


@pytest.mark.parametrize("package", sorted(PLUGINS))
def test_served_methods_are_declared_once_in_the_plugins_interfaces(package):
    _, interfaces = PLUGINS[package]
    served = wire.SERVED[package]
    assert len(served) == len(set(served))
    for name in served:
        assert name in wire.METHODS, name
        assert wire.resolve_method(name, interfaces) == name


def test_what_is_served_and_installed():
    """The executables `make install` makes: every declared method of the
    volume plugin's interfaces; for the datapath, Plugin.Query and every
    Datapath and Data method (xapi calls no other Plugin method on a
    datapath)."""
    assert wire.SERVED["zfsng_volume"] == wire.methods_of(wire.VOLUME_INTERFACES)
    assert wire.SERVED["zfsng_datapath"] == \
        ["Plugin.Query"] + wire.methods_of(("Datapath", "Data"))
    assert "Volume.clone" in wire.SERVED["zfsng_volume"]
    assert "Datapath.attach" in wire.SERVED["zfsng_datapath"]
    assert {"Data.mirror", "Data.stat"} <= set(wire.SERVED["zfsng_datapath"])
    assert wire.UNIMPLEMENTED <= set(wire.SERVED["zfsng_volume"])


def test_each_plugin_answers_plugin_query_with_its_own_function():
    assert volmain.handlers()["Plugin.Query"] is plugin.query
    assert dpmain.handlers()["Plugin.Query"] is dpplugin.query


ENTRY = {"zfsng_volume": volmain, "zfsng_datapath": dpmain}


@pytest.mark.parametrize("package", sorted(PLUGINS))
def test_the_entry_points_table_names_each_methods_own_module(package):
    """MODULES (which module a call loads) is what the modules register:
    each implemented method under the module of its function, once."""
    modules = ENTRY[package].MODULES
    listed = [(name, module) for module, names in modules.items()
              for name in names]
    assert len(listed) == len(set(name for name, _ in listed))
    registered = PLUGINS[package][0]()
    assert dict(listed) == dict(
        (name, function.__module__.split(".", 1)[1])
        for name, function in registered.items())


@pytest.mark.parametrize("package, method, loaded, not_loaded", [
    ("zfsng_volume", "Plugin.Query", "plugin", ["sr", "volume", "cbt"]),
    ("zfsng_volume", "Volume.stat", "volume", ["sr", "cbt", "compose"]),
    ("zfsng_volume", "SR.stat", "sr", ["cbt", "compose", "probe"]),
    ("zfsng_datapath", "Data.stat", "mirror", ["datapath", "mirrorin"]),
    # the datapath checks a migration's leaf (mirrorin) and a mirror's
    # end (mirror's job files), never loading the job or its relay
    ("zfsng_datapath", "Datapath.attach", "datapath",
     ["mirrorjob", "relay"]),
])
def test_a_call_loads_its_own_module_only(package, method, loaded,
                                          not_loaded):
    """In a new interpreter, as every xapi call starts: the entry point
    loads the method's module, not the others (start-up is paid by every
    call)."""
    module, modules = _loads(package, method)
    assert module == "%s.%s" % (package, loaded)
    for other in not_loaded:
        assert "%s.%s" % (package, other) not in modules


@pytest.mark.parametrize("package, method", [
    ("zfsng_volume", "SR.attach"), ("zfsng_volume", "SR.stat"),
    ("zfsng_volume", "Volume.create"), ("zfsng_volume", "Volume.stat"),
    ("zfsng_datapath", "Datapath.activate"),
])
def test_the_common_calls_load_no_send_stream_parser_and_no_hashlib(
        package, method):
    """Only CBT, compose and a mirror read a send stream, and only content
    ids hash: under emulation each module a call loads costs it tens of
    milliseconds, and hashlib without OpenSSL loads six extensions."""
    _, modules = _loads(package, method)
    for heavy in ("zfsng.sendstream", "zfsng.blockmap", "hashlib"):
        assert heavy not in modules


@pytest.mark.parametrize("method", [
    "Datapath.attach", "Datapath.activate", "Datapath.deactivate",
    "Datapath.detach", "Datapath.open", "Datapath.close",
])
def test_the_datapath_calls_load_no_nbd_client(method):
    """Only a mirror's start and its job speak NBD: the other Datapath
    calls need no sockets nor URL parsing (each module a call loads costs
    it tens of milliseconds under emulation)."""
    _, modules = _loads("zfsng_datapath", method)
    for heavy in ("zfsng_datapath.nbd", "socket", "urllib.parse"):
        assert heavy not in modules


def _loads(package, method):
    """(the module of method's function, every module loaded) in a new
    interpreter after the entry point's dispatch for method."""
    code = ("import sys\nfrom %s import main\ntable = main.handlers_for(%r)"
            "\nprint(table[%r].__module__)\n"
            "print(' '.join(sorted(sys.modules)))" % (package, method,
                                                      method))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(TOP, "volume"), os.path.join(TOP, "datapath")]))
    out = subprocess.check_output([sys.executable, "-S", "-c", code],
                                  env=env,
                                  universal_newlines=True).splitlines()
    return out[0], out[1].split()


def test_an_installed_entry_point_needs_no_site_module(tmp_path):
    """make install writes the interpreter with -S and the directory the
    package went to into each entry script: a call then runs without the
    site module's start-up and without PYTHONPATH."""
    prefix = str(tmp_path / "usr")
    subprocess.check_call(["make", "-s", "--no-print-directory", "-C", TOP,
                           "install", "PREFIX=" + prefix,
                           "PLUGIN_PYTHON=" + sys.executable])
    env = dict((k, v) for k, v in os.environ.items() if k != "PYTHONPATH")
    for tree, script in [("volume/org.xen.xapi.storage.zfs-ng", "volume.py"),
                         ("datapath/zfs-ng", "datapath.py")]:
        here = os.path.join(prefix, "libexec/xapi-storage-script", tree)
        with open(os.path.join(here, script)) as f:
            assert f.readline() == "#!%s -S\n" % sys.executable
        proc = subprocess.run([os.path.join(here, "Plugin.Query"), "--json"],
                              input=b'{"dbg": "t"}', stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env, cwd="/")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.decode())["required_api_version"] == \
            "5.0"


def test_the_plugin_trees_hold_only_the_entry_scripts():
    for tree, script in [("plugins/volume/org.xen.xapi.storage.zfs-ng",
                          "volume.py"),
                         ("plugins/datapath/zfs-ng", "datapath.py")]:
        assert os.listdir(os.path.join(TOP, tree)) == [script]


# --- the decorator ----------------------------------------------------------

@pytest.fixture
def registry(monkeypatch):
    """A scratch registry: these tests register functions of their own."""
    monkeypatch.setattr(wire, "_IMPLEMENTATIONS", {})


def _function(module):
    def handler(dbg):
        return None
    handler.__module__ = module
    return handler


def test_registration_returns_the_function_and_fills_the_table(registry):
    handler = _function("somepkg.mod")
    assert wire.method("SR.stat")(handler) is handler
    assert wire.handlers("somepkg") == {"SR.stat": handler}
    assert wire.handlers("otherpkg") == {}


@pytest.mark.parametrize("name", ["SR.frobnicate", "sr.stat", "Volume", ""])
def test_an_undeclared_name_is_refused(registry, name):
    with pytest.raises(ValueError) as err:
        wire.method(name)
    assert "not a declared method" in str(err.value)


def test_a_method_registered_twice_in_one_package_is_refused(registry):
    wire.method("Volume.clone")(_function("somepkg.a"))
    with pytest.raises(ValueError) as err:
        wire.method("Volume.clone")(_function("somepkg.b"))
    assert "registered twice" in str(err.value)
    # Another plugin's package may implement the same method.
    wire.method("Volume.clone")(_function("otherpkg.a"))
