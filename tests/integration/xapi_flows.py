"""xapi-storage-script's own call sequences, played against the plugin.

From xapi's ocaml/xapi-storage-script/main.ml (xen-api): what
one SMAPIv2 operation turns into, call by call.
"""

import datetime


def domain_of(dp, vm):
    """The ``domain`` xapi-storage-script sends the datapath (main.ml
    domain_of, xen-api v24.40.0 and later): a guest's domain id as it is;
    for dom0, ``"u0-" ^ dp |> String.map (function '/' | '-' -> '_' | c ->
    c)``: the map runs over the whole string, "u0-" included. dp is a VBD
    (``vbd/0/xvda``) or a fresh uuid (export, import, copy, migration)."""
    if vm != "0":
        return vm
    return "".join("_" if c in "/-" else c for c in "u0-" + dp)


def vdi_create(plugin, sr, name, size, vdi_type="user", description=""):
    """VDI.create: Volume.create, then Volume.set vdi-type."""
    vol = plugin("Volume.create", sr=sr, name=name, description=description,
                 size=size, sharable=False)
    plugin("Volume.set", sr=sr, key=vol["key"], k="vdi-type", v=vdi_type)
    return plugin("Volume.stat", sr=sr, key=vol["key"])


def vdi_snapshot(plugin, sr, key, content_id=None, tags=()):
    """VDI.snapshot: Volume.snapshot, five Volume.set on the new volume,
    one Volume.set per tag on the source. content_id: the vdi_info's,
    which xapi fills from the source's other-config:content_id, else its
    location: the source's key (xapi_vdi.ml:836-840, main.ml:1442)."""
    content_id = key if content_id is None else content_id
    snap = plugin("Volume.snapshot", sr=sr, key=key)
    now = datetime.datetime.utcnow().strftime("%Y%m%dT%H:%M:%SZ")
    for k, v in (("snapshot_time", now), ("is_a_snapshot", "true"),
                 ("snapshot_of", key), ("content_id", content_id),
                 ("vdi-type", "user")):
        plugin("Volume.set", sr=sr, key=snap["key"], k=k, v=v)
    for tag in tags:
        plugin("Volume.set", sr=sr, key=key, k="tags-%s" % tag, v=tag)
    return plugin("Volume.stat", sr=sr, key=snap["key"])


def vdi_clone(plugin, sr, key):
    """VDI.clone: Volume.clone (of a snapshot or of a live volume)."""
    return plugin("Volume.clone", sr=sr, key=key)


def reset_on_boot_start(plugin, sr, key):
    """Without NONPERSISTENT: clone the VDI, record it as clone-on-boot."""
    clone = plugin("Volume.clone", sr=sr, key=key)
    plugin("Volume.set", sr=sr, key=key, k="clone-on-boot", v=clone["key"])
    return clone


def vdi_destroy(plugin, sr, key):
    """VDI.destroy: with a clone-on-boot key, Volume.destroy of that clone
    and of the VDI, the clone's destroy being sent twice."""
    vol = plugin("Volume.stat", sr=sr, key=key)
    other = vol["keys"].get("clone-on-boot")
    if other:
        plugin("Volume.destroy", sr=sr, key=other)
        plugin("Volume.unset", sr=sr, key=key, k="clone-on-boot")
        plugin("Volume.destroy", sr=sr, key=other)
    plugin("Volume.destroy", sr=sr, key=key)


def sr_scan(plugin, sr):
    """SR.scan: SR.ls minus volumes named by another's clone-on-boot."""
    vols = plugin("SR.ls", sr=sr)
    hidden = set(v["keys"].get("clone-on-boot") for v in vols)
    return [v for v in vols if v["key"] not in hidden]
