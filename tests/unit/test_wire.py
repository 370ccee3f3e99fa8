"""zfsng.wire: the v5 wire protocol as xapi-storage-script speaks it.

``wire.main`` is run as the daemon runs an executable: argv[0] is the
method's file name, ``--json`` the only argument, the JSON object of named
arguments on stdin; stdout must hold exactly one JSON value.
"""

import io
import json
import sys

import pytest

from zfsng import errors, wire
from zfsng_volume import main as mainmod, plugin

from conftest import SR_UUID, handlers

PLUGIN_DIR = "/usr/libexec/xapi-storage-script/volume/" \
    "org.xen.xapi.storage.zfs-ng/"

SR_STAT = {"sr": "tank", "uuid": SR_UUID, "name": "n", "description": "d",
           "free_space": 1, "total_space": 2, "datasources": [],
           "clustered": False, "health": ["Healthy", ""]}


class Recorder(object):
    """A handler that remembers its calls and returns a fixed value."""

    def __init__(self, result=None, exc=None):
        self.result, self.exc, self.calls = result, exc, []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        if self.exc is not None:
            raise self.exc
        return self.result


def run(monkeypatch, capsys, argv, payload, table=None,
        interfaces=wire.VOLUME_INTERFACES):
    """(exit status, stdout, stderr) of wire.main."""
    text = payload if isinstance(payload, str) else json.dumps(payload)
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    rc = wire.main(argv, interfaces, handlers() if table is None else table)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def error_of(out):
    """The error object on stdout, checked for the exact v5 shape."""
    assert out.endswith("\n") and out.count("\n") == 1, out
    obj = json.loads(out)
    assert sorted(obj) == ["backtrace", "code", "params"]
    assert isinstance(obj["code"], str)
    assert isinstance(obj["params"], list)
    assert all(isinstance(p, str) for p in obj["params"])
    assert sorted(obj["backtrace"]) == ["error", "files", "lines"]
    assert isinstance(obj["backtrace"]["error"], str)
    assert obj["backtrace"]["files"] == []
    assert obj["backtrace"]["lines"] == []
    return obj


# --- invocation --------------------------------------------------------------

def test_query_prints_exactly_its_json_result(monkeypatch, capsys):
    argv = [PLUGIN_DIR + "Plugin.Query", "--json"]
    rc, out, _ = run(monkeypatch, capsys, argv, {"dbg": "x"})
    assert rc == 0
    assert out.endswith("\n") and out.count("\n") == 1
    assert json.loads(out) == plugin.query("x")


def test_unit_result_prints_null(monkeypatch, capsys):
    table = {"SR.detach": Recorder(None)}
    rc, out, _ = run(monkeypatch, capsys, ["SR.detach", "--json"],
                     {"dbg": "x", "sr": "tank"}, table)
    assert (rc, out) == (0, "null\n")
    assert table["SR.detach"].calls == [{"dbg": "x", "sr": "tank"}]


