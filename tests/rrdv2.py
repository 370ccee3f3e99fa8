"""A reader of xcp-rrdd's plugin files (protocol V2), for the tests.

Written from the format as xcp-rrdd's reader defines it (xen-api
ocaml/xcp-rrdd/lib/transport/base/rrd_protocol_v2.ml and rrd_rpc.ml),
not from zfs-ng's writer, and as strict as that reader:

  offset 0   "DATASOURCES"
         11  u32 CRC-32 over the timestamp and the values
         15  u32 CRC-32 over the metadata
         19  u32 the number of values
         23  float64 timestamp
         31  the values, 8 bytes each, float64 or int64 by value_type
    31+8n    u32 metadata length, then the metadata (JSON)

Every metadata field must be a JSON string; owner is "host", "vm <uuid>"
or "sr <uuid>"; type gauge, absolute or derive; the values follow the
metadata's names in the order the JSON object lists them.
"""

import json
import struct
import zlib

TYPES = ("gauge", "absolute", "derive")


class Invalid(Exception):
    pass


def _u32(data, offset):
    return struct.unpack_from(">I", data, offset)[0]


def _owner(text):
    words = text.lower().split(" ")
    if words == ["host"] or (len(words) == 2 and words[0] in ("vm", "sr")):
        return tuple(words)
    raise Invalid("owner %r" % text)


def _source(name, fields):
    if not all(isinstance(v, str) for v in fields.values()):
        raise Invalid("%s: a field is not a string: %r" % (name, fields))
    if fields.get("value_type") not in ("float", "int64"):
        raise Invalid("%s: value_type %r" % (name, fields.get("value_type")))
    if fields.get("type", "absolute") not in TYPES:
        raise Invalid("%s: type %r" % (name, fields["type"]))
    for bound in ("min", "max"):
        if bound in fields:
            float(fields[bound])
    return dict(fields, owner=_owner(fields.get("owner", "host")))


def read(data):
    """{"timestamp": float, "sources": {name: metadata with "value"}}."""
    if data[:11] != b"DATASOURCES":
        raise Invalid("header %r" % data[:11])
    count = _u32(data, 19)
    values = data[23:31 + 8 * count]
    if zlib.crc32(values) & 0xffffffff != _u32(data, 11):
        raise Invalid("data checksum")
    length = _u32(data, 31 + 8 * count)
    meta = data[35 + 8 * count:35 + 8 * count + length]
    if len(meta) != length or zlib.crc32(meta) & 0xffffffff != \
            _u32(data, 15):
        raise Invalid("metadata checksum")
    pairs = json.loads(meta.decode("utf-8"),
                       object_pairs_hook=list)
    (top,) = [v for k, v in pairs if k == "datasources"]
    if len(top) != count:
        raise Invalid("%d values, %d names" % (count, len(top)))
    sources = {}
    for i, (name, fields) in enumerate(top):
        fields = _source(name, dict(fields))
        raw = data[31 + 8 * i:39 + 8 * i]
        fields["value"] = struct.unpack(
            ">d" if fields["value_type"] == "float" else ">q", raw)[0]
        sources[name] = fields
    return {"timestamp": struct.unpack_from(">d", data, 23)[0],
            "sources": sources}


def read_file(path):
    with open(path, "rb") as f:
        return read(f.read())
