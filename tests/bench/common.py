"""What every benchmark section shares: the plugin, the pool, timing.

A section is a module with ``run(ctx) -> dict``; ``main.py`` calls each in
turn on one pool and writes what they return into one JSON document. Every
figure is kept as ``summary()`` of its repeats so the report can show the
spread, not one lucky run.
"""

import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from plugin_client import Plugin  # noqa: E402


def summary(values):
    """min / median / max of repeated measurements, and the raw values."""
    values = list(values)
    return {"min": min(values), "median": statistics.median(values),
            "max": max(values), "runs": values}


def timed(fn, runs):
    """summary() of fn's wall time in seconds over runs calls."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return summary(times)


def run(argv, **kwargs):
    """Run a command (argv list), fail loudly; returns stdout as text."""
    return subprocess.run(argv, check=True, stdout=subprocess.PIPE,
                          universal_newlines=True, **kwargs).stdout


def log(fmt, *args):
    """Progress for the person watching: stderr, flushed, timestamped."""
    sys.stderr.write("[%7.1fs] %s\n" % (time.time() - START, fmt % args))
    sys.stderr.flush()


START = time.time()


class Context(object):
    """One benchmark run: the installed plugin, the SR on the bench disk,
    and how hard to try (runs per figure, quick mode for a smoke test).

    The pool is made here with plain ``zpool create`` (zfs-ng's own pool
    options: ``cachefile=none``, no mountpoint; ``ashift=12`` as on the 4K
    sector disks of today's hosts, where the guest's virtio disks would
    give 9 and understate what small blocks cost) and the SR adopts it
    (``zpool=``), so that the other sections can put their own SRs (other
    volblocksizes) and datasets (image files) beside it in the same pool.
    An SR that owns the whole pool would refuse SRs nested inside it.

    Attributes: ``plugin`` (a tests/plugin_client.Plugin), ``sr`` (the SR
    dataset, ``<pool>/zfsng-<uuid>``), ``pool`` (pool name), ``runs``,
    ``quick`` (bool), ``scratch`` (a writable directory off the pool, for
    image files), ``throttle`` (``"IOPS:BPS"``, the limits QEMU put on
    each disk, or None: main.py --throttle), ``parts`` (the disk-bound
    parts to run, None for all: main.py --parts), ``backends`` (the
    launch backends to run, None for the defaults: main.py --backends).
    """

    POOL = "bench"

    def __init__(self, root, device, runs, quick, scratch="/var/tmp/zfsng-bench"):
        # no SR statistics writer: under emulation it would take about
        # 6% of a vCPU from what is measured (TESTING.md). Blocks under
        # 16K on OpenZFS 2.1 under the rig's small ARC: what SR.create
        # refuses an admin is measured here on purpose (the volblocksize
        # sweep, the disk-bound 8K variants, the stall probes).
        self.plugin = Plugin(root, env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run",
                                        "ZFSNG_METRICS_PERIOD": "0",
                                        "ZFSNG_SMALL_BLOCKS_ANY_ARC": "1"})
        self.runs = runs
        self.quick = quick
        self.throttle = None
        self.parts = None
        self.backends = None
        self.device = device
        self.scratch = scratch
        os.makedirs(scratch, exist_ok=True)
        run(["zpool", "create", "-o", "cachefile=none", "-o", "ashift=12",
             "-m", "none", self.POOL, device])
        self.pool = self.POOL
        self.sr = self.new_sr("bench")

    def new_sr(self, name, **options):
        """SR.create + SR.attach adopting the bench pool; options are more
        device-config keys (e.g. volblocksize="4K"). Returns the SR."""
        configuration = dict(options, zpool=self.pool)
        config = self.plugin("SR.create", uuid=new_uuid(), name=name,
                             description="zfs-ng benchmark",
                             configuration=configuration)
        return self.plugin("SR.attach", configuration=config)

    def new_volume(self, size, name="bench", sr=None):
        """Volume.create through the plugin; returns the volume dict."""
        return self.plugin("Volume.create", sr=sr or self.sr, name=name,
                           description="", size=size, sharable=False)

    def zvol_device(self, volume):
        """The block device of a volume (what tapdisk would open)."""
        path = "/dev/zvol/" + volume_dataset(volume)
        deadline = time.time() + 30
        while not os.path.exists(path) and time.time() < deadline:
            run(["udevadm", "settle"])
            time.sleep(0.2)
        return path


def new_uuid():
    """A fresh uuid, made by the installed plugin's own code."""
    from zfsng import names   # the installed copy: on sys.path via Plugin
    return names.new_uuid()


def volume_dataset(volume):
    """The dataset of a volume, read from its URI by the datapath's own
    parser (the installed copy), as the datapath reads it."""
    from zfsng_datapath import uri
    return uri.parse(volume["uri"][0]).dataset
