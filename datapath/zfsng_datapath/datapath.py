"""Datapath.*: a zvol to a guest through tapdisk (raw), or to dom0 directly.

The calls, as xapi makes them for one VBD (shared/smapiv3.md):
  open(persistent)       at VM start (epoch_begin), for every VDI
  attach(domain)         -> XenDisk (tapdisk's device, backend vbd3) for a
                            guest, plus a BlockDevice (the zvol); a dom0
                            attach (domain u0-...) needs only the BlockDevice
  activate[_readonly]    tapdisk opens the zvol (aio:, O_DIRECT, -R)
  deactivate, detach     undo; detach never fails
  close                  at VM shutdown (epoch_end)

Every call is idempotent and repairs what it finds: it reads this host's
state file for (URI, domain), then checks it against reality (``tap-ctl
list``, ZFS, /dev/zvol) and does only the steps still missing. A tapdisk
that died is replaced by a new one on the same minor (the guest's device
path does not change); after a host reboot the state is empty and xapi
attaches afresh. A call that fails undoes what it made (no tapdisk, minor
or clone is left behind by a refused attach).

Locks: one per VDI zvol (``datapath-<pool/.../vol>``) around the whole call,
then zfs-ng's SR lock around the ZFS changes only (so a Volume.destroy or
Volume.snapshot never interleaves with a clone or a rollback). Waiting for
udev happens outside the SR lock.

Snapshot VDIs. ZFS gives a snapshot a device node only with
``snapdev=visible`` on its zvol, which exposes every snapshot of that zvol
(the internal ones too), is a property of the live VDI shared by all its
snapshots (a reference count on someone else's property), and makes
``zfs destroy`` of an attached snapshot fail with "busy". zfs-ng instead
clones the snapshot: ``<sr>/<snapshot uuid>.ro``, ``readonly=on``, marked
with ``org.xcp-ng.zfs-ng:datapath-clone=<boot id>``. A clone costs no space
(read-only: it never diverges), gets its own /dev/zvol node, and keeps the
snapshot alive: Volume.destroy of an attached snapshot VDI is deferred by
ZFS (``zfs destroy -d``) until the clone goes at detach. The volume plugin
never lists it (its name is no uuid and it has no ``vdi`` property of its
own: a clone does not inherit the origin's local properties) nor collects
it. One clone serves every domain that attaches the snapshot; the last
detach destroys it. A clone left by a host that crashed carries another
boot id: the next snapshot attach or detach in that SR destroys it.

Non-persistent disks (feature NONPERSISTENT): ``open(persistent=false)``
takes ``<vol>@zfsng-nonpersistent``; ``close`` rolls the zvol back to it and
destroys it: the reset is instant, with no clone and no copy. The snapshot
is no VDI (its inherited ``vdi`` value is the zvol's uuid, not its own
name). A reset left pending (host crash while the VM ran, so no close) is
done by the next open: rolled back for a new non-persistent run, rolled back
and dropped for a persistent one. ``zfs rollback`` is never given ``-r``:
if a VDI snapshot was taken after the reset point, the reset is refused
(NonpersistentResetBlocked) rather than destroy that snapshot.
"""

from zfsng import errors, lock, log, meta, zfs

from zfsng_datapath import device, state, tapctl, uri as urimod
from zfsng_datapath.errors import NonpersistentResetBlocked, NotAttached, \
    TapdiskError, TapdiskUnavailable

NONPERSISTENT_SNAPSHOT = meta.NONPERSISTENT_SNAPSHOT
CLONE_SUFFIX = ".ro"
CLONE_PROP = meta.prop("datapath-clone")
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def _boot_id():
    try:
        with open(BOOT_ID_PATH) as f:
            return f.read().strip() or "unknown"
    except (IOError, OSError):
        return "unknown"


def _call_lock(target):
    return lock.held("datapath-" + target.head)


def _row(name, columns):
    try:
        return zfs.get_one(name, columns)
    except (errors.DatasetNotFound, errors.PoolNotFound):
        return None


# --- snapshot VDIs: the temporary read-only clone ---------------------------

