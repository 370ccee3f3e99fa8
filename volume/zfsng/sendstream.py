"""What changed in a zvol between two points, read from an incremental
``zfs send`` stream: the source of changed block tracking (``cbt``).

``zfs send -L -e -c -i <from> <to>`` (from: a snapshot or a bookmark of
the zvol) holds every block of the zvol's data object (object 1) born
after ``from``: DRR_WRITE and DRR_WRITE_EMBEDDED records for data,
DRR_FREE records for holes. ZFS's replication relies on it being complete
(a receiver applies it to its copy of ``from`` and must end with ``to``),
which is what makes it a source for CBT that never misses a change. Its
cost grows with the change: only blocks born after ``from`` are visited,
and only their headers are read here (payloads are skipped).

A FREE says "``to`` has a hole here", not "``from`` had data here". On
OpenZFS 2.1 and 2.3 streams carry FREEs that are no change:
- a FREE from the end of the last block the zvol ever had,
  ``(maxblkid + 1) * volblocksize``, to the end of the object (length
  UINT64_MAX), in every stream whose data object changed;
- FREEs for never-written holes under an indirect block the change
  rewrote (holes with no birth time: ``send_holes_without_birth_time``,
  on by default); on a sparse 16 TiB zvol, one 1 MiB write at 8 TiB
  brings a FREE of the 8 TiB before it.
So ``cbt`` counts a FREE as a change only where ``from`` may have held
data.

Record layout (OpenZFS include/sys/zfs_ioctl.h, dmu_replay_record_t): a
312-byte header (type, payload length, a union of the record kinds, a
checksum), then the record's payload; the stream is in the sender's byte
order, told by the BEGIN record's magic.
"""

import struct

from zfsng import blockmap, errors

HEADER = 312
MAGIC = 0x2F5BACBAC
END_OF_OBJECT = (1 << 64) - 1
DATA_OBJECT = 1          # a zvol's data (ZVOL_OBJ); 2 holds its size
(BEGIN, OBJECT, FREEOBJECTS, WRITE, FREE, END, WRITE_BYREF, SPILL,
 WRITE_EMBEDDED, OBJECT_RANGE, REDACT) = range(11)


def _round8(n):
    return (n + 7) // 8 * 8


def _payload(kind, hdr, order):
    """Bytes of payload that follow the header of a record."""
    u32 = lambda at: struct.unpack_from(order + "I", hdr, at)[0]  # noqa
    u64 = lambda at: struct.unpack_from(order + "Q", hdr, at)[0]  # noqa
    if kind == BEGIN:
        return u32(4)
    if kind == OBJECT:
        raw = u32(36)
        return raw if raw else _round8(u32(28))
    if kind == WRITE:
        return u64(96) if hdr[50] else u64(32)   # compressed or logical
    if kind == WRITE_EMBEDDED:
        return _round8(u32(52))
    if kind == SPILL:
        return u64(40) or u64(16)
    if kind in (FREEOBJECTS, FREE, END, WRITE_BYREF, OBJECT_RANGE, REDACT):
        return 0
    raise errors.InternalError("zfs send stream: unknown record type %d"
                               % kind)


def records(read):
    """(kind, header bytes, byte order) of every record, until END;
    read(n) returns up to n bytes (a pipe's read)."""
    order = None
    while True:
        hdr = _exactly(read, HEADER)
        if order is None:
            order = _byte_order(hdr)
        kind = struct.unpack_from(order + "I", hdr, 0)[0]
        _skip(read, _payload(kind, hdr, order))
        yield kind, hdr, order
        if kind == END:
            return


def _byte_order(hdr):
    for order in ("<", ">"):
        if struct.unpack_from(order + "I", hdr, 0)[0] == BEGIN and \
                struct.unpack_from(order + "Q", hdr, 8)[0] == MAGIC:
            return order
    raise errors.InternalError("not a zfs send stream (no BEGIN magic)")


def _exactly(read, n):
    data = b""
    while len(data) < n:
        chunk = read(n - len(data))
        if not chunk:
            raise errors.InternalError(
                "zfs send stream ended inside a record")
        data += chunk
    return data


def _skip(read, n):
    while n > 0:
        chunk = read(min(n, 1 << 20))
        if not chunk:
            raise errors.InternalError(
                "zfs send stream ended inside a payload")
        n -= len(chunk)


def extents(read):
    """(kind, offset, length) of the data object's WRITE and FREE records
    (WRITE_EMBEDDED counts as WRITE); length None: to the object's end."""
    for kind, hdr, order in records(read):
        if kind not in (WRITE, WRITE_EMBEDDED, FREE):
            continue
        obj, = struct.unpack_from(order + "Q", hdr, 8)
        if obj != DATA_OBJECT:
            continue
        if kind == WRITE:
            offset, length = struct.unpack_from(order + "QQ", hdr, 24)
            yield WRITE, offset, length
        else:
            offset, length = struct.unpack_from(order + "QQ", hdr, 16)
            yield (WRITE if kind == WRITE_EMBEDDED else FREE), offset, \
                (None if length == END_OF_OBJECT else length)


def writes_and_frees(read):
    """(writes, frees): the range sets of the data object's WRITE and FREE
    records; a FREE to the object's end ends at END_OF_OBJECT."""
    writes, frees = [], []
    for kind, offset, length in extents(read):
        end = END_OF_OBJECT if length is None else offset + length
        (frees if kind == FREE else writes).append((offset, end))
    return blockmap.normal(writes), blockmap.normal(frees)


def replay(read, write, free, chunk=1 << 20):
    """Replay the data object of a ``zfs send -L`` stream (no -c, no -e:
    every WRITE payload is the block's logical bytes), as it is read:
    write(offset, data) per WRITE, in pieces of at most chunk bytes, and
    free(offset, length) per FREE (length None: to the object's end).
    What a storage migration copies a snapshot, or the change between two,
    with: ZFS reads only the blocks the stream holds, and nothing is held
    in memory beyond one piece. Returns the bytes written."""
    order, written = None, 0
    while True:
        hdr = _exactly(read, HEADER)
        if order is None:
            order = _byte_order(hdr)
        kind = struct.unpack_from(order + "I", hdr, 0)[0]
        size = _payload(kind, hdr, order)
        obj = struct.unpack_from(order + "Q", hdr, 8)[0]
        if kind in (WRITE_EMBEDDED, WRITE_BYREF) or \
                (kind == WRITE and hdr[50]):
            raise errors.InternalError(
                "zfs send stream: an embedded, deduplicated or compressed "
                "record: the stream was not made with -L alone")
        if kind == WRITE and obj == DATA_OBJECT:
            offset = struct.unpack_from(order + "Q", hdr, 24)[0]
            for at in range(0, size, chunk):
                write(offset + at, _exactly(read, min(chunk, size - at)))
            written += size
            continue
        _skip(read, size)
        if kind == FREE and obj == DATA_OBJECT:
            offset, length = struct.unpack_from(order + "QQ", hdr, 16)
            free(offset, None if length == END_OF_OBJECT else length)
        elif kind == END:
            return written

