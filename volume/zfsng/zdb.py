"""zdb: the pool's on-disk structures read without the kernel's help, for
changed block tracking: a zvol snapshot's data end (``data_end``) and the
birth times of its blocks (``born_since``).

zfs-ng's pools have no cachefile, so zdb is always run with ``-e`` and the
directories of the pool's disks (``pools.pool_leaf_devices``); it reads
what the last synced txg left on disk.
"""

import os
import re

from zfsng import blockbirth, errors, log, pools, runner


def data_end(snapshot, block):
    """The end of the snapshot's last block, (maxblkid + 1) * block, as
    ``zdb -e`` reads the zvol's data object from the pool's disks; None if
    zdb cannot tell (it is a bound that only narrows, never a need).
    ``-e`` with the directories of the pool's disks: zfs-ng's pools have
    no cachefile, which plain zdb needs."""
    try:
        argv = _zdb_argv(snapshot)
    except errors.StorageError:
        return None
    result = runner.run(argv + ["-dddd", snapshot, "1"])
    found = re.search(r"dnode maxblkid: (\d+)", result.out)
    if result.rc != 0 or not found:
        log.info("zdb could not read %s's data object: %s", snapshot,
                 (result.err.strip() or "exit %d" % result.rc)[-200:])
        return None
    return (int(found.group(1)) + 1) * block


def _zdb_argv(dataset):
    """``zdb -e -p <dir>...``: zdb reading the pool of dataset from the
    directories of its disks."""
    argv = ["zdb", "-e"]
    for d in sorted(set(os.path.dirname(leaf) for leaf in
                        pools.pool_leaf_devices(dataset.split("/", 1)[0]))):
        argv += ["-p", d]
    return argv


def born_since(txg, snapshot, block, bound):
    """(born, data): the range sets of the snapshot's data blocks born
    after txg, and of all of them, from the birth times of its block
    pointers (``zdb -ddddd <snapshot> 1``, blockbirth): metadata only,
    read as it comes, within bound seconds. The snapshot must be on disk:
    zdb reads the pool from its disks, as the last synced txg left it
    (``zfs snapshot`` returns once its txg synced). A zvol (cbt reads a
    hidden one, which nothing writes) is read as that txg left it."""
    if snapshot.startswith("-") or "#" in snapshot or "/" not in snapshot:
        raise errors.InternalError("not a snapshot or zvol name: %r"
                                   % snapshot)
    argv = _zdb_argv(snapshot) + ["-ddddd", snapshot, "1"]
    result, found = runner.stream(
        argv, lambda read: blockbirth.parse(read, txg, block), bound=bound)
    if result.rc != 0:
        raise errors.ZfsError("zdb could not read the block tree of %s "
                              "(exit %d): %s" % (
                                  snapshot, result.rc,
                                  result.err.strip()[-300:] or "no message"))
    return found
