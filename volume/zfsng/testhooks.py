"""Test hooks: the few settings only tests may change, from the environment.

Tests need to put locks and datapath state in a scratch directory, kill the
plugin after its N-th command (crash points), record every command (the
benchmarks' trace) and shrink the time bounds. All of these come from
environment variables, and xapi-storage-script passes its own environment
to every plugin it runs: on a host, a stray variable must change nothing.
So a hook is honoured only when the installed package carries the marker
file ``TEST_HOOKS`` beside this module. ``make install TEST_HOOKS=1`` (the
test installs) writes it; the RPM never ships it (its test checks that).

The hooks:
  ZFSNG_RUN_DIR       locks and pool-state files (lock.RUN_DIR)
  ZFSNG_DATAPATH_DIR  the datapath's state files
  ZFSNG_SM_PHY_DIR    the datapath's iostat links (/dev/sm/phy)
  ZFSNG_METRICS_DIR   the SR statistics files (/dev/shm/metrics)
  ZFSNG_METRICS_PERIOD seconds between two SR statistics samples (5); 0:
                      the files and the datasource, but no writer
  ZFSNG_CRASH_AFTER   die like a killed process after the N-th command
  ZFSNG_TRACE         append one JSON line per command to this file
  ZFSNG_CMD_TIMEOUT   seconds: a lower bound for every command than
                      runner's own (never a higher one)
  ZFSNG_LOCK_WAIT     seconds: a lower bound for lock waits (lock.WAIT)
  ZFSNG_KILL_GRACE    seconds: a lower wait for a killed command to go
                      (runner.KILL_GRACE)
  ZFSNG_SMALL_BLOCKS_ANY_ARC  any value: SR.create takes blocks under 16K
                      on OpenZFS 2.1 whatever the ARC's floor (the
                      benchmarks that measure what the refusal avoids)
"""

import os

MARKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "TEST_HOOKS")


def enabled():
    return os.path.exists(MARKER)


def get(name, default=None):
    """The hook's value, or default when hooks are off or it is unset."""
    if not name.startswith("ZFSNG_") or not enabled():
        return default
    value = os.environ.get(name)
    return default if value in (None, "") else value


def seconds(name, default):
    """A bound from a hook: only ever lower than the default."""
    try:
        value = float(get(name, default))
    except ValueError:
        return default
    return value if 0 < value < default else default
