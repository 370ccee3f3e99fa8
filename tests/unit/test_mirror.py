"""Data.mirror and Data.stat on the fake host: what is refused before
anything starts, the job recorded and its process started under a bound,
and Data.stat read from the job's file (the mirror job itself runs on real
ZFS and tapdisk: tests/integration/test_migrate_out.py). Also the copy's
rule for zeros: sent only where an earlier round wrote data."""

import contextlib
import errno
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import faketapctl
from conftest import GiB, call, create_sr, create_volume
from test_datapath import DOM0, GUEST, dataset_of, dp, host, snap_vdi, uri_of, vdi  # noqa: F401,E501
from zfsng import collect, errors, lock, meta, names, runner, spaceguard, \
    zfs
from zfsng_datapath import mirror, mirrorjob, nbd, relay, tapctl
from zfsng_datapath.errors import MirrorFailed, NbdError, NotAttached

REMOTE = "nbd+unix:///leaf?socket=/var/run/nbdproxy/export/MIR1a2b3c"


@pytest.fixture
def spawned(host, monkeypatch, tmp_path):
    """The argv lists Data.mirror started (none really started)."""
    monkeypatch.setattr(mirror, "DIR", str(tmp_path / "mirrors"))
    started = []
    monkeypatch.setattr(runner, "spawn_detached", started.append)
    return started


def running(vol):
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)


def test_starts_a_bounded_job_and_answers_its_key(host, vdi, spawned):
    sr, vol = vdi
    running(vol)
    kind, key = dp("Data.mirror", uri=uri_of(vol), domain=GUEST,
                   remote=REMOTE)
    assert kind == "MirrorV1"
    [argv] = spawned
    assert argv[:4] == ["timeout", "-k", "30", str(mirror.LIFETIME)]
    assert argv[4:] == [sys.executable, "-m", "zfsng_datapath.mirrorjob",
                        key]
    job = mirror.load(key)
    assert (job["uri"], job["domain"], job["remote"], job["phase"]) == (
        uri_of(vol), GUEST, REMOTE, "starting")
    assert [job["tapdisk"]] == list(host.tap.tapdisks)
    assert job["minor"] == 0


@pytest.mark.parametrize("case", ["snapshot", "dom0", "remote", "inactive",
                                  "other-domain"])
def test_refuses_before_starting_anything(snap_vdi, spawned, case):
    sr, vol, snap = snap_vdi
    running(vol)
    args = {"uri": uri_of(vol), "domain": GUEST, "remote": REMOTE}
    want = errors.InvalidArgument
    if case == "snapshot":
        args["uri"] = uri_of(snap)
    elif case == "dom0":
        args["domain"] = DOM0
    elif case == "remote":
        args["remote"], want = "nbd://host:10809/leaf", NbdError
    elif case == "inactive":
        dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
        want = NotAttached
    else:
        args["domain"], want = "9", NotAttached
    with pytest.raises(want):
        dp("Data.mirror", **args)
    assert spawned == []
    assert not os.path.isdir(mirror.DIR) or os.listdir(mirror.DIR) == []


def job_in(phase, pid, **fields):
    job = {"key": "0b7f4c36-3e2a-4d51-9a1c-5f6e7d8c9b0a", "phase": phase,
           "pid": pid, "copied": 0, "total": 0, "rounds": [],
           "dataset": "tank/v", "sr": "tank"}
    job.update(fields)
    mirror.save(job)
    return job["key"]


