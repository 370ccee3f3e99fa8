"""The on-pool model: where an SR and its VDIs live, their properties, and
what every dataset zfs-ng finds is to it. Pure rules on names and listing
rows (``zfs list`` columns as dicts): no command runs here, so every other
module asks this one what a dataset is, and none decides it alone.

The pool is the only source of truth: everything xapi ever told zfs-ng is
kept in ZFS user properties under one prefix, so an exported pool imported
on another host brings every VDI with its keys.

Layout
  SR dataset   the pool's root dataset when zfs-ng created the pool, else
               ``<parent>/zfsng-<sr uuid>`` under an adopted pool/dataset.
               Marked by a *local* ``PREFIX:sr-uuid`` (user properties are
               inherited, so only the local one marks the SR root).
  VDI          a zvol ``<sr dataset>/<vdi uuid>``, made as
               ``<sr dataset>/<vdi uuid>.new`` and renamed once it has
               its properties (``is_unfinished_create``).
  snapshot VDI a snapshot ``<sr dataset>/<parent uuid>@<vdi uuid>``.

Every VDI property is set locally on its own zvol or snapshot. Because
snapshots inherit user properties from their zvol, ``PREFIX:vdi`` holds the
object's own uuid: a zvol or snapshot whose ``vdi`` value is not its own uuid
is not a VDI (an admin's manual snapshot, or an internal one) and is never
listed.

Kinds (see the functions of the same names below)
  VDI            a zvol or snapshot whose ``vdi`` is its own uuid, not
                 being freed (``is_vdi``)
  hidden parent  a zvol destroyed while it had dependents: ``vdi`` is
                 HIDDEN; the collector frees it once nothing needs it
                 (``is_hidden``; ``ownership.has_dependents``)
  stand-in       a zvol the datapath set aside to reset a non-persistent
                 VDI, between its two commands (``is_stand_in``)
  internal       ``<vol>@zfsng-clone-<uuid>``: taken to clone a live VDI,
                 destroyed deferred with its clone (``is_internal``)
  reset point    ``<vol>@zfsng-nonpersistent``: a non-persistent VDI's
                 content at open (``reset_point``)
  datapath clone ``<sr>/<snapshot uuid>.ro``: a snapshot VDI served
                 read-only to a guest, marked DATAPATH_CLONE
                 (``clone_name``, ``is_clone_of``)
  data-destroyed a snapshot VDI whose data Volume.data_destroy freed:
                 a bookmark <vol>#<uuid> keeps its place in the zvol's
                 history, an empty zvol <sr>/<uuid> (volmode=none,
                 CBT_BOOKMARK) keeps its properties (``is_data_destroyed``)
  cbt snapshot   ``<vol>@zfsng-cbt-<uuid>``: taken by list_changed_blocks
                 for the live disk, destroyed by it (``is_internal``)
  mirror sink    ``<sr>/<leaf uuid>.in``, MIRROR_SINK: a filesystem
                 with a quota (the bound on its space) holding the zvol
                 ``<sink>/writes`` a storage migration's mirror writes the
                 leaf's data into, one 512-byte block per sector
                 (``is_sink``, ``sink_volume``); a sink made before the
                 bound is that zvol itself. Freed with its leaf.
                 ``<sink zvol>@zfsng-compose``: what Volume.compose reads
                 its block births from (``is_internal``)
  composed       a parent zvol Volume.compose made whole: it carries the
                 leaf's uuid (vdi and COMPOSE_INTO, set in one command)
                 and is that VDI once the leaf's zvol is gone, until it
                 has the leaf's name (``is_composing``)
  unfinished     a zvol a power cut left without its properties or its
                 final name: ``<sr>/<uuid>.new`` (Volume.create,
                 data_destroy), a clone ``<sr>/<uuid>`` or
                 ``<sr>/<uuid>.ro`` with no mark
                 (Volume.clone, a reset's rotation, the datapath's clone);
                 the collector frees them (``is_unfinished_create``,
                 ``is_unmarked_clone``)
  foreign        anything else: an admin's snapshot, dataset or bookmark;
                 never changed (``ownership``)

How long the names get: ``namelimits``.

Values that hold free text are JSON-encoded (ASCII only): ``zfs list -H``
separates columns with tabs and rows with newlines, and a name may contain
either.
"""

