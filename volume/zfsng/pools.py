"""Pools: listing, creating, importing, exporting and destroying them, their
leaves and the ZFS labels on disks.

Kept apart from ``zfs`` (datasets, snapshots, streams) because these are
the SR's concerns, not the VDI's: SR.* and its disk checks and clean-up
call them (and a migration's mirror job ``sync``, to keep its pause
short). They run through ``zfs.zpool`` (and ``zdb -l`` through
the runner) so every pool command has the same parsing, bounds and typed
errors as the dataset commands.
"""

import re

from zfsng import errors, runner, zfs

# multihost: whether a suspended pool can be resumed (health.pool_health)
POOL_COLUMNS = ["name", "guid", "health", "size", "allocated", "free",
                "multihost"]


def list_pools():
    """Imported pools as dicts of POOL_COLUMNS."""
    out = zfs.zpool("list", "-Hp", "-o", ",".join(POOL_COLUMNS))
    return zfs.parse_table(out, POOL_COLUMNS)


def pool_by_guid(guid):
    for pool in list_pools():
        if pool["guid"] == guid:
            return pool
    return None


def pool_by_name(name):
    for pool in list_pools():
        if pool["name"] == name:
            return pool
    return None


def _vdev_names(pool):
    """The names in ``zpool list -vHP``: the pool, every vdev (leaves as
    device paths, groups as mirror-0, raidz2-1, draid1:...-0) and the
    class headers."""
    out = zfs.zpool("list", "-v", "-H", "-P", "-o", "name", "--", pool)
    # In scripted mode every vdev line is "\t<name>" followed by the fixed
    # statistics columns, whatever -o says (print_list_stats): keep the name.
    return [line.strip().split("\t")[0] for line in out.splitlines()]


def pool_leaf_devices(pool):
    """The device paths of a pool's leaf vdevs (``zpool list -vHP``)."""
    return [name for name in _vdev_names(pool) if name.startswith("/")]


def has_parity(pool):
    """Whether the pool keeps data on raidz or dRAID vdevs (only data
    vdevs can be: log, special and dedup take disks and mirrors only)."""
    return any(re.match(r"^(raidz|draid)", name)
               for name in _vdev_names(pool)[1:])


def create_pool(name, vdev_args, pool_props, fs_props, force=False):
    argv = ["create"] + (["-f"] if force else []) + \
        zfs.options("-o", pool_props) + zfs.options("-O", fs_props) + \
        ["-m", "none", "--", name]
    zfs.zpool(*(argv + list(vdev_args)))


def import_pool(guid, search_dirs=(), readonly=False, mount=True,
                new_name=None):
    """Import by guid (stable across renames) without a cachefile.

    ``cachefile=none``: xapi, not the host's boot scripts, decides when an
    SR's pool is imported (SR.attach), so the pool must not be imported
    behind its back at boot. ``new_name`` imports it under that name
    (``zpool import <guid> <new name>``): written to its labels, unless
    readonly.
    """
    argv = ["import", "-o", "cachefile=none"]
    if readonly:
        argv += ["-o", "readonly=on"]
    if not mount:
        argv.append("-N")
    for directory in search_dirs:
        argv += ["-d", directory]
    zfs.zpool(*(argv + ["--", guid] + ([new_name] if new_name else [])))


def export_pool(name):
    zfs.zpool("export", "--", name)


def destroy_pool(name):
    zfs.zpool("destroy", "--", name)


def sync(name):
    """``zpool sync``: write out the pool's dirty data now, so that a
    snapshot taken just after has little left to wait for."""
    zfs.zpool("sync", "--", name)


_LABEL_KEYS = ("name", "state", "pool_guid", "hostid", "hostname", "guid")


def _label(device):
    """The facts of a device's first readable ZFS label (``zdb -l``): the
    first value of each of _LABEL_KEYS, as zdb prints it, quotes removed.
    The label's own keys come before its vdev tree, so "guid" is the
    device's own vdev guid."""
    result = runner.run(["zdb", "-l", "--", device])
    label = {}
    for line in result.out.splitlines():
        key, sep, value = line.strip().partition(": ")
        if sep and key in _LABEL_KEYS and key not in label:
            label[key] = value.strip().strip("'")
    return label


def read_label(device):
    """The pool facts in a device's first readable ZFS label, from
    ``zdb -l``: {name, state, pool_guid, hostid, hostname, guid} (values as
    zdb prints them, quotes removed; state "0" is imported, "1" exported),
    or None when the device holds no pool's label. Reads the device only.
    """
    label = _label(device)
    return label if label.get("pool_guid") else None


def vdev_label(device):
    """The ZFS label on device as read_label gives it, also for a cache or
    spare device (whose label names no pool, only its own vdev guid), or
    None when it holds no label."""
    label = _label(device)
    return label if label.get("guid") else None


