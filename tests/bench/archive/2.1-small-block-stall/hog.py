"""Memory pressure for probe.sh's "module" mode: a dom0 short of memory.

The ARC keeps the module's own limits (cap RAM/2, floor RAM/32, 2.1's
arc_meta_limit 3/4 of the cap); this process takes memory until the ARC
itself sees none to grow into, so its target falls to its floor. Every
second it grows by 16 MiB while the target is over the floor by more
than 8 MiB, the ARC's own measure of the memory it may still take
(arcstats memory_available_bytes: free and inactive file pages less
arc_sys_free) is positive and MemAvailable is over 40 MiB; it gives 16 MiB
back when MemAvailable falls under 32 MiB. Its oom_score_adj is 1000: if
the kernel must kill, it kills the hog, not the workload. Writes its
size in MiB to the file given, for the trace.

Session 28's first version guarded on MemAvailable alone (grow over
64 MiB, give back under 48): the kernel took the page cache first and
the ARC's target still rose to 166-310 MiB (README).
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
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000\n")
    held = []
    while True:
        avail = available()
        if avail < 32 * MIB and held:
            held.pop().close()
        elif arc("c") > arc("c_min") + 8 * MIB and avail > 40 * MIB and \
                arc("memory_available_bytes") > 0:
            held.append(grab())
        with open(out, "w") as f:
            f.write("%d\n" % (len(held) * STEP // MIB))
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1])
