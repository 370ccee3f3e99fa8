"""What xcp-rrdd's iostat plugin needs to count a guest's disk I/O.

The plugin (xen-api ocaml/xcp-rrdd/bin/rrdp-iostat) reads the statistics
of every tapdisk in ``tap-ctl list``, and keeps only those it can name:
- the SR and VDI: it reads every link ``/dev/sm/phy/<sr uuid>/<vdi
  uuid>`` with one readlink and looks the path tapdisk opened (what
  follows ``aio:`` in ``tap-ctl list``) up among the link targets, as
  strings. So the link holds exactly the path the datapath gives
  ``tap-ctl open`` (``/dev/zvol/<pool>/.../<zvol>``), not a resolved one;
- the VM: it reads ``sm-data/vdi-uuid`` in the VBD's xenstore backend,
  which xenopsd writes from the XenDisk implementation's ``extra``.
With both, the VDI's reads, writes and latency appear per VM disk
(``vbd_xvda_*``) and per SR (``iops_read_<first 8 of the SR uuid>`` and
the rest), the figures Xen Orchestra draws.

A link is made at Datapath.attach (guests and dom0 alike: a dom0 attach
has no tapdisk, so nothing is counted, but the link says the same thing
SMAPIv1's do) and removed at the last detach of that VDI on this host. It
follows the VDI, not its zvol: a reset or revert rotation puts another
zvol under the same name, which tapdisk opens at the next activate. The
plugin's scan stops at the first entry it cannot readlink, so only links
are ever put in these directories: a new one is made beside them
(``/dev/sm``) and renamed into place.
"""

import errno
import os

from zfsng import log, testhooks

PHY_DIR = testhooks.get("ZFSNG_SM_PHY_DIR", "/dev/sm/phy")


def link_path(sr_uuid, vdi_uuid):
    return os.path.join(PHY_DIR, sr_uuid, vdi_uuid)


def make(sr_uuid, vdi_uuid, device):
    """The VDI's link to device; its path, or None when it could not be
    made (logged: the statistics are lost, never the attach)."""
    link = link_path(sr_uuid, vdi_uuid)
    try:
        if _target(link) != device:
            os.makedirs(os.path.dirname(link), 0o755, exist_ok=True)
            _replace(link, device)
    except OSError as exc:
        log.warning("no I/O statistics link %s: %s", link, exc)
        return None
    return link


def _replace(link, device):
    """link -> device, made beside PHY_DIR and renamed into place."""
    tmp = os.path.join(os.path.dirname(PHY_DIR), ".zfs-ng-%d-%s"
                       % (os.getpid(), os.path.basename(link)))
    drop(tmp, ())       # a crashed call's, if any
    os.symlink(device, tmp)
    try:
        os.rename(tmp, link)
    except OSError:
        drop(tmp, ())
        raise


def drop(link, in_use):
    """Remove link unless a path in in_use (other attaches of this host)
    is it. Never fails."""
    if not link or link in in_use:
        return
    try:
        os.unlink(link)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("cannot remove I/O statistics link %s: %s", link,
                        exc)


def _target(link):
    try:
        return os.readlink(link)
    except OSError:
        return None
