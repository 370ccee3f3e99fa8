"""tap-ctl: every command the datapath sends to blktap, through zfsng.runner.

Syntax and behaviour are those of blktap's control tool as XCP-ng 8.x ships
it (xapi-project/blktap and its xcp-ng/blktap fork, ``control/tap-ctl.c``
for the options, ``control/tap-ctl-*.c`` and ``drivers/tapdisk-control.c``
for what each one does):

  tap-ctl spawn                      start an idle tapdisk; prints its pid
                                     ("%d\\n" when stdout is not a tty)
  tap-ctl allocate                   reserve a minor; prints the device,
                                     /dev/xen/blktap-2/tapdev<minor>
                                     (BLKTAP2_IO_DEVICE + minor)
  tap-ctl stats -p PID -m MINOR      the VBD's figures, a JSON object
                                     (tapdisk_vbd_stats): nbd_mirror_failed,
                                     and the images it serves from, in
                                     order (each one's path, no type)
  tap-ctl attach -p PID -m MINOR     the tapdisk takes the minor's ring
                                     (EINVAL if it has it already)
  tap-ctl open -p PID -m MINOR -a aio:PATH [-R]
                                     open the image; -R read-only; -D would
                                     ask for no O_DIRECT (see below);
                                     EALREADY if already open
  tap-ctl close -p PID -m MINOR [-t SECONDS]
                                     close it (ENODEV: no such VBD)
  tap-ctl detach -p PID -m MINOR     release the ring (EINVAL while open); a
                                     tapdisk whose last VBD goes exits
                                     (tapdisk_server_check_state)
  tap-ctl free -m MINOR              release the minor (ENODEV if
                                     unknown); only ever of an orphan: on
                                     a minor a tapdisk holds, blktap
                                     3.55.5 answers 0 and the minor stays
                                     listed for good
  tap-ctl pause -p PID -m MINOR
                                     quiesce: in-flight I/O finishes, the
                                     image closes, the ring waits
  tap-ctl unpause -p PID -m MINOR [-a aio:PATH] [-2 nbd:SOCKET]
                                     reopen and resume; -a: another image
                                     (the VBD's name becomes it); -2 adds
                                     an NBD secondary in mirror mode
                                     (writes go to both; a failing
                                     secondary is dropped,
                                     nbd_mirror_failed in its stats)
  tap-ctl list                       one line per VBD, tapdisk and orphan
                                     minor: "pid=%d minor=%d state=%#x
                                     args=%s:%s", fields left out when
                                     unknown (tap_cli_list_dict; a 3-way
                                     outer join of minors, tapdisks, VBDs)

What the datapath relies on here is checked against the real blktap in
the test guest (tests/integration/test_tapctl_contract.py).

On failure tap-ctl prints strerror() on stderr and exits with the errno
(main(): ``return ret >= 0 ? ret : -ret``). The same sequence is what
XCP-ng's own SMAPIv3 tapdisk datapath runs (xcp-ng-xapi-storage
``libs/tapdisk.py``: spawn, allocate, attach -m -p; open -m -p -a; close;
destroy) and SMAPIv1's ``drivers/blktap2.py`` (TapCtl).

O_DIRECT. The zvol is opened without ``-D``, so tapdisk uses O_DIRECT;
reasons:
- block-aio opens with O_DIRECT whatever the flag says (tdaio_open in
  ``drivers/block-aio.c`` falls back to buffered I/O only when the open
  fails with EINVAL); not passing -D says what we rely on;
- ZFS already caches in the ARC; a buffered open would keep a second copy in
  dom0's page cache, and dom0's memory is small and shared with the ARC;
- tapdisk completes a guest write when its aio completes: with buffered
  I/O that is the page cache, which tapdisk never flushes; with O_DIRECT
  the write has reached ZFS. tapdisk passes no flush on either, so the
  write is stable only under the zvol's ``sync=always`` (zfs-ng's default:
  ARCHITECTURE.md, "Why these defaults");
- SMAPIv1 does the same for block-device SRs (blktap2.py keeps O_DIRECT
  except for file SRs, where it trades it for read caching).
Measured on a zvol in the test guest, buffered I/O halved sequential
throughput, cut 4k random reads by 4-8x, and "gained" only random writes
acknowledged before ZFS had them (ARCHITECTURE.md, The datapath: the figures).
"""

import errno
import json
import os
import re
import stat
import time

from zfsng import errors, log, runner

from zfsng_datapath.errors import TapdevHeld, TapdiskError, \
    TapdiskUnavailable

