"""This host's datapath records: one JSON file per (dataset, domain).

The datapath plugin writes them (zfsng_datapath/state.py); the volume
plugin only reads them, to know which live VDIs a VM may be writing on
this host (``writers``: a clone of such a VDI gets a fresh content_id,
zfsng/contentid.py). Both plugins import the core, never each other, so
the directory, the file names and the fields are known here, once.

Kept under /var/run/nonpersistent (a tmpfs on XCP-ng): a host reboot empties
it, which is right, since every tapdisk, minor and attach died with the
host. The records are a memory of what this host did, never the truth: the
datapath checks them against ``tap-ctl list`` and ZFS before acting, so a
tapdisk that died, a minor that was freed, or a crash between two steps is
repaired by the next call, not trusted. Written whole (runfiles): a crash
leaves the old or the new record, never half of one.

Fields (all optional but uri/dataset/domain):
  uri, dataset, domain
  device     the dataset whose /dev/zvol node is handed out (the zvol, or
             the temporary clone of a snapshot)
  clone      that clone's name, for snapshot VDIs
  pid        the tapdisk zfs-ng spawned for this domain
  minor      the blktap minor allocated for it; tapdev its device path
  attached   whether `tap-ctl attach` of pid to minor succeeded
  active     whether activate succeeded (and readonly: how); false again
             after deactivate
  writing    a read-write activate began (set before its new content_id,
             so before tapdisk opens the zvol); false after a read-only
             activate and after deactivate
  sr_uuid    the SR's uuid; phy: the VDI's /dev/sm/phy link (iostat)
"""

import os

from zfsng import runfiles, testhooks

RUN_DIR = testhooks.get("ZFSNG_DATAPATH_DIR",
                        "/var/run/nonpersistent/zfs-ng-datapath")
# '.' is escaped too, so that it can join the two parts of a name
_SAFE = runfiles.SAFE - {"."}


def _escape(text):
    return runfiles.escape(text, _SAFE, upper=True)


def path(dataset, domain):
    """The record of (dataset, domain): both escaped, joined by '.';
    shortened with a digest (runfiles.fit) when too long for a file name,
    as a dataset near ZFS's 255 characters is once its '/' are escaped.
    Names that fit are the ones earlier versions used (an upgrade while
    VMs run finds their records)."""
    joined = "%s.%s" % (_escape(dataset), _escape(domain))
    return os.path.join(RUN_DIR, runfiles.fit(
        joined, "%s\0%s" % (dataset, domain)) + ".json")


def all_records():
    """Every record on this host: the documents that are JSON objects
    (one torn or foreign is no record)."""
    return [st for _, st in runfiles.read_all_json(RUN_DIR)
            if isinstance(st, dict)]


def is_writer(st):
    """Whether the record is of a read-write activate, begun or done: its
    domain may be writing the dataset now, or as soon as its tapdisk
    opens the zvol or is replaced (Datapath.activate does that on the same
    minor), whether or not anything holds the zvol open at this instant.
    A record with no readonly field is taken for read-write: wrong only
    towards caution."""
    return st.get("writing") is True or (
        st.get("active") is True and st.get("readonly") is not True)


def writers(dataset):
    """The domains with a read-write activate of dataset on this host.
    Never raises for what it finds: an unreadable directory or record is
    none (runfiles.read_all_json)."""
    return sorted(str(st.get("domain")) for st in all_records()
                  if st.get("dataset") == dataset and is_writer(st))
