"""ZFS access: every zfs and zpool command zfs-ng runs is built here.

Why one module: the argv conventions (``-Hp`` for parsable output, tabs
between columns, ``-`` for "no value"), the translation of stderr into typed
errors, and the bounded retry on "busy" are the same for every caller, and a
test can read one file to know every command the plugin may run.

Callers pass names that were already validated (see ``names``); this module
still refuses anything that starts with ``-`` so no value can ever be taken
for an option.
"""

import re

from zfsng import errors, log, runner

# sendstream (the stream parser, with blockmap, struct, zlib and base64) is
# imported by the three send functions that use it, not here: every plugin
# call is a new process that imports this module, and only CBT, compose
# and a mirror's copy read a send stream.

# stderr fragments -> error class. First match wins. The texts are those of
# libzfs (lib/libzfs/libzfs_util.c zfs_standard_error), stable since 0.6.
# They stay text, compiled (and cached by re) only when a command fails:
# every call is a new process, and compiling them all at import costs each.
_ERROR_PATTERNS = [
    # "bookmark '<vol>#<name>' does not exist." (zfs destroy of a bookmark)
    (r"dataset does not exist|could not find any snapshots|"
     r"bookmark '[^']*' does not exist",
     errors.DatasetNotFound),
    # zpool import of a pool another host holds: multihost saw its writes
    # ("pool is imported on host 'x' (hostid=...)", or on 2.1 by guid
    # "pool is imported on x (hostid: 0x...)"), or its labels name another
    # hostid ("previously in use from another system").
    (r"pool is imported on |in use from another system|"
     r"imported by another system",
     errors.PoolImportedElsewhere),
    # zpool import of a pool whose name an imported pool already has: from
    # zpool's own check, or from the kernel (EEXIST), as on a multihost pool
    (r"a pool with that name already exists|"
     r"cannot import '[^']*'( as '[^']*')?: pool already exists",
     errors.PoolNameCollision),
    # libzfs's EZFS_POOLUNAVAIL: a SUSPENDED pool refuses every change
    (r"I/O is currently suspended", errors.PoolSuspended),
    (r"no such pool|pool not found|no such pool or dataset",
     errors.PoolNotFound),
    (r"dataset already exists|pool already exists|bookmark exists",
     errors.DatasetExists),
    (r"is busy|resource busy", errors.DatasetBusy),
    (r"out of space|insufficient space|not enough space|"
     r"greater than available space",
     errors.OutOfSpace),
    # zfs rollback without -r (cmd/zfs rollback_check): newer snapshots
    (r"more recent snapshots or bookmarks exist",
     errors.RollbackBlocked),
]

BUSY_RETRIES = 5
BUSY_DELAY = 0.3  # seconds, doubled after each try: about 9 s in all


def _check_args(args):
    for arg in args:
        if not isinstance(arg, str):
            raise errors.InternalError("non-string zfs argument %r" % (arg,))


def classify(result):
    text = result.err.strip() or result.out.strip()
    for pattern, cls in _ERROR_PATTERNS:
        if re.search(pattern, text):
            return cls(text)
    return errors.ZfsError("%s failed (exit %d): %s" % (
        " ".join(result.argv[:2]), result.rc, text or "no message"))


def run(argv, retry_busy=True, stdin_text=None):
    """Run a zfs/zpool argv; return stdout or raise a typed ZfsError.

    Only "busy" is retried, a bounded number of times: it is the one
    transient error (a zvol still opened by udev's blkid right after
    creation, a pool still syncing), and everything else would fail again.
    """
    _check_args(argv)
    result = runner.run_retried(
        argv, lambda r: isinstance(classify(r), errors.DatasetBusy),
        BUSY_RETRIES if retry_busy else 1, BUSY_DELAY, backoff=2,
        stdin_text=stdin_text)
    if result.rc == 0:
        return result.out
    raise classify(result)


def zfs(*args, **kwargs):
    return run(["zfs"] + list(args), **kwargs)


def zpool(*args, **kwargs):
    return run(["zpool"] + list(args), **kwargs)


def parse_table(text, columns):
    """Parse ``-H`` output into a list of dicts keyed by column name.

    Cells that are ``-`` become None: that is how zfs prints "no value".
    """
    rows = []
    for line in text.split("\n"):   # zfs's row ends (not U+2028 & co.)
        if not line:
            continue
        cells = line.split("\t")
        if len(cells) != len(columns):
            raise errors.ZfsError(
                "unexpected zfs output (want %d columns): %r"
                % (len(columns), line))
        rows.append(dict((c, None if v == "-" else v)
                         for c, v in zip(columns, cells)))
    return rows


# --- datasets -------------------------------------------------------------

