"""Memory pressure for probe.sh's "module" mode: a dom0 short of memory.

The ARC keeps the module's own limits (cap RAM/2, floor RAM/32, 2.1's
arc_meta_limit 3/4 of the cap); this process takes any memory the ARC
gives back, so the kernel's reclaim keeps the ARC's target at its floor:
it grows by 16 MiB while the target is over the floor by more than 8 MiB
and MemAvailable is over 64 MiB, and gives 16 MiB back when MemAvailable
falls under 48 MiB (the OOM killer must not pick the workload). Every
second; writes its size in MiB to the file given, for the trace. The
first tries showed that guard too loose: the ARC's target still rose to
166-310 MiB (README).
"""

import mmap
import sys
import time

MIB = 1 << 20
STEP = 16 * MIB


def arc(key):
    with open("/proc/spl/kstat/zfs/arcstats") as f:
        for line in f:
            fields = line.split()
            if len(fields) == 3 and fields[0] == key:
                return int(fields[2])
    return 0


def available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def grab():
    m = mmap.mmap(-1, STEP)
    for i in range(0, STEP, 4096):
        m[i] = 1     # touched: resident, and no swap to put it in
    return m


def main(out):
    held = []
    while True:
        avail = available()
        if avail < 48 * MIB and held:
            held.pop().close()
        elif arc("c") > arc("c_min") + 8 * MIB and avail > 64 * MIB:
            held.append(grab())
        with open(out, "w") as f:
            f.write("%d\n" % (len(held) * STEP // MIB))
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1])
