"""The mirror's relay: tapdisk's NBD secondary served on a local socket,
every request forwarded over the migration's one upstream connection.

Why a relay, not tapdisk straight to the destination: xapi's proxy to the
destination accepts ONE connection (storage_smapiv3_migrate.ml
export_nbd_proxy: one accept, then its listening socket is closed), which
the copy has used already; and tapdisk's NBD client always asks for the
export ``tapdisk_client`` (block-nbd.c, NBD_FIXED_SINGLE_EXPORT), not the
destination's. So the mirror job owns the upstream connection, copies over
it, and then hands tapdisk this socket as its secondary (``tap-ctl unpause
-2 nbd:<socket>``).

tapdisk's client (block-nbd.c): fixed newstyle with NO_ZEROES, one
NBD_OPT_EXPORT_NAME, a 10-byte answer (size, flags); then simple requests
(WRITE, READ, DISC), pipelined. A reply goes back to tapdisk only once
the destination answered the request: tapdisk acknowledges a guest write
when both its image and this secondary have it, so an acknowledged write
is on the destination. When the upstream fails, the relay closes
tapdisk's connection: tapdisk then drops the secondary and marks
``nbd_mirror_failed``; the guest never sees an error.
"""

import os
import select
import socket
import struct
import threading

from zfsng import log
from zfsng_datapath import nbd
from zfsng_datapath.errors import NbdError

ACCEPT_TIMEOUT = 60.0   # seconds: tapdisk connects during tap-ctl unpause
POLL = 0.2              # seconds between two looks for upstream replies


def listen(path):
    """A listening unix socket at path (a stale one removed first)."""
    try:
        os.unlink(path)
    except OSError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(1)
    sock.settimeout(ACCEPT_TIMEOUT)
    return sock


def accept(listener, size):
    """Accept tapdisk's connection and answer its negotiation; returns the
    connected socket. Raises NbdError if tapdisk does not come."""
    try:
        conn, _ = listener.accept()
    except (socket.timeout, OSError) as exc:
        raise NbdError("tapdisk did not connect to the mirror's socket: %s"
                       % exc)
    conn.settimeout(nbd.TIMEOUT)
    try:
        conn.sendall(struct.pack(">QQH", nbd.NBDMAGIC, nbd.IHAVEOPT,
                                 nbd.FLAG_FIXED_NEWSTYLE |
                                 nbd.FLAG_NO_ZEROES))
        cflags, = struct.unpack(">I", _recv(conn, 4))
        _, option, length = struct.unpack(">QII", _recv(conn, 16))
        _recv(conn, length)
        if option != nbd.OPT_EXPORT_NAME:
            raise NbdError("tapdisk asked for NBD option %d" % option)
        conn.sendall(struct.pack(">QH", size, 1) +
                     (b"" if cflags & nbd.FLAG_NO_ZEROES else bytes(124)))
    except (OSError, socket.timeout) as exc:
        conn.close()
        raise NbdError("negotiating with tapdisk: %s" % exc)
    conn.settimeout(None)   # the guest may write nothing for a long time
    return conn


def _shut(conn):
    """End both directions: wakes a thread blocked reading it."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _recv(conn, n, closed="tapdisk closed the mirror's connection"):
    """Exactly n bytes from conn; NbdError(closed) at its end."""
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise NbdError(closed)
        data += chunk
    return data


class Forwarder(object):
    """tapdisk's requests to the upstream client, its replies back."""

    def __init__(self, conn, client):
        self.conn, self.client = conn, client
        self.upstream = client.sock
        self.lock = threading.Lock()     # pending and done
        self.pending = {}   # upstream handle -> (tapdisk's, read length)
        self.next = 1 << 32    # handles apart from the client's own
        self.error = None
        self.done = False
        self.forwarded = 0               # bytes written by the guest

    def run(self):
        """Forward until tapdisk disconnects (the VBD closed: the VM moved
        or stopped) or either side fails; then wait for the replies still
        due. Raises NbdError on an upstream failure."""
        self.client.drain()
        self.upstream.settimeout(None)
        replies = threading.Thread(target=self._replies)
        replies.daemon = True
        replies.start()
        try:
            self._requests()
        finally:
            with self.lock:
                self.done = True
            replies.join(nbd.TIMEOUT + 2 * POLL)
            self.conn.close()
        if self.error:
            raise NbdError(self.error)

    def _requests(self):
        while self.error is None:
            try:
                request = self._request()
            except (NbdError, OSError):
                return                    # tapdisk went away
            if request is None:
                return                    # NBD_CMD_DISC
            magic, flags, kind, handle, offset, length, data = request
            self.next += 1
            # Registered before it is sent (its reply may come at once);
            # sent outside the lock: a send waiting for the destination to
            # read must not keep the replies from being taken.
            with self.lock:
                self.pending[self.next] = (handle, length
                                           if kind == nbd.CMD_READ else 0)
            try:
                self.upstream.sendall(struct.pack(
                    ">IHHQQI", magic, flags, kind, self.next, offset,
                    length) + data)
            except OSError as exc:
                self.error = "the NBD link failed: %s" % exc
                return
            if kind == nbd.CMD_WRITE:
                self.forwarded += length

    def _request(self):
        """tapdisk's next request with its data, or None for DISC."""
        head = _recv(self.conn, 28)
        magic, flags, kind, handle, offset, length = struct.unpack(
            ">IHHQQI", head)
        if magic != nbd.REQUEST_MAGIC:
            raise NbdError("tapdisk sent a bad NBD request")
        if kind == nbd.CMD_DISC:
            return None
        data = _recv(self.conn, length) if kind == nbd.CMD_WRITE else b""
        return magic, flags, kind, handle, offset, length, data

    def _replies(self):
        """Upstream replies to tapdisk, in the order they come. Polls, so
        that it sees the end of the requests without a reply to wait for;
        a reply due for TIMEOUT seconds fails the mirror."""
        self.upstream.settimeout(nbd.TIMEOUT)
        waited = 0.0
        while True:
            with self.lock:
                idle = not self.pending
                if idle and self.done:
                    return
            if not select.select([self.upstream], [], [], POLL)[0]:
                waited = 0.0 if idle else waited + POLL
                if waited < nbd.TIMEOUT:
                    continue
                self.error = "the destination did not answer within %d s" \
                    % nbd.TIMEOUT
            else:
                waited = 0.0
                try:
                    self._reply()
                    continue
                except (NbdError, OSError, socket.timeout) as exc:
                    self.error = str(exc) or "the NBD link failed"
            log.warning("mirror relay: %s", self.error)
            _shut(self.conn)              # tapdisk drops the secondary
            return

    def _reply(self):
        """One upstream reply, passed to tapdisk under its own handle."""
        magic, error, handle = struct.unpack(">IIQ", self._upstream_recv(16))
        with self.lock:
            theirs, read = self.pending.pop(handle, (None, 0))
        if theirs is None:
            raise NbdError("the destination answered an unknown request")
        data = self._upstream_recv(read) if read and not error else b""
        try:
            self.conn.sendall(struct.pack(">IIQ", magic, error, theirs) +
                              data)
        except OSError:
            pass          # tapdisk went away: the requests side ends

    def _upstream_recv(self, n):
        return _recv(self.upstream, n,
                     "the destination closed the NBD connection")
