"""Locking: xapi-storage-script runs plugin calls concurrently.

One lock file per SR (and one global lock for pool-level work: creating,
probing, importing and destroying pools, where the "SR" does not exist yet).
``flock`` locks vanish with the process, so a crashed call never leaves a
stale lock behind. Critical sections are kept short: a call takes the lock
around its ZFS commands, not around the interpreter start-up.

Waits are bounded: a call waits at most WAIT seconds (and never past its
own deadline, ``runner.remaining``) and then fails with ``SrBusy``, so a
call stuck on a suspended pool does not queue every later call forever.
Holders are bounded too (every command and every call has a deadline), so
the lock is always released in the end.

Order: the global lock (pool-level work) is taken before an SR lock, and a
datapath call takes its per-VDI lock before the SR lock; never the other
way round.
"""

import contextlib
import errno
import fcntl
import os
import time

from zfsng import errors, log, runfiles, runner, testhooks

RUN_DIR = testhooks.get("ZFSNG_RUN_DIR", "/run/nonpersistent/zfs-ng")
SLOW_WAIT = 5.0   # seconds: log when a lock took longer than this to get
WAIT = testhooks.seconds("ZFSNG_LOCK_WAIT", 300.0)  # seconds, at most
POLL = 0.05       # seconds between two tries, doubled up to POLL_MAX
POLL_MAX = 1.0


def _path(name):
    return run_file(name, ".lock")


def run_file(name, suffix):
    """RUN_DIR's file for name (runfiles.file_name). Lock files (and
    ``alert``'s health records) are named so."""
    return runfiles.file_name(RUN_DIR, name, suffix)


def try_flock(fd):
    """Take an exclusive flock on fd without waiting: True if taken, False
    if another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except (IOError, OSError) as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def _acquire(fd, name):
    """flock fd, polling, within WAIT and the call's deadline."""
    left = runner.remaining()
    bound = WAIT if left is None else max(0.0, min(WAIT, left))
    start = time.monotonic()
    delay = POLL
    while True:
        if try_flock(fd):
            return time.monotonic() - start
        waited = time.monotonic() - start
        if waited >= bound:
            raise errors.SrBusy(
                "another operation has held %s for more than %.0f s; it "
                "may be stuck on a suspended pool or a failing disk "
                "('zpool status'). Try again later" % (name, waited))
        time.sleep(min(delay, bound - waited))
        delay = min(delay * 2, POLL_MAX)


@contextlib.contextmanager
def held(name):
    """Hold the exclusive lock called name for the with-block."""
    os.makedirs(RUN_DIR, 0o700, exist_ok=True)
    fd = os.open(_path(name), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        waited = _acquire(fd, name)
        if waited > SLOW_WAIT:
            log.info("waited %.1fs for lock %s", waited, name)
        yield
    finally:
        os.close(fd)


def sr_lock(sr):
    return held("sr-" + sr)


@contextlib.contextmanager
def reading(snapshot):
    """Held while a call reads a snapshot it took for itself, outside the
    SR lock (cbt's list to the live disk): the collector, which frees such
    snapshots, leaves it alone meanwhile (``being_read``). Taken before
    the SR lock; its file goes with it."""
    with held("reading-" + snapshot):
        try:
            yield
        finally:
            try:
                os.unlink(_path("reading-" + snapshot))
            except OSError:
                pass


def being_read(snapshot):
    """Whether a live call holds ``reading(snapshot)``: one non-blocking
    try, never a wait (a crashed call's flock is gone with it)."""
    path = _path("reading-" + snapshot)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        if not try_flock(fd):
            return True
    finally:
        os.close(fd)
    try:
        os.unlink(path)    # a crashed call's: its name is never reused
    except OSError:
        pass
    return False


def global_lock():
    return held("pools")
