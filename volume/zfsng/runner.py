"""The command runner: the one seam where zfs-ng touches external programs.

Everything that runs a program (zfs, zpool, blkid, udevadm, ...) comes through
``run``. Unit tests replace the runner with a fake (``set_runner``); nothing
else in the code is faked. Commands are argv lists, never shell strings, and
run with ``LC_ALL=C`` so their output parses the same on every host.

Crash-point testing: with ``ZFSNG_CRASH_AFTER=N`` in the environment the
process dies (as if killed) right after its N-th command returns, so tests
can check that the next call repairs whatever state that left.

Tracing: with ``ZFSNG_TRACE=<file>`` every command appends one JSON line
(argv, rc, seconds) to that file, so the benchmarks (and an admin chasing a
slow call) can tell the plugin's own time from the time its commands took.
"""

import json
import os
import subprocess
import time

from zfsng import log


class Result(object):
    """What a command did: exit status, stdout and stderr as text."""

    __slots__ = ("argv", "rc", "out", "err")

    def __init__(self, argv, rc, out, err):
        self.argv = argv
        self.rc = rc
        self.out = out
        self.err = err


class SubprocessRunner(object):
    """Runs real programs."""

    def __init__(self):
        self.count = 0
        self.crash_after = int(os.environ.get("ZFSNG_CRASH_AFTER", "0") or 0)
        self.trace = os.environ.get("ZFSNG_TRACE")

    def __call__(self, argv, stdin_text=None):
        env = dict(os.environ)
        env["LC_ALL"] = "C"
        env.pop("LANG", None)
        start = time.monotonic()
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, close_fds=True)
        out, err = proc.communicate(
            stdin_text.encode("utf-8") if stdin_text is not None else None)
        result = Result(argv, proc.returncode,
                        out.decode("utf-8", "replace"),
                        err.decode("utf-8", "replace"))
        if self.trace:
            _trace(self.trace, result, time.monotonic() - start)
        self.count += 1
        if self.crash_after and self.count >= self.crash_after:
            log.warning("crash point %d reached after %s", self.count, argv)
            os._exit(137)
        return result


def _trace(path, result, seconds):
    """Append one command's record to the trace file; never fails a call."""
    try:
        with open(path, "a") as f:
            f.write(json.dumps({"argv": result.argv, "rc": result.rc,
                                "s": round(seconds, 6)}) + "\n")
    except (IOError, OSError) as exc:
        log.warning("cannot write trace %s: %s", path, exc)


_runner = SubprocessRunner()


def set_runner(runner):
    """Install another runner (a fake in unit tests); returns the old one."""
    global _runner
    old, _runner = _runner, runner
    return old


def run(argv, stdin_text=None):
    """Run argv (a list of str) and return its Result. Never raises on rc."""
    if not isinstance(argv, (list, tuple)) or not all(
            isinstance(a, str) for a in argv):
        raise TypeError("argv must be a list of str: %r" % (argv,))
    log.debug("run: %s", " ".join(argv))
    try:
        result = _runner(list(argv), stdin_text)
    except OSError as exc:
        result = Result(list(argv), 127, "", "%s: %s" % (argv[0], exc))
    if result.rc != 0:
        log.debug("rc=%d stderr=%s", result.rc, result.err.strip())
    return result
