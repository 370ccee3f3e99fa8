"""The VM fio benchmark's arithmetic and what it sends the domU.

The benchmark runs in the Xen guest (make bench-vm-fio); what can be
wrong without one is here: ratios paired per run (not ratios of
medians), the fio options each run sends through the domU's console (one
line of plain words, or the domU's shell would split them), and a
command refused before anything is sent.
"""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))

import bench_vm_fio  # noqa: E402
import domufio  # noqa: E402  (tests/xen, put on sys.path by bench_vm_fio)

MIB = 1024 * 1024
PLAN = {"size_bytes": 48 * MIB, "runtime_s": 10, "seq_bytes": 8 * MIB,
        "runs": 3}


def run(variant, workload, i, iops, read_per_byte=1.0):
    return {"variant": variant, "workload": workload, "run": i,
            "iops": iops, "mb_s": iops, "clat_p50_us": 1000.0 / iops,
            "clat_p99_us": 2000.0 / iops, "durable_iops": iops,
            "disk_read_per_byte": read_per_byte,
            "disk_written_per_byte": 0.0}


def test_ratios_are_the_median_of_per_run_ratios():
    w = "randread-4k-qd1"
    runs = [run("16k", w, 0, 100), run("8k", w, 0, 200),
            run("16k", w, 1, 50), run("8k", w, 1, 150),
            run("16k", w, 2, 200), run("8k", w, 2, 210)]
    got = bench_vm_fio.pair_ratios(runs)["8k/16k"][w]["iops"]
    # per run: 2.0, 3.0, 1.05; the ratio of medians would be 1.5
    assert got["median"] == pytest.approx(2.0)
    assert got["min"] == pytest.approx(1.05)
    assert got["max"] == pytest.approx(3.0)
    # no VHD ran: no pair against it
    assert set(bench_vm_fio.pair_ratios(runs)) == {"8k/16k"}


def test_a_zero_denominator_is_left_out_not_divided_by():
    w = "seqread-1M"
    runs = [run("16k", w, 0, 10), run("8k", w, 0, 10),
            run("16k", w, 1, 10), run("8k", w, 1, 10)]
    runs[0]["disk_written_per_byte"] = 0.0
    got = bench_vm_fio.pair_ratios(runs)["8k/16k"][w]
    assert "disk_written_per_byte" not in got
    assert got["iops"]["runs"] == [1.0, 1.0]


@pytest.mark.parametrize("workload", bench_vm_fio.WORKLOADS,
                         ids=[w[0] for w in bench_vm_fio.WORKLOADS])
def test_every_run_sends_plain_words_the_domu_can_split(workload):
    for k in range(4):
        options = bench_vm_fio.fio_options(workload, k, PLAN)
        assert all(bench_vm_fio.OPTION.match(o) for o in options), options
        assert "--direct=1" in options
        if workload[1].startswith("rand"):
            assert "--runtime=10" in options
        else:
            offset = int([o for o in options
                          if o.startswith("--offset=")][0].split("=")[1])
            size = int([o for o in options
                        if o.startswith("--size=")][0].split("=")[1])
            assert offset + size <= PLAN["size_bytes"]
        assert ("--end_fsync=1" in options) == ("write" in workload[1])


class FakePty(object):
    def __init__(self):
        self.sent = []

    def send(self, line):
        self.sent.append(line)


def test_a_command_with_a_shell_word_is_refused_before_it_is_sent():
    console = domufio.Console(None)
    console.pty = FakePty()
    with pytest.raises(ValueError):
        console.command(["fio", "tag", "xvdb", "--name=x;poweroff"])
    assert console.pty.sent == [] and console.sent == 0


def test_a_command_waits_for_the_domus_ready_line_of_its_turn():
    console = domufio.Console(None)
    console.pty = FakePty()
    waited = []
    console.wait_line = lambda match, timeout: waited.append(
        [match("ready 1"), match("ready 2"), match("ready 10")])
    console.command(["fio", "t", "xvdb", "--rw=read"])
    console.command(["end"])
    assert waited == [[True, False, False], [False, True, False]]
    assert console.pty.sent == ["fio t xvdb --rw=read", "end"]