def list_datasets(root, columns, types="volume,snapshot", recursive=True,
                  depth=None):
    """One ``zfs list`` of root (and below) with the given columns.

    ``-H`` puts tabs between columns and newlines between rows, and prints
    values as they are: a user property set by hand to a value with a tab
    or a newline (``zfs set org.xcp-ng.zfs-ng:name=$'a\\tb'``) breaks its
    row, and the plain parse would fail the whole listing (every SR.ls of
    the SR). Names never hold either, so the name is asked for first and
    last: a sound row has every column and the same name at both ends.
    The dataset of a broken row is read again alone (``_read_alone``), in
    place, so one odd value costs a few commands, never the listing.
    """
    wanted = columns if columns[:1] == ["name"] else ["name"] + columns
    argv = ["list", "-Hp", "-o", ",".join(wanted + ["name"]), "-t", types]
    if depth is not None:
        argv += ["-d", str(depth)]
    elif recursive:
        argv.append("-r")
    rows = []
    for row, suspects in _rows_and_breaks(zfs(*(argv + ["--", root])),
                                          wanted, root):
        if row is not None:
            rows.append(row)
        for name in suspects:
            if name not in [r["name"] for r in rows]:
                rows += _read_alone(name, wanted)
    return rows


def _under(name, root):
    return name == root or name.startswith(root + "/") or \
        name.startswith(root + "@")


def _rows_and_breaks(text, wanted, root):
    """[(row or None, [names of datasets whose row broke here])] of a
    ``-o name,<wanted>,name`` listing, in order. A broken row's pieces
    start or end with its dataset's name (the others hold parts of the
    odd value: never a name under root that is not its own, but for a
    value made to look like one, which only costs a needless re-read)."""
    out = []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()       # the last row's newline
    for line in lines:
        cells = line.split("\t")
        if len(cells) == len(wanted) + 1 and cells[0] == cells[-1] and \
                _under(cells[0], root):
            out.append((dict((c, None if v == "-" else v)
                             for c, v in zip(wanted, cells)), []))
            continue
        suspects = [n for n in (cells[0], cells[-1]) if _under(n, root)]
        log.warning("zfs list: a row broken by a tab or newline in a "
                    "property value: %r; reading %s again alone", line[:200],
                    ", ".join(suspects) or "nothing (no dataset named)")
        out.append((None, sorted(set(suspects))))
    return out


def _read_alone(name, wanted):
    """[the row of one dataset] with its user properties read one by one:
    alone, ``zfs get -o value`` prints just the value, tabs, newlines and
    all ([] if the dataset is gone meanwhile)."""
    native = [c for c in wanted if ":" not in c]
    try:
        text = zfs("list", "-Hp", "-o", ",".join(native), "-t", "all",
                   "--", name)
        row = parse_table(text, native)[0]
        for prop in [c for c in wanted if ":" in c]:
            value = zfs("get", "-Hp", "-o", "value", prop, "--", name)
            value = value[:-1] if value.endswith("\n") else value
            row[prop] = None if value == "-" else value
    except (errors.DatasetNotFound, IndexError):
        return []
    return [row]


def get_one(name, columns, types="all"):
    """The columns of one dataset, or raise DatasetNotFound."""
    rows = list_datasets(name, columns, types=types, recursive=False)
    if not rows:
        raise errors.DatasetNotFound("dataset does not exist: %s" % name)
    return rows[0]


def exists(name):
    try:
        get_one(name, ["name"])
        return True
    except errors.DatasetNotFound:
        return False


def find_local(prop, pool=None, types="filesystem"):
    """[(dataset, value)] for datasets where prop is set locally, in one
    pool or (pool None) in every imported pool.

    User properties are inherited, so only the local ones mark the dataset
    that carries them (an SR root, not the zvols under it).
    """
    argv = ["get", "-Hp", "-r", "-s", "local", "-t", types,
            "-o", "name,value", prop]
    out = zfs(*(argv + (["--", pool] if pool else [])))
    return [(r["name"], r["value"])
            for r in parse_table(out, ["name", "value"])]


def set_props(name, props):
    """Set several properties in one command (one sync task: atomic)."""
    if not props:
        return
    if name.startswith("-"):
        raise errors.InternalError("dataset name looks like an option: %r"
                                   % name)
    # No "--" here: zfs 2.1's "set" does not use getopt and rejects it.
    argv = ["set"] + ["%s=%s" % (k, v) for k, v in sorted(props.items())]
    zfs(*(argv + [name]))


def options(flag, props):
    """``flag k=v`` for each property, in key order (argv, never a shell
    string: a value may hold any character)."""
    argv = []
    for key, value in sorted((props or {}).items()):
        argv += [flag, "%s=%s" % (key, value)]
    return argv


def create_volume(name, size, props, sparse=True):
    argv = ["create", "-V", str(size)] + (["-s"] if sparse else [])
    zfs(*(argv + options("-o", props) + ["--", name]))


def snapshot(name, props=None):
    """``zfs snapshot -o k=v... pool/vol@snap``: one atomic command."""
    zfs(*(["snapshot"] + options("-o", props) + ["--", name]))


def clone(origin, name, props):
    zfs(*(["clone"] + options("-o", props) + ["--", origin, name]))


