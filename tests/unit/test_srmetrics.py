"""An SR's pool figures for xcp-rrdd: the file (rrdfile), the figures
(poolstats) and the writer's life (srmetrics). Every file is checked with
tests/rrdv2.py, a reader written from the format, not from the writer."""

import math
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import SR_UUID, call, create_sr
from zfsng import errors, lock, runfiles, runner
from zfsng_volume import poolstats, rrdfile, srmetrics

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
import rrdv2  # noqa: E402

OWNER = ("sr", SR_UUID)

# zpool iostat -Hpy -l <pool> 4 1, one report (2.1: 15 columns; 2.3
# adds the rebuild wait)
IOSTAT_21 = ("tank\t1069056\t1072672768\t12\t340\t49152\t10485760\t250000"
             "\t1500000\t200000\t1200000\t-\t-\t40000\t300000\t-\n")
IOSTAT_23 = IOSTAT_21.rstrip("\n") + "\t-\n"
LIST = "1073741824\t1069056\t1072672768\t3\tONLINE\n"
GET = ("used\t5505024\navailable\t1034944512\ncompressratio\t1.85x\n"
       "org.xcp-ng.zfs-ng:sr-uuid\t%s\n" % SR_UUID)


def figures(**changes):
    values = dict(("zfs_" + k, v) for k, v in poolstats.parse_iostat(
        IOSTAT_21).items())
    values.update(changes)
    return values


# --- the file ----------------------------------------------------------------

def test_the_file_reads_back_as_xcp_rrdd_reads_it(tmp_path):
    path = str(tmp_path / "m")
    rrdfile.create(path, rrdfile.encode(srmetrics.sources(SR_UUID),
                                        figures(), 1700000000.5))
    got = rrdv2.read_file(path)
    assert got["timestamp"] == 1700000000.5
    assert sorted(got["sources"]) == sorted(
        "zfs_" + s[0] for s in srmetrics._SOURCES)
    assert got["sources"]["zfs_read_iops"]["value"] == 12.0
    assert got["sources"]["zfs_write_throughput"]["value"] == 10485760.0
    assert got["sources"]["zfs_write_latency"]["value"] == 1.5   # ms
    assert math.isnan(got["sources"]["zfs_health"]["value"])     # unknown
    for source in got["sources"].values():
        assert source["owner"] == OWNER
        assert source["type"] == "gauge" and source["default"] == "true"


def test_a_new_file_is_whole_pages_and_appears_under_its_name_once(
        tmp_path):
    path = str(tmp_path / "m")
    rrdfile.create(path, rrdfile.encode(srmetrics.sources(SR_UUID), {}, 1.0))
    assert os.path.getsize(path) % rrdfile.PAGE == 0
    assert os.listdir(str(tmp_path)) == ["m"]


def test_an_update_rewrites_the_same_file_in_place(tmp_path):
    """xcp-rrdd maps the file once: same inode, same size."""
    path = str(tmp_path / "m")
    table = srmetrics.sources(SR_UUID)
    rrdfile.create(path, rrdfile.encode(table, {}, 1.0))
    before = os.stat(path)
    assert rrdfile.update(path, rrdfile.encode(table, figures(), 2.0))
    after = os.stat(path)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    got = rrdv2.read_file(path)
    assert got["timestamp"] == 2.0
    assert got["sources"]["zfs_read_iops"]["value"] == 12.0


def test_a_read_in_the_middle_of_an_update_fails_its_checksum(tmp_path):
    """The body is written before the header: half an update is never
    taken for data."""
    table = srmetrics.sources(SR_UUID)
    old = rrdfile.encode(table, figures(), 1.0)
    new = rrdfile.encode(table, figures(zfs_read_iops=99.0), 2.0)
    torn = old[:rrdfile._BODY] + new[rrdfile._BODY:]
    with pytest.raises(rrdv2.Invalid):
        rrdv2.read(torn)


def test_an_update_of_a_missing_or_smaller_file_says_so(tmp_path):
    path = str(tmp_path / "m")
    payload = rrdfile.encode(srmetrics.sources(SR_UUID), {}, 1.0)
    assert not rrdfile.update(path, payload)
    with open(path, "wb") as f:
        f.write(b"\0" * 10)
    assert not rrdfile.update(path, payload)


# --- the figures -------------------------------------------------------------

