"""A call that timed out leaves no VDI xapi will find (abandoned.py).

On a slow disk, a command can run past its bound: the runner gives up on
it (CommandTimeout; one stuck in the kernel cannot even be killed, it is
left behind with its pid) and the call reports failure to xapi, but the
command still takes effect, at once or later. A Volume.create, snapshot or
clone so failed must leave nothing SR.ls or Volume.stat shows, and the
next call frees what it made, once no command on it runs. ``TimesOut``
plays such a command on the fake.
"""

import os
import subprocess
import sys

import pytest

from zfsng import abandoned, errors, meta

from conftest import GiB, call
from crashpoint import installed
from test_vdi_semantics import (  # noqa: F401 (sr is a fixture)
    datasets, listed, sr, vdi_create, vdi_snapshot)


class TimesOut(object):
    """A runner whose first command starting with prefix runs past its
    bound: the plugin gets CommandTimeout (pid: the command left behind in
    the kernel, if any), and the command takes effect all the same, at
    once (late=False: done as it was killed) or once finish() is called
    (late=True: still stuck when the call returned)."""

    def __init__(self, host, prefix, pid=None, late=False):
        self.host, self.prefix, self.pid, self.late = host, prefix, pid, late
        self.fired, self.pending = False, None

    def __call__(self, argv, stdin_text=None):
        if not self.fired and argv[:len(self.prefix)] == self.prefix:
            self.fired = True
            if self.late:
                self.pending = list(argv)
            else:
                assert self.host(argv, stdin_text).rc == 0
            raise errors.CommandTimeout(
                "%s did not finish within 6 s (left behind)"
                % " ".join(argv[:4]), pid=self.pid)
        return self.host(argv, stdin_text)

    def finish(self):
        """The stuck command ends in the kernel: its effect lands."""
        assert self.host(self.pending).rc == 0


