"""Host-local datapath state: one JSON file per (URI, domain).

Kept under /var/run/nonpersistent (a tmpfs on XCP-ng): a host reboot empties
it, which is right, since every tapdisk, minor and attach died with the
host. The files are a memory of what this host did, never the truth: every
call checks them against ``tap-ctl list`` and ZFS before acting, so a
tapdisk that died, a minor that was freed, or a crash between two steps is
repaired by the next call, not trusted.

A file is written atomically (temporary file, fsync, rename): a crash leaves
the old or the new state, never half of one.

Fields (all optional but uri/dataset/domain):
  uri, dataset, domain
  device     the dataset whose /dev/zvol node is handed out (the zvol, or
             the temporary clone of a snapshot)
  clone      that clone's name, for snapshot VDIs
  pid        the tapdisk zfs-ng spawned for this domain
  minor      the blktap minor allocated for it; tapdev its device path
  attached   whether `tap-ctl attach` of pid to minor succeeded
  active     whether activate succeeded (and readonly: how)
  sr_uuid    the SR's uuid; phy: the VDI's /dev/sm/phy link (iostat)
"""

import os

from zfsng import lock, runfiles, testhooks

RUN_DIR = testhooks.get("ZFSNG_DATAPATH_DIR",
                        "/var/run/nonpersistent/zfs-ng-datapath")
# '.' is escaped too, so that it can join the two parts of a name
_SAFE = runfiles.SAFE - {"."}


def _escape(text):
    return runfiles.escape(text, _SAFE, upper=True)


def path(dataset, domain):
    """The state file of (dataset, domain): both escaped, joined by '.';
    shortened with a digest (runfiles.fit) when too long for a file name,
    as a dataset near ZFS's 255 characters is once its '/' are escaped.
    Names that fit are the ones earlier versions used (an upgrade while
    VMs run finds their state)."""
    joined = "%s.%s" % (_escape(dataset), _escape(domain))
    return os.path.join(RUN_DIR, runfiles.fit(
        joined, "%s\0%s" % (dataset, domain)) + ".json")


def vdi_lock(head):
    """The lock a datapath call holds on a VDI (its zvol, head) while it
    changes the VDI's tapdisk; taken before the SR lock."""
    return lock.held("datapath-" + head)


def load(dataset, domain):
    """The state dict, or None if this host holds no state for it."""
    return runfiles.read_json(path(dataset, domain))


def save(st):
    runfiles.write_json(path(st["dataset"], st["domain"]), st)


def remove(dataset, domain):
    runfiles.remove(path(dataset, domain))


def all_states():
    """Every state on this host (to know who else uses a clone)."""
    return [st for _, st in runfiles.read_all_json(RUN_DIR)]
