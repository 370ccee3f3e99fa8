"""ARCHITECTURE.md against the code: its module map names every module
(and no other), and the import rules it states hold."""

import ast
import glob
import os
import re
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
# The shared core and each plugin's own package: the import rule is the
# layout (plugins import the core, the core imports no plugin, no plugin
# imports the other).
PACKAGES = {"zfsng": "volume/zfsng",
            "zfsng_volume": "volume/zfsng_volume",
            "zfsng_datapath": "datapath/zfsng_datapath"}
PLUGINS = ("zfsng_volume", "zfsng_datapath")


def _read(path):
    """A source file's text: UTF-8 whatever the locale (dom0's plugins
    run in the C locale, and so do these tests under CPython 3.6)."""
    with open(path, encoding="utf-8") as f:
        return f.read()


def modules():
    """{"pkg.name": path} of every module but the packages' __init__."""
    found = {}
    for pkg, where in PACKAGES.items():
        for path in glob.glob(os.path.join(TOP, where, "*.py")):
            name = os.path.basename(path)[:-3]
            if name != "__init__":
                found["%s.%s" % (pkg, name)] = path
    return found


def imports(path):
    """The package modules path imports (zfsng.x, zfsng_datapath.x)."""
    found = set()
    for node in ast.walk(ast.parse(_read(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module in PACKAGES:
                found.update("%s.%s" % (node.module, a.name)
                             for a in node.names)
            elif node.module.split(".")[0] in PACKAGES:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names
                         if a.name.split(".")[0] in PACKAGES)
    return found & set(modules())


def graph():
    return dict((m, imports(p)) for m, p in modules().items())


def architecture():
    with open(os.path.join(TOP, "ARCHITECTURE.md"), encoding="utf-8") as f:
        return f.read()


def section(text, title):
    start = text.index(title)
    end = text.index("\n### ", start + 1)
    return text[start:end]


def listed(text):
    return set(re.findall(r"^\| `([a-z_]+)\.py` \|", text, re.M))


def test_the_module_map_names_every_module_and_no_other():
    doc = architecture()
    mods = modules()
    for pkg, title in (("zfsng", "### Core"),
                       ("zfsng_volume", "### Volume plugin"),
                       ("zfsng_datapath", "### Datapath plugin")):
        assert listed(section(doc, title)) == set(
            m.split(".")[1] for m in mods if m.startswith(pkg + ".")), pkg


def test_no_module_imports_one_that_imports_it_back():
    edges = graph()
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])


def test_the_core_imports_no_plugin_and_no_plugin_the_other():
    for module, deps in graph().items():
        own = module.split(".")[0]
        bad = [d for d in deps if d.split(".")[0] in PLUGINS and
               d.split(".")[0] != own]
        assert not bad, "%s imports %s" % (module, bad)


def test_every_package_is_installed_by_make_install():
    with open(os.path.join(TOP, "Makefile"), encoding="utf-8") as f:
        makefile = f.read()
    for pkg, where in PACKAGES.items():
        assert "%s,%s)" % (pkg, where) in makefile, pkg


def test_the_model_decides_and_runs_nothing():
    assert imports(modules()["zfsng.meta"]) <= {"zfsng.errors",
                                                 "zfsng.names"}


@pytest.mark.parametrize("needle,owner", [
    ("import subprocess", "zfsng.runner"),
    ('"udevadm", "settle"', "zfsng.udev"),
    ('"--query=symlink"', "zfsng.udev"),
    ('"zpool", "import"', "zfsng.pools"),
    ('TAP_CTL = "tap-ctl"', "zfsng_datapath.tapctl"),
])
def test_each_external_concern_has_one_home(needle, owner):
    holders = sorted(m for m, p in modules().items()
                     if needle in _read(p))
    assert holders == [owner]


def test_nothing_cites_a_document_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=TOP,
                             stdout=subprocess.PIPE, timeout=60,
                             check=True).stdout.decode().split("\n")
    pattern = re.compile(r"design\.md|smapiv3\.md|[Dd]esign decision")
    cited = []
    for name in tracked:
        path = os.path.join(TOP, name)
        if not name or not os.path.isfile(path) or \
                os.path.islink(path) or name.endswith((".img", ".gz")):
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        cited += ["%s: %s" % (name, m) for m in pattern.findall(text)]
    assert cited == []
