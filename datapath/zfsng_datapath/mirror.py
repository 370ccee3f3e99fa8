"""Data.mirror and Data.stat: a VM's disk copied to another SR, for
storage migration out of zfs-ng; and the check that stops a move whose
mirror failed after xapi was told it was complete.

How xapi drives it (xen-api v26.1.4, storage_smapiv3_migrate.ml
send_start and mirror_wait, xapi_vm_migrate.ml): every read-write disk of
a VM, running, halted or suspended, takes this path. The destination made
and activated an empty disk and answered its NBD export; xapi attaches
the VDI in dom0 (not activated), starts a one-shot proxy to it at
``/var/run/nbdproxy/export/<mirror vm>``, calls Data.mirror(uri, the
VM's domid, ``nbd+unix:///<export>?socket=<proxy>``), then polls Data.stat
without pause until ``complete`` or ``failed``. The domid is ``-1`` for a
halted or suspended VM: its disk has no writer, so the job copies one
snapshot of it and is done (``mirrorjob``). A running VM's job copies,
then mirrors its writes until its VBD closes.

After ``complete`` xapi never polls again on its own: it calls Data.stat
once more before it moves the VM's memory (its ``failed`` ignored), then
suspends the VM and calls Datapath.deactivate for its domain before the
destination resumes it. A failure after ``complete`` must reach xapi
through one of those two, or the VM moves onto a stale copy and xapi
destroys this SR's disk. So Data.stat raises ``MirrorFailed`` once for a
job that failed after it said ``complete`` (xapi then fails the move, the
VM still running here), and Datapath.deactivate (``check_ended``) waits
for the job to end once tapdisk has closed and raises ``MirrorFailed``
when it did not end well (xenopsd then halts the VM here, its disk
intact, and the destination is dropped). A guest that reboots during the
move gets a new domain, whose writes no mirror carries: its activate,
while xapi's move still runs, marks the job (``note_reopened``), and the
move fails the same way. What was told to xapi is kept in marker files
beside the job's file (the job's process rewrites its file whole):
``<key>.complete``, ``<key>.reported``, ``<key>.reopened``.

Data.mirror checks and records the job, starts the mirror job
(``mirrorjob``, a detached process with a bound on its life) and returns
at once. Data.stat is one or two file reads: xapi calls it in a loop
(more only once, for a job whose process died: ``finish_dead``).

A job's state is one JSON file in DIR (beside the datapath's state files,
on the same tmpfs: a reboot ends every mirror), written whole by
the job as it goes: phase ("starting", "copying", "mirroring", "done",
"failed"), bytes copied and the disk's allocated bytes (progress), the
rounds, the guest's pause, the error. A job whose process is gone
before it finished is failed, whatever its file says. Files of jobs that
ended more than KEEP seconds ago are removed by the next Data.mirror.

A job killed (SIGKILL, the OOM killer) skips its own cleanup: its VBD
may stay in mirror mode, where tapdisk answers an ENOSPC on the zvol as
success (the write lost), and its space guard stays. The next call that
sees it (Data.stat, Data.mirror's sweep, Datapath.deactivate) does that
cleanup for it (``finish_dead``) and then records the job failed. The
guard goes only once the VBD is out of mirror mode: until then the disk
keeps the job's mark (``spaceguard.mark_mirroring``), and the collector,
which may run first (any SR.attach or Volume.destroy), leaves its guard.
"""

import contextlib
import os
import sys
import time

from zfsng import attachstate, errors, lock, log, names, runfiles, runner, \
    spaceguard, wire
from zfsng_datapath import scope, state, tapctl, uri as urimod
from zfsng_datapath.errors import MirrorFailed, NotAttached

DIR = attachstate.RUN_DIR + "-mirror"
# The bound on a job's whole life. A running VM's job lives until the VM
# has moved, and xapi moves a VM's disks one after the other, then copies
# their snapshots: a week covers a large VM on a slow link. A job that
# outlives it fails, and the move with it (check_ended), never silently.
LIFETIME = 7 * 24 * 3600
START_GRACE = 60        # seconds for a started job to record its pid
FINISHED = ("done", "failed")
HALTED = "-1"           # xapi's domid of a halted or suspended VM
KEEP = 24 * 3600        # seconds a finished job's files are kept
# The dom0 domain of the attach xapi's send_start makes (domain_of of
# "mirror_vbd/<domid>/<device>"): there while xapi's move of the disk
# goes on, gone (DP.destroy) just before xenopsd moves the VM.
SENDING = urimod.DOM0_PREFIX + "mirror_"
# How long Datapath.deactivate waits for a job to end once tapdisk closed
# its secondary: the relay's replies still due (nbd.TIMEOUT, 60 s) and a
# flush. A number, not nbd.TIMEOUT + 30: every Datapath call loads this
# module and only Data.mirror needs nbd's sockets (a unit test holds the
# two together).
END_WAIT = 90
END_POLL = 0.2


