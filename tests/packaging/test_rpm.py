"""The RPM for XCP-ng 8.3, checked as an admin's host would see it.

``make test-rpm`` builds it (``make rpm``) and passes its path in ZFSNG_RPM;
run alone, this module builds it itself. The checks: one noarch package
named after ``make version``; its header (dependencies, provides, a payload
and rpmlib features that XCP-ng 8.3's rpm 4.11 reads); its file list against
what ``make install`` installs; its scriptlets; rpmlint, every finding of
which must be one explained below; and the plugin run from the unpacked
payload (rpm2cpio | cpio into a scratch root) exactly as xapi-storage-script
runs it.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))

from plugin_client import Plugin, PluginError, VOLUME_PLUGIN  # noqa: E402

XSS = "/usr/libexec/xapi-storage-script"
SITELIB = "/usr/lib/python3.6/site-packages"
VOLUME_DIR = XSS + "/volume/org.xen.xapi.storage.zfs-ng"
SPEC = os.path.join(TOP, "packaging", "zfs-ng.spec")

# What the package needs on the host, and nothing else (see the spec).
EXPECTED_REQUIRES = {
    "zfs >= 2.1",
    "python3 >= 3.6",
    "blktap",
    "util-linux",
    "xapi-storage-script",
    # added by rpm itself, both provided by XCP-ng 8.3's python3 package
    "/usr/bin/python3",
    "python(abi) = 3.6",
}

# The rpmlib() features rpm 4.11 (XCP-ng 8.3, CentOS 7) knows. A newer build
# host may add others (PayloadIsZstd, RichDependencies, LargeFiles...): the
# package would then not install there.
RPM_4_11_FEATURES = {
    "VersionedDependencies", "CompressedFileNames", "PayloadIsBzip2",
    "PayloadIsXz", "PayloadIsLzma", "PayloadFilesHavePrefix",
    "ExplicitPackageProvide", "HeaderLoadSortsTags", "ScriptletInterpreterArgs",
    "PartialHardlinkSets", "ConcurrentAccess", "BuiltinLuaScripts",
    "FileCaps", "FileDigests", "TildeInVersions", "ScriptletExpansion",
}

# Every rpmlint finding allowed, and why (TESTING.md, "Building and
# checking the RPM", says the same). Anything else fails the test: fix it or explain it.
RPMLINT_EXPLAINED = {
    "invalid-license":
        "rpmlint's default configuration knows no licence at all "
        "(ValidLicenses = []), so any License tag is reported; ours is "
        "LGPL-2.1-only, its text in LICENSE",
    "no-url-tag":
        "no public project URL yet",
    "invalid-url":
        "Source0 is the tarball `make rpm` makes from the work tree",
    "no-signature":
        "packages are signed by the repository that publishes them, not here",
    "no-packager-tag":
        "Packager is set by the build system that publishes the package",
    "no-group-tag":
        "Group is obsolete (not used by yum/dnf; Fedora dropped it); "
        "rpmlint's openSUSE defaults still ask for it",
    "no-changelogname-tag":
        "the version comes from volume/zfsng/__init__.py at build time; a "
        "hand-kept %changelog would be stale: the history is the git log",
    "no-dependency-on":
        "'locales-ng': rpmlint reads the -ng of zfs-ng as the language code "
        "of Ndonga and wants a locale package",
    "postin-without-ghost-file-creation":
        "the %ghost .pyc files are made by `python3 -m compileall` in "
        "%posttrans; rpmlint looks for each file's literal path in %post",
    "no-buildroot-tag":
        "BuildRoot is ignored since rpm 4.6 (it is always set by rpmbuild)",
    "hardcoded-library-path":
        "the package is for XCP-ng's Python 3.6: /usr/lib/python3.6 is its "
        "noarch site-packages (the build host's %python3_sitelib is another "
        "Python's)",
}


def run(cmd, **kwargs):
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    proc = subprocess.run(cmd, **kwargs)
    assert proc.returncode == 0, "%s failed: %s" % (cmd, proc.stderr)
    return proc.stdout.decode() if isinstance(proc.stdout, bytes) else ""


def query(rpm, *args):
    return run(["rpm", "-qp"] + list(args) + [rpm])


# Quiet even under a parallel make (make check's host layers), whose
# MAKEFLAGS would otherwise add "Entering directory" lines to the output.
MAKE = ["make", "-s", "--no-print-directory", "-C", TOP]


@pytest.fixture(scope="module")
def version():
    return run(MAKE + ["version"]).strip()


@pytest.fixture(scope="module")
def rpm(version):
    path = os.environ.get("ZFSNG_RPM")
    if not path:
        run(MAKE + ["rpm"])
        path = os.path.join(TOP, "build/rpm/RPMS/noarch",
                            "zfs-ng-%s-1.noarch.rpm" % version)
    assert os.path.isfile(path), path
    return path


@pytest.fixture(scope="module")
def files(rpm):
    """{path: flags} of the package's file list (flags: 'g' for %ghost)."""
    out = query(rpm, "--qf", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]")
    result = {}
    for line in out.splitlines():
        flags, _, path = line.rpartition(" ")
        result[path] = flags.strip()
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Every path `make install` installs (DESTDIR-relative)."""
    dest = str(tmp_path_factory.mktemp("install"))
    run(MAKE + ["install", "DESTDIR=" + dest])
    paths = set()
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            paths.add(os.path.join(dirpath, name)[len(dest):])
    # (less the directories the plugin trees go into: not ours)
    return {p for p in paths
            if p.startswith((XSS + "/volume/", XSS + "/datapath/",
                             SITELIB + "/"))}


@pytest.fixture(scope="module")
def root(rpm, tmp_path_factory):
    """The payload, unpacked the way rpm would lay it out on the host."""
    dest = str(tmp_path_factory.mktemp("payload"))
    cpio = subprocess.Popen(["rpm2cpio", rpm], stdout=subprocess.PIPE)
    run(["cpio", "-idm", "--quiet"], stdin=cpio.stdout, cwd=dest)
    assert cpio.wait() == 0
    return dest


def plugin_env(tmp_path_factory):
    # No zfs/zpool on PATH: these calls must never reach ZFS.
    return {"ZFSNG_RUN_DIR": str(tmp_path_factory.mktemp("run")),
            "PATH": "/nonexistent:/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE": "1"}


def datapath_dirs():
    """The datapath plugin trees in the source (plugins/datapath/<name>),
    once they hold something."""
    return sorted(d for d in glob.glob(os.path.join(TOP, "plugins/datapath/*"))
                  if os.path.isdir(d) and os.listdir(d))


def datapath_packages():
    """The datapath plugin's Python packages (datapath/<package>)."""
    return sorted(os.path.dirname(i) for i in
                  glob.glob(os.path.join(TOP, "datapath/*/__init__.py")))


