"""The SMAPIv5 wire protocol, as xapi-storage-script speaks it.

xapi-storage-script runs ``<dir>/<Interface.method> --json`` with the JSON
object of named arguments on stdin. Success is exit 0 with exactly the JSON
result on stdout (``null`` for unit); failure is a non-zero exit with
``{"code", "params", "backtrace"}`` on stdout. The generated Python bindings
are not on PyPI and change between releases, so zfs-ng carries this one
small module instead: the types of every v5 method it can be asked for, a
checker for them, the registry that ties each method to its function and
the dispatcher.

Arguments are checked before a handler runs, and results before they are
printed: a bug then fails the call cleanly instead of handing xapi a value
that breaks its unmarshalling (for instance ``"uuid": null``).

stdin and stdout are UTF-8 bytes, whatever the locale (see ``_write``).
"""

import json
import os
import sys

from zfsng import errors, log, runner


# --- types ------------------------------------------------------------------

class Type(object):
    """A v5 type: ``check(value, where)`` raises TypeError on mismatch."""

    def check(self, value, where):
        raise NotImplementedError


class Prim(Type):
    def __init__(self, name, pytypes):
        self.name, self.pytypes = name, pytypes

    def check(self, value, where):
        # bool is an int in Python; JSON true is never an int64 here.
        if isinstance(value, bool) and bool not in self.pytypes:
            raise TypeError("%s: expected %s, got a boolean" % (where,
                                                                self.name))
        if not isinstance(value, self.pytypes):
            raise TypeError("%s: expected %s, got %s" % (
                where, self.name, type(value).__name__))


INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1


class Int64(Prim):
    """OCaml's int64: xapi cannot unmarshal a number outside its range (a
    volume of 2^63 bytes made every later SR.ls of its SR fail in xapi)."""

    def check(self, value, where):
        Prim.check(self, value, where)
        if not INT64_MIN <= value <= INT64_MAX:
            raise TypeError("%s: %d is outside int64's range" % (where,
                                                                 value))


class LongString(object):
    """A string result too long to build whole: list_changed_blocks' bitmap
    is 44 MB of base64 on a 16 TiB disk. ``pieces()`` yields it as bytes
    that need no JSON escaping (base64's alphabet); the writer (``dump``)
    streams them, and the checker takes it for a string. Its pieces are
    made from values already computed: nothing in them can fail half-way
    through the answer."""

    def __init__(self, pieces):
        self.pieces = pieces


STR = Prim("string", (str,))
LONG_STR = Prim("string", (str, LongString))
BOOL = Prim("bool", (bool,))
FLOAT = Prim("float", (float,))
INT = Int64("int64", (int,))
UNIT = Prim("unit (null)", (type(None),))


class ListOf(Type):
    def __init__(self, item):
        self.item = item

    def check(self, value, where):
        if not isinstance(value, list):
            raise TypeError("%s: expected a list" % where)
        for i, item in enumerate(value):
            self.item.check(item, "%s[%d]" % (where, i))


class StrMap(Type):
    """OCaml's (string * string) list: a JSON object of strings."""

    def check(self, value, where):
        if not isinstance(value, dict):
            raise TypeError("%s: expected an object of strings" % where)
        for key, item in value.items():
            STR.check(item, "%s[%r]" % (where, key))


class Record(Type):
    """Fields: name -> type; names in ``optional`` may be left out (never
    null: the daemon's unmarshaller rejects null for an option)."""

    def __init__(self, fields, optional=()):
        self.fields, self.optional = fields, frozenset(optional)

    def check(self, value, where):
        if not isinstance(value, dict):
            raise TypeError("%s: expected an object" % where)
        for name, ftype in self.fields.items():
            if name not in value:
                if name in self.optional:
                    continue
                raise TypeError("%s: missing field %r" % (where, name))
            ftype.check(value[name], "%s.%s" % (where, name))
        extra = set(value) - set(self.fields)
        if extra:
            raise TypeError("%s: unknown fields %s" % (where, sorted(extra)))


class Variant(Type):
    """``["Tag", arg]``; cases: tag -> arg type."""

    def __init__(self, cases):
        self.cases = cases

    def check(self, value, where):
        if not (isinstance(value, list) and len(value) == 2 and
                value[0] in self.cases):
            raise TypeError("%s: expected one of %s as [tag, arg]" % (
                where, sorted(self.cases)))
        self.cases[value[0]].check(value[1], "%s(%s)" % (where, value[0]))


