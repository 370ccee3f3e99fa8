"""Entry point: the datapath executables are symlinks to a small script
that calls datapath_main with sys.argv."""

import sys

from zfsng import wire

# Imported for their @wire.method registrations: the datapath plugin's table.
from zfsng_datapath import datapath, mirror, mirrorin, plugin  # noqa: F401


def handlers():
    """The datapath plugin's dispatch table: every function that plugin and
    datapath register with @wire.method (wire.SERVED["zfsng_datapath"];
    tests/unit/test_dispatch.py holds it to that)."""
    return wire.handlers("zfsng_datapath")


def datapath_main(argv=None):
    """The datapath plugin: Plugin.Query, Datapath.* and Data.* methods."""
    return wire.main(argv or sys.argv, wire.DATAPATH_INTERFACES, handlers())
