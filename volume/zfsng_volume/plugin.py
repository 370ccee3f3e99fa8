"""Plugin.*: what zfs-ng is, what it can do, and a report for support."""

from zfsng import VERSION, errors, hostid, inventory, meta, pools, wire, \
    zfs
from zfsng_volume import devconfig, health

# Declared honestly: only what works end to end. xapi-storage-script adds
# the SR_*/VDI_* features of every method executable on its own.
FEATURES = ["SR_PROBE", "SR_UPDATE", "SR_STATS", "VDI_CREATE", "VDI_DELETE",
            "VDI_UPDATE", "VDI_SNAPSHOT", "VDI_CLONE", "VDI_RESIZE",
            "THIN_PROVISIONING", "LARGE_VDI",
            # xapi allows VDI.enable_cbt, disable_cbt, list_changed_blocks
            # and data_destroy only if Plugin.Query lists it
            "VDI_CONFIG_CBT",
            # storage migration (xapi_vm_migrate.ml wants VDI_MIRROR and
            # VDI_SNAPSHOT of a source SR, and VDI_MIRROR_IN, which
            # VDI_MIRROR satisfies, of a destination): the datapath's
            # Data.mirror and Data.stat, and the Nbd of its attach; a
            # SMAPIv1 source's mirror: the datapath's import_activate
            # (VDI_MIRROR_IN in its own Query) and Volume.compose.
            "VDI_MIRROR", "VDI_COMPOSE",
            # VM.revert's VDI.revert (xapi v26.1.14 and later): the
            # script does not add it, the plugin must (Volume.revert)
            "VDI_REVERT",
            # xapi activates a VDI attached read-only (a read-only VBD,
            # a copy's source and base, an export, pygrub) with
            # VDI.activate_readonly, not activate3, only if this lists it
            # (storage_mux.ml activate3): the datapath's
            # activate_readonly, tapdisk opened read-only (-R), no fresh
            # content_id, no writer recorded
            "VDI_ACTIVATE_READONLY"]


@wire.method("Plugin.Query")
def query(dbg):
    return {
        "plugin": "zfs-ng",
        "name": "zfs-ng: ZFS zvol storage",
        "description": "Local ZFS storage: every VDI is a zvol, snapshots "
                       "and clones are native ZFS, no image format on top",
        "vendor": "zfs-ng project",
        "copyright": "(C) the zfs-ng authors",
        "version": VERSION,
        "required_api_version": "5.0",
        "features": list(FEATURES),
        "configuration": dict(devconfig.KEYS),
        "required_cluster_stack": [],
        "supported_image_formats": ["raw"],
    }


def _section(title, body):
    return "== %s ==\n%s\n" % (title, body.rstrip())


def _sr_settings(dataset):
    cols = ["name", "used", "available", "compression", "compressratio",
            "dedup", "sync", meta.SR_UUID, meta.SR_OWNER,
            meta.SR_PROVISIONING, meta.SR_VOLBLOCKSIZE]
    row = zfs.get_one(dataset, cols)
    vols = zfs.list_datasets(dataset, ["name"], types="volume,snapshot")
    lines = ["%s: %s" % (c, row[c]) for c in cols]
    lines.append("zvols and snapshots: %d" % len(vols))
    return "\n".join(lines)


def _pool_problems():
    """One line per imported pool with a problem, or a line saying there
    is none.

    First in the report: SR.stat reports a pool that still serves every
    block as Healthy (xapi would refuse to scan it otherwise), so this is
    where support sees at once what the SR's health hides. Every imported
    pool, from ``zpool`` alone: it answers even for a suspended pool, when
    no ``zfs`` command (and so no SR lookup) does.
    """
    try:
        imported = sorted(p["name"] for p in pools.list_pools())
    except errors.StorageError as exc:
        return "cannot list the pools: %s" % exc.message
    lines = []
    for pool in imported:
        try:
            seen = health.pool_health(pool)[1]
        except errors.StorageError as exc:
            lines.append("pool %s: health unknown: %s" % (pool, exc.message))
            continue
        if seen != ["Healthy", ""]:
            lines.append("%s (SR reported to xapi as %s)" % (seen[1], seen[0]))
    return "\n".join(lines) or ("no problem: every imported pool is ONLINE "
                                "and 'zpool status -x' is clean")


def _hostid_line():
    """Multihost protection tells hosts apart by hostid: say which one this
    host has, or that it has none."""
    value = hostid.current()
    if not value:
        return ("none: pools cannot have multihost protection; run "
                "'zgenhostid' (see README, shared disks)")
    return "%s (must differ on every host that sees the same disks)" \
        % hostid.text(value)


@wire.method("Plugin.diagnostics")
def diagnostics(dbg):
    """A readable report: the pools' problems first, then the ZFS version,
    each SR's pool status and settings."""
    out = [_section("pool health", _pool_problems()),
           _section("zfs-ng", "version %s" % VERSION)]
    out.append(_section("hostid", _hostid_line()))
    try:
        out.append(_section("ZFS", zfs.version()))
        srs = inventory.find_srs()
    except errors.StorageError as exc:
        out.append(_section("ZFS", "not usable: %s" % exc.message))
        return "\n".join(out)
    if not srs:
        out.append(_section("SRs", "no zfs-ng SR is attached on this host"))
    for pool in sorted(set(meta.pool_of(ds) for ds, _ in srs)):
        out.append(_section("zpool status %s" % pool, pools.pool_status(pool)))
    for dataset, _ in srs:
        out.append(_section("SR %s" % dataset, _sr_settings(dataset)))
    return "\n".join(out)


@wire.method("Plugin.ls")
def ls(dbg):
    """The attached zfs-ng SRs on this host, by their sr string."""
    return [dataset for dataset, _ in inventory.find_srs()]
