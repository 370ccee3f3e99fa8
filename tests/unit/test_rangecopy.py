"""rangecopy: the process that copies a compose's ranges between zvols,
here between plain files standing for the zvols' devices."""

import io
import json
import os

import pytest

from zfsng import rangecopy, zvoldev

K = 1024


@pytest.fixture
def devices(tmp_path, monkeypatch):
    """Two 'zvols' src and dst: files of 64 KiB, every byte of src 0xAA
    but a zeroed 4 KiB at 8 KiB, every byte of dst 0x55."""
    paths = {"tank/src": str(tmp_path / "src"),
             "tank/dst": str(tmp_path / "dst")}
    data = bytearray(b"\xaa" * 64 * K)
    data[8 * K:12 * K] = b"\0" * 4 * K
    with open(paths["tank/src"], "wb") as f:
        f.write(bytes(data))
    with open(paths["tank/dst"], "wb") as f:
        f.write(b"\x55" * 64 * K)
    monkeypatch.setattr(zvoldev, "wait", lambda name: paths[name])
    return paths


def run_main(monkeypatch, ranges, argv=("--", "tank/src", "tank/dst")):
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(ranges)))
    return rangecopy.main(list(argv))


def test_only_the_ranges_are_copied_zeros_included(devices, monkeypatch,
                                                   capsys):
    assert run_main(monkeypatch, [[4 * K, 12 * K], [60 * K, 64 * K]]) == 0
    assert capsys.readouterr().out == "%d\n" % (12 * K)
    with open(devices["tank/dst"], "rb") as f:
        got = f.read()
    want = bytearray(b"\x55" * 64 * K)
    want[4 * K:8 * K] = b"\xaa" * 4 * K
    want[8 * K:12 * K] = b"\0" * 4 * K
    want[60 * K:] = b"\xaa" * 4 * K
    assert got == bytes(want)


def test_a_chunk_larger_than_the_copy_unit(devices, monkeypatch):
    monkeypatch.setattr(rangecopy, "CHUNK", 3 * K)
    assert run_main(monkeypatch, [[1 * K, 30 * K]]) == 0
    with open(devices["tank/src"], "rb") as s, \
            open(devices["tank/dst"], "rb") as d:
        assert d.read()[K:30 * K] == s.read()[K:30 * K]


@pytest.mark.parametrize("ranges", [[[5, 5]], [[-1, 4]], [[1]], {"a": 1},
                                    [[0, "9"]]])
def test_bad_ranges_copy_nothing(devices, monkeypatch, ranges):
    assert run_main(monkeypatch, ranges) == 1
    with open(devices["tank/dst"], "rb") as f:
        assert f.read() == b"\x55" * 64 * K


def test_a_range_past_the_source_fails(devices, monkeypatch):
    assert run_main(monkeypatch, [[60 * K, 70 * K]]) == 1


def test_usage(devices, monkeypatch):
    assert run_main(monkeypatch, [], argv=("tank/src", "tank/dst")) == 2
    assert os.path.getsize(devices["tank/dst"]) == 64 * K
