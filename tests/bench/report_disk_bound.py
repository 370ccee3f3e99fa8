"""The disk-bound section's part of report.md (report.py calls it).

Every figure is the median (min-max) of its repeats; ratios are per run
(run i of one backend against run i of the other). ``util`` is how close
the disks came to their limits, per disk: max(requests a second / the
IOPS limit, bytes a second / the byte limit), 1.0 meaning at the limit.
"""

import json
import os
import statistics

from report import (_ratio, launch_table, plot_ratios,  # noqa: E402
                    ratio_s as _x, table as _table)

MiB = 1024.0 * 1024
WORKLOADS = ["randread-4k", "randwrite-4k", "seqread-4M", "seqwrite-4M"]
NAMES = ["tap-zvol", "tap-vhd-file", "tap-raw-file", "tap-vhd-ext4",
         "tap-zvol-std", "tap-zvol-16k", "tap-zvol-8k", "tap-zvol-4k",
         "tap-zvol-tput"]
RATIO_TEXT = {
    "zvol_vs_vhd": "tap-zvol / tap-vhd-file (zfs-ng against SMAPIv1's "
                   "ZFS SR)",
    "raw_vs_vhd": "tap-raw-file / tap-vhd-file (apples to apples: the "
                  "VHD format on the same dataset)",
    "zvol_vs_raw": "tap-zvol / tap-raw-file (zvol against file, raw)",
    "zvol_vs_ext4_vhd": "tap-zvol / tap-vhd-ext4 (zfs-ng against SMAPIv1's "
                        "EXT SR)",
    "zvolstd_vs_vhd": "tap-zvol-std / tap-vhd-file (zfs-ng with "
                      "sync=standard against SMAPIv1's ZFS SR)",
    "zvol16k_vs_zvol": "tap-zvol-16k / tap-zvol (16K blocks against "
                       "the default, 8K on one disk)",
    "zvol8k_vs_zvol": "tap-zvol-8k / tap-zvol (8K blocks against "
                      "the default: 16K before it was 8K)",
    "zvol4k_vs_zvol": "tap-zvol-4k / tap-zvol (4K blocks against "
                      "the default)",
    "zvoltput_vs_zvol": "tap-zvol-tput / tap-zvol (logbias=throughput "
                        "against the default latency)",
    "zvoltput_vs_vhd": "tap-zvol-tput / tap-vhd-file (zfs-ng with "
                       "logbias=throughput against SMAPIv1's ZFS SR)",
}


NOT_RUN = "(not run in this report: main.py --parts)\n"


def _s(values, fmt="%.0f"):
    values = list(values)
    if not values:
        return "-"
    return (fmt + " (" + fmt + "-" + fmt + ")") % (
        statistics.median(values), min(values), max(values))


def _rate(runs, workload):
    """IOPS of random runs, MiB/s of sequential ones (under these limits
    a 4M run does well under one request a second)."""
    if workload.startswith("seq"):
        return _s((m["mib_s"] for m in runs), "%.2f") + " MiB/s"
    return _s(m["iops"] for m in runs)


def _pair(left, right, key):
    """One figure of two sets of runs side by side: "left / right"."""
    return "%s / %s" % (_s((m[key] for m in left), "%.2f"),
                        _s((m[key] for m in right), "%.2f"))


def _arc_caps(runs):
    """The ARC caps (MiB, as text) the runs recorded having raised."""
    return ", ".join("%d" % (c / MiB) for c in sorted(set(
        m["zfs_arc_max"] for m in runs if m.get("zfs_arc_max"))))


def _raised_caps(d):
    """What the header adds to the ARC's cap when the redundant part
    raised it for its runs: otherwise the header's cap reads as theirs."""
    caps = _arc_caps(d.get("redundant") or [])
    return " (%s MiB for the redundant part)" % caps if caps else ""


def _pick(runs, **match):
    return [m for m in runs if all(m.get(k) == v for k, v in match.items())]


