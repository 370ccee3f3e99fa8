"""Datapath.import_activate: where a storage migration into zfs-ng writes.

A migration from a SMAPIv1 SR (xen-api storage_smapiv1_migrate.ml): the
destination's receive_start_common creates the leaf VDI, snapshots it (the
"dummy"), attaches and activates it in the mirror's domain. Then xapi's
nbd_handler (storage_migrate.ml) calls DATA.import_activate, which
xapi-storage-script passes on as Datapath.import_activate(uri, domain)
only if this plugin's Plugin.Query lists VDI_MIRROR_IN, and sends the
source's connection, an fd, over SCM_RIGHTS to the unix socket path the
call returns. The leaf's tapdisk takes such fds on
``/var/run/blktap-control/nbdserver-new<pid>.<minor>`` (blktap 3.55.5,
tapdisk-nbdserver.c) and serves each as a new-style NBD connection: the
source tapdisk's mirror writes the guest's writes through it.

Where the writes go. Not into the leaf's own zvol: a write smaller than
its blocks would leave the rest of the block as the leaf had it, zeros,
and nothing could later tell the guest's bytes from them. So the call
makes the leaf's *mirror sink* (``meta.sink_name``: 512-byte blocks, one
per sector, no compression, so zeros are data too; marked with the
leaf's uuid) and has the leaf's tapdisk serve it instead: ``tap-ctl
pause``, then ``unpause -a aio:<the sink>``. Nothing has written the leaf
yet (the VM runs on the source). Volume.compose later puts the sink's
sectors on the parent the copy filled, and the leaf becomes the
migrated disk (zfsng_volume/compose.py).

Its bound. A 512-byte block takes a whole sector of the pool and a
block pointer: for 4 KiB writes, 7.5 times the bytes written on one
ashift=12 disk, 10 times on a 3-disk raidz1 (measured on OpenZFS 2.1 and
2.3; 1.07 times at ashift=9), and the mirror writes into it for the
whole move. A long move in of a busy VM could so fill the pool, and
every VM on it would get ENOSPC. ZFS bounds
a zvol's space only through the quota of a filesystem above it; so the
sink is a filesystem ``<sr>/<leaf uuid>.in`` with a quota, and the
zvol ``<sink>/writes`` inside (``meta.sink_volume``). The quota
(``bound``) is half the room the SR has when the move starts: its
``available``, which the refreservations of thick VDIs are out of
already (they are never at risk), less the quota the SR's other sinks
have not used yet (two moves in at once cannot pass it together). The
other half stays for the rest: thin VDIs growing, and the parent, which
xapi copies at the same time (this call is not told which VDI it is).
Not sized from the disk: the most a sink can take depends on the vdevs'
ashift and parity, and a quota reserves nothing, so a larger one costs
nothing. Not a watcher polling the sink's use: later than the quota, one
more process to bound, and nothing once it dies. Below MIN_BOUND the
call refuses (OutOfSpace) before anything is made, and the move fails at
its start. When the sink reaches its quota the zvol fails the mirror's
writes (EIO to tapdisk's aio: ZFS's EDQUOT has no block-layer status),
the leaf's tapdisk answers each with an NBD error, and the source's
tapdisk drops the mirror: the guest's write succeeds on the source
alone, and nbd_mirror_failed, which xapi reads before it moves the
memory, fails the move (MIRROR_FAILED); xapi's receive_cancel then
destroys the leaf, and the collector the sink. The source keeps every
write (measured on OpenZFS 2.1 and 2.3 through the real tapdisk:
tests/integration/test_migrate_from_v1.py).

Idempotent, and a crash anywhere is finished by the next call. The sink's
filesystem is made with its quota, ``compression=off``, ``canmount=off``
and the mark in one ``zfs create``; ZFS sets the quota (a special
property) in a sync task of its own before the others, which it sets
together: a marked sink is bounded. One a power cut left without its mark
(``meta.is_unfinished_sink``) is finished by the next call, or freed by
the collector once its leaf is gone. The zvol inside gets its
volblocksize with its creation and inherits compression and the mark: it
is whole from its first transaction group. A VBD left paused is unpaused
onto the sink. A sink whose leaf is destroyed (xapi's receive_cancel)
goes with it (the collector). A sink of the unbounded form a host
upgraded in the middle of a move finds, the zvol ``<sr>/<leaf uuid>.in``
itself, is served, composed and freed as before; an unmarked 512-byte
zvol by that name (a power cut inside its create, before the upgrade) is
made again in the bounded form.

Until the compose, the leaf's own zvol is empty: the guest's writes are
in the sink, the copied base on the parent. xapi calls the compose from a
hook that ignores its failure, then starts the VM on the leaf. So no VBD
but the mirror's own may attach or activate a leaf whose sink is still
there (``check_whole``, from datapath.py): a compose past its commit is
finished then, anything else is refused (ComposePending), never served.
"""

