"""The fake host's changed block tracking: guest writes, zfs send, zdb.

``Streams``, a mixin of ``FakeZfs``: what a guest writes or discards
(``write``, ``guest_write``, ``guest_free``: each zvol keeps the birth txg
of every block), ``zfs send`` as a real record stream read through the
runner's ``stream``, and ``zdb`` (``-l`` labels, ``-dddd`` and
``-ddddd`` a zvol's data object); then the stream records themselves
(``_record``, ``_free``) and ``_Reader``, the pipe a stream is read from.
"""

import json
import os
import struct

from zfsng import errors

from .model import KiB, CommandError, _Unknown, _head, nicenum


class Streams(object):
    """Guest I/O, block births, zfs send streams and zdb."""

    # --- a guest's writes and discards -------------------------------------

    def write(self, name, nbytes, overwrite=0):
        """A guest writes nbytes of new data, and overwrites overwrite
        bytes of existing data (kept by the newest snapshot, if any)."""
        pool, ds = self._lookup(name)
        self._check_space(pool, name, nbytes, ds)
        ds.refer += nbytes
        if overwrite:
            snaps = self._snapshots(pool, ds.name)
            if snaps:
                snaps[-1].unique += overwrite
            ds.from_origin = max(0, ds.from_origin - overwrite)

    def guest_write(self, name, offset, length):
        """A guest writes (non-zero data) to bytes offset..offset+length of
        zvol name: every volblocksize block it touches is born in a new
        txg, as ZFS writes whole blocks. Used space grows by the blocks
        that held no data."""
        pool, ds = self._zvol(name)
        first, last = self._block_range(ds, offset, length)
        fresh = [b for b in range(first, last + 1)
                 if not ds.blocks.get(b, (0, False))[1]]
        self._check_space(pool, name, len(fresh) * ds.volblocksize, ds)
        pool.txg += 1
        for blkid in range(first, last + 1):
            ds.blocks[blkid] = (pool.txg, True)
        ds.maxblkid = max(ds.maxblkid, last)
        ds.dnode_txg = pool.txg
        ds.refer += len(fresh) * ds.volblocksize

    def guest_free(self, name, offset, length):
        """A guest discards bytes offset..offset+length of zvol name
        (zvol_discard: dmu_free_long_range). Whole blocks holding data or
        written before become holes born in a new txg; a block never
        written stays a hole without birth time; the partly covered
        blocks at either end are zeroed in place: rewritten. maxblkid
        does not shrink (only a truncation would)."""
        pool, ds = self._zvol(name)
        block = ds.volblocksize
        first, last = self._block_range(ds, offset, length)
        pool.txg += 1
        for blkid in range(first, last + 1):
            whole = offset <= blkid * block and \
                (blkid + 1) * block <= offset + length
            birth, data = ds.blocks.get(blkid, (None, False))
            if birth is None:
                continue
            if whole:
                ds.blocks[blkid] = (pool.txg, False)
                ds.refer -= block if data else 0
            elif data:
                ds.blocks[blkid] = (pool.txg, True)
        ds.dnode_txg = pool.txg

    def _rangecopy(self, argv):
        """``python3 -m zfsng.rangecopy -- <source> <target>``, the ranges
        as JSON on stdin: every block of target the ranges touch is
        rewritten in one txg. It holds data if it did and was not wholly
        covered, or if source has data in the covered part; else it is a
        hole born now where target had a block (a zero write over
        compression), nothing where it had none."""
        if len(argv) != 6 or argv[3] != "--":
            raise _Unknown()
        pool, src = self._zvol(argv[4])
        _, dst = self._zvol(argv[5])
        ranges = json.loads(self.stdin)
        pool.txg += 1
        touched = {}
        for offset, end in ranges:
            for blkid in range(offset // dst.volblocksize,
                               (end - 1) // dst.volblocksize + 1):
                start = blkid * dst.volblocksize
                lo, hi = max(offset, start), min(end, start +
                                                 dst.volblocksize)
                cover, data = touched.get(blkid, (0, False))
                touched[blkid] = (cover + hi - lo,
                                  data or self._has_data(src, lo, hi))
        for blkid, (cover, data) in touched.items():
            old = dst.blocks.get(blkid)
            data = data or (cover < dst.volblocksize and old and old[1])
            if data:
                dst.refer += 0 if old and old[1] else dst.volblocksize
                dst.blocks[blkid] = (pool.txg, True)
                dst.maxblkid = max(dst.maxblkid, blkid)
            elif old is not None:
                dst.refer -= dst.volblocksize if old[1] else 0
                dst.blocks[blkid] = (pool.txg, False)
        dst.dnode_txg = pool.txg
        return "%d\n" % sum(e - o for o, e in ranges)

    @staticmethod
    def _has_data(ds, lo, hi):
        return any(ds.blocks.get(b, (0, False))[1] for b in
                   range(lo // ds.volblocksize,
                         (hi - 1) // ds.volblocksize + 1))

    def _zvol(self, name):
        pool, ds = self._lookup(name)
        assert ds.kind == "volume", "a guest writes to zvols: %s" % name
        return pool, ds

    @staticmethod
    def _block_range(ds, offset, length):
        assert length > 0 and 0 <= offset and \
            offset + length <= ds.volsize, (offset, length, ds.volsize)
        return offset // ds.volblocksize, \
            (offset + length - 1) // ds.volblocksize

    @staticmethod
    def _copy_data(source, ds):
        """A snapshot or clone starts with its source's blocks."""
        ds.blocks = dict(source.blocks)
        ds.maxblkid, ds.dnode_txg = source.maxblkid, source.dnode_txg

    # --- changed block tracking: zfs send, zdb -------------------------------

    # zfs send

    def stream(self, argv, consume, bound=None):
        """The runner's stream(argv, consume): the command's stdout (bytes)
        is read by consume(read); returns (Result, consume's value), as
        runner.SubprocessRunner.stream does. Only ``zfs send`` and ``zdb
        -ddddd`` write a stream. A failed command writes nothing: consume's
        StorageError over the empty stream gives way to the command's
        Result. The bound asked for is kept in ``bounds`` (argv, bound)."""
        self.calls.append(list(argv))
        self.bounds = getattr(self, "bounds", []) + [(list(argv), bound)]
        self._sending = _Reader([])
        try:
            result = self._run(list(argv))
            reader = self._sending if result.rc == 0 else _Reader([])
        finally:
            self._sending = None
        try:
            value = consume(reader.read)
        except errors.StorageError:
            if result.rc == 0:
                raise
            return result, None
        return result, value

    def _zfs_send(self, argv):
        """``zfs send -L [-e -c] [-i <from>] <snapshot>`` (zfs_send_one): an
        incremental stream (a full one without -i: from txg 0) of the data object (object 1) in OpenZFS's
        record layout, little-endian. What it holds, as OpenZFS 2.1 and
        2.3 send it (traverse_visitbp, send_holes_without_birth_time=1):
        the blocks born after from's txg, walked down the block tree
        (indirect blocks of 1024 pointers, 3 pointers in the dnode): a
        data block is a WRITE of one block, a hole born after from a FREE,
        and under every indirect block walked, a never-written subtree a
        FREE of its whole span; then, once the dnode changed, the FREE
        from (maxblkid + 1) * volblocksize to the object's end. FREEs
        that touch are one record. Not modelled: indirect blocks turned
        into holes by a discard of their whole span (ZFS then sends one
        FREE of the span; here, one per block), embedded and compressed
        records (-e -c change the payloads, never the ranges), and any
        object but the data object."""
        if getattr(self, "_sending", None) is None:
            raise _Unknown()    # a send stream is never read as text
        opts, args = self._getopt(argv, 2, "Leci:")
        flags = dict(opts)
        if sorted(flags) not in (["L", "c", "e", "i"], ["L", "c", "e"],
                                 ["L", "i"], ["L"]) or len(args) != 1:
            raise _Unknown()
        if "i" not in flags:       # a full stream: everything born since 0
            pool, to = self._lookup(args[0])
            if to.kind != "snapshot":
                raise _Unknown()
            self._sending = _Reader(self._send_records(to, 0))
            return ""
        base, target = flags["i"], args[0]
        if "@" not in target or ("@" not in base and "#" not in base) or \
                base[0] in "@#":
            raise _Unknown()
        pool, to = self._lookup(target)
        errprefix = "warning: cannot send '%s'" % target
        if "@" in base:
            _, start = self._lookup(base)
        else:
            start = pool.datasets.get(base)
            if start is None or start.kind != "bookmark":
                raise CommandError("%s: incremental source (%s) does not "
                                   "exist" % (errprefix, base))
        if not self._is_before(pool, start, to):
            raise CommandError("%s: not an earlier snapshot from the same "
                               "fs" % errprefix)
        self._sending = _Reader(self._send_records(to, start.createtxg))
        return ""

    def _is_before(self, pool, earlier, later):
        """snapshot_is_before() (and the kernel's check of a bookmark):
        earlier is older and in later's history: its zvol, or the origin
        of its zvol (before the clone's origin), recursively."""
        if earlier.createtxg >= later.createtxg:
            return False
        head = pool.datasets.get(_head(later.name))
        while head is not None:
            if _head(earlier.name) == head.name:
                return True
            if not head.origin or head.origin not in pool.datasets:
                return False
            origin = pool.datasets[head.origin]
            if earlier.createtxg > origin.createtxg:
                return False
            head = pool.datasets.get(_head(origin.name))
        return False

    def _send_records(self, to, fromtxg):
        """The records of the stream, as _Reader chunks."""
        block, fanout, top = to.volblocksize, 1024, 3
        yield _record(SEND_BEGIN, [(4, "I", 0), (8, "Q", SEND_MAGIC),
                                   (32, "Q", int(to.guid))])
        if to.dnode_txg > fromtxg:
            yield _record(SEND_OBJECT, [(8, "Q", 1), (16, "I", 23),
                                        (24, "I", block)])
            records = []
            levels = 1
            while top * fanout ** (levels - 1) <= to.maxblkid:
                levels += 1
            births = [dict((b, t) for b, (t, _) in to.blocks.items())]
            for level in range(1, levels):
                above = {}
                for blkid, birth in births[-1].items():
                    key = blkid // fanout
                    above[key] = max(above.get(key, 0), birth)
                births.append(above)

            def walk(level, index):
                birth = births[level].get(index)
                span = fanout ** level
                if birth is None:        # never written: a hole, birth 0
                    records.append(("free", index * span * block,
                                    span * block))
                elif birth > fromtxg and level == 0:
                    records.append(("write" if to.blocks[index][1] else
                                    "free", index * block, block))
                elif birth > fromtxg:
                    for child in range(index * fanout, (index + 1) * fanout):
                        walk(level - 1, child)

            for index in range(top):
                walk(levels - 1, index)
            tail = (to.maxblkid + 1) * block
            yield _record(SEND_FREE, [(8, "Q", 1), (16, "Q", tail),
                                      (24, "Q", SEND_END_OF_OBJECT)])
            pending = None
            for kind, offset, length in records:
                if kind == "free":
                    if pending and pending[1] == offset:
                        pending = (pending[0], offset + length)
                        continue
                    if pending:
                        yield _free(*pending)
                    pending = (offset, offset + length)
                    continue
                if pending:
                    yield _free(*pending)
                    pending = None
                yield _record(SEND_WRITE, [(8, "Q", 1), (16, "I", 23),
                                           (24, "Q", offset),
                                           (32, "Q", length)])
                yield length             # its payload
            if pending:
                yield _free(*pending)
            yield _record(SEND_FREEOBJECTS, [(8, "Q", 3), (16, "Q", 0)])
        yield _record(SEND_END, [(40, "Q", int(to.guid))])

    # zdb

    def _zdb(self, argv):
        """``zdb -l -- <device>``: the first label's pool facts and its
        top-level vdev's tree (its ashift)."""
        if argv[1:2] == ["-e"]:
            return self._zdb_objects(argv)
        if argv[1:3] != ["-l", "--"] or len(argv) != 4:
            raise _Unknown()
        dev = self._dev(argv[3])
        pools = [p for p in self.pools
                 if dev is not None and dev.label and
                 p.guid == dev.label["guid"]]
        if not pools:
            raise CommandError("failed to unpack label 0\nfailed to unpack "
                               "label 1\nfailed to unpack label 2\nfailed "
                               "to unpack label 3", rc=2)
        klass = dev.label.get("klass")
        if klass in ("cache", "spare"):
            # vdev_label_init(): an L2ARC or hot spare label holds only
            # its version, state (POOL_STATE_L2CACHE 4, _SPARE 3), guid;
            # zdb then prints a cache device's L2ARC header (OpenZFS 2.1)
            header = "" if klass == "spare" else (
                "------------------------------------\nL2ARC device header"
                "\n------------------------------------\n    magic: "
                "6504978260106102853\n    version: 1\n    pool_guid: %s\n"
                "    flags: 1\n\n" % pools[-1].guid)
            return ("------------------------------------\nLABEL 0\n"
                    "------------------------------------\n"
                    "    version: 5000\n    state: %d\n    guid: %s\n"
                    "    labels = 0 1 2 3 \n%s"
                    % (4 if klass == "cache" else 3, dev.label["leaf_guid"],
                       header))
        pool = pools[-1]
        state = {"ACTIVE": 0, "EXPORTED": 1}.get(pool.state, 2)
        hostid, hostname = self.hostid, self.hostname
        if pool.elsewhere and pool.state == "EXPORTED":
            state, (hostid, hostname) = 0, pool.elsewhere
        # the leaf's top-level vdev (spa_config_generate: a label holds
        # its top-level vdev's tree, with its ashift)
        tops = [(i, v) for i, v in enumerate(pool.vdevs)
                if any(leaf.guid == dev.label["leaf_guid"]
                       for leaf in v.leaves)]
        index, top = tops[0] if tops else (0, None)
        tree = "" if top is None else (
            "    vdev_children: %d\n    vdev_tree:\n        type: '%s'\n"
            "        id: %d\n        guid: %s\n        ashift: %d\n"
            "        is_log: %d\n"
            % (len([v for v in pool.vdevs
                    if v.klass not in ("cache", "spare")]),
               top.kind, index, top.guid or dev.label["leaf_guid"],
               top.ashift, 1 if top.klass == "log" else 0))
        return ("------------------------------------\nLABEL 0\n"
                "------------------------------------\n"
                "    version: 5000\n    name: '%s'\n    state: %d\n"
                "    txg: %d\n    pool_guid: %s\n    errata: 0\n"
                "    hostid: %d\n    hostname: '%s'\n"
                "    top_guid: %s\n    guid: %s\n%s"
                % (pool.name, state, pool.txg, pool.guid, hostid, hostname,
                   top.guid if top is not None and top.guid else
                   dev.label["leaf_guid"], dev.label["leaf_guid"], tree))

    def _zdb_objects(self, argv):
        """``zdb -e -p <dir>... -dddd <dataset> 1``: the data object of a
        zvol or snapshot, as zdb reads it from the pool's disks (dump_dnode
        at verbosity 4: its "dnode maxblkid" line); with ``-ddddd``
        (verbosity 5, read as a stream) its block tree too
        (``_indirect_blocks``)."""
        dirs, i = [], 2
        while argv[i:i + 1] == ["-p"] and i + 1 < len(argv):
            dirs.append(argv[i + 1])
            i += 2
        tree = argv[i:i + 1] == ["-ddddd"]
        if tree and getattr(self, "_sending", None) is None:
            raise _Unknown()    # printed to a stream only
        if argv[i:i + 1] not in (["-dddd"], ["-ddddd"]) or \
                len(argv) != i + 3 or argv[i + 2] != "1" or not dirs:
            raise _Unknown()
        name = argv[i + 1]
        pool = None
        for candidate in self.pools:
            if candidate.name == _head(name.split("/")[0]) and \
                    candidate.state == "ACTIVE":
                pool = candidate
        if pool is None or not [l for l in pool.leaves()
                                if os.path.dirname(l.path) in dirs]:
            raise CommandError("zdb: can't open '%s': No such file or "
                               "directory" % _head(name.split("/")[0]))
        ds = pool.datasets.get(name)
        if ds is None or ds.kind not in ("volume", "snapshot") or \
                ds.volblocksize is None:
            raise CommandError("failed to hold dataset '%s': No such file "
                               "or directory" % name, rc=2)
        text = ("Dataset %s [ZVOL], ID %d, cr_txg %d, %s, 2 objects\n\n"
                "    Object  lvl   iblk   dblk  dsize  dnsize  lsize   %%full"
                "  type\n"
                "%10d  %3d  %5s  %5s  %5s  %6s  %5s  %6s  zvol object\n"
                "\tdnode flags: USED_BYTES \n\tdnode maxblkid: %d\n\n"
                % (name, 100 + ds.createtxg, ds.createtxg, nicenum(ds.refer),
                   1, 1 if ds.maxblkid == 0 else 2, "128K",
                   nicenum(ds.volblocksize), nicenum(ds.refer), "512",
                   nicenum((ds.maxblkid + 1) * ds.volblocksize), "100.00",
                   ds.maxblkid))
        if not tree:
            return text
        self._sending = _Reader([(text + self._indirect_blocks(ds)).encode()])
        return ""

    def _indirect_blocks(self, ds):
        """zdb's dump_indirect of the data object (cmd/zdb/zdb.c,
        visit_indirect, snprintf_blkptr_compact at -ddddd): every block
        pointer with a birth, pre-order, indirect blocks of 1024 pointers
        and 3 in the dnode as _send_records walks them. An indirect
        block's birth is its newest child's, its fill the data blocks
        under it; one with none is a hole. Not modelled: embedded blocks
        (printed as EMBEDDED, fill 1) and gang blocks."""
        block, fanout, top = ds.volblocksize, 1024, 3
        levels = 1
        while top * fanout ** (levels - 1) <= ds.maxblkid:
            levels += 1
        tiers = [dict((b, (t, 1 if data else 0))
                      for b, (t, data) in ds.blocks.items())]
        for level in range(1, levels):
            above = {}
            for blkid, (birth, fill) in tiers[-1].items():
                old = above.get(blkid // fanout, (0, 0))
                above[blkid // fanout] = (max(old[0], birth), old[1] + fill)
            tiers.append(above)
        lines = ["Indirect blocks:"]

        def visit(level, index):
            if index not in tiers[level]:
                return              # birth 0: not printed
            birth, fill = tiers[level][index]
            marks = "".join("L%x" % level if l == level else " "
                            for l in range(levels - 1, -2, -1))
            size = block if level == 0 else 128 * KiB
            if fill:
                bp = "0:%x:%x %xL/%xP F=%d B=%d/%d cksum=%016x:0:0:0" % (
                    (index + 1) * 4096, 4096, size, 4096, fill, birth, birth,
                    index)
            else:
                bp = "0:0:0 %xL B=%d" % (size, birth)
            lines.append("%16x %s%s" % (index * fanout ** level * block,
                                        marks, bp))
            if level and fill:
                for child in range(index * fanout, (index + 1) * fanout):
                    visit(level - 1, child)

        for index in range(top):
            visit(levels - 1, index)
        return "\n".join(lines) + "\n\n"


# --- zfs send stream records (OpenZFS include/sys/zfs_ioctl.h) ----------------

SEND_HEADER = 312          # sizeof (dmu_replay_record_t)
SEND_MAGIC = 0x2F5BACBAC   # DMU_BACKUP_MAGIC
SEND_END_OF_OBJECT = (1 << 64) - 1
(SEND_BEGIN, SEND_OBJECT, SEND_FREEOBJECTS, SEND_WRITE, SEND_FREE,
 SEND_END) = range(6)


def _record(kind, fields):
    """A record's header, little-endian: drr_type, drr_payloadlen, then
    (offset, struct format, value) fields of the drr_u union."""
    hdr = bytearray(SEND_HEADER)
    struct.pack_into("<I", hdr, 0, kind)
    for at, fmt, value in fields:
        struct.pack_into("<" + fmt, hdr, at, value)
    return bytes(hdr)


def _free(offset, end):
    return _record(SEND_FREE, [(8, "Q", 1), (16, "Q", offset),
                               (24, "Q", end - offset)])


class _Reader(object):
    """A pipe's read(n) over chunks: bytes, or an int (that many bytes of
    payload, made as they are read)."""

    def __init__(self, chunks):
        self.chunks = iter(chunks)
        self.current = b""

    def read(self, n=-1):
        while not self.current:
            chunk = next(self.chunks, None)
            if chunk is None:
                return b""
            self.current = chunk
        if isinstance(self.current, int):
            take = self.current if n < 0 else min(n, self.current)
            self.current -= take
            return b"\xa5" * take
        take = self.current if n < 0 else self.current[:n]
        self.current = self.current[len(take):]
        return take
