"""How long zfs-ng's names get: the longest name it ever makes in an SR,
checked against ZFS's limit when the SR is made (``devconfig``, SR.create),
since ZFS would refuse it in the middle of a later call.
"""

from zfsng import names
from zfsng.meta import CBT_SNAPSHOT, bookmark, child_sr_dataset, \
    clone_name, compose_snapshot, creating_name, internal_snapshot, \
    reset_point, sink_name, sink_volume, vdi_dataset


MAX_NAME = names.MAX_NAME
_SAMPLE_UUID = "00000000-0000-4000-8000-000000000000"


def longest_name(sr):
    """The longest name zfs-ng ever makes in the SR dataset sr, by the
    rules above with a uuid's length: SR.create refuses (or, for a pool
    named after the SR, avoids) an SR where it would pass MAX_NAME, since
    ZFS would refuse it in the middle of a later call (a snapshot, a live
    clone) that xapi expects to work."""
    vdi = vdi_dataset(sr, _SAMPLE_UUID)
    snapshot = "%s@%s" % (vdi, _SAMPLE_UUID)
    return max([vdi, creating_name(sr, _SAMPLE_UUID),
                clone_name(sr, _SAMPLE_UUID), snapshot, bookmark(snapshot),
                internal_snapshot(vdi, _SAMPLE_UUID), reset_point(vdi),
                compose_snapshot(sink_volume({
                    "name": sink_name(sr, _SAMPLE_UUID),
                    "type": "filesystem"})),
                "%s@%s%s" % (vdi, CBT_SNAPSHOT, _SAMPLE_UUID)], key=len)


def room_for(sr):
    """How many bytes sr may grow by (negative: too long by that much)."""
    return MAX_NAME - len(longest_name(sr).encode("utf-8"))


def sample_sr_dataset(parent):
    """The SR dataset an SR adopting parent gets, with a uuid's length."""
    return child_sr_dataset(parent, _SAMPLE_UUID)
