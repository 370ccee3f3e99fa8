"""Every command and every lock wait has a bound (runner, lock): a stuck
command or a stuck holder gives a typed error, never an endless wait."""

import fcntl
import os
import time

import pytest

from zfsng import errors, lock, runner


@pytest.fixture(autouse=True)
def no_deadline():
    yield
    runner._deadline["at"] = None


def test_a_command_past_its_bound_is_killed_and_typed(monkeypatch):
    monkeypatch.setattr(runner, "DEFAULT_TIMEOUT", 0.5)
    start = time.monotonic()
    with pytest.raises(errors.CommandTimeout) as info:
        runner.SubprocessRunner()(["sleep", "30"])
    assert time.monotonic() - start < 10
    assert "sleep 30" in info.value.message
    assert info.value.params()[0] == "CommandTimeout"


def test_a_command_that_cannot_be_reaped_is_left_behind(monkeypatch):
    # The shell is killed, but its child keeps the output pipe open, as a
    # zfs command stuck in the kernel keeps everything: the call must
    # still come back, within the bound and the grace.
    monkeypatch.setattr(runner, "DEFAULT_TIMEOUT", 0.5)
    monkeypatch.setattr(runner, "KILL_GRACE", 0.5)
    start = time.monotonic()
    with pytest.raises(errors.CommandTimeout) as info:
        runner.SubprocessRunner()(["sh", "-c", "sleep 20; true"])
    assert time.monotonic() - start < 10
    assert "left behind" in info.value.message


def test_pool_commands_get_the_longer_bound():
    assert runner.timeout_for(["zpool", "import", "-o", "x"]) == \
        runner.POOL_TIMEOUT
    assert runner.timeout_for(["zfs", "list"]) == runner.DEFAULT_TIMEOUT
    assert runner.timeout_for(["zpool", "list"]) == runner.DEFAULT_TIMEOUT
    assert runner.DEFAULT_TIMEOUT < runner.POOL_TIMEOUT < \
        runner.CALL_DEADLINE


def test_no_command_runs_past_the_calls_deadline(monkeypatch):
    runner.start_call(0.3)
    assert 0 < runner.timeout_for(["zfs", "list"]) <= 0.3
    with pytest.raises(errors.CommandTimeout):
        runner.SubprocessRunner()(["sleep", "30"])
    with pytest.raises(errors.CommandTimeout) as info:
        runner.SubprocessRunner()(["true"])   # not even started
    assert "ran out of time" in info.value.message


def _hold_elsewhere(name):
    """Take the lock through another open file, as another process would."""
    os.makedirs(lock.RUN_DIR, exist_ok=True)
    fd = os.open(lock._path(name), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_lock_held_too_long_gives_sr_busy(monkeypatch):
    monkeypatch.setattr(lock, "WAIT", 0.5)
    fd = _hold_elsewhere("sr-tank")
    try:
        start = time.monotonic()
        with pytest.raises(errors.SrBusy):
            with lock.sr_lock("tank"):
                pytest.fail("got a lock someone else holds")
        assert 0.4 < time.monotonic() - start < 5
    finally:
        os.close(fd)
    with lock.sr_lock("tank"):   # released: at once
        pass


def test_a_lock_wait_ends_at_the_calls_deadline(monkeypatch):
    monkeypatch.setattr(lock, "WAIT", 60)
    fd = _hold_elsewhere("pools")
    try:
        runner.start_call(0.4)
        start = time.monotonic()
        with pytest.raises(errors.SrBusy):
            with lock.global_lock():
                pass
        assert time.monotonic() - start < 5
    finally:
        os.close(fd)


def test_any_string_maps_to_its_own_lock_file():
    long_a, long_b = "sr-" + "a" * 300, "sr-" + "a" * 299 + "b"
    paths = [lock._path(n) for n in
             (long_a, long_b, "tank/x", "tank%2fx", "日本", "")]
    assert len(set(paths)) == len(paths)
    assert all(len(os.path.basename(p)) < 255 for p in paths)
    with lock.held(long_a):
        pass