def render(d, out):
    """Markdown lines for the section, and its plots written to out."""
    t = d["throttle"]
    failed = d.get("failed_parts") or []
    md = ["## Disk-bound: the launch benchmark with the disk as the "
          "bottleneck\n",
          "Every pool disk throttled by QEMU to **%d requests/s and %.2f "
          "MB/s** (each disk on its own), the proportions of a %s (rated "
          "%d MB/s sequential read, %d random 4k read IOPS). The ARC "
          "capped at %d MiB%s, dirty data at %d MiB (ZFS and the page "
          "cache), caches dropped before every run; %d MiB per device, "
          "%d s runs (writes: until durable), %d repeats interleaved.\n"
          % (t["iops"], t["bps"] / 1e6, d["ssd"]["model"],
             d["ssd"]["seq_read_mb_s"], d["ssd"]["rand_read_iops"],
             d["tuning"]["zfs_arc_max"] / MiB, _raised_caps(d),
             d["tuning"]["zfs_dirty_data_max"] / MiB, d["size_mib"],
             d["runtime_s"], d["runs"])]
    if failed:
        md.append("**Parts that failed (see output.log): %s.**\n"
                  % ", ".join(failed))
    md += _ceilings(out)
    md += ["### zfs-ng against SMAPIv1's VHD file (the launch benchmark)\n"]
    md += [launch_table(d),
           "### The other ratios\n", _ratio_table(d),
           "### What a snapshot costs\n",
           "Median IOPS with a snapshot over median without.\n",
           _table(["backend"] + WORKLOADS, _penalty_rows(d)),
           "### Every figure\n",
           "*util*: how close the disk came to its limit (1.0 = at it). "
           "*disk read/written per byte*: bytes the disk moved per byte "
           "fio moved. *CPU busy*: the guest's CPUs during fio.\n",
           _table(["workload", "snapshot", "backend", "IOPS", "MiB/s",
                   "util", "disk read per byte", "disk written per byte",
                   "CPU busy", "ARC hits/misses"], _every_row(d))] \
        if d["launch_runs"] else [NOT_RUN]
    md += ["### Several VDIs at once on the one-disk pool\n",
           "N zfs-ng VDIs, each with its own fio at once (IOPS, or "
           "MiB/s for sequential runs); the total against one VDI's, and "
           "the slowest VDI's share of an even split (1.0 = even).\n",
           _table(["workload", "1 VDI", "2 VDIs", "4 VDIs",
                   "4 / 1", "evenness at 4", "util at 4",
                   "disk read per byte, 1 / 4 VDIs",
                   "disk written per byte, 1 / 4 VDIs"],
                  _scaling_rows(d)) if d["scaling"] else NOT_RUN,
           "### Layouts on four disks: ZFS against Linux RAID\n",
           "zfs-ng (tap-zvol) on the ZFS layout against a VHD on ext4 on "
           "mdadm RAID over the same four throttled disks (IOPS, or MiB/s "
           "for sequential runs).\n",
           _table(["layout", "workload", "zfs-ng", "ext4 VHD on md",
                   "zfs-ng / md", "util zfs / md",
                   "disk read per byte zfs / md",
                   "disk written per byte zfs / md"], _layout_rows(d))
           if d["layouts"] else NOT_RUN]
    if d.get("cbt_list"):
        md += ["### Listing a backup's changes on the slow disk\n",
               "The CBT section's listing benchmark on a pool striped "
               "over four throttled disks: list_changed_blocks' walk of "
               "the block "
               "pointers' birth times (zdb, metadata only) and an "
               "incremental zfs send, against reading the changed bytes "
               "once, caches dropped. Target: zdb at most 0.25x the read "
               "at 10% changed. Both lists equal the blocks written.\n",
               _table(["changed", "of a disk of", "zdb s", "zfs send s",
                       "read once s", "zdb / read", "send / read"],
                      [["%g%%" % (r["fraction"] * 100),
                        "%.0f MiB" % (r["disk_bytes"] / MiB),
                        "%.1f" % r["zdb_s"], "%.1f" % r["send_s"],
                        "%.1f" % r["read_s"],
                        "%.2fx" % (r["zdb_s"] / r["read_s"]),
                        "%.2fx" % (r["send_s"] / r["read_s"])]
                       for r in d["cbt_list"]])]
    if d.get("latency"):
        md += _latency(d)
    if d.get("redundant"):
        md += _redundant(d)
    if d.get("slog"):
        md += _slog(d)
    if d["launch_runs"]:
        md.append("\n![disk-bound ratios](%s)\n"
                  % os.path.basename(_plot(d, out)))
    return md


