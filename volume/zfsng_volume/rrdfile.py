"""xcp-rrdd's plugin file (protocol V2): how an SR's figures reach the RRDs.

xcp-rrdd reads ``/dev/shm/metrics/<uid>`` of every registered plugin every
5 seconds. The file, all numbers big-endian:

  "DATASOURCES"                      11 bytes
  CRC-32 of the data                 u32   (the timestamp and the values)
  CRC-32 of the metadata             u32
  number of values                   u32
  timestamp                          float64, seconds since the epoch
  values                             one float64 each
  metadata length                    u32
  metadata                           JSON

The metadata names each value, in order:
``{"datasources": {<name>: {"description", "units", "owner", "type",
"value_type", "min", "max", "default"}}}``; the reader takes every field
as a string (a JSON number makes it refuse the whole file), and the values
come in the order of the names, which here is sorted.

What the daemon's reader demands of the file, and why it is written so:
- it maps the file once, when it registers it, so the file keeps the size
  it was made with (``create`` pads it to whole pages);
- it registers the file as soon as it appears in the directory (inotify)
  and ignores ``*.tmp`` names, so the file is made whole under a ``.tmp``
  name and renamed once;
- an update then rewrites the file in place: the values, then the header
  with the checksums last, so a read in between fails its checksum and is
  retried at the next cycle instead of taking half of an update;
- deleting the file deregisters it (xapi-storage-script's SR.detach never
  does: see srmetrics).
"""

import json
import os
import struct
import zlib

HEADER = b"DATASOURCES"
PAGE = 4096
_BODY = len(HEADER) + 8        # where the count starts: after the two CRCs


class Source(object):
    """One datasource: a float64 gauge unless said otherwise."""

    __slots__ = ("name", "description", "units", "owner", "kind", "low",
                 "high")

    def __init__(self, name, description, units, owner, kind="gauge",
                 low="0", high="inf"):
        self.name, self.description, self.units = name, description, units
        self.owner, self.kind, self.low, self.high = owner, kind, low, high

    def metadata(self):
        return {"description": self.description, "units": self.units,
                "owner": self.owner, "type": self.kind,
                "value_type": "float", "min": self.low, "max": self.high,
                "default": "true"}


def _crc(data):
    return zlib.crc32(data) & 0xffffffff


def encode(sources, values, timestamp):
    """The file's bytes for values (name -> float; a missing one is NaN,
    an unknown value for the RRD)."""
    ordered = sorted(sources, key=lambda s: s.name)
    meta = json.dumps({"datasources": dict(
        (s.name, s.metadata()) for s in ordered)}, sort_keys=True,
        separators=(",", ":")).encode("ascii")
    data = struct.pack(">d", timestamp) + b"".join(
        struct.pack(">d", float(values.get(s.name, float("nan"))))
        for s in ordered)
    return b"".join([HEADER, struct.pack(">LLL", _crc(data), _crc(meta),
                                         len(ordered)),
                     data, struct.pack(">L", len(meta)), meta])


def create(path, payload):
    """Make path hold payload, padded to whole pages, appearing whole."""
    size = -(-len(payload) // PAGE) * PAGE
    tmp = path + ".tmp"
    os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, payload + b"\0" * (size - len(payload)))
    finally:
        os.close(fd)
    os.rename(tmp, path)


def update(path, payload):
    """Rewrite path in place (the same size, the same inode the daemon
    maps): the body first, the header and its checksums last. False when
    the file is gone or too small for payload (it must be made again)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size < len(payload):
            return False
        os.pwrite(fd, payload[_BODY:], _BODY)
        os.pwrite(fd, payload[:_BODY], 0)
    finally:
        os.close(fd)
    return True
