"""zfs-ng as a storage migration's destination: the Nbd implementation of
a Datapath.attach is the real tapdisk's NBD server on the VDI, and what a
source writes into it is what the zvol holds.

xapi's order (xen-api v26.1.4, storage_smapiv3_migrate.ml receive_start3
and storage_migrate.ml import_nbd_proxy): Volume.create of the leaf,
Datapath.attach for the mirror's pseudo-domain ("MIR" and six hex digits,
which main.ml's domain_of passes as it is), the first Nbd answer parsed
for the export name, Datapath.activate; then the source's writes arrive
through xapi's proxy, which finds the socket by attaching again
(get_nbd_server); receive_finalize3 destroys the datapath (deactivate,
detach). An offline copy (DATA.copy: "CP" pseudo-domain, attach,
activate, get_nbd_server) takes the same path. The source is played here
by zfs-ng's own NBD client (zfsng_datapath.nbd), as a zfs-ng source's
mirror would write.
"""

import os
import random
import sys
import time

import pytest

from datapath_util import SIZE, dataset, dd_hash, sha
from test_tapdisk import Xapi, nothing_left, vbd_of

_TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
for _dir in ("volume", "datapath"):
    sys.path.insert(0, os.path.join(_TOP, _dir))

from zfsng_datapath import nbd  # noqa: E402

MIRROR_VM = "MIR1a2b3c"
COPY_VM = "CP1a2b3c"      # xapi_vm_migrate.ml: "CP"/"MIR" and 3+3 hex
MiB = 1 << 20


def spinning(pid):
    """tapdisk's log lines that show its NBD server looping on a closed
    client (blktap 3.55.5 restarts a handshake on NBD_CMD_DISC, then
    spins once that socket closes): the client must close without it."""
    mark = "tapdisk[%d]:" % pid
    with open("/var/log/messages", errors="replace") as f:
        return [line for line in f if mark in line and (
            "reconnect header" in line or "select failed" in line or
            "Could not receive client flags" in line)][:3]


def nbd_of(result):
    """(socket, export) of the first Nbd, split as xapi's parse_nbd_uri
    splits it."""
    (uri,) = [i[1]["uri"] for i in result["implementations"]
              if i[0] == "Nbd"]
    parts = uri.split(":")
    assert len(parts) == 4 and parts[:2] == ["nbd", "unix"], uri
    assert parts[3].startswith("exportname="), uri
    return parts[2], parts[3][len("exportname="):]


@pytest.mark.parametrize("pseudo", [MIRROR_VM, COPY_VM])
def test_a_source_writes_the_disk_through_the_attach_nbd_answer(
        dp, plugin, sr, pseudo):
    leaf = plugin("Volume.create", sr=sr, name="leaf", description="",
                  size=SIZE, sharable=False)
    xapi = Xapi(dp, plugin, sr, leaf)
    attached = xapi("Datapath.attach", domain=pseudo)
    socket_path, export = nbd_of(attached)
    xapi("Datapath.activate", domain=pseudo)
    row = vbd_of(attached["implementations"][0][1]["params"])
    assert socket_path == "/var/run/blktap-control/nbd%d.%d" % (
        row["pid"], row["minor"])
    want = bytearray(SIZE)
    rnd = random.Random(5)
    client = nbd.Client.connect(socket_path, export, timeout=120)
    assert client.size == SIZE
    assert not client.flags & nbd.SEND_WRITE_ZEROES   # tapdisk's server
    for at in sorted(rnd.sample(range(SIZE // MiB), 12)):
        data = os.urandom(MiB // 2)
        client.write(at * MiB + 4096, data)
        want[at * MiB + 4096:at * MiB + 4096 + len(data)] = data
    client.write(0, b"\xff" * (2 * MiB))            # then zeros over data
    client.zero(MiB // 2, MiB)
    want[0:2 * MiB] = b"\xff" * (2 * MiB)
    want[MiB // 2:MiB // 2 + MiB] = bytes(MiB)
    client.flush()
    client.close()
    # xapi's proxy finds the server again by attaching (get_nbd_server)
    again = xapi("Datapath.attach", domain=pseudo)
    assert nbd_of(again) == (socket_path, export)
    reader = nbd.Client.connect(socket_path, export, timeout=120)
    assert reader.read(0, 4 * MiB) == bytes(want[:4 * MiB])
    reader.close()
    time.sleep(1)
    assert not spinning(row["pid"])
    xapi("Datapath.deactivate", domain=pseudo)   # receive_finalize3
    xapi("Datapath.detach", domain=pseudo)
    assert not os.path.exists(socket_path)
    assert dd_hash("/dev/zvol/" + dataset(leaf), SIZE) == sha(bytes(want))
    nothing_left(sr)
