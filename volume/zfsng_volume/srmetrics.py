"""An attached SR's pool figures in xcp-rrdd, every 5 seconds.

SR.stat answers ``datasources: ["xeno+shm:///zfs-ng-<sr uuid>"]``;
xapi-storage-script then registers that uid with xcp-rrdd (SR.attach, in
main.ml), which reads ``/dev/shm/metrics/<uid>`` (rrdfile) into the SR's
RRD: ``xe sr-data-source-list``. The figures are poolstats'.

The writer is a small process of its own, started by SR.attach and run
until SR.detach, as tapdisks are:
- SR.attach makes the file before it returns (xapi registers it right
  after, and a missing file fails the registration, and with it the plug),
  records the SR as attached on this host, and starts the writer;
- the writer holds a lock file for its whole life (at most one writer per
  SR), runs niced, takes its sample with bounded commands, and rewrites
  the file in place; it ends when the SR is no longer recorded as attached,
  when the file is gone, or when the SR's dataset could not be read as
  this SR's (pool gone, pool suspended, a new pool by the same name) for
  a minute (GONE_LIMIT periods in a row), publishing meanwhile every
  figure as unknown and health 2; SR.stat starts another if the SR is
  still attached;
- SR.stat starts a writer again when the SR is recorded as attached and
  none holds the lock (one that was killed): never waiting for it;
- SR.detach and SR.destroy drop the record, stop the writer and delete the
  file, also when the pool is gone (``stop_recorded``); SR.detach starts
  it again if its ``zpool export`` fails. xapi-storage-script's SR.detach
  means to deregister the uid but never does (at v26.1.4 it matches the
  stored uid, no longer a URI, against the URI scheme); xcp-rrdd
  deregisters a file deleted from its directory itself, so the next attach
  registers the new file.

Run as ``python3 -m zfsng_volume.srmetrics -- <sr dataset> <sr uuid>``.
"""

import errno
import os
import signal
import sys
import time

from zfsng import lock, log, meta, runfiles, runner, testhooks
from zfsng_volume import poolstats, rrdfile