def path(key):
    names.check_uuid(key)
    return os.path.join(DIR, key + ".json")


def load(key):
    """The job's state, or None."""
    return runfiles.read_json(path(key))


def save(job):
    runfiles.write_json(path(job["key"]), job)


def _alive(job):
    """Whether the job's process runs (a job not yet started is given
    START_GRACE seconds to record its pid)."""
    pid = job.get("pid")
    if not pid:
        return time.time() - job.get("started", 0) < START_GRACE
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:   # not a reused pid
            return b"zfsng_datapath.mirrorjob" in f.read()
    except (IOError, OSError):
        return False


def phase(job):
    """The job's phase, "failed" if its process died before it ended or
    its disk was opened again by another domain during the move."""
    if job["phase"] not in FINISHED and not _alive(job) or \
            _reopened_by(job.get("key")) is not None:
        return "failed"
    return job["phase"]


def status(job):
    """Data.stat's answer for a job."""
    now = phase(job)
    total = max(job.get("total") or 0, 1)
    progress = 1.0 if now in ("mirroring", "done") else \
        min(0.99, 0.99 * job.get("copied", 0) / total)
    return {"failed": now == "failed",
            "complete": now in ("mirroring", "done"),
            "progress": progress}


def _dead(job):
    """Its process ended before the job recorded its end."""
    return job["phase"] not in FINISHED and not _alive(job)


def finish_dead(job, vdi_locked=False):
    """The cleanup a job whose process died did not run: its VBD, if it
    still runs, leaves mirror mode (``leave_mirror_mode``; not once
    tapdisk retired the zvol, stale then: mirrorjob._retired), its space
    guard is put back, then the job is recorded failed, in that order: a
    crash in between leaves it dead and unfinished, done again by the
    next call (each step can be done twice). Neither is touched while a
    live job holds the disk's guard (a newer move of it: that mirror is
    its own). A VBD that tapdisk would not take out of mirror mode keeps
    the guard, and the job stays for the next call. Under the VDI's lock
    (vdi_locked: the caller holds it) and the SR lock; returns the job as
    it is now."""
    if not _dead(job):
        return job
    try:
        with _vdi_lock(job["dataset"], vdi_locked), \
                lock.sr_lock(job["sr"]):
            return _finish_dead(load(job["key"]) or job)
    except errors.StorageError as exc:
        log.error("mirror %s: the cleanup of its dead process is left for "
                  "the next call: %s", job["key"], exc.message)
        return job


def _finish_dead(job):
    if not _dead(job):                 # another call finished it
        return job
    zvol = job["dataset"]
    if not lock.being_read(spaceguard.lock_name(zvol)):
        if job.get("switching") and not job.get("zvol_retired") and \
                not leave_mirror_mode(job["key"], job["tapdisk"],
                                      job["minor"]):
            return job
        spaceguard.mirror_ended(zvol)
        spaceguard.release(zvol)
    why = job.get("error") or "its process ended before the mirror did"
    job = dict(job, phase="failed", error=why, ended=time.time())
    save(job)
    log.error("mirror %s of %s: %s (its cleanup done for it)", job["key"],
              zvol, why)
    return job


def _vdi_lock(dataset, held):
    return contextlib.ExitStack() if held else state.vdi_lock(dataset)


def leave_mirror_mode(key, pid, minor):
    """Reopen the VBD's image without a secondary (``unpause -2 null``):
    for a mirror that failed while its VM runs on here. tapdisk marks the
    image TD_IGNORE_ENOSPC when it adds a secondary and keeps the mark
    once the secondary is dropped: an ENOSPC on the zvol would then be
    answered success to the guest, the write lost (tapdisk-vbd.c
    tapdisk_vbd_complete_td_request). A VBD left paused (its job died
    between pause and unpause) is unpaused so. Nothing to do once the
    VBD is closed. True once the VBD is out of mirror mode (or closed);
    False, logged, when tap-ctl failed: never raises (it runs on the way
    out of an error, the one to report)."""
    try:
        row = tapctl.view().vbd(pid, minor)
        if row is None or not row.is_open:
            return True
        if not row.is_paused:
            tapctl.pause(pid, minor)   # a failed one leaves it running
        try:
            tapctl.unpause(pid, minor, "null")
        except BaseException:
            tapctl.settle_unpaused(pid, minor)
            raise
        log.info("mirror %s: tapdisk %s minor %s out of mirror mode", key,
                 pid, minor)
        return True
    except errors.StorageError as exc:
        log.error("mirror %s: tapdisk %s minor %s may still ignore ENOSPC "
                  "(a pause and unpause of it clears it): %s", key, pid,
                  minor, exc.message)
        return False


