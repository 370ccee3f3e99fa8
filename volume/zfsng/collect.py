"""The collector: frees what nothing needs any more, and finishes what a
crash left between two commands. The only place that destroys datasets
nobody asked to destroy.

What it frees (the kinds are ``meta``'s):
- a hidden parent once it has no dependents (no snapshot VDI, no clone,
  no admin's snapshot); destroying one can free its own hidden parent, the
  origin of its origin snapshot, hence the rounds;
- an internal snapshot without its clone (the clone was never made, or is
  gone), and one that lost its deferred-destroy mark (a crash between
  ``zfs clone`` and ``zfs destroy -d``) gets it back;
- a datapath clone no state file of this host uses (``sweep_clones``: the
  datapath passes the clones its state files name);
- what a power cut left inside a ``zfs create -o`` or ``zfs clone -o``
  (ZFS sets their properties after making the dataset): a clone without
  its properties (``meta.is_unmarked_clone``: of a Volume.clone that never
  returned, of a reset's rotation, or a datapath clone without its mark),
  and a zvol whose Volume.create never returned
  (``meta.is_unfinished_create``);
- a Volume.compose cut after its parent took the leaf's uuid
  (``meta.is_composing``): the leaf's zvol is destroyed and the parent
  gets its name (``finish_compose``), and the mark left on a finished one
  goes; a migration's mirror sink once its leaf is gone, and one a power
  cut left inside its ``zfs create`` (``meta.is_unfinished_sink``);
- a Volume.revert a crash cut short (``meta.reverting``): undone or
  finished (``revertsteps.finish``);
- a mirror's space guard no live mirror job holds and no VBD may
  still mirror (a dom0 crash mid-move; a killed job's guard once the
  datapath took its VBD out of mirror mode): the zvol's refreservation
  put back (``spaceguard``);
- what a Volume.create, snapshot or clone that reported failure made
  anyway (a command the runner gave up on finished in the kernel), once
  no command on it runs (``free_abandoned``: ``abandoned`` has the
  records).
Snapshots destroyed deferred are freed by ZFS itself with their last clone.

The volume plugin runs ``collect`` at SR.attach and at Volume.destroy
whenever the SR holds anything hidden or half-done, and
``free_abandoned`` at every Volume call that changes the SR; the datapath
runs ``sweep_clones`` at attach, detach, open and close. Callers hold the
SR lock.
"""

from zfsng import abandoned, errors, inventory, lock, log, meta, \
    ownership, revertsteps, spaceguard, zfs

ROUNDS = 64  # bound on cascades (a chain of hidden parents)


def garbage(rows):
    """[(action, dataset)] that collect should do now: "destroy",
    "defer" (``zfs destroy -d``), "compose" (``finish_compose``),
    "unmark" (the COMPOSE_INTO of a finished compose), "remove" (a
    ``zfs destroy`` without -r: an unfinished sink), "revert" (a
    revert a crash cut short: ``revertsteps.finish``) or "unguard" (a
    dead mirror's space guard: ``spaceguard.release``)."""
    actions = []
    for row in rows:
        if row.get(meta.MIRROR_GUARD) and not lock.being_read(
                spaceguard.lock_name(row["name"])) and \
                not spaceguard.mirroring(row["name"]):
            actions.append(("unguard", row["name"]))
        if meta.reverting(row):
            actions.append(("revert", row["name"]))
        elif meta.is_composing(row):
            actions.append(("compose", row["name"]))
        elif _composed(row):
            actions.append(("unmark", row["name"]))
        elif meta.is_sink(row) and _sink_orphan(row, rows):
            actions.append(("destroy", row["name"]))
        elif meta.is_unfinished_sink(row) and _sink_orphan(row, rows):
            actions.append(("remove", row["name"]))
        elif meta.is_hidden(row) and \
                not ownership.has_dependents(row["name"], rows):
            actions.append(("destroy", row["name"]))
        elif meta.is_unmarked_clone(row) or meta.is_unfinished_create(row):
            actions.append(("destroy", row["name"]))
        elif meta.is_internal(row) and not meta.clones_of(row):
            if not lock.being_read(row["name"]):   # cbt's, outside the lock
                actions.append(("destroy", row["name"]))
        elif meta.is_internal(row) and row.get("defer_destroy") != "on":
            actions.append(("defer", row["name"]))
    return actions


def needed(rows):
    """Whether the SR holds anything collect may have to free."""
    return any(meta.is_hidden(r) or meta.is_unmarked_clone(r) or
               meta.is_unfinished_create(r) or meta.is_composing(r) or
               _composed(r) or meta.is_sink(r) or meta.reverting(r) or
               meta.is_unfinished_sink(r) or
               bool(r.get(meta.MIRROR_GUARD)) or
               (meta.is_internal(r) and r.get("defer_destroy") != "on")
               for r in rows)


def collect(sr, rows=None, done=None):
    """Free what nothing needs any more, until nothing is left to free.
    rows: the SR's listing (inventory.rows), if the caller has it; done:
    abandoned.finished(sr), if the caller has read it."""
    if _free_recorded(sr, rows, done):
        rows = None
    for _ in range(ROUNDS):
        rows = inventory.rows(sr) if rows is None else rows
        actions = garbage(rows)
        if not actions:
            return
        for action, name in actions:
            log.info("collect: %s %s", action, name)
            _act(action, name, rows)
        rows = None
    log.warning("collect: still work left after %d rounds", ROUNDS)


