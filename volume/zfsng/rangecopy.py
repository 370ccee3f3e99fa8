"""Copying byte ranges of one zvol onto another, in a process of its own.

``copy`` runs ``python3 -m zfsng.rangecopy -- <source> <target>`` (two
zvols, by dataset name) through the runner, with the ranges as JSON on
stdin: ``[[offset, end], ...]``. The process waits for both zvols'
devices (``zvoldev``), copies each range and flushes the target before it
exits 0, printing the bytes copied.

Why a process: a read or write on a zvol of a suspended pool blocks in
the kernel until the pool comes back. In the plugin's own process nothing
could bound it, and the call would hold the SR lock for ever; as a
command it has a bound like every other (``runner``), and the call fails
with CommandTimeout instead.
"""

import json
import os
import sys

from zfsng import errors, log, names, runner, zvoldev

CHUNK = 1 << 20
RATE = 20 << 20     # bytes a second: a slow disk's scattered reads and writes


def copy(source, target, ranges):
    """Copy the range set ranges of zvol source onto zvol target, within a
    bound that grows with the bytes (``runner.allow``). Returns the bytes
    copied; raises StorageError (CommandTimeout past the bound)."""
    for name in (source, target):
        names.check_dataset_name(name)
    nbytes = sum(end - offset for offset, end in ranges)
    argv = [sys.executable, "-m", "zfsng.rangecopy", "--", source, target]
    result = runner.run(argv, json.dumps([list(r) for r in ranges]),
                        bound=runner.allow(RATE, nbytes))
    if result.rc != 0:
        raise errors.StorageError(
            "could not copy %d bytes from %s to %s: %s" % (
                nbytes, source, target,
                result.err.strip()[-300:] or "exit %d" % result.rc))
    return nbytes


def _copy_fds(src, dst, ranges):
    done = 0
    for offset, end in ranges:
        while offset < end:
            data = os.pread(src, min(CHUNK, end - offset), offset)
            if not data:
                raise OSError("short read at %d" % offset)
            view = memoryview(data)
            while view:
                written = os.pwrite(dst, view, offset)
                view, offset, done = view[written:], offset + written, \
                    done + written
    return done


def _ranges(text):
    ranges = json.loads(text)
    if not isinstance(ranges, list) or not all(
            isinstance(r, list) and len(r) == 2 and
            all(isinstance(x, int) and x >= 0 for x in r) and r[0] < r[1]
            for r in ranges):
        raise ValueError("ranges must be [[offset, end], ...]")
    return ranges


def main(argv):
    """The process: argv is ``[-- source target]``. Its own commands
    (zvol_id) are not the call's: a test's crash point and command trace
    count the plugin's commands only (testhooks)."""
    for hook in ("ZFSNG_CRASH_AFTER", "ZFSNG_TRACE"):
        os.environ.pop(hook, None)
    runner.set_runner(runner.SubprocessRunner())
    if len(argv) != 3 or argv[0] != "--":
        log.error("usage: python3 -m zfsng.rangecopy -- SOURCE TARGET "
                  "< ranges.json")
        return 2
    try:
        ranges = _ranges(sys.stdin.read())
        devices = [zvoldev.wait(name) for name in argv[1:]]
        src = os.open(devices[0], os.O_RDONLY)
        try:
            dst = os.open(devices[1], os.O_WRONLY)
            try:
                done = _copy_fds(src, dst, ranges)
                os.fsync(dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
    except (ValueError, OSError, errors.StorageError) as exc:
        log.error("rangecopy %s: %s", " ".join(argv[1:]), exc)  # stderr too
        return 1
    sys.stdout.write("%d\n" % done)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
