"""A clone a power cut left without its properties.

ZFS makes a clone, then sets the properties given with ``zfs clone -o`` in
a second transaction group (zfs_ioc_clone). The power-cut campaign
(tests/faults/powercut.py, OpenZFS 2.3, mirror, --seed 5, iteration 3: a
Volume.clone of a snapshot VDI in flight at the cut) found such a zvol
after the reboot: <sr>/<uuid> with none of zfs-ng's properties, never
listed, keeping its origin snapshot (and so that VDI's parent) alive for
good. The collector (SR.attach, Volume.destroy) now frees it: its
Volume.clone never returned, and it holds no data of its own.
"""

import uuid

from zfsng import meta

from conftest import call
from test_vdi_semantics import (  # noqa: F401 (sr is a fixture)
    datasets, garbage, listed, snapshot_name, sr, vdi_create, vdi_snapshot,
    zvol)


def cut_clone(fake, origin, name):
    """The state a cut between zfs clone's two transaction groups leaves."""
    fake.admin("zfs clone %s %s" % (origin, name))


def test_a_clone_of_a_snapshot_cut_before_its_properties(fake, sr):
    source = vdi_create(sr, name="tmpl")
    snap = vdi_snapshot(sr, source["key"])
    bare = "%s/%s" % (sr, uuid.uuid4())
    cut_clone(fake, snapshot_name(fake, sr, snap["key"]), bare)
    assert set(listed(sr)) == set([source["key"], snap["key"]])
    call("SR.attach", configuration=fake.sr_config)   # the PBD plug
    assert not fake.exists(bare)
    assert set(listed(sr)) == set([source["key"], snap["key"]])
    assert garbage(fake, sr) == []
    # the snapshot is free again: its destroy is not deferred for ever
    call("Volume.destroy", sr=sr, key=snap["key"])
    call("Volume.destroy", sr=sr, key=source["key"])
    assert datasets(fake) == [sr]


def test_a_live_clone_cut_before_its_properties(fake, sr):
    source = vdi_create(sr, name="vm disk")
    new = str(uuid.uuid4())
    internal = meta.internal_snapshot(zvol(sr, source["key"]), new)
    fake.admin("zfs snapshot %s" % internal)
    cut_clone(fake, internal, "%s/%s" % (sr, new))
    other = vdi_create(sr, name="other")
    call("Volume.destroy", sr=sr, key=other["key"])   # collects too
    assert datasets(fake) == [sr, zvol(sr, source["key"])]
    assert set(listed(sr)) == set([source["key"]])


def test_what_may_be_an_admins_is_kept(fake, sr):
    """A clone with data of its own, one not named by a uuid, or one of
    a snapshot that is no VDI: never zfs-ng's to destroy."""
    source = vdi_create(sr, name="tmpl")
    snap = snapshot_name(fake, sr, vdi_snapshot(sr, source["key"])["key"])
    written = "%s/%s" % (sr, uuid.uuid4())
    cut_clone(fake, snap, written)
    fake.write(written, 1 << 20)
    named = "%s/mine" % sr
    cut_clone(fake, snap, named)
    fake.admin("zfs snapshot %s@admin" % zvol(sr, source["key"]))
    of_admins = "%s/%s" % (sr, uuid.uuid4())
    cut_clone(fake, "%s@admin" % zvol(sr, source["key"]), of_admins)
    call("SR.attach", configuration=fake.sr_config)
    assert all(fake.exists(n) for n in (written, named, of_admins))