def test_a_report_is_taken_only_if_its_sha256_matches():
    import hashlib
    body = '{"jobs": [{"read": {"total_ios": 3}}]}'
    sha = hashlib.sha256(body.encode()).hexdigest()
    assert domufio.verified(sha + " " + body)["jobs"][0]["read"] == \
        {"total_ios": 3}
    # a kernel message inside the line, or a character lost
    cut = body[:10] + "[  12.3] xen: msg" + body[10:]
    assert domufio.verified(sha + " " + cut) is None
    assert domufio.verified(sha + " " + body[:-1]) is None


def txg(state, nwritten, ndirty=8192, otime=0, stime=0):
    return {"state": state, "ndirty": ndirty, "nread": 0,
            "nwritten": nwritten, "reads": 0, "writes": 1, "otime": otime,
            "stime": stime}


def test_only_the_txgs_that_synced_during_the_run_are_counted():
    before = {"txgs": {"10": txg("C", 100), "11": txg("S", 0)},
              "zil": {"zil_commit_count": 5}}
    after = {"txgs": {"10": txg("C", 100), "11": txg("C", 300),
                      "12": txg("C", 700), "13": txg("O", 0)},
             "zil": {"zil_commit_count": 9}}
    got = bench_vm_fio.zfs_delta(before, after, 4096)
    assert got["txgs"]["count"] == 2
    assert got["txgs"]["nwritten"] == 1000
    assert got["zil"]["zil_commit_count"] == 4
    assert got["txgs"]["history_overrun"] is False


def test_a_runs_txgs_say_how_long_each_was_open_and_synced():
    """The open point of BENCHMARKS: what starts a small VDI's txgs before
    their timer; a txg open for 1.2 s, not 5, was started early."""
    before = {"txgs": {"10": txg("C", 100)}, "dmu_tx": {"dmu_tx_quota": 2}}
    after = {"txgs": {"10": txg("C", 100),
                      "11": txg("C", 300, otime=1000000000, stime=4e8),
                      "12": txg("C", 700, otime=1400000000, stime=6e8)},
             "dmu_tx": {"dmu_tx_quota": 9}}
    z = bench_vm_fio.zfs_delta(before, after, 8192)
    assert z["dmu_tx"] == {"dmu_tx_quota": 7}
    run = {"zfs": z, "bytes": 8192, "ios": 2, "disk_written_per_byte": 3.0,
           "disk_read_per_byte": 0.0}
    got = bench_vm_fio.breakdown_of(run)
    assert (got["open_ms"], got["sync_ms"]) == (1200.0, 500.0)
    del z["txgs"]["otime"]          # a result from before they were kept
    assert bench_vm_fio.breakdown_of(run)["open_ms"] is None


def test_txgs_kstat_is_read_by_its_header(tmp_path):
    path = tmp_path / "txgs"
    path.write_text(
        "18 0 0x01 3 336 1 2\n"
        "txg      birth            state ndirty       nread        "
        "nwritten     reads    writes   otime        qtime        wtime"
        "        stime\n"
        "7        2405345745       C     65536        0            "
        "143360       0        14       5000         10           20"
        "           30\n")
    got = bench_vm_fio._txgs(str(path))
    assert got == {"7": {"state": "C", "ndirty": 65536, "nread": 0,
                         "nwritten": 143360, "reads": 0, "writes": 14,
                         "otime": 5000, "qtime": 10, "wtime": 20,
                         "stime": 30}}


@pytest.mark.parametrize("version,want", [
    ("zfs-2.3.2-1\nzfs-kmod-2.3.2-1\n", "8k"), ("zfs-2.1.15-1\n", "16k"),
    ("zfs-2.3.2-1\nzfs-kmod-2.1.11-1\n", "16k"),   # the module runs
    ("", "16k")])
def test_the_default_variant_is_the_plugins_choice_for_one_disk(version,
                                                                want):
    assert bench_vm_fio.default_variant(version) == want


def test_the_default_is_paired_with_both_vhds():
    w = "randwrite-4k-qd1"
    runs = [run(v, w, 0, 10 * (i + 1)) for i, v in enumerate(
        ["16k", "vhd-file", "vhd-ext4"])]
    got = bench_vm_fio.pair_ratios(runs, default="16k")
    assert set(got) == {"16k/vhd-file", "16k/vhd-ext4"}
    assert got["16k/vhd-file"][w]["iops"]["median"] == pytest.approx(0.5)
