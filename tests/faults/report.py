"""The fault campaign's report, made on the host from the guests' JSON.

    python3 tests/faults/report.py DIR [DIR ...] > report.md

Each DIR holds one OpenZFS version's results, in it or in directories
below it: ``<scenario>-<seed>.json`` from campaign.py,
``powercut-<seed>-<iteration>.json`` from powercut.py, and
``zfs-version`` and ``<run>.rc`` (a run's exit status), written by the
make target. The report gives, per
version and scenario: the faults injected, the plugin calls made, the
errors returned by type, the data checked, and what was lost, with the
totals first. It exits 1 if any result records a problem or a loss, so a
make target that writes it also fails on one.
"""

import glob
import json
import os
import sys


def load(directory):
    results = []
    for path in sorted(glob.glob(os.path.join(directory, "**", "*.json"),
                                 recursive=True)):
        with open(path) as f:
            result = json.load(f)
        # a ledger's result (not campaign.py's reboot-check.json)
        if isinstance(result, dict) and "scenario" in result and \
                "calls" in result:
            results.append(result)
    return results


def version(directory):
    for path in glob.glob(os.path.join(directory, "**", "zfs-version"),
                          recursive=True):
        with open(path) as f:
            return f.read().strip()
    return os.path.basename(os.path.normpath(directory))


def faults_of(result):
    """What was injected: the scenario's faults; for a power cut (its
    ``cut``: the burst's call in flight), the cut itself."""
    cut = result.get("cut")
    if result["faults"] or not cut:
        return result["faults"]
    flight = cut.get("in_flight") or {}
    return ["power cut %.0f s into the burst, %s in flight" % (
        cut.get("delay", 0), flight.get("method", "no call"))]


def lost_count(result):
    lost = result["lost"]
    return len(lost["vdis"]) + len(lost["keys"]) + lost["bytes"]


def group(results):
    """scenario -> its results, in order."""
    by = {}
    for r in results:
        by.setdefault(r["scenario"], []).append(r)
    return by


def merge_counts(dicts):
    total = {}
    for d in dicts:
        for name, count in d.items():
            total[name] = total.get(name, 0) + count
    return total


def counts_text(counts):
    return ", ".join("%s %d" % (k, v) for k, v in sorted(counts.items())) \
        or "none"


def failed_runs(directory):
    """The runs (``<run>.rc``, written by the make target) that exited
    non-zero: a guest that died or a check that failed."""
    failed = []
    for path in sorted(glob.glob(os.path.join(directory, "*.rc"))):
        with open(path) as f:
            status = f.read().strip()
        if status != "0":
            failed.append("%s (exit %s)" % (
                os.path.basename(path)[:-3], status))
    return failed


def section(directory):
    results = load(directory)
    lines = ["## OpenZFS %s\n" % version(directory)]
    failed = failed_runs(directory)
    if failed:
        lines.append("**Runs that failed:** %s (see their logs in %s).\n"
                     % (", ".join(failed), directory))
    if not results:
        return lines + ["No results.\n"], 1 + len(failed)
    lines.append("| scenario | runs | faults injected | plugin calls | "
                 "errors returned, by type | hashes checked | lost VDIs / "
                 "keys / data | problems | slowest call s |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    bad = len(failed)
    for name, runs in sorted(group(results).items()):
        calls = sum(sum(r["calls"].values()) for r in runs)
        lost = [sum(len(r["lost"][k]) for r in runs)
                for k in ("vdis", "keys")] + \
            [sum(r["lost"]["bytes"] for r in runs)]
        problems = sum(len(r["problems"]) for r in runs)
        bad += problems + sum(lost_count(r) for r in runs)
        lines.append("| %s | %d | %d | %d | %s | %d | %d / %d / %d | %d | "
                     "%.1f |" % (
                         name, len(runs),
                         sum(len(faults_of(r)) for r in runs),
                         calls, counts_text(merge_counts(
                             r["errors"] for r in runs)),
                         sum(r["hashes_checked"] for r in runs), lost[0],
                         lost[1], lost[2],
                         problems, max(r["slowest_call"]["seconds"]
                                       for r in runs)))
    lines.append("")
    for name, runs in sorted(group(results).items()):
        lines.append("### %s\n" % name)
        for r in runs:
            label = "seed %s" % r["seed"]
            if "iteration" in r:
                label += ", iteration %s" % r["iteration"]
            lines.append("- **%s** (%.0f s): %s" % (
                label, r["seconds"], "; ".join(faults_of(r)) or "no fault"))
            for text in r["notes"]:
                if not text.startswith("cut: "):   # said by faults_of
                    lines.append("  - %s" % text.splitlines()[0][:300])
            for text in r["problems"]:
                lines.append("  - **problem:** %s" % text.splitlines()[0])
        lines.append("")
    return lines, bad


def main(directories):
    out = ["# zfs-ng fault campaign\n",
           "Real OpenZFS in a QEMU guest under software emulation (TCG): "
           "seconds are far above a real host's and count only as bounds "
           "kept or not. Every plugin call went through the installed "
           "executables, as xapi-storage-script runs them.\n"]
    bad = 0
    for directory in directories:
        lines, n = section(directory)
        out.extend(lines)
        bad += n
    out.insert(2, "**Result: %s.**\n" % (
        "no problem, nothing lost" if not bad else
        "%d problems, losses or failed runs (below)" % bad))
    sys.stdout.write("\n".join(out) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.stderr.write(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
