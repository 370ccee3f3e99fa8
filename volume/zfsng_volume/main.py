"""Entry points: the method executables are symlinks to small scripts that
call one of these with sys.argv."""

import sys

from zfsng import wire

# The module whose @wire.method functions implement each method. A call
# imports its own module only (and what that one imports): every xapi call
# starts a new interpreter, and the modules a call does not use would cost
# it their loading each time. tests/unit/test_dispatch.py holds this table
# to the registrations.
MODULES = {
    "plugin": ["Plugin.Query", "Plugin.diagnostics", "Plugin.ls"],
    "sr": ["SR.attach", "SR.create", "SR.destroy", "SR.detach", "SR.ls",
           "SR.set_description", "SR.set_name", "SR.stat"],
    "probe": ["SR.probe"],
    "volume": ["Volume.clone", "Volume.create", "Volume.destroy",
               "Volume.resize", "Volume.snapshot", "Volume.stat"],
    "labels": ["Volume.set", "Volume.set_description", "Volume.set_name",
               "Volume.unset"],
    "cbt": ["Volume.data_destroy", "Volume.disable_cbt", "Volume.enable_cbt",
            "Volume.list_changed_blocks"],
    "compose": ["Volume.compose"],
    "revert": ["Volume.revert"],
}


def handlers():
    """The volume plugin's whole dispatch table: every function its modules
    register with @wire.method (wire.SERVED["zfsng_volume"] less
    wire.UNIMPLEMENTED; tests/unit/test_dispatch.py holds it to that)."""
    for module in MODULES:
        __import__("zfsng_volume." + module)
    return wire.handlers("zfsng_volume")


def handlers_for(method):
    """The dispatch table one call of method needs: its module loaded."""
    return wire.load_handlers("zfsng_volume", MODULES, method)


def volume_main(argv=None):
    """The volume plugin: Plugin.*, SR.* and Volume.* methods."""
    return wire.main(argv or sys.argv, wire.VOLUME_INTERFACES, handlers_for)