@pytest.fixture
def live_job_pid():
    """A process whose command line names the mirror job (pids are
    checked against it: a reused pid is no job)."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "import time; time.sleep(60)",
                             "zfsng_datapath.mirrorjob"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_job_not_yet_started_is_given_time(spawned, monkeypatch):
    import time
    key = job_in("starting", None, started=time.time())
    assert dp("Data.stat", operation=["MirrorV1", key])["failed"] is False
    key = job_in("starting", None, started=time.time() - 61)
    assert dp("Data.stat", operation=["MirrorV1", key])["failed"] is True


@pytest.mark.parametrize("phase,alive,want", [
    ("copying", True, {"failed": False, "complete": False}),
    ("mirroring", True, {"failed": False, "complete": True,
                         "progress": 1.0}),
    ("done", False, {"failed": False, "complete": True, "progress": 1.0}),
    ("failed", False, {"failed": True, "complete": False}),
    ("copying", False, {"failed": True, "complete": False}),   # it died
])
def test_stat_reads_the_jobs_file(spawned, live_job_pid, phase, alive,
                                  want):
    key = job_in(phase, live_job_pid if alive else 999999,
                 copied=300, total=1000)
    got = dp("Data.stat", operation=["MirrorV1", key])
    assert {k: got[k] for k in want} == want
    if not got["complete"]:
        assert got["progress"] == pytest.approx(0.99 * 0.3)


def test_stat_of_an_unknown_operation_is_a_typed_error(spawned):
    for operation in (["MirrorV1", "0b7f4c36-3e2a-4d51-9a1c-5f6e7d8c9b0a"],
                      ["CopyV1", "0b7f4c36-3e2a-4d51-9a1c-5f6e7d8c9b0a"],
                      ["MirrorV1", "../../etc/passwd"]):
        with pytest.raises(errors.InvalidArgument):
            dp("Data.stat", operation=operation)


class Recorder(object):
    """An NBD client that records what it is asked."""

    def __init__(self):
        self.zeroed, self.sent, self.written = [], 0, []

    def zero(self, offset, length):
        self.zeroed.append((offset, offset + length))

    def write(self, offset, data):
        self.sent += len(data)
        self.written.append((offset, bytes(data)))


def test_records_that_follow_each_other_go_as_one_request():
    """zfs send's records are one block each: joined up to an NBD
    request's size, sent before a zero and at the round's end, the bytes
    unchanged."""
    client = Recorder()
    copy = mirrorjob.Copy({"total": 0}, client, "tank/v", 1 << 40)
    block = 16 << 10
    record = lambda n: bytes([n % 251]) * block            # noqa: E731
    per_request = nbd.MAX_REQUEST // block
    for n in range(per_request + 2):                       # contiguous
        copy._write(n * block, record(n))
    assert [len(d) for _, d in client.written] == [nbd.MAX_REQUEST]
    copy._write(100 * nbd.MAX_REQUEST, record(7))          # a gap
    assert [len(d) for _, d in client.written] == [nbd.MAX_REQUEST,
                                                   2 * block]
    copy.held = [(0, 1 << 30)]
    copy._free(200 * nbd.MAX_REQUEST, block)               # passes all on
    assert [(at, len(d)) for at, d in client.written] == [
        (0, nbd.MAX_REQUEST), (nbd.MAX_REQUEST, 2 * block),
        (100 * nbd.MAX_REQUEST, block)]
    assert b"".join(d for _, d in client.written[:2]) == \
        b"".join(record(n) for n in range(per_request + 2))
    assert client.zeroed == [(200 * nbd.MAX_REQUEST,
                              200 * nbd.MAX_REQUEST + block)]
    copy._write(0, record(1))
    copy._pass_on()                                        # a round's end
    assert client.written[-1] == (0, record(1))


def test_zeros_are_sent_only_where_an_earlier_round_wrote():
    client = Recorder()
    copy = mirrorjob.Copy({"total": 0}, client, "tank/v", 1 << 40)
    copy.held = [(0, 100), (1000, 2000), (5000, 6000)]
    copy.writes, copy.frees = [], []
    copy._free(50, 1500)                 # over two written ranges
    copy._free(3000, 1000)               # never written: nothing sent
    copy._free(5500, None)               # to the end of the disk
    assert client.zeroed == [(50, 100), (1000, 1550), (5500, 6000)]
    copy._write(4096, b"x" * 512)
    copy._write(4608, b"y" * 512)        # touching: one range
    assert copy.writes == [(4096, 5120)]


@pytest.mark.parametrize("sizes, rounds", [
    ([900, 100, 60, 50], 3),          # a small round: mirroring next
    ([900, 300, 250, 100], 3),        # no longer shrinking: no use going on
    ([900, 400, 300, 200, 150, 100, 60], 7),
    ([int(10 ** 5 * 0.75 ** n) for n in range(20)], mirrorjob.MAX_ROUNDS),
])
def test_rounds_stop_when_small_or_no_longer_shrinking(monkeypatch, sizes,
                                                       rounds):
    MiB = 1 << 20
    monkeypatch.setattr(mirrorjob, "ROUND_SMALL", 64 * MiB)
    copy = mirrorjob.Copy({"total": 0}, Recorder(), "tank/v", 1 << 40)
    snaps, sent = [], []
    monkeypatch.setattr(copy, "snapshot",
                        lambda held: snaps.append("s%d" % len(snaps)) or
                        snaps[-1])

    def send(base, snap):
        assert base == (snaps[-2] if len(snaps) > 1 else None)
        sent.append(sizes[len(sent)] * MiB)
        return sent[-1]
    monkeypatch.setattr(copy, "send", send)
    released = []
    monkeypatch.setattr(copy, "release", lambda snap: snap and
                        released.append(snap))
    assert copy.rounds(held=None) == snaps[-1]
    assert len(sent) == rounds
    assert released == snaps[:-1]      # each base once the next is sent


def test_a_dead_jobs_snapshot_is_collected_a_running_ones_kept(host, vdi):
    """A job holds each of its snapshots (lock.reading) until it destroys
    it; one a crash left (dom0 died mid-mirror) is freed by the collector,
    which the next SR.attach runs, and one a running job holds is not."""
    sr, vol = vdi
    zvol = dataset_of(vol)
    held, left = ["%s@%s%s" % (zvol, meta.MIRROR_SNAPSHOT, n)
                  for n in ("1" * 8, "2" * 8)]
    for snap in (held, left):
        zfs.snapshot(snap)
    with lock.reading(held):
        collect.collect(sr)
        names = snapshots(zvol)
        assert held in names and left not in names
    collect.collect(sr)
    assert held not in snapshots(zvol)
    assert call("Volume.stat", sr=sr, key=vol["key"])["key"] == vol["key"]


def snapshots(zvol):
    return [r["name"] for r in zfs.list_datasets(zvol, ["name"],
                                                 types="snapshot")]


def test_the_catch_up_writes_only_through_the_relay():
    """Once tapdisk mirrors, every write and zero of the copy goes through
    the relay (which keeps them off mirrored ranges), none straight to
    the upstream connection the relay reads the replies of."""
    client, relayed = Recorder(), Recorder()
    copy = mirrorjob.Copy({"total": 0}, client, "tank/v", 1 << 30)
    copy.held = [(0, 4096)]
    copy.sink = relayed
    copy._write(8192, b"x" * 4096)
    copy._free(0, 4096)
    assert (client.sent, client.zeroed) == (0, [])
    assert (relayed.sent, relayed.zeroed) == (4096, [(0, 4096)])


class Doc(dict):
    """A job's state without its file: update keeps the fields."""

    def update(self, **fields):
        dict.update(self, fields)


def switching(host, vdi, tmp_path, monkeypatch):
    """A running VDI's copy at its switch: (copy, listener, vbd state)."""
    monkeypatch.setattr(mirror, "DIR", str(tmp_path / "mirrors"))
    monkeypatch.setattr(tapctl, "SETTLE_POLL", 0)
    sr, vol = vdi
    running(vol)
    [(pid, minor, _, _)] = host.tap.vbds()
    job = Doc(tapdisk=pid, minor=minor, sr=sr, total=0)
    copy = mirrorjob.Copy(job, Recorder(), dataset_of(vol), vol[
        "virtual_size"])
    listener = relay.listen(str(tmp_path / "relay.sock"))
    vbd = host.tap.tapdisks[pid][minor]
    return copy, listener, vbd


