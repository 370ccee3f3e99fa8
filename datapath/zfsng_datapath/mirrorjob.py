"""The mirror job: the process Data.mirror starts, which copies a VM's
disk to the destination, then, for a running VM, mirrors the guest's
writes to it.

A halted or suspended VM's disk (domain -1) has no writer: one snapshot
is sent whole (step 1's round 0), flushed, and the job is done; no tapdisk
is involved.

0. Guard the zvol's space (``spaceguard``; a running VM's disk only):
   a pool without the room fails the move before anything is copied.
1. Copy in rounds. Round 0 snapshots the zvol and sends the snapshot
   (``zfs send -L``: ZFS reads only allocated blocks, holes are FREE
   records) into the destination over the one upstream NBD connection.
   Each later round snapshots again and sends only the change since the
   previous snapshot, which ZFS knows exactly (the blocks born since).
   The guest writes meanwhile; each round is smaller than the last while
   the link is faster than the guest. Rounds stop once one is small
   (ROUND_SMALL), once they stop shrinking, or after MAX_ROUNDS.
2. Switch to mirroring, with the guest paused only for a snapshot: the
   pool's dirty data is written out first (``zpool sync``: a snapshot
   waits for it), the SR lock is taken (no other call's wait lands
   inside the pause),
   tapdisk is paused (its in-flight writes finish, the image is closed),
   the last snapshot is taken, and tapdisk is unpaused with this job's
   relay as its NBD secondary: from then on tapdisk acknowledges a guest
   write once both the zvol and the destination have it. The pause is
   logged and kept in the job's state; its length does not depend on the
   disk, the change or the link.
3. Catch up: the change between the previous round's snapshot and the
   last one is sent through the relay, beside tapdisk's mirrored writes
   (relay.Forwarder): a catch-up write never lands over a range tapdisk
   wrote since the unpause, so no background copy writes over a mirrored
   write. Data.stat says complete once the catch-up is flushed.
4. Mirror: the relay forwards tapdisk's writes until tapdisk closes the
   secondary (the VBD closed: the VM moved or stopped). From the switch
   on, a watchdog asks tapdisk every WATCH seconds whether it dropped the
   secondary (``nbd_mirror_failed``: a write the destination failed or
   did not answer within tapdisk's own 30 s), which the relay cannot see;
   the job then fails, and the move with it (``mirror.check_ended``).
   It also sees tapdisk retire the zvol on an ENOSPC (``_retired``),
   which the space guard exists to prevent.

A guest that writes faster than the link: the rounds stop shrinking and
the job goes on to mirror; from then on the guest's writes go at the
link's pace (each waits for the destination), until the VM has moved.

Zeros. The destination starts empty (xapi creates it for the migration),
so a FREE needs zeros sent only where this job wrote data before: the
job keeps the ranges it wrote (``blockmap``), and a FREE of a range never
written costs nothing, however large (a sparse 16 TiB disk copies its
data, not its size).

Every snapshot is held with ``lock.reading`` while the job uses it: the
collector frees it once the job is gone (crash, reboot), and the job
destroys it itself when done.
"""

import bisect
import contextlib
import os
import signal
import sys
import threading
import time

from zfsng import blockmap, errors, lock, log, meta, names, pools, \
    spaceguard, zfs
from zfsng_datapath import mirror, nbd, relay, tapctl
from zfsng_datapath.errors import NbdError

MiB = 1 << 20
ROUND_SMALL = 64 * MiB     # a change this small is sent while mirroring
SHRINK = 0.8               # a round at least this much smaller than the last
MAX_ROUNDS = 10
MIN_RATE = MiB             # bytes/s: a send's bound is its size at this
WATCH = 5.0                # seconds between two looks at tapdisk's stats


class Terminated(Exception):
    """SIGTERM (the bound on the job's life): the job fails, its cleanup
    runs (a paused VBD is unpaused, its snapshots destroyed)."""

    message = "the job was stopped at the bound on its life"


def _terminate(signum, frame):
    raise Terminated()


class Job(object):
    """The job's state file, saved whole at each step, one step at a time
    (the watchdog's thread records too, and the file's writes share one
    temporary name)."""

    may_mirror = False    # its VBD may be in mirror mode
    left = False          # its VBD seen out of mirror mode since
    _saving = threading.Lock()

    def __init__(self, key):
        self.doc = mirror.load(key)
        if self.doc is None:
            raise errors.InternalError("no mirror job %s" % key)
        self.key = key

    def update(self, **fields):
        with self._saving:
            self.doc.update(fields)
            mirror.save(self.doc)

    def __getitem__(self, name):
        return self.doc[name]

    def get(self, name):
        return self.doc.get(name)


