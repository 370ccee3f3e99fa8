"""blockbirth: zdb's block tree of a zvol read into (born, data).

The lines are in the format of cmd/zdb/zdb.c (print_indirect and
snprintf_blkptr_compact at -ddddd, OpenZFS 2.1 and 2.3): offset, level
marks, then the block pointer: data, EMBEDDED, or a hole.
"""

import pytest

from zfsng import blockbirth, errors

K = 1024
B = 16 * K
HEAD = (b"Dataset tank/v@s [ZVOL], ID 90, cr_txg 30, 10.0M, 2 objects\n\n"
        b"    Object  lvl   iblk   dblk  dsize  dnsize  lsize   %full  type\n"
        b"         1    2   128K    16K  10.0M     512    16M  100.00  zvol "
        b"object\n\tdnode flags: USED_BYTES\n\tdnode maxblkid: 1023\n\n")
TAIL = b"\n\t\tsegment [0000000000000000, 0000000000008000) size   32K\n"


def data(offset, level, birth, fill=1, size=B):
    marks = {1: b"L1  ", 0: b" L0 "}[level]
    return (b"%16x " % offset + marks +
            b"0:1a000:4000 %xL/4000P F=%d B=%d/%d cksum=0:0:0:0"
            % (size, fill, birth, birth))


def hole(offset, level, birth):
    marks = {1: b"L1  ", 0: b" L0 "}[level]
    return b"%16x " % offset + marks + b"0:0:0 %xL B=%d" % (B, birth)


def embedded(offset, birth):
    return (b"%16x " % offset + b" L0 EMBEDDED et=0 4000L/12P B=%d" % birth)


def output(*lines):
    return HEAD + b"Indirect blocks:\n" + b"\n".join(lines) + b"\n" + TAIL


def parse(text, fromtxg, chunk=None):
    pos = [0]

    def read(n):
        n = min(n, chunk or n)
        piece = text[pos[0]:pos[0] + n]
        pos[0] += len(piece)
        return piece
    return blockbirth.parse(read, fromtxg, B)


TREE = output(
    data(0, 1, 40, fill=4, size=128 * K),
    data(0, 0, 20),
    data(B, 0, 35),
    hole(2 * B, 0, 36),         # zeros over data, or a discard
    embedded(3 * B, 38),
    data(5 * B, 0, 12))


@pytest.mark.parametrize("chunk", [None, 1, 7, 100])
def test_born_and_data_whatever_the_reads(chunk):
    born, found = parse(TREE, 30, chunk)
    assert born == [(B, 2 * B), (3 * B, 4 * B)]
    assert found == [(0, 2 * B), (3 * B, 4 * B), (5 * B, 6 * B)]


def test_nothing_born_after_the_newest_block():
    born, found = parse(TREE, 40)
    assert born == [] and len(found) == 3


def test_a_subtree_zdb_left_out_fails_the_parse():
    """zdb goes on when it cannot read an indirect block: its fill tells."""
    text = output(data(0, 1, 40, fill=4, size=128 * K), data(0, 0, 20),
                  data(B, 0, 35), embedded(3 * B, 38))
    with pytest.raises(errors.ZfsError) as err:
        parse(text, 30)
    assert "left out" in str(err.value)


@pytest.mark.parametrize("text", [
    HEAD,                                           # no block tree
    HEAD + b"Indirect blocks:\n" + data(0, 0, 20),  # cut inside it
    output(b"               0  L0 what"),           # unreadable
    output(data(0, 0, 20), data(B, 1, 20, size=128 * K)),   # L1 under L0
])
def test_an_unexpected_output_fails_typed(text):
    with pytest.raises(errors.ZfsError):
        parse(text, 0)


def test_an_empty_zvol_has_no_data():
    assert parse(output(), 0) == ([], [])
