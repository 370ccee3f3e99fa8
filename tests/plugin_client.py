"""Call installed zfs-ng executables exactly as xapi-storage-script does.

``<plugin dir>/<Interface.method> --json`` with the JSON object of named
arguments on stdin; exit 0 and the JSON result on stdout, or non-zero and
the error object on stdout. Every answer is checked against the v5 types of
the installed package, and stdout must always be exactly one JSON value.
"""

import base64
import json
import os
import re
import subprocess
import sys
import time

VOLUME_PLUGIN = "usr/libexec/xapi-storage-script/volume/org.xen.xapi.storage.zfs-ng"
SITELIB = "usr/lib/python3.6/site-packages"


TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def install(dest, python=None):
    """``make install DESTDIR=dest TEST_HOOKS=1`` of this checkout (the
    ZFSNG_* test hooks work in it), the executables run by python if
    given; returns dest."""
    argv = ["make", "-s", "-C", TOP, "install", "DESTDIR=" + dest,
            "TEST_HOOKS=1"]
    if python:
        argv.append("PLUGIN_PYTHON=" + python)
    subprocess.check_call(argv)
    return dest


class PluginError(Exception):
    """A call that failed the way xapi would see it: code and params."""

    def __init__(self, method, obj):
        Exception.__init__(self, "%s: %s %s" % (method, obj.get("code"),
                                                obj.get("params")))
        self.code = obj["code"]
        self.params = obj["params"]
        self.obj = obj

    @property
    def name(self):
        """The typed error name (params[0] of SR_BACKEND_FAILURE)."""
        return self.params[0] if self.params else self.code


class Plugin(object):
    """One installed plugin tree under root (a DESTDIR or /)."""

    def __init__(self, root, plugin_dir=VOLUME_PLUGIN, env=None):
        self.root = root
        self.dir = os.path.join(root, plugin_dir)
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.path.join(root, SITELIB)
        self.env.update(env or {})
        sys.path.insert(0, self.env["PYTHONPATH"])
        from zfsng import wire  # the installed copy: its v5 type table
        self.wire = wire

    def raw(self, method, args, argv_extra=("--json",)):
        """Run the executable; return (rc, stdout, stderr) as text.

        The arguments go as xapi-storage-script writes them: non-ASCII as
        UTF-8 bytes, not \\u escapes. Both outputs must be UTF-8.
        With ZFSNG_CALL_LOG set, each call appends a line (the test, the
        method, its seconds) to that file: what a suite's calls cost
        (TESTING.md)."""
        start = time.time()
        proc = subprocess.run(
            [os.path.join(self.dir, method)] + list(argv_extra),
            input=json.dumps(args, ensure_ascii=False).encode("utf-8"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)
        if os.environ.get("ZFSNG_CALL_LOG"):
            with open(os.environ["ZFSNG_CALL_LOG"], "a") as log:
                log.write("%s\t%s\t%.3f\n" % (
                    os.environ.get("PYTEST_CURRENT_TEST", "-"), method,
                    time.time() - start))
        return (proc.returncode, proc.stdout.decode("utf-8"),
                proc.stderr.decode("utf-8"))

    def __call__(self, method, **args):
        """One call as xapi-storage-script makes it. An SR.attach is
        followed by SR.stat of its answer, as the daemon's sr_attach_impl
        does before it records the SR as attached: a stat that fails
        fails the attach."""
        result = self._one(method, args)
        if method == "SR.attach":
            self._one("SR.stat", {"dbg": args.get("dbg"), "sr": result})
        return result

    def _one(self, method, args):
        if args.get("dbg") is None:
            args["dbg"] = "zfs-ng-test"
        rc, out, err = self.raw(method, args)
        try:
            obj = json.loads(out)
        except ValueError:
            raise AssertionError("%s: stdout is not one JSON value: %r "
                                 "(stderr: %s)" % (method, out, err))
        if rc != 0:
            check_error_object(obj)
            raise PluginError(method, obj)
        self.wire.METHODS[method][1].check(obj, method)
        return obj


def check_error_object(obj):
    assert set(obj) == {"code", "params", "backtrace"}, obj
    assert isinstance(obj["code"], str) and obj["code"]
    assert all(isinstance(p, str) for p in obj["params"]), obj
    assert set(obj["backtrace"]) == {"error", "files", "lines"}, obj


def marked_blocks(result, nbytes=None):
    """The block numbers a Volume.list_changed_blocks answer marks, in
    order (bit 0x80 of byte 0 is block 0). Only its non-zero bytes are
    looked at: a 16 TiB disk's bitmap is 32 MiB, nearly all zeros. Given
    nbytes, the bitmap must be that long (it is decoded once)."""
    bits = base64.b64decode(result["bitmap"])
    assert nbytes is None or len(bits) == nbytes, (len(bits), nbytes)
    return [m.start() * 8 + j for m in re.finditer(b"[^\x00]", bits)
            for j in range(8) if bits[m.start()] & (0x80 >> j)]
