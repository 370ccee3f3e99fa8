"""What a datapath call is about: the URI's dataset, and the domain.

URIs (made by the volume plugin, zfsng.meta.volume_uri)
  zfs-ng:///<sr dataset>/<vdi uuid>                   a VDI: a zvol
  zfs-ng:///<sr dataset>/<parent uuid>@<snap uuid>    a snapshot VDI

The scheme is the name of the datapath directory xapi-storage-script routes
to (``<root>/datapath/zfs-ng/``). It cannot collide with XCP-ng's own
datapaths (``tapdisk``, ``qdisk``, ``file``, ``raw``...): the scheme is the
SR type, which is ours.

Domains: xapi-storage-script's ``domain_of`` (ocaml/xapi-storage-script/
main.ml) sends a guest's domain id as it is, and for dom0 (vm "0"), since
xen-api v24.40.0 (XCP-ng 8.3), ``"u0-" ^ dp`` with every ``/`` and ``-``
of the whole string mapped to ``_``: ``u0_vbd_0_xvda`` for a VBD plugged
into dom0, ``u0_<uuid with _ for ->`` for an export, import, copy or
migration. Older xapi sent ``0``. Both are dom0: the zvol itself, no
tapdisk. Anything else is a guest (it needs the XenDisk), after a check that
it is a safe file-name component.
"""

import re

from zfsng import meta, names
from zfsng.errors import InvalidArgument, InvalidConfiguration

SCHEME = meta.URI_SCHEME          # "zfs-ng"
PREFIX = SCHEME + ":///"
DOM0_PREFIX = "u0_"     # what domain_of makes of "u0-" (it maps '-' too)
DOM0_OLD = "0"          # dom0 as xapi before v24.40.0 sent it
_DOMAIN_RE = r"^[A-Za-z0-9_.:-]{1,128}\Z"


class Target(object):
    """A parsed URI.

    dataset   what the URI names (pool/.../vol or pool/.../vol@snap)
    head      the zvol (dataset without @snap)
    snapshot  the snapshot's uuid, or None for a live VDI
    sr        the SR dataset (the zvol's parent)
    """

    __slots__ = ("uri", "dataset", "head", "snapshot", "sr")

    def __init__(self, uri, dataset, head, snapshot, sr):
        self.uri, self.dataset, self.head = uri, dataset, head
        self.snapshot, self.sr = snapshot, sr

    def __repr__(self):
        return "Target(%r)" % self.dataset

    def key(self):
        """The VDI's uuid (xapi's key): the snapshot's, or the zvol's."""
        return self.snapshot or self.head.rsplit("/", 1)[1]


def parse(uri):
    """The Target of a zfs-ng URI, or raise InvalidArgument.

    Strict on purpose: the dataset ends up in zfs and tap-ctl argv lists and
    in /dev paths, and only names the volume plugin makes are accepted (the
    zvol is named by a uuid, a snapshot VDI's snapshot too), so a URI can
    never point the datapath at an internal snapshot or another dataset.
    """
    if not isinstance(uri, str) or not uri.startswith(PREFIX):
        raise InvalidArgument("not a %s URI: %r (expected %s<pool>/.../<vdi "
                              "uuid>[@<snapshot uuid>])"
                              % (SCHEME, uri, PREFIX))
    dataset = uri[len(PREFIX):]
    head, at, snap = dataset.partition("@")
    try:
        names.check_dataset_name(head, "URI dataset")
    except InvalidConfiguration as exc:
        raise InvalidArgument(exc.message)
    parts = head.split("/")
    if len(parts) < 2 or not names.is_uuid(parts[-1]) or \
            (at and not names.is_uuid(snap)):
        raise InvalidArgument(
            "URI %r does not name a zfs-ng VDI (<sr dataset>/<vdi uuid> or "
            "<sr dataset>/<vdi uuid>@<snapshot uuid>)" % uri)
    return Target(uri, dataset, head, snap or None, head.rsplit("/", 1)[0])


def is_dom0(domain):
    return domain == DOM0_OLD or domain.startswith(DOM0_PREFIX)


def is_vm(domain):
    """A running VM's domain id (a number), not one of xapi's
    pseudo-domains for a migration's copy (``CP`` and six hex digits) or
    mirror (``MIR...``), which tapdisk serves like a guest but which are
    dom0's reads and writes."""
    return domain.isdigit() and domain != DOM0_OLD


def check_domain(domain):
    if not re.match(_DOMAIN_RE, domain or ""):
        raise InvalidArgument("domain %r is neither a domain id nor a dom0 "
                              "datapath name (u0_...)" % (domain,))
    return domain
