"""The disk-bound benchmark's arithmetic and run.sh's --throttle check.

The benchmark itself runs in the guest (make bench-disk-bound); what can
be wrong without a guest is here: the limits chosen from the ceilings,
the pairing of runs into ratios, and run.sh refusing limits it cannot
hand to QEMU before it starts anything.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))

import bench_disk_bound  # noqa: E402
import diskrig  # noqa: E402

MIB = 1024 * 1024


def demand(backend, workload, disk_iops, disk_bps):
    """A ceilings run: what it asked of the disk, per second."""
    return {"backend": backend, "workload": workload,
            "disk_iops": disk_iops, "disk_bps": disk_bps}


def test_limits_are_a_quarter_of_the_least_demand_in_ssd_proportion():
    per = diskrig.BYTES_PER_IOPS
    runs = [demand("tap-zvol", "randread-4k", 2000, 2000 * 16384),
            # bytes bind this one: 4 MiB requests, few of them
            demand("tap-zvol", "seqread-4M", 30, 100 * 1000 * 1000),
            # the least: 1200 requests, or 1200 * per bytes, a second
            demand("tap-vhd-file", "randwrite-4k", 1200, 1200 * per - 7)]
    got = diskrig.throttle_from(runs)
    assert got["iops"] == 300
    assert got["bps"] == 300 * per
    assert got["arg"] == "300:%d" % got["bps"]
    assert got["set_by"] == "tap-vhd-file randwrite-4k"
    # each run is held to at most a quarter of its demand, in one unit
    for r in runs:
        assert min(got["iops"] / float(r["disk_iops"]),
                   got["bps"] / float(r["disk_bps"])) <= 0.25 + 1e-9
    # the SSD's proportion: its rated sequential read bytes per random IOPS
    assert per == 560 * 1000 * 1000 // 98000


def test_a_run_that_never_reached_the_disk_is_named_not_counted():
    runs = [demand("tap-zvol", "randread-4k", 2000, 2000 * 16384),
            demand("tap-vhd-ext4", "seqread-4M", 0, 0)]
    got = diskrig.throttle_from(runs)
    assert got["iops"] == 2000 * 16384 // diskrig.BYTES_PER_IOPS // 4
    assert got["never_on_disk"] == ["tap-vhd-ext4 seqread-4M"]


@pytest.mark.parametrize("size", [64 * MIB, 256 * MIB])
def test_sequential_runs_start_apart_leaving_a_quarter_to_read(size):
    offsets = [diskrig.seq_offset(k, size) for k in range(7)]
    assert offsets[0] == 0
    assert len(set(offsets[:6])) == 6       # every run of a state apart
    assert offsets[6] == 0
    assert all(o % (4 * MIB) == 0 and o <= size * 3 // 4 - size // 8
               for o in offsets)


def run(backend, workload, snapshot, i, iops):
    return {"backend": backend, "workload": workload, "snapshot": snapshot,
            "run": i, "iops": iops}


def test_ratios_pair_run_i_with_run_i_of_the_same_state():
    runs = [run("tap-zvol", "randread-4k", False, 0, 100.0),
            run("tap-zvol", "randread-4k", False, 1, 300.0),
            run("tap-vhd-file", "randread-4k", False, 0, 10.0),
            run("tap-vhd-file", "randread-4k", False, 1, 100.0),
            run("tap-zvol", "randread-4k", True, 0, 50.0),
            run("tap-vhd-file", "randread-4k", True, 0, 25.0)]
    got = dict(((r["ratio"], r["snapshot"]), r["value"])
               for r in bench_disk_bound.ratios(runs))
    plain = got[("zvol_vs_vhd", False)]
    assert sorted(plain["runs"]) == [3.0, 10.0]
    assert plain["median"] == 6.5
    assert got[("zvol_vs_vhd", True)]["runs"] == [2.0]
    # no raw-file runs: no ratio made up for it
    assert ("raw_vs_vhd", False) not in got


def test_smaller_blocks_are_paired_with_zfs_ng_s_default():
    runs = [run("tap-zvol", "randwrite-4k", False, 0, 100.0),
            run("tap-zvol-4k", "randwrite-4k", False, 0, 250.0),
            run("tap-zvol-8k", "randwrite-4k", False, 1, 80.0)]
    got = dict((r["ratio"], r["value"])
               for r in bench_disk_bound.ratios(runs))
    assert got["zvol4k_vs_zvol"]["runs"] == [2.5]
    # run 1 of the 8K blocks has no run 1 of the default to pair with
    assert "zvol8k_vs_zvol" not in got


class _Ctx(object):
    backends = ["tap-zvol", "tap-zvol-2k"]


def test_launch_refuses_a_backend_it_does_not_know():
    with pytest.raises(ValueError) as err:
        bench_disk_bound.Launch(_Ctx(), MIB)
    assert "tap-zvol-2k" in str(err.value)
    assert "tap-zvol-4k" in str(err.value)      # what it does know


def test_snapshot_penalty_is_median_with_over_median_without():
    runs = [run("tap-zvol", "seqwrite-4M", False, i, v)
            for i, v in enumerate([10.0, 20.0, 30.0])]
    runs += [run("tap-zvol", "seqwrite-4M", True, i, v)
             for i, v in enumerate([5.0, 10.0, 40.0])]
    got = bench_disk_bound.snapshot_penalty(runs)
    assert got == [{"backend": "tap-zvol", "workload": "seqwrite-4M",
                    "with_over_without": 0.5}]


@pytest.mark.parametrize("value", ["500", "0:100", "500:", "a:b", "5:-1"])
def test_run_sh_refuses_a_throttle_qemu_cannot_take(value):
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "tests", "guest", "run.sh"),
         "--throttle", value, "--", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=30)
    assert proc.returncode == 2
    assert "--throttle wants IOPS:BYTES_PER_SECOND" in proc.stderr


def test_dirty_data_is_seconds_of_the_throttled_disk_within_bounds():
    assert diskrig.dirty_cap(None) == 32 * MIB        # unthrottled
    assert diskrig.dirty_cap(1685630) == 8 * MIB      # 4 s is 6.4 MiB
    assert diskrig.dirty_cap(3 * MIB) == 12 * MIB
    assert diskrig.dirty_cap(100 * MIB) == 32 * MIB


def _part_run(directory, throttle, **parts):
    os.makedirs(str(directory))
    section = {"throttle": throttle, "wall_s": 10.0, "failed_parts": [],
               "launch_runs": [], "scaling": [], "layouts": [],
               "cbt_list": [], "ratios": [], "snapshot_penalty": []}
    section.update(parts)
    with open(os.path.join(str(directory), "results.json"), "w") as f:
        json.dump({"conditions": {"runs": 3}, "disk-bound": section}, f)
    return str(directory)


def test_merge_takes_each_part_from_the_run_that_ran_it(tmp_path):
    import report
    limits = {"iops": 162, "bps": 925668}
    a = _part_run(tmp_path / "launch", limits,
                  launch_runs=[{"backend": "tap-zvol"}],
                  ratios=[{"ratio": "zvol_vs_vhd"}])
    b = _part_run(tmp_path / "scaling", limits, scaling=[{"vdis": 4}],
                  failed_parts=["layouts"])
    report.merge(str(tmp_path), [a, b])
    with open(os.path.join(str(tmp_path), "results.json")) as f:
        got = json.load(f)["disk-bound"]
    assert got["launch_runs"] == [{"backend": "tap-zvol"}]
    assert got["ratios"] == [{"ratio": "zvol_vs_vhd"}]
    assert got["scaling"] == [{"vdis": 4}]
    assert got["layouts"] == [] and got["failed_parts"] == ["layouts"]
    assert got["merged_from"] == ["launch", "scaling"]   # no host paths


def test_merge_carries_the_latency_part_and_its_ratios(tmp_path):
    import report
    limits = {"iops": 162, "bps": 925668}
    a = _part_run(tmp_path / "launch", limits,
                  launch_runs=[{"backend": "tap-zvol"}])
    b = _part_run(tmp_path / "latency", limits,
                  latency=[{"variant": "16k-latency"}],
                  latency_ratios=[{"volblocksize": "16k"}],
                  latency_size_mib=32, latency_runtime_s=10)
    report.merge(str(tmp_path), [a, b])
    with open(os.path.join(str(tmp_path), "results.json")) as f:
        got = json.load(f)["disk-bound"]
    assert got["latency"] == [{"variant": "16k-latency"}]
    assert got["latency_ratios"] == [{"volblocksize": "16k"}]
    assert (got["latency_size_mib"], got["latency_runtime_s"]) == (32, 10)
    assert got["launch_runs"] == [{"backend": "tap-zvol"}]


def lat(variant, workload, i, p50, p99, iops=10.0):
    """A latency part's run: fio's clat percentiles in microseconds."""
    return {"variant": variant, "workload": workload, "run": i,
            "p50": p50, "p99": p99, "iops": iops}


def test_latency_ratios_pair_throughput_with_latency_run_by_run():
    w = "syncwrite-4k-qd1"
    runs = [lat("16k-latency", w, 0, 1000.0, 4000.0),
            lat("16k-latency", w, 1, 2000.0, 4000.0),
            lat("16k-throughput", w, 0, 3000.0, 2000.0, iops=5.0),
            lat("16k-throughput", w, 1, 2000.0, 8000.0, iops=10.0),
            # another block size and workload never pair across
            lat("8k-latency", w, 0, 500.0, 500.0),
            lat("16k-latency", "syncwrite-64k-qd1", 0, 100.0, 100.0)]
    got = bench_disk_bound.latency_ratios(runs)
    assert len(got) == 1
    r = got[0]
    assert (r["volblocksize"], r["workload"]) == ("16k", w)
    assert sorted(r["p50"]["runs"]) == [1.0, 3.0]
    assert sorted(r["p99"]["runs"]) == [0.5, 2.0]
    assert sorted(r["iops"]["runs"]) == [0.5, 1.0]


def test_a_run_keeps_fio_s_completion_latency_in_microseconds():
    stats = {"runtime": 10000, "total_ios": 300, "io_bytes": 300 * 4096,
             "clat_ns": {"mean": 2500000.0,
                         "percentile": {"50.000000": 2000000,
                                        "99.000000": 9000000,
                                        "99.900000": 12000000}}}
    got = diskrig._job(stats)
    assert got["clat_us"] == {"p50": 2000.0, "p99": 9000.0, "mean": 2500.0}
    assert got["total_ios"] == 300
    # a read job of a write run (fio reports both sides) has no clat
    assert diskrig._job({"runtime": 0, "total_ios": 0,
                         "io_bytes": 0})["clat_us"] == {}


def test_merge_refuses_runs_under_different_limits(tmp_path):
    import report
    a = _part_run(tmp_path / "a", {"iops": 162, "bps": 925668})
    b = _part_run(tmp_path / "b", {"iops": 137, "bps": 782818})
    with pytest.raises(SystemExit) as err:
        report.merge(str(tmp_path), [a, b])
    assert "different limits" in str(err.value)


def _stat_line(in_flight):
    """A /sys/class/block/X/stat line: 17 fields, in_flight the 9th."""
    fields = [0] * 17
    fields[8] = in_flight
    return " ".join(str(f) for f in fields)


def test_runs_wait_until_the_last_run_s_requests_have_drained(
        tmp_path, monkeypatch):
    stat = str(tmp_path / "stat")
    # a prefetch draining, a gap between two of its requests, then idle
    seen = [3, 0, 2, 1, 0, 0, 0, 0]
    reads = []

    def read(path):
        assert path == stat
        reads.append(seen[len(reads)])
        return _stat_line(reads[-1])
    monkeypatch.setattr(diskrig, "_read", read)
    monkeypatch.setattr(diskrig.time, "sleep", lambda s: None)
    diskrig.wait_quiet([stat])
    assert reads == [3, 0, 2, 1, 0, 0]  # two idle polls in a row, then on


def test_a_disk_that_never_drains_costs_the_bound_and_no_more(
        tmp_path, monkeypatch):
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds
    monkeypatch.setattr(diskrig, "_read", lambda path: _stat_line(1))
    monkeypatch.setattr(diskrig.time, "time", lambda: clock[0])
    monkeypatch.setattr(diskrig.time, "sleep", sleep)
    assert diskrig.wait_quiet(["stat"], bound=30, poll=0.5) == 30.0


def _migrate_run(directory, date, version="zfs-2.3.2", **parts):
    os.makedirs(str(directory))
    section = {"data_bytes": 1, "block": 2, "wall_s": 10.0}
    section.update(parts)
    with open(os.path.join(str(directory), "results.json"), "w") as f:
        json.dump({"conditions": {"date": date, "zfs_version": version},
                   "migrate": section}, f)
    return str(directory)


def test_a_migrate_merge_keeps_the_parts_it_did_not_rerun(tmp_path):
    """The committed migrate results grow by the parts run since: the
    old run's parts stay, a part run again is taken from the later run,
    and each part says which run (date) it comes from."""
    import report
    old = _migrate_run(tmp_path / "old", "d1", by_size=[{"size": 1}],
                       plain_copy={"seconds": 2.0}, full=[{"rate": "idle"}])
    new = _migrate_run(tmp_path / "new", "d2", halted=[{"size": 3}],
                       snapshots=[{"size": 4}], by_size=[{"size": 5}],
                       parts=["by_size", "halted", "snapshots"])
    report.merge(str(tmp_path), [old, new])
    with open(os.path.join(str(tmp_path), "results.json")) as f:
        got = json.load(f)
    section = got["migrate"]
    assert section["plain_copy"] == {"seconds": 2.0}
    assert section["full"] == [{"rate": "idle"}]
    assert section["by_size"] == [{"size": 5}]
    assert section["halted"] == [{"size": 3}]
    assert section["snapshots"] == [{"size": 4}]
    assert section["parts_from"]["full"]["date"] == "d1"
    assert section["parts_from"]["halted"]["date"] == "d2"
    assert section["parts_from"]["halted"]["run"] == "new"
    assert got["conditions"]["date"] == "d1" and section["wall_s"] == 20.0


def test_the_mirrored_writes_table_says_the_guards_syncs(tmp_path):
    """The mirroring part merges like the others, and its table gives
    the guest's rate mirrored against alone and the guard's syncs."""
    import report
    mirroring = {"alone": {"bytes": 40 * MIB, "seconds": 20.0,
                           "slowest_s": 0.1},
                 "mirrored": {"bytes": 10 * MIB, "seconds": 20.0,
                              "slowest_s": 0.9},
                 "mirrored_bytes": 12 * MIB, "settles": 3,
                 "settle_seconds": 1.5, "window": 4 * MIB}
    earlier = {"run": "older", "date": "d0", "cpus": 1,
               "zfs_version": "zfs-2.3.2"}
    old = _migrate_run(tmp_path / "old", "d1", by_size=[{"size": 1}],
                       halted=[{"size": 2}],
                       parts_from={"halted": earlier})
    new = _migrate_run(tmp_path / "new", "d2", mirroring=mirroring,
                       parts=["mirroring"])
    report.merge(str(tmp_path), [old, new])
    with open(os.path.join(str(tmp_path), "results.json")) as f:
        section = json.load(f)["migrate"]
    assert section["mirroring"] == mirroring
    assert section["parts_from"]["mirroring"]["date"] == "d2"
    assert section["parts_from"]["by_size"]["date"] == "d1"
    assert section["parts_from"]["halted"] == earlier   # merged before
    text = "".join(report._while_mirrored(section["mirroring"]))
    assert "| mirrored | 0.50 | 0.25x | 12.0 | 3 | 0.50 | 0.90 |" in text
    assert "window of 4.0 MiB" in text


def test_a_migrate_merge_refuses_two_zfs_versions(tmp_path):
    import report
    a = _migrate_run(tmp_path / "a", "d1", by_size=[{"size": 1}])
    b = _migrate_run(tmp_path / "b", "d2", version="zfs-2.1.5",
                     halted=[{"size": 1}])
    with pytest.raises(SystemExit) as err:
        report.merge(str(tmp_path), [a, b])
    assert "different ZFS versions" in str(err.value)


def vrun(variant, workload, i, iops, read=1.0, written=1.0, p50=None):
    """A redundant or slog part's run."""
    m = {"variant": variant, "workload": workload, "run": i, "iops": iops,
         "disk_read_per_byte": read, "disk_written_per_byte": written}
    if p50 is not None:
        m["p50"] = p50
    return m


