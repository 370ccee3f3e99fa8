"""What changed in a zvol since a txg, read from its block pointers'
birth times: the source of changed block tracking (``cbt``).

ZFS stamps every block pointer with the txg that wrote it (its logical
birth: a dedup hit, a clone of a block, a rewrite all get the txg of the
write). ``zdb -ddddd <pool>/<zvol>@<snap> 1`` prints the block tree of a
zvol's data object (cmd/zdb/zdb.c, dump_indirect): every block pointer
with a birth time, indirect blocks before their children. Only metadata
is read (the indirect blocks), never the data, so the cost grows with the
number of blocks the snapshot holds, not with the bytes changed.

One line per block pointer (OpenZFS 2.1 and 2.3 print it alike)::

    <offset, hex> L<level> <vdev>:<offset>:<asize> <lsize>L/<psize>P
        F=<fill> B=<birth>/<physical birth> cksum=...     (one line)
    <offset, hex> L<level> EMBEDDED et=<type> <lsize>L/<psize>P B=<birth>
    <offset, hex> L<level> 0:0:0 <lsize>L B=<birth>            (a hole)

Pointers with birth 0 (never-written holes) are not printed, and neither
are the children of a hole. So the L0 data lines are exactly where the
snapshot holds data: its allocation map, without over-statement.

Exactness. A block of ``to`` born at or before ``from``'s txg is the block
``from`` had at that offset (nothing wrote there since), so the changes
from ``from`` to ``to`` are: the L0 data blocks born after ``from``, and
the places where ``to`` has no data but ``from`` may have had some (the
caller's allocation map of ``from``). Hole births are not needed.

zdb ignores a failed read of an indirect block (dump_indirect goes on
without its children). Every block pointer carries its fill, the number
of data blocks under it (an L0's is 1, a hole's 0), so ``parse`` checks
that each indirect block's children add up to its fill: a subtree left
out fails the parse instead of going unnoticed.
"""

import re

from zfsng import errors

CHUNK = 1 << 20
_HEADER = b"Indirect blocks:"


# One block pointer line: offset, level, EMBEDDED, fill, birth (a hole
# has no fill: 0; an embedded block's is 1).
_LINE = (br"^ *([0-9a-f]+) +L([0-9a-f]+) +(?:(EMBEDDED) +et=\d+ +\S+|"
         br"\S+ +\S+(?: +F=(\d+))?) +B=(\d+)")


class _Tree(object):
    """The L0 ranges of one object, checked against the fills of the
    indirect blocks above them as the lines come (pre-order). Lines are
    taken a block of text at a time (one regular expression over it): a
    large zvol prints millions."""

    def __init__(self, fromtxg, block):
        self.fromtxg = fromtxg
        self.block = block
        self.stack = []      # [level, fill, children's fill]
        self.data = [[-1, -1]]   # L0 data ranges, in order, merged
        self.born = []       # the same, born after fromtxg

    def add(self, text):
        """The block pointer lines of text (whole lines, none empty)."""
        found = re.findall(_LINE, text, re.M)
        if len(found) != text.count(b"\n") + 1:
            bad = [l for l in text.split(b"\n") if not re.match(_LINE, l)]
            raise _malformed("unreadable", bad[0] if bad else text)
        fromtxg, block = self.fromtxg, self.block
        data, born, stack = self.data, self.born, self.stack
        top = stack[-1] if stack else None
        for offset, level, embedded, fill, birth in found:
            if level == b"0" and top is not None and top[0] == 1:
                if embedded or fill:        # a data block (the fast path)
                    top[2] += 1
                    start = int(offset, 16)
                    if data[-1][1] == start:
                        data[-1][1] = start + block
                    else:
                        data.append([start, start + block])
                    if int(birth) > fromtxg:
                        _append(born, start, start + block)
                continue
            level = int(level, 16)
            fill = 1 if embedded else int(fill or 0)
            self._close(level)
            if stack:
                if stack[-1][0] != level + 1:
                    raise _malformed("a level %d block under a level %d one"
                                     % (level, stack[-1][0]), offset)
                stack[-1][2] += fill
            if level > 0 and fill:
                stack.append([level, fill, 0])
            elif level == 0 and fill:
                start = int(offset, 16)
                _extend(data, start, start + block)
                if int(birth) > fromtxg:
                    _append(born, start, start + block)
            top = stack[-1] if stack else None

    def _close(self, level):
        while self.stack and self.stack[-1][0] <= level:
            frame = self.stack.pop()
            if frame[1] != frame[2]:
                raise errors.ZfsError(
                    "zdb left out blocks: a level %d block holds %d data "
                    "blocks, %d printed under it (a failed read?)"
                    % (frame[0], frame[1], frame[2]))

    def finish(self):
        self._close(1 << 30)
        return self.born, [(a, b) for a, b in self.data[1:]]


def _append(ranges, start, stop):
    if ranges and ranges[-1][1] == start:
        ranges[-1] = (ranges[-1][0], stop)
    else:
        ranges.append((start, stop))


def _extend(ranges, start, stop):
    """_append for the lists of lists of _Tree.data."""
    if ranges[-1][1] == start:
        ranges[-1][1] = stop
    else:
        ranges.append([start, stop])


def _malformed(why, line):
    return errors.ZfsError("zdb printed a block pointer line zfs-ng cannot "
                           "read (%s): %r" % (why, line[:200]))


def _blocks(tree, buf):
    """Hand tree the whole block pointer lines of buf; (state, what is
    left): "after" once the blank line that ends them is read."""
    blank = (b"\n" + buf).find(b"\n\n")     # at buf[blank]
    if blank >= 0:
        if blank > 1:
            tree.add(buf[:blank - 1])
        return "after", b""
    cut = buf.rfind(b"\n")
    if cut > 0:
        tree.add(buf[:cut])
    return "blocks", buf[cut + 1:] if cut >= 0 else buf


def parse(read, fromtxg, block):
    """(born, data) from zdb's output read by read(n): the range sets of
    the data object's L0 data blocks born after fromtxg, and of all of
    them; block is the volblocksize. The output is read as it comes (a
    large zvol prints millions of lines) and to its end (zdb must not
    block on a full pipe)."""
    tree = _Tree(fromtxg, block)
    state, buf = "header", b""     # then "blocks", then "after"
    while True:
        chunk = read(CHUNK)
        buf += chunk
        if state == "header":
            at = (b"\n" + buf).find(b"\n" + _HEADER + b"\n")
            if at >= 0:
                state, buf = "blocks", buf[at + len(_HEADER) + 1:]
            else:               # the header may straddle two reads
                buf = buf[-(len(_HEADER) + 2):]
        if state == "blocks":
            state, buf = _blocks(tree, buf)
        if state == "after":
            buf = b""           # the rest (segments) read to its end
        if not chunk:
            break
    if state != "after":
        raise errors.ZfsError("zdb printed no whole block tree (%s)"
                              % ("no 'Indirect blocks:'" if state == "header"
                                 else "it ended inside it"))
    return tree.finish()