class OneOf(Type):
    """A string from a fixed set (an OCaml enum encoded as its name)."""

    def __init__(self, names):
        self.names = names

    def check(self, value, where):
        if value not in self.names:
            raise TypeError("%s: expected one of %s" % (where, self.names))


STRMAP = StrMap()

QUERY_RESULT = Record({
    "plugin": STR, "name": STR, "description": STR, "vendor": STR,
    "copyright": STR, "version": STR, "required_api_version": STR,
    "features": ListOf(STR), "configuration": STRMAP,
    "required_cluster_stack": ListOf(STR),
    "supported_image_formats": ListOf(STR)},
    optional=["supported_image_formats"])

HEALTH = Variant({"Healthy": STR, "Recovering": STR, "Unreachable": STR,
                  "Unavailable": STR})

SR_STAT = Record({
    "sr": STR, "name": STR, "uuid": STR, "description": STR,
    "free_space": INT, "total_space": INT, "datasources": ListOf(STR),
    "clustered": BOOL, "health": HEALTH}, optional=["uuid"])

PROBE_RESULT = Record({"configuration": STRMAP, "complete": BOOL,
                       "sr": SR_STAT, "extra_info": STRMAP},
                      optional=["sr"])

VOLUME = Record({
    "key": STR, "uuid": STR, "name": STR, "description": STR,
    "read_write": BOOL, "sharable": BOOL, "virtual_size": INT,
    "physical_utilisation": INT, "uri": ListOf(STR), "keys": STRMAP,
    "volume_type": OneOf(["Data", "CBT_Metadata", "Data_and_CBT_Metadata"]),
    "cbt_enabled": BOOL}, optional=["uuid", "volume_type", "cbt_enabled"])

IMPLEMENTATION = Variant({
    "XenDisk": Record({"params": STR, "extra": STRMAP, "backend_type": STR}),
    "BlockDevice": Record({"path": STR}),
    "File": Record({"path": STR}),
    "Nbd": Record({"uri": STR})})

ATTACH_RESULT = Record({"implementations": ListOf(IMPLEMENTATION)})

# Data.*: a long-running operation, and what Data.stat says of it
OPERATION = Variant({"CopyV1": STR, "MirrorV1": STR})
OPERATION_STATUS = Record({"failed": BOOL, "complete": BOOL,
                           "progress": FLOAT}, optional=["progress"])

_SR = [("sr", STR)]
_KEY = _SR + [("key", STR)]

# method -> (arguments after dbg, result type)
METHODS = {
    "Plugin.Query": ([], QUERY_RESULT),
    "Plugin.diagnostics": ([], STR),
    "Plugin.ls": ([], ListOf(STR)),
    "SR.probe": ([("configuration", STRMAP)], ListOf(PROBE_RESULT)),
    "SR.create": ([("uuid", STR), ("configuration", STRMAP), ("name", STR),
                   ("description", STR)], STRMAP),
    "SR.attach": ([("configuration", STRMAP)], STR),
    "SR.detach": (_SR, UNIT),
    "SR.destroy": (_SR, UNIT),
    "SR.stat": (_SR, SR_STAT),
    "SR.set_name": (_SR + [("new_name", STR)], UNIT),
    "SR.set_description": (_SR + [("new_description", STR)], UNIT),
    "SR.ls": (_SR, ListOf(VOLUME)),
    "Volume.create": (_SR + [("name", STR), ("description", STR),
                             ("size", INT), ("sharable", BOOL)], VOLUME),
    "Volume.snapshot": (_KEY, VOLUME),
    "Volume.clone": (_KEY, VOLUME),
    "Volume.destroy": (_KEY, UNIT),
    "Volume.set_name": (_KEY + [("new_name", STR)], UNIT),
    "Volume.set_description": (_KEY + [("new_description", STR)], UNIT),
    "Volume.set": (_KEY + [("k", STR), ("v", STR)], UNIT),
    "Volume.unset": (_KEY + [("k", STR)], UNIT),
    "Volume.resize": (_KEY + [("new_size", INT)], UNIT),
    "Volume.stat": (_KEY, VOLUME),
    "Volume.compare": (_KEY + [("key2", STR)],
                       Record({"blocksize": INT,
                               "ranges": ListOf(ListOf(INT))})),
    "Volume.enable_cbt": (_KEY, UNIT),
    "Volume.disable_cbt": (_KEY, UNIT),
    "Volume.data_destroy": (_KEY, UNIT),
    "Volume.list_changed_blocks": (
        _KEY + [("key2", STR), ("offset", INT), ("length", INT)],
        Record({"granularity": INT, "bitmap": LONG_STR})),
    "Volume.compose": (_KEY + [("key2", STR)], UNIT),
    "Volume.revert": (_SR + [("snapshot", STR), ("key", STR)], UNIT),
    "Datapath.open": ([("uri", STR), ("persistent", BOOL)], UNIT),
    "Datapath.attach": ([("uri", STR), ("domain", STR)], ATTACH_RESULT),
    "Datapath.activate": ([("uri", STR), ("domain", STR)], UNIT),
    "Datapath.activate_readonly": ([("uri", STR), ("domain", STR)], UNIT),
    "Datapath.deactivate": ([("uri", STR), ("domain", STR)], UNIT),
    "Datapath.detach": ([("uri", STR), ("domain", STR)], UNIT),
    "Datapath.close": ([("uri", STR)], UNIT),
    # a unix socket path that takes an NBD connection's fd (SCM_RIGHTS)
    "Datapath.import_activate": ([("uri", STR), ("domain", STR)], STR),
    "Data.mirror": ([("uri", STR), ("domain", STR), ("remote", STR)],
                    OPERATION),
    "Data.stat": ([("operation", OPERATION)], OPERATION_STATUS),
}