def test_pair_ratios_pair_run_i_with_run_i_and_skip_the_unpaired():
    w = "randwrite-4k"
    runs = [vrun("16k", w, 0, 10.0, written=8.0),
            vrun("16k", w, 1, 20.0, written=4.0),
            vrun("8k", w, 0, 30.0, written=2.0),
            vrun("8k", w, 1, 10.0, written=4.0),
            vrun("8k", w, 2, 99.0)]             # no run 2 of 16k
    got = bench_disk_bound.pair_ratios(runs, [("8k", "16k")])
    assert len(got) == 1
    r = got[0]
    assert r["of"] == ["8k", "16k"] and r["workload"] == w
    assert r["iops"]["runs"] == [3.0, 0.5]
    assert r["disk_written_per_byte"]["runs"] == [0.25, 1.0]
    assert "p50" not in r                       # neither run has one


def test_pair_ratios_leave_out_a_zero_denominator():
    w = "randread-4k"
    runs = [vrun("a", w, 0, 10.0, written=0.0, p50=200.0),
            vrun("b", w, 0, 5.0, written=0.0, p50=100.0)]
    got = bench_disk_bound.pair_ratios(runs, [("a", "b")])[0]
    assert got["iops"]["median"] == 2.0 and got["p50"]["median"] == 2.0
    assert "disk_written_per_byte" not in got