# --- the build --------------------------------------------------------------

def test_make_rpm_makes_exactly_one_noarch_rpm(rpm, version):
    assert os.path.basename(rpm) == "zfs-ng-%s-1.noarch.rpm" % version
    built = glob.glob(os.path.join(os.path.dirname(os.path.dirname(rpm)),
                                   "*", "*.rpm"))
    assert built == [rpm]


def test_header_names_version_and_release_from_one_place(rpm, version):
    out = query(rpm, "--qf", "%{NAME} %{VERSION} %{RELEASE} %{ARCH}")
    assert out == "zfs-ng %s 1 noarch" % version
    # The one place it comes from, which Plugin.Query reports too.
    with open(os.path.join(TOP, "volume/zfsng/__init__.py")) as init:
        assert 'VERSION = "%s"' % version in init.read()


def test_rpm_4_11_can_read_it(rpm):
    assert query(rpm, "--qf", "%{PAYLOADCOMPRESSOR}") == "xz"
    features = set(re.findall(r"^rpmlib\((\w+)\)", query(rpm, "--requires"),
                              re.M))
    assert features and features <= RPM_4_11_FEATURES, features


# --- dependencies ---------------------------------------------------------------

def test_requires_what_it_runs_and_nothing_else(rpm):
    requires = set(query(rpm, "--requires").splitlines())
    requires = {r.strip() for r in requires
                if not r.startswith("rpmlib(") and r.strip() != "/bin/sh"}
    assert requires == EXPECTED_REQUIRES


