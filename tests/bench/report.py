"""Turn a benchmark run's results.json into report.md and PNG plots.

    python3 tests/bench/report.py DIR
    python3 tests/bench/report.py --compare OUT.md DIR...   (runs side by side)
    python3 tests/bench/report.py --throttle DIR   (limits from ceilings)
    python3 tests/bench/report.py --merge OUT DIR...   (disk-bound parts
                                                         run separately)

Runs on the host (matplotlib is a bench tool, installed by ``make bench``
into the project's venv, never needed by the plugin). Every table shows
medians with the min-max spread of the repeats; ratios are what to read.
"""

import json
import os
import sys

MiB = 1024.0 * 1024
GiB = MiB * 1024


def _pyplot():
    """matplotlib's pyplot without a display, imported only to plot: the
    merge and the limits need none of it (nor does a venv without it)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


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
BACKENDS = ["tap-zvol", "zvol", "tap-vhd-file", "tap-raw-file"]
RATIO_TEXT = {
    "zvol_vs_vhd": "tap-zvol / tap-vhd-file (zfs-ng against SMAPIv1)",
    "hop": "zvol / tap-zvol (slowdown by the tapdisk hop)",
    "raw_vs_vhd": "tap-raw-file / tap-vhd-file (the VHD format)",
    "zvol_vs_raw": "tap-zvol / tap-raw-file (zvol against file, raw)",
}


def ratio_s(s):
    return "%.2fx (%.2f-%.2f)" % (s["median"], s["min"], s["max"])


def _ratio(d, name, workload, snapshot):
    for r in d.get("ratios", []):
        if (r["ratio"], r["workload"], r["snapshot"]) == (name, workload,
                                                         snapshot):
            return r["value"]
    return None


def _wl_order(w):
    return WORKLOADS.index(w) if w in WORKLOADS else 99


def launch_table(d):
    """tap-zvol / tap-vhd-file beside the launch benchmark and targets."""
    rows = []
    for w in WORKLOADS:
        plain = _ratio(d, "zvol_vs_vhd", w, False)
        snap = _ratio(d, "zvol_vs_vhd", w, True)
        target = d["targets"][w]
        met = [x["median"] >= target for x in (plain, snap) if x]
        rows.append([w, d["launch"][w], ">= %gx" % target,
                     ratio_s(plain) if plain else "-",
                     ratio_s(snap) if snap else "-",
                     "yes" if met and all(met) else
                     ("no" if not any(met) else "without snapshot only"
                      if met[0] else "with snapshot only")])
    return table(["workload", "Vates' launch benchmark", "target",
                  "measured, no snapshot", "measured, with snapshot",
                  "target met"], rows)


def hop_table(d):
    rows = []
    for w in WORKLOADS:
        cells = [_ratio(d, "hop", w, snap) for snap in (False, True)]
        rows.append([w] + [ratio_s(c) if c else "-" for c in cells] +
                     ["yes" if all(c and c["median"] <= d["hop_target"]
                                   for c in cells) else "no"])
    return table(["workload", "zvol / tap-zvol, no snapshot",
                  "with snapshot", "<= %gx" % d["hop_target"]], rows)


def other_ratios_table(d):
    rows = []
    for name in ("raw_vs_vhd", "zvol_vs_raw"):
        for w in WORKLOADS:
            rows.append([RATIO_TEXT[name], w] + [
                ratio_s(c) if c else "-" for c in
                (_ratio(d, name, w, s) for s in (False, True))])
    return table(["ratio", "workload", "no snapshot", "with snapshot"], rows)


def penalty_table(d):
    by = dict(((p["backend"], p["workload"]), p["with_over_without"])
              for p in d.get("snapshot_penalty", []))
    rows = [[b] + ["%.2fx" % by[(b, w)] if by.get((b, w)) else "-"
                   for w in WORKLOADS] for b in BACKENDS]
    return table(["backend"] + WORKLOADS, rows)


def _dp_rows(results):
    rows = []
    for r in sorted(results, key=lambda r: (r["snapshot"],
                                            _wl_order(r["workload"]),
                                            BACKENDS.index(r["backend"])
                                            if r["backend"] in BACKENDS
                                            else 99)):
        rows.append([r["workload"], "yes" if r["snapshot"] else "no",
                     r["backend"], spread(r["iops"]),
                     spread(r["mib_s"], "%.1f"),
                     _per_byte(r, "disk_read_per_byte"),
                     _per_byte(r, "disk_written_per_byte"),
                     "%.0f" % med(r["zil_commits"]) if "zil_commits" in r
                     else "",
                     "%d/%d" % (r["arc"]["arc_hits"], r["arc"]["arc_misses"])
                     if "arc" in r else ""] + _cpu(r))
    return rows


def _cpu(r):
    """Guest CPU busy share and CPU microseconds per I/O (medians)."""
    if "cpu_busy" not in r:
        return ["", ""]
    return ["%.0f%%" % (100 * med(r["cpu_busy"])),
            "%.0f" % med(r["cpu_us_per_io"])]


def _per_byte(r, key):
    return "%.1f" % med(r[key]) if key in r else ""


def datapath(d, out):
    if "ratios" not in d:
        return ["## Datapath\n", "(an older results.json: no tapdisk "
                "figures; rendered by an older report.py)\n"]
    md = ["## Datapath through tapdisk: zfs-ng's zvol against SMAPIv1's "
          "VHD file\n",
          "fio (libaio, O_DIRECT) on the tapdev XCP-ng's real tapdisk "
          "serves, every backend on the same pool with the same "
          "compression. *tap-zvol*: a zfs-ng VDI attached through the "
          "installed datapath plugin (tapdisk `aio:` on the zvol); "
          "*zvol*: fio on that same zvol, no tapdisk; *tap-vhd-file*: "
          "tapdisk `vhd:` on a dynamic VHD in a dataset (SMAPIv1's ZFS "
          "SR); *tap-raw-file*: tapdisk `aio:` on a raw file in a dataset "
          "(control). Every ratio is computed per run (interleaved runs "
          "paired) and given as median (min-max); above 1 the first "
          "backend is faster.\n",
          "### zfs-ng (tapdisk raw on a zvol) against SMAPIv1 (tapdisk VHD "
          "on a file)\n",
          "With a snapshot: the zvol under a ZFS snapshot, the VHD as a "
          "VHD snapshot chain (what SMAPIv1's VDI.snapshot makes).\n",
          launch_table(d),
          "### The tapdisk hop\n",
          "fio on the zvol itself over fio on the tapdev tapdisk makes of "
          "it: how many times slower the guest's path is.\n",
          hop_table(d),
          "### The other ratios\n",
          other_ratios_table(d),
          "### What a snapshot costs\n",
          "Median IOPS with a snapshot over median without, per backend.\n",
          penalty_table(d),
          "### Every figure\n",
          "*disk read/written per byte*: bytes the pool's disk moved per "
          "byte fio moved (amplification, which TCG does not distort). "
          "*ZIL commits*: median per run. *ARC hits/misses*: demand data, "
          "all runs. *guest CPU busy*: share of the guest's CPU time "
          "not idle during fio; *CPU us per I/O*: busy CPU time per I/O "
          "(emulated: only comparable within the run).\n",
          table(["workload", "snapshot", "backend", "IOPS median (min-max)",
                 "MiB/s median (min-max)", "disk read per byte",
                 "disk written per byte", "ZIL commits", "ARC hits/misses",
                 "guest CPU busy", "CPU us per I/O"],
                _dp_rows(d["results"]))]
    md += _config_and_notes(d)
    path = _plot_datapath(d, out)
    md.append("\n![datapath ratios](%s)\n" % os.path.basename(path))
    return md


def _plot_datapath(d, out):
    return plot_ratios(d, out, ["zvol_vs_vhd", "hop", "raw_vs_vhd",
                                "zvol_vs_raw"],
                       "Datapath ratios through tapdisk", "datapath.png")


def plot_ratios(d, out, names, title, filename, targets=None):
    """Bars of the named per-run ratios (medians) per workload, without
    and with a snapshot, on a log scale; targets (workload: ratio), if
    given, as dashed lines."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, snap in zip(axes, (False, True)):
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            vals = [(_ratio(d, name, w, snap) or {"median": 0})["median"]
                    for w in WORKLOADS]
            ax.bar([x + i * width for x in range(len(WORKLOADS))], vals,
                   width, label=name)
        for x, w in enumerate(WORKLOADS if targets else []):
            ax.plot([x - width / 2, x + 0.8 - width / 2],
                    [targets[w]] * 2, color="black", linestyle="--",
                    linewidth=0.8)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(WORKLOADS))])
        ax.set_xticklabels(WORKLOADS)
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_yscale("log")
        ax.set_title("with a snapshot" if snap else "no snapshot")
    axes[0].set_ylabel("IOPS ratio (median of per-run ratios)" +
                       ("; dashed: launch post" if targets else ""))
    axes[0].legend()
    fig.suptitle(title)
    return _save(fig, out, filename)


