"""What a storage migration's tests and benchmark both play: xapi's
one-shot NBD proxy, and a guest writing through its tapdev meanwhile."""

import hashlib
import mmap
import os
import random
import socket
import threading
import time

BLOCK = 64 * 1024


class Proxy(threading.Thread):
    """xapi's export_nbd_proxy once connected (storage_smapiv3_migrate.ml:
    one accept, then the listening socket closed): bytes both ways to
    upstream until either side closes. It can cut the link, after
    cut_after bytes towards the destination or when cut is set."""

    def __init__(self, path, upstream, cut_after=None):
        threading.Thread.__init__(self, daemon=True)
        self.upstream, self.cut_after = upstream, cut_after
        self.cut = threading.Event()
        self.sent, self.error = 0, None
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.path = path
        self.ends = ()
        self.start()

    def run(self):
        conn, _ = self.listener.accept()
        self.listener.close()
        os.unlink(self.path)
        out = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ends = (conn, out)
        try:
            out.connect(self.upstream)
        except OSError as exc:
            self.error = exc          # the source sees the link go
            self.close()
            return
        threads = [threading.Thread(target=self.pipe, args=(conn, out, True)),
                   threading.Thread(target=self.pipe, args=(out, conn, False))]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            if self.cut.wait(0.2):
                self.close()
            for t in threads:
                t.join(0.01)

    def pipe(self, a, b, towards):
        try:
            while True:
                data = a.recv(1 << 16)
                if not data:
                    break
                if towards:
                    self.sent += len(data)
                    if self.cut_after is not None and \
                            self.sent > self.cut_after:
                        break
                b.sendall(data)
        except OSError:
            pass
        self.close()

    def close(self):
        for s in self.ends:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Writer(threading.Thread):
    """A guest writing through its tapdev with O_DIRECT until stopped:
    BLOCK-sized writes at random places of the first ``size`` bytes,
    random data or (one in five) zeros over data, one every ``interval``
    seconds. Keeps the count, the bytes and the slowest write (a pause
    of the guest's disk shows there).

    mixed: as guests write, not as a benchmark does: each write is 512
    bytes, 4 KiB or BLOCK (a sector, a page, a large write), aligned to
    its size, and every FLUSH_EVERY writes the guest flushes (fdatasync:
    the block layer's flush, which tapdisk takes as a barrier). Two mixed
    writers on one disk overlap each other's writes, in flight at once."""

    SIZES = (512, 4096, BLOCK)
    FLUSH_EVERY = 16

    def __init__(self, tapdev, seed, size, interval=0.005, mixed=False):
        threading.Thread.__init__(self, daemon=True)
        self.tapdev, self.rnd = tapdev, random.Random(seed)
        self.size, self.interval, self.mixed = size, interval, mixed
        self.stop = threading.Event()
        self.count, self.error, self.slowest = 0, None, 0.0
        self.bytes, self.flushes = 0, 0

    @property
    def written(self):
        return self.bytes

    def run(self):
        buf = mmap.mmap(-1, BLOCK)
        fd = os.open(self.tapdev, os.O_WRONLY | os.O_DIRECT)
        try:
            while not self.stop.is_set():
                self._write(fd, buf)
                if self.mixed and self.count % self.FLUSH_EVERY == 0:
                    os.fdatasync(fd)
                    self.flushes += 1
                if self.interval:
                    self.stop.wait(self.interval)
        except OSError as exc:
            self.error = exc
        finally:
            os.close(fd)

    def _write(self, fd, buf):
        size = self.rnd.choice(self.SIZES) if self.mixed else BLOCK
        buf.seek(0)
        buf.write(bytes(size) if self.rnd.random() < 0.2 else
                  self.rnd.getrandbits(8 * size).to_bytes(size, "little"))
        at = self.rnd.randrange(self.size // size) * size
        started = time.monotonic()
        os.pwrite(fd, memoryview(buf)[:size], at)
        self.slowest = max(self.slowest, time.monotonic() - started)
        self.count += 1
        self.bytes += size


def whole_hash(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
