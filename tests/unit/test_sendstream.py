"""The zfs send stream reader and the CBT bitmap, on streams built record
by record as OpenZFS lays them out (dmu_replay_record_t)."""

import base64
import io
import random
import struct

import pytest

from zfsng import blockmap, errors, sendstream as ss

KiB, MiB = 1 << 10, 1 << 20


def record(kind, fields, order="<", payload=b""):
    """A 312-byte header: type, payload length, then (offset, format,
    value) fields of the union, and the payload after it."""
    hdr = bytearray(ss.HEADER)
    struct.pack_into(order + "I", hdr, 0, kind)
    for at, fmt, value in fields:
        struct.pack_into(order + fmt, hdr, at, value)
    return bytes(hdr) + payload


def begin(order="<", nvlist=b""):
    return record(ss.BEGIN, [(4, "I", len(nvlist)), (8, "Q", ss.MAGIC)],
                  order, nvlist)


def obj(number, bonuslen=0, order="<"):
    return record(ss.OBJECT, [(8, "Q", number), (24, "I", 16 * KiB),
                              (28, "I", bonuslen)], order,
                  b"\0" * ((bonuslen + 7) // 8 * 8))


def write(number, offset, length, compressed=0, order="<"):
    fields = [(8, "Q", number), (24, "Q", offset), (32, "Q", length)]
    if compressed:
        fields += [(50, "B", 2), (96, "Q", compressed)]
    return record(ss.WRITE, fields, order,
                  b"x" * (compressed or length))


def embedded(number, offset, length, psize=83, order="<"):
    return record(ss.WRITE_EMBEDDED,
                  [(8, "Q", number), (16, "Q", offset), (24, "Q", length),
                   (48, "I", length), (52, "I", psize)], order,
                  b"e" * ((psize + 7) // 8 * 8))


def free(number, offset, length, order="<"):
    return record(ss.FREE, [(8, "Q", number), (16, "Q", offset),
                            (24, "Q", length)], order)


def end(order="<"):
    return record(ss.END, [], order)


def stream(*parts):
    return io.BytesIO(b"".join(parts)).read


def test_extents_are_the_data_objects_writes_and_frees():
    read = stream(begin(nvlist=b"n" * 40), obj(1), free(1, 4 * MiB,
                                                         ss.END_OF_OBJECT),
                  free(1, 0, 16 * KiB), write(1, 96 * KiB, 16 * KiB),
                  write(1, 112 * KiB, 16 * KiB, compressed=300),
                  embedded(1, 128 * KiB, 16 * KiB), obj(2, bonuslen=3),
                  write(2, 0, 512), free(2, 512, ss.END_OF_OBJECT),
                  record(ss.FREEOBJECTS, [(8, "Q", 3)]), end())
    assert list(ss.extents(read)) == [
        (ss.FREE, 4 * MiB, None), (ss.FREE, 0, 16 * KiB),
        (ss.WRITE, 96 * KiB, 16 * KiB), (ss.WRITE, 112 * KiB, 16 * KiB),
        (ss.WRITE, 128 * KiB, 16 * KiB)]


def test_writes_and_frees_come_apart_as_range_sets():
    # what OpenZFS sent for: base data 0..1 MiB; then zeros over the
    # first block, a discard at 512 KiB, a write at 96 KiB, and a write
    # at 4 MiB that grew the object (never-written holes 1..4 MiB and the
    # free to the object's end come with it); object 2 (the zvol's size)
    # is no data
    read = stream(begin(), obj(1), free(1, 4 * MiB + 64 * KiB,
                                        ss.END_OF_OBJECT),
                  free(1, 0, 16 * KiB), write(1, 96 * KiB, 16 * KiB),
                  write(1, 112 * KiB, 16 * KiB),
                  free(1, 512 * KiB, 64 * KiB),
                  free(1, 1 * MiB, 3 * MiB + 64 * KiB),
                  write(2, 0, 8), embedded(1, 4 * MiB, 64 * KiB), end())
    writes, frees = ss.writes_and_frees(read)
    assert writes == [(96 * KiB, 128 * KiB), (4 * MiB, 4 * MiB + 64 * KiB)]
    # the never-written holes and the free to the end touch: one range
    assert frees == [(0, 16 * KiB), (512 * KiB, 576 * KiB),
                     (1 * MiB, ss.END_OF_OBJECT)]


def test_a_big_endian_stream_reads_the_same():
    parts = lambda o: stream(begin(o), obj(1, order=o),  # noqa: E731
                             write(1, 0, 16 * KiB, order=o),
                             free(1, 64 * KiB, 64 * KiB, order=o), end(o))
    assert list(ss.extents(parts(">"))) == list(ss.extents(parts("<")))


@pytest.mark.parametrize("data,why", [
    (b"", "ended inside a record"),
    (record(ss.WRITE, []), "no BEGIN magic"),
    (begin() + write(1, 0, 16 * KiB)[:400], "ended inside a payload"),
    (begin() + record(42, []), "unknown record type 42"),
])
def test_a_broken_stream_is_an_error_never_a_silent_answer(data, why):
    with pytest.raises(errors.InternalError) as err:
        list(ss.extents(io.BytesIO(data).read))
    assert why in str(err.value)


def test_the_bitmap_has_the_first_block_in_the_top_bit():
    bits = blockmap.bitmap([(64 * KiB, 192 * KiB)], 8 * 64 * KiB)
    assert bits == bytes([0b01100000])
    assert b"".join(blockmap.encoded_bitmap([(64 * KiB, 192 * KiB)],
                                            8 * 64 * KiB)) == \
        base64.b64encode(bits)


PIECE_BLOCKS = blockmap.CHUNK * 8     # blocks one piece of the base64 covers


@pytest.mark.parametrize("seed", range(200))
def test_the_streamed_bitmap_is_the_base64_of_the_whole_bitmap(seed):
    """Pieces join into exactly the base64 of bitmap(): across piece
    edges, in whole zero and whole full pieces, in a last short piece."""
    rnd = random.Random(seed)
    g = blockmap.GRANULARITY
    size = rnd.choice([1, g, PIECE_BLOCKS * g, 3 * PIECE_BLOCKS * g + 5,
                       rnd.randrange(1, 4 * PIECE_BLOCKS * g)])
    ranges = []
    for _ in range(rnd.randrange(6)):
        at = rnd.randrange(size + g)
        ranges.append((at, at + rnd.choice([1, g, 2 * PIECE_BLOCKS * g,
                                            rnd.randrange(1, size + 1)])))
    ranges = blockmap.normal(ranges)
    assert b"".join(blockmap.encoded_bitmap(ranges, size)) == \
        base64.b64encode(blockmap.bitmap(ranges, size))


def test_a_sparse_bitmap_shares_its_empty_pieces():
    """A 16 TiB disk's answer costs its ranges, not its 32 MiB bitmap:
    every whole piece no range touches is the one shared constant."""
    size = 16 << 40
    pieces = list(blockmap.encoded_bitmap([(0, MiB)], size))
    assert sum(map(len, pieces)) == 4 * ((size // blockmap.GRANULARITY
                                          // 8 + 2) // 3)
    assert len(set(map(id, pieces[1:-1]))) == 1     # the last is short


def test_the_bitmap_covers_the_disk_and_partial_blocks():
    size = 20 * 64 * KiB + 1            # 21 blocks: 3 bytes
    bits = blockmap.bitmap([(1, 2), (20 * 64 * KiB, size),
                       (9 * 64 * KiB - 1, 9 * 64 * KiB + 1)], size)
    assert bits == bytes([0b10000000, 0b11000000, 0b00001000])
    assert blockmap.bitmap([], 0) == b""


# --- replay: a migration's copy ----------------------------------------------

def data_write(number, offset, data, order="<"):
    return record(ss.WRITE, [(8, "Q", number), (24, "Q", offset),
                             (32, "Q", len(data))], order, data)


@pytest.mark.parametrize("order", ["<", ">"])
def test_replay_hands_over_the_data_objects_bytes_and_holes(order):
    one, two = bytes(random.getrandbits(8) for _ in range(40 * KiB)), \
        b"\x07" * (16 * KiB)
    stream = (begin(order) + obj(1, order=order) +
              data_write(1, 0, one, order) +
              data_write(2, 0, b"\x99" * 512, order) +     # not the zvol's
              free(1, 64 * KiB, 32 * KiB, order) +
              data_write(1, 128 * KiB, two, order) +
              free(1, 1 * MiB, ss.END_OF_OBJECT, order) + end(order))
    writes, frees = [], []
    written = ss.replay(io.BytesIO(stream).read,
                        lambda at, data: writes.append((at, data)),
                        lambda at, n: frees.append((at, n)), chunk=16 * KiB)
    assert written == len(one) + len(two)
    assert [(at, len(d)) for at, d in writes] == [
        (0, 16 * KiB), (16 * KiB, 16 * KiB), (32 * KiB, 8 * KiB),
        (128 * KiB, 16 * KiB)]
    assert b"".join(d for at, d in writes[:3]) == one
    assert writes[3][1] == two
    assert frees == [(64 * KiB, 32 * KiB), (1 * MiB, None)]


@pytest.mark.parametrize("record_", [
    lambda: write(1, 0, 16 * KiB, compressed=4 * KiB),
    lambda: embedded(1, 0, 16 * KiB),
])
def test_replay_refuses_a_stream_it_cannot_copy_exactly(record_):
    stream = begin() + obj(1) + record_() + end()
    with pytest.raises(errors.InternalError, match="not made with -L alone"):
        ss.replay(io.BytesIO(stream).read, lambda *a: None,
                  lambda *a: None)


def test_replay_of_a_cut_stream_is_an_error():
    stream = begin() + obj(1) + data_write(1, 0, b"z" * (16 * KiB))
    with pytest.raises(errors.InternalError, match="ended inside"):
        ss.replay(io.BytesIO(stream[:-100]).read, lambda *a: None,
                  lambda *a: None)
