"""Volume.compose: the disk a storage migration received, made whole.

xapi's receive side of a migration from a SMAPIv1 SR (xen-api
``storage_smapiv1_migrate.ml``: ``receive_start_common``,
``receive_finalize``) makes two VDIs here. The *leaf* is snapshotted at
once (the "dummy") and then written by the source's tapdisk mirror: the
guest's writes from then on. The *parent* gets a copy of a snapshot of
the source disk. Then xapi calls VDI.compose(parent, leaf), which
xapi-storage-script turns into Volume.compose(sr, key=leaf, key2=parent):
the leaf's writes go on top of the parent's data, and the leaf, keeping
its uuid, is the migrated VDI the VM runs on. The parent is no longer a
VDI afterwards, nor is the dummy (xapi then destroys the dummy and
ignores the error). xapi ignores a failed compose too, and starts the VM
on the leaf: the datapath refuses a leaf whose sink is still there
(ComposePending, zfsng_datapath/mirrorin.py), never serves it partial.

Sectors. The mirror writes whatever the guest writes, 512 bytes at
least. Written into the leaf's own zvol, a write smaller than a block
would leave the rest of that block as the leaf had it (zeros), and
nothing would tell which bytes the guest wrote. So the datapath's
Datapath.import_activate has the leaf's tapdisk write into the leaf's
*mirror sink*, ``<sr>/<leaf uuid>.in`` (``meta.is_sink``): a zvol of
512-byte blocks without compression, made empty for the mirror, inside a
filesystem whose quota bounds its space (``<sink>/writes``; a sink made
before the bound is the zvol itself: both are read the same). Every
sector written there is one block with a birth time, zeros too (with
compression on, ZFS would store an all-zero write as a hole without a
birth where nothing was: zio_write_compress). Discards are not carried:
tapdisk's mirror sends writes only, and ZFS keeps no trace of a block
written and freed within one transaction group, so a discarded sector
keeps the parent's data (a discard leaves its content undefined).

ZFS-native and exact, at the cost of the mirror's writes, never of the
disk's size: the sink's data blocks (``zdb``: metadata only; if zdb
fails, the WRITE records of a full ``zfs send`` of it, as cbt falls
back) are the byte ranges the guest wrote; those alone are copied from
the sink onto the parent's zvol (``rangecopy``); then the parent takes
the leaf's uuid, labels and name, and the leaf's zvol goes with the
dummy and the sink.

Steps, each one command, and what a crash after each leaves:
1. snapshot the sink's zvol, ``<zvol>@zfsng-compose`` (zdb reads what
   is on disk). It goes with the sink; an unbounded sink's, directly
   under the SR, is internal: the collector frees it if nothing follows.
2. read the written ranges (zdb, else a full send), copy them onto the
   parent, flushed, outside the SR lock (see compose). All three VDIs
   are still what they were; a compose called again copies again (the
   sink has not changed), xapi's receive_cancel destroys them (and the
   collector the sink, once its leaf is gone).
3. one ``zfs set`` on the parent: the leaf's uuid and labels, and
   COMPOSE_INTO. From here on the compose is finished forward
   (``collect.finish_compose``, run here at once, and by the collector of
   the next SR.attach, Volume.destroy or compose): the leaf's zvol and
   the sink are destroyed, the parent renamed to the leaf's name, the
   mark dropped. Meanwhile the parent is the leaf's VDI once the leaf's
   zvol is gone (``meta.is_composing``).
"""

from zfsng import blockmap, collect, contentid, errors, inventory, lock, \
    log, meta, rangecopy, runner, wire, zdb, zfs
from zfsng_volume import volume as vol

ZDB_RATE = 20000     # block pointers a second (as cbt reads them)
SEND_RATE = 20 << 20    # bytes a second, zdb's fallback (as cbt's)
LABELS = (meta.VDI_NAME, meta.VDI_DESCRIPTION, meta.VDI_KEYS,
          meta.VDI_SHARABLE)


@wire.method("Volume.compose")
def compose(dbg, sr, key, key2):
    """key: the leaf (xapi's child), key2: the parent.

    The SR lock is held to check and snapshot the sink, and again to
    check and commit, not while the written ranges are read and copied:
    that takes as long as the mirror's writes take to copy (minutes after
    a long migration), and every other call on the SR, VM starts among
    them, would wait. Meanwhile lock.reading keeps the collector off the
    sink's snapshot; a change to the three volumes in between fails the
    second check, before the commit."""
    held = meta.compose_snapshot(meta.sink_name(sr, key))
    with lock.reading(held):     # the snapshot's name in an unbounded sink
        with vol.locked(sr):
            _, parent, sink = _checked(sr, key, key2)
            snap = meta.compose_snapshot(sink["name"])
            if not zfs.exists(snap):
                zfs.snapshot(snap)
        ranges = _written(snap, sink)
        log.info("compose %s onto %s: %d bytes in %d ranges", sink["name"],
                 parent["name"], blockmap.total(ranges), len(ranges))
        rangecopy.copy(sink["name"], parent["name"], ranges)
        with vol.locked(sr):
            _commit(sr, snap, key, _checked(sr, key, key2))
    return None


def _checked(sr, key, key2):
    """(leaf, parent, sink) rows, once the three can be composed: a typed
    error, and nothing changed, otherwise. A compose cut short after its
    commit is finished first (then the pair is gone: Volume_does_not_exist,
    which xapi's retry takes as done)."""
    inventory.sr_row(sr)
    rows = inventory.rows(sr)
    if collect.needed(rows):
        collect.collect(sr, rows)
        rows = inventory.rows(sr)
    leaf, parent = _pair(sr, rows, key, key2)
    _check_leaf_snapshots(rows, leaf, key)
    return leaf, parent, _sink(sr, rows, leaf, key)


