"""The space a mirrored zvol is guaranteed while tapdisk mirrors it.

Why. In mirror mode tapdisk marks the zvol's image TD_IGNORE_ENOSPC: on
ENOSPC it retires the zvol and goes on with the secondary alone
(tapdisk-vbd.c), whose reads it forwards to the next image, and there is
none: every guest read then returns zeros, and the guest's writes exist
only on the destination (measured on OpenZFS 2.3 through the real
tapdisk: a pool filled during a mirror). So a zvol must never be refused
a write while mirrored, on a pool full or not.

Room to write the disk whole is not enough. Before a write, ZFS reserves
its worst case: every byte dirtied in a txg not yet synced counts
``spa_asize_inflation`` (24) times (dmu_objset_willuse_space,
dsl_dir_tempreserve_space). The zvol's unused refreservation covers that
estimate first (dsl_dataset_check_quota's ref_rsrv); what it does not
cover is asked of the parents, up to the pool's root, which on a full
pool is over its quota. OpenZFS 2.1.7 and later 2.1 then answer ENOSPC
(dsl_dir.c dsl_dir_tempreserve_impl, "used_on_disk >= quota"; the
"quota: extend quota for dataset" backport); 2.2 and 2.3 answer ERESTART
when the pool's deferred frees exceed the overrun (OpenZFS commit
ba769ea351), so the write waits for a txg and goes on. Measured on 2.1
through tapdisk: 64 KiB writes refused with 36 MB of the refreservation
unused.

So the guard is the whole disk plus that estimate, and the estimate is
kept bounded: ``hold`` sets ``refreservation`` to ``auto`` (the whole
disk, snapshots or not), then raises it by ``Budget.margin``: the
inflation times (a window of dirtied bytes, plus what tapdisk can have in
flight twice over, plus the writes ZFS has assigned at once, plus the
dnode's blocks), each write and each dirtied block counted at least one
sector of the pool's largest ashift, as ZFS counts it (``sector``: read
from the vdevs' labels; 64 KiB, ashift 16's, when none can be read; never
below 8 KiB). The mirror's relay (zfsng_datapath.relay) counts each
guest write's dirtied blocks (``Budget.add``) and writes the pool out
(``zpool sync``) whenever a window is full: dd_space_towrite only drops
when its txg syncs (dsl_dir_sync), however few bytes tapdisk has in
flight. The largest window of WINDOWS the pool has room for is taken (a
larger one: fewer syncs); a pool without room even for the smallest
refuses the hold (OutOfSpace), before tapdisk ever mirrors.

Crash safety: the record (``meta.MIRROR_GUARD``: the refreservation
before) comes first and goes last, each one command. The mirror job
holds ``lock.reading(lock_name(zvol))`` while the guard stands, and marks
the disk (``mark_mirroring``) before its VBD can be in mirror mode; the
mark goes (``mirror_ended``) only once the VBD is out of it. The
collector releases a guard no live job holds and no VBD may still
mirror (a dom0 crash mid-move: the marks live on tmpfs), so a thin disk
does not stay thick, and a dead job's VBD keeps its guard until the next
datapath call has taken it out of mirror mode.
"""

import os

from zfsng import errors, lock, log, meta, pools, zfs

LOCK_SUFFIX = "@zfsng-mirror-guard"
KiB, MiB = 1 << 10, 1 << 20

# ZFS's worst-case factor of a dirtied byte (spa_misc.c spa_asize_inflation,
# 24 in OpenZFS 2.1 and 2.3): the running module's value when it says.
INFLATION = 24
INFLATION_PARAMETER = "/sys/module/zfs/parameters/spa_asize_inflation"
# tapdisk's most in flight on one VBD (blktap 3.55.5 tapdisk.h): MAX_REQUESTS
# requests of BLKIF_MAX_SEGMENTS_PER_REQUEST pages, each segment one write.
TAPDISK_REQUESTS = 32
TAPDISK_SEGMENTS = 11
PAGE = 4 * KiB
# A zvol's indirect blocks (DN_MAX_INDBLKSHIFT) and block pointers.
INDIRECT_BLOCK = 128 * KiB
BLOCK_POINTER = 128
# The smallest ZFS's estimate of a write, and of each block it dirties,
# is (spa_get_worst_case_asize: MAX(size, 1 << spa_max_ashift), the
# largest ashift of the pool's normal vdevs): one sector, the pool's
# (``sector``), never taken below 8 KiB.
SECTOR = 8 * KiB
# The largest ashift OpenZFS 2.1 and 2.3 accept (spa.h ASHIFT_MAX): the
# sector assumed when the pool's cannot be read.
ASHIFT_MAX = 16
DNODE = 512                # dmu_tx_count_dnode
DNODE_BLOCK = 16 * KiB
# Dirtied bytes between two forced syncs, largest first.
WINDOWS = (64 * MiB, 16 * MiB, 4 * MiB)