def test_scriptlets_need_only_a_shell(rpm):
    out = query(rpm, "--qf", "[%{REQUIREFLAGS:deptype} %{REQUIRENAME}\n]")
    for line in out.splitlines():
        deptype, name = line.split(" ", 1)
        if deptype in ("post", "preun", "postun", "posttrans", "interp"):
            assert name == "/bin/sh", line


def test_provides_only_itself(rpm, version):
    assert query(rpm, "--provides").split("\n")[:-1] == [
        "zfs-ng = %s-1" % version]


# --- the file list ------------------------------------------------------------------

def test_holds_every_volume_method_executable(files, root):
    env = Plugin(root, env={"PYTHONDONTWRITEBYTECODE": "1"})
    methods = env.wire.SERVED["zfsng_volume"]    # the one list of methods
    assert set(m.split(".")[0] for m in methods) == set(
        env.wire.VOLUME_INTERFACES)
    for method in methods:
        path = VOLUME_DIR + "/" + method
        assert path in files, method
        assert os.access(root + path, os.X_OK), method
    assert os.access(root + VOLUME_DIR + "/volume.py", os.X_OK)


def test_holds_every_datapath_method_executable_when_there_is_one(files, root):
    trees = datapath_dirs()
    if not trees:
        assert not any(p.startswith(XSS + "/datapath/") for p in files)
        pytest.skip("no datapath plugin in this tree yet (plugins/datapath)")
    env = Plugin(root, env={"PYTHONDONTWRITEBYTECODE": "1"})
    for tree in trees:
        name = os.path.basename(tree)
        # What xapi-storage-script calls on a datapath plugin, and whatever
        # else the tree holds.
        methods = env.wire.SERVED["zfsng_datapath"]
        assert "Plugin.Query" in methods and "Datapath.attach" in methods
        for method in set(methods) | set(os.listdir(tree)):
            path = "%s/datapath/%s/%s" % (XSS, name, method)
            assert path in files, path
            assert os.access(root + path, os.X_OK), path
    for package in datapath_packages():
        for source in glob.glob(os.path.join(package, "*.py")):
            path = "%s/%s/%s" % (SITELIB, os.path.basename(package),
                                 os.path.basename(source))
            assert path in files, path


def test_holds_the_python_package_for_python_3_6(files):
    sources = glob.glob(os.path.join(TOP, "volume/zfsng/*.py"))
    assert sources
    for source in sources:
        name = os.path.basename(source)
        assert SITELIB + "/zfsng/" + name in files, name


def test_packages_exactly_what_make_install_installs(files, installed):
    ours = {p for p, flags in files.items()
            if "g" not in flags and not p.endswith("/__pycache__")
            and not p.startswith(("/usr/share/doc/", "/usr/share/licenses/"))}
    assert ours == installed


def test_ships_no_test_hooks_marker(files, root):
    # Without it, ZFSNG_* variables in the daemon's environment (locks
    # elsewhere, crash points, traces) can change nothing on a host.
    assert not [f for f in files if os.path.basename(f) == "TEST_HOOKS"]
    assert glob.glob(os.path.join(root, SITELIB.lstrip("/"), "zfsng",
                                  "testhooks.py"))
    assert not glob.glob(os.path.join(root, SITELIB.lstrip("/"), "zfsng",
                                      "TEST_HOOKS"))


def test_owns_no_directory_of_another_package(files):
    for shared in ("/usr", "/usr/lib", "/usr/libexec", XSS, XSS + "/volume",
                   XSS + "/datapath", "/usr/lib/python3.6", SITELIB,
                   SITELIB + "/__pycache__", "/usr/share/doc",
                   "/usr/share/licenses"):
        assert shared not in files, shared
    for path in files:
        assert path.startswith((XSS + "/volume/", XSS + "/datapath/",
                                SITELIB + "/", "/usr/share/doc/",
                                "/usr/share/licenses/zfs-ng-")), path


