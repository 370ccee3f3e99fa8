"""Plugin.Query of the datapath plugin."""

from zfsng import VERSION, wire

# NONPERSISTENT: xapi then delegates reset-on-boot to Datapath.open/close
# (xapi-storage-script main.ml, epoch_begin/epoch_end) instead of cloning
# the VDI at every VM start. VDI_MIRROR_IN: xapi-storage-script calls
# Datapath.import_activate (a SMAPIv1 source's mirror into a leaf) only
# if this lists it (mirrorin.py).
FEATURES = ["NONPERSISTENT", "VDI_MIRROR_IN"]


@wire.method("Plugin.Query")
def query(dbg):
    return {
        "plugin": "zfs-ng",
        "name": "zfs-ng raw datapath",
        "description": "Hands a zfs-ng zvol to a guest through tapdisk in "
                       "raw (aio) mode, or to dom0 as a block device; "
                       "reset-on-boot by ZFS snapshot and rollback",
        "vendor": "zfs-ng project",
        "copyright": "(C) the zfs-ng authors",
        "version": VERSION,
        "required_api_version": "5.0",
        "features": list(FEATURES),
        "configuration": {},
        "required_cluster_stack": [],
    }
