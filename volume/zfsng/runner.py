"""The command runner: the one seam where zfs-ng touches external programs.

Everything that runs a program (zfs, zpool, blkid, udevadm, ...) comes through
``run``. Unit tests replace the runner with a fake (``set_runner``); nothing
else in the code is faked. Commands are argv lists, never shell strings, and
run with ``LC_ALL=C`` so their output parses the same on every host.

Bounds. xapi-storage-script waits for a plugin without any time limit,
and a command on a suspended pool (or a stuck tap-ctl) can block forever,
holding the SR lock, with every later call queued behind it. So every
command has a bound (``timeout_for``): past it, the command is killed and
the call fails with ``CommandTimeout``. A process stuck in the kernel
cannot be killed until its I/O ends; after KILL_GRACE seconds it is left
behind (it dies when the pool comes back) and the call still returns. On
top of that, a whole call has a deadline (``start_call``, CALL_DEADLINE):
no command starts after it, and no command may run past it, so a call that
holds a lock holds it for a bounded time, and callers waiting for that lock
(``lock.WAIT``) get ``SrBusy`` instead of waiting forever. Whatever a
killed command left is repaired by the next call, as after a crash.

Test hooks (``testhooks``): ZFSNG_CRASH_AFTER=N makes the process die (as
if killed) right after its N-th command returns, so tests can check that
the next call repairs whatever state that left; ZFSNG_TRACE=<file> appends
one JSON line (argv, rc, seconds) per command, so the benchmarks can tell
the plugin's own time from its commands' time; ZFSNG_CMD_TIMEOUT lowers
every command's bound, ZFSNG_KILL_GRACE the wait for a killed one.
"""

import json
import math
import os
import select
import subprocess
import threading
import time

from zfsng import errors, log, testhooks

# Seconds. A zfs or zpool command on a healthy pool takes well under a
# second on a host; 120 s is ample for a loaded one. Pool-level commands
# get more: an import with multihost protection first watches the pool for
# about 20 s (longer for many disks), create and destroy touch every disk,
# export flushes the pool.
DEFAULT_TIMEOUT = 120.0
POOL_TIMEOUT = 300.0
_POOL_VERBS = ("import", "export", "create", "destroy")
CALL_DEADLINE = 600.0   # a whole plugin call
KILL_GRACE = 5.0        # waiting for a killed command to go

_deadline = {"at": None}


def start_call(seconds=CALL_DEADLINE):
    """Start the deadline of one plugin call (the wire's entry point)."""
    _deadline["at"] = time.monotonic() + seconds


def remaining():
    """Seconds left before the call's deadline (None: no deadline)."""
    if _deadline["at"] is None:
        return None
    return _deadline["at"] - time.monotonic()


def kill_grace():
    """Seconds to wait for a killed command to go: KILL_GRACE, or a lower
    one from the test hook ZFSNG_KILL_GRACE (a test that hangs a disk
    waits this out at every command it kills)."""
    return testhooks.seconds("ZFSNG_KILL_GRACE", KILL_GRACE)


