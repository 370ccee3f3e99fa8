"""The guest's flush through a power cut of the whole machine, the host's
part: a real Xen PV VM fsyncs writes to its zfs-ng disk, QEMU is killed,
the same disks boot again (make test-xen-powercut).

    python3 tests/xen/powercut.py --zfs 2.1|2.3 --out DIR [--timeout S]

Boots the test guest as a Xen host twice on one --state dir (its pool
disks and root file system), as tests/xen/powercut_guest.py's docstring
says: boot 1 runs ``phase1`` with run.sh's --cut-on, which kills QEMU with
SIGKILL once dom0 asks (run.sh's 125); boot 2 runs ``phase2``, which
attaches the SR and checks what the domU's writes left. DIR keeps the
results: powercut/phase1.json (what the domU acknowledged), powercut/
phase2.json (what was found), boot-1.log and boot-2.log (the guests'
output), summary.json (rcs and seconds). The state dir (DIR/state: six
sparse 1 GiB disks and the root overlay) is removed at the end, whatever
happened. DIR must be new or empty. Exits non-zero unless boot 1 was cut and boot 2 passed.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
CUT_RC = 125
CUT_FILE = "power-cut-now"
GUEST_CMD = ("make -s guest-install && PYTHONDONTWRITEBYTECODE=1 "
             "ZFSNG_ROOT=/tmp/zfsng-root python3 -m pytest -p no:cacheprovider "
             "-v -s tests/xen/powercut_guest.py -k ")


def boot(args, phase, out, state, cut):
    """One boot of the guest as a Xen host: (run.sh's exit code, s)."""
    argv = ["bash", os.path.join(TOP, "tests/guest/run.sh"), "--xen",
            "--zfs", args.zfs, "--results", out, "--state", state,
            "--timeout", str(args.timeout)]
    if cut:
        argv += ["--cut-on", CUT_FILE]
    argv += ["--", "sh", "-c", GUEST_CMD + phase]
    start = time.monotonic()
    rc = subprocess.call(argv, cwd=TOP)
    seconds = time.monotonic() - start
    log = os.path.join(out, "output.log")
    if os.path.exists(log):
        shutil.copy(log, os.path.join(out, "boot-%s.log" % phase[-1]))
    return rc, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zfs", default="2.3")
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=int, default=1800,
                        help="bound on one boot, seconds")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    state = os.path.join(out, "state")
    if os.path.isdir(out) and os.listdir(out):
        parser.error("%s is not empty: give a fresh dir" % out)
    os.makedirs(state)
    summary = {"zfs": args.zfs}
    try:
        rc1, s1 = boot(args, "phase1", out, state, cut=True)
        summary["boot1"] = {"rc": rc1, "seconds": round(s1, 1)}
        ok = rc1 == CUT_RC and os.path.exists(
            os.path.join(out, "powercut", "phase1.json"))
        if ok:
            rc2, s2 = boot(args, "phase2", out, state, cut=False)
            summary["boot2"] = {"rc": rc2, "seconds": round(s2, 1)}
            ok = rc2 == 0
    finally:
        shutil.rmtree(state, ignore_errors=True)
    found = os.path.join(out, "powercut", "phase2.json")
    if os.path.exists(found):
        with open(found) as f:
            summary["found"] = json.load(f)
    summary["passed"] = ok
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    print("[xen-powercut] zfs %s: %s; boot 1 (writes, cut) rc %s, %s s; "
          "boot 2 (attach, check) %s" % (
              args.zfs, "PASSED" if ok else "FAILED", rc1, round(s1),
              "rc %s, %s s" % (summary["boot2"]["rc"],
                               summary["boot2"]["seconds"])
              if "boot2" in summary else "not run (boot 1 was not cut "
              "after writing powercut/phase1.json)"), flush=True)
    if "found" in summary:
        print("[xen-powercut] found after the cut: %s" % json.dumps(
            summary["found"], sort_keys=True), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
