"""Telling the admin about pool health: SMlog, Plugin.diagnostics and a
XenAPI message sent in the background, once per change, never waited for.

The messages go to a fake ``xe`` (conftest's ``xe``: a shell script)
started for real through ``runner.spawn_detached``, so these tests also
show that the call neither waits for xe nor shares a pipe or a session
with it.
"""

import fcntl
import os
import time

import pytest

from zfsng import errors, lock, runner
from zfsng_volume import alert

from conftest import SR_UUID, arcstats_floor, call, create_sr, \
    create_volume


@pytest.fixture(autouse=True)
def arc_floor_high_enough(fake):
    """Only the pool's health is told here: arcfloor has nothing to say
    of an ARC floor of 256 MiB (test_arcfloor)."""
    arcstats_floor(256)

HANGING_XE = """#!/bin/sh
# written whole, then renamed: the test may read it at any moment
echo $$ > %(log)s.pid.tmp
mv %(log)s.pid.tmp %(log)s.pid
exec sleep 60
"""


def stat(sr):
    return call("SR.stat", sr=sr)["health"]


def test_a_message_per_change(fake, xe):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc /dev/sdd"})
    assert stat(sr) == ["Healthy", ""]
    assert xe(0, wait=0.3) == []            # healthy from the start: silent

    fake.offline("/dev/sdc1")
    text = stat(sr)[1]
    stat(sr)
    stat(sr)
    [degraded] = xe(1)
    assert degraded["name"] == "ZFSNG_POOL_DEGRADED"
    assert degraded["priority"] == "2"
    assert degraded["sr-uuid"] == SR_UUID
    assert degraded["body"].startswith(text)
    assert "stays usable" in degraded["body"]

    fake.offline("/dev/sdd1")               # a second disk: a new problem
    stat(sr)
    assert "/dev/sdd1 OFFLINE" in xe(2)[1]["body"]

    fake.set_health("tank", "SUSPENDED")
    assert stat(sr)[0] == "Unavailable"
    unavailable = xe(3)[2]
    assert unavailable["name"] == "ZFSNG_POOL_SUSPENDED"
    assert unavailable["priority"] == "1"

    fake.set_health("tank", None)
    fake.online("/dev/sdc1")
    fake.online("/dev/sdd1")
    assert stat(sr) == ["Healthy", ""]
    stat(sr)
    messages = xe(4)
    assert len(messages) == 4
    assert messages[3]["name"] == "ZFSNG_POOL_ONLINE"
    assert messages[3]["priority"] == "5"


def test_probe_sends_nothing(fake, xe):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    fake.offline("/dev/sdc1")
    [found] = call("SR.probe", configuration={})
    assert found["sr"]["health"][0] == "Healthy"
    assert xe(0, wait=0.3) == []


