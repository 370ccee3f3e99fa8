"""zfs-ng's fault campaign, the in-guest part: storage that fails under a
working SR, on real OpenZFS.

    python3 tests/faults/campaign.py --root DESTDIR --out DIR
        [--scenarios NAME,...] [--seed N] [--quick]
    python3 tests/faults/campaign.py --root DESTDIR --out DIR --after-reboot

Each scenario builds its own pool and SR on the guest's spare disks, puts
load on it through the installed plugin, injects its fault through the
kernel (device-mapper tables switched at run time, a disk pulled from its
bus), judges every call the fault touches, brings the storage back and
checks that nothing was lost. It writes DIR/<scenario>-<seed>.json (see
ledger.Ledger.result) and exits 1 if any scenario found a problem. The
seed decides every random choice, so a failure replays with the same one.

One fault needs a reboot: a multihost pool that lost its only disk, which
OpenZFS does not resume (disk-loss). The scenario then leaves what the next
boot must find (storage.AFTER_REBOOT); once every scenario has run, the
campaign writes it to DIR/reboot-check.json and cuts the guest's power (a
clean reboot would wait on the suspended pool). The host boots the guest
again on the same disks (the make target, with run.sh --state) and runs
--after-reboot, which checks the SR (storage.after_reboot) and writes
DIR/<scenario>-reboot-<seed>.json.

Power cuts in the middle of plugin calls are driven from the host
(tests/faults/powercut.py), not from here.
"""

import argparse
import json
import os
import random
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ledger  # noqa: E402
import storage  # noqa: E402

SCENARIOS = storage.SCENARIOS     # name -> function(ledger, rnd, quick)
REBOOT_CHECK = "reboot-check.json"


def run_one(name, seed, root, quick, out):
    ledger.log("scenario %s, seed %d%s", name, seed,
               " (quick)" if quick else "")
    return judge(name, seed, root, out, lambda book: SCENARIOS[name](
        book, random.Random("%s-%d" % (name, seed)), quick))


def judge(name, seed, root, out, play):
    """play(ledger) and write its result: whether it found no problem."""
    book = ledger.Ledger(name, seed, root)
    try:
        play(book)
    except Exception:   # a crash of the scenario is a finding, not the end
        book.problem("the scenario stopped: %s" % traceback.format_exc())
    result = book.result()
    with open(os.path.join(out, "%s-%d.json" % (name, seed)), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    ledger.log("scenario %s: %d calls, errors %s, %d hashes checked, "
               "%d problems, %.0f s", name, sum(result["calls"].values()),
               result["errors"], result["hashes_checked"],
               len(result["problems"]), result["seconds"])
    return not result["problems"]


def cut_power(out):
    """Leave the next boot its check, then cut the power (sysrq b, no
    sync: a sync would wait on the suspended pool's dirty zvols)."""
    with open(os.path.join(out, REBOOT_CHECK), "w") as f:
        json.dump(storage.AFTER_REBOOT, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    ledger.log("a pool is left suspended: cutting the power; the next "
               "boot checks it (--after-reboot)")
    with open("/proc/sysrq-trigger", "w") as f:
        f.write("b")
    time.sleep(120)
    return 3        # the cut did not happen


def after_reboot(root, out):
    with open(os.path.join(out, REBOOT_CHECK)) as f:
        pending = json.load(f)
    ledger.log("scenario %s, seed %d", pending["scenario"], pending["seed"])
    return judge(pending["scenario"], pending["seed"], root, out,
                 lambda book: storage.after_reboot(book, pending))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="run in the order given (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--after-reboot", action="store_true",
                        help="check what a reboot gave back (see above)")
    args = parser.parse_args()
    if args.after_reboot:
        return 0 if after_reboot(args.root, args.out) else 1
    names = [n for n in args.scenarios.split(",") if n]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error("unknown scenarios %s (known: %s)" % (
            unknown, ", ".join(sorted(SCENARIOS))))
    os.makedirs(args.out, exist_ok=True)
    ok = [run_one(n, args.seed, args.root, args.quick, args.out)
          for n in names]
    if storage.AFTER_REBOOT:
        return cut_power(args.out)
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
