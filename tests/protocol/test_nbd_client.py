"""zfsng_datapath.nbd against a real NBD server (qemu-nbd on a raw file,
over a unix socket): what a migration's copy writes is what the server
stores, zeros included, with and without the server's WRITE_ZEROES; a
refused export and a server that stops answering are typed errors in
bounded time. (tapdisk's own server is met in the guest suite.)"""

import errno
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(TOP, "volume"), os.path.join(TOP, "datapath")]

from zfsng_datapath import nbd  # noqa: E402
from zfsng_datapath.errors import NbdError  # noqa: E402

MiB = 1 << 20
SIZE = 8 * MiB


@pytest.fixture
def served(tmp_path):
    """(socket path, image path) of qemu-nbd serving a raw file as
    export "vdi"."""
    qemu_nbd = shutil.which("qemu-nbd")
    assert qemu_nbd, "qemu-nbd (Debian qemu-utils) is needed: .ci/run " \
        "installs it"
    image, sock = str(tmp_path / "disk.raw"), str(tmp_path / "nbd.sock")
    with open(image, "wb") as f:
        f.write(os.urandom(SIZE))
    proc = subprocess.Popen([qemu_nbd, "-f", "raw", "-x", "vdi", "-k", sock,
                             "--cache=none", "--aio=threads", "-t", image],
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not _listening(sock):     # the socket's file comes before listen
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "qemu-nbd did not start"
        time.sleep(0.05)
    yield sock, image
    proc.terminate()
    proc.wait(timeout=30)


def _listening(path):
    """Whether a server listens on the unix socket path, from the
    kernel's table (/proc/net/unix: the flag __SO_ACCEPTCON), without
    connecting: qemu-nbd serves one client at a time, and a probe's
    connection, closed mid-handshake, can keep the next client waiting
    for ever."""
    with open("/proc/net/unix") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == path and \
                    int(fields[3], 16) & 0x10000:
                return True
    return False


def image_bytes(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("server_zeroes", [True, False])
def test_writes_and_zeros_reach_the_image(served, server_zeroes):
    sock, image = served
    before = image_bytes(image)
    client = nbd.Client.connect(sock, "vdi", timeout=30)
    assert client.size == SIZE
    assert client.flags & nbd.SEND_WRITE_ZEROES     # qemu-nbd offers it
    if not server_zeroes:                           # as tapdisk's server
        client.flags &= ~nbd.SEND_WRITE_ZEROES
    data = os.urandom(3 * MiB + 4096)
    client.write(512 * 1024, data)                 # several requests
    client.zero(5 * MiB, 2 * MiB + 512)
    client.flush()
    assert client.read(512 * 1024, len(data)) == data
    assert client.read(5 * MiB, 2 * MiB + 512) == bytes(2 * MiB + 512)
    assert client.sent == len(data) + (0 if server_zeroes else
                                       2 * MiB + 512)
    client.close()
    after = image_bytes(image)
    want = bytearray(before)
    want[512 * 1024:512 * 1024 + len(data)] = data
    want[5 * MiB:7 * MiB + 512] = bytes(2 * MiB + 512)
    assert after == bytes(want)


def test_a_write_beyond_the_end_fails_the_batch(served):
    sock, _ = served
    client = nbd.Client.connect(sock, "vdi", timeout=30)
    client.write(SIZE - 512, bytes(1024))
    with pytest.raises(NbdError, match="failed command 1"):
        client.drain()
    client.close()


def test_an_unknown_export_is_refused(served):
    sock, _ = served
    with pytest.raises(NbdError, match="refused export 'other'"):
        nbd.Client.connect(sock, "other", timeout=30)


def test_no_server_is_a_typed_error(tmp_path):
    with pytest.raises(NbdError, match="cannot connect"):
        nbd.Client.connect(str(tmp_path / "none.sock"), "vdi", timeout=5)


def _silent_server(path, greet):
    """A server that accepts, says the greeting if told, then nothing."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    held = []

    def serve():
        conn, _ = listener.accept()
        held.append(conn)
        if greet:
            conn.sendall(struct.pack(">QQH", nbd.NBDMAGIC, nbd.IHAVEOPT, 3))
    threading.Thread(target=serve, daemon=True).start()
    return listener, held


@pytest.mark.parametrize("greet", [False, True])
def test_a_server_that_stops_answering_is_an_error_not_a_hang(tmp_path,
                                                              greet):
    listener, held = _silent_server(str(tmp_path / "s.sock"), greet)
    try:
        with pytest.raises(NbdError, match="did not answer within 1 s"):
            nbd.Client.connect(str(tmp_path / "s.sock"), "vdi", timeout=1)
    finally:
        listener.close()
        for conn in held:
            conn.close()


def _old_server(path, size):
    """A fixed-newstyle server without NBD_OPT_GO (it answers
    NBD_REP_ERR_UNSUP), as servers before it had: the client falls back to
    NBD_OPT_EXPORT_NAME."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    seen = []

    def recv(conn, n):
        data = b""
        while len(data) < n:
            data += conn.recv(n - len(data))
        return data

    def serve():
        conn, _ = listener.accept()
        conn.sendall(struct.pack(">QQH", nbd.NBDMAGIC, nbd.IHAVEOPT, 1))
        recv(conn, 4)
        for _ in range(2):
            _, option, length = struct.unpack(">QII", recv(conn, 16))
            data = recv(conn, length)
            seen.append((option, data))
            if option == nbd.OPT_GO:
                conn.sendall(struct.pack(">QIII", nbd.REPLY_MAGIC, option,
                                         (1 << 31) + 1, 0))
            else:
                conn.sendall(struct.pack(">QH", size, 1) + bytes(124))
        seen.append(conn)
    threading.Thread(target=serve, daemon=True).start()
    return listener, seen


def test_falls_back_to_export_name_on_an_older_server(tmp_path):
    listener, seen = _old_server(str(tmp_path / "o.sock"), 5 * MiB)
    try:
        client = nbd.Client.connect(str(tmp_path / "o.sock"), "vdi",
                                    timeout=10)
        assert (client.size, client.flags) == (5 * MiB, 1)
        assert [s[0] for s in seen[:2]] == [nbd.OPT_GO, nbd.OPT_EXPORT_NAME]
        assert seen[1][1] == b"vdi"
        client.sock.close()
    finally:
        listener.close()


def test_tapdisks_negative_errno_is_named(tmp_path):
    """tapdisk's server answers a failed request with the request's
    negative errno as it is (tapdisk-nbdserver.c: reply.error =
    htonl(error)), where the protocol wants a positive one: the error an
    admin reads names ENOSPC, not errno 4294967268."""
    listener, seen = _old_server(str(tmp_path / "o.sock"), 5 * MiB)
    try:
        client = nbd.Client.connect(str(tmp_path / "o.sock"), "vdi",
                                    timeout=10)
        deadline = time.monotonic() + 10
        while len(seen) < 3:                 # the server's connection
            assert time.monotonic() < deadline
            time.sleep(0.01)
        conn = seen[2]
        client.write(0, b"a" * 4096)
        request = b""
        while len(request) < 28 + 4096:
            request += conn.recv(28 + 4096 - len(request))
        handle = struct.unpack(">IHHQQI", request[:28])[3]
        conn.sendall(struct.pack(">IIQ", nbd.SIMPLE_REPLY_MAGIC,
                                 (1 << 32) - errno.ENOSPC, handle))
        with pytest.raises(NbdError, match=r"ENOSPC \(errno 28\)"):
            client.drain()
        assert nbd.reply_error(errno.EIO) == "EIO (errno 5)"   # protocol's
        client.sock.close()
    finally:
        listener.close()


@pytest.mark.parametrize("uri,want", [
    ("nbd+unix:///vdi?socket=/var/run/nbdproxy/export/MIRabc123",
     ("/var/run/nbdproxy/export/MIRabc123", "vdi")),
    ("nbd+unix:///a%20b?socket=/tmp/x%3Ay", ("/tmp/x:y", "a b")),
    ("nbd:unix:/var/run/blktap-control/nbd12.3:exportname=zfs-ng",
     ("/var/run/blktap-control/nbd12.3", "zfs-ng")),
])
def test_parses_the_uris_xapi_and_attach_give(uri, want):
    assert nbd.parse_uri(uri) == want


@pytest.mark.parametrize("uri", [
    "nbd://host/vdi", "nbd+unix:///vdi", "nbd:unix:/s", "file:///x",
    "nbd+unix://vdi?socket=/s",
])
def test_refuses_other_uris(uri):
    with pytest.raises(NbdError, match="not an NBD unix-socket URI"):
        nbd.parse_uri(uri)


# --- the mirror's relay: tapdisk's secondary forwarded upstream ----------------

from zfsng_datapath import relay  # noqa: E402


class TapdiskClient(object):
    """tapdisk's NBD client as block-nbd.c negotiates (NO_ZEROES, one
    NBD_OPT_EXPORT_NAME "tapdisk_client" with its NUL, a 10-byte answer)
    and sends simple requests."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(path)
        self.recv(18)
        self.sock.sendall(struct.pack(">I", 3))
        name = b"tapdisk_client\0"
        self.sock.sendall(struct.pack(">QII", nbd.IHAVEOPT,
                                      nbd.OPT_EXPORT_NAME, len(name)) + name)
        self.size, self.flags = struct.unpack(">QH", self.recv(10))

    def recv(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the relay closed the connection"
            data += chunk
        return data

    def request(self, kind, handle, offset, data=b"", length=None):
        self.sock.sendall(struct.pack(
            ">IHHQQI", nbd.REQUEST_MAGIC, 0, kind, handle, offset,
            len(data) if length is None else length) + data)

    def reply(self, read=0):
        magic, error, handle = struct.unpack(">IIQ", self.recv(16))
        assert magic == nbd.SIMPLE_REPLY_MAGIC
        return error, handle, self.recv(read) if read and not error else b""


def relayed(served, tmp_path):
    """(tapdisk's client, the forwarder's thread, its outcome)."""
    sock, _ = served
    upstream = nbd.Client.connect(sock, "vdi", timeout=30)
    listener = relay.listen(str(tmp_path / "relay.sock"))
    came = {}
    thread = threading.Thread(target=lambda: came.setdefault(
        "conn", relay.accept(listener, upstream.size)))
    thread.start()
    tapdisk = TapdiskClient(str(tmp_path / "relay.sock"))
    thread.join(30)
    forwarder = relay.Forwarder(came["conn"], upstream)
    outcome = {}

    def run():
        try:
            forwarder.run()
        except NbdError as exc:
            outcome["error"] = exc
    runner_thread = threading.Thread(target=run)
    runner_thread.start()
    return tapdisk, runner_thread, outcome, forwarder


def test_the_relay_forwards_tapdisks_writes_and_reads(served, tmp_path):
    _, image = served
    tapdisk, thread, outcome, forwarder = relayed(served, tmp_path)
    assert tapdisk.size == SIZE
    blocks = [(i, os.urandom(64 * 1024)) for i in range(0, 40, 3)]
    for n, (i, data) in enumerate(blocks):          # pipelined
        tapdisk.request(nbd.CMD_WRITE, 0xAB00 + n, i * 64 * 1024, data)
    handles = sorted(tapdisk.reply()[1] for _ in blocks)
    assert handles == [0xAB00 + n for n in range(len(blocks))]
    tapdisk.request(nbd.CMD_READ, 7, 3 * 64 * 1024, length=64 * 1024)
    error, handle, data = tapdisk.reply(read=64 * 1024)
    assert (error, handle, data) == (0, 7, blocks[1][1])
    tapdisk.request(nbd.CMD_DISC, 8, 0)
    thread.join(30)
    assert not thread.is_alive() and outcome == {}
    assert forwarder.forwarded == 64 * 1024 * len(blocks)
    with open(image, "rb") as f:
        for i, data in blocks:
            f.seek(i * 64 * 1024)
            assert f.read(len(data)) == data


def test_a_dead_destination_drops_tapdisks_secondary(served, tmp_path):
    tapdisk, thread, outcome, _ = relayed(served, tmp_path)
    tapdisk.request(nbd.CMD_WRITE, 1, 0, b"a" * 4096)
    assert tapdisk.reply()[:2] == (0, 1)
    subprocess.run(["pkill", "-f", "qemu-nbd.*" + str(tmp_path)],
                   timeout=30)
    try:        # the relay may have dropped tapdisk already: no matter
        tapdisk.request(nbd.CMD_WRITE, 2, 0, b"b" * 4096)
    except OSError:
        pass
    thread.join(60)
    assert not thread.is_alive()
    assert "closed the NBD connection" in str(outcome["error"]) or \
        "link failed" in str(outcome["error"])
    try:                                    # tapdisk sees its secondary go
        assert tapdisk.sock.recv(16) == b""
    except ConnectionResetError:
        pass


def test_the_catch_up_never_writes_over_a_mirrored_write(served, tmp_path):
    """The copy's last change and tapdisk's mirrored writes share the one
    upstream connection: where tapdisk wrote since the switch, the
    destination keeps tapdisk's bytes, whatever the catch-up sends later
    there; elsewhere it gets the catch-up's, zeros included."""
    _, image = served
    tapdisk, thread, outcome, forwarder = relayed(served, tmp_path)
    mirrored = os.urandom(8192)
    tapdisk.request(nbd.CMD_WRITE, 1, 64 * 1024, mirrored)
    assert tapdisk.reply()[:2] == (0, 1)
    old = os.urandom(256 * 1024)
    forwarder.write(0, old)                  # over the mirrored range
    forwarder.zero(68 * 1024, 4096)          # inside it: nothing sent
    forwarder.zero(128 * 1024, 64 * 1024)    # outside it: zeros
    forwarder.flush()
    forwarder.caught_up()
    tapdisk.request(nbd.CMD_DISC, 2, 0)
    thread.join(30)
    assert not thread.is_alive() and outcome == {}
    want = bytearray(old)
    want[64 * 1024:72 * 1024] = mirrored
    want[128 * 1024:192 * 1024] = bytes(64 * 1024)
    assert image_bytes(image)[:256 * 1024] == bytes(want)
    zeros_sent = 0 if forwarder.flags & nbd.SEND_WRITE_ZEROES else 64 * 1024
    assert forwarder.sent == 256 * 1024 - 8192 + zeros_sent
    assert forwarder.forwarded == 8192


def test_a_mirrored_write_waits_for_an_overlapping_catch_up_write(
        served, tmp_path):
    """An NBD server may run requests in flight in any order: a tapdisk
    write over a catch-up write not yet answered is held until that
    answer, and one elsewhere is not."""
    tapdisk, thread, outcome, forwarder = relayed(served, tmp_path)
    with forwarder.lock:          # a catch-up write in flight over 0..4096
        forwarder.copying[7] = (0, 4096)
    tapdisk.request(nbd.CMD_WRITE, 1, 1 << 20, b"e" * 4096)  # elsewhere
    assert tapdisk.reply()[:2] == (0, 1)
    tapdisk.request(nbd.CMD_WRITE, 2, 0, b"o" * 4096)        # over it
    tapdisk.sock.settimeout(1)
    with pytest.raises(socket.timeout):
        tapdisk.reply()
    with forwarder.lock:                     # its answer comes
        del forwarder.copying[7]
        forwarder.lock.notify_all()
    tapdisk.sock.settimeout(30)
    assert tapdisk.reply()[:2] == (0, 2)
    tapdisk.request(nbd.CMD_DISC, 3, 0)
    thread.join(30)
    assert not thread.is_alive() and outcome == {}


def test_an_error_reply_fails_the_mirror(served, tmp_path):
    """The destination fails a mirrored write: tapdisk gets the error (and
    drops its secondary), and the relay fails the mirror too, so the job
    cannot end "done" with the destination missing writes."""
    tapdisk, thread, outcome, _ = relayed(served, tmp_path)
    tapdisk.request(nbd.CMD_WRITE, 1, SIZE, b"a" * 4096)   # past the end
    error, handle, _ = tapdisk.reply()
    assert error != 0 and handle == 1
    thread.join(60)
    assert not thread.is_alive()
    assert "failed a mirrored request" in str(outcome["error"])
