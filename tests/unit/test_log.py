"""zfsng.log: SMlog and stderr, never stdout, and never a failed call.

Python 3.6 in the C locale (dom0's daemon environment) has an ASCII stderr
and decodes what it cannot as surrogate escapes, which CPython's syslog
refuses to encode: a log line with such text must still be written, and
must never raise.
"""

import io
import sys

from zfsng import log

TEXT = u"Donn\u00e9es \u2713 \u65e5\u672c"
UNDECODABLE = "Donn\udcc3\udca9es"   # b"Donn\xc3\xa9es" read as ASCII


class StrictSyslog(object):
    """The syslog module's interface; encodes like CPython's (UTF-8,
    strict: a lone surrogate raises UnicodeEncodeError)."""

    LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERR = 7, 6, 4, 3

    def __init__(self):
        self.lines = []

    def syslog(self, priority, message):
        message.encode("utf-8")
        self.lines.append((priority, message))


def _setup(monkeypatch):
    """(syslog, stderr bytes buffer) with an ASCII, strict stderr."""
    fake = StrictSyslog()
    monkeypatch.setattr(log, "syslog", fake)
    monkeypatch.setitem(log._state, "opened", True)
    monkeypatch.setitem(log._state, "ident", "zfs-ng[SR.stat]")
    monkeypatch.setitem(log._state, "dbg", "")
    stderr = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stderr", stderr)
    return fake, stderr


def test_non_ascii_is_logged_as_utf8(monkeypatch):
    fake, stderr = _setup(monkeypatch)
    log.info("renamed to %s", TEXT)
    assert fake.lines == [(6, "zfs-ng[SR.stat] info: renamed to " + TEXT)]
    stderr.flush()
    assert stderr.buffer.getvalue() == (
        "zfs-ng[SR.stat] info: renamed to %s\n" % TEXT).encode("utf-8")


def test_undecodable_text_is_escaped_not_fatal(monkeypatch):
    fake, stderr = _setup(monkeypatch)
    log.error("bad name %s", UNDECODABLE + " " + TEXT)
    line = fake.lines[0][1]
    assert line.endswith("bad name Donn\\udcc3\\udca9es " + TEXT)
    stderr.flush()
    assert stderr.buffer.getvalue().decode("utf-8") == line + "\n"


def test_the_dbg_string_may_be_anything(monkeypatch):
    fake, _ = _setup(monkeypatch)
    log.set_dbg(UNDECODABLE)
    log.warning("x")
    assert "[Donn\\udcc3\\udca9es] x" in fake.lines[0][1]


def test_a_closed_stderr_loses_the_line_not_the_call(monkeypatch):
    fake, stderr = _setup(monkeypatch)
    stderr.close()
    log.error("still %s", TEXT)
    assert len(fake.lines) == 1