def test_rotated_puts_each_variant_first_in_turn():
    names = ["a", "b", "c", "d"]
    firsts = [bench_disk_bound.rotated(names, i)[0] for i in range(5)]
    assert firsts == ["a", "b", "c", "d", "a"]
    assert sorted(bench_disk_bound.rotated(names, 3)) == names


def test_variant_runs_never_run_a_target_twice_in_a_row(monkeypatch):
    order = []

    def measure(targets, size, workload, runtime_s, k, seq_bytes):
        order.append(targets[0])
        return {"clat_us": [{}]}
    monkeypatch.setattr(bench_disk_bound.diskrig, "measure", measure)
    monkeypatch.setattr(bench_disk_bound.common, "log", lambda *a: None)
    names = ["a", "b", "c", "d"]
    workloads = [("w%d" % n,) for n in range(3)]
    out = bench_disk_bound._variant_runs(
        dict((n, n) for n in names), names, dict((n, {}) for n in names),
        1, workloads, 1, 2, None, "part")
    assert len(order) == len(out) == 3 * 2 * 4
    assert all(x != y for x, y in zip(order, order[1:])), order
    for w in range(3):              # each run still has every target once
        for r in range(2):
            start = (w * 2 + r) * 4
            assert sorted(order[start:start + 4]) == names