from zfsng import names

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
# Changed block tracking (cbt.py). CBT_ENABLED: "true" on a zvol whose
# snapshots are tracked, and on each snapshot taken meanwhile (set locally
# at the snapshot, so a later disable does not change what it was).
# CBT_MAP: a snapshot's allocation map (blockmap.encode_map), what
# list_changed_blocks learnt of where it may hold data.
# CBT_BOOKMARK: on a data-destroyed snapshot VDI (see is_data_destroyed),
# the bookmark that keeps its place in the zvol's history.
# The VDI's content_id (xapi's key "content_id"): what xapi's storage
# copies match a base by (zfsng/contentid.py says why it is kept apart
# from the keys and what it may be).
CONTENT_ID = prop("content-id")
CBT_ENABLED = prop("cbt")
CBT_MAP = prop("cbt-map")
CBT_BOOKMARK = prop("cbt-bookmark")

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
# list_changed_blocks to the live disk sends from a snapshot taken for the
# call, <vol>@<this><uuid>, destroyed before the call returns.
CBT_SNAPSHOT = "zfsng-cbt-"
# A storage migration's copy rounds snapshot the live disk, <vol>@<this>
# <uuid>, held (lock.reading) by the mirror job until it destroys them.
MIRROR_SNAPSHOT = "zfsng-sxm-"
# A storage migration into zfs-ng: the source's mirror writes the leaf
# VDI's new data into <sr>/<leaf uuid><SINK_SUFFIX>, a zvol of SECTOR-byte
# blocks without compression, whose MIRROR_SINK is the leaf's uuid: every
# sector written is one block whose birth ZFS records, zeros included,
# the granularity Volume.compose needs (zfsng_volume/compose.py). Compose
# reads its block births from <sink>@<COMPOSE_SNAPSHOT>; the parent, once
# the writes are on it, carries the leaf's uuid in COMPOSE_INTO (and in
# VDI_UUID) until it has the leaf's name (is_composing).
# The sink is a filesystem with a quota, <sr>/<leaf uuid><SINK_SUFFIX>, and
# the zvol is <sink>/<SINK_VOLUME>: ZFS bounds a zvol's space only through
# a quota on a filesystem above it (zfsng_datapath/mirrorin.py says why and
# how much). A sink made before that (a host upgraded mid-migration) is
# the zvol <sr>/<leaf uuid><SINK_SUFFIX> itself, unbounded.
SINK_SUFFIX = ".in"
SINK_VOLUME = "writes"
MIRROR_SINK = prop("mirror-sink")
# A zvol a mirror guards (zfsng/spaceguard.py): its refreservation before.
MIRROR_GUARD = prop("mirror-guard")
SECTOR = 512
COMPOSE_SNAPSHOT = "zfsng-compose"
# Volume.revert (zfsng/revertsteps.py) sets the VDI's zvol aside and clones
# it again from the snapshot; the zvol set aside carries, until the revert
# is done, "<vdi uuid>@<snapshot uuid>" in REVERTING.
REVERTING = prop("reverting")
# A zvol a revert or a reset set aside (revertsteps, zfsng_datapath/reset.py)
# carries, from the command that hides it (with vdi=HIDDEN), the uuid of
# the VDI it was: the snapshots it keeps are still that VDI's (xapi's
# snapshot_of), and a later revert to one of them finds it so
# (``snapshot_of``). Its snapshots inherit the value.
ASIDE_OF = prop("aside-of")
COMPOSE_INTO = prop("compose-into")