@pytest.mark.parametrize("text", [IOSTAT_21, IOSTAT_23])
def test_iostat_rates_and_latencies(text):
    got = poolstats.parse_iostat(text)
    assert got == {"read_iops": 12.0, "write_iops": 340.0,
                   "read_throughput": 49152.0,
                   "write_throughput": 10485760.0,
                   "read_latency": 0.25, "write_latency": 1.5}


def test_figures_with_no_value_are_unknown_not_zero():
    got = poolstats.parse_iostat("tank\t0\t0\t-\t-\t-\t-\t-\t-\n")
    assert all(math.isnan(v) for v in got.values())
    assert all(math.isnan(v) for v in poolstats.parse_iostat("").values())


@pytest.mark.parametrize("health,number", [
    ("ONLINE", 0), ("DEGRADED", 1), ("FAULTED", 2), ("SUSPENDED", 2),
    ("UNAVAIL", 2)])
def test_health_as_a_number(health, number):
    got = poolstats.parse_list(LIST.replace("ONLINE", health))
    assert got["health"] == number
    assert got["pool_size"] == 1073741824 and got["fragmentation"] == 3


def test_a_pool_that_cannot_be_listed_cannot_serve():
    got = poolstats.parse_list("")
    assert got["health"] == 2 and math.isnan(got["pool_size"])


def test_the_sr_dataset_space_compression_and_owner():
    assert poolstats.parse_get(GET) == {
        "sr_used": 5505024.0, "sr_available": 1034944512.0,
        "compressratio": 1.85}
    assert poolstats.sr_uuid_of(GET) == SR_UUID
    assert poolstats.sr_uuid_of("") is None


# --- the writer's life, through the SR calls ---------------------------------

def test_attach_makes_the_file_before_it_returns_and_starts_a_writer(
        fake, writers):
    sr, _ = create_sr()
    got = rrdv2.read_file(srmetrics.path(SR_UUID))
    assert all(s["owner"] == OWNER for s in got["sources"].values())
    assert writers == [[sys.executable, "-m", "zfsng_volume.srmetrics",
                        "--", sr, SR_UUID]]
    assert call("SR.stat", sr=sr)["datasources"] == [
        "xeno+shm:///zfs-ng-" + SR_UUID]


def hold_writer_lock():
    os.makedirs(lock.RUN_DIR, exist_ok=True)
    fd = os.open(srmetrics._lock_file(SR_UUID), os.O_RDWR | os.O_CREAT)
    assert lock.try_flock(fd)
    return fd


def test_stat_starts_a_writer_again_only_when_none_runs(
        fake, writers, monkeypatch):
    sr, _ = create_sr()                 # SR.attach, then SR.stat at once:
    assert len(writers) == 1            # the new writer is left its time
    monkeypatch.setattr(srmetrics, "STARTUP", 0.0)
    call("SR.stat", sr=sr)
    assert len(writers) == 2            # none held the lock: started again
    fd = hold_writer_lock()
    try:
        call("SR.stat", sr=sr)
        assert len(writers) == 2
    finally:
        os.close(fd)


def test_detach_and_destroy_leave_no_file_and_no_datasource(fake, writers):
    sr, config = create_sr()
    call("SR.detach", sr=sr)
    assert not os.path.exists(srmetrics.path(SR_UUID))
    assert not os.path.exists(srmetrics._record(SR_UUID))
    sr = call("SR.attach", configuration=config)
    assert os.path.exists(srmetrics.path(SR_UUID))
    call("SR.destroy", sr=sr)
    assert os.listdir(srmetrics.DIR) == []


@pytest.mark.parametrize("how", ["zpool destroy tank", "zpool export tank"])
def test_detach_of_an_sr_whose_pool_is_gone_stops_its_statistics(
        fake, writers, how):
    """The pool destroyed or exported by hand: SR.detach has nothing to
    export, but still drops the record and deletes the file (xcp-rrdd
    then deregisters it)."""
    sr, _ = create_sr()
    fake.admin(how)
    assert call("SR.detach", sr=sr) is None
    assert not os.path.exists(srmetrics.path(SR_UUID))
    assert not os.path.exists(srmetrics._record(SR_UUID))


def test_a_failed_export_keeps_the_statistics_of_the_sr_left_attached(
        fake, writers):
    """The writer is stopped before zpool export (its commands could make
    the pool busy): an export that fails starts it again."""
    sr, _ = create_sr()
    fake.inject("zpool export", "cannot export 'tank': Input/output error")
    with pytest.raises(errors.ZfsError):
        call("SR.detach", sr=sr)
    assert fake.imported() == ["tank"]
    assert rrdv2.read_file(srmetrics.path(SR_UUID))["sources"]
    assert call("SR.stat", sr=sr)["datasources"] == [
        "xeno+shm:///zfs-ng-" + SR_UUID]
    assert len(writers) == 2 and writers[0] == writers[1]   # started again