# --- raw file against zvol ----------------------------------------------------

def rawfile(d, out):
    md = ["## Raw file against zvol, no tapdisk: one difference at a time\n",
          "fio directly on each device (libaio, O_DIRECT). Ratio: IOPS over "
          "zvol-16K's (zfs-ng's defaults) in the same run, median "
          "(min-max) of the per-run ratios. *reqsync*: the module "
          "parameter zvol_request_sync=1 during its runs.\n"]
    rows = []
    for r in sorted(d["results"], key=lambda r: (
            _wl_order(r["workload"]), d["configs"].index(r["config"]))):
        rows.append([r["workload"], r["config"], spread(r["iops"]),
                     spread(r["mib_s"], "%.1f"),
                     ratio_s(r["ratio_to_zvol_16k"]),
                     _per_byte(r, "disk_read_per_byte"),
                     _per_byte(r, "disk_written_per_byte"),
                     "%.0f" % med(r["zil_commits"]),
                     "%d/%d" % (r["arc"]["arc_hits"],
                                r["arc"]["arc_misses"])] + _cpu(r))
    md.append(table(["workload", "device", "IOPS median (min-max)",
                     "MiB/s median (min-max)", "ratio to zvol-16K",
                     "disk read per byte", "disk written per byte",
                     "ZIL commits", "ARC hits/misses", "guest CPU busy",
                     "CPU us per I/O"], rows))
    md += _config_and_notes(d)
    return md


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
    plt = _pyplot()
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
          "- Start + `import zfsng_volume.main`: %s s" %
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