def _commit(sr, snap, key, rows):
    """One zfs set gives the parent the leaf's identity (see the steps
    above), once the snapshot the copy was made from is still there
    (DatasetNotFound otherwise: the next compose copies again)."""
    zfs.get_one(snap, ["name"])
    leaf, parent, _ = rows
    props = dict((k, leaf[k]) for k in LABELS if leaf.get(k) is not None)
    props.update({meta.VDI_UUID: key, meta.COMPOSE_INTO: key,
                  # its data changed: xapi's claim on either is stale
                  meta.CONTENT_ID: contentid.encode(contentid.fresh(), key)})
    zfs.set_props(parent["name"], props)
    parent = zfs.get_one(parent["name"], meta.VOLUME_COLUMNS)
    collect.finish_compose(parent, inventory.rows(sr))


def _pair(sr, rows, key, key2):
    """The leaf's and the parent's rows, once they are two live zvols
    compose can join: a typed error, and nothing changed, otherwise."""
    if key == key2:
        raise errors.InvalidArgument("Volume.compose: %s is both the child "
                                     "and the parent" % key)
    leaf, parent = vol.find_in(rows, key), vol.find_in(rows, key2)
    for row, uuid in ((leaf, key), (parent, key2)):
        if meta.is_snapshot(row) or meta.is_data_destroyed(row) or \
                row["name"] != meta.vdi_dataset(sr, uuid):
            raise errors.InvalidArgument(
                "Volume.compose: %s is not a disk (a snapshot, or a disk "
                "being reset or composed)" % uuid)
        if row.get(meta.CBT_ENABLED) == "true":
            raise errors.InvalidArgument(
                "Volume.compose: changed block tracking is on for %s: "
                "disable it first (xapi does not migrate such disks)" % uuid)
    if leaf["volsize"] != parent["volsize"]:
        raise errors.InvalidArgument(
            "Volume.compose: %s is %s bytes, its parent %s %s" % (
                key, leaf["volsize"], key2, parent["volsize"]))
    if any(meta.is_snapshot(r) and meta.parent_of(r["name"]) ==
           parent["name"] for r in rows):
        raise errors.InvalidArgument(
            "Volume.compose: the parent %s has snapshots; they would "
            "become the composed disk's" % key2)
    return leaf, parent


def _check_leaf_snapshots(rows, leaf, key):
    """The leaf's zvol goes with its snapshots: the dummy, no more (any
    other would be a VDI lost)."""
    mine = [r for r in rows if meta.is_snapshot(r) and
            meta.parent_of(r["name"]) == leaf["name"]]
    if len(mine) > 1 or any(meta.clones_of(r) or not meta.is_vdi(r)
                            for r in mine):
        raise errors.InvalidArgument(
            "Volume.compose: %s has snapshots other than the migration's "
            "one, or snapshots with clones; they would be lost" % key)


def _sink(sr, rows, leaf, key):
    """The row of the zvol of the leaf's mirror sink (either form), once
    it can be trusted to hold every sector the mirror wrote."""
    name = meta.sink_name(sr, key)
    found = [r for r in rows if r["name"] == name and meta.is_sink(r)]
    if not found:
        raise errors.InvalidArgument(
            "Volume.compose: %s received no mirror (no %s): only a disk "
            "a storage migration wrote through Datapath.import_activate "
            "can be composed" % (key, name))
    sink = found[0]
    if sink["type"] != "volume":
        name = meta.sink_volume(sink)
        try:
            sink = zfs.get_one(name, meta.VOLUME_COLUMNS, types="volume")
        except errors.DatasetNotFound:
            raise errors.InvalidArgument(
                "Volume.compose: %s received no mirror (no %s): only a "
                "disk a storage migration wrote through "
                "Datapath.import_activate can be composed" % (key, name))
    compression = zfs.zfs("get", "-Hp", "-o", "value", "compression", "--",
                          name).strip()
    if int(sink["volblocksize"]) > meta.SECTOR or compression != "off" or \
            sink["volsize"] != leaf["volsize"]:
        raise errors.InvalidArgument(
            "Volume.compose: %s is not a mirror sink compose can read "
            "(volblocksize %s, compression %s, %s bytes for a %s-byte "
            "disk)" % (name, sink["volblocksize"], compression,
                       sink["volsize"], leaf["volsize"]))
    return sink


def _written(snap, sink):
    """The range set of the sectors the mirror wrote into the sink (it
    started empty): its data blocks, within the disk, from zdb (metadata
    only), else from the WRITE records of a full send of the snapshot
    (its data read once), as cbt does. Without compression and with one
    block a sector, those are exactly the written sectors, zeros too. A
    zdb past its bound fails the call: a send would only take longer."""
    size, block = int(sink["volsize"]), int(sink["volblocksize"])
    try:
        _, data = zdb.born_since(0, snap, block,
                                 runner.allow(ZDB_RATE, size // block + 1))
    except errors.CommandTimeout:
        raise
    except errors.StorageError as exc:
        log.warning("zdb could not list the blocks of %s (%s): sending it "
                    "whole instead", snap, exc.message)
        data = zfs.send_data(snap, bound=runner.allow(SEND_RATE, size))
    return blockmap.intersect(data, [(0, size)])