def clone_name(target):
    return "%s/%s%s" % (target.sr, target.snapshot, CLONE_SUFFIX)


def _is_our_clone(row, target):
    return row is not None and row.get("origin") == target.dataset and \
        row.get(CLONE_PROP) is not None and row.get("type") == "volume"


_CLONE_COLUMNS = ["name", "type", "origin", CLONE_PROP]


def _ensure_clone(target):
    """Make (or adopt) the snapshot's clone; return (name, made_now)."""
    name = clone_name(target)
    boot = _boot_id()
    with lock.sr_lock(target.sr):
        row = _row(name, _CLONE_COLUMNS)
        if row is not None:
            if not _is_our_clone(row, target):
                raise errors.DatasetExists(
                    "%s exists and is not zfs-ng's clone of %s: rename or "
                    "remove it" % (name, target.dataset))
            if row[CLONE_PROP] != boot:
                zfs.set_props(name, {CLONE_PROP: boot})  # this boot's now
            return name, False
        if _row(target.dataset, ["name"]) is None:
            raise errors.Volume_does_not_exist(target.snapshot)
        log.info("cloning %s to %s (read-only) for the datapath",
                 target.dataset, name)
        zfs.clone(target.dataset, name, {"readonly": "on", CLONE_PROP: boot})
        _sweep(target.sr, keep=name)
        return name, True


def _users(clone, but=None):
    return [s for s in state.all_states()
            if s.get("clone") == clone and
            (s.get("dataset"), s.get("domain")) != but]


def _drop_clone(target, name, but=None):
    """Destroy the clone unless another domain still uses it. Never raises:
    what fails here is left for the next sweep."""
    if _users(name, but):
        log.info("%s still used by another domain: kept", name)
        return
    try:
        with lock.sr_lock(target.sr):
            row = _row(name, _CLONE_COLUMNS)
            if row is not None:
                if not _is_our_clone(row, target):
                    log.warning("%s is not zfs-ng's clone of %s: left alone",
                                name, target.dataset)
                else:
                    log.info("destroying the datapath clone %s", name)
                    zfs.destroy(name)
            _sweep(target.sr)
    except errors.StorageError as exc:
        log.warning("could not destroy %s (the next snapshot attach or "
                    "detach in this SR retries): %s", name, exc.message)


def _sweep(sr, keep=None):
    """Destroy clones a previous boot left (a host crash skips detach).
    Caller holds the SR lock; never raises."""
    boot = _boot_id()
    try:
        found = zfs.find_local(CLONE_PROP, sr, types="volume")
    except errors.StorageError as exc:
        log.warning("cannot list datapath clones of %s: %s", sr, exc.message)
        return
    used = set(s.get("clone") for s in state.all_states())
    for name, value in found:
        if name == keep or value == boot or name in used or \
                name.rsplit("/", 1)[0] != sr:
            continue
        log.info("destroying %s, a datapath clone left by an earlier boot",
                 name)
        try:
            zfs.destroy(name)
        except errors.StorageError as exc:
            log.warning("could not destroy %s: %s", name, exc.message)


# --- the tapdisk of a guest --------------------------------------------------

def _ensure_tapdisk(st, view):
    """Make pid+minor attached, reusing whatever of them is still alive:
    spawn, allocate, attach, each step saved as soon as it succeeded."""
    pid, minor = st.get("pid"), st.get("minor")
    if view.vbd(pid, minor):
        if not st.get("attached"):
            st["attached"] = True
            state.save(st)
        return
    if minor is not None and not view.minor_orphan(minor):
        log.info("minor %s is gone or taken: allocating another", minor)
        st["minor"] = st["tapdev"] = None
    if pid is not None and not view.tapdisk_idle(pid):
        log.info("tapdisk %s is gone: spawning another", pid)
        st["pid"] = None
    st["attached"] = False
    if st.get("pid") is None:
        st["pid"] = tapctl.spawn()
        state.save(st)
    if st.get("minor") is None:
        st["minor"], st["tapdev"] = tapctl.allocate()
        state.save(st)
    tapctl.attach(st["pid"], st["minor"])
    st["attached"] = True
    state.save(st)