def test_per_disk_tells_the_data_disk_from_the_log_device():
    before = [(0, 0, 0, 0), (5, 0, 5, 0)]
    after = [(10, 4096, 20, 8192), (5, 0, 105, 16384)]
    got = diskrig.per_disk(["/dev/disk/by-id/virtio-zfsng-d2",
                            "/dev/disk/by-id/virtio-zfsng-d3"],
                           before, after, 4096.0, 2.0)
    assert [p["disk"] for p in got] == ["virtio-zfsng-d2",
                                        "virtio-zfsng-d3"]
    assert got[0]["written_per_byte"] == 2.0
    assert got[0]["read_per_byte"] == 1.0
    assert got[1]["written_per_byte"] == 4.0 and got[1]["iops"] == 50.0


def test_report_renders_the_redundant_and_slog_parts(tmp_path):
    import report_disk_bound
    w = "randwrite-4k"
    disks = [{"disk": "d2", "read_per_byte": 0.5, "written_per_byte": 2.0,
              "iops": 1.0, "bps": 1.0, "util": 0.5},
             {"disk": "d3", "read_per_byte": 0.0, "written_per_byte": 6.0,
              "iops": 1.0, "bps": 1.0, "util": 1.0}]
    red = [dict(vrun(v, w, 0, x), disk_util=1.0, arc_mib_at_start=30.0,
                arc_hits=1, arc_misses=2, zfs_arc_max=512 * MIB)
           for v, x in (("16k", 10.0), ("8k", 25.0))]
    slog = [dict(vrun(v, w, 0, x, p50=1000.0), p99=9000.0, disk_util=1.0,
                 per_disk=disks[:n])
            for v, x, n in (("nolog-latency", 10.0, 1),
                            ("log-latency", 40.0, 2))]
    d = {"throttle": {"iops": 100, "bps": 571400}, "ssd": diskrig.SSD,
         "tuning": {"zfs_arc_max": 64 * MIB,
                    "zfs_dirty_data_max": 8 * MIB},
         "size_mib": 128, "runtime_s": 10, "runs": 1, "launch_runs": [],
         "scaling": [], "layouts": [], "redundant": red, "slog": slog,
         "redundant_ratios": bench_disk_bound.pair_ratios(
             red, [("8k", "16k")]),
         "slog_ratios": bench_disk_bound.pair_ratios(
             slog, [("log-latency", "nolog-latency")]),
         "defaults_size_mib": 48, "slog_size_mib": 32,
         "defaults_seq_mib": 8}
    text = "\n".join(report_disk_bound.render(d, str(tmp_path)))
    assert "raised to **512 MiB**" in text
    # the header's cap is the rig's, with the redundant part's beside it
    assert "capped at 64 MiB (512 MiB for the redundant part)," in text
    assert "| 8k / 16k | randwrite-4k | 2.50x (2.50-2.50) |" in text
    assert "| log-latency / nolog-latency | randwrite-4k | 4.00x" in text
    # the log device's column: 6.00 for the log pool, none without one
    assert "| 2.00 (2.00-2.00) | 0.50 (0.50-0.50) | 6.00 (6.00-6.00) |" \
        in text


