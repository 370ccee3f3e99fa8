"""fakezfs as real programs: zfs, zpool, lsblk, blkid, wipefs and udevadm
on PATH for protocol tests that run the installed executables.

The unit tests put ``tests/unit/fakezfs/`` in the plugin's own process;
a protocol test runs the plugin as xapi-storage-script does, a process per
call, so the fake host lives in a pickle file between commands instead.
``install(bin_dir, state)`` writes one small shell wrapper per program
into bin_dir (put it first on the plugin's PATH) and returns the FakeZfs
host to set up; ``save``/``load`` move it in and out of the state file.
Each command runs under an exclusive lock on that file, so concurrent
calls see the fake as one host. Kept Python 3.6-compatible: the tests run
under 3.6 too.
"""

import fcntl
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
UNIT = os.path.join(os.path.dirname(HERE), "unit")


def _fakezfs():
    if UNIT not in sys.path:
        sys.path.insert(0, UNIT)
    import fakezfs
    return fakezfs


def save(host, state):
    with open(state, "wb") as f:
        pickle.dump(host, f)


def load(state):
    _fakezfs()                  # pickle finds the classes by module name
    with open(state, "rb") as f:
        return pickle.load(f)


def install(bin_dir, state):
    """One wrapper per faked program in bin_dir; a fresh host in state."""
    fakezfs = _fakezfs()
    for prog in fakezfs.PROGRAMS:
        path = os.path.join(bin_dir, prog)
        with open(path, "w") as f:
            f.write('#!/bin/sh\nexec "%s" "%s" "%s" %s "$@"\n'
                    % (sys.executable, os.path.abspath(__file__), state,
                       prog))
        os.chmod(path, 0o755)
    host = fakezfs.FakeZfs()
    save(host, state)
    return host


def main(argv):
    """fakezfs_cmd.py STATE PROGRAM ARGS...: run one command on the host."""
    state, command = argv[1], argv[2:]
    with open(state + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        host = load(state)
        try:
            result = host(command)
        except AssertionError as exc:   # an argv form the fake lacks
            result = None
            message = "fakezfs_cmd: %s\n" % exc
        save(host, state)
    if result is None:
        sys.stderr.write(message)
        return 99
    sys.stdout.buffer.write(result.out.encode("utf-8"))
    sys.stderr.buffer.write(result.err.encode("utf-8"))
    return result.rc


def _utf8_argv(argv):
    """argv as the plugin sent it, UTF-8 bytes (runner._argv_bytes), as
    text: Python 3.6 in the C locale would decode them as ASCII with
    surrogate escapes, which the fake host cannot store."""
    return [os.fsencode(a).decode("utf-8", "replace") for a in argv]


if __name__ == "__main__":
    sys.exit(main(_utf8_argv(sys.argv)))