@pytest.fixture
def stuck():
    """A live process: the pid of a command still stuck in the kernel.
    Killed (the command ended) by the test or at its end."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def _source(sr, kind):
    """The VDI the call works on: a live one, or a snapshot VDI."""
    key = vdi_create(sr, name="source")["key"]
    if kind == "clone-snapshot":
        return vdi_snapshot(sr, key)["key"]
    return key


def _failing(sr, kind, key):
    """The call of kind on key (create: a new VDI), and the command that
    makes its VDI visible."""
    if kind == "create":
        return ["zfs", "rename"], lambda: call(
            "Volume.create", sr=sr, name="new", description="", size=GiB,
            sharable=False)
    if kind == "snapshot":
        return ["zfs", "snapshot"], lambda: call(
            "Volume.snapshot", sr=sr, key=key)
    return ["zfs", "clone"], lambda: call("Volume.clone", sr=sr, key=key)


KINDS = ["create", "snapshot", "clone-live", "clone-snapshot"]


def _made(fake, sr, before):
    """The VDIs the failed call made: {uuid: dataset}."""
    made = {}
    for name in set(datasets(fake)) - set(before):
        uuid = fake.local_props(name).get(meta.VDI_UUID)
        if uuid and meta.object_uuid(name) == uuid:
            made[uuid] = name
    return made


def _time_out(fake, sr, kind, **how):
    """Run the call of kind with its visible command timing out: (the
    runner, the datasets before, the keys listed before)."""
    key = _source(sr, kind)
    prefix, action = _failing(sr, kind, key)
    before, keys = datasets(fake), set(listed(sr))
    runner_ = TimesOut(fake, prefix, **how)
    with installed(runner_):
        with pytest.raises(errors.CommandTimeout):
            action()
    return runner_, before, keys, key


def _next_call(sr, key):
    """Any later call that changes the SR (under its lock)."""
    call("Volume.set", sr=sr, key=key, k="next", v="call")


def _assert_hidden(fake, sr, before, keys):
    made = _made(fake, sr, before)
    assert made, "the command took no effect: nothing to test"
    assert set(listed(sr)) == keys
    for uuid in made:
        with pytest.raises(errors.Volume_does_not_exist):
            call("Volume.stat", sr=sr, key=uuid)
    return made


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_that_timed_out_leaves_no_vdi(fake, sr, kind):
    _, before, keys, key = _time_out(fake, sr, kind)
    _assert_hidden(fake, sr, before, keys)
    _next_call(sr, key)
    # nothing of the failed call is left: no VDI, no internal snapshot
    assert datasets(fake) == before
    assert set(listed(sr)) == keys


def test_the_next_call_reads_the_records_once(fake, sr, monkeypatch):
    """free_abandoned hands what it read to the collector, which used to
    read every record (and every command's /proc entry) again."""
    _, before, _, key = _time_out(fake, sr, KINDS[0])
    reads = []
    real = abandoned.finished
    monkeypatch.setattr(abandoned, "finished",
                        lambda s: reads.append(s) or real(s))
    _next_call(sr, key)
    assert datasets(fake) == before
    assert len(reads) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_command_still_stuck_is_waited_for_then_freed(fake, sr, kind,
                                                         stuck):
    runner_, before, keys, key = _time_out(fake, sr, kind, pid=stuck.pid,
                                           late=True)
    runner_.finish()        # ends in the kernel after the call returned
    made = _assert_hidden(fake, sr, before, keys)
    _next_call(sr, key)     # its command may still run: left as it is
    assert set(made.values()) <= set(datasets(fake))
    _assert_hidden(fake, sr, before, keys)
    stuck.kill()
    stuck.wait()            # the command has ended
    _next_call(sr, key)
    assert datasets(fake) == before
    assert set(listed(sr)) == keys


def test_a_timeout_after_the_clone_leaves_no_vdi(fake, sr):
    # the clone is made, the deferred destroy of its internal snapshot
    # runs past its bound: the call failed all the same
    key = _source(sr, "clone-live")
    before, keys = datasets(fake), set(listed(sr))
    with installed(TimesOut(fake, ["zfs", "destroy"])):
        with pytest.raises(errors.CommandTimeout):
            call("Volume.clone", sr=sr, key=key)
    _assert_hidden(fake, sr, before, keys)
    _next_call(sr, key)
    assert datasets(fake) == before


def test_a_record_outlives_the_boot_of_its_command(fake, sr, stuck,
                                                   tmp_path, monkeypatch):
    # a power cut while the command was stuck: after the reboot its pid
    # means nothing, and what it made is freed by the first call
    runner_, before, keys, key = _time_out(fake, sr, "create",
                                           pid=stuck.pid, late=True)
    runner_.finish()
    other_boot = tmp_path / "boot_id"
    other_boot.write_text("another boot\n")
    monkeypatch.setattr(abandoned, "BOOT_ID", str(other_boot))
    _assert_hidden(fake, sr, before, keys)
    _next_call(sr, key)
    assert datasets(fake) == before


def test_a_record_that_cannot_be_written_is_said(fake, sr, tmp_path,
                                                 monkeypatch):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setattr(abandoned, "DIR", str(blocked))
    key = _source(sr, "snapshot")
    with installed(TimesOut(fake, ["zfs", "snapshot"])):
        with pytest.raises(errors.CommandTimeout) as info:
            call("Volume.snapshot", sr=sr, key=key)
    assert "could not record" in info.value.message
    assert "could not record" in info.value.params()[1]


def test_a_call_that_returned_is_listed_and_a_destroy_that_returned_is_not(
        fake, sr):
    # the other half of the contract, around a failed call's record
    key = _source(sr, "snapshot")
    with installed(TimesOut(fake, ["zfs", "snapshot"])):
        with pytest.raises(errors.CommandTimeout):
            call("Volume.snapshot", sr=sr, key=key)
    made = [call("Volume.snapshot", sr=sr, key=key)["key"],
            call("Volume.clone", sr=sr, key=key)["key"],
            call("Volume.create", sr=sr, name="n", description="", size=GiB,
                 sharable=False)["key"]]
    assert set(made) <= set(listed(sr))
    for new in made:
        assert call("Volume.stat", sr=sr, key=new)["key"] == new
    for new in made:
        call("Volume.destroy", sr=sr, key=new)
    assert set(listed(sr)) == {key}
    assert not os.listdir(abandoned.DIR) or not any(
        os.listdir(os.path.join(abandoned.DIR, d))
        for d in os.listdir(abandoned.DIR))