VOLUME_COLUMNS = ["name", "type", "volsize", "used", "usedds",
                  "usedrefreserv", "refreservation", "volblocksize",
                  "origin", "clones", "defer_destroy",
                  VDI_UUID, VDI_NAME, VDI_DESCRIPTION, VDI_KEYS,
                  VDI_SHARABLE, CBT_ENABLED, CBT_BOOKMARK, DATAPATH_CLONE,
                  COMPOSE_INTO, MIRROR_SINK, REVERTING, MIRROR_GUARD,
                  ASIDE_OF, CONTENT_ID, "guid"]

SR_COLUMNS = ["name", "used", "available", SR_UUID, SR_NAME,
              SR_DESCRIPTION, SR_OWNER, SR_PROVISIONING, SR_VOLBLOCKSIZE,
              SR_DEVICES]

CHILD_PREFIX = "zfsng-"


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


def pool_of(dataset):
    return dataset.split("/", 1)[0]


def parent_of(name):
    """The zvol of a snapshot name; a zvol's own name otherwise."""
    return name.split("@", 1)[0]


def below(name, parent):
    """Whether name is a dataset, snapshot or bookmark inside parent."""
    return name.startswith(parent + "/") or \
        name.startswith(parent + "@") or name.startswith(parent + "#")


# --- kinds -------------------------------------------------------------------

def is_sr_root(sr, row):
    """Whether row (type, SR_UUID, SR_OWNER) is the listing of sr as the
    root of a zfs-ng SR. sr-uuid and sr-owner are inherited: only the
    SR's own dataset carries them with its own name."""
    uuid = row.get(SR_UUID)
    if row.get("type") != "filesystem" or not uuid:
        return False
    if row.get(SR_OWNER) == "pool":
        return sr == pool_of(sr)
    return sr.rsplit("/", 1)[-1] == CHILD_PREFIX + uuid


def in_sr(row, sr):
    """Directly under the SR (a copy deeper down is no VDI of it)."""
    return parent_of(row["name"]).rsplit("/", 1)[0] == sr


def is_snapshot(row):
    return row["type"] == "snapshot"


def clones_of(row):
    return [c for c in (row.get("clones") or "").split(",") if c]


def is_internal(row):
    """A snapshot zfs-ng takes for one call: to clone a live VDI, to list
    the changes of a live VDI, or to copy it in a migration."""
    return is_snapshot(row) and \
        object_uuid(row["name"]).startswith((INTERNAL_SNAPSHOT,
                                             CBT_SNAPSHOT, MIRROR_SNAPSHOT,
                                             COMPOSE_SNAPSHOT))


def is_data_destroyed(row):
    """A snapshot VDI whose data is gone (Volume.data_destroy): the empty
    zvol that holds its properties, CBT_BOOKMARK its bookmark."""
    return row["type"] == "volume" and bool(row.get(CBT_BOOKMARK))


def bookmark(snapshot_name):
    """The bookmark data_destroy leaves of a snapshot: <vol>#<uuid>."""
    return snapshot_name.replace("@", "#", 1)


def bookmarked_snapshot(row):
    """The snapshot a data-destroyed VDI was."""
    return row[CBT_BOOKMARK].replace("#", "@", 1)


def is_hidden(row):
    return not is_snapshot(row) and row.get(VDI_UUID) == HIDDEN


def is_vdi(row):
    """A visible VDI: its own uuid in its vdi property (inherited values,
    on snapshots zfs-ng did not take, fail this), and not being freed."""
    if row.get(VDI_UUID) != object_uuid(row["name"]):
        return False
    return not (is_snapshot(row) and row.get("defer_destroy") == "on")


