"""Datapath.*: a zvol to a guest through tapdisk (raw), or to dom0 directly.

The calls, as xapi makes them for one VBD (xapi-storage-script main.ml):
  open(persistent)       at VM start (epoch_begin), for every VDI
  attach(domain)         -> XenDisk (tapdisk's device, backend vbd3) for a
                            guest, plus a BlockDevice (the zvol); a dom0
                            attach (domain u0_..., or 0: see uri.py) needs
                            only the BlockDevice
  activate[_readonly]    tapdisk opens the zvol (aio:, O_DIRECT, -R)
  deactivate, detach     undo; detach never fails
  close                  at VM shutdown (epoch_end)

Only zfs-ng VDIs are touched (scope.py). Every call is idempotent and
repairs what it finds: it reads this host's state file for (URI, domain),
then checks it against reality (``tap-ctl list``, ZFS, /dev/zvol) and does
only the steps still missing. A tapdisk that died is replaced by a new one
on the same minor (the guest's device path does not change), once the
kernel has released the block device it left (tapctl.wait_released:
TapdevHeld while the VM's backend holds it); after a host
reboot the state is empty and xapi attaches afresh. A call that fails undoes what it made (no tapdisk, minor
or clone is left behind by a refused attach).

Locks: one per VDI zvol (``datapath-<pool/.../vol>``) around the whole call,
then zfs-ng's SR lock around the ZFS checks and changes only (so a
Volume.destroy or Volume.snapshot never interleaves with a clone, a
rollback or a reset's rotation). Waiting for
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
detach destroys it. A clone no state file of this host uses (its detach
failed to destroy it, or the host crashed) is destroyed by the next attach,
detach, open or close in that SR, and the volume plugin's collector then
frees what it kept alive (a hidden parent). The clone is named after the
snapshot's uuid alone, and a state file is found by it too: a reset moves a
snapshot to another zvol (reset.py), which changes its URI, not its clone.
ZFS sets the -o properties of ``zfs clone`` after making the clone
(zfs_ioc_clone): a power cut between leaves it without ``readonly`` and
its mark, which no sweep looks for. The next attach of that snapshot marks
it and uses it; until then the volume plugin's collector may free it
(zfsng.meta.is_unmarked_clone).

Non-persistent disks (feature NONPERSISTENT, open and close): reset.py.
"""

from zfsng import collect, errors, lock, log, meta, wire, zfs, zvoldev

from zfsng_datapath import reset, scope, state, tapctl, \
    uri as urimod
from zfsng_datapath.errors import NotAttached, TapdiskError, \
    TapdiskUnavailable

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
    return scope.row(name, columns)


def _load(target, domain):
    """This host's state for (URI, domain), or None. A snapshot VDI's
    state is also found by its clone (same snapshot uuid and domain): a
    reset that set its zvol aside (reset.py) changed its URI."""
    st = state.load(target.dataset, domain)
    if st is None and target.snapshot is not None:
        clone = clone_name(target)
        for other in state.all_states():
            if other.get("clone") == clone and other.get("domain") == domain:
                return other
    return st


# --- snapshot VDIs: the temporary read-only clone ---------------------------

def clone_name(target):
    return meta.clone_name(target.sr, target.snapshot)


def _is_our_clone(row, target):
    return meta.is_clone_of(row, target.sr, target.snapshot)


_CLONE_COLUMNS = ["name", "type", "origin", "usedds", meta.VDI_UUID,
                  meta.DATAPATH_CLONE]


def _ensure_clone(target):
    """Make (or adopt) the snapshot's clone; return (name, made_now).
    Caller holds the SR lock, and checked the snapshot is a VDI."""
    name = clone_name(target)
    boot = _boot_id()
    row = _row(name, _CLONE_COLUMNS)
    if row is not None and meta.is_unmarked_clone(row):
        # a power cut inside our zfs clone: made, never marked nor used
        log.warning("%s: a power cut left it without its properties: "
                    "marked as this boot's clone of %s", name,
                    target.dataset)
        zfs.set_props(name, {"readonly": "on", meta.DATAPATH_CLONE: boot})
        return name, True
    if row is not None:
        if not _is_our_clone(row, target):
            raise errors.DatasetExists(
                "%s exists and is not zfs-ng's clone of %s: rename or "
                "remove it" % (name, target.dataset))
        if row[meta.DATAPATH_CLONE] != boot:
            # this boot's now
            zfs.set_props(name, {meta.DATAPATH_CLONE: boot})
        return name, False
    log.info("cloning %s to %s (read-only) for the datapath",
             target.dataset, name)
    zfs.clone(target.dataset, name,
              {"readonly": "on", meta.DATAPATH_CLONE: boot})
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
            dropped = False
            if row is not None:
                if not _is_our_clone(row, target):
                    log.warning("%s is not zfs-ng's clone of %s: left alone",
                                name, target.dataset)
                else:
                    log.info("destroying the datapath clone %s", name)
                    zfs.destroy(name)
                    dropped = True
            _sweep(target.sr, freed=dropped)
    except errors.StorageError as exc:
        log.warning("could not destroy %s (the next attach, detach, open or "
                    "close in this SR retries): %s", name, exc.message)


