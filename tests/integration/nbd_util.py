"""An NBD server and Xen Orchestra's NBD client, for the guest tests.

XO reads the changed blocks of a VDI snapshot over NBD: xapi plugs a
read-only VBD of the VDI into dom0 and its NBD server serves that block
device, over TLS; XO reads it with its own client, @vates/nbd-client. The
tests play both ends with real programs rather than a model of them:

- serve(device) runs qemu-nbd on the device, read-only, over TLS by
  default (certificates made with openssl for the one server);
- read_blocks(server, backup, blocks) runs XO's client under node
  (tests/guest/nbd/read-blocks.mjs) and writes the blocks read into a
  backup file at their own offsets, as a delta backup does.

The client and its dependencies are in the guest image, in /opt/zfsng-nbd
(tests/guest/blktap-image.sh); ZFSNG_NBD_MODULES names another
node_modules, to run these helpers elsewhere.
"""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

READ_BLOCKS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "..", "guest", "nbd", "read-blocks.mjs")
NODE_MODULES = os.environ.get("ZFSNG_NBD_MODULES",
                              "/opt/zfsng-nbd/node_modules")
BLOCK_SIZE = 64 * 1024      # XO's NBD block, and CBT's granularity
ADDRESS = "127.0.0.1"


class NbdError(Exception):
    """The server did not start, or the client failed (its stderr)."""


class Server(object):
    """A running qemu-nbd: where to connect, and the certificate XO would
    be given (None for a plain TCP server)."""

    def __init__(self, device, address, port, export, cert, process):
        self.device = device
        self.address = address
        self.port = port
        self.export = export
        self.cert = cert
        self.process = process

    def __repr__(self):
        return "<nbd %s:%d/%s %s%s>" % (self.address, self.port, self.export,
                                        self.device,
                                        " tls" if self.cert else "")


def _run(argv, timeout):
    proc = subprocess.run(argv, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout,
                          universal_newlines=True)
    if proc.returncode != 0:
        raise NbdError("%s exited %d: %s" % (" ".join(argv), proc.returncode,
                                             proc.stderr.strip()))
    return proc.stdout


def _certificates(directory):
    """A CA and a server certificate signed by it, in the file names
    qemu's tls-creds-x509 reads from its dir. Two certificates, not one
    self-signed: qemu (GnuTLS) refuses a server certificate that is also a
    CA. Returns the server certificate's path: what xapi hands XO is its
    host certificate, which XO passes to the client as ``cert``."""
    def path(name):
        return os.path.join(directory, name)
    _run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
          "ec_paramgen_curve:prime256v1", "-nodes",
          "-keyout", path("ca-key.pem"), "-out", path("ca-cert.pem"),
          "-days", "2", "-subj", "/CN=zfsng test CA"], 60)
    _run(["openssl", "req", "-newkey", "ec", "-pkeyopt",
          "ec_paramgen_curve:prime256v1", "-nodes",
          "-keyout", path("server-key.pem"), "-out", path("server.csr"),
          "-subj", "/CN=" + ADDRESS], 60)
    with open(path("server.ext"), "w") as f:
        f.write("basicConstraints=CA:FALSE\n"
                "keyUsage=digitalSignature\n"
                "extendedKeyUsage=serverAuth\n"
                "subjectAltName=IP:%s\n" % ADDRESS)
    _run(["openssl", "x509", "-req", "-in", path("server.csr"),
          "-CA", path("ca-cert.pem"), "-CAkey", path("ca-key.pem"),
          "-CAcreateserial", "-days", "2", "-extfile", path("server.ext"),
          "-out", path("server-cert.pem")], 60)
    return path("server-cert.pem")


def _free_port():
    """A port nobody listens on now (qemu-nbd may still lose it to
    someone else before it binds: serve() then tries another)."""
    s = socket.socket()
    try:
        s.bind((ADDRESS, 0))
        return s.getsockname()[1]
    finally:
        s.close()


def _loopback_up():
    """Bring up lo if it is down: the guest's init (no systemd, no network
    configuration) leaves it down, and then nothing connects to 127.0.0.1
    (ENETUNREACH). The image has busybox's ip if not iproute2's."""
    with open("/sys/class/net/lo/flags") as f:
        if int(f.read(), 16) & 1:      # IFF_UP
            return
    ip = ["ip"] if shutil.which("ip") else ["busybox", "ip"]
    _run(ip + ["link", "set", "lo", "up"], 30)


def _greeting(port):
    """Why no NBD server answers on the port, or None if one does: its
    greeting starts with NBDMAGIC (a bare accept could still be someone
    else's listener)."""
    try:
        with contextlib.closing(socket.create_connection((ADDRESS, port),
                                                         timeout=2)) as s:
            data = b""
            while len(data) < 8:
                chunk = s.recv(8 - len(data))
                if not chunk:
                    break
                data += chunk
    except (OSError, socket.timeout) as e:
        return str(e) or type(e).__name__
    return None if data == b"NBDMAGIC" else "greeting %r" % data


