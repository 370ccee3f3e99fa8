"""Entry points: the method executables are symlinks to small scripts that
call one of these with sys.argv."""

import sys

# Imported for their @wire.method registrations: the volume plugin's table.
from zfsng import wire
from zfsng_volume import cbt, compose, labels, plugin  # noqa: F401
from zfsng_volume import probe, sr, volume  # noqa: F401


def handlers():
    """The volume plugin's dispatch table: every function its modules
    register with @wire.method (wire.SERVED["zfsng_volume"] less
    wire.UNIMPLEMENTED; tests/unit/test_dispatch.py holds it to that)."""
    return wire.handlers("zfsng_volume")


def volume_main(argv=None):
    """The volume plugin: Plugin.*, SR.* and Volume.* methods."""
    return wire.main(argv or sys.argv, wire.VOLUME_INTERFACES, handlers())