from zfsng import collect, errors, inventory, lock, log, meta, wire, zfs, \
    zvoldev
from zfsng_datapath import scope, state, tapctl, uri as urimod
from zfsng_datapath.errors import ComposePending, NotAttached

MIN_BOUND = 16 << 20
SINK_COLUMNS = ["name", "type", "used", "quota", meta.MIRROR_SINK]


@wire.method("Datapath.import_activate")
def import_activate(dbg, uri, domain):
    target = urimod.parse(uri)
    urimod.check_domain(domain)
    if target.snapshot is not None or urimod.is_dom0(domain):
        raise errors.InvalidArgument(
            "Datapath.import_activate: %s in domain %s is no disk a "
            "migration writes through tapdisk" % (uri, domain))
    with lock.held("datapath-" + target.head):
        st = state.load(target.dataset, domain)
        if not st or not st.get("active") or st.get("pid") is None:
            raise NotAttached("Datapath.import_activate: %s is not active "
                              "in domain %s on this host: Datapath.attach "
                              "and activate come first" % (uri, domain))
        sink = meta.sink_name(target.sr, target.head.rsplit("/", 1)[1])
        with lock.sr_lock(target.sr):
            leaf = scope.check(target)
            sink = _ensure_sink(target.sr, sink, leaf)
        zvoldev.wait(sink)
        _serve(st, zvoldev.link(sink))
        st["device"], st["sink"] = sink, sink
        state.save(st)
        return tapctl.nbd_fd_socket(st["pid"], st["minor"])


def _ensure_sink(sr, sink, leaf):
    """Make the leaf's mirror sink, or find (and finish) the one an
    earlier call made; its zvol's name. Under the SR lock."""
    uuid = meta.object_uuid(leaf["name"])
    row = scope.row(sink, ["name", "type", "volblocksize", meta.MIRROR_SINK])
    if row is not None and meta.is_sink(row) and row["type"] == "volume":
        return sink    # made before the bound (an upgrade mid-move): kept
    if row is None:
        _make_bound(sr, sink, uuid)
    elif not meta.is_sink(row):
        _claim_unmarked(sr, sink, uuid, row)
    volume = meta.sink_volume({"name": sink, "type": "filesystem"})
    found = scope.row(volume, ["type", "volblocksize"])
    if found is None:
        log.info("making %s, the mirror sink of %s", volume, leaf["name"])
        zfs.create_volume(volume, int(leaf["volsize"]),
                          {"volblocksize": str(meta.SECTOR)})
    elif found["type"] != "volume" or \
            found.get("volblocksize") != str(meta.SECTOR):
        raise errors.InvalidArgument(
            "%s is in the way of the mirror sink of %s (zfs-ng did not "
            "make it): rename or destroy it" % (volume, uuid))
    return volume


def _make_bound(sr, sink, uuid, finish=False):
    """Create the sink's filesystem: its quota, no compression, never
    mounted, then the mark. ZFS sets the quota (a special property) in
    a sync task of its own before the others, the mark and compression
    in one (zfs_set_prop_nvlist): a marked sink is bounded and its zvol
    is made whole, inheriting compression=off."""
    props = {"quota": str(bound(sr, sink)), "compression": "off",
             "canmount": "off", meta.MIRROR_SINK: uuid}
    if finish:
        log.info("%s: a sink a crash left unmarked, finished", sink)
        zfs.set_props(sink, props)
        return
    log.info("making %s, the bounded mirror sink of %s (quota %s)", sink,
             uuid, props["quota"])
    zfs.create_filesystem(sink, props)


