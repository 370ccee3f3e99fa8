"""names.new_uuid (what every new VDI is keyed by) and name_uuid (a
derived content_id), and the start-up cost they keep away."""

import uuid

from zfsng import names


def test_new_uuid_is_a_lowercase_version_4_rfc4122_uuid():
    for _ in range(200):
        text = names.new_uuid()
        assert names.is_uuid(text), text
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_new_uuids_differ():
    assert len(set(names.new_uuid() for _ in range(1000))) == 1000


def test_no_module_a_call_may_load_imports_uuid_ctypes_or_traceback():
    # Start-up cost, paid by every xapi call: see names.new_uuid (on
    # Python 3.6, importing uuid loads ctypes and runs ldconfig -p) and
    # wire.main. Every module of the three packages, since a call loads
    # its method's. What the standard library needs anyway does not
    # count: on Python 3.6, subprocess imports threading, which imports
    # traceback.
    import subprocess
    import sys
    import os
    top = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    modules = []
    for package, where in (("zfsng", "volume"), ("zfsng_volume", "volume"),
                           ("zfsng_datapath", "datapath")):
        modules += ["%s.%s" % (package, f[:-3]) for f in sorted(
            os.listdir(os.path.join(top, where, package)))
            if f.endswith(".py") and f != "__init__.py"]
    assert "zfsng.contentid" in modules and len(modules) > 40
    code = ("import sys, subprocess, importlib; before = set(sys.modules)\n"
            "for m in %r: importlib.import_module(m)\n"
            "print(sorted(m for m in ('uuid', 'ctypes', 'traceback') "
            "if m in sys.modules and m not in before))" % (modules,))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(top, "volume"), os.path.join(top, "datapath")]))
    out = subprocess.check_output([sys.executable, "-S", "-c", code], env=env)
    assert out.decode().strip() == "[]"


def test_name_uuid_is_uuid5():
    for namespace in (uuid.NAMESPACE_DNS, uuid.uuid4()):
        for name in ("", "a", "vdi:123", "\u00e9t\u00e9", "x" * 300):
            text = names.name_uuid(str(namespace), name)
            assert text == str(uuid.uuid5(namespace, name))
            assert names.is_uuid(text)