@pytest.mark.parametrize("fault", ["pause-stalls", "unpause-fails",
                                   "snapshot-fails"])
def test_a_failed_switch_leaves_the_guests_disk_running(host, vdi, tmp_path,
                                                        monkeypatch, fault):
    """Whatever fails around the switch, the VBD ends unpaused on its
    zvol: a pause tap-ctl gave up on completes in tapdisk later (and
    nothing else would unpause it), a resume that fails stays paused."""
    copy, listener, vbd = switching(host, vdi, tmp_path, monkeypatch)
    image = vbd["args"]
    if fault == "pause-stalls":
        host.tap.stall_pause()
    elif fault == "unpause-fails":
        host.tap.inject("tap-ctl unpause", errno.EIO)
    else:
        host.zfs.inject("zfs snapshot", "cannot create snapshot: I/O error")
    with contextlib.ExitStack() as held:
        with pytest.raises(errors.StorageError):
            copy.switch(held, listener)
    assert vbd["state"] & (faketapctl.PAUSED |
                           faketapctl.PAUSE_REQUESTED) == 0
    assert vbd["args"] == image


def test_a_pause_that_never_settles_is_given_up_on_within_its_bound(
        host, vdi, tmp_path, monkeypatch):
    """A tapdisk that never completes the pause: pause raises after
    PAUSE_SETTLE, the VBD left as tapdisk has it (and SMlog says how to
    resume it), no unpause sent to a VBD that is not paused."""
    copy, listener, vbd = switching(host, vdi, tmp_path, monkeypatch)
    monkeypatch.setattr(tapctl, "PAUSE_SETTLE", 0)
    host.tap.stall_pause(completes=False)
    with contextlib.ExitStack() as held:
        with pytest.raises(errors.CommandTimeout):
            copy.switch(held, listener)
    assert vbd["state"] & faketapctl.PAUSE_REQUESTED
    assert not [a for a in host.calls if a[:2] == ["tap-ctl", "unpause"]]


# --- a halted VM's disk (domain -1) ------------------------------------------

def test_a_halted_vms_disk_is_mirrored_without_a_tapdisk(host, vdi, spawned):
    """xapi mirrors every read-write disk of a halted or suspended VM with
    its domid, -1, the disk attached in dom0 and not activated: the job
    is recorded without a tapdisk (it copies one snapshot)."""
    sr, vol = vdi
    dp("Datapath.attach", uri=uri_of(vol), domain="u0-mirror_vbd_x_y")
    kind, key = dp("Data.mirror", uri=uri_of(vol), domain="-1",
                   remote=REMOTE)
    job = mirror.load(key)
    assert (job["domain"], job["tapdisk"], job["minor"]) == ("-1", None,
                                                             None)
    assert len(spawned) == 1


def test_a_running_vms_disk_is_no_halted_vms(host, vdi, spawned):
    sr, vol = vdi
    running(vol)
    with pytest.raises(errors.InvalidArgument):
        dp("Data.mirror", uri=uri_of(vol), domain="-1", remote=REMOTE)
    assert not spawned


class Upstream(Recorder):
    """The destination's NBD client, for a job run in this process."""

    def __init__(self, size):
        Recorder.__init__(self)
        self.size, self.flushed, self.closed = size, 0, False

    def flush(self):
        self.flushed += 1

    def close(self):
        self.closed = True


def test_a_halted_vms_job_sends_one_snapshot_and_is_done(host, vdi,
                                                         spawned,
                                                         monkeypatch):
    """The job of a halted VM's disk: one snapshot sent whole (its data,
    not its size), flushed, destroyed; done, complete for Data.stat."""
    sr, vol = vdi
    zvol = dataset_of(vol)
    host.zfs.guest_write(zvol, 0, 8192)
    host.zfs.guest_write(zvol, 512 << 20, 4096)
    _, key = dp("Data.mirror", uri=uri_of(vol), domain="-1", remote=REMOTE)
    upstream = Upstream(vol["virtual_size"])
    monkeypatch.setattr(nbd.Client, "connect",
                        staticmethod(lambda path, export: upstream))
    assert mirrorjob.main(["mirrorjob", key]) == 0
    job = mirror.load(key)
    assert job["phase"] == "done" and len(job["rounds"]) == 1
    block = host.zfs.dataset(zvol).volblocksize
    assert [(at, len(d)) for at, d in upstream.written] == [
        (0, block), (512 << 20, block)]       # whole blocks
    assert upstream.flushed and upstream.closed
    assert not [n for n in snapshots(zvol) if meta.MIRROR_SNAPSHOT in n]
    assert not [a for a in host.calls if a[:1] == ["tap-ctl"] and
                a[1] in ("pause", "unpause")]
    assert dp("Data.stat", operation=["MirrorV1", key])["complete"]


# --- a mirror that fails after xapi was told it was complete -----------------

def test_a_failure_after_complete_is_raised_once_by_data_stat(spawned):
    """xapi polls Data.stat only until complete; it calls it once more
    before it moves the VM's memory, ignoring ``failed``: so the failure
    of a job that said complete is raised (the move fails, the VM still
    running here), once; after that Data.stat answers failed."""
    key = job_in("mirroring", None, dataset="tank/v",
                 started=time.time())     # not yet started: alive
    job = mirror.load(key)
    assert dp("Data.stat", operation=["MirrorV1", key])["complete"]
    job.update(phase="failed", error="the destination went away")
    mirror.save(job)
    with pytest.raises(MirrorFailed) as raised:
        dp("Data.stat", operation=["MirrorV1", key])
    assert "the destination went away" in str(raised.value)
    answer = dp("Data.stat", operation=["MirrorV1", key])
    assert answer["failed"] and not answer["complete"]


