"""A plugin "process" killed right after a command: the one seam the crash
point tests of both plugins use (test_crash_points.py for the volume
plugin, test_datapath.py for the datapath).

The seam is the runner: ``CrashAfter`` and ``CrashAfterCommand`` forward
to the host's runner and, right after the command they wait for completes,
raise ``Killed``. The command itself did happen: its effect is on the
host. ``CutInside`` is a power cut inside one command that ZFS does in
several transaction groups (``zfs create -o``, ``zfs clone -o``): only its
first ones happened.
"""

import contextlib

from zfsng import runner


class Killed(BaseException):
    """The plugin process died right after a command (SIGKILL, host
    crash): a BaseException, so no ``except Exception`` in the plugin can
    swallow it, and nothing after it runs."""


class CrashAfter(object):
    """A runner that kills the "process" right after its n-th command
    (n=0: never, and ``count`` says how many ran)."""

    def __init__(self, host, n):
        self.host, self.n, self.count, self.dead = host, n, 0, False

    def __call__(self, argv, stdin_text=None, **bound):
        if self.dead:       # a dead process runs nothing more
            raise Killed("command after the crash: %r" % (argv,))
        result = self.host(argv, stdin_text, **bound)
        self._after(argv)
        return result

    def stream(self, argv, consume, **bound):
        """A streamed command (zfs send) counts as one command too."""
        if self.dead:
            raise Killed("command after the crash: %r" % (argv,))
        answer = self.host.stream(argv, consume, **bound)
        self._after(argv)
        return answer

    def _after(self, argv):
        self.count += 1
        if self.count == self.n:
            self.dead = True
            raise Killed("killed after command %d: %r" % (self.n, argv))


class CrashAfterCommand(CrashAfter):
    """Kill the "process" right after its nth (first by default) argv that
    starts with prefix."""

    def __init__(self, host, prefix, nth=1):
        CrashAfter.__init__(self, host, None)
        self.prefix, self.nth = list(prefix), nth

    def __call__(self, argv, stdin_text=None, **bound):
        if self.dead:
            raise Killed("command after the crash: %r" % (argv,))
        result = self.host(argv, stdin_text, **bound)
        self._after(argv)
        return result

    def _after(self, argv):
        if argv[:len(self.prefix)] == self.prefix:
            self.nth -= 1
        if argv[:len(self.prefix)] == self.prefix and self.nth == 0:
            self.dead = True
            raise Killed("killed after %r" % (argv,))


class CutInside(CrashAfterCommand):
    """A power cut inside the first command that starts with prefix, a
    ``zfs create`` or ``zfs clone``: the dataset is made, its -o
    properties are not (but keep: FakeZfs.cut_next), and nothing runs
    after it. fake: the FakeZfs behind host."""

    def __init__(self, host, fake, prefix, keep=()):
        CrashAfterCommand.__init__(self, host, prefix)
        self.fake, self.keep = fake, keep

    def __call__(self, argv, stdin_text=None, **bound):
        if not self.dead and argv[:len(self.prefix)] == self.prefix:
            self.fake.cut_next(self.keep)
        return CrashAfterCommand.__call__(self, argv, stdin_text, **bound)


@contextlib.contextmanager
def installed(runner_):
    """runner_ as the plugin's runner for the block, the one before it
    back afterwards, even when the block was killed."""
    old = runner.set_runner(runner_)
    try:
        yield runner_
    finally:
        runner.set_runner(old)


def commands_run(host, action):
    """How many commands action() runs on host (not killed): the crash
    points a test must try are 1 to this number."""
    with installed(CrashAfter(host, 0)) as counter:
        action()
    return counter.count