def test_byte_code_is_ghost_owned_for_python_3_6(files):
    for path in files:
        if path.endswith(".py") and path.startswith(SITELIB):
            head, name = os.path.split(path)
            pyc = "%s/__pycache__/%s.cpython-36.pyc" % (head, name[:-3])
            assert files.get(pyc) == "g", pyc
    # ...and none shipped: byte code from the build host's Python would be
    # for the wrong interpreter.
    assert not any(p.endswith(".pyc") and "g" not in f
                   for p, f in files.items())


def test_ships_the_readme_and_the_licence(files, version):
    # and the pages the README links to
    for doc in ("README.md", "ARCHITECTURE.md", "TESTING.md", "BENCHMARKS.md"):
        assert "/usr/share/doc/zfs-ng-%s/%s" % (version, doc) in files
    assert "/usr/share/licenses/zfs-ng-%s/LICENSE" % version in files


# --- scriptlets -----------------------------------------------------------------------

def scriptlet(rpm, tag):
    out = query(rpm, "--qf", "%%{%s}" % tag)
    return "" if out == "(none)" else out


@pytest.mark.parametrize("tag", ["PREIN", "POSTIN", "PREUN", "POSTUN",
                                 "POSTTRANS"])
def test_scriptlets_are_valid_shell(rpm, tag):
    text = scriptlet(rpm, tag)
    if text:
        run(["sh", "-n"], input=text.encode())


def test_posttrans_byte_compiles_the_installed_package(rpm, files):
    text = scriptlet(rpm, "POSTTRANS")
    assert "python3 -m compileall -q -f %s/zfsng" % SITELIB in text
    # ...and restarts xapi-storage-script only if it ships a datapath plugin.
    restart = "systemctl try-restart xapi-storage-script.service"
    has_datapath = any(p.startswith(XSS + "/datapath/") for p in files)
    assert (restart in text) == has_datapath


