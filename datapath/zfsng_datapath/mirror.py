"""Data.mirror and Data.stat: a running VM's disk copied to another SR
while the guest writes, for storage migration out of zfs-ng.

How xapi drives it (xen-api v26.1.4, storage_smapiv3_migrate.ml
send_start and mirror_wait): the destination made and activated an empty
disk and answered its NBD export; xapi starts a one-shot proxy to it at
``/var/run/nbdproxy/export/<mirror vm>``, calls Data.mirror(uri, the VM's
domid, ``nbd+unix:///<export>?socket=<proxy>``), then polls Data.stat
without pause until ``complete`` or ``failed``, and only then moves the
VM's memory. Once the VM runs on the destination, the source's VBD is
closed, which ends the mirror.

Data.mirror checks and records the job, starts the mirror job
(``mirrorjob``, a detached process with a bound on its life) and returns
at once. Data.stat is one file read: xapi calls it in a loop.

A job's state is one JSON file in DIR (beside the datapath's state files,
on the same tmpfs: a reboot ends every mirror), written whole by
the job as it goes: phase ("starting", "copying", "mirroring", "done",
"failed"), bytes copied and the disk's allocated bytes (progress), the
rounds, the guest's pause, the error. A job whose process is gone
before it finished is failed, whatever its file says.
"""

import os
import sys
import time

from zfsng import errors, log, names, runfiles, runner, wire
from zfsng_datapath import nbd, scope, state, uri as urimod
from zfsng_datapath.errors import NotAttached

DIR = state.RUN_DIR + "-mirror"
LIFETIME = 24 * 3600    # seconds: the bound on a job's whole life
START_GRACE = 60        # seconds for a started job to record its pid
FINISHED = ("done", "failed")


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


def status(job):
    """Data.stat's answer for a job."""
    phase = job["phase"]
    if phase not in FINISHED and not _alive(job):
        phase = "failed"
    total = max(job.get("total") or 0, 1)
    progress = 1.0 if phase in ("mirroring", "done") else \
        min(0.99, 0.99 * job.get("copied", 0) / total)
    return {"failed": phase == "failed",
            "complete": phase in ("mirroring", "done"),
            "progress": progress}


@wire.method("Data.mirror")
def mirror(dbg, uri, domain, remote):
    target = urimod.parse(uri)
    urimod.check_domain(domain)
    if target.snapshot is not None or urimod.is_dom0(domain):
        raise errors.InvalidArgument(
            "Data.mirror: %s in domain %s is no running VM's disk"
            % (uri, domain))
    nbd.parse_uri(remote)
    st = state.load(target.dataset, domain)
    if not st or not st.get("active") or st.get("pid") is None:
        raise NotAttached("Data.mirror: %s is not active in domain %s on "
                          "this host" % (uri, domain))
    scope.check(target)
    key = names.new_uuid()
    job = {"key": key, "uri": uri, "dataset": target.dataset,
           "sr": target.sr, "domain": domain, "remote": remote,
           "tapdisk": st["pid"], "minor": st["minor"], "phase": "starting",
           "started": time.time(),
           "copied": 0, "total": 0, "rounds": []}
    save(job)
    runner.spawn_detached(["timeout", "-k", "30", str(LIFETIME),
                           sys.executable, "-m", "zfsng_datapath.mirrorjob",
                           key])
    log.info("mirror %s: %s of domain %s to %s", key, target.dataset,
             domain, remote)
    return ["MirrorV1", key]


@wire.method("Data.stat")
def stat(dbg, operation):
    kind, key = operation
    job = load(key) if kind == "MirrorV1" else None
    if job is None:
        raise errors.InvalidArgument("Data.stat: no operation %s %s on "
                                     "this host" % (kind, key))
    return status(job)