VOLUME_INTERFACES = ("Plugin", "SR", "Volume")
DATAPATH_INTERFACES = ("Plugin", "Datapath", "Data")


def methods_of(interfaces):
    return sorted(m for m in METHODS if m.split(".")[0] in interfaces)


# --- what each plugin serves ----------------------------------------------------
#
# METHODS is the one list of SMAPIv3 methods: the types above, the dispatch
# (functions registered with @method) and the installed executables
# (`make install` makes one symlink per name in SERVED) all follow from it.

# The Python package that implements each plugin -> the methods it serves,
# one executable each. Of the Plugin interface the datapath plugin serves
# Plugin.Query only: it is all xapi-storage-script asks a datapath plugin.
SERVED = {
    "zfsng_volume": methods_of(VOLUME_INTERFACES),
    "zfsng_datapath": ["Plugin.Query"] + methods_of(("Datapath", "Data")),
}

# Served (installed) but deliberately without an implementation: they answer
# the typed Unimplemented error (README: compare).
# Listed so that a unit test can tell these from a forgotten handler.
UNIMPLEMENTED = frozenset([
    "Volume.compare",
])

# (package, method) -> the function that implements it; filled at import.
_IMPLEMENTATIONS = {}


def method(name):
    """Decorator: the function implements SMAPIv3 method ``name`` for the
    plugin of its package (zfsng_volume or zfsng_datapath: both serve Plugin.Query,
    each its own). Next to the function, so that the name and its code
    cannot drift apart; a name not in METHODS, or a second function for the
    same method, fails at import time (a typo never ships silently)."""
    if name not in METHODS:
        raise ValueError("@wire.method(%r): not a declared method" % name)

    def register(function):
        key = (function.__module__.split(".")[0], name)
        other = _IMPLEMENTATIONS.get(key)
        if other is not None:
            raise ValueError("%s: registered twice in %s (%s.%s and %s.%s)" % (
                name, key[0], other.__module__, other.__name__,
                function.__module__, function.__name__))
        _IMPLEMENTATIONS[key] = function
        return function
    return register


def handlers(package):
    """The dispatch table (method -> function) of the plugin implemented by
    ``package``: what its modules, once imported, registered with @method."""
    return {name: function
            for (owner, name), function in _IMPLEMENTATIONS.items()
            if owner == package}


def load_handlers(package, modules, method):
    """The dispatch table of package once the module that implements
    method is imported: modules maps each of package's modules to the
    methods it implements (its entry point's table). A method in none
    (one of UNIMPLEMENTED) loads nothing."""
    for module, names in modules.items():
        if method in names:
            __import__(package + "." + module)
    return handlers(package)


def resolve_method(name, interfaces):
    """The canonical method for an executable name (lookup ignores case)."""
    for method in methods_of(interfaces):
        if method.lower() == name.lower():
            return method
    return None


# --- calls ------------------------------------------------------------------

