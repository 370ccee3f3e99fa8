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
is on the destination. When the upstream fails, or the destination
answers a request with an error (passed on to tapdisk), the relay fails
the mirror and closes tapdisk's connection: tapdisk then drops the
secondary and marks ``nbd_mirror_failed``; the guest never sees an error.

The space guard's window (zfsng.spaceguard.Budget): every tapdisk write
is counted at what it can dirty in ZFS, and once a window is full the
relay has the pool written out (``settle``: ``zpool sync``) before it
reads tapdisk's next request, so ZFS's estimate of the zvol's writes not
yet synced stays inside the refreservation the guard raised. tapdisk
writes the zvol and this secondary at once, so while the relay waits
its requests in flight (at most its ring) are all it can add; the
guard's margin counts them.
"""

import os
import select
import socket
import struct
import threading
import time

from zfsng import blockmap, log
from zfsng.errors import StorageError
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
    """tapdisk's requests to the upstream client, its replies back; and
    the catch-up: the copy's last change, sent over the same connection
    while tapdisk mirrors (``write``, ``zero``, ``drain``, ``flush``, as
    nbd.Client has them).

    The catch-up never writes over a mirrored write: while it runs, the
    ranges tapdisk wrote are kept (``mirrored``), a catch-up write sends
    only what lies outside them, and a tapdisk write that overlaps a
    catch-up write still in flight waits for its reply first (an NBD
    server may run requests in flight in any order)."""

    def __init__(self, conn, client, budget=None, settle=None):
        self.conn, self.client = conn, client
        self.budget, self.settle = budget, settle   # the space guard's
        self.upstream = client.sock
        self.flags = client.flags
        self.lock = threading.Condition()   # the fields below
        self.sending = threading.Lock()     # one request at a time on the wire
        self.pending = {}   # upstream handle -> (tapdisk's, read length)
        self.copying = {}   # upstream handle -> range, the catch-up's
        self.mirrored = []  # range set tapdisk wrote, while tracking
        self.tracking = True
        self.next = 1 << 32    # handles apart from the client's own
        self.error = None
        self.done = False
        self.threads = []
        self.forwarded = 0               # bytes written by the guest
        self.sent = 0                    # bytes written by the catch-up
        self.settles = 0                 # the guard's pool syncs, and
        self.settle_seconds = 0.0        # their time: what they cost

    def run(self):
        """start, then wait."""
        self.start()
        self.wait()

    def start(self):
        """Forward in two threads, requests and replies."""
        self.client.drain()
        self.upstream.settimeout(nbd.TIMEOUT)
        self.threads = [threading.Thread(target=self._replies),
                        threading.Thread(target=self._requests)]
        for thread in self.threads:
            thread.daemon = True
            thread.start()

    def wait(self):
        """Until tapdisk disconnects (the VBD closed: the VM moved or
        stopped) or either side fails; then the replies still due. Raises
        NbdError on an upstream failure."""
        replies, requests = self.threads
        requests.join()      # the job's own life bound holds
        with self.lock:
            self.done = True
            self.lock.notify_all()
        replies.join(nbd.TIMEOUT + 2 * POLL)
        self.conn.close()
        if self.error:
            raise NbdError(self.error)

    def ended(self, timeout):
        """Wait up to timeout seconds for the forwarding to end; whether
        it has."""
        with self.lock:
            return self.lock.wait_for(lambda: self.done or
                                      self.error is not None, timeout)

    def stop(self, error):
        """Fail the mirror: tapdisk drops its secondary."""
        self._fail(error)
        _shut(self.conn)

    # --- tapdisk's side -----------------------------------------------------

    def _requests(self):
        try:
            self._forward_requests()
        finally:
            with self.lock:
                self.done = True
                self.lock.notify_all()

    def _forward_requests(self):
        while self.error is None:
            try:
                request = self._request()
            except (NbdError, OSError):
                return                    # tapdisk went away
            if request is None:
                return                    # NBD_CMD_DISC
            magic, flags, kind, handle, offset, length, data = request
            # Registered before it is sent (its reply may come at once);
            # sent outside the lock: a send waiting for the destination to
            # read must not keep the replies from being taken.
            with self.lock:
                if kind == nbd.CMD_WRITE and not self._mirroring(
                        offset, offset + length):
                    return
                self.next += 1
                ours = self.next
                self.pending[ours] = (handle, length
                                      if kind == nbd.CMD_READ else 0)
            if not self._send(struct.pack(">IHHQQI", magic, flags, kind,
                                          ours, offset, length) + data):
                return
            if kind == nbd.CMD_WRITE:
                self.forwarded += length
                if not self._counted(offset, length):
                    return

    def _counted(self, offset, length):
        """Count a tapdisk write in the guard's window; once it is full,
        the pool written out before the next request is read. False (the
        mirror failed) if that cannot be done."""
        if self.budget is None or not self.budget.add(offset, length):
            return True
        started, failed = time.monotonic(), None
        try:
            self.settle()
        except StorageError as exc:
            failed = exc
        self.settles += 1          # counted before a failure ends the mirror
        self.settle_seconds += time.monotonic() - started
        if failed is not None:
            self.stop("the pool could not be written out to keep the "
                      "disk's writes inside their guard: %s"
                      % failed.message)
            return False
        self.budget.reset()
        return True

    def _mirroring(self, start, end):
        """Note a tapdisk write while the catch-up runs, and wait until no
        catch-up write in flight overlaps it. Under the lock."""
        if not self.tracking:
            return True
        self.mirrored = blockmap.union(self.mirrored, [(start, end)])
        if not self.lock.wait_for(lambda: self.error is not None or not any(
                s < end and start < e for s, e in self.copying.values()),
                nbd.TIMEOUT):
            self._fail("the destination did not answer within %d s"
                       % nbd.TIMEOUT)
        return self.error is None

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

    # --- the catch-up -------------------------------------------------------

    def write(self, offset, data):
        """The copy's data at offset, except where tapdisk wrote since."""
        for at in range(0, len(data), nbd.MAX_REQUEST):
            piece = data[at:at + nbd.MAX_REQUEST]
            self._catch_up(nbd.CMD_WRITE, offset + at, len(piece), piece)

    def zero(self, offset, length):
        """Zeros at offset..offset+length, except where tapdisk wrote."""
        for at in range(offset, offset + length, nbd.MAX_REQUEST):
            n = min(nbd.MAX_REQUEST, offset + length - at)
            if self.flags & nbd.SEND_WRITE_ZEROES:
                self._catch_up(nbd.CMD_WRITE_ZEROES, at, n, None)
            else:
                self._catch_up(nbd.CMD_WRITE, at, n, nbd.ZERO_CHUNK[:n])

    def drain(self):
        """Wait until every catch-up request has its reply."""
        with self.lock:
            self._wait(lambda: not self.copying)

    def flush(self):
        """drain, then FLUSH where the server offers it."""
        self.drain()
        if self.flags & nbd.SEND_FLUSH:
            self._catch_up(nbd.CMD_FLUSH, 0, 0, None)
            self.drain()

    def caught_up(self):
        """The catch-up is over: tapdisk's writes need no more tracking."""
        with self.lock:
            self.tracking, self.mirrored = False, []

    def _catch_up(self, kind, offset, length, data):
        with self.lock:
            if self.done:
                raise NbdError("tapdisk closed the mirror before the copy "
                               "ended")
            self._wait(lambda: len(self.copying) < nbd.WINDOW)
            parts = [(offset, offset + length)] if not length else \
                blockmap.subtract([(offset, offset + length)], self.mirrored)
            sends = []
            for start, end in parts:
                self.next += 1
                self.copying[self.next] = (start, end)
                sends.append((self.next, start, end))
        for handle, start, end in sends:
            body = bytes(data[start - offset:end - offset]) if data else b""
            if not self._send(struct.pack(">IHHQQI", nbd.REQUEST_MAGIC, 0,
                                          kind, handle, start, end - start)
                              + body):
                raise NbdError(self.error)
            self.sent += len(body)

    def _wait(self, ready):
        """Under the lock: wait until ready() or a failure (NbdError)."""
        if not self.lock.wait_for(lambda: self.error is not None or ready(),
                                  nbd.TIMEOUT):
            self._fail("the destination did not answer within %d s"
                       % nbd.TIMEOUT)
        if self.error is not None:
            raise NbdError(self.error)

    # --- the destination's side ---------------------------------------------

    def _send(self, message):
        """One request upstream; False (the mirror failed) if it cannot."""
        try:
            with self.sending:
                self.upstream.sendall(message)
            return True
        except OSError as exc:          # socket.timeout included
            self.stop("the NBD link failed: %s" % exc)
            return False

    def _fail(self, error):
        """Record the first failure and wake every waiter."""
        with self.lock:           # reentrant: waiters call it holding it
            if self.error is None:
                self.error = error
                log.warning("mirror relay: %s", error)
            self.lock.notify_all()

    def _replies(self):
        """Upstream replies, in the order they come. Polls, so that it sees
        the end of the requests without a reply to wait for; a reply due
        for TIMEOUT seconds fails the mirror."""
        waited = 0.0
        while self.error is None:
            with self.lock:
                idle = not self.pending and not self.copying
                if idle and self.done:
                    return
            if not select.select([self.upstream], [], [], POLL)[0]:
                waited = 0.0 if idle else waited + POLL
                if waited >= nbd.TIMEOUT:
                    self.stop("the destination did not answer within %d s"
                              % nbd.TIMEOUT)
                continue
            waited = 0.0
            try:
                self._reply()
            except (NbdError, OSError) as exc:
                self.stop(str(exc) or "the NBD link failed")

    def _reply(self):
        """One upstream reply: the catch-up's, or passed to tapdisk under
        its own handle."""
        magic, error, handle = struct.unpack(">IIQ", self._upstream_recv(16))
        with self.lock:
            ours = self.copying.pop(handle, None)
            theirs, read = self.pending.pop(handle, (None, 0))
            self.lock.notify_all()
        if ours is not None:
            if error:
                raise NbdError("the destination failed a copy write at "
                               "%d+%d: %s" % (ours[0], ours[1] - ours[0],
                                              nbd.reply_error(error)))
            return
        if theirs is None:
            raise NbdError("the destination answered an unknown request")
        data = self._upstream_recv(read) if read and not error else b""
        try:
            self.conn.sendall(struct.pack(">IIQ", magic, error, theirs) +
                              data)
        except OSError:
            pass          # tapdisk went away: the requests side ends
        if error:    # tapdisk drops the secondary on it: so does the job
            raise NbdError("the destination failed a mirrored request: %s"
                           % nbd.reply_error(error))

    def _upstream_recv(self, n):
        return _recv(self.upstream, n,
                     "the destination closed the NBD connection")
