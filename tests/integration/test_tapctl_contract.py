"""The fake tap-ctl (tests/unit/faketapctl.py) held to the real one.

The unit tests of the datapath run on an in-memory blktap. Here the same
tap-ctl command sequences run against XCP-ng's real blktap in this guest
(tap-ctl and tapdisk v3.55.5, the blktap2 driver) and against the fake,
and what the datapath reads from each is compared step by step: the exit
status (the errno tap-ctl returns) and stdout, with pids and minors
renamed in order of appearance (both sides number them their own way) and
the ``tap-ctl list`` lines compared as parsed by the datapath's own
``tapctl.parse_list``.

Every step must agree. Two things the datapath never does are not
played, because on the real blktap they spoil the guest for every later
test (faketapctl's docstring has both):
- ``free`` of a minor a tapdisk holds: answered 0, and the minor then
  stays listed for good (the fake refuses it with EBUSY);
- ``free`` of a minor number never allocated: the blktap2 driver of this
  guest checks it against its compile-time maximum, not against the
  minors it has, and reads past its table: ENODEV when that memory is
  zero, a kernel oops (NULL pointer in blktap_control_ioctl, tap-ctl
  killed) when it is not; both were seen (the fake answers ENODEV).
The datapath frees only minors ``tap-ctl list`` shows as orphans.
"""

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import sh

_TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
for _dir in ("tests/unit", "volume", "datapath"):
    sys.path.insert(0, os.path.join(_TOP, _dir))

import faketapctl  # noqa: E402
from zfsng_datapath import tapctl  # noqa: E402



class Real(object):
    """The real blktap, one command at a time."""

    def run(self, argv):
        proc = subprocess.run(["tap-ctl"] + argv, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=60)
        return proc.returncode, proc.stdout.decode()

    def kill(self, pid, sig):
        os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while os.path.exists("/proc/%d" % pid) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        # the kernel notices the ring's owner is gone when its file closes
        time.sleep(0.2)


class Fake(object):
    def __init__(self):
        self.fake = faketapctl.FakeTapCtl()

    def run(self, argv):
        result = self.fake(["tap-ctl"] + argv)
        return result.rc, result.out

    def kill(self, pid, sig):
        if sig == signal.SIGKILL:
            self.fake.kill_tapdisk(pid)
        else:     # what tapctl.terminate runs
            assert self.fake(["kill", "-TERM", str(pid)]).rc == 0


class Names(object):
    """pid and minor numbers named P1, P2... and M1, M2... in the order
    spawn and allocate hand them out (a freed minor number may come back
    from the next allocate: it gets the next name), so that two runs
    compare."""

    def __init__(self):
        self.values = {}    # name -> number
        self.names = {}     # (kind, number) -> latest name

    def new(self, kind, value):
        name = "%s%d" % (kind, 1 + sum(1 for n in self.values
                                       if n.startswith(kind)))
        self.values[name] = value
        self.names[kind, value] = name
        return name

    def name(self, kind, value):
        return self.names.get((kind, value)) or self.new(kind, value)

    def value(self, name):
        return self.values[name]


def seen(kind, rc, out, names):
    """What the datapath reads from one command's answer."""
    if rc != 0:
        return ("error", errno.errorcode.get(rc, rc))
    if kind == "spawn":
        return ("pid", names.new("P", int(out.split()[-1])))
    if kind == "allocate":
        path = out.strip().splitlines()[-1]
        number = path[len(faketapctl.TAPDEV % 0) - 1:]
        assert path == faketapctl.TAPDEV % int(number), path
        return ("tapdev", names.new("M", int(number)))
    if kind == "list":
        rows = tapctl.parse_list(out)
        found = [(names.name("P", r.pid) if r.pid is not None else None,
                  names.name("M", r.minor) if r.minor is not None else None,
                  r.state, r.type, r.path) for r in rows]
        return ("rows", sorted(found, key=repr))
    if kind == "stats":
        return ("mirror_failed, images", tapctl.parse_mirror_failed(out),
                tapctl.parse_images(out))
    return ("ok", out.strip())


def play(side, steps, names):
    """Run steps [(name, kind, argv template)] on side; argv may hold
    {P1}/{M1}... for the numbers seen so far; kind "kill9" or "term" sends
    the tapdisk named by argv that signal."""
    answers = []
    for name, kind, argv in steps:
        if kind in ("kill9", "term"):
            side.kill(names.value(argv), signal.SIGKILL if kind == "kill9"
                      else signal.SIGTERM)
            answers.append((name, "killed"))
            continue
        words = []
        for word in argv.split():
            if word.startswith("{"):
                word = str(names.value(word[1:-1]))
            words.append(word)
        rc, out = side.run(words)
        answers.append((name, seen(kind, rc, out, names)))
    return answers


