"""The real SubprocessRunner, on harmless programs (printf, false, env):
the seam every other unit test replaces, so its own behaviour is checked
here once: LC_ALL=C, exit codes, stdin, the trace and the crash point."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from zfsng import errors, runner, testhooks


@pytest.fixture
def hooks_on(tmp_path, monkeypatch):
    """As in a test install (make install TEST_HOOKS=1)."""
    marker = tmp_path / "TEST_HOOKS"
    marker.write_text("test\n")
    monkeypatch.setattr(testhooks, "MARKER", str(marker))


@pytest.fixture
def unkillable(monkeypatch):
    """The runner's commands ignore its kill, as a process stuck in the
    kernel does: the list of those started, each really killed at the
    test's end."""
    started = []
    real_popen = subprocess.Popen

    class Unkillable(real_popen):
        def __init__(self, *args, **kwargs):
            real_popen.__init__(self, *args, **kwargs)
            started.append(self)

        def kill(self):
            pass
    monkeypatch.setattr(runner.subprocess, "Popen", Unkillable)
    yield started
    for proc in started:
        real_popen.kill(proc)
        proc.wait()


def test_output_exit_code_and_stdin():
    real = runner.SubprocessRunner()
    assert real(["printf", "%s", "a\tb"]).out == "a\tb"
    assert real(["false"]).rc == 1
    assert real(["cat"], stdin_text="héllo").out == "héllo"


def test_commands_run_in_the_c_locale(monkeypatch):
    monkeypatch.setenv("LANG", "fr_FR.UTF-8")
    monkeypatch.setenv("LC_ALL", "fr_FR.UTF-8")
    lines = runner.SubprocessRunner()(["env"]).out.splitlines()
    assert "LC_ALL=C" in lines
    assert not [l for l in lines if l.startswith("LANG=")]


def test_no_trace_file_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("ZFSNG_TRACE", raising=False)
    monkeypatch.chdir(tmp_path)
    runner.SubprocessRunner()(["true"])
    assert os.listdir(str(tmp_path)) == []


def test_hooks_do_nothing_outside_a_test_install(tmp_path, monkeypatch):
    # The daemon passes its environment on: a stray variable on a host
    # must neither trace nor crash the plugin.
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("ZFSNG_TRACE", str(trace))
    monkeypatch.setenv("ZFSNG_CRASH_AFTER", "1")
    monkeypatch.setattr(testhooks, "MARKER", str(tmp_path / "absent"))
    real = runner.SubprocessRunner()
    assert real(["printf", "ok"]).out == "ok"
    assert real(["printf", "again"]).out == "again"
    assert not trace.exists()


def test_trace_records_every_command(tmp_path, monkeypatch, hooks_on):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("ZFSNG_TRACE", str(trace))
    real = runner.SubprocessRunner()
    real(["true"])
    real(["false"])
    records = [json.loads(l) for l in trace.read_text().splitlines()]
    assert [(r["argv"], r["rc"]) for r in records] == [(["true"], 0),
                                                       (["false"], 1)]
    assert all(0 <= r["s"] < 60 for r in records)


def test_unwritable_trace_does_not_fail_the_command(tmp_path, monkeypatch,
                                                   hooks_on):
    monkeypatch.setenv("ZFSNG_TRACE", str(tmp_path / "no" / "such" / "dir"))
    assert runner.SubprocessRunner()(["printf", "ok"]).out == "ok"


