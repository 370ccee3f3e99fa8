"""What a call that reported failure was making: recorded before the
failure reaches xapi, never listed, freed once no command on it runs.

Why. A ``zfs`` command stuck in the kernel (a slow or failing disk)
cannot be killed: ``runner`` gives up on it at its bound and the call
fails with ``CommandTimeout``, but the command may still finish later.
A Volume.create, snapshot or clone that failed so would leave a VDI xapi
was told was never made: it would appear at the next SR.scan, unknown to
the admin, holding space, and the admin's retry would make a second one.
A failure after the command (the ``zfs get`` that reads the new VDI back)
leaves one just the same.

So from the command that makes a VDI visible to the call's answer, a
failure first records which VDI the call was making (``making``): its
uuid, the datasets it may leave, and the command left behind in the
kernel, if any. Its uuid is new to that call, so nothing else carries it:
SR.ls and Volume.stat leave out every recorded uuid (``recorded``), and
the collector destroys the datasets once the command is gone
(``finished``, ``collect.free_abandoned``), then drops the record.

Where. One file per VDI in ``DIR/<sr>/``, on the host's own disk and
kept across reboots: a command stuck at a power cut may have made its
dataset in the last transaction group the pool wrote, and the VDI must
stay hidden after the reboot until it is freed. A command's pid is only
trusted in the boot it was recorded in (``/proc``'s boot id), and only
with the start time ``/proc`` gave its process then (no pid reuse).
Records live on this host: a pool imported elsewhere meanwhile shows
what they hide (as whole VDIs, to destroy by hand).
"""

import contextlib
import os

from zfsng import errors, log, runfiles

# Persistent, like cleanup.PLAN_DIR: a record must outlive a reboot.
# Tests point it elsewhere.
DIR = "/var/lib/zfs-ng/abandoned"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _sr_dir(sr):
    return runfiles.file_name(DIR, sr, "")


def _path(sr, key):
    return os.path.join(_sr_dir(sr), runfiles.escape(key) + ".json")


def _read(path):
    """A file of /proc, stripped; None when it is not there."""
    try:
        with open(path) as f:
            return f.read().strip()
    except (IOError, OSError):
        return None


def _started(pid):
    """pid's start time (clock ticks after boot) while it runs; None once
    it is gone (or a zombie: it has finished)."""
    stat = _read("/proc/%d/stat" % pid)
    if not stat:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]   # field 22 of proc(5)


def _command(pid):
    """What identifies a command left behind, while it runs: {} if none."""
    if pid is None:
        return {}
    started = _started(pid)
    if started is None:
        return {}
    return {"pid": pid, "started": started, "boot": _read(BOOT_ID)}


def _running(record):
    """Whether the command a record names still runs (the same process of
    the same boot)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or record.get("boot") != _read(BOOT_ID):
        return False
    return _started(pid) == record.get("started")


def record(sr, key, datasets, exc):
    """Write, durably, that the call making VDI key (its datasets) failed
    with exc. Raises OSError when the file cannot be written."""
    document = {"sr": sr, "vdi": key, "datasets": list(datasets),
                "error": getattr(exc, "message", None) or str(exc)}
    document.update(_command(getattr(exc, "pid", None)))
    runfiles.write_json(_path(sr, key), document, durable=True)
    log.warning("%s: the call making VDI %s failed; recorded: %s is never "
                "listed and is freed once no command on it runs%s", sr, key,
                ", ".join(datasets),
                " (pid %d still runs)" % document["pid"]
                if "pid" in document else "")


@contextlib.contextmanager
def making(sr, key, datasets):
    """Around the commands that make VDI key visible and read it back:
    any failure is recorded (``record``) before it goes on to xapi. When
    the record cannot be written, the error says so."""
    try:
        yield
    except Exception as exc:
        try:
            record(sr, key, datasets, exc)
        except (IOError, OSError) as why:
            log.error("cannot record the failed call making %s: %s", key,
                      why)
            if isinstance(exc, errors.StorageError):
                exc.message = (
                    "%s; and zfs-ng could not record the VDI it was making "
                    "(%s): if VDI %s appears at the next scan, it is this "
                    "call's, to destroy" % (exc.message, why, key))
                exc.args = (exc.message,)
        raise


def _records(sr):
    return [doc for _, doc in runfiles.read_all_json(_sr_dir(sr))
            if isinstance(doc, dict) and doc.get("sr") == sr and
            isinstance(doc.get("vdi"), str)]


def recorded(sr):
    """The uuids of the VDIs calls that failed were making in sr: never
    shown to xapi."""
    return set(doc["vdi"] for doc in _records(sr))


def is_recorded(sr, key):
    return os.path.exists(_path(sr, key))


def finished(sr):
    """[(uuid, datasets)] of the records of sr whose command no longer
    runs: what they made (if anything) is whole now, and can go."""
    return [(doc["vdi"], [d for d in doc.get("datasets", ())
                          if isinstance(d, str)])
            for doc in _records(sr) if not _running(doc)]


def drop(sr, key):
    """Forget the record of key: its datasets are gone."""
    runfiles.remove(_path(sr, key))
