"""Turn a benchmark run's results.json into report.md and PNG plots.

    python3 tests/bench/report.py DIR

Runs on the host (matplotlib is a bench tool, installed by ``make bench``
into the project's venv, never needed by the plugin). Every table shows
medians with the min-max spread of the repeats; ratios are what to read.
"""

import json
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MiB = 1024.0 * 1024
GiB = MiB * 1024


def med(s):
    return s["median"]


def spread(s, fmt="%.0f"):
    return (fmt + " (" + fmt + "-" + fmt + ")") % (s["median"], s["min"],
                                                   s["max"])


def table(head, rows):
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


# --- datapath ---------------------------------------------------------------

WORKLOADS = ["randread-4k", "randwrite-4k", "seqread-4M", "seqwrite-4M"]


def _dp_rows(results):
    rows = []
    for r in sorted(results, key=lambda r: (r["snapshot"],
                                            WORKLOADS.index(r["workload"])
                                            if r["workload"] in WORKLOADS
                                            else 99, r["backend"])):
        rows.append([r["workload"], "yes" if r["snapshot"] else "no",
                     r["backend"], spread(r["iops"]),
                     spread(r["mib_s"], "%.1f"),
                     "%.2fx" % r["ratio_to_zvol"],
                     "%.2fx" % r["ratio_to_zvol_nbd"]
                     if "ratio_to_zvol_nbd" in r else "",
                     _per_byte(r, "disk_read_per_byte"),
                     _per_byte(r, "disk_written_per_byte")])
    return rows


def _per_byte(r, key):
    return "%.1f" % med(r[key]) if key in r else ""


def datapath(d, out):
    md = ["## Datapath: zvol against the files SMAPIv1 would use\n",
          "fio on the block device each stack gives a guest, same pool, same "
          "compression. Ratio = that backend's median / the zvol's median in "
          "the same snapshot state (above 1 is faster than the zvol). "
          "*vs zvol-nbd*: the VHD against a zvol behind the same qemu-nbd, "
          "the cost of the format alone. *disk read/written per byte*: "
          "bytes the pool's disk moved per byte fio moved (amplification, "
          "which TCG does not distort).\n"]
    md.append(table(["workload", "snapshot", "backend", "IOPS median (min-max)",
                     "MiB/s median (min-max)", "ratio to zvol",
                     "vs zvol-nbd", "disk read per byte",
                     "disk written per byte"],
                    _dp_rows(d["results"])))
    md += _config_and_notes(d)
    path = _plot_datapath(d["results"], out)
    md.append("\n![datapath ratios](%s)\n" % os.path.basename(path))
    return md


def _plot_datapath(results, out):
    backends = sorted(set(r["backend"] for r in results),
                      key=lambda b: (b != "zvol", b))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, snap in zip(axes, (False, True)):
        width = 0.8 / len(backends)
        for i, backend in enumerate(backends):
            vals = []
            for w in WORKLOADS:
                hit = [r for r in results if r["backend"] == backend and
                       r["workload"] == w and r["snapshot"] == snap]
                vals.append(hit[0]["ratio_to_zvol"] if hit else 0)
            ax.bar([x + i * width for x in range(len(WORKLOADS))], vals,
                   width, label=backend)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(WORKLOADS))])
        ax.set_xticklabels(WORKLOADS)
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_title("with a snapshot" if snap else "no snapshot")
    axes[0].set_ylabel("median / zvol median")
    axes[0].legend()
    fig.suptitle("Datapath throughput relative to the zfs-ng zvol")
    return _save(fig, out, "datapath.png")


# --- volblocksize -----------------------------------------------------------

