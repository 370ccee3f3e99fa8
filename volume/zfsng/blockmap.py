"""Sets of byte ranges of a disk, and how changed block tracking writes
them: the bitmap xapi expects, and the allocation map kept on the pool.

A range set is a sorted list of disjoint, non-adjacent ``(offset, end)``
pairs (bytes, end excluded). ``normal`` makes one from any ranges.

The bitmap, as xapi and Xen Orchestra read it (XenServer's CBT): one bit
per GRANULARITY bytes of the disk, the first block in the most significant
bit of the first byte (``01100000``: the second and third blocks changed),
base64 on the wire. xapi keeps only the bitmap (it drops the granularity
Volume.list_changed_blocks returns), so the granularity is fixed.

The allocation map (``encode_map``) is a range set that holds at least
every byte a snapshot has data in. It must fit in one ZFS user property:
when it does not, the smallest gaps are filled until it does. Filling a
gap only makes the map larger, which is safe: the map may over-state
what a snapshot holds, never under-state it (see ``cbt``).
"""

import base64
import zlib

from zfsng import errors

GRANULARITY = 64 * 1024
MAP_FORMAT = "1"


def normal(ranges):
    """The range set of ranges (any order, may overlap or touch)."""
    out = []
    for offset, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and offset <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((offset, end))
    return out


def union(a, b):
    return normal(list(a) + list(b))