def main(argv):
    key = argv[1]
    log.setup("mirror", key)
    signal.signal(signal.SIGTERM, _terminate)
    job = Job(key)
    job.update(pid=os.getpid(), phase="copying")
    try:
        with contextlib.ExitStack() as held:
            run(job, held)
        job.update(phase="done", ended=time.time())
        log.info("mirror %s done", key)
        return 0
    except Exception as exc:     # the job's end: recorded, never raised
        message = getattr(exc, "message", None) or repr(exc)
        job.update(phase="failed", error=message, ended=time.time())
        log.error("mirror %s failed: %s", key, message)
        return 1


def run(job, held):
    zvol = job["dataset"]
    row = zfs.get_one(zvol, ["volsize", "logicalreferenced"])
    size = int(row["volsize"])
    job.update(total=int(row["logicalreferenced"] or 0))
    socket_path, export = nbd.parse_uri(job["remote"])
    client = nbd.Client.connect(socket_path, export)
    held.callback(client.close)
    if client.size != size:
        raise NbdError("the destination is %d bytes, the disk %d"
                       % (client.size, size))
    copy = Copy(job, client, zvol, size)
    if job["tapdisk"] is None:            # a halted VM's disk: one round
        copy.send(None, copy.snapshot(held))
        return
    budget = _guard(job, held)  # a pool without the room fails the move
    base = copy.rounds(held)    # now, not after the whole copy
    sock = os.path.join(mirror.DIR, job.key + ".sock")
    listener = relay.listen(sock)
    held.callback(lambda: _unlink(sock))
    held.callback(listener.close)
    try:
        mirror_writes(job, copy, base, listener, held, budget)
    except BaseException:
        _leave_mirror_mode(job)
        raise
    _leave_mirror_mode(job)     # tapdisk closed the secondary: a closed
                                # VBD's is nothing to do


def _guard(job, held):
    """Room for the zvol's writes while tapdisk mirrors it (spaceguard):
    held until the job ends, released after the VBD left mirror mode.
    Taken before the copy: a pool that cannot guard the disk fails the
    move at once, not after the rounds have copied the whole disk (and
    the switch's snapshot then needs the same room as a round's).
    Returns the guard's Budget, which the relay keeps."""
    zvol = job["dataset"]
    held.enter_context(lock.reading(spaceguard.lock_name(zvol)))
    with lock.sr_lock(job["sr"]):
        budget = spaceguard.hold(zvol)
    held.callback(lambda: _unguard(job))
    return budget


def _unguard(job):
    """Put the guard back, unless the VBD may still be in mirror mode
    (tapdisk would not take it out): then the disk keeps its guard and
    mark until Datapath.deactivate sees the VBD closed."""
    if job.may_mirror and not job.left:
        log.error("mirror %s: the space guard of %s stays while its VBD "
                  "may still mirror", job.key, job["dataset"])
        return
    try:
        with lock.sr_lock(job["sr"]):
            spaceguard.mirror_ended(job["dataset"])
            spaceguard.release(job["dataset"])
    except errors.StorageError as exc:
        log.warning("mirror %s: the space guard of %s is left for the "
                    "collector: %s", job.key, job["dataset"], exc.message)


def mirror_writes(job, copy, base, listener, held, budget=None):
    """Switch, catch up, then forward tapdisk's writes until it closes
    the secondary (each counted in the guard's budget)."""
    last, forwarder = copy.switch(held, listener, budget)
    _watch(job, forwarder)
    try:
        copy.catch_up(base, last, forwarder)
    except BaseException as exc:
        forwarder.stop("the catch-up failed: %s"
                       % (getattr(exc, "message", None) or exc))
        raise
    job.update(phase="mirroring")
    forwarder.wait()
    copy.client.flush()
    job.update(mirrored=forwarder.forwarded, settles=forwarder.settles,
               settle_seconds=round(forwarder.settle_seconds, 3),
               window=budget.window if budget else None)
    log.info("mirror %s: %d bytes mirrored; the space guard's window "
             "took %d pool syncs, %.1f s", job.key, forwarder.forwarded,
             forwarder.settles, forwarder.settle_seconds)


def _leave_mirror_mode(job):
    """A mirror that failed while its VM runs on here: its VBD leaves
    mirror mode (mirror.leave_mirror_mode says why), unless tapdisk
    retired the zvol (_retired): a reopen would serve the guest a stale
    disk. Notes whether the VBD is out of mirror mode now."""
    if job.get("zvol_retired"):
        log.error("mirror %s: tapdisk %s minor %s left serving the "
                  "destination alone: its zvol is stale since an ENOSPC",
                  job.key, job["tapdisk"], job["minor"])
        return
    left = mirror.leave_mirror_mode(job.key, job["tapdisk"], job["minor"])
    if job.may_mirror:
        job.left = left


