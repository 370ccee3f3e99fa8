"""Logging to SMlog (syslog facility LOCAL2) and stderr, never stdout.

stdout belongs to the wire protocol: any stray byte there fails the call in
xapi-storage-script, so nothing here may print to it. Messages carry the
method name and xapi's ``dbg`` string so that one SMlog line can be matched
to the xapi task that caused it. Lines are UTF-8 whatever the locale, and
text Python could not decode is escaped, not fatal: logging never fails a
call.
"""

import os
import sys

try:
    import syslog
except ImportError:  # pragma: no cover - every Linux has it
    syslog = None

_state = {"ident": "zfs-ng", "dbg": "", "opened": False,
          "debug": os.environ.get("ZFSNG_DEBUG") == "1"}


def setup(method, dbg=""):
    """Tag every later message with the method and xapi's dbg string."""
    _state["ident"] = "zfs-ng[%s]" % method
    _state["dbg"] = dbg
    if syslog is not None and not _state["opened"]:
        syslog.openlog("zfs-ng", syslog.LOG_PID, syslog.LOG_LOCAL2)
        _state["opened"] = True


def set_dbg(dbg):
    _state["dbg"] = dbg


def _emit(priority, label, fmt, args):
    text = fmt % args if args else fmt
    line = _printable("%s %s: %s%s" % (
        _state["ident"], label,
        ("[%s] " % _state["dbg"]) if _state["dbg"] else "", text))
    if _state["opened"]:
        for part in line.splitlines() or [""]:
            syslog.syslog(priority, part)
    if priority != _DEBUG or _state["debug"]:
        _to_stderr(line + "\n")


def _printable(text):
    """text with lone surrogates (bytes Python could not decode, kept as
    surrogate escapes) spelled \\udcxx: syslog encodes every message to
    UTF-8 and raises on them, and a log line must never fail a call."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _to_stderr(text):
    """UTF-8 bytes whatever the locale (Python 3.6's stderr is ASCII in the
    C locale); a closed or broken stderr loses the line, not the call."""
    try:
        out = getattr(sys.stderr, "buffer", None)
        if out is None:
            sys.stderr.write(text)
        else:
            sys.stderr.flush()
            out.write(text.encode("utf-8"))
        sys.stderr.flush()
    except (IOError, OSError, ValueError):
        pass


_DEBUG = syslog.LOG_DEBUG if syslog else 7


def debug(fmt, *args):
    _emit(_DEBUG, "debug", fmt, args)


def info(fmt, *args):
    _emit(syslog.LOG_INFO if syslog else 6, "info", fmt, args)


def warning(fmt, *args):
    _emit(syslog.LOG_WARNING if syslog else 4, "warning", fmt, args)


def error(fmt, *args):
    _emit(syslog.LOG_ERR if syslog else 3, "error", fmt, args)
