"""How zfs-ng writes text, keys and booleans into ZFS user properties,
and reads them back: one line of ``zfs -H`` output each, within the
kernel's limit on a value's length.

Kept apart from ``meta`` (which says what each property and dataset
name means) because this is about the values' encoding only: JSON with
UTF-8 characters, escapes where a reader could break a line, and a typed
error before anything too long reaches ``zfs set``.
"""

import json

from zfsng.errors import MetadataTooLarge, MetadataUnreadable
from zfsng.meta import VDI_KEYS

# The kernel refuses a user property value of ZAP_MAXVALUELEN (8192) bytes
# or more with E2BIG (dsl_props_set_check, zfs_check_userprops); libzfs
# does not check a dataset user property's value length (OpenZFS 2.1, 2.3).
MAX_VALUE = 8191


def encode_text(text):
    """text as its JSON string, non-ASCII kept as UTF-8 characters (not
    \\u escapes) so that ``zfs list -o`` shows it as the admin wrote it;
    control characters stay escaped (a value is one line of zfs -H
    output). decode_text reads both forms: what older versions wrote
    too."""
    return checked(_json(text))


# Characters some readers take for line ends (Python's splitlines): kept
# escaped, as JSON escapes the control characters, so that a value is one
# line for every reader of zfs -H output.
_LINE_ENDS = ("\x85", "\u2028", "\u2029")


def _json(value, **options):
    """value as JSON with UTF-8 characters; with escapes if it holds
    something UTF-8 cannot carry (a lone surrogate from undecodable
    input)."""
    text = json.dumps(value, ensure_ascii=False, **options)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, **options)
    for char in _LINE_ENDS:   # only inside JSON strings: escapes are valid
        text = text.replace(char, "\\u%04x" % ord(char))
    return text


def decode_text(value, default=""):
    if value is None:
        return default
    try:
        decoded = json.loads(value)
    except ValueError:
        return value  # set by hand: show it as it is
    return decoded if isinstance(decoded, str) else value


def encode_keys(keys):
    return checked(_json(keys, sort_keys=True))


def decode_keys(value, dataset="?"):
    """The keys as stored; MetadataUnreadable if the property was set by
    hand to anything but a JSON object."""
    if value is None:
        return {}
    try:
        keys = json.loads(value)
    except ValueError:
        keys = None
    if not isinstance(keys, dict):
        raise MetadataUnreadable(
            "%s: %s is not a JSON object: %r; set it to one (zfs set "
            "%s='{}' %s) or back to what it was" % (
                dataset, VDI_KEYS, value[:80], VDI_KEYS, dataset))
    return keys


def encode_bool(flag):
    return "true" if flag else "false"


def checked(value):
    """value, or MetadataTooLarge if the kernel would refuse it."""
    if len(value.encode("utf-8")) > MAX_VALUE:
        raise MetadataTooLarge(
            "metadata of %d bytes does not fit in a ZFS user property "
            "(at most %d bytes once encoded); shorten the name, description "
            "or keys" % (len(value), MAX_VALUE))
    return value