def lifecycle(image):
    """One VBD's whole life, the refusals the datapath may meet on the way,
    and a tapdisk killed under an open VBD then replaced on its minor."""
    img = "aio:" + image
    return [
        ("list-empty", "list", "list"),
        ("spawn", "spawn", "spawn"),
        ("allocate", "allocate", "allocate"),
        ("list-idle-and-orphan", "list", "list"),
        ("attach", "ok", "attach -p {P1} -m {M1}"),
        ("attach-again", "ok", "attach -p {P1} -m {M1}"),
        ("list-attached", "list", "list"),
        ("open-missing-image", "ok",
         "open -p {P1} -m {M1} -a aio:/dev/zvol/none/such"),
        ("open", "ok", "open -p {P1} -m {M1} -a " + img),
        ("open-again", "ok", "open -p {P1} -m {M1} -a " + img),
        ("list-open", "list", "list"),
        ("stats-open", "stats", "stats -p {P1} -m {M1}"),
        ("detach-while-open", "ok", "detach -p {P1} -m {M1}"),
        ("close", "ok", "close -p {P1} -m {M1} -t 120"),
        ("close-closed", "ok", "close -p {P1} -m {M1} -t 120"),
        ("list-closed", "list", "list"),
        ("stats-closed", "stats", "stats -p {P1} -m {M1}"),
        ("open-read-only", "ok", "open -p {P1} -m {M1} -a %s -R" % img),
        ("list-read-only", "list", "list"),
        ("close-read-only", "ok", "close -p {P1} -m {M1} -t 120"),
        ("detach", "ok", "detach -p {P1} -m {M1}"),
        ("list-orphan", "list", "list"),
        ("stats-detached", "stats", "stats -p {P1} -m {M1}"),
        ("attach-to-exited-tapdisk", "ok", "attach -p {P1} -m {M1}"),
        ("free", "ok", "free -m {M1}"),
        ("list-empty-again", "list", "list"),
        ("spawn-2", "spawn", "spawn"),
        ("allocate-2", "allocate", "allocate"),
        ("attach-2", "ok", "attach -p {P2} -m {M2}"),
        ("open-2", "ok", "open -p {P2} -m {M2} -a " + img),
        ("kill-2", "kill9", "P2"),
        ("list-after-kill", "list", "list"),
        ("close-after-kill", "ok", "close -p {P2} -m {M2} -t 120"),
        ("spawn-3", "spawn", "spawn"),
        ("attach-3-to-orphan", "ok", "attach -p {P3} -m {M2}"),
        ("open-3", "ok", "open -p {P3} -m {M2} -a " + img),
        ("list-replaced", "list", "list"),
        ("close-3", "ok", "close -p {P3} -m {M2} -t 120"),
        ("detach-3", "ok", "detach -p {P3} -m {M2}"),
        ("free-2", "ok", "free -m {M2}"),
        ("list-end", "list", "list"),
    ]


def held_minor(image):
    """Another tapdisk on a minor a tapdisk holds; an idle tapdisk ended by
    SIGTERM, as tapctl.terminate does. Not played: ``free`` of a held minor,
    which the real blktap lets through and which then leaves the minor
    listed for good in this guest (faketapctl's docstring)."""
    return [
        ("spawn", "spawn", "spawn"),
        ("allocate", "allocate", "allocate"),
        ("attach", "ok", "attach -p {P1} -m {M1}"),
        ("open", "ok", "open -p {P1} -m {M1} -a aio:" + image),
        ("spawn-other", "spawn", "spawn"),
        ("attach-other-to-held", "ok", "attach -p {P2} -m {M1}"),
        ("list-with-idle", "list", "list"),
        ("terminate-idle", "term", "P2"),
        ("list-without-idle", "list", "list"),
        ("close", "ok", "close -p {P1} -m {M1} -t 120"),
        ("detach", "ok", "detach -p {P1} -m {M1}"),
        ("list-end", "list", "list"),
        ("free", "ok", "free -m {M1}"),
        ("free-again", "ok", "free -m {M1}"),
        ("list-freed", "list", "list"),
    ]


@pytest.fixture
def image(disks):
    """A zvol to open, as the datapath opens one."""
    sh("zpool", "create", "-f", "-m", "none", "ctank", disks[0])
    sh("zfs", "create", "-V", "64M", "ctank/vol")
    sh("udevadm", "settle")
    yield "/dev/zvol/ctank/vol"    # disks' teardown ends the tapdisks


def compare(steps):
    """Both sides' answers, step by step: the list of mismatches."""
    real = play(Real(), steps, Names())
    fake = play(Fake(), steps, Names())
    return ["%s: real %r, fake %r" % (name, got, want)
            for (name, got), (_, want) in zip(real, fake)
            if got != want]


@pytest.mark.parametrize("sequence", [lifecycle, held_minor])
def test_the_fake_answers_as_the_real_blktap(image, sequence):
    steps = sequence(image)
    mismatches = compare(steps)
    assert not mismatches, "\n".join(mismatches)