def _claim_unmarked(sr, sink, uuid, row):
    """What a crash inside an earlier call's ``zfs create`` left by the
    sink's name, without its mark: an empty filesystem (finished) or a
    512-byte zvol of the unbounded form (made again); anything else is
    in the way (InvalidArgument, nothing changed)."""
    if row["type"] == "filesystem" and not row.get(meta.MIRROR_SINK) and \
            len(zfs.list_datasets(sink, ["name"], types="all")) == 1:
        _make_bound(sr, sink, uuid, finish=True)
        return
    if row["type"] == "volume" and not row.get(meta.MIRROR_SINK) and \
            row.get("volblocksize") == str(meta.SECTOR):
        log.info("%s: a sink a crash left unmarked, made again", sink)
        zfs.destroy(sink)
        _make_bound(sr, sink, uuid)
        return
    raise errors.InvalidArgument(
        "%s is in the way of the mirror sink of %s (a dataset zfs-ng did "
        "not make): rename or destroy it" % (sink, uuid))


def bound(sr, sink):
    """The quota of a new sink: half the room the SR has now, the room
    being its ``available`` (the other VDIs' refreservations are out of
    it already) less what the other sinks of the SR may still take (their
    quota they have not used): see the module docstring. OutOfSpace,
    nothing changed, below MIN_BOUND: the move would fail at its first
    writes."""
    avail = int(zfs.get_one(sr, ["available"])["available"])
    others = sum(max(0, int(r["quota"]) - int(r["used"])) for r in
                 zfs.list_datasets(sr, SINK_COLUMNS, types="filesystem",
                                   depth=1)
                 if meta.is_sink(r) and r["name"] != sink and
                 (r.get("quota") or "0").isdigit())
    quota = (avail - others) // 2
    if quota < MIN_BOUND:
        raise errors.OutOfSpace(
            "Datapath.import_activate: SR %s has %d bytes free, %d of them "
            "held for the mirrors of other moves in: too little for the "
            "writes of a move in (a VM's writes while it moves take several "
            "times their size in the mirror sink). Free space on the SR, or "
            "move the VM halted" % (sr, avail, others))
    return quota


def _serve(st, path):
    """Have the VBD's tapdisk serve path (the sink) from now on."""
    pid, minor = st["pid"], st["minor"]
    row = tapctl.view().vbd(pid, minor)
    if row is None or not row.is_open:
        raise NotAttached("the tapdisk of %s for domain %s is gone: "
                          "attach and activate it again"
                          % (st["dataset"], st["domain"]))
    if row.path == path and not row.is_paused:
        return
    if not row.is_paused:
        tapctl.pause(pid, minor)   # a failed one leaves the VBD running
    log.info("tapdisk %s minor %s now serves %s", pid, minor, path)
    try:
        tapctl.unpause(pid, minor, image=path)
    except BaseException:
        tapctl.settle_unpaused(pid, minor)   # on the leaf, as before
        raise


def check_whole(target, st):
    """Refuse (ComposePending) to hand out a leaf whose mirror sink still
    holds writes its zvol lacks, unless st is the mirror's own VBD (the
    one import_activate made serve the sink). A compose cut after its
    commit is finished instead: the leaf's name is then the composed
    disk. Costs one ``zfs get`` when there is no sink. Callers hold the
    SR lock, and pass a disk's target, never a snapshot's."""
    if "sink" in st:
        return
    leaf = target.head.rsplit("/", 1)[1]
    sink = meta.sink_name(target.sr, leaf)
    found = scope.row(sink, ["name", "type", meta.MIRROR_SINK])
    if found is None or not meta.is_sink(found):
        return
    rows = inventory.rows(target.sr)
    if any(meta.is_composing(r) and r[meta.COMPOSE_INTO] == leaf
           for r in rows):
        log.info("%s: finishing the compose a crash cut after its commit",
                 target.head)
        collect.collect(target.sr, rows)
        return
    raise ComposePending(
        "VDI %s holds the writes of a storage migration, in its mirror sink "
        "%s, that Volume.compose has not put on the copied disk yet: it is "
        "not attached or activated, since no VM may run on a partial disk; "
        "nothing was changed. The migration's compose failed (see SMlog on "
        "this, the destination, host); the data is in %s and the "
        "migration's parent VDI." % (leaf, sink, sink))
