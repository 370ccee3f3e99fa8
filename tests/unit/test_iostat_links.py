"""The datapath's links for xcp-rrdd's iostat plugin (zfsng_datapath.iostat).

The plugin's rule, as rrdp_iostat.ml states it, written here on its own:
every ``tap-ctl list`` line is read as ``pid=%d minor=%d state=%s
args=%s@:%s`` (kind before the first ':', path after it; kinds aio, vhd
and qcow2 only), every entry ``/dev/sm/phy/<sr>/<vdi>`` is read with one
readlink, and a tapdisk belongs to the (sr, vdi) whose link target equals
its path as a string. The VM side is the VBD's ``sm-data/vdi-uuid``,
which xenopsd writes from the XenDisk's ``extra``.
"""

import os

from conftest import SR_UUID, call
from test_datapath import DOM0, GUEST, dataset_of, dp, host, snap_vdi, \
    uri_of, vdi, rotation_scenario  # noqa: F401
from zfsng_datapath import iostat


def tapdisk_paths(tap):
    """(pid, minor) -> path of every tapdisk line iostat accepts."""
    found = {}
    for line in tap(["tap-ctl", "list"]).out.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        kind, _, path = fields.get("args", "").partition(":")
        if kind in ("aio", "vhd", "qcow2") and path:
            found[(int(fields["pid"]), int(fields["minor"]))] = path
    return found


def phy_map():
    """link target -> (sr uuid, vdi uuid), as the iostat plugin reads it."""
    table = {}
    if not os.path.isdir(iostat.PHY_DIR):
        return table
    for sr in os.listdir(iostat.PHY_DIR):
        for key in os.listdir(os.path.join(iostat.PHY_DIR, sr)):
            table[os.readlink(os.path.join(iostat.PHY_DIR, sr, key))] = \
                (sr, key)
    return table


def mapped(host):
    table = phy_map()
    return dict((k, table.get(p)) for k, p in tapdisk_paths(host.tap).items())


def extra_of(answer):
    (xendisk,) = [i[1] for i in answer["implementations"]
                  if i[0] == "XenDisk"]
    return xendisk["extra"]


def test_a_guest_disk_maps_to_its_sr_vdi_and_vm(host, vdi):
    sr, vol = vdi
    answer = dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    assert extra_of(answer) == {"vdi-uuid": vol["key"]}
    assert list(mapped(host).values()) == [(SR_UUID, vol["key"])]
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    assert phy_map() == {}


def test_a_snapshot_maps_by_its_clone_and_its_own_uuid(host, snap_vdi):
    sr, vol, snap = snap_vdi
    dp("Datapath.attach", uri=uri_of(snap), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(snap), domain=GUEST)
    assert list(mapped(host).values()) == [(SR_UUID, snap["key"])]


def test_a_dom0_attach_links_the_zvol_it_hands_out(host, vdi):
    sr, vol = vdi
    answer = dp("Datapath.attach", uri=uri_of(vol), domain=DOM0)
    (path,) = [i[1]["path"] for i in answer["implementations"]]
    assert phy_map() == {path: (SR_UUID, vol["key"])}
    assert host.tap.tapdisks == {}       # nothing for iostat to count


def test_the_link_stays_while_another_attach_of_the_vdi_needs_it(
        host, snap_vdi):
    sr, vol, snap = snap_vdi
    for domain in (GUEST, "8"):
        dp("Datapath.attach", uri=uri_of(snap), domain=domain)
    dp("Datapath.detach", uri=uri_of(snap), domain=GUEST)
    assert list(phy_map().values()) == [(SR_UUID, snap["key"])]
    dp("Datapath.detach", uri=uri_of(snap), domain="8")
    assert phy_map() == {}


def test_a_wrong_link_is_replaced_and_nothing_else_is_left(host, vdi):
    sr, vol = vdi
    link = iostat.link_path(SR_UUID, vol["key"])
    os.makedirs(os.path.dirname(link))
    os.symlink("/dev/zvol/elsewhere", link)
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    assert list(mapped(host).values()) == [(SR_UUID, vol["key"])]
    assert os.listdir(os.path.dirname(iostat.PHY_DIR)) == ["phy"]


def test_an_unwritable_link_directory_costs_the_statistics_only(host, vdi):
    sr, vol = vdi
    os.makedirs(os.path.dirname(iostat.PHY_DIR))
    with open(iostat.PHY_DIR, "w"):
        pass                        # a file where the directory should be
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    assert len(host.tap.vbds()) == 1
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)


def test_after_a_reset_rotation_the_disk_still_maps_to_its_vdi(host, vdi):
    """A non-persistent disk reset by rotation (its zvol set aside, a new
    one under the same name): the next start's tapdisk maps to the VDI."""
    sr, vol = vdi
    vol, snap, clone, keep = rotation_scenario(host, sr, vol)
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.deactivate", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.detach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.close", uri=uri_of(vol))            # the rotation
    assert call("Volume.stat", sr=sr, key=vol["key"])["uri"] == vol["uri"]
    dp("Datapath.open", uri=uri_of(vol), persistent=False)
    dp("Datapath.attach", uri=uri_of(vol), domain=GUEST)
    dp("Datapath.activate", uri=uri_of(vol), domain=GUEST)
    assert list(mapped(host).values()) == [(SR_UUID, vol["key"])]
    assert list(tapdisk_paths(host.tap).values()) == [
        host.link(dataset_of(vol))]