def test_a_failure_before_complete_is_answered_not_raised(spawned):
    """xapi's mirror_wait sees ``failed`` itself: no raise."""
    key = job_in("failed", None, dataset="tank/v", error="refused")
    answer = dp("Data.stat", operation=["MirrorV1", key])
    assert answer["failed"] and not answer["complete"]


def test_deactivate_waits_out_the_relays_replies_and_a_flush():
    """END_WAIT is a number so that the Datapath calls need not load nbd
    (its sockets); it must still cover the relay's last reply due."""
    assert mirror.END_WAIT == nbd.TIMEOUT + 30


def mirrored(host, vol, monkeypatch, phase):
    """A job mirroring vol's disk for the guest, that Data.stat said was
    complete; its process stood for by a live pid."""
    monkeypatch.setattr(mirror, "END_WAIT", 0.5)
    [(pid, minor, _, _)] = host.tap.vbds()
    job = {"key": names.new_uuid(), "dataset": dataset_of(vol),
           "domain": GUEST, "tapdisk": pid, "minor": minor, "phase": phase,
           "pid": None, "started": time.time(), "copied": 0,
           "total": 0, "rounds": []}
    mirror.save(job)
    assert dp("Data.stat", operation=["MirrorV1", job["key"]])["complete"]
    return job


@pytest.mark.parametrize("fault", ["tapdisk-dropped", "job-failed",
                                   "job-hangs"])
def test_deactivate_stops_a_move_whose_mirror_failed(host, vdi, spawned,
                                                     monkeypatch, fault):
    """xenopsd deactivates the suspended VM's disk before the destination
    resumes it: a mirror that failed after complete fails that call (the
    move stops; xenopsd halts the VM here, its disk intact), once; the
    VBD is closed all the same."""
    sr, vol = vdi
    running(vol)
    job = mirrored(host, vol, monkeypatch, "mirroring")
    [(pid, minor, _, _)] = host.tap.vbds()
    if fault == "tapdisk-dropped":
        host.tap.drop_mirror(pid, minor)
        job.update(phase="done", ended=1)
    elif fault == "job-failed":
        job.update(phase="failed", error="no reply within 60 s")
    mirror.save(job)
    with pytest.raises(MirrorFailed):
        dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    assert host.tap.vbds()[0][2] is None               # closed
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)


def test_deactivate_after_a_good_mirror_lets_the_move_go_on(host, vdi,
                                                            spawned,
                                                            monkeypatch):
    sr, vol = vdi
    running(vol)
    job = mirrored(host, vol, monkeypatch, "done")
    job.update(ended=1)
    mirror.save(job)
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    assert host.tap.vbds()[0][2] is None


def test_a_job_failed_before_complete_never_fails_a_deactivate(
        host, vdi, spawned, monkeypatch):
    """xapi knew (mirror_wait saw failed): the VM stays here and its
    later shutdown must not fail."""
    sr, vol = vdi
    running(vol)
    [(pid, minor, _, _)] = host.tap.vbds()
    job_in("failed", None, dataset=dataset_of(vol), domain=GUEST,
           tapdisk=pid, minor=minor, error="refused")
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)


def test_finished_jobs_files_go_after_a_day(host, vdi, spawned,
                                            monkeypatch):
    old = job_in("done", None, dataset="tank/v", ended=1)
    mirror._mark(old, "complete")
    sr, vol = vdi
    running(vol)
    _, key = dp("Data.mirror", uri=uri_of(vol), domain=GUEST, remote=REMOTE)
    assert sorted(os.listdir(mirror.DIR)) == [key + ".json"]


def test_a_vm_stopped_mid_copy_is_not_held_by_its_job(host, vdi, spawned,
                                                      monkeypatch):
    """A job xapi was never told complete cannot stop a move: the VM's
    deactivate does not wait for it to end."""
    sr, vol = vdi
    running(vol)
    monkeypatch.setattr(mirror, "END_WAIT", 30)
    [(pid, minor, _, _)] = host.tap.vbds()
    job_in("copying", None, dataset=dataset_of(vol), domain=GUEST,
           tapdisk=pid, minor=minor, started=time.time())
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    assert waits == []


@pytest.mark.parametrize("told_by", ["data-stat", "deactivate"])
def test_a_guest_rebooted_during_its_move_fails_the_move(
        host, vdi, spawned, monkeypatch, told_by):
    """A reboot during the move: the old domain's VBD closes (its mirror
    ends "done"), a new domain opens the disk, and its writes reach no
    mirror. While xapi's move runs (its send_start attach is there), that
    activate marks the job: xapi's last Data.stat, or the new domain's
    deactivate in VM_save, fails the move, once."""
    sr, vol = vdi
    sending = "u0_mirror_vbd_7_xvda"
    dp("Datapath.attach", uri=uri_of(vol), domain=sending)
    running(vol)
    job = mirrored(host, vol, monkeypatch, "mirroring")
    job.update(phase="done", ended=time.time())   # reboot: as the VBD
    mirror.save(job)                              # closes, the job ends
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.attach", uri=uri_of(vol), domain="8")
    dp("Datapath.activate", uri=uri_of(vol), domain="8")
    if told_by == "data-stat":
        with pytest.raises(MirrorFailed) as raised:
            dp("Data.stat", operation=["MirrorV1", job["key"]])
        dp("Datapath.deactivate", uri=uri_of(vol), domain="8")
    else:
        with pytest.raises(MirrorFailed) as raised:
            dp("Datapath.deactivate", uri=uri_of(vol), domain="8")
    assert "domain 8" in str(raised.value)
    answer = dp("Data.stat", operation=["MirrorV1", job["key"]])
    assert answer["failed"] and not answer["complete"]


