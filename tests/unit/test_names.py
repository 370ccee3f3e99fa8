"""names.new_uuid: what every new VDI is keyed by."""

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


def test_importing_the_plugin_does_not_import_uuid_or_traceback():
    # Start-up cost: see names.new_uuid and wire.main. What the standard
    # library needs anyway does not count: on Python 3.6, subprocess
    # imports threading, which imports traceback.
    import subprocess
    import sys
    import os
    code = ("import sys, subprocess; before = set(sys.modules); "
            "import zfsng_volume.main; "
            "print(sorted(m for m in ('uuid', 'traceback') "
            "if m in sys.modules and m not in before))")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(
        os.path.dirname(names.__file__)))
    out = subprocess.check_output([sys.executable, "-S", "-c", code], env=env)
    assert out.decode().strip() == "[]"
