"""Entry point: the datapath executables are symlinks to a small script
that calls datapath_main with sys.argv."""

import sys

from zfsng import wire

from zfsng_datapath import datapath, plugin


def handlers():
    table = {}
    table.update(plugin.HANDLERS)
    table.update(datapath.HANDLERS)
    return table


def datapath_main(argv=None):
    """The datapath plugin: Plugin.Query and Datapath.* methods."""
    return wire.main(argv or sys.argv, wire.DATAPATH_INTERFACES, handlers())