def timeout_for(argv, own=None):
    """The bound of one command: its own (own: one its caller derived from
    the work it must do), lowered to the call's deadline."""
    bound = DEFAULT_TIMEOUT
    if own is not None:
        bound = own
    elif argv[0] == "zpool" and len(argv) > 1 and argv[1] in _POOL_VERBS:
        bound = POOL_TIMEOUT
    elif argv[0] == "udevadm" and argv[1:2] == ["settle"]:
        bound = DEFAULT_TIMEOUT + 30   # it has its own --timeout
    bound = testhooks.seconds("ZFSNG_CMD_TIMEOUT", bound)
    left = remaining()
    return bound if left is None else min(bound, left)


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
        self.crash_after = int(testhooks.get("ZFSNG_CRASH_AFTER", "0"))
        self.trace = testhooks.get("ZFSNG_TRACE")

    def __call__(self, argv, stdin_text=None, bound=None):
        bound = _bound(argv, bound)   # own bound: see run()
        start = time.monotonic()
        proc = subprocess.Popen(
            _argv_bytes(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=_env(), close_fds=True)
        out, err = _communicate(
            proc, argv, bound,
            stdin_text.encode("utf-8") if stdin_text is not None else None)
        result = Result(argv, proc.returncode,
                        out.decode("utf-8", "replace"),
                        err.decode("utf-8", "replace"))
        self._done(result, start)
        return result

    def _done(self, result, start):
        """After each command: its trace line, and the test crash point."""
        if self.trace:
            _trace(self.trace, result, time.monotonic() - start)
        self.count += 1
        if self.crash_after and self.count >= self.crash_after:
            log.warning("crash point %d reached after %s", self.count,
                        result.argv)
            os._exit(137)

    def stream(self, argv, consume, bound=None):
        """Run argv and hand its stdout, as bytes, to consume(read) while it
        runs: for output too large to hold (a zfs send stream). read(n)
        returns up to n bytes as they come, b"" at the end; stderr is
        drained by a thread, so the command never blocks on it. No read
        waits past the command's bound: there the command is killed and
        given up on (CommandTimeout), its output unread. A zfs send stuck
        in the kernel (a suspended pool) survives SIGKILL and keeps its
        stdout open, so waiting for the end of it would hold the call, and
        the SR lock, until a reboot. Returns (Result with out "", what
        consume returned). When consume fails with a StorageError because
        the command failed (its stdout ended early), the Result tells the
        command's error and the value is None; any other failure of
        consume kills the command and passes on."""
        bound = _bound(argv, bound)   # own bound: see stream()
        start = time.monotonic()
        proc = subprocess.Popen(
            _argv_bytes(argv), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
            close_fds=True, bufsize=0)
        err = []
        drain = threading.Thread(target=lambda: err.append(proc.stderr.read()))
        drain.daemon = True
        drain.start()
        value, failure = None, None
        try:
            value = consume(_bounded_reader(proc.stdout.fileno(),
                                            start + bound))
        except _PastBound:
            raise _abandon(proc, argv, bound) from None
        except errors.StorageError as exc:
            failure = exc
        except BaseException:
            proc.kill()
            raise
        finally:
            proc.stdout.close()
        if failure is not None:
            proc.kill()    # no effect if it has exited already
        rc = _wait(proc, argv, bound)
        drain.join(kill_grace())
        if failure is not None and rc <= 0:
            raise failure
        result = Result(argv, rc, "", b"".join(err).decode("utf-8", "replace"))
        self._done(result, start)
        return result, value


class _PastBound(Exception):
    """A stream's read reached the command's bound."""


_PIPE_READ = 1 << 16   # a pipe's capacity: asking more allocates in vain


def _bounded_reader(fd, deadline):
    """read(n) on the pipe fd: up to n bytes as they come, b"" at its end;
    raises _PastBound instead of waiting past deadline (monotonic)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)

    def read(n):
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(int(math.ceil(left * 1000))):
            raise _PastBound()
        return os.read(fd, min(n, _PIPE_READ))
    return read


def _abandon(proc, argv, bound):
    """The CommandTimeout of a stream past its bound, once proc is killed
    and, if it does not die within KILL_GRACE (stuck in the kernel), left
    behind: it dies when its I/O ends. Its stderr stays with the drain
    thread, which ends with the plugin (closing a pipe another thread is
    reading could hand that thread a reused descriptor)."""
    proc.kill()
    try:
        proc.wait(timeout=kill_grace())
        return _stream_timeout(argv, bound)
    except subprocess.TimeoutExpired:
        return _stream_timeout(argv, bound, "left behind, stuck in the "
                               "kernel (pid %d)" % proc.pid, pid=proc.pid)


def _argv_bytes(argv):
    """argv as UTF-8 bytes, whatever the locale. Under Python 3.6 in the C
    locale (dom0's daemon) Popen would encode str arguments as ASCII and
    fail on a value an admin set by hand (a VDI named "Données") that a
    call copies into ``zfs clone -o``. Output goes the other way with
    "replace" (``Result``): valid UTF-8, which is all zfs-ng writes and
    what any UTF-8 terminal types, comes back as the same text and is
    copied byte for byte; the rare value that is not UTF-8 is copied with
    U+FFFD in place of its bad bytes rather than carried as lone
    surrogates, which strict encoders (meta's size check, the wire, the
    logs) would each have to guard against. surrogateescape here is for
    str that holds such escapes already (argv from os.environ or sys.argv)."""
    return [a.encode("utf-8", "surrogateescape") for a in argv]


def _env():
    """The environment of every command: the C locale, so that output
    parses the same on every host."""
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    env.pop("LANG", None)
    return env


def _bound(argv, own=None):
    """argv's bound (timeout_for), or CommandTimeout if the call has no
    time left to start it."""
    bound = timeout_for(argv) if own is None else timeout_for(argv, own)
    if bound <= 0:
        raise errors.CommandTimeout(
            "the call ran out of time (%d s) before %s"
            % (CALL_DEADLINE, " ".join(argv[:3])))
    return bound


def _wait(proc, argv, bound):
    """proc's exit status, once consume has read all it wrote."""
    try:
        return proc.wait(timeout=kill_grace())
    except subprocess.TimeoutExpired:
        proc.kill()
        raise _stream_timeout(argv, bound)


def _stream_timeout(argv, bound, fate="killed", pid=None):
    log.error("%s: not done after %.0f s, %s", " ".join(argv), bound, fate)
    return errors.CommandTimeout(
        "%s did not finish within %.0f s (%s); if a pool is involved, "
        "check 'zpool status' for a suspended pool or a failing disk"
        % (" ".join(argv[:4]), bound, fate), pid=pid)


def _communicate(proc, argv, bound, data):
    """proc's (stdout, stderr), or kill it and raise CommandTimeout."""
    try:
        return proc.communicate(data, timeout=bound)
    except subprocess.TimeoutExpired:
        pass
    proc.kill()
    left = None   # the pid of a command still running when we go on
    try:
        proc.communicate(timeout=kill_grace())
        fate = "killed"
    except subprocess.TimeoutExpired:
        # Stuck in the kernel (I/O to a suspended pool): it dies when the
        # I/O ends. Drop our end of its pipes and go on.
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe:
                pipe.close()
        left = proc.pid
        fate = "left behind, stuck in the kernel (pid %d)" % proc.pid
    log.error("%s: no answer after %.0f s, %s", " ".join(argv), bound, fate)
    raise errors.CommandTimeout(
        "%s did not finish within %.0f s (%s); if a pool is involved, "
        "check 'zpool status' for a suspended pool or a failing disk"
        % (" ".join(argv[:4]), bound, fate), pid=left)


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


def run(argv, stdin_text=None, bound=None):
    """Run argv (a list of str) and return its Result. Never raises on rc.
    bound: the command's own, in seconds, when its work grows with the
    data (``allow``)."""
    if not isinstance(argv, (list, tuple)) or not all(
            isinstance(a, str) for a in argv):
        raise TypeError("argv must be a list of str: %r" % (argv,))
    start = time.monotonic()
    try:
        result = _runner(list(argv), stdin_text,
                         **({} if bound is None else {"bound": bound}))
    except OSError as exc:
        result = Result(list(argv), 127, "", "%s: %s" % (argv[0], exc))
    # SMlog gets every command with its exit code and time: where a slow
    # or failing call went.
    log.debug("run: %s: rc=%d in %.2fs%s", " ".join(argv), result.rc,
              time.monotonic() - start,
              " stderr=%s" % result.err.strip() if result.rc else "")
    return result


def stream(argv, consume, bound=None):
    """Run argv, its stdout (bytes) read by consume(read) as it comes:
    see SubprocessRunner.stream. Returns (Result, consume's value); the
    Result's out is empty. Never raises on rc."""
    if not isinstance(argv, (list, tuple)) or not all(
            isinstance(a, str) for a in argv):
        raise TypeError("argv must be a list of str: %r" % (argv,))
    start = time.monotonic()
    try:
        result, value = _runner.stream(   # bound: the command's own, if
            list(argv), consume,          # its work grows with the data
            **({} if bound is None else {"bound": bound}))
    except OSError as exc:
        result, value = Result(list(argv), 127, "", "%s: %s" % (argv[0], exc)), None
    log.debug("stream: %s: rc=%d in %.2fs%s", " ".join(argv), result.rc,
              time.monotonic() - start,
              " stderr=%s" % result.err.strip() if result.rc else "")
    return result, value


def allow(rate, work, after=60.0):
    """The bound of a command that must do work at rate at least (units a
    second), and the call's deadline raised to hold it and after seconds
    more for what follows: xapi waits for a plugin without limit, and a
    large disk's work must not fail at the default deadline."""
    bound = DEFAULT_TIMEOUT + float(work) / rate
    left = remaining()
    if left is not None and left < bound + after:
        start_call(bound + after)
    return bound


def run_retried(argv, transient, attempts, delay, backoff=1.0,
                stdin_text=None):
    """run argv, again while transient(result) says its failure is one
    that passes (zfs "busy", a tap-ctl racing a tapdisk's exit): at most
    attempts runs, delay seconds apart (times backoff after each). The one
    retry loop of zfs-ng: only known transient failures are retried, a
    bounded number of times. Returns the last Result."""
    for attempt in range(attempts):
        result = run(argv, stdin_text)
        if result.rc == 0 or attempt == attempts - 1 or \
                not transient(result):
            return result
        log.info("%s: %s; retrying in %.1fs", " ".join(argv[:2]),
                 result.err.strip() or "exit %d" % result.rc, delay)
        time.sleep(delay)
        delay *= backoff
    return result


def spawn_detached(argv):
    """Start argv in the background and return at once, never waiting for
    it: for work the call must not wait on (a XenAPI message, ``alert``).

    A double fork: a middle process starts argv and exits, so argv is
    init's child (no zombie, nothing to reap here). argv gets its own
    session (a signal to the plugin's process group does not reach it),
    /dev/null as stdin, stdout and stderr (xapi-storage-script reads the
    plugin's stdout and stderr to their end: an inherited pipe would hold
    the call open until argv exits) and no other descriptor (an inherited
    lock file would stay locked). The caller bounds argv's run time (with
    ``timeout``). Arguments are passed as UTF-8 whatever the locale.
    Raises OSError when argv could not be started.
    """
    if not isinstance(argv, (list, tuple)) or not all(
            isinstance(a, str) for a in argv):
        raise TypeError("argv must be a list of str: %r" % (argv,))
    log.debug("spawn: %s", " ".join(argv))
    args = _argv_bytes(argv)
    env = _env()
    pid = os.fork()
    if pid == 0:   # the middle process: never returns
        code = 0
        try:
            subprocess.Popen(args, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, close_fds=True,
                             start_new_session=True, env=env)
        except BaseException:
            code = 127
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise OSError("cannot start %s" % argv[0])