def test_xapis_copy_reading_the_mirrored_disk_is_no_reboot(
        host, vdi, spawned, monkeypatch):
    """xapi copies a moving VM's snapshots and suspend image itself
    (storage_smapiv1_migrate.ml copy_into_vdi) while the VM's mirror
    runs; with_activated_disk may attach and activate the mirrored disk
    too, as sparse_dd's base (the first VDI whose content_id is the new
    destination VDI's, "" on a SMAPIv3 SR), for the copy's pseudo-domain
    CP<hex>. That is a read by dom0, not a rebooted guest: the move goes
    on, and the VM's deactivate ends it well."""
    sr, vol = vdi
    sending = "u0_mirror_vbd_7_xvda"
    dp("Datapath.attach", uri=uri_of(vol), domain=sending)
    running(vol)
    job = mirrored(host, vol, monkeypatch, "mirroring")
    for method in ("Datapath.attach", "Datapath.activate",
                   "Datapath.deactivate", "Datapath.detach"):
        dp(method, uri=uri_of(vol), domain="CP1a2b3c")
        answer = dp("Data.stat", operation=["MirrorV1", job["key"]])
        assert answer["complete"] and not answer["failed"], method
    job.update(phase="done", ended=time.time())   # the VM moves
    mirror.save(job)
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    assert dp("Data.stat", operation=["MirrorV1", job["key"]])["complete"]


def test_a_reboot_after_the_move_ended_is_no_failure(host, vdi, spawned,
                                                     monkeypatch):
    """Once xapi's send_start attach is gone (the move over, or given
    up), a new domain on the disk is an ordinary VM start."""
    sr, vol = vdi
    running(vol)
    job = mirrored(host, vol, monkeypatch, "done")
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.attach", uri=uri_of(vol), domain="8")
    dp("Datapath.activate", uri=uri_of(vol), domain="8")
    dp("Datapath.deactivate", uri=uri_of(vol), domain="8")
    assert dp("Data.stat", operation=["MirrorV1", job["key"]])["complete"]


@pytest.mark.parametrize("vbd_open", [True, False])
def test_a_mirror_that_fails_leaves_mirror_mode(host, vdi, tmp_path,
                                                monkeypatch, vbd_open):
    """tapdisk keeps ignoring ENOSPC on the zvol's image once a secondary
    was added, dropped or not: a failed mirror whose VM runs on here has
    its image reopened without a secondary (pause, unpause -2 null); a
    VBD closed already is left alone."""
    copy, _, vbd = switching(host, vdi, tmp_path, monkeypatch)
    job = mirrorjob.Job.__new__(mirrorjob.Job)
    job.key = names.new_uuid()
    job.doc = dict(copy.job, key=job.key, dataset=copy.zvol, rounds=[],
                   copied=0, remote=REMOTE)

    class Failing(object):
        def stop(self, error):
            pass

        def wait(self):
            raise NbdError("the destination closed the NBD connection")

        def ended(self, timeout):
            return True
    monkeypatch.setattr(nbd.Client, "connect", staticmethod(
        lambda path, export: Upstream(copy.size)))
    monkeypatch.setattr(mirrorjob.Copy, "rounds", lambda self, held: "s1")
    monkeypatch.setattr(mirrorjob.Copy, "switch",
                        lambda self, held, listener, budget=None:
                        ("s2", Failing()))
    monkeypatch.setattr(mirrorjob.Copy, "catch_up", lambda self, *a: None)
    monkeypatch.setattr(mirror, "save", lambda doc: None)
    short = tempfile.mkdtemp(dir="/tmp")    # a unix socket's path is short
    monkeypatch.setattr(mirror, "DIR", short)
    if not vbd_open:
        [(pid, minor, _, _)] = host.tap.vbds()
        host.tap(["tap-ctl", "close", "-p", str(pid), "-m", str(minor)])
    before = len(host.calls)
    with contextlib.ExitStack() as held:
        with pytest.raises(NbdError):
            mirrorjob.run(job, held)
    cycled = [a[1:2] + a[6:] for a in host.calls[before:]
              if a[:2] in (["tap-ctl", "pause"], ["tap-ctl", "unpause"])]
    assert cycled == ([["pause"], ["unpause", "-2", "null"]] if vbd_open
                      else [])
    assert vbd["state"] == (0 if vbd_open else faketapctl.CLOSED)
    assert host.zfs.get(copy.zvol, meta.MIRROR_GUARD) is None  # put back
    assert host.zfs.get(copy.zvol, "refreservation") in (None, 0, "0")
    shutil.rmtree(short)


def test_a_pool_without_room_for_the_guard_refuses_before_the_pause(
        host, tmp_path, monkeypatch, spawned):
    """Room to write the disk whole, or no mirror: the job fails before
    it copies anything and before tapdisk is paused, the VM untouched."""
    sr, _ = create_sr({"device": "/dev/sdb"})
    vol = create_volume(sr, size=20 * GiB, name="big")   # a 10 GiB pool
    running(vol)
    [(pid, minor, _, _)] = host.tap.vbds()
    copy = mirrorjob.Copy(Doc(tapdisk=pid, minor=minor, sr=sr, total=0),
                          Upstream(vol["virtual_size"]), dataset_of(vol),
                          vol["virtual_size"])
    job = mirrorjob.Job.__new__(mirrorjob.Job)
    job.key = names.new_uuid()
    job.doc = dict(copy.job, key=job.key, dataset=copy.zvol, rounds=[],
                   copied=0, remote=REMOTE)
    monkeypatch.setattr(nbd.Client, "connect", staticmethod(
        lambda path, export: Upstream(copy.size)))
    copied = []
    monkeypatch.setattr(mirrorjob.Copy, "rounds",
                        lambda self, held: copied.append(1) or "s1")
    monkeypatch.setattr(mirror, "save", lambda doc: None)
    with contextlib.ExitStack() as held:
        with pytest.raises(errors.OutOfSpace):
            mirrorjob.run(job, held)
    assert not [a for a in host.calls if a[:2] == ["tap-ctl", "pause"]]
    assert not copied            # refused before the copy, not after it
    assert host.zfs.get(copy.zvol, meta.MIRROR_GUARD) is None


