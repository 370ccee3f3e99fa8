"""What a fault scenario did and found, kept as it goes.

Every plugin call of the campaign goes through ``Ledger.call``: it runs
the installed executable exactly as xapi-storage-script does (JSON on
stdin, one JSON value on stdout), with an outer bound of its own, so that
a call that hangs is a finding instead of a hung campaign. The ledger
counts calls per method and errors per type, keeps the slowest call, and
collects the scenario's checks: hashes compared, and anything lost (VDIs,
keys, data). A failed expectation is recorded as a problem and the
scenario goes on, so one report shows everything a fault broke.
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

from plugin_client import VOLUME_PLUGIN, check_error_object  # noqa: E402

# Datapath.* methods are the datapath plugin's executables (the power-cut
# burst attaches, activates and resets VDIs through the ledger too).
DATAPATH_PLUGIN = "usr/libexec/xapi-storage-script/datapath/zfs-ng"

# Seconds. The plugin's own deadline for a whole call is 600 s
# (runner.CALL_DEADLINE); a call still running past OUTER_BOUND has
# escaped every bound the plugin sets, which is a finding in itself.
OUTER_BOUND = 900.0


class CallError(Exception):
    """A call that failed as xapi sees it: its typed error name."""

    def __init__(self, method, obj):
        Exception.__init__(self, "%s: %s" % (method, obj["params"]))
        self.obj = obj
        self.name = obj["params"][0] if obj["params"] else obj["code"]


class Ledger(object):
    """One scenario's record. ``plugin_env`` is added to the environment
    of every call (test hooks such as ZFSNG_CMD_TIMEOUT)."""

    def __init__(self, scenario, seed, root, plugin_env=None):
        self.scenario, self.seed, self.root = scenario, seed, root
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.path.join(
            root, "usr/lib/python3.6/site-packages")
        self.env.update(plugin_env or {})
        self.faults = []
        self.calls = {}
        self.errors = {}
        self.slowest = (0.0, "")
        self.hashes_checked = 0
        self.lost = {"vdis": [], "keys": [], "bytes": 0}
        self.problems = []
        self.notes = []
        self.started = time.monotonic()

    # --- plugin calls ---------------------------------------------------

    def call(self, method, bound=OUTER_BOUND, **args):
        """The result of method(args), or raise CallError (counted by its
        type). A call past bound, or one whose stdout is not exactly one
        JSON value, is recorded as a problem and raises AssertionError.
        An SR.attach is followed by SR.stat of its answer, as xapi's
        daemon does before it records the SR as attached."""
        result = self._one(method, bound, args)
        if method == "SR.attach":
            self._one("SR.stat", bound, {"dbg": args.get("dbg"),
                                         "sr": result})
        return result

    def _one(self, method, bound, args):
        if args.get("dbg") is None:
            args["dbg"] = "fault-%s-%d" % (self.scenario, self.seed)
        self.calls[method] = self.calls.get(method, 0) + 1
        start = time.monotonic()
        plugin = DATAPATH_PLUGIN if method.startswith("Datapath.") \
            else VOLUME_PLUGIN
        try:
            proc = subprocess.run(
                [os.path.join(self.root, plugin, method), "--json"],
                input=json.dumps(args).encode("utf-8"),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=self.env, timeout=bound)
        except subprocess.TimeoutExpired:
            self.problem("%s did not return within %.0f s" % (method, bound))
            raise AssertionError("%s hung" % method)
        seconds = time.monotonic() - start
        if seconds > self.slowest[0]:
            self.slowest = (seconds, method)
        try:
            obj = json.loads(proc.stdout.decode("utf-8"))
        except ValueError:
            self.problem("%s: stdout is not one JSON value: %r" % (
                method, proc.stdout[:300]))
            raise AssertionError("%s: bad stdout" % method)
        if proc.returncode == 0:
            return obj
        check_error_object(obj)
        error = CallError(method, obj)
        self.errors[error.name] = self.errors.get(error.name, 0) + 1
        raise error

    def attempt(self, method, **args):
        """(result, None) or (None, error name): for calls a fault may
        make fail, which the scenario then judges."""
        try:
            return self.call(method, **args), None
        except CallError as exc:
            return None, exc.name

    # --- what the scenario found -----------------------------------------

    def fault(self, text):
        self.faults.append(text)
        log("%s: fault: %s", self.scenario, text)

    def note(self, text):
        self.notes.append(text)
        log("%s: %s", self.scenario, text)

    def problem(self, text):
        self.problems.append(text)
        log("%s: PROBLEM: %s", self.scenario, text)

    def expect(self, condition, text):
        """Record text as a problem unless condition holds."""
        if not condition:
            self.problem(text)
        return condition

    def hashes(self, expected, actual, what):
        """Compare {name: sha256} maps; a missing or different one is
        lost data (counted in lost["bytes"])."""
        for name, digest in sorted(expected.items()):
            self.hashes_checked += 1
            if actual.get(name) != digest:
                self.problem("%s: %s's data differs or is gone" % (what,
                                                                    name))
                self.lost["bytes"] += 1

    def lost_vdi(self, key):
        self.lost["vdis"].append(key)
        self.problem("VDI %s is lost" % key)

    def lost_key(self, vdi, key):
        self.lost["keys"].append("%s:%s" % (vdi, key))
        self.problem("VDI %s lost its key %s" % (vdi, key))

    def result(self):
        return {
            "scenario": self.scenario, "seed": self.seed,
            "faults": self.faults, "calls": self.calls,
            "errors": self.errors,
            "slowest_call": {"seconds": round(self.slowest[0], 1),
                             "method": self.slowest[1]},
            "hashes_checked": self.hashes_checked, "lost": self.lost,
            "problems": self.problems, "notes": self.notes,
            "seconds": round(time.monotonic() - self.started, 1),
        }


def log(fmt, *args):
    sys.stderr.write("[faults %s] %s\n" % (time.strftime("%H:%M:%S"),
                                           fmt % args))
    sys.stderr.flush()
