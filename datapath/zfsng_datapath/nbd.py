"""An NBD client: what a storage migration writes the disk's blocks with.

xapi hands the datapath the destination of a mirror as an NBD URI
(``nbd+unix:///<export>?socket=<path>``, ``Data.mirror``), and zfs-ng's
own attach answers one (tapdisk's NBD server). This module speaks the
protocol's fixed newstyle negotiation (NBD_OPT_GO, falling back to
NBD_OPT_EXPORT_NAME for an older server) and its simple replies, which is
what tapdisk's server and client, qemu-nbd and xapi's proxies all speak.

Every wait is bounded: the socket has a timeout, so a peer that stops
answering is an NbdError, never a hang. Requests are pipelined (up to
WINDOW in flight) because the link, not the disk, is what a migration
waits for; a reply that reports an error fails the whole batch, as the
destination then holds unknown data there.

Protocol constants: the NBD protocol document (doc/proto.md of the NBD
project), as tapdisk's tapdisk-nbdserver.c implements it.
"""

import errno
import socket
import struct
from urllib.parse import unquote

from zfsng_datapath.errors import NbdError

NBDMAGIC = 0x4E42444D41474943          # "NBDMAGIC"
IHAVEOPT = 0x49484156454F5054          # "IHAVEOPT"
REPLY_MAGIC = 0x3E889045565A9          # option replies
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES = 1, 2
OPT_EXPORT_NAME, OPT_ABORT, OPT_GO = 1, 2, 7
REP_ACK, REP_INFO = 1, 3
INFO_EXPORT = 0
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM = 0, 1, 2, 3, 4
CMD_WRITE_ZEROES = 6
SEND_FLUSH, SEND_TRIM, SEND_WRITE_ZEROES = 1 << 2, 1 << 5, 1 << 6
READ_ONLY = 1 << 1

TIMEOUT = 60.0             # seconds: the bound on any one wait for the peer
MAX_REQUEST = 1 << 20      # bytes per request (tapdisk takes up to 64 MiB)
WINDOW = 16                # requests in flight
ZERO_CHUNK = bytes(MAX_REQUEST)


def reply_error(error):
    """The error field of a reply as an admin reads it: "ENOSPC (errno
    28)". The protocol sends a positive errno; tapdisk's server sends its
    request's negative one as it is (tapdisk-nbdserver.c: reply.error =
    htonl(error), the error -errno from libaio-backend.c), which reads
    4294967268 for ENOSPC."""
    if error >= 1 << 31:
        error = (1 << 32) - error
    return "%s (errno %d)" % (errno.errorcode.get(error, "unknown"), error)


def parse_uri(uri):
    """(socket path, export name) of ``nbd+unix:///<export>?socket=<path>``
    (what xapi passes to Data.mirror) or ``nbd:unix:<path>:exportname=<name>``
    (what an attach answers)."""
    if uri.startswith("nbd:unix:"):
        path, sep, rest = uri[len("nbd:unix:"):].partition(":")
        if sep and rest.startswith("exportname=") and path:
            return path, rest[len("exportname="):]
    elif uri.startswith("nbd+unix://"):
        rest = uri[len("nbd+unix://"):]
        where, _, query = rest.partition("?")
        params = dict(p.partition("=")[::2] for p in query.split("&") if p)
        if where.startswith("/") and params.get("socket"):
            return unquote(params["socket"]), unquote(where[1:])
    raise NbdError("not an NBD unix-socket URI: %r" % uri)