def _release_tapdisk(st):
    """Close, detach and free what this state holds; True when nothing of
    it is left. Never raises."""
    pid, minor = st.get("pid"), st.get("minor")
    if pid is None and minor is None:
        return True
    try:
        view = tapctl.view()
        row = view.vbd(pid, minor)
        if row is not None:
            if row.is_open:
                tapctl.close(pid, minor)
            tapctl.detach(pid, minor)   # its last VBD: the tapdisk exits
        elif view.tapdisk_idle(pid) and not st.get("attached"):
            tapctl.terminate(pid)       # spawned, never attached
        if minor is not None:
            view = tapctl.view()
            if view.minor_orphan(minor):
                tapctl.free(minor)
            elif view.vbd(pid, minor):
                return False
    except TapdiskUnavailable as exc:
        log.warning("nothing to release without tap-ctl: %s", exc.message)
        return True
    except TapdiskError as exc:
        log.error("releasing tapdisk %s minor %s: %s", pid, minor,
                  exc.message)
        return False
    return True


# --- the methods -------------------------------------------------------------

def _target(uri, domain=None):
    target = urimod.parse(uri)
    if domain is not None:
        urimod.check_domain(domain)
    return target


def _device_dataset(target, st):
    """The dataset to hand out: the zvol, or the snapshot's clone."""
    if target.snapshot is None:
        if _row(target.head, ["name"]) is None:
            raise errors.Volume_does_not_exist(target.head.rsplit("/", 1)[1])
        return target.head, False
    st["clone"] = clone_name(target)
    state.save(st)   # before the clone exists: detach knows to remove it
    return _ensure_clone(target)


def attach(dbg, uri, domain):
    target = _target(uri, domain)
    guest = not urimod.is_dom0(domain)
    with _call_lock(target):
        old = state.load(target.dataset, domain)
        st = old or {"uri": uri, "dataset": target.dataset,
                     "domain": domain}
        made_clone = False
        try:
            view = tapctl.view() if guest else None  # no tap-ctl: no change
            st["device"], made_clone = _device_dataset(target, st)
            state.save(st)
            device.wait(st["device"])
            if guest:
                _ensure_tapdisk(st, view)
        except Exception:
            if old is None:   # a refused first attach leaves nothing
                if _release_tapdisk(st):
                    state.remove(target.dataset, domain)
                if made_clone:
                    _drop_clone(target, st["clone"],
                                but=(target.dataset, domain))
            raise
        impls = [["BlockDevice", {"path": device.link(st["device"])}]]
        if guest:
            impls.insert(0, ["XenDisk", {"params": st["tapdev"], "extra": {},
                                         "backend_type": "vbd3"}])
        log.info("attached %s for domain %s: %s%s", target.dataset, domain,
                 device.link(st["device"]),
                 " via %s" % st["tapdev"] if guest else "")
        return {"implementations": impls}


def _activate(uri, domain, readonly):
    target = _target(uri, domain)
    readonly = readonly or target.snapshot is not None
    with _call_lock(target):
        st = state.load(target.dataset, domain)
        if st is None or not st.get("device"):
            raise NotAttached("%s is not attached for domain %s on this "
                              "host: Datapath.attach comes first"
                              % (target.dataset, domain))
        device.wait(st["device"])
        path = device.link(st["device"])
        if not urimod.is_dom0(domain):
            view = tapctl.view()
            row = view.vbd(st.get("pid"), st.get("minor"))
            if row is None:
                log.warning("tapdisk of %s for domain %s is gone: starting "
                            "another on minor %s", target.dataset, domain,
                            st.get("minor"))
                _ensure_tapdisk(st, view)
            elif row.is_open:
                if row.path == path and \
                        st.get("readonly") in (None, readonly):
                    return _activated(st, readonly)
                log.info("reopening %s (%s)", path,
                         "read-only" if readonly else "read-write")
                tapctl.close(st["pid"], st["minor"])
            tapctl.open_image(st["pid"], st["minor"], path, readonly)
        return _activated(st, readonly)


