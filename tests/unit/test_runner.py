"""The real SubprocessRunner, on harmless programs (printf, false, env):
the seam every other unit test replaces, so its own behaviour is checked
here once: LC_ALL=C, exit codes, stdin, the trace and the crash point."""

import json
import os
import subprocess
import sys

from zfsng import runner


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


def test_trace_records_every_command(tmp_path, monkeypatch):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("ZFSNG_TRACE", str(trace))
    real = runner.SubprocessRunner()
    real(["true"])
    real(["false"])
    records = [json.loads(l) for l in trace.read_text().splitlines()]
    assert [(r["argv"], r["rc"]) for r in records] == [(["true"], 0),
                                                       (["false"], 1)]
    assert all(0 <= r["s"] < 60 for r in records)


def test_unwritable_trace_does_not_fail_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("ZFSNG_TRACE", str(tmp_path / "no" / "such" / "dir"))
    assert runner.SubprocessRunner()(["printf", "ok"]).out == "ok"


def test_crash_point_kills_the_process_after_the_nth_command(tmp_path):
    # In a child process: the crash is os._exit, which would end pytest.
    code = ("from zfsng import runner\n"
            "r = runner.SubprocessRunner()\n"
            "r(['true']); print('first', flush=True)\n"
            "r(['true']); print('second', flush=True)\n")
    env = dict(os.environ, ZFSNG_CRASH_AFTER="2",
               PYTHONPATH=os.path.dirname(os.path.dirname(runner.__file__)))
    proc = subprocess.run([sys.executable, "-c", code], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.returncode == 137
    assert proc.stdout.decode() == "first\n"
