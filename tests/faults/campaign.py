"""zfs-ng's fault campaign, the in-guest part: storage that fails under a
working SR, on real OpenZFS.

    python3 tests/faults/campaign.py --root DESTDIR --out DIR
        [--scenarios NAME,...] [--seed N] [--quick]

Each scenario builds its own pool and SR on the guest's spare disks, puts
load on it through the installed plugin, injects its fault through the
kernel (device-mapper tables switched at run time, a disk pulled from its
bus), judges every call the fault touches, brings the storage back and
checks that nothing was lost. It writes DIR/<scenario>-<seed>.json (see
ledger.Ledger.result) and exits 1 if any scenario found a problem. The
seed decides every random choice, so a failure replays with the same one.

Power cuts need the guest itself to die and boot again: they are driven
from the host (tests/faults/powercut.py), not from here.
"""

import argparse
import json
import os
import random
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ledger  # noqa: E402
import storage  # noqa: E402

SCENARIOS = storage.SCENARIOS     # name -> function(ledger, rnd, quick)


def run_one(name, seed, root, quick, out):
    book = ledger.Ledger(name, seed, root)
    ledger.log("scenario %s, seed %d%s", name, seed,
               " (quick)" if quick else "")
    try:
        SCENARIOS[name](book, random.Random("%s-%d" % (name, seed)), quick)
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="run in the order given (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    names = [n for n in args.scenarios.split(",") if n]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error("unknown scenarios %s (known: %s)" % (
            unknown, ", ".join(sorted(SCENARIOS))))
    os.makedirs(args.out, exist_ok=True)
    ok = [run_one(n, args.seed, args.root, args.quick, args.out)
          for n in names]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
