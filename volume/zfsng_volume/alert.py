"""Telling the admin about a pool's health: SMlog and a XenAPI message.

SR.stat reports a pool that still serves every block (DEGRADED, a resilver,
a faulted cache or log device...) as Healthy, because xapi fails every
SR.scan of an SR that is not (``health.pool_health`` says why), and xapi shows
nothing of Healthy's text. So this module tells the admin instead:

- SMlog: a warning on every SR.stat that finds a problem;
- a XenAPI message on the SR (an alert in Xen Orchestra and XenCenter), once
  each time the problem changes, and once when the pool is clean again.

The plugin never waits on xapi. It runs while xapi waits for its answer
(SR.scan calls SR.stat), and ``xe message-create`` is a call into xapi: run
in the call, it could wait on xapi (a busy master, a pool member whose
master is away) and delay, or deadlock, the very call xapi is waiting for.
So the message is sent by a detached process (``runner.spawn_detached``:
own session, /dev/null for stdin, stdout and stderr, never waited for),
killed by ``timeout`` after XE_TIMEOUT seconds; whether it is delivered
does not change the call's answer. A change is seen by comparing with the
last health recorded for the SR in ``<lock.RUN_DIR>/health-<sr>.json``
(no record: healthy). RUN_DIR is in /run, so after a reboot a pool that is
still unwell is announced once again. Without ``xe`` (not an XCP-ng host)
the message is only logged.

The record also keeps the SR's last SR.stat answer: a suspended pool
answers no ``zfs get``, and SR.stat then reports that answer with its
health Unavailable (``last_record``), so xapi sees an unavailable SR rather
than a failed call, and the admin gets the message.
"""

import json
import os

from zfsng import lock, log, names, runner

XE = "/opt/xensource/bin/xe"
XE_TIMEOUT = 30     # seconds before the background xe is killed
CLEAN = ["Healthy", ""]


def report(record, pool, state):
    """Tell the admin about pool's health as SR.stat found it. record is
    SR.stat's answer (its health the v5 value sent to xapi), state zpool's.
    Never raises, never waits."""
    health = record["health"]
    if health != CLEAN:
        log.warning("SR %s: %s (reported to xapi as %s)", record["sr"],
                    health[1], health[0])
    try:
        changed = _record(record, state)
    except (IOError, OSError) as exc:
        log.warning("cannot record the health of SR %s: %s", record["sr"],
                    exc)
        return
    if changed and names.is_uuid(record.get("uuid")):
        send(record["uuid"], *message(pool, state, health))


def last_record(sr):
    """The last SR.stat answer recorded for sr (since boot), or None: what
    SR.stat reports when a suspended pool cannot tell it anything else."""
    try:
        with open(_path(sr)) as f:
            return json.loads(f.read() or "null")["record"]
    except (IOError, OSError, ValueError, KeyError, TypeError):
        return None


def _path(sr):
    return lock.run_file("health-" + sr, ".json")


def _record(record, state):
    """Store the SR's answer and pool state; True if its health changed
    (no record yet counts as healthy).

    The file is read and written under a flock of its own, never waited
    for: a call that finds it held leaves it to the holder (the next
    SR.stat compares again), so one change gives one message.
    """
    os.makedirs(lock.RUN_DIR, 0o700, exist_ok=True)
    fd = os.open(_path(record["sr"]), os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+") as f:
        if not lock.try_flock(f):
            return False
        try:
            last = json.loads(f.read() or "null")
        except ValueError:
            last = None
        if not isinstance(last, dict):
            last = {"state": "ONLINE", "health": CLEAN}
        seen = {"state": state, "health": record["health"],
                "record": record}
        if seen != last:
            f.seek(0)
            f.truncate()
            f.write(json.dumps(seen))   # ASCII: json escapes the rest
        return [last.get("state"), last.get("health")] != \
            [state, record["health"]]


def message(pool, state, health):
    """(name, priority, body) of the XenAPI message for a new health.

    Priorities as XenCenter and Xen Orchestra read them: 1 critical (the SR
    is unusable), 2 major (redundancy lost), 3 warning (another problem of
    a pool that serves all its data), 5 information (clean again).
    """
    kind, text = health
    name = "ZFSNG_POOL_" + "".join(c for c in state if c.isalnum()).upper()
    see = " See 'zpool status -v %s'." % pool
    if kind != "Healthy":
        return (name, 1, "%s The SR is %s: xapi refuses to scan it until the "
                "pool is repaired.%s" % (text, kind, see))
    if text:
        return (name, 2 if state == "DEGRADED" else 3,
                "%s The SR stays usable: ZFS still serves every block. "
                "Repair the pool soon.%s" % (text, see))
    return (name, 5, "pool %s is %s again, with no problem to report."
            % (pool, state))


def send(sr_uuid, name, priority, body):
    """Start ``xe message-create`` in the background, or log why not.
    Never raises, never waits (the module's docstring says why)."""
    what = "XenAPI message %s (priority %d) on SR %s" % (name, priority,
                                                         sr_uuid)
    if not os.access(XE, os.X_OK):
        log.info("%s not sent: no %s on this host", what, XE)
        return
    argv = ["timeout", "-k", "5", str(XE_TIMEOUT), XE, "message-create",
            "name=" + name, "priority=%d" % priority, "sr-uuid=" + sr_uuid,
            "body=" + body]
    try:
        runner.spawn_detached(argv)
    except OSError as exc:
        log.warning("%s not sent: %s", what, exc)
        return
    log.info("%s: xe started in the background", what)