class Client(object):
    """One negotiated NBD connection: size, flags, and the commands."""

    def __init__(self, sock, export, timeout=TIMEOUT):
        self.sock, self.export, self.timeout = sock, export, timeout
        self.sock.settimeout(timeout)
        self.size, self.flags = self._negotiate(export)
        self.sent = 0               # bytes of data written, for progress
        self._handle = 0
        self._pending = {}          # handle -> (command, offset, length)

    @classmethod
    def connect(cls, path, export, timeout=TIMEOUT):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except (OSError, socket.timeout) as exc:
            sock.close()
            raise NbdError("cannot connect to the NBD server at %s: %s"
                           % (path, exc))
        try:
            return cls(sock, export, timeout)
        except BaseException:
            sock.close()
            raise

    # --- negotiation --------------------------------------------------------

    def _negotiate(self, export):
        magic, opt, gflags = struct.unpack(">QQH", self._recv(18))
        if magic != NBDMAGIC or opt != IHAVEOPT:
            raise NbdError("not a newstyle NBD server (magic %x %x)"
                           % (magic, opt))
        if not gflags & FLAG_FIXED_NEWSTYLE:
            raise NbdError("the NBD server is not fixed newstyle")
        self._no_zeroes = bool(gflags & FLAG_NO_ZEROES)
        self._send(struct.pack(">I", gflags & (FLAG_FIXED_NEWSTYLE |
                                               FLAG_NO_ZEROES)))
        name = export.encode("utf-8")
        found = self._opt_go(name)
        return found if found is not None else self._export_name(name)

    def _option(self, option, data):
        self._send(struct.pack(">QII", IHAVEOPT, option, len(data)) + data)

    def _opt_go(self, name):
        """(size, flags) by NBD_OPT_GO, or None if the server lacks it."""
        self._option(OPT_GO, struct.pack(">I", len(name)) + name +
                     struct.pack(">H", 0))
        size = flags = None
        while True:
            magic, option, reply, length = struct.unpack(
                ">QIII", self._recv(20))
            data = self._recv(length) if length else b""
            if magic != REPLY_MAGIC or option != OPT_GO:
                raise NbdError("bad option reply from the NBD server")
            if reply == REP_ACK:
                if size is None:
                    raise NbdError("the NBD server gave no export size")
                return size, flags
            if reply == REP_INFO:
                if len(data) >= 12 and \
                        struct.unpack(">H", data[:2])[0] == INFO_EXPORT:
                    size, flags = struct.unpack(">QH", data[2:12])
                continue
            if reply & (1 << 31):
                if reply == (1 << 31) + 1:      # NBD_REP_ERR_UNSUP
                    return None
                raise NbdError("the NBD server refused export %r: error "
                               "%d %s" % (name.decode("utf-8", "replace"),
                                          reply & 0x7FFFFFFF,
                                          data.decode("utf-8", "replace")))

    def _export_name(self, name):
        self._option(OPT_EXPORT_NAME, name)
        size, flags = struct.unpack(">QH", self._recv(10))
        if not self._no_zeroes:
            self._recv(124)
        return size, flags

    # --- transmission -------------------------------------------------------

    def _request(self, command, offset, length, data=b""):
        """Send one request; wait for replies while WINDOW are in flight."""
        while len(self._pending) >= WINDOW:
            self._reply()
        self._handle += 1
        self._pending[self._handle] = (command, offset, length)
        self._send(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, command,
                               self._handle, offset, length) + data)

    def _reply(self):
        """Read one simple reply (not for READ: see read)."""
        magic, error, handle = struct.unpack(">IIQ", self._recv(16))
        if magic != SIMPLE_REPLY_MAGIC or handle not in self._pending:
            raise NbdError("bad reply from the NBD server")
        command, offset, length = self._pending.pop(handle)
        if error:
            raise NbdError("the NBD server failed command %d at %d+%d: %s"
                           % (command, offset, length, reply_error(error)))

    def drain(self):
        """Wait until every request sent has its reply."""
        while self._pending:
            self._reply()

    def write(self, offset, data):
        """Write data at offset, in MAX_REQUEST pieces, pipelined."""
        view = memoryview(data)
        for at in range(0, len(data), MAX_REQUEST):
            piece = view[at:at + MAX_REQUEST]
            self._request(CMD_WRITE, offset + at, len(piece), bytes(piece))
            self.sent += len(piece)

    def zero(self, offset, length):
        """Make offset..offset+length read as zeros: WRITE_ZEROES where
        the server offers it, else zeros written (tapdisk's server has only
        READ and WRITE)."""
        for at in range(offset, offset + length, MAX_REQUEST):
            n = min(MAX_REQUEST, offset + length - at)
            if self.flags & SEND_WRITE_ZEROES:
                self._request(CMD_WRITE_ZEROES, at, n)
            else:
                self._request(CMD_WRITE, at, n, ZERO_CHUNK[:n])
                self.sent += n

    def flush(self):
        """Wait for every reply, then FLUSH where the server offers it."""
        self.drain()
        if self.flags & SEND_FLUSH:
            self._request(CMD_FLUSH, 0, 0)
            self.drain()

    def read(self, offset, length):
        """length bytes at offset (one request; for checks and tests)."""
        self.drain()
        self._handle += 1
        self._send(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_READ,
                               self._handle, offset, length))
        magic, error, handle = struct.unpack(">IIQ", self._recv(16))
        if magic != SIMPLE_REPLY_MAGIC or handle != self._handle:
            raise NbdError("bad reply from the NBD server")
        if error:
            raise NbdError("the NBD server failed a read at %d+%d: %s"
                           % (offset, length, reply_error(error)))
        return self._recv(length)

    def close(self):
        """Wait for the replies due if the link still works, then close;
        never raises. No NBD_CMD_DISC: tapdisk's server (blktap 3.55.5,
        tapdisk-nbdserver.c) answers it by starting a new handshake on the
        same socket, and once that socket closes it keeps a dead
        descriptor in its event loop and spins (``select failed: Bad file
        descriptor``) until the VBD closes. A plain close ends the
        connection cleanly for it and for every other server."""
        try:
            self.drain()
        except (NbdError, OSError):
            pass
        finally:
            self.sock.close()

    # --- the socket ---------------------------------------------------------

    def _send(self, data):
        try:
            self.sock.sendall(data)
        except socket.timeout:
            raise NbdError("the NBD server took more than %d s to take "
                           "data" % self.timeout)
        except OSError as exc:
            raise NbdError("the NBD link failed: %s" % exc)

    def _recv(self, n):
        chunks, left = [], n
        while left:
            try:
                chunk = self.sock.recv(min(left, 1 << 20))
            except socket.timeout:
                raise NbdError("the NBD server did not answer within %d s"
                               % self.timeout)
            except OSError as exc:
                raise NbdError("the NBD link failed: %s" % exc)
            if not chunk:
                raise NbdError("the NBD server closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
