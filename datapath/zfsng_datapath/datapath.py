"""Datapath.*: a zvol to a guest through tapdisk (raw), or to dom0 directly.

The calls, as xapi makes them for one VBD (xapi-storage-script main.ml):
  open(persistent)       at VM start (epoch_begin), for every VDI
  attach(domain)         -> for a guest: XenDisk and BlockDevice, both
                            tapdisk's device (backend vbd3), and tapdisk's
                            NBD server; for dom0 (domain u0_..., or 0: see
                            uri.py) only a BlockDevice, the zvol itself
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

Snapshot VDIs reach a guest through a read-only clone: snapclone.py.
Non-persistent disks (feature NONPERSISTENT, open and close): reset.py.
"""

from zfsng import contentid, lock, log, meta, wire, zfs, zvoldev
from zfsng_datapath import iostat, mirror, mirrorin, reset, scope, \
    snapclone, state, tapctl, uri as urimod
from zfsng_datapath.errors import NotAttached, TapdiskError, \
    TapdiskUnavailable


def _call_lock(target):
    return state.vdi_lock(target.head)


def _load(target, domain):
    """This host's state for (URI, domain), or None. A snapshot VDI's
    state is also found by its clone (same snapshot uuid and domain): a
    reset that set its zvol aside (reset.py) changed its URI."""
    st = state.load(target.dataset, domain)
    if st is None and target.snapshot is not None:
        clone = snapclone.name(target)
        for other in state.all_states():
            if other.get("clone") == clone and other.get("domain") == domain:
                return other
    return st


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
            tapctl.detach(pid, minor)   # its last VBD: the tapdisk exits,
            view = tapctl.view()        # unless an NBD client it was
            if view.tapdisk_idle(pid):  # passed (a migration's) holds it
                tapctl.terminate(pid)
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
    whether it was made now). Checks the VDI (never a migration's leaf
    before its compose: mirrorin.check_whole, first, as a compose it
    finishes renames), finishes a reset a crash interrupted, sweeps
    unused clones; notes the SR's uuid (iostat)."""
    with lock.sr_lock(target.sr):
        if target.snapshot is None:
            mirrorin.check_whole(target, st)
            st["sr_uuid"] = reset.prepare(target)[meta.SR_UUID]
            snapclone.sweep(target.sr)
            return target.head, False
        st["sr_uuid"] = scope.check_sr(target)[meta.SR_UUID]
        scope.check_vdi(target)
        st["clone"] = snapclone.name(target)
        state.save(st)   # before the clone exists: detach knows to remove it
        made = snapclone.ensure(target)
        snapclone.sweep(target.sr, keep=made[0])
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
            # the VBD of a migration's mirror keeps serving its sink
            st["device"] = st.get("sink") or st["device"]
            state.save(st)
            zvoldev.wait(st["device"])
            if guest:
                _ensure_tapdisk(st, view)
            _link_for_iostat(target, st)
        except Exception:
            if old is None:   # a refused first attach leaves nothing
                if _release_tapdisk(st):
                    state.remove(target.dataset, domain)
                if made_clone:
                    snapclone.drop(target, st["clone"],
                                but=(target.dataset, domain))
            raise
        impls = _implementations(target, st) if guest else \
            [["BlockDevice", {"path": zvoldev.link(st["device"])}]]
        log.info("attached %s for domain %s: %s%s", target.dataset, domain,
                 zvoldev.link(st["device"]),
                 " via %s" % st["tapdev"] if guest else "")
        return {"implementations": impls}


def _link_for_iostat(target, st):
    """The VDI's /dev/sm/phy link to what tapdisk opens (iostat)."""
    link = iostat.make(st["sr_uuid"], target.key(),
                       zvoldev.link(st["device"]))
    if link != st.get("phy"):
        st["phy"] = link
        state.save(st)


def _implementations(target, st):
    """A guest attach's answer. xenopsd writes the VBD's ``params`` from
    the first BlockDevice (or File) of it, before the XenDisk's own
    (xenops_server_xen.ml params_of_backend), and the vbd3 backend
    (tapback) finds the tapdisk by that device's number: so the
    BlockDevice is tapdisk's device too, as XCP-ng's own tapdisk
    datapath answers, never the zvol under it. ``extra`` goes to the
    backend's ``sm-data/``: ``vdi-uuid`` names the VDI to xcp-rrdd's
    iostat plugin (iostat.py)."""
    return [["XenDisk", {"params": st["tapdev"],
                         "extra": {"vdi-uuid": target.key()},
                         "backend_type": "vbd3"}],
            ["BlockDevice", {"path": st["tapdev"]}],
            ["Nbd", {"uri": _nbd_uri(target, st)}]]