TAP_CTL = "tap-ctl"
# Every VBD a tapdisk opens serves its image over NBD (fixed newstyle, any
# export name) on this unix socket (tapdisk_vbd_start_nbdservers at open,
# TAPDISK_NBDSERVER_NEW_SOCK_PATH "<pid>.<minor>"): xapi's migrations write
# into a disk through it. It exists from open to close.
NBD_SOCKET = "/var/run/blktap-control/nbd%d.%d"
# Beside it, the same server takes connections made elsewhere: a unix
# socket that receives a connected fd (SCM_RIGHTS) and serves it as a
# new-style NBD client (td_fdreceiver: TAPDISK_NBDSERVER_NEW_LISTEN_SOCK_PATH
# "<pid>.<minor>"). xapi passes a storage migration's connection there.
NBD_FD_SOCKET = "/var/run/blktap-control/nbdserver-new%d.%d"
PAUSE_REQUESTED = 0x10   # TD_VBD_PAUSE_REQUESTED in a VBD's state
PAUSED = 0x20         # TD_VBD_PAUSED in a VBD's state (tapdisk-vbd.h)
# A pause whose tap-ctl failed (killed at its bound) stays requested in
# tapdisk, which completes it once its in-flight requests have (each
# bounded by TD_VBD_REQUEST_TIMEOUT, 120 s): how long pause waits for
# that before it unpauses.
PAUSE_SETTLE = 150.0  # seconds
SETTLE_POLL = 0.5     # seconds
CLOSE_TIMEOUT = 120   # seconds: tap-ctl close -t, as SMAPIv1 uses
IMAGE_TYPE = "aio"    # raw: the zvol's blocks are the disk's blocks
# Known transient failures, retried a bounded number of times (as sm's
# blktap2.py does): `list` fails with EPROTO or ENOENT when a tapdisk exits
# while it is being asked; `spawn` fails now and then with status 1
# (CA-292268).
RETRIES = 5
RETRY_DELAY = 0.3     # seconds
_TRANSIENT = {"list": (errno.EPROTO, errno.ENOENT), "spawn": (1,)}

# allocate's output: /dev/xen/blktap-2/tapdev<N> (blktap 3.x, XCP-ng 8.x);
# newer blktaps name it blktap<N> or .../tapdisk-<N>: the minor is the number.
_DEVICE_RE = r"^(/\S*?(?:tapdev|blktap|tapdisk-))([0-9]+)$"


# A minor whose tapdisk died keeps its block device while anything holds
# it open (blkback, for a running VM); once released, blktap retries the
# destroy every 5 s (the 6.1 port; XenServer's driver every 0.1 s). A new
# tapdisk must not take the minor before: its device creation fails
# (EEXIST, which tap-ctl open does not report) and the retry then destroys
# the device under it, leaving an "open" VBD with no disk.
RELEASE_TIMEOUT = 12.0   # seconds: two retries of the driver, and some
RELEASE_POLL = 0.2
SYS_DEV_BLOCK = "/sys/dev/block"


def _run(argv):
    transient = _TRANSIENT.get(argv[0], ())
    result = runner.run_retried([TAP_CTL] + argv,
                                lambda r: r.rc in transient, RETRIES,
                                RETRY_DELAY)
    if result.rc == 0:
        return result.out
    text = (result.err.strip() or result.out.strip() or "no message")
    if result.rc == 127 and not result.out:
        raise TapdiskUnavailable(
            "tap-ctl is not available on this host (%s): a guest disk needs "
            "XCP-ng's blktap (tap-ctl, tapdisk); dom0 attaches do not"
            % text)
    name = errno.errorcode.get(result.rc, "exit %d" % result.rc)
    raise TapdiskError("tap-ctl %s failed (%s): %s"
                       % (" ".join(argv), name, text), rc=result.rc)


def _last_int(text, what):
    match = re.search(r"([0-9]+)\s*$", text)
    if not match:
        raise TapdiskError("tap-ctl %s printed no number: %r" % (what, text))
    return int(match.group(1))


def spawn():
    """Start a tapdisk; return its pid."""
    return _last_int(_run(["spawn"]), "spawn")


def allocate():
    """Reserve a minor; return (minor, device path)."""
    out = _run(["allocate"]).strip()
    line = out.splitlines()[-1].strip() if out else ""
    match = re.match(_DEVICE_RE, line)
    if not match:
        raise TapdiskError("tap-ctl allocate printed %r, not a tap device"
                           % out)
    return int(match.group(2)), line


def nbd_socket(pid, minor):
    """The path of the NBD server of the tapdisk pid's VBD minor."""
    return NBD_SOCKET % (int(pid), int(minor))


def nbd_fd_socket(pid, minor):
    """Where the NBD server of the tapdisk pid's VBD minor takes fds."""
    return NBD_FD_SOCKET % (int(pid), int(minor))


def attach(pid, minor):
    _run(["attach", "-p", str(pid), "-m", str(minor)])