def test_measure_drains_the_disks_before_it_drops_the_caches(monkeypatch):
    calls = []
    monkeypatch.setattr(diskrig, "stat_files", lambda disks: ["s"])
    monkeypatch.setattr(diskrig, "wait_quiet",
                        lambda stats: calls.append("quiet") or 1.0)
    monkeypatch.setattr(diskrig, "drop_caches",
                        lambda: calls.append("drop"))
    monkeypatch.setattr(diskrig, "arcstats", lambda: {"size": 0})
    monkeypatch.setattr(diskrig, "arc_data_counts", lambda: (0, 0))
    monkeypatch.setattr(diskrig, "disk_counts", lambda stats: (0, 0, 0, 0))
    monkeypatch.setattr(diskrig, "cpu_times", lambda: (0, 1))
    monkeypatch.setattr(diskrig, "fio_jobs", lambda *a: calls.append(
        "fio") or [{"runtime": 1000, "total_ios": 1, "io_bytes": 4096,
                    "clat_us": {}}])
    target = diskrig.Target("/dev/x", lambda: calls.append("sync"), ["d"])
    m = diskrig.measure([target], MIB, ("randread-4k", "randread", "4k", 1),
                        1)
    assert calls == ["quiet", "drop", "sync", "quiet", "fio"]
    assert m["quiet_wait_s"] == 2.0


