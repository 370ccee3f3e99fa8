"""faketapctl: an in-memory blktap (tap-ctl, tapdisks, minors) for unit tests.

Like fakezfs, it is a runner (``FakeTapCtl()(argv) -> runner.Result``)
installed at zfs-ng's one command seam, and it answers the way blktap's
``tap-ctl`` does (xapi-project/blktap ``control/tap-ctl.c`` for the options
and output, ``control/tap-ctl-*.c`` and ``drivers/tapdisk-control.c`` and
the kernel's ``control.c`` (blktap-dkms) for the state machine), and is
held to the real blktap by tests/integration/test_tapctl_contract.py,
which plays the same command sequences on both in the test guest:

- ``spawn`` starts an idle tapdisk and prints its pid ("%d\\n": stdout is
  no tty); an idle tapdisk lives until killed.
- ``allocate`` reserves the lowest free minor and prints
  ``/dev/xen/blktap-2/tapdev<minor>``.
- ``attach -p -m`` needs both options (else usage, EINVAL), a live tapdisk
  (ENOENT: its control socket is gone; ECONNREFUSED: it died and left the
  socket), an allocated minor (ENOENT: no ring device), a minor no other
  tapdisk holds (EINVAL) and not already attached to this one (EINVAL).
- ``open -p -m -a type:path [-R] [-D] [-t s]`` needs the VBD attached
  (EINVAL), not open yet (EALREADY), and an existing path (ENOENT).
- ``close -p -m [-f] [-t s]`` needs the VBD (ENODEV); closing a closed
  one is done at once (0), as the real one answers.
- ``detach -p -m`` needs the VBD (ENODEV) closed (EINVAL); a tapdisk whose
  last VBD goes exits (tapdisk_server_check_state).
- ``free -m`` needs the minor (ENODEV) and no tapdisk holding it (EBUSY).
  The real one is looser: freeing a minor a tapdisk holds answers 0 and
  leaves the minor listed for good, even after that tapdisk lets it go
  (seen on blktap 3.55.5 with the 6.1 driver; further frees answer 0 and
  change nothing). Freeing a minor number never allocated can oops the
  test guest's blktap2 driver (it reads past its table of minors); the
  fake answers ENODEV, as the driver does when that memory happens to be
  zero. The datapath frees only orphan minors, so neither is played
  against the real one.
- ``list [-p] [-m] [-t] [-f]`` prints the key=value lines of
  tap_cli_list_dict: VBDs ("pid=%d minor=%d state=%#x args=%s:%s", no args
  before open; state 0, or 0x2 once closed), idle tapdisks ("pid=%d"),
  then orphan minors ("minor=%d").
- ``stats -p -m`` prints the VBD's figures (tapdisk_vbd_stats, JSON);
  ENODEV without the VBD.
- A failure prints strerror() on stderr and exits with the errno.
- ``kill -TERM <pid>`` (the kill program) ends a tapdisk.

Test helpers: ``kill_tapdisk(pid)`` (a tapdisk that died: its VBDs vanish,
its minors stay allocated and become orphans, as the kernel keeps them),
``reboot()``, ``vbds()``, ``inject(prefix, errno, times)``.

Mirror mode: an unpause with ``-2 nbd:...`` marks the VBD's image
``ignore_enospc`` (tapdisk's TD_IGNORE_ENOSPC, kept once the secondary
is dropped); only a reopen clears it: ``unpause -2 null``, or close.
"""

import errno
import os

from zfsng import errors, runner

TAPDEV = "/dev/xen/blktap-2/tapdev%d"
CLOSED = 0x2          # a VBD's state in ``list`` once closed
PAUSE_REQUESTED = 0x10   # TD_VBD_PAUSE_REQUESTED: a pause not done yet
PAUSED = 0x20         # TD_VBD_PAUSED, until unpause
PROGRAMS = ("tap-ctl", "kill")