def intersect(a, b):
    """The bytes in both range sets."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a, b):
    """The bytes of range set a that are not in range set b."""
    out, j = [], 0
    for offset, end in a:
        while j < len(b) and b[j][1] <= offset:
            j += 1
        k, start = j, offset
        while k < len(b) and b[k][0] < end:
            if b[k][0] > start:
                out.append((start, b[k][0]))
            start = max(start, b[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


def total(ranges):
    return sum(end - offset for offset, end in ranges)


# --- the bitmap xapi returns ---------------------------------------------------

def bitmap(ranges, size, granularity=GRANULARITY):
    """The bits of a disk of size bytes where every block touched by one of
    ranges (a range set) is set. Whole bytes of a long range are set at
    once: a range of terabytes costs no more than a slice."""
    blocks = (size + granularity - 1) // granularity
    bits = bytearray((blocks + 7) // 8)
    for offset, end in ranges:
        first = offset // granularity
        last = min((end - 1) // granularity, blocks - 1)   # inclusive
        if first > last:
            continue
        _set_bits(bits, first, last + 1)
    return bytes(bits)


def _set_bits(bits, first, stop):
    while first < stop and first % 8:
        bits[first // 8] |= 0x80 >> (first % 8)
        first += 1
    whole = (stop - first) // 8
    if whole:
        bits[first // 8:first // 8 + whole] = b"\xff" * whole
        first += whole * 8
    while first < stop:
        bits[first // 8] |= 0x80 >> (first % 8)
        first += 1


def blocks_in(ranges, granularity=GRANULARITY):
    """How many blocks a range set touches: from its ranges, never by
    walking a bitmap (a 16 TiB disk's has 256 Mi bits)."""
    count, last = 0, -1
    for offset, end in ranges:
        first, stop = max(offset // granularity, last + 1), \
            (end - 1) // granularity
        if stop >= first:
            count += stop - first + 1
            last = stop
    return count


# The whole-disk bitmap in base64, written piece by piece. A 16 TiB disk's
# bitmap is 32 MiB, 44 MB of base64: building it whole and then its JSON
# text took 7 passes over it, most of list_changed_blocks' time on a large
# disk. A piece covers CHUNK bytes of the bitmap (a multiple of 3, so that
# pieces join into one base64 text); a piece no range touches is one
# shared constant, so a sparse disk's answer costs its ranges, not its size.
CHUNK = 3 * 64 * 1024
_ZERO_PIECE = base64.b64encode(bytes(CHUNK))
_FULL_PIECE = base64.b64encode(b"\xff" * CHUNK)


def encoded_bitmap(ranges, size, granularity=GRANULARITY):
    """Yield the base64 of ``bitmap(ranges, size)`` as ASCII bytes pieces,
    without ever holding the whole bitmap or its text."""
    blocks = (size + granularity - 1) // granularity
    spans = _block_spans(ranges, blocks, granularity)
    length = (blocks + 7) // 8
    at = 0
    for first_byte in range(0, length, CHUNK):
        lo, hi = first_byte * 8, min(blocks, (first_byte + CHUNK) * 8)
        while at < len(spans) and spans[at][1] <= lo:
            at += 1
        inside = []
        for first, stop in spans[at:]:
            if first >= hi:
                break
            inside.append((max(first, lo) - lo, min(stop, hi) - lo))
        yield _piece(inside, min(CHUNK, length - first_byte))


def _block_spans(ranges, blocks, granularity):
    """The blocks ranges touch, as merged (first, stop) block spans."""
    spans = []
    for offset, end in ranges:
        first = offset // granularity
        stop = min((end - 1) // granularity + 1, blocks)
        if first >= stop:
            continue
        if spans and first <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(stop, spans[-1][1]))
        else:
            spans.append((first, stop))
    return spans


def _piece(inside, nbytes):
    """One piece: nbytes of bitmap with the blocks of the spans inside
    (relative to the piece) set."""
    if nbytes == CHUNK and not inside:
        return _ZERO_PIECE
    if nbytes == CHUNK and inside == [(0, CHUNK * 8)]:
        return _FULL_PIECE
    bits = bytearray(nbytes)
    for first, stop in inside:
        _set_bits(bits, first, stop)
    return base64.b64encode(bytes(bits))


# --- the allocation map kept on the pool -----------------------------------------

def encode_map(ranges, limit):
    """A range set as text of at most limit bytes: format, then the
    compressed varints of the gaps and lengths. Gaps are filled, the
    smallest first, until it fits (a larger map is still a true one)."""
    ranges = list(ranges)
    while True:
        text = "%s:%s" % (MAP_FORMAT, base64.b64encode(zlib.compress(
            _varints(ranges), 9)).decode("ascii"))
        if len(text) <= limit or len(ranges) <= 1:
            return text
        ranges = _coarser(ranges)


def _coarser(ranges):
    """ranges with the smallest half of its gaps filled."""
    gaps = sorted(ranges[i + 1][0] - ranges[i][1]
                  for i in range(len(ranges) - 1))
    cut = gaps[len(gaps) // 2]
    out = [ranges[0]]
    for offset, end in ranges[1:]:
        if offset - out[-1][1] <= cut:
            out[-1] = (out[-1][0], end)
        else:
            out.append((offset, end))
    return out


def decode_map(text):
    """The range set encode_map wrote; MetadataUnreadable otherwise."""
    try:
        fmt, _, data = text.partition(":")
        if fmt != MAP_FORMAT:
            raise ValueError("format %r" % fmt)
        numbers = _numbers(zlib.decompress(base64.b64decode(
            data.encode("ascii"), validate=True)))
    except (ValueError, TypeError, zlib.error) as exc:
        raise errors.MetadataUnreadable(
            "unreadable allocation map (%s)" % exc)
    if len(numbers) % 2:
        raise errors.MetadataUnreadable("allocation map: odd length")
    ranges, at = [], 0
    for i in range(0, len(numbers), 2):
        offset = at + numbers[i]
        at = offset + numbers[i + 1]
        ranges.append((offset, at))
    return normal(ranges)


def _varints(ranges):
    out, at = bytearray(), 0
    for offset, end in ranges:
        for number in (offset - at, end - offset):
            while number >= 0x80:
                out.append(0x80 | (number & 0x7f))
                number >>= 7
            out.append(number)
        at = end
    return bytes(out)


def _numbers(data):
    numbers, value, shift = [], 0, 0
    for byte in bytearray(data):
        value |= (byte & 0x7f) << shift
        shift += 7
        if not byte & 0x80:
            numbers.append(value)
            value, shift = 0, 0
    if shift:
        raise ValueError("truncated varint")
    return numbers
