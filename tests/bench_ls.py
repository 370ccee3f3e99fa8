"""Benchmark (not a test): SR.ls against a bare ``zfs list -t all``.

Run in the guest by ``make bench-ls`` (``BENCH_VDIS`` VDIs, 3 snapshot VDIs
each). The VDIs are made with the same zfs commands the plugin runs, not
through it, so building a 4,000-object pool stays affordable under TCG.
Prints the median, min and max of several runs of each, and the ratio; the
design target is SR.ls <= 1.5x the bare listing. Absolute times under QEMU
TCG mean little: only the ratio counts.
"""

import json
import os
import statistics
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from plugin_client import Plugin  # noqa: E402

ROOT = os.environ.get("ZFSNG_ROOT", "/tmp/zfsng-root")
VDIS = int(os.environ.get("BENCH_VDIS", "1000"))
RUNS = int(os.environ.get("BENCH_RUNS", "7"))
P = "org.xcp-ng.zfs-ng:"


def vdi_props(key):
    return ["-o", P + "vdi=" + key, "-o", P + 'name="bench"',
            "-o", P + 'description=""', "-o", P + 'keys={"vdi-type": "user"}',
            "-o", P + "sharable=false"]


def populate(sr):
    start = time.time()
    for i in range(VDIS):
        key = str(uuid.uuid4())
        vol = "%s/%s" % (sr, key)
        subprocess.check_call(["zfs", "create", "-s", "-V", "16M",
                               "-o", "volblocksize=16384"] + vdi_props(key) +
                              [vol])
        for _ in range(3):
            snap = str(uuid.uuid4())
            subprocess.check_call(["zfs", "snapshot"] + vdi_props(snap) +
                                  ["%s@%s" % (vol, snap)])
        if (i + 1) % 100 == 0:
            print("  %d/%d VDIs (%.0fs)" % (i + 1, VDIS, time.time() - start),
                  flush=True)


def timed(fn):
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median": statistics.median(times), "min": min(times),
            "max": max(times)}


def main():
    plugin = Plugin(ROOT, env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})
    disk = "/dev/disk/by-id/virtio-zfsng-d1"
    config = plugin("SR.create", uuid=str(uuid.uuid4()), name="bench",
                    description="", configuration={"device": disk})
    sr = plugin("SR.attach", configuration=config)
    print("populating %d VDIs with 3 snapshots each..." % VDIS, flush=True)
    populate(sr)
    count = len(plugin("SR.ls", sr=sr))
    assert count == VDIS * 4, count
    # The plugin is timed as xapi-storage-script sees it: the executable's
    # run, without this client's own JSON parsing and type checks.
    bare = timed(lambda: subprocess.check_output(
        ["zfs", "list", "-t", "all", "-r", "-H", "-p", sr]))
    ls = timed(lambda: plugin.raw("SR.ls", {"dbg": "bench", "sr": sr}))
    start = timed(lambda: plugin.raw("Plugin.Query", {"dbg": "bench"}))
    result = {"vdis": VDIS, "objects": count, "runs": RUNS,
              "zfs_version": subprocess.check_output(
                  ["zfs", "version"]).decode().split()[0],
              "bare_zfs_list_s": bare, "sr_ls_s": ls,
              "plugin_query_s": start,
              "ratio_median": ls["median"] / bare["median"]}
    print(json.dumps(result, indent=2))
    print("SR.ls over %d VDIs (%d objects): median %.3fs vs bare zfs list "
          "%.3fs: ratio %.2fx (target <= 1.5x); interpreter start + query "
          "%.3fs" % (VDIS, count, ls["median"], bare["median"],
                     result["ratio_median"], start["median"]))


if __name__ == "__main__":
    main()
