"""A write the guest saw complete after its flush survives a power cut.

XCP-ng's tapdisk never passes a guest's flush on: blkfront's flush becomes
a WRITE_BARRIER, which tapdisk only orders (td-req.c completes it once the
writes before it have completed), and its aio driver writes the zvol with
O_DIRECT and never calls fsync (block-aio.c); the tapdev in dom0 announces
no write cache either, so a flush on it ends in the kernel. What reaches
the zvol is a plain write, and ZFS with ``sync=standard`` keeps a plain
write in the open transaction group for up to the txg timeout (5 s, longer
under load) before it is on disk: a power cut in that window loses writes
the guest was told were stable. With ``sync=always`` every zvol write is
in the ZIL before it completes, which is why it is zfs-ng's default.

The power cut: ``zpool freeze`` stops the pool writing transaction groups
while the ZIL still writes (OpenZFS's own ZIL tests use it), and the disk
is then copied as it is: what a power cut would leave. The pool is
exported (closing a zvol commits its log, so the export itself proves
nothing), the copy put back, and the SR attached: the import replays the
ZIL. The VDI set to ``sync=standard`` by hand is the control: its guest
write is lost while a dom0 write made with fsync on the zvol itself is
kept, so the rig can tell a loss from a keep. A third VDI has
``logbias=throughput`` (``device-config:logbias``): its write goes to its
block outside the transaction groups and the log holds only where, which
the replay must find as well.
"""

import pytest

from conftest import sh, wipe
from datapath_util import DATA, dataset, dd_hash, dd_write, new_vdi, \
    pattern, sha
from test_sr_lifecycle import attach
from test_tapdisk import Xapi, zvol

POOL = "cutsr"


@pytest.fixture
def stored(plugin, disks, new_uuid):
    """An SR zfs-ng made with its defaults: the configuration xapi keeps."""
    config = plugin("SR.create", uuid=new_uuid(), name=POOL,
                    description="", configuration={"device": disks[0]})
    yield config
    sh("zpool", "destroy", "-f", POOL, check=False)


def copy(source, target):
    sh("dd", "if=" + source, "of=" + target, "bs=4M", "iflag=direct",
       "oflag=direct", "status=none")
    sh("blockdev", "--rereadpt", target)
    sh("udevadm", "settle")


def test_a_write_the_guest_flushed_survives_a_power_cut(plugin, dp, disks,
                                                        stored):
    disk, spare = disks[0], disks[1]
    sr = attach(plugin, stored)
    assert sh("zfs", "get", "-H", "-o", "value", "sync", sr).strip() == \
        "always"
    kept, control = new_vdi(plugin, sr), new_vdi(plugin, sr)
    # device-config:logbias=throughput's VDIs: each sync write goes to its
    # block (dmu_sync), the log holding only where it went
    direct = new_vdi(plugin, sr)
    sh("zfs", "set", "sync=standard", dataset(control))   # an admin's choice
    sh("zfs", "set", "logbias=throughput", dataset(direct))
    vm = Xapi(dp, plugin, sr, kept, repeat=False)
    other = Xapi(dp, plugin, sr, control, repeat=False)
    third = Xapi(dp, plugin, sr, direct, repeat=False)
    tapdev, kept_zvol = vm.start()
    other_tapdev, other_zvol = other.start()
    third_tapdev, third_zvol = third.start()
    # a running VM's zvol has its log's first block on disk: a transaction
    # group records it, so it must be made before the freeze
    for path in (kept_zvol, other_zvol, third_zvol):
        assert dd_write(path, pattern(0), offset=2 * DATA) == (0, "")
    sh("zpool", "sync", POOL)
    sh("zpool", "freeze", POOL)
    # dom0's fsync first: it commits every write the zvol's log holds
    assert dd_write(other_zvol, pattern(3), offset=DATA) == (0, "")
    assert dd_write(tapdev, pattern(1)) == (0, "")           # flushed
    assert dd_write(other_tapdev, pattern(2)) == (0, "")     # flushed
    assert dd_write(third_tapdev, pattern(4)) == (0, "")     # flushed
    copy(disk, spare)                          # the power cut
    vm.stop()
    other.stop()
    third.stop()
    plugin("SR.detach", sr=sr)
    copy(spare, disk)                          # the host boots again
    wipe([spare])
    attach(plugin, stored)                     # the import replays the ZIL
    sh("udevadm", "settle")
    assert dd_hash(zvol(control), offset=DATA) == sha(pattern(3)), \
        "a write made with fsync on the zvol was lost: the rig lost the ZIL"
    assert dd_hash(zvol(control)) == sha(bytes(DATA)), \
        "sync=standard kept a guest's write through the cut: nothing was cut"
    assert dd_hash(zvol(kept)) == sha(pattern(1))
    assert dd_hash(zvol(direct)) == sha(pattern(4)), \
        "logbias=throughput lost a flushed write"