class FakeTapCtl(object):

    def __init__(self, exists=os.path.exists):
        self.exists = exists          # is the image path there?
        self.tapdisks = {}            # pid -> {minor: vbd dict}
        self.minors = set()           # allocated minors
        self.killed = set()           # pids of tapdisks that died
        self.next_pid = 4242
        self.calls = []
        self.unknown = []
        self.injected = []            # [argv prefix, errno, times]
        # tapdisks that stay up idle after their last VBD goes (one an
        # NBD client's fd was passed to, as in a migration)
        self.lingering = set()
        self.stalled_pauses = 0       # see stall_pause
        self.pauses_complete = True

    # --- runner interface ----------------------------------------------------

    def __call__(self, argv, stdin_text=None):
        self.calls.append(list(argv))
        for rule in self.injected:
            prefix, err, times = rule
            if argv[:len(prefix)] == prefix and times != 0:
                rule[2] -= 1
                return self._fail(argv, err)
        if argv[0] == "kill":
            return self._kill(argv)
        if len(argv) < 2:
            return self._usage(argv)
        handler = getattr(self, "_" + argv[1], None)
        if handler is None:
            self.unknown.append(argv)
            raise AssertionError("faketapctl: unsupported command %r" % argv)
        try:
            out = handler(argv[2:])
        except _Errno as exc:
            return self._fail(argv, exc.err)
        return runner.Result(argv, 0, out or "", "")

    @staticmethod
    def _fail(argv, err):
        return runner.Result(argv, err, "", os.strerror(err) + "\n")

    def _usage(self, argv):
        return runner.Result(argv, errno.EINVAL, "",
                             "usage: %s\n" % " ".join(argv))

    # --- helpers for tests ---------------------------------------------------

    def kill_tapdisk(self, pid):
        """The tapdisk died (crash, kill -9): no VBD is served any more;
        the minors it held stay allocated in the kernel (orphans)."""
        del self.tapdisks[pid]
        self.killed.add(pid)

    def reboot(self):
        self.tapdisks, self.minors, self.killed = {}, set(), set()

    def vbds(self):
        """[(pid, minor, args or None, readonly)] of every VBD."""
        return sorted((pid, minor, v["args"], v["readonly"])
                      for pid, vbds in self.tapdisks.items()
                      for minor, v in vbds.items())

    def inject(self, command, err, times=1):
        """The next ``times`` argvs starting with command's words fail with
        errno err."""
        self.injected.append([command.split(), err, times])

    def stall_pause(self, times=1, completes=True):
        """The next ``times`` pauses outlive tap-ctl, as behind a slow
        request: tap-ctl is killed at its bound (CommandTimeout) with the
        pause requested in tapdisk (PAUSE_REQUESTED), which completes it
        later, here at the next ``list`` (tapdisk_vbd_check_state), or
        never (completes=False: a request stuck for good)."""
        self.stalled_pauses = times
        self.pauses_complete = completes

    def holder(self, minor):
        for pid, vbds in self.tapdisks.items():
            if minor in vbds:
                return pid
        return None

    # --- commands ------------------------------------------------------------

    @staticmethod
    def _opts(args, spec):
        """getopt(3) with spec like "p:m:h"; _Errno(EINVAL) on a bad one."""
        takes, i = {}, 0
        while i < len(spec):
            takes[spec[i]] = spec[i + 1:i + 2] == ":"
            i += 2 if takes[spec[i]] else 1
        opts, i = {}, 0
        while i < len(args):
            arg = args[i]
            if not arg.startswith("-") or len(arg) < 2 or arg[1] not in takes:
                raise _Errno(errno.EINVAL)
            flag = arg[1]
            if takes[flag]:
                value = arg[2:]
                if not value:
                    i += 1
                    if i >= len(args):
                        raise _Errno(errno.EINVAL)
                    value = args[i]
                opts[flag] = value
            else:
                if len(arg) != 2:
                    raise _Errno(errno.EINVAL)
                opts[flag] = True
            i += 1
        return opts

    @staticmethod
    def _int(opts, flag):
        if flag not in opts:
            raise _Errno(errno.EINVAL)   # usage
        try:
            return int(opts[flag])
        except ValueError:
            raise _Errno(errno.EINVAL)

    def _tapdisk(self, pid):
        if pid in self.killed:
            raise _Errno(errno.ECONNREFUSED)  # its socket, no listener
        if pid not in self.tapdisks:
            raise _Errno(errno.ENOENT)   # no control socket ctl<pid>
        return self.tapdisks[pid]

    def _spawn(self, args):
        self._opts(args, "c:h")
        pid = self.next_pid
        self.next_pid += 17
        self.tapdisks[pid] = {}
        return "%d\n" % pid

    def _allocate(self, args):
        self._opts(args, "d:h")
        minor = 0
        while minor in self.minors:
            minor += 1
        self.minors.add(minor)
        return TAPDEV % minor + "\n"

    def _attach(self, args):
        opts = self._opts(args, "p:m:h")
        pid, minor = self._int(opts, "p"), self._int(opts, "m")
        vbds = self._tapdisk(pid)
        if minor in vbds:
            raise _Errno(errno.EINVAL)
        if minor not in self.minors:
            raise _Errno(errno.ENOENT)   # no ring device /dev/.../blktapN
        if self.holder(minor) is not None:
            raise _Errno(errno.EINVAL)   # another tapdisk maps the ring
        vbds[minor] = {"args": None, "readonly": False, "state": 0}
        return ""

    def _vbd(self, opts):
        """The VBD -p/-m of opts names (ENODEV: no such VBD)."""
        vbd = self._tapdisk(self._int(opts, "p")).get(self._int(opts, "m"))
        if vbd is None:
            raise _Errno(errno.ENODEV)
        return vbd

    @staticmethod
    def _image_path(spec):
        """The path of an image argument <type>:<path> (EINVAL: a type
        tapdisk does not know)."""
        kind, sep, path = spec.partition(":")
        if not sep or kind not in ("aio", "vhd", "qcow2"):
            raise _Errno(errno.EINVAL)
        return path

    def _open(self, args):
        opts = self._opts(args, "a:RDm:p:e:r2:st:C:Eh")
        pid, minor = self._int(opts, "p"), self._int(opts, "m")
        if "a" not in opts:
            raise _Errno(errno.EINVAL)
        path = self._image_path(opts["a"])
        vbd = self._tapdisk(pid).get(minor)
        if vbd is None:
            raise _Errno(errno.EINVAL)
        if vbd["args"] is not None:
            raise _Errno(errno.EALREADY)
        if not self.exists(path):
            raise _Errno(errno.ENOENT)
        vbd["args"], vbd["readonly"] = opts["a"], "R" in opts
        vbd["state"], vbd["ignore_enospc"] = 0, False
        return ""

    def _close(self, args):
        vbd = self._vbd(self._opts(args, "p:m:ft:h"))
        if vbd["args"] is None:
            return ""                    # already closed: done
        vbd["args"], vbd["readonly"] = None, False
        vbd["state"], vbd["ignore_enospc"] = CLOSED, False
        return ""

    def _pause(self, args):
        """Quiesce: the image closes, the VBD keeps its name (args)."""
        vbd = self._vbd(self._opts(args, "p:m:h"))
        if self.stalled_pauses:
            self.stalled_pauses -= 1
            vbd["state"] = vbd.get("state", 0) | PAUSE_REQUESTED
            raise errors.CommandTimeout("tap-ctl pause did not finish within "
                                        "its bound")
        vbd["state"] = vbd.get("state", 0) | PAUSED
        return ""

    def _stats(self, args):
        """The VBD's figures as tapdisk_vbd_stats prints them (the fields
        the datapath reads): ENODEV without the VBD."""
        vbd = self._vbd(self._opts(args, "p:m:h"))
        chain = ", ".join('{ "name": "%s", "hits": [ 0, 0 ], "fail": '
                          '[ 0, 0 ], "driver": { "type": 2 } }' % path
                          for path in self._chain(vbd))
        return ('{ "name": "%s", "secs": [ 0, 0 ], "images": [ %s ], '
                '"FIXME_enospc_redirect_count": 0, "nbd_mirror_failed": %d, '
                '"reqs_outstanding": 0, "read_caching": "false" }\n'
                % (vbd["args"] or "", chain, vbd.get("mirror_failed", 0)))

    @staticmethod
    def _chain(vbd):
        """The images tapdisk serves from: none closed or paused; the
        image, then a mirror's secondary; the secondary alone once an
        ENOSPC retired the image (retire_image)."""
        if not vbd["args"] or vbd.get("state", 0) & PAUSED:
            return []
        chain = [] if vbd.get("retired") else [vbd["args"].split(":", 1)[1]]
        if vbd.get("secondary") and not vbd.get("mirror_failed"):
            chain.append(vbd["secondary"].split(":", 1)[1])
        return chain

    def retire_image(self, pid, minor):
        """An ENOSPC on a mirrored image: tapdisk drops the image from the
        chain and serves from the secondary alone, nbd_mirror_failed
        untouched (tapdisk_vbd_complete_td_request)."""
        vbd = self.tapdisks[pid][minor]
        assert vbd.get("ignore_enospc") and vbd.get("secondary")
        vbd["retired"] = True

    def drop_mirror(self, pid, minor):
        """tapdisk dropped the VBD's NBD secondary (a write failed or timed
        out): nbd_mirror_failed is 1 until the next unpause."""
        self.tapdisks[pid][minor]["mirror_failed"] = 1

    def _unpause(self, args):
        """Reopen (-a: another image, the VBD's new name) and resume."""
        opts = self._opts(args, "p:m:a:2:c:h")
        vbd = self._vbd(opts)
        if not vbd.get("state", 0) & PAUSED:
            raise _Errno(errno.EINVAL)
        if "a" in opts:
            if not self.exists(self._image_path(opts["a"])):
                raise _Errno(errno.ENOENT)
            vbd["args"] = opts["a"]
        if "2" in opts:
            vbd["ignore_enospc"] = opts["2"] != "null"
        vbd["secondary"] = opts["2"] if opts.get("2", "null") != "null" \
            else None
        vbd["retired"] = False             # the image reopened
        vbd["state"] = 0
        return ""

    def _detach(self, args):
        opts = self._opts(args, "p:m:h")
        pid, minor = self._int(opts, "p"), self._int(opts, "m")
        vbds = self._tapdisk(pid)
        vbd = vbds.get(minor)
        if vbd is None:
            raise _Errno(errno.ENODEV)
        if vbd["args"] is not None:
            raise _Errno(errno.EINVAL)
        del vbds[minor]
        if not vbds and pid not in self.lingering:
            del self.tapdisks[pid]       # its last VBD: tapdisk exits
        return ""

    def _free(self, args):
        opts = self._opts(args, "m:h")
        minor = self._int(opts, "m")
        if minor not in self.minors:
            raise _Errno(errno.ENODEV)
        if self.holder(minor) is not None:
            raise _Errno(errno.EBUSY)
        self.minors.remove(minor)
        return ""

    def _list(self, args):
        opts = self._opts(args, "m:p:t:f:h")
        for vbds in self.tapdisks.values():    # a stalled pause completes
            for vbd in vbds.values():
                if vbd.get("state", 0) & PAUSE_REQUESTED and \
                        self.pauses_complete:
                    vbd["state"] = vbd["state"] & ~PAUSE_REQUESTED | PAUSED
        rows = []   # (pid, minor, state, type, path), -1/None = unknown
        if "p" in opts:
            pids = [int(opts["p"])] if int(opts["p"]) in self.tapdisks \
                else []
        else:
            pids = sorted(self.tapdisks)
        for pid in pids:
            vbds = self.tapdisks[pid]
            if not vbds:
                rows.append((pid, -1, -1, None, None))
            for minor in sorted(vbds):
                args_ = vbds[minor]["args"]
                kind, path = (args_.split(":", 1) if args_ else (None, None))
                rows.append((pid, minor, vbds[minor].get("state", 0), kind,
                             path))
        if "p" not in opts:
            held = set(m for vbds in self.tapdisks.values() for m in vbds)
            rows += [(-1, m, -1, None, None)
                     for m in sorted(self.minors - held)]
        lines = []
        for pid, minor, state, kind, path in rows:
            if "m" in opts and int(opts["m"]) >= 0 and \
                    minor != int(opts["m"]):
                continue
            if "t" in opts and kind and kind != opts["t"]:
                continue
            if "f" in opts and path and path != opts["f"]:
                continue
            fields = []
            if pid != -1:
                fields.append("pid=%d" % pid)
            if minor != -1:
                fields.append("minor=%d" % minor)
            if state != -1:
                fields.append("state=%s" % ("%#x" % state if state
                                            else "0"))
            if kind and path:
                fields.append("args=%s:%s" % (kind, path))
            lines.append(" ".join(fields) + "\n")
        return "".join(lines)

    def _kill(self, argv):
        if len(argv) != 3 or argv[1] != "-TERM":
            self.unknown.append(argv)
            raise AssertionError("faketapctl: unsupported kill %r" % argv)
        pid = int(argv[2])
        if pid not in self.tapdisks:
            return runner.Result(argv, 1, "",
                                 "kill: (%d) - No such process\n" % pid)
        del self.tapdisks[pid]
        return runner.Result(argv, 0, "", "")


class _Errno(Exception):
    def __init__(self, err):
        Exception.__init__(self, os.strerror(err))
        self.err = err
