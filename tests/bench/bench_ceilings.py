"""Ceilings: what each backend does when nothing but the emulated CPU
bounds it, and the disk limits the ``disk-bound`` section is run under.

Run on unthrottled RAM-backed disks (``make bench-disk-bound``'s first
boot), with the disk-bound rig's caches and workloads (diskrig), one run
each, no snapshot. The limits (``throttle``): a quarter of the least any
run asked of the disk at its ceiling, in requests or in bytes, bytes in
the rated SSD's proportion to requests (diskrig.throttle_from); the host
passes them to the second boot as ``run.sh --throttle IOPS:BPS``.
"""

import common
import diskrig
from bench_disk_bound import Launch, plan


def run(ctx):
    plan_ = plan(ctx)
    tuning = diskrig.tune()
    launch = Launch(ctx, plan_["size_bytes"])
    ceilings, runs = {}, []
    try:
        launch.setup()
        diskrig.fill(list(launch.targets.values()), plan_["size_bytes"])
        for workload in diskrig.WORKLOADS:
            for name in launch.names:
                m = diskrig.measure([launch.targets[name]],
                                    plan_["size_bytes"], workload,
                                    plan_["ceiling_runtime_s"],
                                    seq_bytes=plan_["ceiling_seq_bytes"])
                ceilings.setdefault(name, {})[workload[0]] = dict(
                    (k, m[k]) for k in ("iops", "mib_s", "cpu_busy",
                                        "disk_iops", "disk_bps"))
                runs.append(dict(m, backend=name, workload=workload[0]))
            common.log("ceilings: %s done", workload[0])
    finally:
        launch.close()
    return {"ceilings": ceilings, "runs": runs, "tuning": tuning,
            "size_mib": plan_["size_bytes"] // diskrig.MIB,
            "runtime_s": plan_["ceiling_runtime_s"],
            "seq_mib": plan_["ceiling_seq_bytes"] // diskrig.MIB,
            "ssd": diskrig.SSD, "throttle": diskrig.throttle_from(runs)}