def is_stand_in(row, present):
    """A zvol set aside to be cloned again from one of its snapshots while
    no zvol has the VDI's name yet: the datapath's reset of a
    non-persistent VDI (zfsng_datapath/reset.py), from its reset point, or
    Volume.revert (zfsng/revertsteps.py), from the snapshot REVERTING
    names. A crash between the rename and the clone leaves it so until the
    next call that repairs it. It carries the VDI's uuid. Meanwhile it is
    that VDI (listed, found, snapshotted, destroyed as it), under the
    VDI's own URI, which the datapath repairs first: xapi never loses the
    VDI. A zvol by the VDI's name that is only the new clone cut before
    its properties (``is_unmarked_clone`` of that snapshot: a power cut
    inside the clone) is no VDI yet either, so the set-aside zvol stays
    the VDI. present: the listing's rows by name."""
    vdi = row.get(VDI_UUID) or ""
    source = rotation_source(row, present)
    if row["type"] != "volume" or not names.is_uuid(vdi) or \
            vdi == object_uuid(row["name"]) or source is None:
        return False
    named = present.get(vdi_dataset(row["name"].rsplit("/", 1)[0], vdi))
    return named is None or (is_unmarked_clone(named) and
                             named.get("origin") == source)


def rotation_source(row, present):
    """The snapshot a zvol set aside is to be cloned again from: its
    reset point, or the snapshot a revert names (on that zvol, or on one
    an earlier revert or reset set aside: ``revert_source``); None if
    neither."""
    if reset_point(row["name"]) in present:
        return reset_point(row["name"])
    found = reverting(row)
    if found:
        return revert_source(row["name"], found[1], present)
    return None


def revert_source(aside, snap, present):
    """The name of snapshot uuid snap that a revert setting aside zvol
    aside clones from: aside@snap when the snapshot was the VDI's zvol's,
    else wherever it is in the SR (snapshot uuids are unique); None if it
    is gone."""
    own = "%s@%s" % (aside, snap)
    if own in present:
        return own
    sr = aside.rsplit("/", 1)[0]
    for name in present:
        if "@" in name and object_uuid(name) == snap and \
                parent_of(name).rsplit("/", 1)[0] == sr:
            return name
    return None


def snapshot_of(snap, vol, present):
    """Whether the snapshot row snap is one of the VDI vol's (a zvol row
    carrying it): on vol, or on a hidden zvol that a revert or a reset of
    vol set aside (ASIDE_OF), where those steps move the snapshots taken
    after the one they go back to. present: the listing's rows by name."""
    head = parent_of(snap["name"])
    if head == vol["name"]:
        return True
    owner = present.get(head)
    return owner is not None and is_hidden(owner) and \
        bool(vol.get(VDI_UUID)) and owner.get(ASIDE_OF) == vol[VDI_UUID]


def reverting(row):
    """(vdi uuid, snapshot uuid) of the revert a zvol is in, or None. Its
    snapshots inherit the value: only the zvol's own counts."""
    vdi, _, snap = (row.get(REVERTING) or "").partition("@")
    if row["type"] == "volume" and names.is_uuid(vdi) and \
            names.is_uuid(snap):
        return vdi, snap
    return None


def is_composing(row):
    """A parent zvol that Volume.compose made whole and gave the leaf's
    uuid and labels (one ``zfs set``, with COMPOSE_INTO), still under its
    own name: it is the leaf's VDI once the leaf's zvol is gone (compose
    destroys it, then renames this one to its name). The collector
    finishes what a crash left between those commands."""
    into = row.get(COMPOSE_INTO) or ""
    return row["type"] == "volume" and names.is_uuid(into) and \
        row.get(VDI_UUID) == into and object_uuid(row["name"]) != into


def is_sink(row):
    """A migration's mirror sink: <sr>/<leaf uuid>.in marked with that
    uuid (an admin's dataset by such a name is not one), a filesystem
    (bounded: its zvol inside) or a zvol (made before the bound)."""
    last = row["name"].rsplit("/", 1)[-1]
    uuid = last[:-len(SINK_SUFFIX)]
    return row["type"] in ("volume", "filesystem") and \
        last.endswith(SINK_SUFFIX) and names.is_uuid(uuid) and \
        row.get(MIRROR_SINK) == uuid


