"""Entry points: the method executables are symlinks to small scripts that
call one of these with sys.argv."""

import sys

from zfsng import plugin, sr, volume, wire


def volume_main(argv=None):
    """The volume plugin: Plugin.*, SR.* and Volume.* methods."""
    handlers = {}
    for module in (plugin, sr, volume):
        handlers.update(module.HANDLERS)
    return wire.main(argv or sys.argv, wire.VOLUME_INTERFACES, handlers)