def check_arguments(method, args):
    """Return the handler's keyword arguments, or raise InvalidArgument."""
    if not isinstance(args, dict):
        raise errors.InvalidArgument("%s: arguments must be a JSON object"
                                     % method)
    spec, _ = METHODS[method]
    kwargs = {}
    for name, atype in [("dbg", STR)] + spec:
        if name not in args:
            raise errors.InvalidArgument("%s: missing argument %r"
                                         % (method, name))
        try:
            atype.check(args[name], name)
        except TypeError as exc:
            raise errors.InvalidArgument("%s: %s" % (method, exc))
        kwargs[name] = args[name]
    extra = sorted(set(args) - set(kwargs))
    if extra:  # a newer xapi may send more; tolerate, but say so in SMlog
        log.info("ignoring unknown arguments %s", extra)
    return kwargs


def call(method, args, handlers):
    """Check, run and check again: returns the result or raises."""
    kwargs = check_arguments(method, args)
    log.set_dbg(kwargs["dbg"])
    handler = handlers.get(method)
    if handler is None:
        raise errors.Unimplemented(method)
    result = handler(**kwargs)
    try:
        METHODS[method][1].check(result, "result")
    except TypeError as exc:
        raise errors.InternalError("%s returned a malformed result: %s"
                                   % (method, exc))
    return result


def error_object(exc, tb_text=""):
    return {"code": exc.code, "params": [str(p) for p in exc.params()],
            "backtrace": {"error": tb_text or exc.message, "files": [],
                          "lines": []}}


# The wire is UTF-8 whatever the locale. xapi-storage-script writes
# non-ASCII as UTF-8 bytes (rpclib's Yojson escapes only control characters)
# and reads UTF-8 back. Python's text streams follow the locale instead:
# Python 3.6 in the C locale (dom0's daemon environment; 3.7+ coerce it to
# UTF-8) reads stdin as ASCII, and "Données" would arrive as surrogate
# escapes and be stored that way. So stdin and stdout are read and written
# as bytes (their text layer only where a test put a stream without one).

def dump(obj):
    """Yield the JSON text of obj, then a newline, as UTF-8 bytes pieces.
    A LongString value of a top-level object goes piece by piece."""
    if not (isinstance(obj, dict) and
            any(isinstance(v, LongString) for v in obj.values())):
        yield _utf8(obj) + b"\n"
        return
    yield b"{"
    for i, (name, value) in enumerate(obj.items()):
        yield (b", " if i else b"") + _utf8(name) + b": "
        if isinstance(value, LongString):
            yield b'"'
            for piece in value.pieces():
                yield piece
            yield b'"'
        else:
            yield _utf8(value)
    yield b"}\n"


def _utf8(obj):
    # "replace": a lone surrogate cannot be UTF-8; xapi must never get
    # bytes it cannot decode (nothing decoded strictly yields one)
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "replace")


def _write(obj):
    out = getattr(sys.stdout, "buffer", None)
    if out is None:
        sys.stdout.write(b"".join(dump(obj)).decode("utf-8"))
    else:
        sys.stdout.flush()   # anything already in the text layer goes first
        for piece in dump(obj):
            out.write(piece)
    sys.stdout.flush()


def _read_args():
    data = getattr(sys.stdin, "buffer", sys.stdin).read()
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise errors.InvalidArgument("stdin is not valid UTF-8: %s"
                                         % exc)
    try:
        return json.loads(data)
    except ValueError as exc:
        raise errors.InvalidArgument("stdin is not valid JSON: %s" % exc)


def main(argv, interfaces, handlers):
    """Entry point of every method executable; returns the exit status.
    handlers: the dispatch table, or a function of the method that
    returns it (the entry points load only the called method's module)."""
    runner.start_call()   # the call's deadline: see runner
    name = os.path.basename(argv[0])
    method = resolve_method(name, interfaces)
    log.setup(method or name)
    if method is None:
        sys.stderr.write("zfs-ng: %r is not a method of %s\n"
                         % (name, "/".join(interfaces)))
        return 2
    if argv[1:] != ["--json"]:
        sys.stderr.write("usage: %s --json < arguments.json\n"
                         "  (the JSON object of %s's named arguments)\n"
                         % (name, method))
        return 2
    try:
        table = handlers(method) if callable(handlers) else handlers
        result = call(method, _read_args(), table)
    except errors.StorageError as exc:
        log.error("%s failed: %s %s", method, exc.code, exc.params())
        _write(error_object(exc))
        return 1
    except Exception as exc:  # a bug: never a traceback on stdout
        import traceback   # only here: a bug is rare, start-up is not
        tb_text = traceback.format_exc()
        log.error("%s crashed: %s", method, tb_text)
        _write(error_object(errors.InternalError(
            "%s: %s" % (type(exc).__name__, exc)), tb_text))
        return 1
    _write(result)
    return 0
