"""Bounds, through the installed executables: a zfs command that never
answers (a suspended pool) and an SR lock held by a stuck call both give a
typed error in bounded time, with one JSON value on stdout, and leave no
lock behind. (The bounds are lowered with the test hooks.)"""

import fcntl
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from plugin_client import Plugin, PluginError, install  # noqa: E402

HANG = "#!/bin/sh\nexec sleep 3600\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return install(str(tmp_path_factory.mktemp("root")))


@pytest.fixture
def stuck(root, tmp_path):
    """The plugin on a host whose zfs and zpool never answer."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("zfs", "zpool"):
        path = bin_dir / name
        path.write_text(HANG)
        path.chmod(0o755)
    run = tmp_path / "run"
    return Plugin(root, env={"ZFSNG_RUN_DIR": str(run),
                             "ZFSNG_CMD_TIMEOUT": "2",
                             "ZFSNG_LOCK_WAIT": "2",
                             "PATH": "%s:/usr/bin:/bin" % bin_dir})


def test_a_command_that_never_answers_is_a_typed_error(stuck):
    start = time.monotonic()
    with pytest.raises(PluginError) as info:
        stuck("SR.stat", sr="tank")
    assert time.monotonic() - start < 20
    assert info.value.name == "CommandTimeout"
    assert "zpool status" in info.value.params[1]


def test_a_stuck_holder_of_the_sr_lock_gives_sr_busy(stuck):
    run = stuck.env["ZFSNG_RUN_DIR"]
    os.makedirs(run)
    fd = os.open(os.path.join(run, "sr-tank.lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        start = time.monotonic()
        with pytest.raises(PluginError) as info:
            stuck("Volume.create", sr="tank", name="n", description="",
                  size=1 << 30, sharable=False)
        assert time.monotonic() - start < 20
        assert info.value.name == "SrBusy"
    finally:
        os.close(fd)
    # released: the next call gets the lock (and then meets the stuck zfs)
    with pytest.raises(PluginError) as info:
        stuck("Volume.create", sr="tank", name="n", description="",
              size=1 << 30, sharable=False)
    assert info.value.name == "CommandTimeout"


def test_the_hooks_do_nothing_in_an_install_without_the_marker(
        root, tmp_path):
    # As the RPM installs it: ZFSNG_RUN_DIR in the daemon's environment
    # must not move the locks.
    os.remove(os.path.join(root, "usr/lib/python3.6/site-packages/zfsng",
                           "TEST_HOOKS"))
    try:
        run = tmp_path / "run"
        plugin = Plugin(root, env={"ZFSNG_RUN_DIR": str(run),
                                   "PATH": "/nonexistent:/usr/bin:/bin"})
        code = ("from zfsng import lock, testhooks\n"
                "print(testhooks.enabled(), lock.RUN_DIR)\n")
        out = subprocess.run([sys.executable, "-c", code], env=plugin.env,
                             stdout=subprocess.PIPE).stdout.decode()
        assert out.split() == ["False", "/run/nonpersistent/zfs-ng"]
    finally:
        with open(os.path.join(root, "usr/lib/python3.6/site-packages/"
                               "zfsng/TEST_HOOKS"), "w") as f:
            f.write("test\n")