def _act(action, name, rows):
    if action == "revert":
        sr = name.rsplit("/", 1)[0]
        revertsteps.finish(
            [r for r in rows if r["name"] == name][0],
            dict((r["name"], r) for r in rows),
            zfs.get_one(sr, [meta.SR_PROVISIONING]).get(
                meta.SR_PROVISIONING) == "thick")
    elif action == "compose":
        finish_compose([r for r in rows if r["name"] == name][0], rows)
    elif action == "unmark":
        zfs.inherit(name, meta.COMPOSE_INTO)
    elif action == "unguard":
        spaceguard.release(name)
    else:
        _destroy(name, recursive=(action == "destroy" and "@" not in name),
                 defer=(action == "defer"))


def _composed(row):
    """A compose's parent that has the leaf's name: only the mark left."""
    return row["type"] == "volume" and bool(row.get(meta.COMPOSE_INTO)) \
        and row[meta.COMPOSE_INTO] == meta.object_uuid(row["name"])


def _sink_orphan(row, rows):
    """A mirror sink whose leaf VDI is gone (destroyed, or a compose's
    parent about to take its name)."""
    leaf = meta.object_uuid(row["name"])[:-len(meta.SINK_SUFFIX)]
    sr = row["name"].rsplit("/", 1)[0]
    return not any(r["name"] == meta.vdi_dataset(sr, leaf) or
                   (meta.is_composing(r) and r[meta.COMPOSE_INTO] == leaf)
                   for r in rows)


def finish_compose(row, rows):
    """The last steps of Volume.compose, from the composed parent row:
    destroy the leaf's zvol with its snapshots (the dummy) and its mirror
    sink (the writes are on the parent now), give the parent the leaf's
    name, drop the mark. Each step is one command; a crash between two
    leaves a state this finishes again."""
    leaf = meta.composed_leaf(row)
    sink = meta.sink_name(leaf.rsplit("/", 1)[0], row[meta.COMPOSE_INTO])
    for name in (leaf, sink):
        if any(r["name"] == name for r in rows):
            log.info("compose: destroying %s, now on %s", name, row["name"])
            _destroy(name, recursive=True)
    log.info("compose: %s becomes %s", row["name"], leaf)
    zfs.rename(row["name"], leaf)
    zfs.inherit(leaf, meta.COMPOSE_INTO)


def free_abandoned(sr):
    """Destroy what calls that reported failure made anyway, once their
    commands are gone, then what that frees (an internal snapshot whose
    clone it was). Cheap when there is nothing: no command. Never raises:
    what it could not destroy stays recorded, the next call retries."""
    done = abandoned.finished(sr)
    if not done:
        return
    try:
        collect(sr, done=done)
    except errors.StorageError as exc:
        log.warning("collect %s: %s", sr, exc.message)


def _free_recorded(sr, rows=None, done=None):
    """Destroy the datasets of the finished records of sr (the ones on the
    pool: their names are the records', the pool says which exist) and
    drop the records. Whether it destroyed anything."""
    done = abandoned.finished(sr) if done is None else done
    if not done:
        return False
    present = set(r["name"] for r in (rows or inventory.rows(sr)))
    freed = False
    for key, datasets in done:
        left = [d for d in datasets if d in present and
                d.startswith(sr + "/")]
        try:
            for name in left:
                log.info("collect: destroy %s, made by a call that failed "
                         "(VDI %s)", name, key)
                _destroy(name, recursive="@" not in name)
                freed = True
        except errors.StorageError as exc:
            log.warning("collect: %s stays recorded: %s", key, exc.message)
            continue
        try:
            abandoned.drop(sr, key)
        except OSError as exc:
            log.warning("collect: cannot drop the record of %s: %s", key,
                        exc)
    return freed


def _destroy(name, recursive, defer=False):
    try:
        zfs.destroy(name, recursive=recursive, defer=defer)
    except errors.DatasetNotFound:
        pass  # gone already (a deferred one, freed by ZFS meanwhile)


def sweep_clones(sr, in_use, freed=False):
    """Destroy the datapath clones of sr not in in_use, whatever boot made
    them (a detach that failed to destroy its clone, a host crash that
    skipped detach), then, if a clone went (freed: the caller destroyed
    one already), collect what it kept alive: a hidden parent. The pool is
    imported on this host only, and a clone being made is named by a state
    file first, so in_use is complete. Never raises: the next call
    retries."""
    try:
        found = zfs.find_local(meta.DATAPATH_CLONE, sr, types="volume")
    except errors.StorageError as exc:
        log.warning("cannot list datapath clones of %s: %s", sr, exc.message)
        return
    for name, _ in found:
        if name in in_use or name.rsplit("/", 1)[0] != sr:
            continue
        log.info("destroying %s, a datapath clone no attach uses", name)
        try:
            zfs.destroy(name)
            freed = True
        except errors.StorageError as exc:
            log.warning("could not destroy %s: %s", name, exc.message)
    if freed:
        try:
            collect(sr)
        except errors.StorageError as exc:
            log.warning("collect %s: %s", sr, exc.message)