def test_volume_main_entry_point(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"dbg": "d"}'))
    rc = mainmod.volume_main(["Plugin.Query", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["plugin"] == "zfs-ng"


@pytest.mark.parametrize("argv", [
    ["SR.stat"],
    ["SR.stat", "--json", "--verbose"],
    ["SR.stat", "--jsn"],
    ["SR.stat", "json"],
])
def test_json_flag_is_required(monkeypatch, capsys, argv):
    table = {"SR.stat": Recorder(SR_STAT)}
    rc, out, err = run(monkeypatch, capsys, argv,
                       {"dbg": "x", "sr": "tank"}, table)
    assert rc == 2
    assert out == ""
    assert "--json" in err
    assert table["SR.stat"].calls == []


@pytest.mark.parametrize("name", [
    "SR.frobnicate", "Volume", "SR.", "stat", "Datapath.attach",
    "Datapath.activate", "Plugin.Query.extra", "",
])
def test_unknown_method_names_are_refused(monkeypatch, capsys, name):
    rc, out, err = run(monkeypatch, capsys, [PLUGIN_DIR + name, "--json"],
                       {"dbg": "x"}, {})
    assert rc == 2
    assert out == ""
    assert "not a method" in err


@pytest.mark.parametrize("name,method", [
    ("sr.stat", "SR.stat"), ("SR.STAT", "SR.stat"),
    ("plugin.query", "Plugin.Query"), ("PLUGIN.QUERY", "Plugin.Query"),
    ("volume.set_description", "Volume.set_description"),
    ("Volume.List_Changed_Blocks", "Volume.list_changed_blocks"),
])
def test_method_lookup_ignores_case(name, method):
    assert wire.resolve_method(name, wire.VOLUME_INTERFACES) == method


def test_case_insensitive_lookup_runs_the_handler(monkeypatch, capsys):
    table = {"SR.stat": Recorder(SR_STAT)}
    rc, out, _ = run(monkeypatch, capsys, [PLUGIN_DIR + "sr.STAT", "--json"],
                     {"dbg": "x", "sr": "tank"}, table)
    assert rc == 0
    assert json.loads(out) == SR_STAT
    assert table["SR.stat"].calls == [{"dbg": "x", "sr": "tank"}]


def test_datapath_methods_are_not_volume_methods():
    methods = wire.methods_of(wire.VOLUME_INTERFACES)
    assert "SR.create" in methods and "Volume.create" in methods
    assert "Plugin.Query" in methods
    assert not [m for m in methods if m.startswith("Datapath.")]
    assert "Datapath.attach" in wire.methods_of(wire.DATAPATH_INTERFACES)
    assert wire.resolve_method("Datapath.attach",
                               wire.VOLUME_INTERFACES) is None


def test_every_handler_is_a_v5_method():
    for method in handlers():
        assert method in wire.METHODS, method
        assert method.split(".")[0] in wire.VOLUME_INTERFACES


# --- arguments ---------------------------------------------------------------

BAD_ARGUMENTS = [
    ("SR.stat", {"sr": "tank"}, "dbg"),
    ("SR.stat", {"dbg": "x"}, "sr"),
    ("SR.stat", {"dbg": 1, "sr": "tank"}, "dbg"),
    ("SR.stat", {"dbg": "x", "sr": None}, "sr"),
    ("SR.stat", {"dbg": "x", "sr": ["tank"]}, "sr"),
    ("SR.stat", {"dbg": "x", "sr": 7}, "sr"),
    ("SR.attach", {"dbg": "x", "configuration": {"device": 1}},
     "configuration"),
    ("SR.attach", {"dbg": "x", "configuration": {"device": None}},
     "configuration"),
    ("SR.attach", {"dbg": "x", "configuration": [["device", "/dev/sdb"]]},
     "configuration"),
    ("SR.attach", {"dbg": "x", "configuration": "device=/dev/sdb"},
     "configuration"),
    ("Volume.create", {"dbg": "x", "sr": "tank", "name": "n",
                       "description": "d", "size": "1024",
                       "sharable": False}, "size"),
    ("Volume.create", {"dbg": "x", "sr": "tank", "name": "n",
                       "description": "d", "size": True,
                       "sharable": False}, "size"),
    ("Volume.create", {"dbg": "x", "sr": "tank", "name": "n",
                       "description": "d", "size": 1024.0,
                       "sharable": False}, "size"),
    ("Volume.create", {"dbg": "x", "sr": "tank", "name": "n",
                       "description": "d", "size": 1024,
                       "sharable": "false"}, "sharable"),
    ("Volume.create", {"dbg": "x", "sr": "tank", "name": "n",
                       "description": "d", "size": 1024,
                       "sharable": 0}, "sharable"),
    ("Volume.create", {"dbg": "x", "sr": "tank", "name": None,
                       "description": "d", "size": 1024,
                       "sharable": False}, "name"),
    ("Volume.set", {"dbg": "x", "sr": "tank", "key": "k", "k": "a"}, "v"),
]


@pytest.mark.parametrize("method,args,argument", BAD_ARGUMENTS)
def test_arguments_are_type_checked(monkeypatch, capsys, method, args,
                                    argument):
    table = {method: Recorder()}
    rc, out, _ = run(monkeypatch, capsys, [method, "--json"], args, table)
    assert rc == 1
    obj = error_of(out)
    assert obj["code"] == "SR_BACKEND_FAILURE"
    assert obj["params"][0] == "InvalidArgument"
    assert repr(argument) in obj["params"][1] or \
        "%s:" % argument in obj["params"][1] or \
        "%s[" % argument in obj["params"][1]
    assert table[method].calls == []


@pytest.mark.parametrize("stdin", [
    "", "{", "not json", '{"dbg": "x"} trailing', "[1, 2]", "null", '"x"',
])
def test_stdin_must_be_a_json_object(monkeypatch, capsys, stdin):
    table = {"Plugin.Query": Recorder(plugin.query("x"))}
    rc, out, _ = run(monkeypatch, capsys, ["Plugin.Query", "--json"], stdin,
                     table)
    assert rc == 1
    obj = error_of(out)
    assert obj["params"][0] == "InvalidArgument"
    assert table["Plugin.Query"].calls == []


def test_unknown_extra_arguments_are_tolerated(monkeypatch, capsys):
    table = {"SR.stat": Recorder(SR_STAT)}
    rc, out, _ = run(monkeypatch, capsys, ["SR.stat", "--json"],
                     {"dbg": "x", "sr": "tank", "newer_xapi_arg": 1}, table)
    assert rc == 0
    assert table["SR.stat"].calls == [{"dbg": "x", "sr": "tank"}]


# --- the bytes on the wire --------------------------------------------------

NON_ASCII = u"Donn\u00e9es \u2713 \u65e5\u672c \U0001f4be"


def run_c_locale(monkeypatch, argv, stdin_bytes, table):
    """(exit status, stdout bytes) of wire.main with stdin and stdout as
    Python 3.6 makes them in the C locale: ASCII text layers over bytes
    (stdin decoding with surrogateescape, stdout strict)."""
    stdin = io.TextIOWrapper(io.BytesIO(stdin_bytes), encoding="ascii",
                             errors="surrogateescape")
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(sys, "stdout", stdout)
    rc = wire.main(argv, wire.VOLUME_INTERFACES, table)
    stdout.flush()
    return rc, stdout.buffer.getvalue()


def test_non_ascii_arguments_arrive_intact_whatever_the_locale(monkeypatch):
    # xapi writes UTF-8 bytes, not \u escapes (Yojson escapes only control
    # characters): exactly what an ASCII stdin turns into surrogates.
    table = {"Volume.set": Recorder(None)}
    payload = json.dumps({"dbg": "x", "sr": "tank", "key": "k",
                          "k": NON_ASCII, "v": NON_ASCII},
                         ensure_ascii=False).encode("utf-8")
    rc, out = run_c_locale(monkeypatch, ["Volume.set", "--json"], payload,
                           table)
    assert (rc, out) == (0, b"null\n")
    assert table["Volume.set"].calls[0]["k"] == NON_ASCII
    assert table["Volume.set"].calls[0]["v"] == NON_ASCII


def test_non_ascii_results_are_utf8_bytes_whatever_the_locale(monkeypatch):
    table = {"SR.stat": Recorder(dict(SR_STAT, name=NON_ASCII))}
    rc, out = run_c_locale(monkeypatch, ["SR.stat", "--json"],
                           b'{"dbg": "x", "sr": "tank"}', table)
    assert rc == 0
    assert NON_ASCII.encode("utf-8") in out       # as xapi writes it
    assert json.loads(out.decode("utf-8"))["name"] == NON_ASCII


def test_non_ascii_error_messages_are_utf8_too(monkeypatch):
    table = {"SR.stat": Recorder(exc=errors.InvalidArgument(NON_ASCII))}
    rc, out = run_c_locale(monkeypatch, ["SR.stat", "--json"],
                           b'{"dbg": "x", "sr": "tank"}', table)
    assert rc == 1
    assert error_of(out.decode("utf-8"))["params"][1] == NON_ASCII


def test_a_long_string_is_written_piece_by_piece_as_one_json_value(
        monkeypatch):
    """list_changed_blocks' bitmap goes out in pieces, never whole: the
    bytes are still exactly one JSON object, fields in order."""
    pieces = [b"AAAA", b"/w==", b""]
    table = {"Volume.list_changed_blocks": Recorder({
        "granularity": 65536, "bitmap": wire.LongString(
            lambda: iter(pieces))})}
    rc, out = run_c_locale(
        monkeypatch, ["Volume.list_changed_blocks", "--json"],
        b'{"dbg": "x", "sr": "tank", "key": "a", "key2": "b", '
        b'"offset": 0, "length": -1}', table)
    assert rc == 0
    assert out == b'{"granularity": 65536, "bitmap": "AAAA/w=="}\n'


def test_a_long_string_is_taken_only_where_the_interface_allows_it():
    with pytest.raises(TypeError):
        wire.STR.check(wire.LongString(lambda: iter([])), "name")


def test_stdin_that_is_not_utf8_is_a_typed_error(monkeypatch):
    table = {"Volume.set": Recorder(None)}
    rc, out = run_c_locale(monkeypatch, ["Volume.set", "--json"],
                           b'{"dbg": "x", "sr": "tank", "key": "k", '
                           b'"k": "\xe9", "v": ""}', table)
    assert rc == 1
    obj = error_of(out.decode("utf-8"))
    assert obj["params"][0] == "InvalidArgument"
    assert "UTF-8" in obj["params"][1]
    assert table["Volume.set"].calls == []


def test_an_out_of_range_int64_result_fails_the_call_cleanly(monkeypatch,
                                                             capsys):
    # xapi's unmarshaller would fail on it, far from the cause
    volume = {"key": "k", "name": "n", "description": "", "read_write": True,
              "sharable": False, "virtual_size": 2 ** 63,
              "physical_utilisation": 0, "uri": [], "keys": {}}
    rc, out, _ = run(monkeypatch, capsys, ["Volume.stat", "--json"],
                     {"dbg": "x", "sr": "tank", "key": "k"},
                     {"Volume.stat": Recorder(volume)})
    assert rc == 1
    obj = error_of(out)
    assert obj["params"][0] == "InternalError"
    assert "virtual_size" in obj["params"][1]


# --- results -----------------------------------------------------------------

def _without(record, field):
    return dict((k, v) for k, v in record.items() if k != field)


BAD_RESULTS = [
    ("SR.stat", dict(SR_STAT, uuid=None)),            # null option
    ("SR.stat", _without(SR_STAT, "free_space")),     # missing field
    ("SR.stat", dict(SR_STAT, free_space=1.5)),
    ("SR.stat", dict(SR_STAT, free_space=True)),
    ("SR.stat", dict(SR_STAT, clustered="false")),
    ("SR.stat", dict(SR_STAT, health=["Fine", ""])),
    ("SR.stat", dict(SR_STAT, health="Healthy")),
    ("SR.stat", dict(SR_STAT, health=["Healthy"])),
    ("SR.stat", dict(SR_STAT, datasources=[1])),
    ("SR.stat", dict(SR_STAT, extra="field")),
    ("SR.detach", {}),
    ("SR.detach", ""),
    ("SR.attach", None),
    ("SR.create", {"device": 1}),
    ("Plugin.ls", "tank"),
    ("SR.probe", [{"configuration": {}, "complete": "yes",
                   "extra_info": {}}]),
    ("SR.probe", [{"configuration": {}, "complete": True, "extra_info": {},
                   "sr": dict(SR_STAT, uuid=None)}]),
    ("Volume.stat", {"key": "k"}),
]


@pytest.mark.parametrize("method,result", BAD_RESULTS)
def test_results_are_type_checked(monkeypatch, capsys, method, result):
    spec = wire.METHODS[method][0]
    args = dict((name, {} if name == "configuration" else "x")
                for name, _ in spec)
    args["dbg"] = "x"
    rc, out, _ = run(monkeypatch, capsys, [method, "--json"], args,
                     {method: Recorder(result)})
    assert rc == 1
    obj = error_of(out)
    assert obj["params"][0] == "InternalError"
    assert "malformed result" in obj["params"][1]


def test_optional_fields_may_be_left_out(monkeypatch, capsys):
    result = _without(SR_STAT, "uuid")
    rc, out, _ = run(monkeypatch, capsys, ["SR.stat", "--json"],
                     {"dbg": "x", "sr": "tank"},
                     {"SR.stat": Recorder(result)})
    assert rc == 0
    assert json.loads(out) == result


# --- errors ------------------------------------------------------------------

def test_storage_error_object(monkeypatch, capsys):
    exc = errors.DeviceInUse("device /dev/sdb is mounted on /mnt")
    rc, out, _ = run(monkeypatch, capsys, ["SR.stat", "--json"],
                     {"dbg": "x", "sr": "tank"},
                     {"SR.stat": Recorder(exc=exc)})
    assert rc == 1
    obj = error_of(out)
    assert obj["code"] == "SR_BACKEND_FAILURE"
    assert obj["params"] == ["DeviceInUse",
                             "device /dev/sdb is mounted on /mnt"]
    assert obj["backtrace"]["error"] == "device /dev/sdb is mounted on /mnt"


@pytest.mark.parametrize("exc,code,params", [
    (errors.SrNotEmpty("2 VDIs"), "SR_NOT_EMPTY", []),
    (errors.VdiShrinkNotAllowed("no"), "SR_BACKEND_FAILURE_79",
     ["VdiShrinkNotAllowed", "no"]),
    (errors.Volume_does_not_exist("k-1"), "SR_BACKEND_FAILURE",
     ["Volume_does_not_exist", "k-1"]),
    (errors.Sr_not_attached("tank"), "SR_BACKEND_FAILURE",
     ["Sr_not_attached", "tank"]),
    (errors.SR_does_not_exist("u", "long text"), "SR_BACKEND_FAILURE",
     ["SR_does_not_exist", "u"]),
    (errors.InvalidConfiguration("bad"), "SR_BACKEND_FAILURE",
     ["InvalidConfiguration", "bad"]),
])
def test_error_codes_and_params(monkeypatch, capsys, exc, code, params):
    rc, out, _ = run(monkeypatch, capsys, ["SR.stat", "--json"],
                     {"dbg": "x", "sr": "tank"},
                     {"SR.stat": Recorder(exc=exc)})
    assert rc == 1
    obj = error_of(out)
    assert obj["code"] == code
    assert obj["params"] == params


def test_unimplemented_method(monkeypatch, capsys):
    rc, out, _ = run(monkeypatch, capsys, ["Volume.compare", "--json"],
                     {"dbg": "x", "sr": "tank", "key": "a", "key2": "b"}, {})
    assert rc == 1
    obj = error_of(out)
    assert obj["code"] == "SR_BACKEND_FAILURE"
    assert obj["params"] == ["Unimplemented", "Volume.compare"]


def test_unimplemented_is_checked_after_the_arguments(monkeypatch, capsys):
    rc, out, _ = run(monkeypatch, capsys, ["Volume.compare", "--json"],
                     {"dbg": "x"}, {})
    assert rc == 1
    assert error_of(out)["params"][0] == "InvalidArgument"


@pytest.mark.parametrize("exc", [
    ZeroDivisionError("division by zero"), KeyError("health"),
    AttributeError("'NoneType' object has no attribute 'split'"),
    AssertionError("bug"), TypeError("bad"),
])
def test_internal_exception_never_prints_a_traceback(monkeypatch, capsys,
                                                     exc):
    rc, out, err = run(monkeypatch, capsys, ["SR.stat", "--json"],
                       {"dbg": "x", "sr": "tank"},
                       {"SR.stat": Recorder(exc=exc)})
    assert rc == 1
    assert not out.startswith("Traceback")
    obj = error_of(out)      # stdout is exactly one JSON object
    assert obj["code"] == "SR_BACKEND_FAILURE"
    assert obj["params"][0] == "InternalError"
    assert type(exc).__name__ in obj["params"][1]
    assert "Traceback" in obj["backtrace"]["error"]
    assert "Traceback" in err     # the trace goes to the log


def test_errors_from_the_real_plugin_reach_stdout_as_json(
        fake, monkeypatch, capsys):
    rc, out, _ = run(monkeypatch, capsys, ["SR.stat", "--json"],
                     {"dbg": "x", "sr": "nosuchpool"})
    assert rc == 1
    assert error_of(out)["params"] == ["Sr_not_attached", "nosuchpool"]


# --- the type checker itself -------------------------------------------------

@pytest.mark.parametrize("wtype,good,bad", [
    (wire.STR, ["", "x", u"\u00e9"], [None, 1, b"x", True, []]),
    (wire.INT, [0, -1, 2 ** 62, 2 ** 63 - 1, -2 ** 63],
     [True, False, 1.0, "1", None, 2 ** 63, -2 ** 63 - 1, 2 ** 64]),
    (wire.BOOL, [True, False], [0, 1, "true", None]),
    (wire.UNIT, [None], [0, "", {}, []]),
    (wire.ListOf(wire.STR), [[], ["a", "b"]], [["a", 1], "ab", None, ("a",)]),
    (wire.STRMAP, [{}, {"a": "b"}], [{"a": 1}, {"a": None}, [], None]),
    (wire.HEALTH, [["Healthy", ""], ["Recovering", "x"],
                   ["Unreachable", "y"], ["Unavailable", "z"]],
     [["Healthy"], ["Healthy", None], ["healthy", ""], ("Healthy", ""),
      ["Healthy", "", ""], "Healthy"]),
    (wire.OneOf(["Data", "CBT_Metadata"]), ["Data", "CBT_Metadata"],
     ["data", None, ""]),
    (wire.Record({"a": wire.INT, "b": wire.STR}, optional=["b"]),
     [{"a": 1}, {"a": 1, "b": "x"}],
     [{}, {"b": "x"}, {"a": 1, "b": None}, {"a": 1, "c": 2}, []]),
])
def test_type_checker(wtype, good, bad):
    for value in good:
        wtype.check(value, "v")
    for value in bad:
        with pytest.raises(TypeError):
            wtype.check(value, "v")


def test_type_errors_name_the_path():
    with pytest.raises(TypeError) as info:
        wire.METHODS["SR.ls"][1].check(
            [{"key": "k", "name": "n", "description": "d", "read_write": True,
              "sharable": False, "virtual_size": 1,
              "physical_utilisation": 1, "uri": ["u", 7], "keys": {}}],
            "result")
    assert "result[0].uri[1]" in str(info.value)