def _latency(d):
    """The latency part: sync writes one at a time, logbias=latency
    against logbias=throughput, per block size."""
    rows = []
    ratios = dict(((r["volblocksize"], r["workload"]), r)
                  for r in d.get("latency_ratios", []))
    for size in ("16k", "8k"):
        for w in ("syncwrite-4k-qd1", "syncwrite-64k-qd1"):
            lat = _pick(d["latency"], variant=size + "-latency", workload=w)
            tput = _pick(d["latency"], variant=size + "-throughput",
                         workload=w)
            if not lat or not tput:
                continue
            r = ratios.get((size, w), {})
            rows.append(
                [size.upper(), w] +
                ["%s / %s" % (_s((m[p] / 1000.0 for m in lat), "%.1f"),
                              _s((m[p] / 1000.0 for m in tput), "%.1f"))
                 for p in ("p50", "p99")] +
                [_x(r[k]) if k in r else "-" for k in ("p50", "p99",
                                                       "iops")] +
                [_pair(lat, tput, key) for key in (
                    "iops", "disk_written_per_byte",
                    "disk_read_per_byte", "disk_util")])
    return ["### Sync-write latency at queue depth 1: logbias\n",
            "zfs-ng VDIs (sync=always) through the datapath plugin and "
            "tapdisk, one SR per column pair, %d MiB each, filled; fio "
            "random writes at iodepth 1 for %d s per run, caches dropped "
            "before each, the four VDIs in turn (the order rotating), %d "
            "runs. Latency: fio's completion latency (clat) in ms, "
            "median (min-max) over the runs of each run's percentile. "
            "Ratios: throughput over latency, run i against run i "
            "(above 1: logbias=throughput is slower per write, or, for "
            "IOPS, faster).\n"
            % (d.get("latency_size_mib", 0), d.get("latency_runtime_s", 0),
               d["runs"]),
            _table(["volblocksize", "workload",
                    "p50 ms, latency / throughput",
                    "p99 ms, latency / throughput",
                    "p50 throughput / latency", "p99 throughput / latency",
                    "IOPS throughput / latency", "IOPS, latency / throughput",
                    "disk written per byte, latency / throughput",
                    "disk read per byte, latency / throughput",
                    "util, latency / throughput"], rows)]


def _first_seen(runs, field):
    """The values of field in runs, each once, in the order first met."""
    out = []
    for m in runs:
        if m[field] not in out:
            out.append(m[field])
    return out


def _variants(runs):
    return _first_seen(runs, "variant")


def _workloads(runs):
    return _first_seen(runs, "workload")


def _pair_rows(ratios, keys):
    """One row per (pair, workload) of bench_disk_bound.pair_ratios."""
    return [["%s / %s" % tuple(r["of"]), r["workload"]] +
            [_x(r[k]) if k in r else "-" for k in keys] for r in ratios]


def _redundant(d):
    """The redundant part: 8K and 16K blocks, redundant_metadata all
    against most, the launch workloads."""
    runs = d["redundant"]
    rows = []
    for w in _workloads(runs):
        for v in _variants(runs):
            ms = _pick(runs, variant=v, workload=w)
            if not ms:
                continue
            rows.append([w, v, _rate(ms, w)] +
                        [_s((m[k] for m in ms), "%.2f") for k in (
                            "disk_read_per_byte", "disk_written_per_byte",
                            "disk_util", "arc_mib_at_start")] +
                        ["%d/%d" % (sum(m["arc_hits"] for m in ms),
                                    sum(m["arc_misses"] for m in ms))])
    return ["### 8K blocks and redundant_metadata=most\n",
            "zfs-ng VDIs through the datapath plugin and tapdisk, one SR "
            "each on the one-disk pool (volblocksize 16K or 8K; "
            "redundant_metadata all, the default, or most, set on the "
            "SR's dataset), %d MiB each, filled; the launch part's four "
            "workloads (sequential runs move %d MiB), caches dropped "
            "before each run, the four VDIs in turn with the order "
            "rotating, %d runs. The ARC's cap raised to **%s MiB** for "
            "this part (tests/bench/diskrig.py ARC_SMALL_BLOCKS says "
            "why). Ratios are run i against run i; *disk read/written "
            "per byte*: bytes the disk moved per byte fio moved.\n"
            % (d.get("defaults_size_mib", 0), d.get("defaults_seq_mib", 0),
               d["runs"], _arc_caps(runs)),
            _table(["pair", "workload", "IOPS", "disk read per byte",
                    "disk written per byte", "p50", "p99"],
                   _pair_rows(d.get("redundant_ratios", []),
                              ("iops", "disk_read_per_byte",
                               "disk_written_per_byte", "p50", "p99"))),
            "\n",
            _table(["workload", "VDI", "IOPS or MiB/s", "disk read per byte",
                    "disk written per byte", "util", "ARC MiB at start",
                    "ARC hits/misses"], rows)]