def lock_name(zvol):
    """The name the mirror job holds with lock.reading."""
    return zvol + LOCK_SUFFIX


def sector(pool):
    """The pool's sector as ZFS's estimate sizes it (at least SECTOR):
    that of its vdevs' largest ashift (pools.max_ashift). When no label
    says, ASHIFT_MAX's: a larger margin can only refuse the move (the VM
    stays where it is, OutOfSpace says why), a smaller one could let ZFS
    refuse a mirrored write, and tapdisk would serve the guest zeros."""
    try:
        shift = pools.max_ashift(pool)
    except (errors.ZfsError, errors.CommandTimeout) as exc:
        log.info("%s: its ashift unread (%s)", pool, exc)
        shift = None
    if shift is None:
        log.info("%s: no vdev label read, its sector taken as the largest "
                 "ZFS allows (ashift %d)", pool, ASHIFT_MAX)
        shift = ASHIFT_MAX
    return max(SECTOR, 1 << shift)


def inflation():
    """ZFS's spa_asize_inflation, INFLATION when unreadable."""
    try:
        with open(INFLATION_PARAMETER) as f:
            return max(1, int(f.read().strip()))
    except (IOError, OSError, ValueError):
        return INFLATION


class Budget(object):
    """The dirtied-bytes bound of a guarded zvol's writes: what each
    write can dirty in ZFS (its data blocks whole, and its indirect
    blocks at every level), summed over a window."""

    def __init__(self, volsize, volblocksize, window, sector=SECTOR):
        self.block = max(int(volblocksize), 512)
        self.window = window
        self.sector = sector
        # what ZFS's estimate counts of each dirtied data block
        # (dbuf_dirty -> dmu_objset_willuse_space): a sector at least
        self.charge = max(self.block, sector)
        blocks = max(1, -(-int(volsize) // self.block))
        per = INDIRECT_BLOCK // BLOCK_POINTER
        self.spans, self.indirect_total, count = [], 0, blocks
        span = self.block
        while True:                    # one level of indirect blocks each
            span *= per
            count = -(-count // per)
            self.spans.append(span)
            self.indirect_total += count * INDIRECT_BLOCK
            if count == 1:
                break
        self.data = self.indirect = 0

    def dirtied(self, offset, length):
        """(data, indirect) bytes one write can dirty."""
        end = offset + max(length, 1) - 1
        data = (end // self.block - offset // self.block + 1) * self.charge
        indirect = sum((end // s - offset // s + 1) * INDIRECT_BLOCK
                       for s in self.spans)
        return data, indirect

    def _bound(self, data, indirect):
        return data + min(indirect, self.indirect_total)

    def add(self, offset, length):
        """Count a write; whether the window is full (then ``sync``
        the pool and ``reset``)."""
        data, indirect = self.dirtied(offset, length)
        self.data += data
        self.indirect += indirect
        return self._bound(self.data, self.indirect) >= self.window

    def reset(self):
        self.data = self.indirect = 0

    def in_flight(self):
        """What tapdisk's requests in flight can dirty at once: each of
        its requests a run of pages anywhere on the disk."""
        data, indirect = self.dirtied(self.block - 1,
                                      TAPDISK_SEGMENTS * PAGE)
        return self._bound(TAPDISK_REQUESTS * data,
                           TAPDISK_REQUESTS * indirect)

    def margin(self, factor):
        """The refreservation beyond the whole disk that keeps ZFS's
        estimate of every write inside it: the window (plus the one
        write that filled it), the requests in flight when a sync began
        and those not yet counted, and the writes assigned at once
        (each at least a sector, plus its dnode), and the zvol's dnode
        block and its objset's meta-dnode indirect blocks in each of the
        three txgs not yet synced."""
        most = self._bound(*self.dirtied(self.block - 1,
                                         TAPDISK_SEGMENTS * PAGE))
        segments = TAPDISK_REQUESTS * TAPDISK_SEGMENTS
        assigned = segments * (PAGE + self.sector + DNODE)
        meta_blocks = 3 * (max(DNODE_BLOCK, self.sector) +
                           3 * INDIRECT_BLOCK)
        return factor * (self.window + most + 2 * self.in_flight() +
                         assigned + meta_blocks)


def hold(zvol):
    """Guarantee the zvol room for its writes while mirrored; returns
    the Budget the relay keeps. OutOfSpace (nothing changed) when its
    pool lacks the room. Under the SR lock."""
    row = zfs.get_one(zvol, ["refreservation", "volsize", "volblocksize",
                             meta.MIRROR_GUARD])
    row["sector"] = sector(zvol.split("/", 1)[0])
    if not row.get(meta.MIRROR_GUARD):
        zfs.set_props(zvol, {meta.MIRROR_GUARD:
                             row.get("refreservation") or "0"})
    try:
        zfs.set_props(zvol, {"refreservation": "auto"})
        whole = int(zfs.get_one(zvol, ["refreservation"])["refreservation"])
        budget = _raise(zvol, whole, row, inflation())
    except errors.OutOfSpace as exc:
        release(zvol)
        raise errors.OutOfSpace(
            "%s cannot be moved while its VM runs: its pool lacks the free "
            "space to guarantee the disk's writes while they are mirrored "
            "(room to write it whole and ZFS's estimate of the writes in "
            "flight: at least %d MiB more than refreservation=auto). On a "
            "full pool tapdisk's mirror would serve the guest zeros. Free "
            "space on the pool, or move the VM halted (%s)" % (
                zvol, _least(row) >> 20, exc.message))
    log.info("%s: its writes guaranteed room while mirrored (a sync every "
             "%d MiB dirtied, %d KiB sectors)", zvol, budget.window >> 20,
             budget.sector >> 10)
    return budget


def _budget(row, window):
    return Budget(int(row["volsize"]), int(row["volblocksize"] or 0),
                  window, row["sector"])


def _least(row):
    return _budget(row, WINDOWS[-1]).margin(inflation())


def _raise(zvol, whole, row, factor):
    """The refreservation raised past the whole disk by the largest
    window's margin the pool has room for; OutOfSpace if none."""
    for window in WINDOWS[:-1]:
        try:
            return _set(zvol, whole, _budget(row, window), factor)
        except errors.OutOfSpace:
            pass
    return _set(zvol, whole, _budget(row, WINDOWS[-1]), factor)


def _set(zvol, whole, budget, factor):
    zfs.set_props(zvol, {"refreservation":
                         str(whole + budget.margin(factor))})
    return budget


def _mark(zvol):
    return lock.run_file(lock_name(zvol), ".mirroring")


def mark_mirroring(zvol):
    """Note that the zvol's VBD may be in mirror mode from now on (before
    the pause that adds the secondary)."""
    os.makedirs(lock.RUN_DIR, 0o700, exist_ok=True)
    with open(_mark(zvol), "w"):
        pass


def mirror_ended(zvol):
    """Its VBD is out of mirror mode (closed, or reopened without a
    secondary): the guard may go."""
    try:
        os.unlink(_mark(zvol))
    except OSError:
        pass


def mirroring(zvol):
    """Whether the zvol's VBD may still be in mirror mode."""
    return os.path.exists(_mark(zvol))


def release(zvol):
    """Put back the refreservation the guard replaced; nothing if there
    is no guard. Under the SR lock."""
    try:
        row = zfs.get_one(zvol, [meta.MIRROR_GUARD])
    except errors.DatasetNotFound:
        return
    before = row.get(meta.MIRROR_GUARD)
    if not before:
        return
    zfs.set_props(zvol, {"refreservation": before})
    zfs.inherit(zvol, meta.MIRROR_GUARD)
    log.info("%s: refreservation back to %s", zvol, before)