def _nbd_uri(target, st):
    """The tapdisk's NBD server, as xapi parses it (storage_interface.ml
    parse_nbd_uri: ``nbd:unix:<socket>:exportname=<name>``, split on ":",
    so neither part may hold one). It serves once the VBD is activated;
    xapi writes a migrated or copied disk into it (receive_start3,
    get_nbd_server), each time after activating it. tapdisk takes any
    export name: the URI's last name says which disk it is in its log."""
    return "nbd:unix:%s:exportname=%s" % (
        tapctl.nbd_socket(st["pid"], st["minor"]),
        target.dataset.rsplit("/", 1)[-1])


def _activate(uri, domain, readonly):
    target = _target(uri, domain)
    readonly = readonly or target.snapshot is not None
    with _call_lock(target):
        st = _load(target, domain)
        if st is None or not st.get("device"):
            raise NotAttached("%s is not attached for domain %s on this "
                              "host: Datapath.attach comes first"
                              % (target.dataset, domain))
        if target.snapshot is None:     # a disk attached before its mirror
            with lock.sr_lock(target.sr):
                mirrorin.check_whole(target, st)
                if not readonly:
                    _mark_writing(st)
                    _new_content_id(target)
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
            mirror.note_reopened(target.dataset, domain)
        return _activated(st, readonly)


def _new_content_id(target):
    """A fresh content_id for a live VDI about to be opened read-write:
    its data is about to change, so what xapi once claimed it holds (the
    id a copy set, storage_smapiv1_migrate.ml:285) is no longer true; as
    SMAPIv1 drops the id at a read-write activate (storage_smapiv1.ml:
    519-526). Before tapdisk opens it, one bounded zfs set of one
    property: a call cut before or after it leaves an id of its own on
    the VDI, either one fine (zfsng/contentid.py). xapi's copy reads the
    destination's id before it activates it (copy_into_vdi, 171) and
    claims the source's after (285): the claim lands after this."""
    key = target.key()
    log.info("%s: a fresh content_id before it is opened read-write", key)
    zfs.set_props(target.head, {meta.CONTENT_ID: contentid.encode(
        contentid.fresh(), key)})


def _mark_writing(st):
    """Record the read-write activate before its fresh content_id, both
    under the SR lock a clone takes: from the id's change on, a clone of
    the VDI sees a writer (zfsng/attachstate.py) even while tapdisk has
    not opened the zvol yet, and gets an id of its own. A call cut after
    this leaves the mark until deactivate or detach: a stale one only
    costs a clone a fresh id, never data."""
    if not st.get("writing"):
        st["writing"] = True
        state.save(st)


def _activated(st, readonly):
    st["active"], st["readonly"] = True, readonly
    st["writing"] = not readonly
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
        dropped = False
        if st.get("pid") is not None:
            try:
                row = tapctl.view().vbd(st["pid"], st.get("minor"))
            except TapdiskUnavailable:
                row = None
            if row is not None and row.is_open:
                dropped = _mirror_dropped(target, domain, st)
                tapctl.close(st["pid"], st["minor"])
        st["active"] = st["writing"] = False
        state.save(st)
        # xenopsd deactivates a migrating VM's disks after suspending it
        # and before the destination resumes it: the last moment a failed
        # mirror can stop the move (mirror.py)
        mirror.check_ended(target.dataset, domain, dropped)
        return None


def _mirror_dropped(target, domain, st):
    """Whether tapdisk dropped the secondary of a mirror of this disk,
    asked before the close ends it (False without a mirror)."""
    if not mirror.jobs_of(target.dataset, domain):
        return False
    try:
        return bool(tapctl.mirror_failed(st["pid"], st["minor"]))
    except TapdiskError as exc:
        log.warning("tap-ctl stats of %s: %s", target.dataset, exc.message)
        return False


@wire.method("Datapath.detach")
def detach(dbg, uri, domain):
    """Never fails once the arguments are understood: every step is tried,
    what could not be undone is logged and left in the state file for the
    next call on this VDI to finish."""
    target = _target(uri, domain)
    with _call_lock(target):
        st = _load(target, domain)
        clone = snapclone.name(target) if target.snapshot else None
        owner = (st or {}).get("dataset", target.dataset)
        if st is not None:
            clone = st.get("clone") or clone
            try:
                done = _release_tapdisk(st)   # none in a dom0 state
                if done:
                    state.remove(owner, domain)
                    iostat.drop(st.get("phy"), [
                        s.get("phy") for s in state.all_states()])
                else:
                    st["detaching"] = True
                    state.save(st)
            except Exception as exc:  # never fail: log and move on
                log.error("detach %s for %s: %s", target.dataset, domain,
                          exc)
        if clone:
            try:
                snapclone.drop(target, clone, but=(owner, domain))
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
        snapclone.sweep(target.sr)
        return None


@wire.method("Datapath.close")
def close(dbg, uri):
    target = _target(uri)
    if target.snapshot is not None:
        return None
    with _call_lock(target), lock.sr_lock(target.sr):
        reset.close(target, reset.prepare(target))
        snapclone.sweep(target.sr)
        return None
