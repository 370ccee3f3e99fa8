"""Files zfs-ng keeps outside the pool: lock files, health records, the
datapath's per-attach state, the clean-up plans of destroyed pools.

All are small JSON documents (or empty lock files) in a directory of their
own, named from strings xapi sends. Two rules hold for every one of them,
so they live here once:
- a name maps to one file name and distinct names to distinct files
  (``file_name``: escaped, shortened with a digest when too long);
- a document is replaced whole (temporary file, fsync, rename), so a
  crash leaves the old or the new one, never half of either; a reader
  takes a missing or unreadable document for none.
"""

import errno
import json
import os

NAME_MAX = 200    # bytes of a file name (the filesystem allows 255)
SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                 "0123456789-_.")


def escape(name, safe=SAFE, upper=False):
    """Every byte of name's UTF-8 not in safe as %xx (%XX if upper): one
    file name per string, and distinct strings give distinct names."""
    form = "%%%02X" if upper else "%%%02x"
    return "".join(chr(b) if chr(b) in safe else form % b
                   for b in bytearray(name.encode("utf-8",
                                                  "surrogateescape")))


def file_name(directory, name, suffix):
    """directory's file for name: escaped, or, when that would be too
    long for a file name, its start and a digest of the whole."""
    return os.path.join(directory, fit(escape(name), name) + suffix)


def fit(safe, name):
    """safe (name escaped) if it fits NAME_MAX, else its start, '..' and
    a digest of name: distinct names keep distinct files."""
    if len(safe) <= NAME_MAX:
        return safe
    import hashlib      # here: rare, and costly to import for every call
    digest = hashlib.sha256(name.encode("utf-8", "replace")).hexdigest()
    return "%s..%s" % (safe[:NAME_MAX - 66], digest)


def write_json(path, document, durable=False):
    """Replace path's document whole. durable: also make the rename itself
    survive a power loss (fsync of the directory), for what must outlive a
    reboot."""
    directory = os.path.dirname(path)
    os.makedirs(directory, 0o700, exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:   # write() of a file object writes all
        f.write(json.dumps(document, sort_keys=True).encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    if durable:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_json(path):
    """path's document; None if there is none or it is no JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (IOError, OSError) as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    except ValueError:
        return None   # cannot happen with write_json; taken for none


def read_all_json(directory):
    """[(file name less .json, document)] of every *.json file of
    directory, in file name order."""
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in entries:
        if not name.endswith(".json"):
            continue
        try:
            document = read_json(os.path.join(directory, name))
        except (IOError, OSError):
            continue
        if document is not None:
            found.append((name[:-len(".json")], document))
    return found


def remove(path):
    """Remove path; gone already is fine."""
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