def cbt(d, out):
    md = ["## Changed blocks\n"]
    if d.get("bytes_read"):
        md += _cbt_bytes_read(d["bytes_read"])
    if d.get("after_revert"):
        r = d["after_revert"]
        md.append("\n### The next delta after a revert\n")
        md.append("A %d MiB disk written whole; S1; 48 KiB writes over 5%%; "
                  "S2, listed and data-destroyed (backed up); the disk "
                  "reverted to S1; 5%% more; S3. "
                  "`list_changed_blocks(S2, S3)` from S2's bookmark: "
                  "*read*, the 64 KiB blocks it marks; *differ*, the blocks "
                  "whose bytes differ. Target: read at most 1.1x differ.\n"
                  % (r["disk_bytes"] >> 20))
        md.append(table(["differ MiB", "read MiB", "read / differ",
                         "list_changed_blocks s"],
                        [["%.1f" % (r["differ_bytes"] / 1048576.0),
                          "%.1f" % (r["read_bytes"] / 1048576.0),
                          "%.3fx" % r["ratio"], "%.2f" % r["lcb_s"]]]))
    return md + _cbt_rest(d, out)


def _cbt_bytes_read(b):
    md = ["### Bytes read per incremental backup against bytes changed\n",
          "A %d MiB disk written whole, then rounds as Xen Orchestra runs "
          "them: random 48 KiB writes over a fraction of the disk, a "
          "snapshot, `Volume.list_changed_blocks(previous, new)`, "
          "`Volume.data_destroy(previous)`. *changed*: the 64 KiB blocks "
          "the writes touched; *read*: the blocks the bitmap marks (what "
          "XO reads over NBD). Target: read at most 1.1x changed. *Whole "
          "reads*: the same incremental without CBT, both snapshots read "
          "whole and compared. The first round's list also makes the "
          "first snapshot's map (a full send of it).\n" % (b["disk_bytes"] // (1 << 20))]
    rows = [["%.0f%%" % (r["fraction"] * 100),
             "%.1f" % (r["changed_bytes"] / 1048576.0),
             "%.1f" % (r["read_bytes"] / 1048576.0), "%.3fx" % r["ratio"],
             "%.2f" % r["lcb_s"],
             "%.0f" % (r["whole_read_bytes"] / 1048576.0),
             "%.1f" % r["whole_read_s"]] for r in b["rounds"]]
    md.append(table(["changed", "changed MiB", "read MiB", "read / changed",
                     "list_changed_blocks s", "whole reads MiB",
                     "whole reads s"], rows))
    return md


def _cbt_rest(d, out):
    md = []
    if d.get("list_methods"):
        m = d["list_methods"]
        md.append("\n### Listing the changes: block births against zfs "
                  "send\n")
        md.append("A %d MiB disk written whole, then a fraction of its "
                  "64 KiB blocks rewritten at random between two snapshots. "
                  "*zdb*: the changes from the block pointers' birth times "
                  "(`zdb -ddddd`, metadata only; what list_changed_blocks "
                  "uses); *send*: from an incremental `zfs send` (reads the "
                  "changed data); *read once*: the changed bytes read from "
                  "the new snapshot's device. Caches dropped before each, "
                  "primarycache=metadata. Both methods listed exactly the "
                  "rewritten blocks. Target: zdb at most 0.25x the read at "
                  "10%% changed.\n" % (m[0]["disk_bytes"] >> 20))
        rows = [["%.0f%%" % (r["fraction"] * 100),
                 "%.0f" % (r["changed_bytes"] / 1048576.0),
                 "%.2f" % r["zdb_s"], "%.2f" % r["send_s"],
                 "%.2f" % r["read_s"], "%.2fx" % (r["zdb_s"] / r["read_s"]),
                 "%.2fx" % (r["send_s"] / r["read_s"])] for r in m]
        md.append(table(["changed", "changed MiB", "zdb s", "send s",
                         "read once s", "zdb / read", "send / read"], rows))
    if not d.get("by_size"):
        return md
    md.append("\n### list_changed_blocks against disk size\n")
    md.append("Sparse disks, 1 MiB written, a snapshot, 1 MiB more in the "
              "middle, a snapshot; median (min-max) of the runs, the first "
              "of which also makes the base's map. The time is the call as "
              "xapi waits for it: the plugin's process, its whole answer "
              "read (the bitmap covers the whole disk: 32 MiB, 44 MB of "
              "base64 at 16 TiB). Target: 16 TiB at most 1.5x 64 MiB.\n")
    base = med(d["by_size"][0]["lcb_s"])
    rows = [["%d MiB" % (r["size"] >> 20) if r["size"] < (1 << 30) else
             "%d GiB" % (r["size"] >> 30), spread(r["lcb_s"], "%.3f"),
             r["blocks"], "%.2fx" % (med(r["lcb_s"]) / base)]
            for r in d["by_size"]]
    md.append(table(["disk", "list_changed_blocks s", "blocks marked",
                     "against the smallest"], rows))
    return md


def _mib(n):
    return "%.1f" % (n / MiB)


def _size(n):
    return "%d MiB" % (n >> 20) if n < (1 << 30) else \
        "%d GiB" % (n >> 30) if n < (1 << 40) else "%d TiB" % (n >> 40)


def _pause(r):
    return "-" if r["pause_s"] is None else "%.2f" % r["pause_s"]


def migrate(d, out):
    md = ["## Storage migration out of zfs-ng\n",
          "Through the real tapdisk in xapi's order: the source attached "
          "for a guest, the destination a volume of a second zfs-ng SR "
          "served by tapdisk's NBD server, a one-shot unix-socket proxy "
          "between them; each destination checked byte for byte. *sent*: "
          "what the copy wrote to the destination (rounds and catch-up); "
          "*allocated*: the source's data when the migration started; "
          "*pause*: the guest's tapdisk paused, as the job timed it.\n",
          "### Against disk size (%s MiB of data, no writer)\n"
          % _mib(d["data_bytes"]),
          "Target: a sparse disk copies its data, not its size. A "
          "running VM's disk is guaranteed room to be written whole while "
          "it is mirrored, so its sizes fit the bench pool; the halted "
          "VM's disks below go to 16 TiB.\n"]
    if d.get("parts_from"):
        md.append("Parts merged from separate runs (report.py --merge), "
                  "each figure compared only within its own run: %s.\n"
                  % "; ".join("%s %s, %s vCPU" % (name, o["date"],
                                                  o.get("cpus") or "?")
                              for name, o in
                              sorted(d["parts_from"].items())))
    base = d["by_size"][0]["seconds"]
    rows = [[_size(r["size"]), "%.1f" % r["seconds"],
             "%.2fx" % (r["seconds"] / base), _mib(r["sent_bytes"]),
             _mib(r["allocated_bytes"]),
             "%.3fx" % (r["sent_bytes"] / max(r["allocated_bytes"], 1)),
             _pause(r)] for r in d["by_size"]]
    md.append(table(["disk", "to complete s", "against the smallest",
                     "sent MiB", "allocated MiB", "sent / allocated",
                     "pause s"], rows))
    if d.get("halted"):
        md.append("\n### A halted VM's disks (%s MiB of data)\n"
                  % _mib(d["data_bytes"]))
        md.append("xapi mirrors a halted or suspended VM's disks too, "
                  "with the domid -1: one snapshot copied, no tapdisk. "
                  "Target: sent equals allocated.\n")
        rows = [[_size(r["size"]), "%.1f" % r["seconds"],
                 _mib(r["sent_bytes"]), _mib(r["allocated_bytes"]),
                 "%.3fx" % (r["sent_bytes"] / max(r["allocated_bytes"], 1))]
                for r in d["halted"]]
        md.append(table(["disk", "to complete s", "sent MiB",
                         "allocated MiB", "sent / allocated"], rows))
    if d.get("snapshots"):
        md += _snapshot_copies(d)
    plain = d["plain_copy"]
    md.append("\n### A full %s MiB disk, with a guest writing\n"
              % _mib(d["full_bytes"]))
    md.append("The guest writes 64 KiB blocks at random through its "
              "tapdev (a fifth of them zeros over data) from before "
              "Data.mirror until its VM moves. *guest wrote*: during the "
              "copy, until complete; *slowest write*: the guest's view of "
              "the pause. Beside it, a plain full copy of the same disk "
              "over the same kind of link (every block read and written): "
              "%.1f s. Targets: sent at most 1.05x allocated plus what the "
              "guest wrote; the pause at most 1 s of guest time.\n"
              % plain["seconds"])
    rows = [[r["rate"], "%.1f" % r["seconds"],
             "%.2fx" % (r["seconds"] / plain["seconds"]),
             " / ".join(_mib(b) for b in r["rounds"]),
             _mib(r["sent_bytes"]), _mib(r["written_during_copy"]),
             "%.3fx" % (r["sent_bytes"] / max(
                 r["allocated_bytes"] + r["written_during_copy"], 1)),
             _pause(r), "-" if r["slowest_guest_write_s"] is None else
             "%.2f" % r["slowest_guest_write_s"]] for r in d["full"]]
    md.append(table(["guest writes", "to complete s", "against plain copy",
                     "rounds MiB", "sent MiB", "guest wrote MiB",
                     "sent / (allocated + wrote)", "pause s",
                     "slowest write s"], rows))
    if d.get("mirroring"):
        md += _while_mirrored(d["mirroring"])
    return md


def _while_mirrored(m):
    """The guest flat out alone, then mirrored; the guard's syncs."""
    alone, mirrored = m["alone"], m["mirrored"]

    def rate(r):
        return r["bytes"] / MiB / max(r["seconds"], 1e-9)
    md = ["\n### While mirrored: a guest writing flat out\n",
          "The same disk, the guest writing 64 KiB blocks at random as "
          "fast as it can: %.0f s with no mirror, then %.0f s between "
          "complete and the VM's move, every write mirrored. *syncs*: the "
          "space guard's `zpool sync`, one each time a window of %s MiB "
          "is dirtied, over the whole mirror (from the switch to the "
          "move), with the bytes tapdisk mirrored meanwhile.\n"
          % (alone["seconds"], mirrored["seconds"],
             _mib(m["window"]) if m.get("window") else "?")]
    settles = m.get("settles") or 0
    settle = m.get("settle_seconds") or 0.0
    rows = [["alone", "%.2f" % rate(alone), "1.00x", "-", "-", "-",
             "%.2f" % alone["slowest_s"]],
            ["mirrored", "%.2f" % rate(mirrored),
             "%.2fx" % (rate(mirrored) / max(rate(alone), 1e-9)),
             _mib(m.get("mirrored_bytes", 0)), str(settles),
             "%.2f" % (settle / settles) if settles else "-",
             "%.2f" % mirrored["slowest_s"]]]
    md.append(table(["guest", "MiB/s", "against alone", "mirrored MiB",
                     "syncs", "s per sync", "slowest write s"], rows))
    return md


def _snapshot_copies(d):
    md = ["\n### A VM with snapshots (%s MiB of data, %s MiB rewritten "
          "between snapshots)\n" % (_mib(d["data_bytes"]),
                                      _mib(d.get("rewrite_bytes", 0))),
          "The VM runs: its disk is mirrored, then, while the mirror "
          "lives on, xapi copies each snapshot itself (DATA.copy): "
          "attached and activated for a CP domain, tapdisk's device read "
          "whole as sparse_dd reads it. *read*: bytes through tapdisk "
          "(the disk's size); *non-zero*: the 64 KiB blocks sparse_dd "
          "would send; *referenced* / *written*: the snapshot's ZFS "
          "figures. xapi's cost, not zfs-ng's: a snapshot's copy reads "
          "its whole size, holes included.\n"]
    rows = []
    for r in d["snapshots"]:
        for n, c in enumerate(r["snapshots"], 1):
            rows.append([_size(r["size"]), n, "%.1f" % c["seconds"],
                         "%.1f" % c["read_seconds"], _mib(c["read_bytes"]),
                         _mib(c["nonzero_bytes"]),
                         _mib(c["referenced_bytes"]),
                         _mib(c["written_bytes"]),
                         "%.1fx" % (c["read_bytes"] /
                                    max(c["referenced_bytes"], 1)),
                         "%.1f" % (c["read_bytes"] / MiB /
                                   max(c["read_seconds"], 1e-9)),
                         "%.1f" % r["seconds"]])
    md.append(table(["disk", "snapshot", "copy s", "read s", "read MiB",
                     "non-zero MiB", "referenced MiB", "written MiB",
                     "read / referenced", "read MiB/s",
                     "leaf's mirror s"], rows))
    return md


def compose(d, out):
    md = ["## Composing a disk that moved in\n",
          "A VM moving in from a SMAPIv1 SR: the parent holds the copy of "
          "the source's snapshot, the leaf's mirror sink what the guest "
          "wrote meanwhile. `Volume.compose` lists the sink's data blocks "
          "from their birth times and copies exactly those bytes onto the "
          "parent. The time is the call as xapi waits for it; median "
          "(min-max) of the runs.\n",
          "\n### Against disk size\n",
          "Sparse disks, 1 MiB in the parent, 256 scattered 4 KiB writes "
          "in the sink. Target: the largest disk at most 1.5x the "
          "smallest.\n"]
    base = med(d["by_size"][0]["compose_s"])
    md.append(table(["disk", "written", "compose s", "against the smallest"],
                    [[_size(r["size"]), "%s MiB" % _mib(r["written"]),
                      spread(r["compose_s"], "%.2f"),
                      "%.2fx" % (med(r["compose_s"]) / base)]
                     for r in d["by_size"]]))
    md.append("\n### Against what the mirror wrote\n")
    md.append("A 1 GiB disk, the sink written in 64 KiB writes at random "
              "offsets.\n")
    md.append(table(["written", "compose s", "MiB/s"],
                    [["%s MiB" % _mib(r["written"]),
                      spread(r["compose_s"], "%.2f"),
                      "%.1f" % r["mib_per_s"]] for r in d["by_written"]]))
    return md


def _plot_ls(rows, out):
    plt = _pyplot()
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
    _pyplot().close(fig)
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


def compare(out_path, directories):
    """The tapdisk tables of several runs (one per ZFS version), side by
    side, into one markdown file."""
    runs = []
    for directory in directories:
        with open(os.path.join(directory, "results.json")) as f:
            r = json.load(f)
        if "ratios" in r.get("datapath", {}):
            runs.append((directory, r))
    if not runs:
        sys.exit("compare: no run with tapdisk datapath figures")
    d0 = runs[0][1]["datapath"]
    heads = []
    for directory, r in runs:
        v = r["conditions"]["zfs_version"].split("-")[1]
        heads += ["%s, no snapshot" % v, "%s, with snapshot" % v]
    md = ["# zfs-ng against SMAPIv1 through tapdisk, OpenZFS side by side\n",
          "Generated by `tests/bench/report.py --compare` from: %s. QEMU "
          "TCG guest: only ratios within one run count. Each cell: median "
          "(min-max) of per-run IOPS ratios.\n" % ", ".join(
              "[%s](%s/report.md) (%d runs per figure)" % (
                  os.path.basename(os.path.normpath(dr)),
                  os.path.relpath(dr, os.path.dirname(out_path) or "."),
                  r["conditions"]["runs"]) for dr, r in runs),
          "Why these ratios differ from Vates' launch benchmark of the ZFS "
          "SR (about 2x sequential write, 3x sequential read, 12-13x 4k "
          "random): the project's BENCHMARKS.md.\n",
          "## tap-zvol / tap-vhd-file (zfs-ng against SMAPIv1's ZFS SR)\n"]
    rows = []
    for w in WORKLOADS:
        row = [w, d0["launch"][w], ">= %gx" % d0["targets"][w]]
        for _, r in runs:
            for snap in (False, True):
                c = _ratio(r["datapath"], "zvol_vs_vhd", w, snap)
                row.append(ratio_s(c) if c else "-")
        rows.append(row)
    md.append(table(["workload", "Vates' launch benchmark", "target"] + heads,
                    rows))
    md.append("\n## The tapdisk hop: zvol / tap-zvol (target <= %gx)\n"
              % d0["hop_target"])
    rows = []
    for w in WORKLOADS:
        row = [w]
        for _, r in runs:
            for snap in (False, True):
                c = _ratio(r["datapath"], "hop", w, snap)
                row.append(ratio_s(c) if c else "-")
        rows.append(row)
    md.append(table(["workload"] + heads, rows))
    md.append("\n## Guest time\n")
    md.append(table(["run", "datapath section s", "whole run s"], [
        [os.path.basename(os.path.normpath(dr)),
         "%.0f" % r["datapath"]["wall_s"],
         "%.0f" % sum(v["wall_s"] for v in r.values()
                      if isinstance(v, dict) and "wall_s" in v)]
        for dr, r in runs]))
    with open(out_path, "w") as f:
        f.write("\n".join(md))
    print("comparison: %s" % out_path)


def main(directory):
    with open(os.path.join(directory, "results.json")) as f:
        r = json.load(f)
    md = header(r)
    for name, fn in (("datapath", datapath), ("rawfile", rawfile),
                     ("volblocksize", volblocksize), ("control", control),
                     ("cbt", cbt), ("migrate", migrate),
                     ("compose", compose), ("disk-bound", disk_bound)):
        if name in r:
            md += fn(r[name], directory)
            md.append("\nSection wall time: %.0f s\n" % r[name]["wall_s"])
    path = os.path.join(directory, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    print("report: %s" % path)


def disk_bound(d, out):
    import report_disk_bound
    return report_disk_bound.render(d, out)


def merge(out, directories):
    """One results.json in out from disk-bound runs of separate parts
    (main.py --parts) under the same limits: each part from the run that
    ran it, the run's conditions and the ceilings from the first. Runs of
    the migrate section merge likewise (merge_migrate)."""
    runs = []
    for directory in directories:
        with open(os.path.join(directory, "results.json")) as f:
            runs.append(json.load(f))
    if all("migrate" in r and "disk-bound" not in r for r in runs):
        return merge_migrate(out, directories, runs)
    limits = set(json.dumps(r["disk-bound"]["throttle"], sort_keys=True)
                 for r in runs)
    if len(limits) != 1:
        sys.exit("report.py --merge: the runs had different limits")
    merged = dict(runs[0])
    section = dict(runs[0]["disk-bound"])
    section["failed_parts"] = []
    for name in ("launch_runs", "scaling", "layouts", "cbt_list",
                 "latency", "redundant", "slog"):
        ran = [r["disk-bound"] for r in runs if r["disk-bound"].get(name)]
        section[name] = ran[0][name] if ran else []
        if ran and name == "launch_runs":   # its summaries go with it
            section["ratios"] = ran[0]["ratios"]
            section["snapshot_penalty"] = ran[0]["snapshot_penalty"]
        if ran and name == "latency":
            section["latency_ratios"] = ran[0]["latency_ratios"]
            for key in ("latency_size_mib", "latency_runtime_s"):
                section[key] = ran[0][key]
        if ran and name in ("redundant", "slog"):
            section[name + "_ratios"] = ran[0][name + "_ratios"]
            for key in ("defaults_size_mib", "slog_size_mib",
                        "defaults_seq_mib"):
                section[key] = ran[0].get(key)
    for r in runs:
        section["failed_parts"] += r["disk-bound"].get("failed_parts", [])
    section["wall_s"] = max(r["disk-bound"]["wall_s"] for r in runs)
    section["merged_from"] = [os.path.basename(os.path.abspath(d))
                              for d in directories]
    merged["disk-bound"] = section
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(merged, f, indent=2, sort_keys=True)
        f.write("\n")


def merge_migrate(out, directories, runs):
    """The migrate section from runs of some of its parts (main.py
    --parts): each part from the last run that ran it, with that run's
    date and ZFS version beside it (parts_from); the first run's
    conditions; the sum of the wall times."""
    import bench_migrate        # its parts, named there only
    parts = bench_migrate.PARTS
    merged = dict(runs[0])
    section = {}
    origin = {}
    for directory, run in zip(directories, runs):
        d = run["migrate"]
        for name in parts:
            if d.get(name):
                section[name] = d[name]     # a merged run keeps its origins
                origin[name] = d.get("parts_from", {}).get(name) or {
                    "run": os.path.basename(os.path.abspath(directory)),
                    "date": run["conditions"]["date"],
                    "cpus": run["conditions"].get("cpus"),
                    "zfs_version": run["conditions"]["zfs_version"]}
        for key, value in d.items():
            if key not in parts + ["parts", "wall_s", "parts_from",
                                   "merged_from"]:
                section.setdefault(key, value)
    versions = set(o["zfs_version"] for o in origin.values())
    if len(versions) != 1:
        sys.exit("report.py --merge: the runs had different ZFS versions")
    section["parts_from"] = origin
    section["wall_s"] = sum(r["migrate"]["wall_s"] for r in runs)
    merged["migrate"] = section
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(merged, f, indent=2, sort_keys=True)
        f.write("\n")


def throttle(directory):
    """Print the limits the ceilings section chose (run.sh --throttle)."""
    with open(os.path.join(directory, "results.json")) as f:
        print(json.load(f)["ceilings"]["throttle"]["arg"])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--throttle":
        throttle(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "--merge":
        merge(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit("usage: report.py DIR (containing results.json)\n"
                 "       report.py --throttle DIR   (the ceilings' limits)\n"
                 "       report.py --merge OUT DIR...  (disk-bound parts)\n"
                 "       report.py --compare OUT.md DIR...")
