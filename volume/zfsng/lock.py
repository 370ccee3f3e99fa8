"""Locking: xapi-storage-script runs plugin calls concurrently.

One lock file per SR (and one global lock for pool-level work: creating,
probing, importing and destroying pools, where the "SR" does not exist yet).
``flock`` locks vanish with the process, so a crashed call never leaves a
stale lock behind. Critical sections are kept short: a call takes the lock
around its ZFS commands, not around the interpreter start-up.
"""

import contextlib
import fcntl
import os
import time

from zfsng import log

RUN_DIR = os.environ.get("ZFSNG_RUN_DIR", "/run/nonpersistent/zfs-ng")
SLOW_WAIT = 5.0  # seconds: log when a lock took longer than this to get


def _path(name):
    safe = "".join(c if c.isalnum() or c in "-_." else "%%%02x" % ord(c)
                   for c in name)
    return os.path.join(RUN_DIR, "%s.lock" % safe)


@contextlib.contextmanager
def held(name):
    """Hold the exclusive lock called name for the with-block."""
    os.makedirs(RUN_DIR, 0o700, exist_ok=True)
    start = time.time()
    fd = os.open(_path(name), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        waited = time.time() - start
        if waited > SLOW_WAIT:
            log.info("waited %.1fs for lock %s", waited, name)
        yield
    finally:
        os.close(fd)


def sr_lock(sr):
    return held("sr-" + sr)


def global_lock():
    return held("pools")