def _marker(key, what):
    return os.path.join(DIR, "%s.%s" % (key, what))


def _mark(key, what):
    with open(_marker(key, what), "w"):
        pass


def _marked(key, what):
    return os.path.exists(_marker(key, what))


def _failure_to_report(job):
    """The error of a job that failed after xapi was told it was
    complete, if xapi has not been told of it yet; else None. Told once:
    xapi's cleanup calls Data.stat again and must not fail there."""
    if phase(job) != "failed" or not _marked(job["key"], "complete") or \
            _marked(job["key"], "reported"):
        return None
    reopened = _reopened_by(job["key"])
    _mark(job["key"], "reported")
    if reopened is not None:
        return ("the VM's disk was opened again, by domain %s (a reboot), "
                "after the mirror of domain %s's writes ended" % (
                    reopened, job["domain"]))
    return job.get("error") or "its process ended before the mirror did"


def _reopened_by(key):
    """The domain that opened the disk again during the move, or None."""
    if not key:
        return None
    try:
        with open(_marker(key, "reopened")) as f:
            return f.read().strip() or None
    except (IOError, OSError):
        return None


def note_reopened(dataset, domain):
    """Datapath.activate's note: a guest domain opens a disk whose move
    xapi still runs (its send_start attach is there) while the disk's
    mirror, told complete, was another domain's: a guest that rebooted
    during the move, whose new domain's writes no mirror carries. The
    move must then fail (check_ended, Data.stat). Only a VM's domain
    counts: xapi's copy of the VM's snapshots or suspend image during
    the move may open this disk too, for its CP pseudo-domain, as
    sparse_dd's base (storage_smapiv1_migrate.ml copy_into_vdi), which
    is a read, no reboot."""
    if not urimod.is_vm(domain) or not os.path.isdir(DIR) or \
            not os.listdir(DIR):
        return
    jobs = [j for j in _jobs(lambda j: j.get("dataset") == dataset)
            if j.get("tapdisk") is not None and j["domain"] != domain and
            _marked(j["key"], "complete") and
            not _marked(j["key"], "reported")]
    if jobs and any(st.get("dataset") == dataset and
                    st.get("domain", "").startswith(SENDING)
                    for st in state.all_states()):
        for job in jobs:
            log.error("mirror %s: %s opened again by domain %s during its "
                      "move: the move will fail", job["key"], dataset,
                      domain)
            with open(_marker(job["key"], "reopened"), "w") as f:
                f.write(domain)


def _failed(job, why):
    return MirrorFailed(
        "the mirror of %s to the migration's destination failed after it "
        "was complete (%s): the move is stopped so that the VM never runs "
        "on a stale copy; its disk on this SR is intact" % (
            job["dataset"], why))


@wire.method("Data.mirror")
def mirror(dbg, uri, domain, remote):
    target = urimod.parse(uri)
    if domain != HALTED:
        urimod.check_domain(domain)
    if target.snapshot is not None or urimod.is_dom0(domain):
        raise errors.InvalidArgument(
            "Data.mirror: %s in domain %s is no VM's disk" % (uri, domain))
    from zfsng_datapath import nbd      # only here: see END_WAIT
    nbd.parse_uri(remote)
    job = _new_job(target, uri, domain, remote)
    scope.check(target)
    _sweep()
    save(job)
    runner.spawn_detached(["timeout", "-k", "30", str(LIFETIME),
                           sys.executable, "-m", "zfsng_datapath.mirrorjob",
                           job["key"]])
    log.info("mirror %s: %s of domain %s to %s", job["key"], target.dataset,
             domain, remote)
    return ["MirrorV1", job["key"]]


def _new_job(target, uri, domain, remote):
    """The job's first state: a running VM's names its tapdisk; a halted
    VM's has none, and no guest may be running on the disk."""
    job = {"key": names.new_uuid(), "uri": uri, "dataset": target.dataset,
           "sr": target.sr, "domain": domain, "remote": remote,
           "tapdisk": None, "minor": None, "phase": "starting",
           "started": time.time(), "copied": 0, "total": 0, "rounds": []}
    if domain == HALTED:
        running = [st["domain"] for st in state.all_states()
                   if st.get("dataset") == target.dataset and
                   st.get("active") and st.get("pid") is not None]
        if running:
            raise errors.InvalidArgument(
                "Data.mirror: %s is the disk of a running VM (domain %s), "
                "not of a halted one" % (uri, running[0]))
        return job
    st = state.load(target.dataset, domain)
    if not st or not st.get("active") or st.get("pid") is None:
        raise NotAttached("Data.mirror: %s is not active in domain %s on "
                          "this host" % (uri, domain))
    job.update(tapdisk=st["pid"], minor=st["minor"])
    return job