def is_unfinished_sink(row):
    """A bounded sink a power cut left inside its ``zfs create``: the
    filesystem <sr>/<leaf uuid>.in without its mark (ZFS sets the -o
    properties after making it, the mark last). Known by its name alone,
    as ``is_unfinished_create``'s .new: the next import_activate
    finishes it, the collector frees it once its leaf is gone, with a
    plain ``zfs destroy`` (never -r). One that holds anything (its used
    more than its own: a child, a snapshot) is an admin's, never one."""
    last = row["name"].rsplit("/", 1)[-1]
    return row["type"] == "filesystem" and last.endswith(SINK_SUFFIX) and \
        names.is_uuid(last[:-len(SINK_SUFFIX)]) and \
        not row.get(MIRROR_SINK) and row.get("used") is not None and \
        row.get("used") == row.get("usedds")


def sink_name(sr, leaf_uuid):
    """The sink of a leaf, either form (``is_sink``)."""
    return vdi_dataset(sr, leaf_uuid) + SINK_SUFFIX


def sink_volume(sink):
    """The zvol the mirror writes into, of a sink's row (``is_sink``)."""
    if sink["type"] == "volume":
        return sink["name"]
    return "%s/%s" % (sink["name"], SINK_VOLUME)


def in_sink(row, sr):
    """A bounded sink's zvol or its snapshot (they inherit its mark):
    zfs-ng's own, listed below the sink, never directly under the SR."""
    head = parent_of(row["name"])
    sink, _, last = head.rpartition("/")
    return last == SINK_VOLUME and sink.rsplit("/", 1)[0] == sr and \
        row["type"] in ("volume", "snapshot") and \
        is_sink({"name": sink, "type": "filesystem",
                 MIRROR_SINK: row.get(MIRROR_SINK)})


def composed_leaf(row):
    """The leaf zvol a composing parent takes the place of."""
    return vdi_dataset(row["name"].rsplit("/", 1)[0], row[COMPOSE_INTO])


def vdi_rows(rows):
    """The rows of rows that are VDIs (stand-ins and composed parents
    included). A data-destroyed VDI's zvol is one once its snapshot is
    not: between the two commands of data_destroy, the snapshot is the
    VDI."""
    present = dict((r["name"], r) for r in rows)
    snapshots = set(r["name"] for r in rows if is_snapshot(r) and is_vdi(r))
    return [r for r in rows if (is_vdi(r) and not (
        is_data_destroyed(r) and bookmarked_snapshot(r) in snapshots))
        or is_stand_in(r, present) or
        (is_composing(r) and composed_leaf(r) not in present)]


def uri_dataset(row):
    """The dataset a VDI's URI names: its own, but for a stand-in."""
    if is_snapshot(row):
        return row["name"]
    return vdi_dataset(row["name"].rsplit("/", 1)[0], row[VDI_UUID])


def is_unmarked_clone(row):
    """A clone zfs-ng was making when the host died: ZFS makes a clone
    and sets the properties given with it (``zfs clone -o``) in later
    transaction groups (zfs_ioc_clone), so a power cut between them leaves
    the clone without any of zfs-ng's properties. Three calls make one:
    - Volume.clone: <sr>/<uuid>, of a snapshot VDI or of
      @zfsng-clone-<its own uuid>. The call never returned, so xapi never
      knew it; it keeps its origin alive, and that VDI's parent, for ever;
    - a reset's rotation, step 2 (zfsng_datapath/reset.py): <sr>/<uuid>,
      of <sr>/<other uuid>@zfsng-nonpersistent. The set-aside zvol still
      carries the VDI (``is_stand_in``); without this clone it is back at
      S1, which the datapath finishes;
    - the datapath's clone of a snapshot VDI, <sr>/<snapshot uuid>.ro, of
      <sr>/<uuid>@<snapshot uuid>, without DATAPATH_CLONE (so no sweep
      finds it, and the next attach finds its name taken). It is made
      under the SR lock and handed out only once marked, so no attach
      uses it; the datapath's next attach of the snapshot marks it.
    Known by those names directly under the SR, no ``vdi`` value, no
    datapath mark (a row without the DATAPATH_CLONE column cannot prove a
    .ro unmarked), the origin a zfs-ng snapshot of a uuid-named zvol of
    the SR, and no data of its own (usedds 0): nothing ever wrote to it,
    and destroying it loses nothing."""
    if row["type"] != "volume" or row.get(VDI_UUID) or \
            row.get(DATAPATH_CLONE) or row.get("usedds") != "0":
        return False
    sr, _, last = row["name"].rpartition("/")
    origin = row.get("origin") or ""
    head, _, snap = origin.partition("@")
    if head.rsplit("/", 1)[0] != sr or \
            not names.is_uuid(head.rsplit("/", 1)[-1]):
        return False
    if last.endswith(CLONE_SUFFIX):
        return DATAPATH_CLONE in row and names.is_uuid(snap) and \
            last == snap + CLONE_SUFFIX
    return names.is_uuid(last) and \
        (names.is_uuid(snap) or snap == INTERNAL_SNAPSHOT + last or
         snap == NONPERSISTENT_SNAPSHOT)