def _sweep(sr, keep=None, freed=False):
    """The collector's sweep of the datapath clones of sr that no state
    file of this host uses (collect.sweep_clones). Caller holds the SR
    lock; never raises."""
    used = set(st.get("clone") for st in state.all_states())
    used.add(keep)
    collect.sweep_clones(sr, used, freed=freed)


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
    if st.get("minor") is not None:
        tapctl.wait_released(st["tapdev"])
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
    """The dataset to hand out: the zvol, or the snapshot's clone (and
    whether it was made now). Checks the VDI, finishes a reset a crash
    interrupted, sweeps unused clones."""
    with lock.sr_lock(target.sr):
        if target.snapshot is None:
            reset.prepare(target)
            _sweep(target.sr)
            return target.head, False
        scope.check(target)
        st["clone"] = clone_name(target)
        state.save(st)   # before the clone exists: detach knows to remove it
        made = _ensure_clone(target)
        _sweep(target.sr, keep=made[0])
        return made


@wire.method("Datapath.attach")
def attach(dbg, uri, domain):
    target = _target(uri, domain)
    guest = not urimod.is_dom0(domain)
    with _call_lock(target):
        old = _load(target, domain)
        st = old or {"uri": uri, "dataset": target.dataset,
                     "domain": domain}
        made_clone = False
        try:
            view = tapctl.view() if guest else None  # no tap-ctl: no change
            st["device"], made_clone = _device_dataset(target, st)
            state.save(st)
            zvoldev.wait(st["device"])
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
        impls = [["BlockDevice", {"path": zvoldev.link(st["device"])}]]
        if guest:
            impls.insert(0, ["XenDisk", {"params": st["tapdev"], "extra": {},
                                         "backend_type": "vbd3"}])
        log.info("attached %s for domain %s: %s%s", target.dataset, domain,
                 zvoldev.link(st["device"]),
                 " via %s" % st["tapdev"] if guest else "")
        return {"implementations": impls}


def _activate(uri, domain, readonly):
    target = _target(uri, domain)
    readonly = readonly or target.snapshot is not None
    with _call_lock(target):
        st = _load(target, domain)
        if st is None or not st.get("device"):
            raise NotAttached("%s is not attached for domain %s on this "
                              "host: Datapath.attach comes first"
                              % (target.dataset, domain))
        zvoldev.wait(st["device"])
        path = zvoldev.link(st["device"])
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


@wire.method("Datapath.activate")
def activate(dbg, uri, domain):
    return _activate(uri, domain, False)


@wire.method("Datapath.activate_readonly")
def activate_readonly(dbg, uri, domain):
    return _activate(uri, domain, True)


@wire.method("Datapath.deactivate")
def deactivate(dbg, uri, domain):
    target = _target(uri, domain)
    with _call_lock(target):
        st = _load(target, domain)
        if st is None:
            return None
        # a dom0 state has no tapdisk, unless an older zfs-ng made it (it
        # took u0_ domains for guests): that one is closed too
        if st.get("pid") is not None:
            try:
                row = tapctl.view().vbd(st["pid"], st.get("minor"))
            except TapdiskUnavailable:
                row = None
            if row is not None and row.is_open:
                tapctl.close(st["pid"], st["minor"])
        st["active"] = False
        state.save(st)
        return None


@wire.method("Datapath.detach")
def detach(dbg, uri, domain):
    """Never fails once the arguments are understood: every step is tried,
    what could not be undone is logged and left in the state file for the
    next call on this VDI to finish."""
    target = _target(uri, domain)
    with _call_lock(target):
        st = _load(target, domain)
        clone = clone_name(target) if target.snapshot else None
        owner = (st or {}).get("dataset", target.dataset)
        if st is not None:
            clone = st.get("clone") or clone
            try:
                done = _release_tapdisk(st)   # none in a dom0 state
                if done:
                    state.remove(owner, domain)
                else:
                    st["detaching"] = True
                    state.save(st)
            except Exception as exc:  # never fail: log and move on
                log.error("detach %s for %s: %s", target.dataset, domain,
                          exc)
        if clone:
            try:
                _drop_clone(target, clone, but=(owner, domain))
            except Exception as exc:  # never fail
                log.error("detach %s: clone %s: %s", target.dataset, clone,
                          exc)
        log.info("detached %s for domain %s", target.dataset, domain)
        return None


# --- NONPERSISTENT (reset.py) ----------------------------------------------

@wire.method("Datapath.open")
def open_(dbg, uri, persistent):
    target = _target(uri)
    if target.snapshot is not None:
        return None   # a snapshot VDI is read-only: nothing to reset
    with _call_lock(target), lock.sr_lock(target.sr):
        reset.open_(target, reset.prepare(target), persistent)
        _sweep(target.sr)
        return None


@wire.method("Datapath.close")
def close(dbg, uri):
    target = _target(uri)
    if target.snapshot is not None:
        return None
    with _call_lock(target), lock.sr_lock(target.sr):
        reset.close(target, reset.prepare(target))
        _sweep(target.sr)
        return None