def volblocksize(d, out):
    md = ["## volblocksize sweep\n",
          "A half-sparse image copied with `qemu-img convert -S` into a "
          "fresh zvol of each volblocksize, then 4k random IOPS on it.\n"]
    rows = []
    for r in sorted(d["results"], key=lambda r: r["volblocksize"]):
        rows.append(["%dK" % (r["volblocksize"] // 1024),
                     "%.1f" % (r["space_used_bytes"] / MiB),
                     "%.1f" % (r["logical_bytes"] / MiB),
                     r.get("compressratio", ""),
                     spread(r["convert_s"], "%.1f"),
                     spread(r["randread_iops"]),
                     _per_byte(r, "randread_disk_read_per_byte"),
                     spread(r["randwrite_iops"]),
                     _per_byte(r, "randwrite_disk_written_per_byte")])
    md.append(table(["volblocksize", "used MiB", "logical MiB",
                     "compressratio", "import s", "4k randread IOPS",
                     "disk read per byte", "4k randwrite IOPS",
                     "disk written per byte"], rows))
    md += _config_and_notes(d)
    path = _plot_volblocksize(d["results"], out)
    md.append("\n![volblocksize sweep](%s)\n" % os.path.basename(path))
    return md


def _plot_volblocksize(results, out):
    results = sorted(results, key=lambda r: r["volblocksize"])
    labels = ["%dK" % (r["volblocksize"] // 1024) for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.bar(labels, [r["space_used_bytes"] / MiB for r in results])
    a.set_ylabel("MiB used after the copy")
    a.set_title("space")
    x = range(len(labels))
    b.plot(x, [med(r["randread_iops"]) for r in results], "o-",
           label="4k randread")
    b.plot(x, [med(r["randwrite_iops"]) for r in results], "s-",
           label="4k randwrite")
    b.set_xticks(list(x))
    b.set_xticklabels(labels)
    b.set_ylabel("IOPS (median)")
    b.set_title("4k random IOPS")
    b.legend()
    return _save(fig, out, "volblocksize.png")


# --- control plane ----------------------------------------------------------

def control(d, out):
    s = d["startup"]
    md = ["## Control plane\n",
          "Each method run as xapi-storage-script runs it (one process per "
          "call). *commands* is the time its zfs/zpool commands took, from "
          "the runner's trace; *overhead* is the rest: interpreter start, "
          "imports, the plugin's own work.\n",
          "- Interpreter start (`python3 -c pass`): %s s" %
          spread(s["python_start_s"], "%.3f"),
          "- Start + `import zfsng.main`: %s s" %
          spread(s["python_import_zfsng_s"], "%.3f"),
          "- Slowest imports (self time, ms): %s\n" % ", ".join(
              "%s %.1f" % (m["module"], m["self_us"] / 1000.0)
              for m in s["slowest_imports"][:6])]
    rows = []
    for m in d["methods"]:
        rows.append([m["method"], m["commands"], spread(m["wall_s"], "%.3f"),
                     spread(m["commands_s"], "%.3f"),
                     "%.3f" % med(m["overhead_s"]),
                     "%.2fx" % med(m["ratio"]) if "ratio" in m else "-"])
    md.append(table(["method", "commands", "wall s", "commands s",
                     "overhead s", "wall / commands"], rows))
    md.append("\n### SR.ls against a bare `zfs list -t all`\n")
    md.append("Each VDI has 3 snapshot VDIs, so the listing holds 4 objects "
              "per VDI. Target: at most 1.5x at 1,000 VDIs.\n")
    rows = [[r["vdis"], r["objects"], spread(r["bare_zfs_list_s"], "%.2f"),
             spread(r["sr_ls_s"], "%.2f"), "%.2fx" % r["ratio"]]
            for r in d["sr_ls"]]
    md.append(table(["VDIs", "objects", "zfs list -t all s", "SR.ls s",
                     "ratio"], rows))
    path = _plot_ls(d["sr_ls"], out)
    md.append("\n![SR.ls scaling](%s)\n" % os.path.basename(path))
    return md


def _plot_ls(rows, out):
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [r["vdis"] for r in rows]
    ax.plot(x, [med(r["bare_zfs_list_s"]) for r in rows], "o-",
            label="zfs list -t all")
    ax.plot(x, [med(r["sr_ls_s"]) for r in rows], "s-", label="SR.ls")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("VDIs (each with 3 snapshot VDIs)")
    ax.set_ylabel("seconds (median)")
    ax.legend()
    ax.set_title("SR.ls against a bare zfs list")
    return _save(fig, out, "sr-ls.png")


# --- the report -------------------------------------------------------------

def _config_and_notes(d):
    md = []
    if d.get("config"):
        md.append("\nConditions: " + ", ".join(
            "%s=%s" % (k, json.dumps(v)) for k, v in sorted(
                d["config"].items())) + "\n")
    for note in d.get("notes", []):
        md.append("- " + note)
    return md


def _save(fig, out, name):
    fig.tight_layout()
    path = os.path.join(out, name)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def header(r):
    c = r["conditions"]
    return ["# zfs-ng benchmark report\n",
            "**Read the ratios, not the absolute figures.** This run is in a "
            "QEMU guest under TCG (software CPU emulation, no KVM): absolute "
            "IOPS, MiB/s and seconds are far below any real host and mean "
            "nothing on their own. Only ratios between figures of this same "
            "run count.\n",
            "- OpenZFS %s (kernel module %s), Linux %s, Python %s" % (
                c["zfs_version"], c["zfs_kmod"], c["kernel"], c["python"]),
            "- guest: %d vCPUs, %d MiB; %d runs per figure%s; %s" % (
                c["cpus"], c["mem_mib"], c["runs"],
                " (quick mode)" if c.get("quick") else "", c["date"]),
            "- every figure: median (min-max) over the runs; raw values in "
            "results.json\n"]


def main(directory):
    with open(os.path.join(directory, "results.json")) as f:
        r = json.load(f)
    md = header(r)
    for name, fn in (("datapath", datapath), ("volblocksize", volblocksize),
                     ("control", control)):
        if name in r:
            md += fn(r[name], directory)
            md.append("\nSection wall time: %.0f s\n" % r[name]["wall_s"])
    path = os.path.join(directory, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    print("report: %s" % path)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py DIR (containing results.json)")
    main(sys.argv[1])