# "ashift: N" in a label's vdev tree: its top-level vdev's (vdev_label.c
# vdev_config_generate; a leaf's label holds its top-level vdev's tree,
# spa_config.c spa_config_generate), and in 2.3 a cache device's own.
_ASHIFT_RE = re.compile(r"^\s*ashift: ([0-9]+)\s*$", re.M)


def max_ashift(pool):
    """The largest ashift of the pool's vdevs, as the labels on its leaves
    say, at least the pool's ``ashift`` property; None when no leaf's label
    could be read.

    Why the labels: the ``ashift`` pool property is only the default of
    vdevs yet to be made (0, "detected", unless ``-o ashift`` was given),
    not what a vdev has; OpenZFS 2.1 has no vdev properties (``zpool get
    ashift <pool> <vdev>`` is 2.2+); plain ``zdb -C`` needs a cachefile
    zfs-ng's pools have none of, and ``zdb -e`` opens the whole pool. A
    top-level vdev's ashift never changes, each of its leaves' labels
    holds it (``zdb -l`` reads four 256 KiB labels of one device), and a
    pool that can write has a readable leaf in each top-level vdev. A
    label is counted only if it names this pool's guid (a path reused by
    another pool's disk counts nothing). Log, special and (2.3) cache
    vdevs are counted too, though ZFS's estimate sizes by the normal
    class's only (spa_max_ashift): too large errs on the safe side."""
    text = zfs.zpool("get", "-Hp", "-o", "property,value", "ashift,guid",
                     "--", pool)
    props = dict(line.split("\t", 1) for line in text.splitlines()
                 if "\t" in line)
    guid = (props.get("guid") or "").strip()
    found = []
    for device in pool_leaf_devices(pool):
        found += _label_ashifts(device, guid)
    if not found:
        return None
    prop = (props.get("ashift") or "").strip()
    return max(found + [int(prop)] if prop.isdigit() else found)


def _label_ashifts(device, guid):
    """The ashifts ``zdb -l`` prints of device, if its label names the pool
    guid; none if it cannot be read within its bound."""
    try:
        out = runner.run(["zdb", "-l", "--", device]).out
    except errors.CommandTimeout:
        return []
    if not guid or "pool_guid: %s" % guid not in [
            line.strip() for line in out.splitlines()]:
        return []
    return [int(value) for value in _ASHIFT_RE.findall(out)]


def pool_leaves(pool):
    """[(path, vdev guid)] of a pool's leaf vdevs.

    ``zpool list -v -H`` prints the same lines in the same order with -P
    (device paths) and with -g (vdev guids): the pool, each vdev, the class
    headers.
    """
    paths = zfs.zpool("list", "-v", "-H", "-P", "-o", "name", "--",
                      pool).splitlines()
    guids = zfs.zpool("list", "-v", "-H", "-g", "-o", "name", "--",
                      pool).splitlines()
    if len(paths) != len(guids):
        raise errors.ZfsError("zpool list -P and -g of %s disagree "
                              "(the pool changed meanwhile?)" % pool)
    leaves = []
    for path, guid in zip(paths, guids):
        path, guid = path.strip().split("\t")[0], guid.strip().split("\t")[0]
        if path.startswith("/") and guid.isdigit():
            leaves.append((path, guid))
    return leaves


def labelclear(device):
    zfs.zpool("labelclear", "-f", "--", device)


def importable_pools(search_dirs=()):
    """Pools that ``zpool import`` could import: [{name, guid, state}].

    ``zpool import`` without a pool argument has no parsable mode, so this
    reads its stable "pool:", "id:" and "state:" lines.
    """
    argv = ["zpool", "import"]
    for directory in search_dirs:
        argv += ["-d", directory]
    result = runner.run(argv)
    if result.rc != 0 and "no pools available" not in result.err:
        raise zfs.classify(result)
    pools, current = [], None
    for line in result.out.splitlines():
        key, _, value = line.strip().partition(": ")
        if key == "pool":
            current = {"name": value.strip(), "guid": None, "state": None}
            pools.append(current)
        elif current is not None and key == "id":
            current["guid"] = value.strip()
        elif current is not None and key == "state":
            current["state"] = value.strip()
    return [p for p in pools if p["guid"]]


def pool_status(name, problems_only=False):
    """``zpool status -P`` text (for health reasons and diagnostics).

    problems_only adds ``-x``: a pool with nothing wrong prints only
    "pool '<name>' is healthy", without a status sentence or config. -x
    also leaves out the notices that are no problem (features not enabled,
    an older on-disk version) while keeping resilvers, data errors and
    faulted cache or log devices, which leave a pool ONLINE.
    """
    if problems_only:
        return zfs.zpool("status", "-x", "-P", "--", name)
    return zfs.zpool("status", "-P", "--", name)