# --- a job killed without its cleanup ------------------------------------------

def killed_while_mirroring(host, vol, paused=False):
    """A job killed (SIGKILL) once tapdisk mirrored the disk: its VBD in
    mirror mode (or left paused, killed inside the switch), its space
    guard standing, its file saying it mirrors, its pid dead."""
    zvol = dataset_of(vol)
    [(pid, minor, _, _)] = host.tap.vbds()
    with lock.sr_lock(zvol.split("/")[0]):
        spaceguard.hold(zvol)
    spaceguard.mark_mirroring(zvol)          # as the job does at its switch
    host.tap(["tap-ctl", "pause", "-p", str(pid), "-m", str(minor)])
    if not paused:
        host.tap(["tap-ctl", "unpause", "-p", str(pid), "-m", str(minor),
                  "-2", "nbd:/var/run/x.sock"])
    job = {"key": names.new_uuid(), "dataset": zvol, "sr": zvol.split("/")[0],
           "domain": GUEST, "tapdisk": pid, "minor": minor,
           "phase": "mirroring", "pid": 999999, "started": time.time(),
           "switching": time.time(), "copied": 0, "total": 0, "rounds": []}
    mirror.save(job)
    return job, host.tap.tapdisks[pid][minor]


def guarded(host, zvol):
    return host.zfs.get(zvol, meta.MIRROR_GUARD) is not None


@pytest.mark.parametrize("seen_by", ["data-stat", "data-mirror",
                                     "deactivate", "paused"])
def test_a_killed_jobs_vbd_leaves_mirror_mode_at_the_next_call(
        host, vdi, spawned, seen_by):
    """A job killed without its cleanup leaves its VBD in mirror mode,
    where tapdisk answers an ENOSPC on the zvol as success: the next call
    that sees it (xapi's Data.stat, a new Data.mirror, the VBD's
    deactivate) reopens the image without a secondary, puts the guard
    back and records the job failed, once."""
    sr, vol = vdi
    running(vol)
    zvol = dataset_of(vol)
    job, vbd = killed_while_mirroring(host, vol, paused=seen_by == "paused")
    before = len(host.calls)
    if seen_by == "data-mirror":
        dp("Data.mirror", uri=uri_of(vol), domain=GUEST, remote=REMOTE)
    elif seen_by == "deactivate":
        dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    else:
        answer = dp("Data.stat", operation=["MirrorV1", job["key"]])
        assert answer["failed"] and not answer["complete"]
    cycled = [a[1:2] + a[6:] for a in host.calls[before:]
              if a[:2] in (["tap-ctl", "pause"], ["tap-ctl", "unpause"])]
    assert not vbd["ignore_enospc"] and not vbd["state"] & faketapctl.PAUSED
    if seen_by == "deactivate":
        assert cycled == [] and vbd["args"] is None      # closed
    elif seen_by == "paused":
        assert cycled == [["unpause", "-2", "null"]]
    else:
        assert cycled == [["pause"], ["unpause", "-2", "null"]]
    assert not guarded(host, zvol)
    assert host.zfs.get(zvol, "refreservation") in (None, 0, "0")
    done = mirror.load(job["key"])
    assert done["phase"] == "failed" and done["ended"] and done["error"]
    before = len(host.calls)
    dp("Data.stat", operation=["MirrorV1", job["key"]])
    assert host.calls[before:] == []                   # done once


def test_a_killed_jobs_cleanup_waits_while_tapdisk_refuses_it(
        host, vdi, spawned):
    """tap-ctl fails: the guard stays (the disk keeps its room while the
    VBD may ignore ENOSPC) and the next call tries again."""
    sr, vol = vdi
    running(vol)
    job, vbd = killed_while_mirroring(host, vol)
    host.tap.inject("tap-ctl pause", errno.EIO)
    assert dp("Data.stat", operation=["MirrorV1", job["key"]])["failed"]
    assert vbd["ignore_enospc"] and guarded(host, dataset_of(vol))
    assert mirror.load(job["key"])["phase"] == "mirroring"
    assert dp("Data.stat", operation=["MirrorV1", job["key"]])["failed"]
    assert not vbd["ignore_enospc"] and not guarded(host, dataset_of(vol))
    assert mirror.load(job["key"])["phase"] == "failed"


@pytest.mark.parametrize("collector", ["sr-attach", "volume-destroy"])
def test_the_collector_leaves_a_killed_jobs_guard_while_its_vbd_mirrors(
        host, vdi, spawned, collector):
    """A killed job's VBD may still be in mirror mode until the next
    datapath call takes it out: a collector that runs first (SR.attach,
    a Volume.destroy of another disk) leaves its guard, so a pool filled
    meanwhile never refuses the zvol a write tapdisk would answer as
    done; the datapath's cleanup puts it back."""
    sr, vol = vdi
    running(vol)
    zvol = dataset_of(vol)
    job, vbd = killed_while_mirroring(host, vol)
    if collector == "sr-attach":
        collect.collect(sr)
    else:
        other = create_volume(sr, size=GiB, name="other")
        call("Volume.destroy", sr=sr, key=other["key"])
    assert vbd["ignore_enospc"] and guarded(host, zvol)
    assert int(host.zfs.get(zvol, "refreservation")) > GiB
    assert dp("Data.stat", operation=["MirrorV1", job["key"]])["failed"]
    assert not vbd["ignore_enospc"] and not guarded(host, zvol)
    assert not spaceguard.mirroring(zvol)


