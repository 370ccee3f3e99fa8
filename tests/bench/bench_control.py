"""Control plane: what the plugin costs on top of the zfs commands it runs.

Three figures, all through the installed executables run as
xapi-storage-script runs them (one process per call, JSON on stdin):

* every method's wall time against the summed time of the zfs/zpool
  commands it ran, read from the runner's trace (``ZFSNG_TRACE``): the
  difference is interpreter start, imports and the plugin's own work;
* interpreter start-up and import time, with the slowest imports;
* SR.ls over 10, 100 and 1,000 VDIs with 3 snapshot VDIs each, against a
  bare ``zfs list -t all`` (its default columns) of the same SR. The design
  target is 1.5x at 1,000 VDIs.

The SR.ls pools are built with the zfs commands and properties the plugin
itself uses, eight at a time: 4,000 plugin calls would take most of an hour
under TCG, and SR.ls reads the same objects either way (the VDI count is
checked against the listing).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import common

MiB = 1024 * 1024
LS_LEVELS = [10, 100, 1000]
LS_LEVELS_QUICK = [10, 50]


class Traced(object):
    """Calls one method with a fresh trace file; returns what it cost."""

    def __init__(self, plugin):
        self.plugin = plugin
        self.dir = tempfile.mkdtemp(prefix="zfsng-trace-")
        self.count = 0

    def __call__(self, method, **args):
        self.count += 1
        path = os.path.join(self.dir, "%d.jsonl" % self.count)
        self.plugin.env["ZFSNG_TRACE"] = path
        start = time.perf_counter()
        try:
            out = raw_call(self.plugin, method, **args)
        finally:
            del self.plugin.env["ZFSNG_TRACE"]
        wall = time.perf_counter() - start
        commands = _read_trace(path)
        return json.loads(out), {"wall": wall, "commands": len(commands),
                                 "commands_s": sum(c["s"] for c in commands)}


def _read_trace(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _one_round(call, sr):
    """One pass over the methods xapi uses, in a realistic order; returns
    {method: cost}. Leaves the SR as it found it."""
    costs = {}

    def timed(label, method, **args):
        result, cost = call(method, sr=sr, **args) if method != \
            "Plugin.Query" else call(method, **args)
        costs[label] = cost
        return result

    timed("Plugin.Query", "Plugin.Query")
    vol = timed("Volume.create", "Volume.create", name="bench",
                description="", size=64 * MiB, sharable=False)
    key = vol["key"]
    timed("Volume.set", "Volume.set", key=key, k="vdi-type", v="user")
    timed("Volume.set_name", "Volume.set_name", key=key, new_name="renamed")
    timed("Volume.stat", "Volume.stat", key=key)
    snap = timed("Volume.snapshot", "Volume.snapshot", key=key)
    clone_snap = timed("Volume.clone (snapshot)", "Volume.clone",
                       key=snap["key"])
    clone_live = timed("Volume.clone (live)", "Volume.clone", key=key)
    timed("Volume.resize", "Volume.resize", key=key, new_size=128 * MiB)
    timed("SR.stat", "SR.stat")
    timed("SR.ls", "SR.ls")
    timed("Volume.destroy (leaf)", "Volume.destroy", key=clone_live["key"])
    timed("Volume.destroy (parent)", "Volume.destroy", key=key)
    timed("Volume.destroy (snapshot)", "Volume.destroy", key=snap["key"])
    timed("Volume.destroy (last)", "Volume.destroy", key=clone_snap["key"])
    return costs


def methods(ctx):
    """Per-method wall time against its commands' time, over ctx.runs."""
    call = Traced(ctx.plugin)
    rounds = []
    for i in range(ctx.runs):
        common.log("control: method round %d/%d", i + 1, ctx.runs)
        rounds.append(_one_round(call, ctx.sr))
    out = []
    for label in rounds[0]:
        costs = [r[label] for r in rounds]
        walls = [c["wall"] for c in costs]
        cmds = [c["commands_s"] for c in costs]
        entry = {"method": label, "wall_s": common.summary(walls),
                 "commands_s": common.summary(cmds),
                 "commands": costs[0]["commands"],
                 "overhead_s": common.summary(
                     [w - c for w, c in zip(walls, cmds)])}
        if min(cmds) > 0:
            entry["ratio"] = common.summary(
                [w / c for w, c in zip(walls, cmds)])
        out.append(entry)
    return out