def create_filesystem(name, props):
    zfs(*(["create"] + options("-o", props) + ["--", name]))


def destroy(name, recursive=False, defer=False):
    argv = ["destroy"]
    if recursive:
        argv.append("-r")
    if defer:
        argv.append("-d")
    zfs(*(argv + ["--", name]))


def rollback(snapshot):
    """``zfs rollback`` of a zvol to its latest snapshot. Never ``-r``
    (which destroys the newer snapshots, VDIs among them): when there are
    newer ones, RollbackBlocked, and nothing changed."""
    zfs("rollback", "--", snapshot)


def rename(name, new):
    """``zfs rename``: a zvol, with all its snapshots (their clones follow:
    their origin is renamed too), or a snapshot within its zvol."""
    zfs("rename", "--", name, new)


def promote(clone):
    """``zfs promote``: the clone takes its origin's snapshots up to and
    including the origin snapshot; the origin becomes a clone of it."""
    if clone.startswith("-"):
        raise errors.InternalError("dataset name looks like an option: %r"
                                   % clone)
    # No "--": zfs promote takes no option and refuses any word starting
    # with "-" (zfs_do_promote, OpenZFS 2.1 and 2.3).
    zfs("promote", clone)


def bookmark(snapshot, name):
    """``zfs bookmark <vol>@<snap> <vol>#<name>``: the snapshot's place in
    the zvol's history, kept when the snapshot goes; a bookmark is a valid
    source of an incremental send."""
    zfs("bookmark", "--", snapshot, name)


def send_changes(base, target, bound=None):
    """(writes, frees): the range sets of target's data object that
    ``zfs send -i base target`` carries (sendstream.writes_and_frees); base
    is a snapshot or bookmark of target's zvol (or of its origin's). The
    stream is read as it comes and never kept: its headers only. bound:
    seconds (the changed data is read: the default bound caps its size)."""
    for name in (base, target):
        if name.startswith("-"):
            raise errors.InternalError("dataset name looks like an option:"
                                       " %r" % name)
    argv = ["zfs", "send", "-L", "-e", "-c", "-i", base, target]
    from zfsng import sendstream
    result, found = runner.stream(argv, sendstream.writes_and_frees,
                                  bound=bound)
    if result.rc != 0:
        raise classify(result)
    return found


def send_data(snapshot, bound=None):
    """The range set of the snapshot's data: the writes of a full ``zfs
    send -L -e -c`` (holes come as frees and are never read; data is read
    once, within the command's bound)."""
    if snapshot.startswith("-"):
        raise errors.InternalError("dataset name looks like an option: %r"
                                   % snapshot)
    argv = ["zfs", "send", "-L", "-e", "-c", snapshot]
    from zfsng import sendstream
    result, found = runner.stream(argv, sendstream.writes_and_frees,
                                  bound=bound)
    if result.rc != 0:
        raise classify(result)
    return found[0]


def send_replay(base, snapshot, write, free, bound):
    """Replay the snapshot's data (the change since base, a snapshot of the
    same zvol, or all of it when base is None) through write and free
    (sendstream.replay), read from ``zfs send -L`` as it comes. Returns
    the bytes written. bound: seconds for the whole send."""
    for name in (base or "", snapshot):
        if name.startswith("-"):
            raise errors.InternalError("dataset name looks like an option:"
                                       " %r" % name)
    argv = ["zfs", "send", "-L"] + (["-i", base] if base else []) + \
        [snapshot]
    from zfsng import sendstream
    result, written = runner.stream(
        argv, lambda read: sendstream.replay(read, write, free), bound=bound)
    if result.rc != 0:
        raise classify(result)
    return written


def createtxg(name):
    """The txg a snapshot was taken in (a bookmark: its snapshot's)."""
    text = zfs("get", "-Hp", "-o", "value", "-t", "all", "createtxg", "--",
               name).strip()
    if not text.isdigit():
        raise errors.ZfsError("no createtxg for %s: %r" % (name, text))
    return int(text)


def inherit(name, prop):
    """Remove a dataset's local value of prop (``zfs inherit``)."""
    zfs("inherit", "--", prop, name)


def version():
    """``zfs version`` first line, e.g. 'zfs-2.1.11-1'."""
    out = zfs("version", retry_busy=False)
    return out.splitlines()[0].strip() if out else "unknown"


def kernel_version():
    """(major, minor) of the loaded OpenZFS module, from ``zfs version``'s
    zfs-kmod line (the userland's if there is none), or None."""
    return parse_version(zfs("version", retry_busy=False))


def parse_version(out):
    """(major, minor) from ``zfs version``'s output: its zfs-kmod line,
    the module that runs, else its userland line; None if neither."""
    found = [re.match(r"^zfs(-kmod)?-([0-9]+)\.([0-9]+)", line.strip())
             for line in out.splitlines()]
    found = sorted((m for m in found if m), key=lambda m: not m.group(1))
    return (int(found[0].group(2)), int(found[0].group(3))) if found \
        else None