def answers(port):
    """Whether an NBD server answers on the port (see _greeting)."""
    return _greeting(port) is None


def _stop(process):
    """End qemu-nbd and reap it: no process outlives the test."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def serve(device, tls=True, export="vdi", timeout=120):
    """Serve a block device read-only over NBD, as xapi's NBD server serves
    a snapshot's VBD to XO; TLS by default, as xapi's is (tls=False: plain
    TCP, which is what a TLS-less client or qemu-io talks).

    Yields a Server once qemu-nbd answers with its greeting (within
    timeout seconds, else NbdError with qemu-nbd's own words); qemu-nbd is
    stopped and reaped on the way out, however the block ends.

    --persistent --shared=4: one server for several client connections in
    turn and at once (XO reconnects; a test reads several times). The
    server listens on 127.0.0.1 only, on a free port; lo is brought up
    first if it is down, as in the test guest."""
    _loopback_up()
    tmp = tempfile.mkdtemp(prefix="zfsng-nbd-serve.")
    process = None
    try:
        cert, tls_args = None, []
        if tls:
            creds = os.path.join(tmp, "tls")
            os.mkdir(creds, 0o700)
            cert = _certificates(creds)
            tls_args = ["--object", "tls-creds-x509,id=tls0,endpoint=server,"
                        "dir=%s,verify-peer=off" % creds, "--tls-creds", "tls0"]
        log_path = os.path.join(tmp, "qemu-nbd.log")
        for _attempt in range(3):
            port = _free_port()
            with open(log_path, "w") as log:
                process = subprocess.Popen(
                    ["qemu-nbd", "--read-only", "--format=raw",
                     "--bind=" + ADDRESS, "--port=%d" % port,
                     "--export-name=" + export, "--persistent", "--shared=4"]
                    + tls_args + [device],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            deadline = time.monotonic() + timeout
            why_not = "not tried"
            while why_not and process.poll() is None \
                    and time.monotonic() < deadline:
                why_not = _greeting(port)
                if why_not:
                    time.sleep(0.1)
            if not why_not:
                break
            exited = process.poll()
            _stop(process)
            with open(log_path) as log:
                said = log.read().strip()
            if "Address already in use" not in said:
                why = ("did not answer within %ds (%s)" % (timeout, why_not)
                       if exited is None else "exited %d" % exited)
                raise NbdError("qemu-nbd on %s %s: %s" % (device, why, said))
        else:
            raise NbdError("qemu-nbd found no free port: %s" % said)
        yield Server(device, ADDRESS, port, export, cert, process)
    finally:
        if process is not None:
            _stop(process)
        shutil.rmtree(tmp, ignore_errors=True)


def read_blocks(server, backup_path, blocks, size=None,
                block_size=BLOCK_SIZE, timeout=600):
    """Read blocks of the server's export with XO's NBD client and write
    each at index * block_size into backup_path (created if missing, not
    truncated; with size, first truncated or extended to exactly size).

    blocks: block indexes (ints), or "all" for every block of the export,
    the last one short if the export's size is not a multiple of
    block_size. Returns read-blocks.mjs's result, {"blocks": n, "bytes":
    bytes read}; raises NbdError with the client's stderr if it fails or
    outlives timeout seconds.

    node resolves the client's ES modules from the script's own directory
    (ES modules ignore NODE_PATH), so it runs a copy of read-blocks.mjs
    beside a link to the image's node_modules; /src, where the script is,
    is read-only and has no node_modules."""
    tmp = tempfile.mkdtemp(prefix="zfsng-nbd-read.")
    try:
        script = os.path.join(tmp, "read-blocks.mjs")
        shutil.copyfile(READ_BLOCKS, script)
        os.symlink(NODE_MODULES, os.path.join(tmp, "node_modules"))
        blocks_path = os.path.join(tmp, "blocks")
        with open(blocks_path, "w") as f:
            if blocks == "all":
                f.write("all\n")
            else:
                f.write("".join("%d\n" % int(i) for i in blocks))
        argv = ["node", script, "--address", server.address,
                "--port", str(server.port), "--export", server.export,
                "--backup", backup_path, "--blocks", blocks_path,
                "--block-size", str(block_size)]
        if size is not None:
            argv += ["--size", str(size)]
        if server.cert:
            argv += ["--cert", server.cert]
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=timeout,
                                  universal_newlines=True)
        except subprocess.TimeoutExpired as e:
            said = e.stderr or b""
            if isinstance(said, bytes):
                said = said.decode("utf-8", "replace")
            raise NbdError("read-blocks.mjs timed out after %ds: %s"
                           % (timeout, said.strip()))
        if proc.returncode != 0:
            raise NbdError("read-blocks.mjs exited %d: %s"
                           % (proc.returncode, proc.stderr.strip()))
        lines = proc.stdout.strip().splitlines()
        if not lines:
            raise NbdError("read-blocks.mjs printed nothing: %s"
                           % proc.stderr.strip())
        return json.loads(lines[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
