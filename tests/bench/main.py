"""zfs-ng benchmark suite, run inside the ZFS guest by ``make bench``.

    python3 tests/bench/main.py --root DESTDIR --device DISK --out DIR
        [--sections datapath,rawfile,volblocksize,control,cbt,migrate,
                    compose] [--runs N] [--quick]
    python3 tests/bench/main.py ... --sections ceilings
    python3 tests/bench/main.py ... --sections disk-bound --throttle I:B
        [--parts launch_runs,scaling,layouts,cbt_list,latency,redundant,
                 slog]
        [--backends tap-zvol,tap-vhd-file,tap-zvol-tput,...]
    python3 tests/bench/main.py ... --sections vm-fio --throttle I:B
        [--backends 16k,8k,vhd-ext4]     (in the Xen guest: run.sh --xen)
    python3 tests/bench/main.py ... --sections migrate
        [--parts by_size,halted,snapshots,plain_copy,full]

Creates one SR on DISK through the installed plugin, runs each section on
that same pool, and writes DIR/results.json: every figure with its repeats
and the conditions it was taken under. The host turns that into the report
(tests/bench/report.py). A benchmark is not a test: it asserts nothing about
speed, it prints figures; it does fail if a step it measures fails.
"""

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

SECTIONS = ["datapath", "rawfile", "volblocksize", "control", "cbt",
            "migrate", "compose"]
# Asked for by name only: the two boots of `make bench-disk-bound`, the
# first on unthrottled disks, the second on disks run.sh --throttle slowed.
# vm-fio: fio inside a Xen PV VM (make bench-vm-fio, run.sh --xen).
ON_REQUEST = ["ceilings", "disk-bound", "vm-fio"]


def conditions(args):
    """What the figures depend on, recorded beside them."""
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    return {
        "zfs_version": common.run(["zfs", "version"]).split()[0],
        "zfs_kmod": common.run(["zfs", "version"]).split()[1],
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "mem_mib": mem_kib // 1024,
        "runs": args.runs,
        "throttle": args.throttle,
        "quick": args.quick,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "virtualisation": "QEMU TCG (software emulation): absolute figures "
                          "mean nothing, only same-run ratios count",
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--runs", type=int, default=None,
                        help="repeats per figure (default 3, 1 with --quick)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default=None,
                        help="disk-bound, cbt or migrate: only these "
                             "parts (comma lists: launch_runs,scaling,"
                             "layouts,cbt_list,latency,redundant,slog, "
                             "launch_runs,latency if none is named; "
                             "list_methods,"
                             "bytes_read,after_revert,by_size; by_size,"
                             "halted,"
                             "snapshots,plain_copy,full,mirroring); "
                             "vm-fio: only "
                             "these workloads (bench_vm_fio.WORKLOADS)")
    parser.add_argument("--backends", default=None,
                        help="disk-bound and ceilings: only these launch "
                             "backends (comma list: the defaults' names, "
                             "tap-zvol-16k, tap-zvol-8k, tap-zvol-4k, "
                             "tap-zvol-tput); vm-fio: its variants "
                             "(16k,8k,16k-8g,8k-8g,vhd-file,vhd-ext4)")
    parser.add_argument("--throttle", default=None,
                        help="IOPS:BPS, the limits run.sh --throttle put on "
                             "each disk (disk-bound section)")
    args = parser.parse_args()
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS + ON_REQUEST)
    if unknown:
        parser.error("unknown sections: %s" % ", ".join(sorted(unknown)))
    os.makedirs(args.out, exist_ok=True)
    if set(sections) & set(ON_REQUEST):
        import diskrig
        diskrig.as_ssds()    # before the first pool is made on them
    ctx = common.Context(args.root, args.device, args.runs, args.quick)
    ctx.throttle = args.throttle
    ctx.parts = args.parts.split(",") if args.parts else None
    ctx.backends = args.backends.split(",") if args.backends else None
    result = {"conditions": conditions(args)}
    failed = []
    for name in sections:
        common.log("section %s: start", name)
        start = time.time()
        try:
            result[name] = importlib.import_module(
                "bench_" + name.replace("-", "_")).run(ctx)
            result[name]["wall_s"] = time.time() - start
            if result[name].get("failed_parts"):
                failed.append(name)
        except Exception:   # keep the other sections' figures
            traceback.print_exc()
            failed.append(name)
        common.log("section %s: %s in %.0fs", name,
                   "FAILED" if name in failed else "done",
                   time.time() - start)
        _write(args.out, result)
    if failed:
        common.log("failed sections: %s", ", ".join(failed))
        sys.exit(1)


def _write(out, result):
    path = os.path.join(out, "results.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    os.rename(path + ".tmp", path)


if __name__ == "__main__":
    main()
