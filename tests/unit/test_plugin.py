"""Plugin.Query, Plugin.diagnostics and Plugin.ls."""

import os
import sys

from zfsng import VERSION, wire
from zfsng_volume import devconfig

from conftest import SR_UUID, SR_UUID2, call, create_sr, create_volume

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "datapath"))
from zfsng_datapath import datapath, main as dpmain  # noqa: E402


def test_query(fake):
    query = call("Plugin.Query")
    assert query["plugin"] == "zfs-ng"
    assert query["required_api_version"] == "5.0"
    assert query["version"] == VERSION
    assert query["configuration"] == devconfig.KEYS
    assert query["required_cluster_stack"] == []
    assert len(query["features"]) == len(set(query["features"]))
    assert {"SR_PROBE", "SR_STATS", "VDI_CREATE", "VDI_DELETE",
            "THIN_PROVISIONING"} <= set(query["features"])
    assert fake.calls == []          # answered without running anything


def test_query_offers_storage_migration_out_and_in(fake):
    """xapi_vm_migrate.ml lets a VM's disks move only from an SR whose
    Query lists VDI_MIRROR and VDI_SNAPSHOT, into one that lists
    VDI_MIRROR_IN or VDI_MIRROR (smint.ml: VDI_MIRROR satisfies it)."""
    features = set(call("Plugin.Query")["features"])
    assert {"VDI_MIRROR", "VDI_SNAPSHOT"} <= features


def test_query_has_xapi_activate_read_only_attaches_read_only(fake):
    """storage_mux.ml activate3 (v26.1.4, 614-638) calls
    VDI.activate_readonly for a VDI attached read-only only if the SR's
    features, the volume plugin's Query (main.ml 868-933), list
    VDI_ACTIVATE_READONLY; else activate3, which opens the zvol
    read-write and renews its content_id. main.ml then runs the
    datapath's Datapath.activate_readonly whatever the datapath's own
    Query says (1529-1560): it must be one of the datapath's methods
    (each gets its executable, the Makefile's install)."""
    assert "VDI_ACTIVATE_READONLY" in call("Plugin.Query")["features"]
    assert "Datapath.activate_readonly" in wire.SERVED["zfsng_datapath"]
    assert dpmain.handlers()["Datapath.activate_readonly"] is \
        datapath.activate_readonly


def test_diagnostics_names_the_pool_and_the_sr(fake):
    sr, _ = create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    create_volume(sr)
    text = call("Plugin.diagnostics")
    assert "version %s" % VERSION in text
    assert "zfs-2.1.15-1" in text
    assert "== zpool status tank ==" in text
    assert "pool: tank" in text and "/dev/sdc1" in text
    assert "== SR tank ==" in text
    assert SR_UUID in text
    assert "compression: lz4" in text
    assert "zvols and snapshots: 1" in text


def test_diagnostics_of_an_adopted_sr(fake):
    fake.admin("zpool create -m none data /dev/sdc")
    stored = call("SR.create", uuid=SR_UUID, configuration={"zpool": "data"},
                  name="a", description="")
    sr = call("SR.attach", configuration=stored)
    text = call("Plugin.diagnostics")
    assert "== zpool status data ==" in text
    assert "== SR %s ==" % sr in text


def test_diagnostics_of_a_degraded_pool(fake):
    create_sr({"vdev": "mirror /dev/sdb /dev/sdc"})
    fake.offline("/dev/sdc1")
    text = call("Plugin.diagnostics")
    assert "state: DEGRADED" in text and "OFFLINE" in text


def test_diagnostics_without_srs(fake):
    text = call("Plugin.diagnostics")
    assert "no zfs-ng SR" in text
    assert "zfs-2.1.15-1" in text


def test_diagnostics_when_zfs_is_not_usable(fake):
    fake.inject("zfs version", "The ZFS modules are not loaded.\nTry "
                "running '/sbin/modprobe zfs' as root to load them.\n")
    text = call("Plugin.diagnostics")
    assert "not usable" in text and "modprobe zfs" in text


def test_diagnostics_runs_nothing_that_changes_state(fake):
    create_sr()
    mark = len(fake.calls)
    call("Plugin.diagnostics")
    assert fake.mutations(since=mark) == []


def test_ls_lists_the_srs_on_this_host(fake):
    assert call("Plugin.ls") == []
    create_sr()
    fake.admin("zpool create -m none data /dev/sdc")
    call("SR.create", uuid=SR_UUID2, configuration={"zpool": "data"},
         name="a", description="")
    assert sorted(call("Plugin.ls")) == sorted(["tank",
                                                "data/zfsng-" + SR_UUID2])
    call("SR.detach", sr="tank")
    assert call("Plugin.ls") == ["data/zfsng-" + SR_UUID2]