DIR = testhooks.get("ZFSNG_METRICS_DIR", "/dev/shm/metrics")
PERIOD = float(testhooks.get("ZFSNG_METRICS_PERIOD", 5))  # xcp-rrdd's
SAMPLE = max(1, int(PERIOD) - 1)   # seconds of zpool iostat in a period
GONE_SECONDS = 60.0   # without its SR this long, the writer ends: in
GONE_LIMIT = max(2, int(GONE_SECONDS // max(PERIOD, 1)))  # periods, 2 or more
STOP_WAIT = 5.0       # seconds SR.detach waits for the writer to end
STARTUP = 30.0        # seconds a new writer has to take its lock
_MODULE = "zfsng_volume.srmetrics"

_SOURCES = (
    ("read_iops", "pool read operations", "ops/s"),
    ("write_iops", "pool write operations", "ops/s"),
    ("read_throughput", "pool bytes read", "B/s"),
    ("write_throughput", "pool bytes written", "B/s"),
    ("read_latency", "average wait of a pool read", "ms"),
    ("write_latency", "average wait of a pool write", "ms"),
    ("pool_size", "pool size", "B"),
    ("pool_allocated", "pool space allocated", "B"),
    ("pool_free", "pool space free", "B"),
    ("sr_used", "space used by the SR's disks and snapshots", "B"),
    ("sr_available", "space the SR can still use", "B"),
    ("fragmentation", "pool free space fragmentation", "%"),
    ("compressratio", "compression ratio of the SR's data", "x"),
    ("health", "pool health: 0 ONLINE, 1 DEGRADED, 2 cannot serve data",
     "state"),
)


def uid(sr_uuid):
    return "zfs-ng-" + sr_uuid


def uri(sr_uuid):
    return "xeno+shm:///" + uid(sr_uuid)


def path(sr_uuid):
    return os.path.join(DIR, uid(sr_uuid))


def sources(sr_uuid):
    owner = "sr " + sr_uuid
    return [rrdfile.Source("zfs_" + name, text, units, owner)
            for name, text, units in _SOURCES]


_RECORD = "srmetrics-"


def _record(sr_uuid):
    return lock.run_file(_RECORD + sr_uuid, ".json")


def _lock_file(sr_uuid):
    return lock.run_file("srmetrics-" + sr_uuid, ".lock")


# --- the plugin's side -------------------------------------------------------

def start(sr, sr_uuid):
    """SR.attach: the file, the record, the writer. Never fails the
    attach: what cannot be done is logged, and SR.stat then lists no
    datasource (so xapi registers nothing)."""
    try:
        runfiles.write_json(_record(sr_uuid), {"sr": sr})
        if not os.path.exists(path(sr_uuid)):
            rrdfile.create(path(sr_uuid), rrdfile.encode(
                sources(sr_uuid), {}, time.time()))
    except OSError as exc:
        log.warning("SR %s: no I/O statistics: %s", sr, exc)
        return
    _spawn_unless_running(sr, sr_uuid)


def datasources(sr, sr_uuid):
    """SR.stat's datasources: the file's URI while the SR is attached on
    this host; a writer that was killed is started again. Never fails the
    SR.stat: an unusable run directory means no datasource."""
    try:
        if not _attached(sr, sr_uuid) or not os.path.exists(path(sr_uuid)):
            return []
        _spawn_unless_running(sr, sr_uuid)
    except OSError as exc:
        log.warning("SR %s: no I/O statistics: %s", sr, exc)
        return []
    return [uri(sr_uuid)]


def stop(sr_uuid):
    """SR.detach, SR.destroy: no record, no writer, no file. Never
    fails."""
    try:
        runfiles.remove(_record(sr_uuid))
        _stop_writer(sr_uuid)
        runfiles.remove(path(sr_uuid))
    except OSError as exc:
        log.warning("SR %s: stopping its I/O statistics: %s", sr_uuid, exc)


def stop_recorded(sr):
    """SR.detach, SR.destroy of an SR whose dataset cannot be read (pool
    gone or exported by hand): stop every writer recorded for sr, whose
    uuid only the record still knows. Never fails."""
    for name, record in runfiles.read_all_json(lock.RUN_DIR):
        if name.startswith(_RECORD) and isinstance(record, dict) and \
                record.get("sr") == sr:
            stop(name[len(_RECORD):])


def _running(sr_uuid):
    """Whether a writer holds the SR's lock file."""
    try:
        fd = os.open(_lock_file(sr_uuid), os.O_RDWR)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    try:
        return not lock.try_flock(fd)
    finally:
        os.close(fd)


def _spawn_unless_running(sr, sr_uuid):
    """Start a writer unless one holds the lock or one was started less
    than STARTUP seconds ago (it may not hold the lock yet: xapi's
    SR.stat follows SR.attach at once)."""
    if PERIOD <= 0:
        return                      # tests only: files, but no writer
    record = runfiles.read_json(_record(sr_uuid)) or {}
    if _running(sr_uuid) or \
            0 <= time.monotonic() - record.get("spawned", -1e9) < STARTUP:
        return
    runfiles.write_json(_record(sr_uuid), dict(
        record, sr=sr, spawned=time.monotonic()))
    try:
        _spawn([sys.executable, "-m", _MODULE, "--", sr, sr_uuid])
    except OSError as exc:
        log.warning("SR %s: cannot start its I/O statistics: %s", sr, exc)


def _spawn(argv):
    runner.spawn_detached(argv)


def _stop_writer(sr_uuid):
    """Signal the writer's process group (it and its zpool iostat) and
    wait, within STOP_WAIT, for its lock to be free."""
    pid = (runfiles.read_json(_lock_file(sr_uuid) + ".pid") or {}).get("pid")
    deadline = time.monotonic() + STOP_WAIT
    while _running(sr_uuid):
        if isinstance(pid, int) and _is_writer(pid, sr_uuid):
            try:
                os.killpg(pid, signal.SIGTERM)
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    raise
        if time.monotonic() > deadline:
            log.warning("SR %s: its I/O statistics writer (%s) did not end; "
                        "it ends by itself at its next sample", sr_uuid, pid)
            return
        time.sleep(0.1)


def _is_writer(pid, sr_uuid):
    """Whether pid runs this SR's writer (a pid is reused once free)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().split(b"\0")
    except (IOError, OSError):
        return False
    return _MODULE.encode() in argv and sr_uuid.encode() in argv


# --- the writer --------------------------------------------------------------

def _attached(sr, sr_uuid):
    return (runfiles.read_json(_record(sr_uuid)) or {}).get("sr") == sr


# What a period found (_period): the SR's figures written; its dataset not
# found as this SR's (figures unknown, counted towards GONE_LIMIT); or the
# writer must end now (the SR detached, or its file removed).
SAMPLED, NOT_FOUND, END = "sampled", "not found", "end"


def _period(sr, sr_uuid, table):
    """One sample written: SAMPLED or NOT_FOUND; END when the writer has
    nothing left to write to. Kept apart because a missing SR may be a
    moment's (an import, a rename) and is forgiven a while, whereas a
    detach is final."""
    runner.start_call(PERIOD * 6)
    figures, found = poolstats.sample(meta.pool_of(sr), sr, SAMPLE)
    if not _attached(sr, sr_uuid):
        return END
    if found != sr_uuid:
        figures = _not_this_srs(figures)
    payload = rrdfile.encode(table, dict(
        ("zfs_" + k, v) for k, v in figures.items()), time.time())
    if not rrdfile.update(path(sr_uuid), payload):
        log.info("SR %s: its metrics file is gone", sr)
        return END
    return SAMPLED if found == sr_uuid else NOT_FOUND


def _not_this_srs(figures):
    """What a sample says when the SR dataset could not be read as this
    SR's (a pool of the same name may have replaced the SR's: its figures
    are not this SR's): every figure unknown, and the SR cannot serve
    data."""
    unknown = dict((name, poolstats.NAN) for name in figures)
    unknown["health"] = float(poolstats.NOT_SERVING)
    return unknown


def _write(sr, sr_uuid):
    table, gone = sources(sr_uuid), 0
    while _attached(sr, sr_uuid) and os.path.exists(path(sr_uuid)):
        began = time.monotonic()
        found = _period(sr, sr_uuid, table)
        if found == END:
            return
        gone = 0 if found == SAMPLED else gone + 1
        if gone >= GONE_LIMIT:
            log.info("SR %s: its pool is gone; I/O statistics end", sr)
            return
        time.sleep(max(0.0, PERIOD - (time.monotonic() - began)))


def main(argv):
    """The writer: one per SR (its lock), as long as the SR is attached."""
    for hook in ("ZFSNG_CRASH_AFTER", "ZFSNG_TRACE"):
        os.environ.pop(hook, None)   # its commands are not the call's
    if len(argv) != 3 or argv[0] != "--":
        log.error("usage: python3 -m %s -- SR_DATASET SR_UUID", _MODULE)
        return 2
    sr, sr_uuid = argv[1], argv[2]
    runner.set_runner(runner.SubprocessRunner())
    os.makedirs(lock.RUN_DIR, 0o700, exist_ok=True)
    fd = os.open(_lock_file(sr_uuid), os.O_RDWR | os.O_CREAT, 0o600)
    if not lock.try_flock(fd):
        return 0                      # another writer has it
    runfiles.write_json(_lock_file(sr_uuid) + ".pid", {"pid": os.getpid()})
    os.nice(19)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _write(sr, sr_uuid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