def test_crash_point_kills_the_process_after_the_nth_command(tmp_path):
    # In a child process: the crash is os._exit, which would end pytest.
    code = ("from zfsng import runner\n"
            "r = runner.SubprocessRunner()\n"
            "r(['true']); print('first', flush=True)\n"
            "r(['true']); print('second', flush=True)\n")
    # A copy of the package with the test-install marker.
    package = str(tmp_path / "zfsng")
    shutil.copytree(os.path.dirname(runner.__file__), package)
    with open(os.path.join(package, "TEST_HOOKS"), "w") as f:
        f.write("test\n")
    env = dict(os.environ, ZFSNG_CRASH_AFTER="2", PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.returncode == 137
    assert proc.stdout.decode() == "first\n"


class Scripted(object):
    """A runner answering each run with the next exit status."""

    def __init__(self, statuses):
        self.statuses, self.calls = list(statuses), 0

    def __call__(self, argv, stdin_text=None):
        self.calls += 1
        return runner.Result(argv, self.statuses.pop(0), "", "busy")


@pytest.mark.parametrize("statuses,transient,runs,rc", [
    ([16, 16, 0], {16}, 3, 0),       # transient twice, then done
    ([16, 16, 16, 16], {16}, 3, 16),  # never passes: bounded
    ([16, 2, 0], {16}, 2, 2),        # any other failure ends it
    ([0, 16], {16}, 1, 0),
])
def test_run_retried_retries_only_transient_failures_and_is_bounded(
        monkeypatch, statuses, transient, runs, rc):
    slept = []
    monkeypatch.setattr(runner.time, "sleep", slept.append)
    fake = Scripted(statuses)
    old = runner.set_runner(fake)
    try:
        result = runner.run_retried(["zfs", "destroy"],
                                    lambda r: r.rc in transient, 3, 0.5,
                                    backoff=2)
    finally:
        runner.set_runner(old)
    assert (fake.calls, result.rc) == (runs, rc)
    assert slept == [0.5, 1.0][:runs - 1]


# --- stream: output read as it comes (zfs send) ------------------------------

def _drain(read):
    data = b""
    while True:
        chunk = read(7)
        if not chunk:
            return data
        data += chunk


def test_stream_hands_stdout_to_consume_and_drains_stderr():
    real = runner.SubprocessRunner()
    # more stderr than a pipe holds: a runner that did not drain it would
    # hang here, the command blocked on its stderr
    result, value = real.stream(
        ["sh", "-c", "head -c 200000 /dev/zero >&2; printf abcdefghij"],
        _drain)
    assert (result.rc, value, result.out) == (0, b"abcdefghij", "")
    assert len(result.err) == 200000


def test_stream_gives_the_commands_error_when_its_output_is_cut_short():
    def parse(read):
        if len(_drain(read)) < 5:
            raise errors.InternalError("stream ended inside a record")
    result, value = runner.SubprocessRunner().stream(
        ["sh", "-c", "printf ab; echo 'cannot send' >&2; exit 1"], parse)
    assert (result.rc, value, result.err.strip()) == (1, None, "cannot send")


def test_stream_passes_a_parse_error_of_a_command_that_succeeded():
    def parse(read):
        _drain(read)
        raise errors.InternalError("not a zfs send stream")
    with pytest.raises(errors.InternalError):
        runner.SubprocessRunner().stream(["printf", "xyz"], parse)


def test_stream_kills_a_command_past_its_bound(monkeypatch):
    monkeypatch.setattr(runner, "timeout_for", lambda argv: 0.5)
    with pytest.raises(errors.CommandTimeout):
        runner.SubprocessRunner().stream(["sleep", "30"], _drain)


def _bounded(call, ceiling=60):
    """call()'s exception, raised in a thread joined for at most ceiling
    seconds: a runner that hangs fails the test instead of the suite."""
    outcome = []

    def target():
        try:
            call()
            outcome.append(None)
        except BaseException as exc:   # noqa: B902 -- handed to the test
            outcome.append(exc)
    thread = threading.Thread(target=target)
    thread.daemon = True
    thread.start()
    thread.join(ceiling)
    assert not thread.is_alive(), "the call did not return"
    return outcome[0]


def test_stream_gives_up_on_an_output_another_process_holds_open(
        tmp_path, monkeypatch, hooks_on):
    # The command's child keeps its stdout open after the command is
    # killed, as a zfs send stuck in the kernel does: the reader must not
    # wait for the end of that output.
    monkeypatch.setenv("ZFSNG_CMD_TIMEOUT", "0.5")
    monkeypatch.setattr(runner, "KILL_GRACE", 0.5)
    pidfile = tmp_path / "child.pid"
    argv = ["sh", "-c", "sleep 1000 & echo $! > %s; exec sleep 1000"
            % pidfile]
    try:
        failure = _bounded(
            lambda: runner.SubprocessRunner().stream(argv, _drain))
    finally:
        _kill_pid_in(pidfile)
    assert isinstance(failure, errors.CommandTimeout)
    assert "killed" in str(failure)


def test_stream_leaves_behind_a_command_that_survives_the_kill(
        monkeypatch, hooks_on, unkillable):
    # A process stuck in the kernel ignores SIGKILL until its I/O ends:
    # here a kill that does nothing. The call returns all the same.
    monkeypatch.setenv("ZFSNG_CMD_TIMEOUT", "0.5")
    monkeypatch.setattr(runner, "KILL_GRACE", 0.5)
    failure = _bounded(lambda: runner.SubprocessRunner().stream(
        ["sleep", "1000"], _drain))
    assert isinstance(failure, errors.CommandTimeout)
    assert "left behind" in str(failure)
    assert failure.pid == unkillable[0].pid


def test_a_test_install_may_wait_less_for_a_command_stuck_in_the_kernel(
        monkeypatch, hooks_on, unkillable):
    # test_bounds.py hangs a disk: every command it kills is stuck and
    # waited for KILL_GRACE; ZFSNG_KILL_GRACE shortens that wait, never
    # lengthens it.
    monkeypatch.setenv("ZFSNG_CMD_TIMEOUT", "0.2")
    monkeypatch.setenv("ZFSNG_KILL_GRACE", "0.3")
    assert runner.kill_grace() == 0.3
    began = time.monotonic()
    failure = _bounded(lambda: runner.SubprocessRunner()(
        ["sleep", "1000"]))
    assert isinstance(failure, errors.CommandTimeout)
    assert "left behind" in str(failure)
    assert time.monotonic() - began < runner.KILL_GRACE
    monkeypatch.setenv("ZFSNG_KILL_GRACE", "50")
    assert runner.kill_grace() == runner.KILL_GRACE


def test_the_kill_grace_hook_does_nothing_outside_a_test_install(
        tmp_path, monkeypatch):
    monkeypatch.setattr(testhooks, "MARKER", str(tmp_path / "absent"))
    monkeypatch.setenv("ZFSNG_KILL_GRACE", "0.3")
    assert runner.kill_grace() == runner.KILL_GRACE


def _kill_pid_in(pidfile):
    try:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
    except (OSError, ValueError):
        pass


# --- non-ASCII arguments on dom0's interpreter: CPython 3.6, C locale --------

C_LOCALE_SCRIPT = u"""
import sys
assert sys.getfilesystemencoding() == "ascii"   # what Popen would use
from zfsng import runner
real = runner.SubprocessRunner()
value = u"Donn\\u00e9es \\u2713"
result = real(["printf", "%s", value])
assert (result.rc, result.out) == (0, value), (result.rc, result.out)
result, out = real.stream(["printf", "%s", value], lambda read: read(100))
assert (result.rc, out) == (0, value.encode("utf-8")), (result.rc, out)
print("ok")
"""


def test_non_ascii_arguments_pass_under_python36_in_the_c_locale():
    # A VDI name an admin set by hand (zfs set ...:name=Données) is copied
    # into zfs clone -o / zfs create -o: under 3.6 in the C locale Popen
    # would encode it as ASCII.
    top = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    prefix = subprocess.check_output(
        ["bash", os.path.join(top, "tests", "guest", "python36.sh")])
    python36 = os.path.join(prefix.decode().strip(), "bin", "python3.6")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LC_", "LANG", "PYTHON"))}
    env.update(LC_ALL="C", PYTHONPATH=os.path.dirname(
        os.path.dirname(runner.__file__)))
    proc = subprocess.run(
        [python36, "-c", C_LOCALE_SCRIPT],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr[-300:]) == \
        (0, b"ok\n", b"")