def test_variant_targets_label_each_vdi_with_its_own_zvol(monkeypatch):
    class Vdi(object):
        def __init__(self, n):
            self.dev, self.vol = "/dev/td" + n, {"ds": "pool/sr/" + n}

    monkeypatch.setattr(bench_disk_bound.common, "volume_dataset",
                        lambda vol: vol["ds"])
    monkeypatch.setattr(bench_disk_bound.common, "run", lambda argv: (
        "volblocksize\t%s\nlogbias\tlatency\n"
        % ("8192" if argv[-1].endswith("8k") else "16384")))
    ctx = type("Ctx", (), {"pool": "bench"})()
    targets, props = bench_disk_bound._variant_targets(
        ctx, {"8k": ("sr1", Vdi("8k")), "16k": ("sr2", Vdi("16k"))})
    assert targets["8k"].path == "/dev/td8k"
    assert targets["16k"].dataset == "pool/sr/16k"
    assert targets["8k"].disks == [diskrig.disk(1)]
    assert props["8k"]["volblocksize"] == "8192"
    assert props["16k"] == {"volblocksize": "16384", "logbias": "latency"}


def test_arc_limits_are_the_rig_s_unless_the_experiment_sets_a_cap():
    assert diskrig.arc_limits({}) == (diskrig.ARC_MIN, diskrig.ARC_MAX)
    assert diskrig.arc_limits({"ZFSNG_BENCH_ARC_MAX_MIB": "256"}) == (
        diskrig.ARC_MIN, 256 * MIB)
    assert diskrig.arc_limits({"ZFSNG_BENCH_ARC_MAX_MIB": "module"}) is None