def is_unfinished_create(row):
    """A zvol Volume.create (or data_destroy, its metadata zvol: cbt) was
    making when the host died. ZFS makes a
    zvol and sets the properties given with ``zfs create -o`` in later
    transaction groups (zfs_ioc_create: only volsize and volblocksize go
    with the creation), and a bare zvol <sr>/<uuid> would look like any
    admin's zvol. So Volume.create makes <sr>/<uuid>.new, and renames it
    to <sr>/<uuid> (one transaction group) once the properties are set: a
    zvol by that name is always whole, and one named <sr>/<uuid>.new
    (no origin, no ``vdi`` value or its own uuid) is one whose call
    never returned: xapi never knew it, and it holds nothing."""
    if row["type"] != "volume" or row.get("origin"):
        return False
    last = row["name"].rsplit("/", 1)[-1]
    uuid = last[:-len(CREATE_SUFFIX)]
    return last.endswith(CREATE_SUFFIX) and names.is_uuid(uuid) and \
        row.get(VDI_UUID) in (None, uuid)


# --- the datapath's datasets ---------------------------------------------------

CLONE_SUFFIX = ".ro"
# The name Volume.create makes a zvol under, <sr>/<uuid><this>, before its
# rename to <sr>/<uuid> (is_unfinished_create).
CREATE_SUFFIX = ".new"


def internal_snapshot(zvol, clone_uuid):
    """The snapshot zfs-ng takes of a live zvol to clone it."""
    return "%s@%s%s" % (zvol, INTERNAL_SNAPSHOT, clone_uuid)


def compose_snapshot(sink):
    """The snapshot of a mirror sink Volume.compose reads births from."""
    return "%s@%s" % (sink, COMPOSE_SNAPSHOT)


def reset_point(zvol):
    """A non-persistent VDI's reset point."""
    return "%s@%s" % (zvol, NONPERSISTENT_SNAPSHOT)


def creating_name(sr, vdi_uuid):
    """Where Volume.create makes a VDI's zvol, before it has its name."""
    return vdi_dataset(sr, vdi_uuid) + CREATE_SUFFIX


def clone_name(sr, snapshot_uuid):
    """The datapath's read-only clone of a snapshot VDI."""
    return "%s/%s%s" % (sr, snapshot_uuid, CLONE_SUFFIX)


def is_clone_of(row, sr, snapshot_uuid):
    """Whether row (type, origin, DATAPATH_CLONE) is the datapath's clone
    of that snapshot VDI, wherever a reset moved the snapshot within the
    SR (snapshot uuids are unique)."""
    if row is None or row.get(DATAPATH_CLONE) is None or \
            row.get("type") != "volume":
        return False
    head, _, snap = (row.get("origin") or "").partition("@")
    return snap == snapshot_uuid and head.rsplit("/", 1)[0] == sr