def open_image(pid, minor, path, readonly):
    argv = ["open", "-p", str(pid), "-m", str(minor),
            "-a", "%s:%s" % (IMAGE_TYPE, path)]
    if readonly:
        argv.append("-R")
    _run(argv)


def close(pid, minor):
    _run(["close", "-p", str(pid), "-m", str(minor),
          "-t", str(CLOSE_TIMEOUT)])


def detach(pid, minor):
    _run(["detach", "-p", str(pid), "-m", str(minor)])


def pause(pid, minor):
    """Quiesce the VBD: in-flight requests finish, the image is closed, new
    guest requests wait in the ring (a guest sees a stall, not an error)
    until unpause. A migration's last copy runs while it is paused. No -t:
    blktap 3.55.5's tap-ctl takes it for a usage error (its 't' case
    falls through to '?'); the runner's bound on the command holds.

    A pause that fails leaves the VBD running: tapdisk goes on with a
    pause it was asked for even when tap-ctl is gone (tapdisk-control.c
    leaves TD_VBD_PAUSE_REQUESTED set), and nothing else would ever
    unpause it, the guest's disk frozen for good. So pause waits for that
    request to settle, unpauses a VBD that ended paused, and raises the
    pause's error."""
    try:
        _run(["pause", "-p", str(pid), "-m", str(minor)])
    except errors.StorageError as exc:
        log.error("tap-ctl pause of tapdisk %s minor %s failed (%s): "
                  "making sure the VBD runs", pid, minor, exc.message)
        settle_unpaused(pid, minor)
        raise


def settle_unpaused(pid, minor):
    """Leave the VBD running: wait (at most PAUSE_SETTLE seconds) while a
    pause is requested, then unpause it if it is paused. Never raises: it
    runs on the way out of an error, which is the one to report."""
    bound = PAUSE_SETTLE
    deadline = time.monotonic() + bound
    while True:
        try:
            row = view().vbd(pid, minor)
            if row is None or not row.state_flag(PAUSE_REQUESTED | PAUSED):
                return
            if row.is_paused:
                unpause(pid, minor)
                log.info("tapdisk %s minor %s unpaused", pid, minor)
                return
        except errors.StorageError as exc:
            log.error("tapdisk %s minor %s: %s", pid, minor, exc.message)
        if time.monotonic() >= deadline:
            log.error("tapdisk %s minor %s may still be paused after %d s: "
                      "tap-ctl unpause -p %s -m %s resumes it", pid, minor,
                      bound, pid, minor)
            return
        time.sleep(SETTLE_POLL)


def unpause(pid, minor, secondary=None, image=None):
    """Reopen the image (image: another one, a path opened raw) and
    resume; with secondary (``nbd:<socket>``) every later write also goes
    to it, acknowledged once both have it (mirror mode), and a failing
    secondary is dropped, the guest unaffected (``nbd_mirror_failed`` in
    stats)."""
    argv = ["unpause", "-p", str(pid), "-m", str(minor)]
    if image:
        argv += ["-a", "%s:%s" % (IMAGE_TYPE, image)]
    _run(argv + (["-2", secondary] if secondary else []))


def mirror_failed(pid, minor):
    """Whether the VBD's tapdisk dropped its mirror's secondary
    (``nbd_mirror_failed`` in ``tap-ctl stats``: set when the secondary
    failed a write, timed out (block-nbd.c, 30 s) or could not be opened;
    the guest is never told). None when tapdisk does not say."""
    return parse_mirror_failed(_run(["stats", "-p", str(pid),
                                     "-m", str(minor)]))


def mirror_state(pid, minor):
    """(mirror_failed, images) from one ``tap-ctl stats``: what the
    mirror job's watchdog asks every few seconds."""
    text = _run(["stats", "-p", str(pid), "-m", str(minor)])
    return parse_mirror_failed(text), parse_images(text)


def images(pid, minor):
    """The paths of the images tapdisk serves the VBD from, first first
    (``images`` in ``tap-ctl stats``: the live chain, tapdisk_vbd_stats);
    None when its stats do not say. In mirror mode: the zvol, then the
    NBD secondary's socket. An ENOSPC on the zvol there makes tapdisk
    retire the zvol from the chain and serve the guest from the secondary
    alone (TD_IGNORE_ENOSPC, tapdisk_vbd_complete_td_request), which
    nbd_mirror_failed does not show: the zvol's absence here does."""
    return parse_images(_run(["stats", "-p", str(pid), "-m", str(minor)]))


def parse_images(text):
    """The image paths of ``tap-ctl stats``'s output; None when it is not
    the JSON object tapdisk prints."""
    try:
        return [str(image["name"]) for image in json.loads(text)["images"]]
    except (ValueError, KeyError, TypeError):
        return None