def test_a_guard_whose_vbd_may_mirror_after_its_job_stays_until_closed(
        host, vdi, spawned):
    """The job's own end could not take its VBD out of mirror mode
    (tap-ctl failed): the guard stays, the collector leaves it, and the
    VBD's deactivate (tapdisk closes it) puts it back."""
    sr, vol = vdi
    running(vol)
    zvol = dataset_of(vol)
    job, vbd = killed_while_mirroring(host, vol)
    job.update(phase="failed", ended=time.time(), error="x")  # it ended
    mirror.save(job)
    collect.collect(sr)
    assert guarded(host, zvol)
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    assert vbd["args"] is None and not guarded(host, zvol)
    assert host.zfs.get(zvol, "refreservation") in (None, 0, "0")
    assert not spaceguard.mirroring(zvol)


def test_a_newer_jobs_mirror_is_left_alone(host, vdi, spawned):
    """A live job holds the disk's guard (a newer move of it): the dead
    job is recorded failed, the live one's mirror and guard untouched."""
    sr, vol = vdi
    running(vol)
    job, vbd = killed_while_mirroring(host, vol)
    with lock.reading(spaceguard.lock_name(dataset_of(vol))):
        before = len(host.calls)
        assert dp("Data.stat", operation=["MirrorV1", job["key"]])["failed"]
        assert not [a for a in host.calls[before:]
                    if a[:2] == ["tap-ctl", "pause"]]
    assert vbd["ignore_enospc"] and guarded(host, dataset_of(vol))
    assert mirror.load(job["key"])["phase"] == "failed"


def test_a_job_killed_before_its_switch_never_pauses_the_guest(
        host, vdi, spawned):
    sr, vol = vdi
    running(vol)
    job, vbd = killed_while_mirroring(host, vol)
    del job["switching"]
    job["phase"] = "copying"
    mirror.save(job)
    before = len(host.calls)
    assert dp("Data.stat", operation=["MirrorV1", job["key"]])["failed"]
    assert not [a for a in host.calls[before:] if a[0] == "tap-ctl"]
    assert not guarded(host, dataset_of(vol))


# --- tapdisk retires the zvol on ENOSPC ---------------------------------------

class Watched(object):
    """A relay for the watchdog: it runs for a few looks, then ends;
    stop() records why it was stopped."""

    def __init__(self, looks):
        self.looks, self.stopped = looks, None

    def ended(self, timeout):
        self.looks -= 1
        return self.looks < 0 or self.stopped is not None

    def stop(self, why):
        self.stopped = why


def watched_job(host, vol):
    """A job of vol's disk whose VBD tapdisk mirrors, as after the
    switch: (the job, its VBD's fake state)."""
    doc, vbd = killed_while_mirroring(host, vol)
    doc["image"] = vbd["args"].split(":", 1)[1]
    mirror.save(doc)
    job = mirrorjob.Job(doc["key"])
    return job, vbd


@pytest.mark.parametrize("event", ["retired", "dropped", "none"])
def test_the_watchdog_tells_a_retired_zvol_from_a_dropped_mirror(
        host, vdi, spawned, monkeypatch, event):
    """An ENOSPC retires the zvol (the guest served by the destination
    alone, nbd_mirror_failed untouched): the job records it and lets the
    mirror go on, the destination being the only whole disk. A dropped
    secondary stops the mirror. Neither: nothing happens."""
    sr, vol = vdi
    running(vol)
    monkeypatch.setattr(mirrorjob, "WATCH", 0)
    job, vbd = watched_job(host, vol)
    [(pid, minor, _, _)] = host.tap.vbds()
    if event == "retired":
        host.tap.retire_image(pid, minor)
    elif event == "dropped":
        host.tap.drop_mirror(pid, minor)
    relay_ = Watched(looks=3)
    mirrorjob._watch(job, relay_)
    deadline = time.monotonic() + 10
    while relay_.looks >= 0 and relay_.stopped is None and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    saved = mirror.load(job.key)
    assert bool(saved.get("zvol_retired")) == (event == "retired")
    assert (relay_.stopped is not None) == (event == "dropped")


def test_a_failed_job_never_reopens_a_retired_zvol(host, vdi, spawned):
    """The zvol is stale once retired: the failing job's way out leaves
    the VBD serving the destination rather than reopen the zvol."""
    sr, vol = vdi
    running(vol)
    job, vbd = watched_job(host, vol)
    job.update(zvol_retired=time.time())
    before = len(host.calls)
    mirrorjob._leave_mirror_mode(job)
    assert not [a for a in host.calls[before:] if a[0] == "tap-ctl"]


def test_a_killed_jobs_cleanup_never_reopens_a_retired_zvol(host, vdi,
                                                            spawned):
    sr, vol = vdi
    running(vol)
    job, vbd = killed_while_mirroring(host, vol)
    job["zvol_retired"] = time.time()
    mirror.save(job)
    before = len(host.calls)
    assert dp("Data.stat", operation=["MirrorV1", job["key"]])["failed"]
    assert not [a for a in host.calls[before:]
                if a[:2] in (["tap-ctl", "pause"], ["tap-ctl", "unpause"])]
    assert mirror.load(job["key"])["phase"] == "failed"