def _activated(st, readonly):
    st["active"], st["readonly"] = True, readonly
    state.save(st)
    log.info("activated %s for domain %s%s", st["dataset"], st["domain"],
             " read-only" if readonly else "")
    return None


def activate(dbg, uri, domain):
    return _activate(uri, domain, False)


def activate_readonly(dbg, uri, domain):
    return _activate(uri, domain, True)


def deactivate(dbg, uri, domain):
    target = _target(uri, domain)
    with _call_lock(target):
        st = state.load(target.dataset, domain)
        if st is None:
            return None
        if not urimod.is_dom0(domain) and st.get("pid") is not None:
            try:
                row = tapctl.view().vbd(st["pid"], st.get("minor"))
            except TapdiskUnavailable:
                row = None
            if row is not None and row.is_open:
                tapctl.close(st["pid"], st["minor"])
        st["active"] = False
        state.save(st)
        return None


def detach(dbg, uri, domain):
    """Never fails once the arguments are understood: every step is tried,
    what could not be undone is logged and left in the state file for the
    next call on this VDI to finish."""
    target = _target(uri, domain)
    with _call_lock(target):
        st = state.load(target.dataset, domain)
        clone = clone_name(target) if target.snapshot else None
        if st is not None:
            clone = st.get("clone") or clone
            try:
                done = urimod.is_dom0(domain) or _release_tapdisk(st)
                if done:
                    state.remove(target.dataset, domain)
                else:
                    st["detaching"] = True
                    state.save(st)
            except Exception as exc:  # never fail: log and move on
                log.error("detach %s for %s: %s", target.dataset, domain,
                          exc)
        if clone:
            try:
                _drop_clone(target, clone, but=(target.dataset, domain))
            except Exception as exc:  # never fail
                log.error("detach %s: clone %s: %s", target.dataset, clone,
                          exc)
        log.info("detached %s for domain %s", target.dataset, domain)
        return None


# --- NONPERSISTENT -----------------------------------------------------------

def _reset_point(target):
    return "%s@%s" % (target.head, NONPERSISTENT_SNAPSHOT)


def _rollback(snap):
    try:
        zfs.zfs("rollback", "--", snap)
    except errors.ZfsError as exc:
        if "more recent snapshots" in exc.message:
            raise NonpersistentResetBlocked(
                "cannot reset the non-persistent disk %s: snapshots were "
                "taken after its reset point %s and zfs-ng does not destroy "
                "them (%s). Destroy those snapshots, or make the disk "
                "persistent" % (snap.split("@")[0], snap, exc.message))
        raise


def open_(dbg, uri, persistent):
    target = _target(uri)
    if target.snapshot is not None:
        return None   # a snapshot VDI is read-only: nothing to reset
    snap = _reset_point(target)
    with _call_lock(target), lock.sr_lock(target.sr):
        if _row(target.head, ["name"]) is None:
            raise errors.Volume_does_not_exist(target.head.rsplit("/", 1)[1])
        pending = _row(snap, ["name"]) is not None
        if persistent:
            if pending:
                log.info("%s: completing a reset left pending (no close)",
                         target.head)
                _rollback(snap)
                zfs.destroy(snap)
            return None
        if pending:
            log.info("%s: back to the reset point before a new run", snap)
            _rollback(snap)
        else:
            log.info("%s: reset point for a non-persistent run", snap)
            zfs.snapshot(snap)
        return None


def close(dbg, uri):
    target = _target(uri)
    if target.snapshot is not None:
        return None
    snap = _reset_point(target)
    with _call_lock(target), lock.sr_lock(target.sr):
        if _row(snap, ["name"]) is None:
            return None   # persistent, or already closed
        log.info("%s: resetting the non-persistent disk", snap)
        _rollback(snap)
        zfs.destroy(snap)
        return None


HANDLERS = {
    "Datapath.open": open_, "Datapath.close": close,
    "Datapath.attach": attach, "Datapath.activate": activate,
    "Datapath.activate_readonly": activate_readonly,
    "Datapath.deactivate": deactivate, "Datapath.detach": detach,
}