def _slog(d):
    """The slog part: a pool with a log device against the one-disk
    pool, logbias latency and throughput, write workloads."""
    runs = d["slog"]
    rows = []
    for w in _workloads(runs):
        for v in _variants(runs):
            ms = _pick(runs, variant=v, workload=w)
            if not ms:
                continue
            data = [m["per_disk"][0] for m in ms]
            log = [m["per_disk"][1] for m in ms if len(m["per_disk"]) > 1]
            rows.append(
                [w, v, _rate(ms, w)] +
                [_s((m[p] / 1000.0 for m in ms if m.get(p)), "%.1f")
                 for p in ("p50", "p99")] +
                [_s((p["written_per_byte"] for p in data), "%.2f"),
                 _s((p["read_per_byte"] for p in data), "%.2f"),
                 _s((p["written_per_byte"] for p in log), "%.2f")
                 if log else "-",
                 _s((p["util"] for p in data), "%.2f"),
                 _s((p["util"] for p in log), "%.2f") if log else "-"])
    return ["### A log device\n",
            "zfs-ng VDIs (16K blocks, sync=always) through the datapath "
            "plugin and tapdisk: *nolog-* on the one-disk pool (disk 1), "
            "*log-* on a pool of disk 2 with disk 3 added as its log "
            "(`zpool add POOL log DEV`), every disk under the same "
            "limits; one SR per VDI with logbias latency (zfs-ng's "
            "default) or throughput; %d MiB each, filled; the launch "
            "part's random and sequential writes (sequential runs move "
            "%d MiB) and 4k sync writes one at a time, caches dropped "
            "before each run, the four VDIs in turn with the order "
            "rotating, %d runs. Latency: fio's completion latency in ms "
            "(median over runs of each run's percentile). Ratios are "
            "run i against run i; disk bytes per byte summed over the "
            "pool's disks in the ratio table, per disk in the other.\n"
            % (d.get("slog_size_mib", 0), d.get("defaults_seq_mib", 0),
               d["runs"]),
            _table(["pair", "workload", "IOPS", "disk read per byte",
                    "disk written per byte", "p50", "p99"],
                   _pair_rows(d.get("slog_ratios", []),
                              ("iops", "disk_read_per_byte",
                               "disk_written_per_byte", "p50", "p99"))),
            "\n",
            _table(["workload", "VDI", "IOPS or MiB/s", "p50 ms", "p99 ms",
                    "data disk written per byte", "data disk read per byte",
                    "log device written per byte", "util data disk",
                    "util log device"], rows)]


def _ceilings(out):
    path = os.path.join(out, "ceilings", "results.json")
    if not os.path.exists(path):
        return ["(no ceilings/results.json beside this run)\n"]
    with open(path) as f:
        c = json.load(f)["ceilings"]
    th = c["throttle"]
    rows = [[n] + ["%.0f IOPS, %.1f MiB/s; disk %.0f req/s, %.1f MB/s"
                   % (x["iops"], x["mib_s"], x["disk_iops"],
                      x["disk_bps"] / 1e6)
                   for x in (c["ceilings"][n][w] for w in WORKLOADS)]
            for n in NAMES if n in c["ceilings"]]
    never = th.get("never_on_disk") or []
    seq = ("sequential runs move %d MiB, timed to the last completion"
           % c["seq_mib"] if c.get("seq_mib") else
           "sequential runs timed too, which leaves up to 16 MiB in "
           "flight uncounted by fio: their MiB/s are understated, the "
           "more so the slower the backend (the disk's figures count "
           "everything)")
    return ["### The ceilings the limits come from\n",
            "Unthrottled RAM-backed disks, the same rig, one %d s run "
            "each (%s): what the emulated CPU allows, and what each run "
            "asked of its disk. The limits are %d%% of the least of those "
            "demands (in requests, or in bytes at %d bytes per request: "
            "the SSD's proportion), set by %s: no backend can pass a "
            "quarter of its ceiling.%s\n"
            % (c["runtime_s"], seq, th["share"] * 100, th["bytes_per_iops"],
               th["set_by"], " Never on the disk (all from caches, so "
               "not bound by it): %s." % ", ".join(never) if never else ""),
            _table(["backend"] + WORKLOADS, rows)]