def test_tap_ctl_stats_images_are_read_as_tapdisk_prints_them(host, vdi):
    """The chain in mirror mode: the image, then the secondary; the
    secondary alone once retired; nothing while paused."""
    sr, vol = vdi
    running(vol)
    [(pid, minor, _, _)] = host.tap.vbds()
    path = host.tap.tapdisks[pid][minor]["args"].split(":", 1)[1]
    assert tapctl.images(pid, minor) == [path]
    tapctl.pause(pid, minor)
    assert tapctl.images(pid, minor) == []
    tapctl.unpause(pid, minor, "nbd:/var/run/m.sock")
    assert tapctl.images(pid, minor) == [path, "/var/run/m.sock"]
    host.tap.retire_image(pid, minor)
    assert tapctl.images(pid, minor) == ["/var/run/m.sock"]
    assert tapctl.parse_images("no json") is None


# --- the relay keeps the guard's window ---------------------------------------

class Destination(object):
    """An upstream NBD client whose server answers every request OK."""

    def __init__(self):
        self.sock, server = socket.socketpair()
        self.flags = 0
        self.server = threading.Thread(target=self._serve, args=(server,))
        self.server.daemon = True
        self.server.start()

    def drain(self):
        pass

    def _serve(self, server):
        try:
            while True:
                head = relay._recv(server, 28)
                _, _, kind, handle, _, length = struct.unpack(">IHHQQI",
                                                              head)
                if kind == nbd.CMD_WRITE:
                    relay._recv(server, length)
                server.sendall(struct.pack(">IIQ", nbd.SIMPLE_REPLY_MAGIC,
                                           0, handle))
        except (NbdError, OSError):
            server.close()


def tapdisk_writes(tapdisk, writes):
    """tapdisk's side: each write sent, its reply read."""
    for n, (offset, length) in enumerate(writes):
        tapdisk.sendall(struct.pack(">IHHQQI", nbd.REQUEST_MAGIC, 0,
                                    nbd.CMD_WRITE, n, offset, length) +
                        b"x" * length)
        assert len(relay._recv(tapdisk, 16)) == 16


@pytest.mark.parametrize("settles", [True, False])
def test_the_relay_writes_the_pool_out_once_a_window_is_dirtied(settles):
    """tapdisk's writes are counted at what they dirty in ZFS; once the
    guard's window is full the pool is written out (zpool sync) before
    the next request is read, so ZFS's estimate of the zvol's unsynced
    writes stays inside the guard. A sync that fails fails the mirror
    (tapdisk drops it): never a write past the guard."""
    budget = spaceguard.Budget(32 << 20, 16 << 10, 1 << 20)
    synced = []

    def settle():
        synced.append(budget.data)
        if not settles:
            raise errors.StorageError("zpool sync: I/O error")
    tapdisk, conn = socket.socketpair()
    forwarder = relay.Forwarder(conn, Destination(), budget, settle)
    forwarder.caught_up()
    forwarder.start()
    writes = [(at, 44 << 10) for at in range(0, 8 << 20, 64 << 10)]
    if settles:
        tapdisk_writes(tapdisk, writes)
        # 48 KiB of blocks a write, the disk's 384 KiB of indirect blocks:
        # a sync once 14 writes filled the 1 MiB window, then every 14
        assert synced and all(n >= (1 << 20) - (384 << 10)
                              for n in synced)
        assert len(synced) == len(writes) // 14
        assert forwarder.settles == len(synced)
        assert forwarder.settle_seconds >= 0
        tapdisk.sendall(struct.pack(">IHHQQI", nbd.REQUEST_MAGIC, 0,
                                    nbd.CMD_DISC, 0, 0, 0))
        forwarder.wait()
        return
    # the relay closes tapdisk's connection: its next reply read short,
    # or its next write refused (EPIPE) when the close came first
    with pytest.raises((NbdError, OSError)):
        tapdisk_writes(tapdisk, writes)
    assert len(synced) == 1 and forwarder.settles == 1
    with pytest.raises(NbdError) as err:
        forwarder.wait()
    assert "guard" in str(err.value)


def test_the_jobs_records_from_two_threads_never_interleave(monkeypatch):
    """The watchdog's thread records (a retired zvol) while the job's
    own thread does: each save whole, one after the other (the file's
    writes share one temporary name)."""
    inside, overlaps = [], []

    def save(doc):
        if inside:
            overlaps.append(dict(doc))
        inside.append(1)
        time.sleep(0.01)
        inside.pop()
    monkeypatch.setattr(mirror, "save", save)
    job = mirrorjob.Job.__new__(mirrorjob.Job)
    job.doc = {}
    threads = [threading.Thread(target=lambda: [job.update(step=n)
                                                for n in range(5)])
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not overlaps


def test_the_mirror_s_end_logs_what_the_guard_s_syncs_cost(monkeypatch,
                                                           capsys):
    """The guard's pool syncs are what a busy guest pays while mirrored:
    the job record keeps them, and SMlog says them for the admin."""
    class Forwarder(object):
        forwarded, settles, settle_seconds = 3 << 20, 2, 1.25

        def wait(self):
            pass

    class Copy(object):
        client = Upstream(0)

        def switch(self, held, listener, budget):
            return "s1", Forwarder()

        def catch_up(self, base, last, forwarder):
            pass
    job = mirrorjob.Job.__new__(mirrorjob.Job)
    job.key, job.doc = "k", {}
    monkeypatch.setattr(mirror, "save", lambda doc: None)
    monkeypatch.setattr(mirrorjob, "_watch", lambda job, forwarder: None)
    mirrorjob.mirror_writes(job, Copy(), "s0", None, None)
    assert (job["mirrored"], job["settles"], job["settle_seconds"]) == (
        3 << 20, 2, 1.25)
    assert "mirror k: 3145728 bytes mirrored; the space guard's window " \
        "took 2 pool syncs, 1.2 s" in capsys.readouterr().err