def test_an_attach_without_a_usable_metrics_dir_attaches(fake, writers,
                                                         monkeypatch,
                                                         tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(srmetrics, "DIR", str(blocker / "metrics"))
    sr, _ = create_sr()
    assert call("SR.stat", sr=sr)["datasources"] == []
    assert writers == []


# --- the writer itself -------------------------------------------------------

class Pool(object):
    """The three commands of a sample, answered from text."""

    def __init__(self):
        self.out = {"iostat": IOSTAT_21, "list": LIST, "get": GET}
        self.argvs = []

    def __call__(self, argv, stdin_text=None, bound=None):
        self.argvs.append((argv, bound))
        text = self.out[argv[1]]
        return runner.Result(argv, 0 if text else 1, text, "")


@pytest.fixture
def pool(monkeypatch):
    p = Pool()
    old = runner.set_runner(p)
    monkeypatch.setattr(srmetrics, "SAMPLE", 0)
    yield p
    runner.set_runner(old)


def attached(sr="tank"):
    runfiles.write_json(srmetrics._record(SR_UUID), {"sr": sr})
    rrdfile.create(srmetrics.path(SR_UUID), rrdfile.encode(
        srmetrics.sources(SR_UUID), {}, 1.0))


def test_a_period_writes_every_figure(pool):
    attached()
    assert srmetrics._period("tank", SR_UUID, srmetrics.sources(
        SR_UUID)) == srmetrics.SAMPLED
    got = rrdv2.read_file(srmetrics.path(SR_UUID))["sources"]
    assert got["zfs_write_iops"]["value"] == 340.0
    assert got["zfs_health"]["value"] == 0.0
    assert got["zfs_compressratio"]["value"] == 1.85
    assert got["zfs_sr_available"]["value"] == 1034944512.0
    assert [a[0][:3] for a, _ in [(p, 0) for p in pool.argvs]] == [
        ["zpool", "iostat", "-Hpy"], ["zpool", "list", "-Hp"],
        ["zfs", "get", "-Hp"]]
    assert 0 < runner.remaining() <= srmetrics.PERIOD * 6   # each bounded


def test_a_gone_pool_is_published_as_such_and_counted(pool):
    attached()
    pool.out = {"iostat": "", "list": "", "get": ""}
    assert srmetrics._period("tank", SR_UUID, srmetrics.sources(
        SR_UUID)) == srmetrics.NOT_FOUND
    got = rrdv2.read_file(srmetrics.path(SR_UUID))["sources"]
    assert got["zfs_health"]["value"] == 2.0
    assert math.isnan(got["zfs_read_iops"]["value"])


@pytest.mark.parametrize("get", ["", GET.replace(SR_UUID, "other")],
                         ids=["no dataset", "another sr's"])
def test_another_pools_figures_are_never_published(pool, get):
    """The SR dataset unreadable, or another SR's (a pool of the same name
    replaced the SR's): the pool's figures are not this SR's, so none is
    published (NaN); the SR cannot serve data."""
    attached()
    pool.out["get"] = get
    assert srmetrics._period("tank", SR_UUID, srmetrics.sources(
        SR_UUID)) == srmetrics.NOT_FOUND
    got = rrdv2.read_file(srmetrics.path(SR_UUID))["sources"]
    assert got.pop("zfs_health")["value"] == 2.0
    assert [k for k, v in got.items() if not math.isnan(v["value"])] == []


def test_the_writer_ends_when_the_sr_is_detached_or_its_file_gone(pool):
    attached()
    runfiles.remove(srmetrics._record(SR_UUID))
    assert srmetrics._period("tank", SR_UUID, srmetrics.sources(
        SR_UUID)) == srmetrics.END
    attached()
    os.unlink(srmetrics.path(SR_UUID))
    assert srmetrics._period("tank", SR_UUID, srmetrics.sources(
        SR_UUID)) == srmetrics.END
    assert not os.path.exists(srmetrics.path(SR_UUID))   # never made again


def test_a_detach_ends_the_writer_without_another_period(pool, monkeypatch):
    """A detach is final: the writer ends at the period that finds it,
    not a period later, and never counts it as its SR missing."""
    attached()
    slept = []
    monkeypatch.setattr(srmetrics.time, "sleep", slept.append)
    checks = iter([True])          # the loop's check; then detached
    monkeypatch.setattr(srmetrics, "_attached",
                        lambda *a: next(checks, False))
    srmetrics._write("tank", SR_UUID)
    assert (len(pool.argvs), slept) == (3, [])   # one sample, no sleep


@pytest.mark.parametrize("get", ["", GET.replace(SR_UUID, "other")])
def test_the_writer_ends_once_its_sr_is_gone_a_while(
        pool, monkeypatch, get):
    """No dataset, or another SR's (a new pool by the same name)."""
    attached()
    pool.out["get"] = get
    monkeypatch.setattr(srmetrics, "PERIOD", 0.0)
    srmetrics._write("tank", SR_UUID)              # returns: bounded
    assert len(pool.argvs) == 3 * srmetrics.GONE_LIMIT


def test_a_moment_without_the_sr_is_forgiven(pool, monkeypatch):
    attached()
    answers = iter([""] * (srmetrics.GONE_LIMIT - 1) + [GET] +
                   [""] * srmetrics.GONE_LIMIT)
    pool.out = {"iostat": IOSTAT_21, "list": LIST}
    monkeypatch.setattr(srmetrics, "PERIOD", 0.0)
    real = Pool.__call__

    def call(self, argv, stdin_text=None, bound=None):
        if argv[1] == "get":
            self.out["get"] = next(answers)
        return real(self, argv, stdin_text, bound)
    monkeypatch.setattr(Pool, "__call__", call)
    srmetrics._write("tank", SR_UUID)
    assert len(pool.argvs) == 3 * (2 * srmetrics.GONE_LIMIT)


def test_a_second_writer_leaves_at_once(monkeypatch):
    monkeypatch.setattr(os, "nice", lambda n: pytest.fail("ran"))
    fd = hold_writer_lock()
    try:
        assert srmetrics.main(["--", "tank", SR_UUID]) == 0
    finally:
        os.close(fd)
    assert srmetrics.main(["tank"]) == 2


def test_stop_ends_a_running_writer_and_its_children(tmp_path):
    """A process standing for the writer (its argv names the module and
    the SR, it holds the lock, it has a child): stop ends both."""
    os.makedirs(lock.RUN_DIR, exist_ok=True)
    attached()
    code = ("import fcntl, os, subprocess, sys, time\n"
            "fd = os.open(sys.argv[3], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "child = subprocess.Popen(['sleep', '60'])\n"
            "open(sys.argv[4], 'w').write(str(child.pid))\n"
            "time.sleep(60)\n")
    child_file = str(tmp_path / "child")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "zfsng_volume.srmetrics", SR_UUID,
         srmetrics._lock_file(SR_UUID), child_file],
        start_new_session=True)
    runfiles.write_json(srmetrics._lock_file(SR_UUID) + ".pid",
                        {"pid": proc.pid})
    deadline = time.monotonic() + 10
    while not (srmetrics._running(SR_UUID) and os.path.exists(child_file)
               and open(child_file).read()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(open(child_file).read())
    srmetrics.stop(SR_UUID)
    assert proc.wait(timeout=10) == -signal.SIGTERM
    assert not srmetrics._running(SR_UUID)
    assert not os.path.exists(srmetrics.path(SR_UUID))
    deadline = time.monotonic() + 10
    while os.path.exists("/proc/%d" % child) and \
            "Z" not in open("/proc/%d/stat" % child).read().split()[2]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_stop_never_signals_a_process_that_is_not_the_writer(tmp_path):
    attached()
    runfiles.write_json(srmetrics._lock_file(SR_UUID) + ".pid",
                        {"pid": os.getpid()})     # a stale, reused pid
    srmetrics.stop(SR_UUID)                       # no lock held: no signal
    assert not srmetrics._is_writer(os.getpid(), SR_UUID)


def test_a_zero_period_keeps_the_file_and_starts_no_writer(fake, writers,
                                                           monkeypatch):
    """The test hook the guest suites use (TESTING.md)."""
    monkeypatch.setattr(srmetrics, "PERIOD", 0.0)
    sr, _ = create_sr()
    assert rrdv2.read_file(srmetrics.path(SR_UUID))["sources"]
    assert call("SR.stat", sr=sr)["datasources"] == [
        "xeno+shm:///zfs-ng-" + SR_UUID]
    assert writers == []