def _watch(job, forwarder):
    """Start the watchdog, from the switch to the mirror's end: every
    WATCH seconds it asks tapdisk whether it dropped the secondary (the
    mirror then fails) or retired the zvol (_retired)."""
    def watch():
        while not forwarder.ended(WATCH):
            pid, minor = job["tapdisk"], job["minor"]
            try:
                dropped, chain = tapctl.mirror_state(pid, minor)
            except errors.StorageError:
                continue          # the VBD closing: the relay sees it end
            if dropped:
                forwarder.stop("tapdisk dropped the mirror "
                               "(nbd_mirror_failed)")
                return
            if chain and not job.get("zvol_retired") and \
                    job.get("image") not in chain:
                _retired(job)
    thread = threading.Thread(target=watch)
    thread.daemon = True
    thread.start()


def _retired(job):
    """tapdisk retired the zvol on an ENOSPC the space guard should have
    made impossible (TD_IGNORE_ENOSPC, /var/run/tapdisk-enospc<minor>):
    the guest's writes go to the destination alone (its reads return
    zeros: see ARCHITECTURE.md) and the zvol is stale. The destination
    is the one disk the catch-up makes whole; failing the move would
    leave the VM on the stale zvol. So the mirror goes on, the job
    records it, and nothing reopens the zvol (_leave_mirror_mode,
    mirror.finish_dead)."""
    job.update(zvol_retired=time.time())
    log.error("mirror %s: tapdisk retired %s after an ENOSPC (tapdisk-"
              "enospc%s): the guest's disk is the destination alone and "
              "%s is stale; let the move finish, do not cancel it",
              job.key, job["image"], job["minor"], job["dataset"])


