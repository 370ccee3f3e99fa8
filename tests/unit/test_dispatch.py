"""One declaration per method: wire.METHODS and wire.SERVED name what each
plugin serves; @wire.method ties each function to its method; the entry
points' tables and `make install`'s executables follow from them.

A served method with no function and not declared in wire.UNIMPLEMENTED
fails here: without this test it would only answer Unimplemented at run
time.
"""

import os
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