def test_a_hanging_xe_never_delays_the_call(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(alert, "XE_TIMEOUT", 5)
    log = tmp_path / "xe.log"
    script = tmp_path / "xe"
    script.write_text(HANGING_XE % {"log": log})
    script.chmod(0o755)
    monkeypatch.setattr(alert, "XE", str(script))
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    fake.offline("/dev/sdc1")
    assert stat(sr)[0] == "Healthy"
    pid_file = tmp_path / "xe.log.pid"
    deadline = time.monotonic() + 5
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int(pid_file.read_text())
    # the call has returned while xe still hangs: it did not wait for it
    assert os.path.exists("/proc/%d" % pid)
    assert os.getsid(pid) != os.getsid(0)   # its own session
    # timeout(1) ends it after XE_TIMEOUT seconds
    deadline = time.monotonic() + alert.XE_TIMEOUT + 5
    while os.path.exists("/proc/%d" % pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists("/proc/%d" % pid)


def test_without_xe_the_change_is_logged(fake, tmp_path, monkeypatch,
                                         capsys):
    monkeypatch.setattr(lock, "RUN_DIR", str(tmp_path / "run"))
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    capsys.readouterr()
    fake.offline("/dev/sdc1")
    stat(sr)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1        # SMlog: once per call
    assert "reported to xapi as Healthy" in err and "/dev/sdc1" in err
    assert "XenAPI message ZFSNG_POOL_DEGRADED (priority 2) on SR %s not " \
        "sent: no %s" % (SR_UUID, alert.XE) in err
    record = tmp_path / "run" / "health-tank.json"
    assert '"DEGRADED"' in record.read_text()
    stat(sr)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "XenAPI" not in err


def test_a_record_held_by_another_call_sends_nothing(fake, xe, tmp_path):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    fake.offline("/dev/sdc1")
    os.makedirs(lock.RUN_DIR, exist_ok=True)
    with open(os.path.join(lock.RUN_DIR, "health-tank.json"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert stat(sr)[0] == "Healthy"     # no wait, no message
        assert xe(0, wait=0.3) == []
    stat(sr)
    assert len(xe(1)) == 1


def test_an_unusable_run_dir_does_not_fail_the_call(fake, tmp_path,
                                                    monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    monkeypatch.setattr(lock, "RUN_DIR", str(blocker / "run"))
    fake.offline("/dev/sdc1")
    assert stat(sr)[0] == "Healthy"
    assert "cannot record the health of SR" in capsys.readouterr().err


SUSPENDED = "cannot open 'tank': pool I/O is currently suspended"


def test_a_suspended_pool_is_unavailable_with_the_last_answer(fake, xe):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    create_volume(sr)
    before = call("SR.stat", sr=sr)
    fake.set_health("tank", "SUSPENDED")
    fake.inject("zfs list", SUSPENDED, times=-1)  # as ZFS answers then
    now = call("SR.stat", sr=sr)
    assert now["health"][0] == "Unavailable"
    assert "tank is SUSPENDED" in now["health"][1]
    del before["health"], now["health"]
    assert now == before
    [sent] = xe(1)
    assert (sent["name"], sent["priority"]) == ("ZFSNG_POOL_SUSPENDED", "1")
    assert sent["sr-uuid"] == SR_UUID
    with pytest.raises(errors.ZfsError):        # never another SR's answer
        call("SR.stat", sr="tank/zfsng-" + SR_UUID)


def test_a_suspended_pool_never_stat_before_fails_the_call(fake, tmp_path,
                                                          monkeypatch):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    monkeypatch.setattr(lock, "RUN_DIR", str(tmp_path / "empty"))
    fake.set_health("tank", "SUSPENDED")
    fake.inject("zfs list", SUSPENDED, times=-1)
    with pytest.raises(errors.ZfsError) as err:
        call("SR.stat", sr=sr)
    assert "suspended" in err.value.message


def test_a_failing_zfs_get_on_a_serving_pool_fails_the_call(fake, xe):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    call("SR.stat", sr=sr)
    fake.inject("zfs list", "cannot open 'tank': I/O error", times=-1)
    with pytest.raises(errors.ZfsError):
        call("SR.stat", sr=sr)


@pytest.mark.parametrize("state,health,name,priority", [
    ("DEGRADED", ["Healthy", "pool t is DEGRADED."], "ZFSNG_POOL_DEGRADED", 2),
    ("ONLINE", ["Healthy", "pool t is ONLINE. x"], "ZFSNG_POOL_ONLINE", 3),
    ("ONLINE", ["Healthy", ""], "ZFSNG_POOL_ONLINE", 5),
    ("FAULTED", ["Unavailable", "pool t is FAULTED."], "ZFSNG_POOL_FAULTED",
     1),
    ("UNAVAIL", ["Unavailable", "x"], "ZFSNG_POOL_UNAVAIL", 1),
])
def test_message(state, health, name, priority):
    got = alert.message("t", state, health)
    assert got[:2] == (name, priority)
    assert "zpool status -v t" in got[2] or priority == 5


# --- Plugin.diagnostics ----------------------------------------------------

def test_diagnostics_lead_with_the_pool_problem(fake):
    create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    fake.offline("/dev/sdc1")
    text = call("Plugin.diagnostics")
    first = text.split("\n== ", 1)[0]
    assert first.startswith("== pool health ==")
    assert "tank is DEGRADED" in first and "/dev/sdc1 OFFLINE" in first
    assert "SR reported to xapi as Healthy" in first


def test_diagnostics_of_healthy_pools(fake):
    create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    text = call("Plugin.diagnostics")
    assert text.startswith("== pool health ==\nno problem: every imported "
                           "pool is ONLINE")


def test_diagnostics_of_a_suspended_pool(fake):
    create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    fake.set_health("tank", "SUSPENDED")
    fake.inject("zfs", SUSPENDED, times=-1)    # no zfs command answers
    text = call("Plugin.diagnostics")
    first = text.split("\n== ", 1)[0]
    assert "pool tank is SUSPENDED" in first
    assert "reported to xapi as Unavailable" in first


# --- runner.spawn_detached -------------------------------------------------

def test_spawn_detached_shares_nothing(tmp_path):
    out = str(tmp_path / "out")
    script = tmp_path / "probe"
    script.write_text("#!/bin/sh\n"
                      "fds=$(ls -l /proc/$$/fd)\n"   # before any redirect
                      "echo \"$fds\" > %(out)s.fd\n"
                      "echo $PPID > %(out)s.ppid\n"
                      "cut -d' ' -f6 /proc/$$/stat > %(out)s.sid\n"
                      "while [ ! -e %(out)s.go ]; do sleep 0.05; done\n"
                      "touch %(out)s.done\n" % {"out": out})
    script.chmod(0o755)
    keep = open(str(tmp_path / "held"), "w")    # a descriptor of ours
    try:
        runner.spawn_detached([str(script)])
        # back while the probe still waits for us: nothing waited for it
        assert not os.path.exists(out + ".done")
        open(out + ".go", "w").close()
        deadline = time.monotonic() + 5
        while not os.path.exists(out + ".done") and \
                time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        keep.close()

    def read(suffix):
        with open(out + suffix) as f:
            return f.read()
    assert int(read(".ppid")) != os.getpid()    # not our child
    assert int(read(".sid")) != os.getsid(0)    # its own session
    fds = dict((left.split()[-1], right.strip()) for left, right in
               (line.split(" -> ", 1) for line in read(".fd").splitlines()
                if " -> " in line))
    assert fds["0"] == fds["1"] == fds["2"] == "/dev/null"
    assert str(tmp_path / "held") not in fds.values()


def test_spawn_detached_of_a_missing_program(tmp_path):
    with pytest.raises(OSError):
        runner.spawn_detached([str(tmp_path / "nothing")])


@pytest.mark.parametrize("vdev,leaf", [
    ("mirror /dev/sdb /dev/sdc", "/dev/sdc1"),
    ("mirror /dev/sdb /dev/sdc log /dev/sdd", "/dev/sdd1")])
def test_a_lost_leg_of_a_pool_zfs_calls_online_is_degraded(fake, xe, vdev,
                                                           leaf):
    # OpenZFS 2.3 faults a mirror leg that fails every I/O ("too many
    # errors") and still calls the pool ONLINE (the fault campaign's
    # mirror-loss): the redundancy is lost all the same, and the admin
    # must hear it as a DEGRADED pool, at priority 2
    sr, _ = create_sr({"vdev": vdev})
    fake.fault(leaf)
    fake.set_health("tank", "ONLINE")
    state, text = stat(sr)
    assert state == "Healthy"
    assert text.startswith("pool tank is DEGRADED (zpool says ONLINE")
    assert "%s FAULTED" % leaf in text
    [sent] = xe(1)
    assert (sent["name"], sent["priority"]) == ("ZFSNG_POOL_DEGRADED", "2")


def test_a_lost_cache_device_leaves_the_pool_online(fake, xe):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc cache /dev/sdd"})
    fake.fault("/dev/sdd1")
    state, text = stat(sr)
    assert state == "Healthy" and text.startswith("pool tank is ONLINE.")
    [sent] = xe(1)
    assert (sent["name"], sent["priority"]) == ("ZFSNG_POOL_ONLINE", "3")
