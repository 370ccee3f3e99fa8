"""Validation of every name that reaches a command line.

Device-config values and call arguments are typed by users or sent by xapi;
before any of them is put in an argv it must pass one of these checks. They
are deliberately narrower than what ZFS accepts: nothing that starts with
``-``, no white space, no shell metacharacters, no ``..``.
"""

import os
import re

from zfsng.errors import InvalidArgument, InvalidConfiguration

UUID_RE = (r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
           r"[0-9a-f]{12}\Z")

# zpool(8): a pool name starts with a letter and holds letters, digits and
# "_-.:"; "mirror", "raidz", "draid", "spare", "log" and names starting with
# c[0-9] are reserved.
POOL_RE = r"^[A-Za-z][A-Za-z0-9_.:-]{0,199}\Z"
_RESERVED_POOL = (r"^(mirror|raidz|draid|spare|log|cache|special|"
                  r"dedup|c[0-9]).*$")

COMPONENT_RE = r"^[A-Za-z0-9_.:-]+\Z"

# ZFS refuses a dataset, snapshot or bookmark name of 256 bytes or more
# (ZFS_MAX_DATASET_NAME_LEN counts the terminating NUL).
MAX_NAME = 255

# Device paths: absolute, under /dev, made of the characters udev uses in
# by-id/by-path names.
DEVICE_RE = r"^/dev/[A-Za-z0-9_.:+@,=/-]+\Z"


def new_uuid():
    """A random (version 4) UUID as lowercase text.

    Not ``uuid.uuid4()``: on Python 3.6, XCP-ng 8.3's dom0 interpreter,
    importing ``uuid`` loads ctypes and runs ``ldconfig -p`` to look for
    libuuid, in every plugin process, whether or not it makes a UUID.
    """
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40   # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80   # RFC 4122 variant
    return _text(bytes(raw))


def name_uuid(namespace, name):
    """The name-based (version 5, SHA-1) UUID of name in namespace (a
    UUID's text), as lowercase text: what ``uuid.uuid5`` gives, without
    importing ``uuid`` (see new_uuid). hashlib is imported here, not at
    the top: only content ids need it, and on a Python built without
    OpenSSL it loads six extension modules in every plugin process."""
    import hashlib
    digest = bytearray(hashlib.sha1(
        bytes.fromhex(namespace.replace("-", "")) +
        name.encode("utf-8")).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50   # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80   # RFC 4122 variant
    return _text(bytes(digest))


def _text(raw):
    h = raw.hex()
    return "%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def is_uuid(text):
    return isinstance(text, str) and bool(re.match(UUID_RE, text))


def check_uuid(text, what="uuid", error=InvalidArgument):
    if not is_uuid(text):
        raise error("%s must be a lowercase UUID, got %r" % (what, text))
    return text


def valid_pool_name(text):
    return bool(re.match(POOL_RE, text)) and \
        not re.match(_RESERVED_POOL, text)


def check_pool_name(text, what="pool name"):
    if not valid_pool_name(text):
        raise InvalidConfiguration(
            "%s %r is not a valid pool name: use a letter first, then "
            "letters, digits, '_', '-', '.' or ':' (and not a reserved word "
            "such as mirror, raidz, log)" % (what, text))
    return text


def check_dataset_name(text, what="dataset"):
    """A filesystem path pool/a/b (no snapshots, no '..' components)."""
    parts = text.split("/") if isinstance(text, str) else []
    ok = (len(parts) >= 1 and valid_pool_name(parts[0]) and
          all(re.match(COMPONENT_RE, p) and p not in (".", "..")
              for p in parts[1:]) and len(text) <= MAX_NAME)
    if not ok:
        raise InvalidConfiguration(
            "%s %r is not a valid dataset name: use pool/path with letters, "
            "digits, '_', '-', '.' or ':' in each component" % (what, text))
    return text


def check_device_path(text, what="device"):
    if not re.match(DEVICE_RE, text) or "/../" in text + "/" or \
            text.endswith("/") or "//" in text:
        raise InvalidConfiguration(
            "%s %r is not an acceptable device path: give an absolute path "
            "under /dev such as /dev/sdb or /dev/disk/by-id/..." % (what, text))
    return text