@pytest.mark.parametrize("env,written", [
    ("", {"zfs_arc_min": diskrig.ARC_MIN, "zfs_arc_max": diskrig.ARC_MAX}),
    ("module", {})])
def test_tune_leaves_the_module_s_arc_limits_when_the_experiment_asks(
        monkeypatch, env, written):
    """A memory-pressure experiment runs under the module's own ARC limits
    (ZFSNG_BENCH_ARC_MAX_MIB=module): tune() must not write them."""
    writes = {}
    monkeypatch.setenv("ZFSNG_BENCH_ARC_MAX_MIB", env)
    monkeypatch.setattr(diskrig, "_write",
                        lambda p, v: writes.__setitem__(p, v))
    monkeypatch.setattr(diskrig, "_read", lambda p: "1")
    diskrig.tune(1 << 20)
    arc = dict((os.path.basename(p), v) for p, v in writes.items()
               if "/zfs_arc_" in p)
    assert arc == written


@pytest.mark.parametrize("value", ["32", "1e3", "-128", "128M", " 128"])
def test_arc_limits_refuse_a_cap_below_the_rig_s_or_not_whole_mib(value):
    with pytest.raises(ValueError, match="ZFSNG_BENCH_ARC_MAX_MIB"):
        diskrig.arc_limits({"ZFSNG_BENCH_ARC_MAX_MIB": value})


@pytest.mark.parametrize("asked,ran", [
    (None, ["launch_runs", "latency"]),
    (["slog", "scaling"], ["scaling", "slog"]),
])
def test_only_launch_and_latency_run_unless_parts_are_named(
        monkeypatch, asked, ran):
    """make bench-disk-bound must fit its two hours: the parts that answered
    one question each (scaling, layouts, ...) run only when named."""
    called = []
    monkeypatch.setattr(diskrig, "limits", lambda *a: (100, 100 * MIB))
    monkeypatch.setattr(diskrig, "tune", lambda bps: {})
    monkeypatch.setattr(bench_disk_bound, "PARTS", [
        (name, lambda ctx, plan_, name=name: called.append(name) or [])
        for name, _ in bench_disk_bound.PARTS])

    class Ctx(object):
        quick, runs, parts = True, 1, asked
    got = bench_disk_bound.run(Ctx())
    assert called == ran
    assert got["failed_parts"] == []
