"""Entry point: the datapath executables are symlinks to a small script
that calls datapath_main with sys.argv."""

import sys

from zfsng import wire

# The module whose @wire.method functions implement each method; a call
# imports its own only (see zfsng_volume.main.MODULES).
MODULES = {
    "plugin": ["Plugin.Query"],
    "datapath": ["Datapath.activate", "Datapath.activate_readonly",
                 "Datapath.attach", "Datapath.close", "Datapath.deactivate",
                 "Datapath.detach", "Datapath.open"],
    "mirrorin": ["Datapath.import_activate"],
    "mirror": ["Data.mirror", "Data.stat"],
}


def handlers():
    """The datapath plugin's whole dispatch table: every function its
    modules register with @wire.method (wire.SERVED["zfsng_datapath"];
    tests/unit/test_dispatch.py holds it to that)."""
    for module in MODULES:
        __import__("zfsng_datapath." + module)
    return wire.handlers("zfsng_datapath")


def handlers_for(method):
    """The dispatch table one call of method needs: its module loaded."""
    return wire.load_handlers("zfsng_datapath", MODULES, method)


def datapath_main(argv=None):
    """The datapath plugin: Plugin.Query, Datapath.* and Data.* methods."""
    return wire.main(argv or sys.argv, wire.DATAPATH_INTERFACES,
                     handlers_for)