def startup(ctx):
    """Bare interpreter start against importing the plugin, and the
    imports that cost most (``-X importtime``, microseconds)."""
    env = dict(ctx.plugin.env)
    python = ["python3"]
    bare = common.timed(lambda: subprocess.check_call(python + ["-c", "pass"]),
                        ctx.runs * 3)
    imports = common.timed(lambda: subprocess.check_call(
        python + ["-c", "import zfsng_volume.main"], env=env), ctx.runs * 3)
    proc = subprocess.run(python + ["-X", "importtime", "-c",
                                    "import zfsng_volume.main"],
                          env=env, stderr=subprocess.PIPE,
                          universal_newlines=True, check=True)
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0].startswith("import time:") and \
                parts[1].strip().isdigit():
            rows.append({"module": parts[2].strip(),
                         "self_us": int(parts[0].split(":")[1]),
                         "cumulative_us": int(parts[1])})
    slowest = sorted(rows, key=lambda r: -r["self_us"])[:10]
    main = [r for r in rows if r["module"] == "zfsng_volume.main"]
    return {"python_start_s": bare, "python_import_zfsng_s": imports,
            "import_zfsng_main_us": main[0]["cumulative_us"] if main else None,
            "slowest_imports": slowest}


# --- SR.ls scaling ----------------------------------------------------------

def _props(key):
    """The user properties Volume.create/snapshot set, from the installed
    plugin's own code so the bench pool cannot drift from the real one."""
    from zfsng_volume import volume
    props = volume._vdi_props(key, "bench", "", False, {"vdi-type": "user"})
    return [a for k, v in sorted(props.items()) for a in ("-o", k + "=" + v)]


def _make_vdi(sr, volblocksize):
    key = common.new_uuid()
    vol = "%s/%s" % (sr, key)
    common.run(["zfs", "create", "-s", "-V", "16M", "-o",
                "volblocksize=%d" % volblocksize] + _props(key) + [vol])
    for _ in range(3):
        snap = common.new_uuid()
        common.run(["zfs", "snapshot"] + _props(snap) +
                   ["%s@%s" % (vol, snap)])


def _populate(sr, count, volblocksize):
    start = time.time()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: _make_vdi(sr, volblocksize), range(count)))
    return time.time() - start


def sr_ls(ctx):
    """SR.ls against bare ``zfs list -t all`` as the SR grows, on an SR of
    its own (adopted in the same pool) so nothing else is listed."""
    sr = ctx.new_sr("bench-ls")
    from zfsng import meta
    volblocksize = int(common.run(["zfs", "get", "-Hp", "-o", "value",
                                   meta.SR_VOLBLOCKSIZE, sr]).strip())
    levels = LS_LEVELS_QUICK if ctx.quick else LS_LEVELS
    have, out = 0, []
    for level in levels:
        populate_s = _populate(sr, level - have, volblocksize)
        have = level
        common.log("control: SR.ls at %d VDIs (populated in %.0fs)", level,
                   populate_s)
        listed = len(ctx.plugin("SR.ls", sr=sr))
        if listed != 4 * level:
            raise RuntimeError("SR.ls listed %d, want %d" % (listed, 4 * level))
        bare = common.timed(lambda: common.run(
            ["zfs", "list", "-t", "all", "-r", "-H", "-p", sr]), ctx.runs)
        ls = common.timed(lambda: raw_call(ctx.plugin, "SR.ls", sr=sr),
                          ctx.runs)
        out.append({"vdis": level, "objects": listed, "bare_zfs_list_s": bare,
                    "sr_ls_s": ls,
                    "ratio": ls["median"] / bare["median"]})
    return out


def raw_call(plugin, method, **args):
    """The executable's run alone, as xapi-storage-script sees it (not
    this client's JSON checks); its stdout, or raise if it failed."""
    args.setdefault("dbg", "bench")
    rc, out, err = plugin.raw(method, args)
    if rc != 0:
        raise RuntimeError("%s failed: %s %s" % (method, out, err))
    return out


def run(ctx):
    result = {"startup": startup(ctx), "methods": methods(ctx),
              "sr_ls": sr_ls(ctx)}
    result["config"] = {"runs": ctx.runs, "ls_levels": [
        r["vdis"] for r in result["sr_ls"]], "python": sys.version.split()[0]}
    return result
