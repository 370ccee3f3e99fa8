"""The on-pool layout: where an SR and its VDIs live, and their properties.

The pool is the only source of truth: everything xapi ever told zfs-ng is
kept in ZFS user properties under one prefix, so an exported pool imported
on another host brings every VDI with its keys.

Layout
  SR dataset   the pool's root dataset when zfs-ng created the pool, else
               ``<parent>/zfsng-<sr uuid>`` under an adopted pool/dataset.
               Marked by a *local* ``PREFIX:sr-uuid`` (user properties are
               inherited, so only the local one marks the SR root).
  VDI          a zvol ``<sr dataset>/<vdi uuid>``.
  snapshot VDI a snapshot ``<sr dataset>/<parent uuid>@<vdi uuid>``.

Every VDI property is set locally on its own zvol or snapshot. Because
snapshots inherit user properties from their zvol, ``PREFIX:vdi`` holds the
object's own uuid: a zvol or snapshot whose ``vdi`` value is not its own uuid
is not a VDI (an admin's manual snapshot, or an internal one) and is never
listed.

Values that hold free text are JSON-encoded (ASCII only): ``zfs list -H``
separates columns with tabs and rows with newlines, and a name may contain
either.
"""

import json

from zfsng.errors import MetadataTooLarge, MetadataUnreadable

PREFIX = "org.xcp-ng.zfs-ng"
FORMAT_VERSION = "1"


def prop(name):
    return "%s:%s" % (PREFIX, name)


# SR properties (local on the SR dataset)
SR_UUID = prop("sr-uuid")
SR_NAME = prop("sr-name")
SR_DESCRIPTION = prop("sr-description")
SR_OWNER = prop("sr-owner")          # "pool" or "dataset": what zfs-ng made
SR_PROVISIONING = prop("provisioning")
SR_VOLBLOCKSIZE = prop("volblocksize")
SR_FORMAT = prop("format")
SR_DEVICES = prop("devices")         # JSON list: the disks zfs-ng was given
# JSON of the device-config SR.create was given, on a pool zfs-ng created;
# removed by the SR's first SR.attach. A pool that still has it was never
# attached: a create killed after "zpool create" (see sr.py, _unclaimed).
SR_UNCLAIMED = prop("unclaimed")

# VDI properties (local on each zvol / snapshot)
VDI_UUID = prop("vdi")
VDI_NAME = prop("name")
VDI_DESCRIPTION = prop("description")
VDI_KEYS = prop("keys")
VDI_SHARABLE = prop("sharable")

# A destroyed zvol that still has dependents keeps its name and data but
# gets this value in its vdi property: it is no VDI any more (see volume.py).
HIDDEN = "destroyed"
# Snapshots zfs-ng takes to clone a live volume: <vol>@<prefix><clone uuid>.
INTERNAL_SNAPSHOT = "zfsng-clone-"
# The datapath's reset point for a non-persistent disk: <vol>@<this>. It is
# zfs-ng's own, so it never keeps a destroyed VDI alive.
NONPERSISTENT_SNAPSHOT = "zfsng-nonpersistent"
# The datapath's read-only clone of a snapshot VDI, <sr>/<snapshot uuid>.ro,
# carries this property (zfsng_datapath.datapath).
DATAPATH_CLONE = prop("datapath-clone")

VOLUME_COLUMNS = ["name", "type", "volsize", "used", "usedds",
                  "usedrefreserv", "refreservation", "volblocksize",
                  "origin", "clones", "defer_destroy",
                  VDI_UUID, VDI_NAME, VDI_DESCRIPTION, VDI_KEYS,
                  VDI_SHARABLE]

SR_COLUMNS = ["name", "used", "available", SR_UUID, SR_NAME,
              SR_DESCRIPTION, SR_OWNER, SR_PROVISIONING, SR_VOLBLOCKSIZE,
              SR_DEVICES]

# The kernel refuses a user property value of ZAP_MAXVALUELEN (8192) bytes
# or more with E2BIG (dsl_props_set_check, zfs_check_userprops); libzfs
# does not check a dataset user property's value length (OpenZFS 2.1, 2.3).
MAX_VALUE = 8191

CHILD_PREFIX = "zfsng-"


def encode_text(text):
    return _checked(json.dumps(text))


def decode_text(value, default=""):
    if value is None:
        return default
    try:
        decoded = json.loads(value)
    except ValueError:
        return value  # set by hand: show it as it is
    return decoded if isinstance(decoded, str) else value


def encode_keys(keys):
    return _checked(json.dumps(keys, sort_keys=True))


def decode_keys(value, dataset="?"):
    """The keys as stored; MetadataUnreadable if the property was set by
    hand to anything but a JSON object."""
    if value is None:
        return {}
    try:
        keys = json.loads(value)
    except ValueError:
        keys = None
    if not isinstance(keys, dict):
        raise MetadataUnreadable(
            "%s: %s is not a JSON object: %r; set it to one (zfs set "
            "%s='{}' %s) or back to what it was" % (
                dataset, VDI_KEYS, value[:80], VDI_KEYS, dataset))
    return keys


def encode_bool(flag):
    return "true" if flag else "false"


def _checked(value):
    if len(value.encode("utf-8")) > MAX_VALUE:
        raise MetadataTooLarge(
            "metadata of %d bytes does not fit in a ZFS user property "
            "(at most %d bytes once encoded); shorten the name, description "
            "or keys" % (len(value), MAX_VALUE))
    return value


def vdi_dataset(sr, vdi_uuid):
    return "%s/%s" % (sr, vdi_uuid)


def child_sr_dataset(parent, sr_uuid):
    return "%s/%s%s" % (parent, CHILD_PREFIX, sr_uuid)


URI_SCHEME = "zfs-ng"


def volume_uri(dataset):
    """The URI that routes a volume to zfs-ng's raw datapath plugin.

    The dataset path (pool/.../uuid or pool/.../uuid@snap) is all the
    datapath needs; ZFS names hold no character a URI path must escape.
    """
    return "%s:///%s" % (URI_SCHEME, dataset)


def object_uuid(name):
    """The uuid part of a zvol or snapshot name (the last component)."""
    return name.rsplit("@", 1)[1] if "@" in name else name.rsplit("/", 1)[1]