def fake_xe(tmp_path, answers):
    """A PATH with an `xe` that logs its arguments and prints answers[cmd]."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "xe.log"
    script = bindir / "xe"
    script.write_text(
        "#!/bin/sh\necho \"$@\" >> %s\ncase \"$1\" in\n%s\nesac\n" % (
            log, "".join("%s) echo '%s';;\n" % (cmd, out)
                         for cmd, out in answers.items())))
    script.chmod(0o755)
    return "%s:/usr/bin:/bin" % bindir, log


def run_scriptlet(rpm, tag, arg, path, inventory=None):
    text = scriptlet(rpm, tag)
    if inventory:
        assert "/etc/xensource-inventory" in text
        text = text.replace("/etc/xensource-inventory", str(inventory))
    proc = subprocess.run(["sh", "-s", str(arg)], input=text.encode(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={"PATH": path})
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def test_post_asks_for_a_toolstack_restart_until_xapi_knows_zfs_ng(
        rpm, tmp_path):
    path, _ = fake_xe(tmp_path, {"sm-list": ""})
    rc, out, _ = run_scriptlet(rpm, "POSTIN", 1, path)
    assert rc == 0 and "xe-toolstack-restart" in out
    (tmp_path / "bin" / "xe").unlink()
    (tmp_path / "bin").rmdir()
    path, _ = fake_xe(tmp_path, {"sm-list": "5f0b-sm-uuid"})
    rc, out, _ = run_scriptlet(rpm, "POSTIN", 1, path)
    assert rc == 0 and out == ""


def test_post_without_xapi_still_succeeds(rpm):
    rc, out, _ = run_scriptlet(rpm, "POSTIN", 1, "/nonexistent:/usr/bin:/bin")
    assert rc == 0 and "xe-toolstack-restart" in out


def test_preun_warns_about_attached_srs_reads_only_and_never_fails(
        rpm, tmp_path):
    inventory = tmp_path / "xensource-inventory"
    inventory.write_text("PRODUCT_BRAND='XCP-ng'\n"
                         "INSTALLATION_UUID='0b6f7c1e-host'\n")
    path, log = fake_xe(tmp_path, {"sr-list": "sr-a,sr-b", "pbd-list": "pbd"})
    rc, out, err = run_scriptlet(rpm, "PREUN", 0, path, inventory)
    assert rc == 0 and out == ""
    assert "SR sr-a is still attached" in err
    assert "SR sr-b is still attached" in err
    calls = [c for c in log.read_text().split("\n") if c]
    assert "pbd-list sr-uuid=sr-a host-uuid=0b6f7c1e-host " \
        "currently-attached=true --minimal" in calls
    assert {c.split(" ")[0] for c in calls} <= {"sr-list", "pbd-list"}, calls
    # an upgrade (1) checks nothing; without xapi removal still goes on
    log.unlink()
    rc, out, err = run_scriptlet(rpm, "PREUN", 1, path, inventory)
    assert (rc, out, err) == (0, "", "") and not log.exists()
    rc, _, _ = run_scriptlet(rpm, "PREUN", 0, "/nonexistent:/usr/bin:/bin",
                             inventory)
    assert rc == 0


# --- rpmlint --------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["rpm", "spec"])
def test_rpmlint_findings_are_all_explained(rpm, target):
    if not shutil.which("rpmlint"):
        pytest.skip("rpmlint is not installed (make test-rpm installs it)")
    proc = subprocess.run(["rpmlint", rpm if target == "rpm" else SPEC],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.decode()
    findings = re.findall(r"^zfs-ng[^:]*(?::\d+)?: ([EW]): (\S+)", out, re.M)
    assert findings or "0 errors, 0 warnings" in out, out
    unexplained = sorted({check for _, check in findings
                          if check not in RPMLINT_EXPLAINED})
    assert not unexplained, out


# --- the plugin, run from the unpacked payload ---------------------------------------

def test_plugin_query_from_the_payload(root, version, tmp_path_factory):
    plugin = Plugin(root, env=plugin_env(tmp_path_factory))
    assert plugin.wire.__file__.startswith(root)   # the packaged copy
    query_ = plugin("Plugin.Query")                 # type-checked by Plugin
    assert query_["plugin"] == "zfs-ng"
    assert query_["version"] == version
    assert query_["required_api_version"] == "5.0"


def test_sr_probe_with_bad_config_is_a_typed_error(root, tmp_path_factory):
    plugin = Plugin(root, env=plugin_env(tmp_path_factory))
    with pytest.raises(PluginError) as err:
        plugin("SR.probe", configuration={"compression": "bogus"})
    assert err.value.code == "SR_BACKEND_FAILURE"
    assert err.value.name == "InvalidConfiguration"
    assert "compression" in err.value.params[1]


def test_every_method_answers_json_from_the_payload(root, tmp_path_factory):
    """Each packaged executable runs and prints one JSON value (here: the
    typed error for a missing argument), nothing else on stdout."""
    plugin = Plugin(root, env=plugin_env(tmp_path_factory))
    for method in plugin.wire.methods_of(plugin.wire.VOLUME_INTERFACES):
        if method.startswith("Plugin."):
            continue
        rc, out, _ = plugin.raw(method, {"dbg": "t"})
        assert rc == 1, method
        obj = json.loads(out)
        assert obj["code"] == "SR_BACKEND_FAILURE", (method, obj)


def test_datapath_plugin_query_from_the_payload(root, version,
                                                tmp_path_factory):
    trees = datapath_dirs()
    if not trees:
        pytest.skip("no datapath plugin in this tree yet (plugins/datapath)")
    for tree in trees:
        plugin = Plugin(root, plugin_dir="usr/libexec/xapi-storage-script/"
                        "datapath/" + os.path.basename(tree),
                        env=plugin_env(tmp_path_factory))
        answer = plugin("Plugin.Query")
        assert answer["required_api_version"] == "5.0"


def test_volume_plugin_dir_is_the_one_plugin_client_expects():
    assert "/" + VOLUME_PLUGIN == VOLUME_DIR
