"""A zvol's device node, which udev makes: wait for it, and prove it is
the zvol. The one place that waits for a udev link: SR.attach waits
for every zvol's link after an import, the datapath for the one it hands
out.

udev makes ``/dev/zvol/<dataset>`` asynchronously after a zvol (or a clone)
appears, after a pool import, after a rename. A link can also be stale for
a moment: a zvol destroyed and made again under the same name while udev
still has the old event queued. So before a path is handed to tapdisk or to
a dom0 user:

1. wait, bounded (TIMEOUT), for the link, letting udev settle in between;
2. resolve it: it must point at a zvol block device (``/dev/zd<N>``);
3. ask that device which dataset it is: ``zvol_id <dev>`` (OpenZFS's udev
   helper, the BLKZNAME ioctl) must print exactly the dataset's name. Where
   zvol_id is missing, udev's own record of the device's links
   (``udevadm info --query=symlink``) must hold the link.
"""

import os
import re
import stat
import time

from zfsng import log, runner, udev
from zfsng.errors import DeviceNotReady

DEV_DIR = "/dev"
DEV_ZVOL = "/dev/zvol"
# zvol_id is a udev helper, not on PATH: /lib/udev (OpenZFS 2.1 packages,
# Debian), /usr/lib/udev (2.2+, XCP-ng's usrmerged layout).
ZVOL_ID_PATHS = ("/usr/lib/udev/zvol_id", "/lib/udev/zvol_id")
TIMEOUT = 30.0     # seconds, the bound on a whole wait
POLL = 0.2         # seconds between two looks
SETTLE_MAX = 5     # seconds: one udevadm settle at most this long
_ZD_RE = r"^zd[0-9]+\Z"


def link(dataset):
    return os.path.join(DEV_ZVOL, dataset)


def _zvol_id():
    for path in ZVOL_ID_PATHS:
        if os.path.exists(path):
            return path
    return None


def _name_of(device, dataset):
    """The dataset the device belongs to, as the kernel or udev says it."""
    helper = _zvol_id()
    if helper:
        result = runner.run([helper, device])
        if result.rc != 0:
            return None, "zvol_id %s failed: %s" % (
                device, result.err.strip() or result.rc)
        return result.out.strip(), None
    links, reason = udev.links(device)
    if links is None:
        return None, reason
    want = "zvol/" + dataset
    if want in links:
        return dataset, None
    others = [l[len("zvol/"):] for l in links if l.startswith("zvol/")]
    return (others[0] if others else None), None


def check(dataset):
    """(device, None) if the link is there and is the zvol, else
    (None, reason)."""
    path = link(dataset)
    if not os.path.lexists(path):
        return None, "%s does not exist" % path
    real = os.path.realpath(path)
    if os.path.dirname(real) != DEV_DIR or \
            not re.match(_ZD_RE, os.path.basename(real)):
        return None, "%s points at %s, not a zvol device" % (path, real)
    if not os.path.exists(real):
        return None, "%s points at %s, which is gone" % (path, real)
    name, error = _name_of(real, dataset)
    if error:
        return None, error
    if name != dataset:
        return None, "%s is %s, which belongs to %r, not %r" % (
            path, real, name, dataset)
    return real, None


def openers(dataset, proc="/proc"):
    """The pids of the processes that hold the zvol's device open (a
    tapdisk serving a VM, a dom0 user), from /proc/<pid>/fd: what the
    kernel knows, where a record of attaches would only be a memory.
    [] when the zvol has no device node."""
    try:
        device = os.stat(link(dataset)).st_rdev
    except OSError:
        return []
    found = []
    for pid in (p for p in os.listdir(proc) if p.isdigit()):
        fds = os.path.join(proc, pid, "fd")
        try:
            entries = os.listdir(fds)
        except OSError:          # gone meanwhile, or a kernel thread
            continue
        for fd in entries:
            try:
                st = os.stat(os.path.join(fds, fd))
            except OSError:
                continue
            if stat.S_ISBLK(st.st_mode) and st.st_rdev == device:
                found.append(int(pid))
                break
    return found


def wait(dataset, timeout=None):
    """Wait (bounded) until /dev/zvol/<dataset> exists and is that zvol;
    return the real device (/dev/zd<N>). Raise DeviceNotReady."""
    timeout = TIMEOUT if timeout is None else timeout
    deadline = time.time() + timeout
    settled = False
    while True:
        real, reason = check(dataset)
        if real:
            if settled:
                log.debug("%s ready: %s", dataset, real)
            return real
        left = deadline - time.time()
        if left <= 0:
            raise DeviceNotReady(
                "the device of %s is not ready after %ds: %s. Check that "
                "the pool is imported and udev is running (udevadm settle)"
                % (dataset, int(timeout), reason))
        # settle returns when udev's queue is empty (or at its timeout):
        # the zvol's own event is then handled, or not queued yet
        udev.settle(min(SETTLE_MAX, int(left + 0.999)))
        settled = True
        real, reason = check(dataset)
        if real:
            return real
        time.sleep(min(POLL, max(0.0, deadline - time.time())))


def wait_for_links(datasets, timeout=TIMEOUT):
    """Wait, bounded, until udev made the link of every zvol of datasets
    (after an import they appear asynchronously); a link still missing is
    logged, not fatal: the datapath waits for it again (``wait``)."""
    if not datasets:
        return
    udev.settle(timeout)
    missing = [d for d in datasets if not os.path.exists(link(d))]
    if missing:
        log.warning("after %ds, no /dev/zvol link yet for %s",
                    int(timeout), ", ".join(missing))