def parse_mirror_failed(text):
    """``nbd_mirror_failed`` of ``tap-ctl stats``'s output, as a bool; None
    when it is not there."""
    match = re.search(r'"nbd_mirror_failed"\s*:\s*(-?[0-9]+)', text)
    return None if match is None else match.group(1) != "0"


def device_present(tapdev):
    """True while the kernel has a block device at the tapdev node's
    device number (``/sys/dev/block/<major>:<minor>``)."""
    try:
        info = os.stat(tapdev)
    except OSError:
        return False
    if not stat.S_ISBLK(info.st_mode):
        return False
    return os.path.exists(os.path.join(SYS_DEV_BLOCK, "%d:%d" % (
        os.major(info.st_rdev), os.minor(info.st_rdev))))


def wait_released(tapdev, timeout=RELEASE_TIMEOUT):
    """Wait (bounded) until the block device a dead tapdisk left at tapdev
    is gone, so that a new tapdisk can make it again. TapdevHeld if it
    stays: something still has it open."""
    deadline = time.time() + timeout
    waited = False
    while device_present(tapdev):
        if time.time() >= deadline:
            raise TapdevHeld(
                "%s is still open though its tapdisk is gone: the VM's "
                "backend (or another process) holds it, and a new tapdisk "
                "cannot take it over. Unplug the VBD (or shut the VM down) "
                "and retry" % tapdev)
        if not waited:
            log.info("waiting up to %ds for the kernel to release %s",
                     int(timeout), tapdev)
            waited = True
        time.sleep(RELEASE_POLL)


def free(minor):
    _run(["free", "-m", str(minor)])


def terminate(pid):
    """SIGTERM an idle tapdisk zfs-ng spawned and never attached (one that
    has a VBD exits by itself when its last VBD is detached). sm does the
    same (blktap2.py TapCtl.shutdown)."""
    result = runner.run(["kill", "-TERM", str(pid)])
    if result.rc != 0:
        log.info("kill %d: %s", pid, result.err.strip())


class Row(object):
    """One line of ``tap-ctl list``: any field may be None."""

    __slots__ = ("pid", "minor", "state", "type", "path")

    def __init__(self, pid=None, minor=None, state=None, type=None,
                 path=None):
        self.pid, self.minor, self.state = pid, minor, state
        self.type, self.path = type, path

    @property
    def is_open(self):
        return self.path is not None

    @property
    def is_paused(self):
        """Paused (its image closed, its name kept) until unpause."""
        return self.state_flag(PAUSED)

    def state_flag(self, flags):
        """Whether any of flags is set in the VBD's state."""
        return bool((self.state or 0) & flags)

    def __repr__(self):
        return "Row(pid=%r, minor=%r, args=%s)" % (
            self.pid, self.minor,
            "%s:%s" % (self.type, self.path) if self.path else None)


def parse_list(text):
    """Rows of ``tap-ctl list`` (the non-tty key=value form)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        row = Row()
        # args is last and is the only field whose value may hold spaces
        for field in line.split(" ", 3):
            key, sep, value = field.partition("=")
            if not sep:
                log.info("ignoring tap-ctl list field %r", field)
                continue
            try:
                if key in ("pid", "minor"):
                    setattr(row, key, int(value, 10))
                elif key == "state":
                    row.state = int(value, 16)
                elif key == "args":
                    kind, _, path = value.partition(":")
                    row.type, row.path = kind, path
            except ValueError:
                raise TapdiskError("unexpected tap-ctl list line %r" % line)
        rows.append(row)
    return rows


def list_all():
    """Every tapdisk, VBD and minor on the host: one command."""
    return parse_list(_run(["list"]))


class View(object):
    """What ``tap-ctl list`` said, with the questions the datapath asks."""

    def __init__(self, rows):
        self.rows = rows

    def vbd(self, pid, minor):
        """The row of minor attached to tapdisk pid, or None."""
        if pid is None or minor is None:
            return None
        for row in self.rows:
            if row.pid == pid and row.minor == minor:
                return row
        return None

    def tapdisk_alive(self, pid):
        return pid is not None and any(r.pid == pid for r in self.rows)

    def tapdisk_idle(self, pid):
        """A live tapdisk with no VBD (listed as "pid=N" alone)."""
        rows = [r for r in self.rows if r.pid == pid]
        return bool(rows) and all(r.minor is None for r in rows)

    def minor_orphan(self, minor):
        """The minor is allocated and no live tapdisk holds it."""
        rows = [r for r in self.rows if r.minor == minor]
        return bool(rows) and all(r.pid is None for r in rows)

    def minor_known(self, minor):
        return minor is not None and any(r.minor == minor for r in self.rows)


def view():
    return View(list_all())