class Copy(object):
    """Snapshots and sends, keeping the ranges written upstream."""

    def __init__(self, job, client, zvol, size):
        self.job, self.client, self.zvol, self.size = job, client, zvol, size
        self.sink = client  # what the copy writes with: client, then relay
        self.held = []     # range set of what earlier rounds wrote there
        self.writes, self.frees = [], []      # this round's records
        self.pending_at, self.pending = 0, bytearray()  # records joined
        self.released = set()     # snapshots destroyed already

    def name(self, held):
        """A new snapshot name, held (lock.reading) until the job ends."""
        snap = "%s@%s%s" % (self.zvol, meta.MIRROR_SNAPSHOT,
                            names.new_uuid())
        held.enter_context(lock.reading(snap))
        return snap

    def take(self, snap, held):
        """Snapshot the zvol (under the SR lock); destroyed once no later
        send needs it (release), or at the end."""
        zfs.snapshot(snap)
        held.callback(lambda: self.release(snap))

    def release(self, snap):
        """Destroy a snapshot no send needs any more: a round's base once
        the next round is sent, both of the catch-up's once it is, so a
        long mirror holds no snapshot (each keeps the blocks the guest
        overwrites since). Once: the end's callback finds it gone."""
        if snap is not None and snap not in self.released:
            self.released.add(snap)
            _drop(self.job["sr"], snap)

    def snapshot(self, held):
        snap = self.name(held)
        with lock.sr_lock(self.job["sr"]):
            self.take(snap, held)
        return snap

    def send(self, base, snap):
        """Send snap's change since base (all of it without a base)."""
        started, before = time.monotonic(), self.sink.sent
        total = max(self.job["total"], self.size // 64)
        self.writes, self.frees = [], []
        zfs.send_replay(base, snap, self._write, self._free,
                        bound=max(600, total // MIN_RATE))
        self._pass_on()
        self.sink.flush()
        # one stream's records never overlap: merged once per round
        self.held = blockmap.union(
            blockmap.subtract(self.held, blockmap.normal(self.frees)),
            self.writes)
        seconds = time.monotonic() - started
        sent = self.sink.sent - before
        rounds = self.job["rounds"] + [{"bytes": sent, "ranges": len(
            self.writes), "seconds": round(seconds, 3)}]
        self.job.update(copied=self.job["copied"] + sent, rounds=rounds)
        log.info("mirror round %d: %d bytes in %d ranges, %.1f s (%.1f "
                 "MB/s)", len(rounds), sent, len(self.writes), seconds,
                 sent / max(seconds, 1e-3) / 1e6)
        return sent

    def rounds(self, held):
        """Copy rounds until one is small or they stop shrinking; returns
        the last snapshot sent."""
        base, last = None, None
        for n in range(MAX_ROUNDS):
            snap = self.snapshot(held)
            sent = self.send(base, snap)
            self.release(base)
            base = snap
            if n and (sent <= ROUND_SMALL or sent > SHRINK * last):
                break
            last = sent
        return base

    def switch(self, held, listener, budget=None):
        """Pause, snapshot, unpause with the relay as tapdisk's secondary;
        returns (the snapshot, the relay forwarding tapdisk's writes,
        which keeps budget with a ``zpool sync`` of the pool)."""
        pid, minor = self.job["tapdisk"], self.job["minor"]
        snap = self.name(held)
        came = {}
        waiter = threading.Thread(target=_accept,
                                  args=(listener, self.size, came))
        waiter.daemon = True    # tapdisk connects during the unpause
        pools.sync(self.zvol.split("/")[0])   # less for the snapshot to wait
        with lock.sr_lock(self.job["sr"]):    # for inside the pause
            # from here a killed job's VBD may be left in mirror mode,
            # which the next call then leaves (mirror.finish_dead); its
            # guard stays until then (the mark)
            spaceguard.mark_mirroring(self.zvol)
            self.job.may_mirror = True
            row = tapctl.view().vbd(pid, minor)   # the image it serves
            self.job.update(switching=time.time(),
                            image=row.path if row else None)
            tapctl.pause(pid, minor)   # a failed one leaves the VBD running
            paused = time.monotonic()
            try:
                self.take(snap, held)
                waiter.start()
                tapctl.unpause(pid, minor, "nbd:" + listener.getsockname())
            except BaseException:     # never leave the guest frozen: a
                tapctl.settle_unpaused(pid, minor)   # failed resume stays
                raise                                # paused
            waiter.join(relay.ACCEPT_TIMEOUT + 5)
            pause = time.monotonic() - paused
        self.job.update(pause_seconds=round(pause, 3))
        log.info("mirror: the guest was paused %.2f s; mirroring", pause)
        if "conn" not in came:
            raise came.get("error") or NbdError("tapdisk did not connect")
        pool = self.zvol.split("/")[0]
        forwarder = relay.Forwarder(came["conn"], self.client, budget,
                                    lambda: pools.sync(pool))
        forwarder.start()
        return snap, forwarder

    def catch_up(self, base, last, forwarder):
        """Send the change up to the switch through the relay, beside the
        mirrored writes; then tapdisk's writes need no more tracking."""
        self.sink = forwarder
        self.send(base, last)
        forwarder.caught_up()
        self.release(base)
        self.release(last)

    def _write(self, offset, data):
        """A WRITE record: joined to the pending one when it follows it.
        zfs send gives one record per block (the volblocksize, 16 KiB by
        default): sent one NBD request each, a round took 8.9 times as
        long as a plain copy in 1 MiB requests (BENCHMARKS.md)."""
        if self.pending and offset == self.pending_at + len(self.pending) \
                and len(self.pending) + len(data) <= nbd.MAX_REQUEST:
            self.pending += data
        else:
            self._pass_on()
            self.pending_at, self.pending = offset, bytearray(data)
        if self.writes and self.writes[-1][1] == offset:
            self.writes[-1] = (self.writes[-1][0], offset + len(data))
        else:
            self.writes.append((offset, offset + len(data)))

    def _pass_on(self):
        """Send the pending records' bytes."""
        if self.pending:
            self.sink.write(self.pending_at, bytes(self.pending))
            self.pending = bytearray()

    def _free(self, offset, length):
        """Zeros where an earlier round wrote data; nothing elsewhere."""
        self._pass_on()
        end = self.size if length is None else min(self.size,
                                                   offset + length)
        for start, stop in _overlap(self.held, offset, end):
            self.sink.zero(start, stop - start)
        self.frees.append((offset, end))


def _overlap(ranges, offset, end):
    """The parts of offset..end in the range set ranges (bisected: a
    round may have many FREEs and the set many ranges)."""
    i = bisect.bisect_right(ranges, (offset, offset)) - 1
    found = []
    for start, stop in ranges[max(i, 0):]:
        if start >= end:
            break
        if stop > offset:
            found.append((max(start, offset), min(stop, end)))
    return found


def _accept(listener, size, came):
    try:
        came["conn"] = relay.accept(listener, size)
    except NbdError as exc:
        came["error"] = exc


def _drop(sr, snap):
    try:
        with lock.sr_lock(sr):
            zfs.destroy(snap)
    except errors.StorageError as exc:
        log.warning("mirror: %s left for the collector: %s", snap,
                    exc.message)


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))
