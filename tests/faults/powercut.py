"""Power cuts, the host's part: the same guest booted again and again, its
power cut in the middle of a burst of plugin calls each time.

    python3 tests/faults/powercut.py --zfs 2.3 --iterations N --seed S
        --out DIR [--state DIR] [--mirror] [--cpus 1] [--timeout SECONDS]

Boots the test guest (tests/guest/run.sh) N+1 times with one --state dir,
so every boot is the same host after a reboot: its root file system and
its pool disks as the cut left them. Each boot installs the plugin (make
-s guest-install, /tmp is a tmpfs) and runs tests/faults/burst.py: the
first creates the SR (one disk, or a mirror of two with --mirror) and
writes its configuration to the journal; every later one first checks the
previous burst's cut (PBD plug, scan, invariants); boots 0..N-1 then run
burst i with seed S*1000+i until the guest's power is cut; boot N only
checks. A cut boot ends with run.sh's 125 (no exit code reported).

DIR gets journal.jsonl (what xapi knew), powercut-S-<i>.json per
iteration (ledger.result() and the cut's moment: the call in flight),
boot-<i>.log (the guest's output) and powercut-S.json (the summary).
Exits non-zero if an iteration found a problem, or a boot ended in a way
it should not: a burst boot with anything but 125, a check-only boot with
anything but 0.

Replay: the same --seed from a fresh --state dir replays the same choices
(each burst's calls follow from its seed and the state it starts from);
the cut is timed, so it may land on another call: each iteration's JSON
says which call was in flight.
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


def seed_of(base, iteration):
    return base * 1000 + iteration


def boot(args, iteration, out, state):
    """One boot; (run.sh's exit code, seconds)."""
    last = iteration == args.iterations
    cmd = ["python3", "tests/faults/burst.py", "--root", "/tmp/zfsng-root",
           "--out", "/results", "--base-seed", str(args.seed),
           "--iteration", str(iteration),
           "--seed", str(seed_of(args.seed, iteration))]
    if iteration == 0:
        cmd.append("--create")
        if args.mirror:
            cmd.append("--mirror")
    if last:
        cmd.append("--check-only")
    argv = ["bash", os.path.join(TOP, "tests/guest/run.sh"),
            "--zfs", args.zfs, "--cpus", str(args.cpus),
            "--disks", "2", "--disk-size", args.disk_size,
            "--results", out, "--state", state,
            "--timeout", str(args.timeout), "--",
            "sh", "-c", "make -s guest-install && " + " ".join(cmd)]
    start = time.monotonic()
    with open(os.path.join(out, "run-%d.log" % iteration), "w") as log:
        rc = subprocess.call(argv, cwd=TOP, stdout=log,
                             stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    guest_log = os.path.join(out, "output.log")
    if os.path.exists(guest_log):
        shutil.copy(guest_log, os.path.join(out, "boot-%d.log" % iteration))
    return rc, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zfs", default="2.3")
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--state")
    parser.add_argument("--mirror", action="store_true")
    parser.add_argument("--cpus", type=int, default=1)
    parser.add_argument("--disk-size", default="1G")
    parser.add_argument("--timeout", type=int, default=1500,
                        help="bound on one boot, seconds")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    state = os.path.abspath(args.state or os.path.join(out, "state"))
    if os.path.exists(os.path.join(out, "journal.jsonl")) or \
            (os.path.isdir(state) and os.listdir(state)):
        parser.error("%s or %s holds a previous run: give fresh ones (a "
                     "replay starts from a blank host)" % (out, state))
    os.makedirs(out, exist_ok=True)
    summary = {"zfs": args.zfs, "seed": args.seed,
               "iterations": args.iterations, "mirror": args.mirror,
               "boots": [], "problems": 0, "bad_boots": []}
    for i in range(args.iterations + 1):
        last = i == args.iterations
        rc, seconds = boot(args, i, out, state)
        expected = 0 if last else CUT_RC
        entry = {"boot": i, "rc": rc, "seconds": round(seconds, 1)}
        if rc != expected:
            summary["bad_boots"].append(entry)
        judged = None
        if i > 0:
            path = os.path.join(out, "powercut-%d-%d.json" % (args.seed,
                                                               i - 1))
            if os.path.exists(path):
                with open(path) as f:
                    judged = json.load(f)
                entry["problems"] = judged["problems"]
                entry["in_flight"] = judged["cut"].get("in_flight")
                summary["problems"] += len(judged["problems"])
            else:
                entry["problems"] = ["no result for iteration %d" % (i - 1)]
                summary["problems"] += 1
        summary["boots"].append(entry)
        flight = entry.get("in_flight")
        print("[powercut %s] boot %d/%d: rc %d (%s), %.0f s%s" % (
            time.strftime("%H:%M:%S"), i, args.iterations, rc,
            "ok" if rc == expected else "UNEXPECTED, want %d" % expected,
            seconds,
            "" if i == 0 else "; iteration %d: %d problems, in flight: %s"
            % (i - 1, len(entry["problems"]),
               "%s %s" % (flight["method"], flight["key"]) if flight
               else "nothing")), flush=True)
        for text in entry.get("problems", []):
            print("    PROBLEM: %s" % text.splitlines()[0][:300], flush=True)
        if rc not in (0, 1, CUT_RC):
            print("    see %s/run-%d.log" % (out, i), flush=True)
        if rc == 124:
            break   # a guest that hung: the next boots would too
    burst_boots = [b["seconds"] for b in summary["boots"][:-1]]
    summary["seconds_per_iteration"] = round(
        sum(burst_boots) / len(burst_boots), 1) if burst_boots else None
    with open(os.path.join(out, "powercut-%d.json" % args.seed), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    print("[powercut] %d iterations on zfs %s, seed %d: %d problems, %d "
          "unexpected boots, %.0f s per iteration" % (
              args.iterations, args.zfs, args.seed, summary["problems"],
              len(summary["bad_boots"]),
              summary["seconds_per_iteration"] or 0))
    return 1 if summary["problems"] or summary["bad_boots"] else 0


if __name__ == "__main__":
    sys.exit(main())