def _ratio_table(d):
    rows = []
    for name in ("zvolstd_vs_vhd", "raw_vs_vhd", "zvol_vs_raw",
                 "zvol_vs_ext4_vhd", "zvol16k_vs_zvol", "zvol8k_vs_zvol",
                 "zvol4k_vs_zvol",
                 "zvoltput_vs_zvol", "zvoltput_vs_vhd"):
        for snap in (False, True):
            values = [_ratio(d, name, w, snap) for w in WORKLOADS]
            if any(values):     # a pair not run: no row
                rows.append([RATIO_TEXT[name], "yes" if snap else "no"] +
                            [_x(v) if v else "-" for v in values])
    return _table(["ratio", "snapshot"] + WORKLOADS, rows)


def _penalty_rows(d):
    pen = dict(((p["backend"], p["workload"]), p["with_over_without"])
               for p in d["snapshot_penalty"])
    return [[n] + ["%.2f" % pen[(n, w)] if (n, w) in pen else "-"
                   for w in WORKLOADS] for n in NAMES
            if any((n, w) in pen for w in WORKLOADS)]


def _every_row(d):
    rows = []
    for w in WORKLOADS:
        for snap in (False, True):
            for n in NAMES:
                runs = _pick(d["launch_runs"], backend=n, workload=w,
                             snapshot=snap)
                if not runs:
                    continue
                rows.append([
                    w, "yes" if snap else "no", n,
                    _s(m["iops"] for m in runs),
                    _s((m["mib_s"] for m in runs), "%.2f"),
                    _s((m["disk_util"] for m in runs), "%.2f"),
                    _s((m["disk_read_per_byte"] for m in runs), "%.2f"),
                    _s((m["disk_written_per_byte"] for m in runs), "%.2f"),
                    _s((m["cpu_busy"] for m in runs), "%.2f"),
                    "%d/%d" % (sum(m["arc_hits"] for m in runs),
                               sum(m["arc_misses"] for m in runs))])
    return rows


def _scaling_rows(d):
    rows = []
    for w in WORKLOADS:
        by_n = dict((n, _pick(d["scaling"], workload=w, vdis=n))
                    for n in (1, 2, 4))
        if not by_n[1]:
            continue
        one = dict((m["run"], m["iops"]) for m in by_n[1])
        gain = [m["iops"] / one[m["run"]] for m in by_n[4]
                if one.get(m["run"])]
        even = [min(m["per_target_iops"]) * 4 / m["iops"] for m in by_n[4]
                if m["iops"]]
        per_byte = [_pair(by_n[1], by_n[4], key)
                    for key in ("disk_read_per_byte",
                                "disk_written_per_byte")]
        rows.append([w] + [_rate(by_n[n], w) for n in (1, 2, 4)]
                    + [_s(gain, "%.2f"), _s(even, "%.2f"),
                       _s((m["disk_util"] for m in by_n[4]), "%.2f")]
                    + per_byte)
    return rows


def _layout_rows(d):
    rows = []
    layouts = []
    for m in d["layouts"]:
        if m["layout"] not in layouts:
            layouts.append(m["layout"])
    for lay in layouts:
        for w in WORKLOADS:
            z = _pick(d["layouts"], layout=lay, workload=w, kind="zfs")
            m = _pick(d["layouts"], layout=lay, workload=w, kind="md")
            md_iops = dict((r["run"], r["iops"]) for r in m)
            ratio = [r["iops"] / md_iops[r["run"]] for r in z
                     if md_iops.get(r["run"])]
            raid = m[0]["raid"] if m else "?"
            both = [_pair(z, m, key)
                    for key in ("disk_util", "disk_read_per_byte",
                                "disk_written_per_byte")]
            rows.append(["%s / RAID %s" % (lay, raid), w, _rate(z, w),
                         _rate(m, w), _s(ratio, "%.2f")] + both)
    return rows


def _plot(d, out):
    return plot_ratios(d, out, ["zvol_vs_vhd", "zvolstd_vs_vhd", "raw_vs_vhd",
                                "zvol_vs_ext4_vhd"],
                       "Disk-bound ratios through tapdisk", "disk-bound.png",
                       targets=d["targets"])