def _sweep():
    """Finish the jobs whose process died (``finish_dead``); remove the
    files of jobs that ended more than KEEP seconds ago."""
    for job in _jobs(_dead):
        finish_dead(job)
    now = time.time()
    for job in _jobs(lambda j: phase(j) in FINISHED and
                     now - j.get("ended", now) >= KEEP):
        key = job["key"]
        for leftover in (path(key), _marker(key, "complete"),
                         _marker(key, "reported"),
                         _marker(key, "reopened")):
            try:
                os.unlink(leftover)
            except OSError:
                pass


@wire.method("Data.stat")
def stat(dbg, operation):
    kind, key = operation
    job = load(key) if kind == "MirrorV1" else None
    if job is None:
        raise errors.InvalidArgument("Data.stat: no operation %s %s on "
                                     "this host" % (kind, key))
    job = finish_dead(job)
    why = _failure_to_report(job)
    if why is not None:
        raise _failed(job, why)
    answer = status(job)
    if answer["complete"]:
        _mark(key, "complete")
    return answer


def _jobs(wanted):
    """The jobs whose state wanted(job) accepts."""
    found = []
    for name in os.listdir(DIR) if os.path.isdir(DIR) else []:
        key, _, ext = name.partition(".")
        if ext != "json" or not names.is_uuid(key):
            continue
        job = load(key)
        if job and wanted(job):
            found.append(job)
    return found


def jobs_of(dataset, domain):
    """The jobs mirroring the disk dataset of domain (a running VM's),
    and those whose disk domain opened again during the move."""
    return _jobs(lambda j: j.get("dataset") == dataset and (
        j.get("domain") == domain or _reopened_by(j["key"]) == domain))


def check_ended(dataset, domain, tapdisk_failed):
    """Datapath.deactivate's check, once tapdisk has closed the disk of
    domain: each job mirroring it ends (bounded by END_WAIT); one that
    failed after xapi was told it was complete raises MirrorFailed, the
    move stopped. tapdisk_failed: tapdisk said it dropped the mirror
    (nbd_mirror_failed) before it closed."""
    for job in jobs_of(dataset, domain):
        job = finish_dead(job, vdi_locked=True)
        if not _marked(job["key"], "complete") or \
                _marked(job["key"], "reported"):
            continue      # nothing to tell xapi: never waited for
        if _reopened_by(job["key"]) == domain:
            raise _failed(job, _failure_to_report(job))
        deadline = time.monotonic() + END_WAIT
        while phase(job) not in FINISHED and time.monotonic() < deadline:
            time.sleep(END_POLL)
            job = load(job["key"]) or job
        if tapdisk_failed and phase(job) == "done":
            job = dict(job, phase="failed",
                       error="tapdisk dropped the mirror")
        job = finish_dead(job, vdi_locked=True)   # died meanwhile
        if phase(job) not in FINISHED:
            job = dict(job, phase="failed", error="the mirror did not end "
                       "within %d s of the disk's close" % END_WAIT)
        why = _failure_to_report(job)
        if why is not None:
            log.error("mirror %s: %s", job["key"], why)
            _unguard_closed(dataset, domain)
            raise _failed(job, why)
    _unguard_closed(dataset, domain)


def _unguard_closed(dataset, domain):
    """The guard of a disk whose mirrored VBD tapdisk has just closed (so
    out of mirror mode), left by a job that could not see it end (its
    leave_mirror_mode failed on the closing VBD): put back, unless a live
    job holds it. Never raises: the collector retries once the mark is
    gone."""
    if not spaceguard.mirroring(dataset) or not any(
            j.get("domain") == domain and j.get("tapdisk") is not None
            for j in _jobs(lambda j: j.get("dataset") == dataset)):
        return
    try:
        with lock.sr_lock(dataset.rsplit("/", 1)[0]):
            if lock.being_read(spaceguard.lock_name(dataset)):
                return
            spaceguard.mirror_ended(dataset)
            spaceguard.release(dataset)
    except errors.StorageError as exc:
        log.warning("the space guard of %s is left for the collector: %s",
                    dataset, exc.message)
