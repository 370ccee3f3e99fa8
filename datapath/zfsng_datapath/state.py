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
"""

import errno
import json
import os

from zfsng import testhooks

RUN_DIR = testhooks.get("ZFSNG_DATAPATH_DIR",
                        "/var/run/nonpersistent/zfs-ng-datapath")
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                  "0123456789-_")


def _escape(text):
    """Every character but [A-Za-z0-9_-] as %XX ('.' too, so that it can
    join two parts). Names reaching here are ASCII (uri checks them)."""
    return "".join(c if c in _SAFE else "%%%02X" % ord(c) for c in text)


def path(dataset, domain):
    return os.path.join(RUN_DIR, "%s.%s.json" % (_escape(dataset),
                                                  _escape(domain)))


def load(dataset, domain):
    """The state dict, or None if this host holds no state for it."""
    try:
        with open(path(dataset, domain)) as f:
            return json.load(f)
    except (IOError, OSError) as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    except ValueError:
        return None  # cannot happen with atomic writes; treat as absent


def save(st):
    os.makedirs(RUN_DIR, 0o700, exist_ok=True)
    final = path(st["dataset"], st["domain"])
    tmp = final + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(st, sort_keys=True).encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)


def remove(dataset, domain):
    try:
        os.unlink(path(dataset, domain))
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


def all_states():
    """Every state on this host (to know who else uses a clone)."""
    try:
        entries = os.listdir(RUN_DIR)
    except OSError:
        return []
    found = []
    for name in sorted(entries):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(RUN_DIR, name)) as f:
                found.append(json.load(f))
        except (IOError, OSError, ValueError):
            continue
    return found
