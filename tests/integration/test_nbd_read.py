"""The NBD test harness itself (nbd_util): qemu-nbd serving a zvol
read-only, Xen Orchestra's own client (@vates/nbd-client, under the
guest's node) reading chosen blocks and whole exports into a backup file,
over TLS as from xapi's NBD server, and over plain TCP.

The zvol's size is not a multiple of 64 KiB, XO's block: the last block
read is short, and must land whole at the end of the backup.
"""

import os

import pytest

from conftest import sh
from nbd_util import BLOCK_SIZE, NbdError, answers, read_blocks, serve

POOL = "nbdt"
VOLBLOCK = 16 * 1024
# 20 full blocks and a last one of 16 KiB (zvol sizes are multiples of
# their volblocksize; 16K is set, as 2.1's default is 8K and 2.3's 16K).
SIZE = 20 * BLOCK_SIZE + VOLBLOCK
LAST = SIZE // BLOCK_SIZE


@pytest.fixture
def zvol(disks):
    """A zvol filled with random bytes; yields (device path, content)."""
    sh("zpool", "create", "-f", "-o", "ashift=12", POOL, disks[0])
    sh("zfs", "create", "-V", str(SIZE), "-o", "volblocksize=16K",
       POOL + "/v")
    sh("udevadm", "settle")
    dev = "/dev/zvol/%s/v" % POOL
    content = os.urandom(SIZE)
    fd = os.open(dev, os.O_WRONLY)
    try:
        assert os.pwrite(fd, content, 0) == SIZE
        os.fsync(fd)
    finally:
        os.close(fd)
    yield dev, content
    sh("zpool", "destroy", "-f", POOL, check=False)


def device_bytes(dev):
    with open(dev, "rb") as f:
        return f.read()


def block(data, i):
    return data[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "tcp"])
def test_reads_chosen_blocks_and_all(zvol, tmp_path, tls):
    dev, content = zvol
    chosen = [0, 3, 7, LAST]
    with serve(dev, tls=tls) as server:
        assert (server.cert is not None) == tls
        backup = str(tmp_path / "backup")
        got = read_blocks(server, backup, chosen, size=SIZE)
        assert got == {"blocks": 4, "bytes": 3 * BLOCK_SIZE + VOLBLOCK}
        with open(backup, "rb") as f:
            data = f.read()
        assert len(data) == SIZE
        for i in range(LAST + 1):
            want = block(content, i) if i in chosen else \
                bytes(len(block(content, i)))
            assert block(data, i) == want, "block %d" % i

        # The rest, into the same file (not truncated without size).
        rest = [i for i in range(LAST + 1) if i not in chosen]
        got = read_blocks(server, backup, rest)
        assert got["blocks"] == len(rest)
        with open(backup, "rb") as f:
            assert f.read() == content

        # A full read, as XO's first backup, into a new file.
        full = str(tmp_path / "full")
        got = read_blocks(server, full, "all")
        assert got == {"blocks": LAST + 1, "bytes": SIZE}
        with open(full, "rb") as f:
            assert f.read() == content

        # Past the end: the client's error, not a hang or a short file.
        with pytest.raises(NbdError, match="past the end"):
            read_blocks(server, str(tmp_path / "x"), [LAST + 1])
    assert device_bytes(dev) == content


def test_read_only_and_stopped(zvol):
    """A write through the export fails (qemu-nbd runs --read-only and
    says so in the handshake: qemu refuses to open it for writing), the
    device is unchanged, and once serve() is left nothing listens and
    qemu-nbd is reaped."""
    dev, content = zvol
    with serve(dev, tls=False) as server:
        url = "nbd://%s:%d/%s" % (server.address, server.port, server.export)
        with pytest.raises(AssertionError,
                           match="Permission denied|read-only|Read-only"):
            sh("qemu-io", "-f", "raw", url, "-c", "write -P 0x55 0 64k")
        process, port = server.process, server.port
        assert process.poll() is None
    assert process.returncode is not None
    assert not answers(port)
    assert device_bytes(dev) == content
