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
PACKAGES = {"zfsng": "volume/zfsng", "zfsng_datapath": "datapath/zfsng_datapath"}
# the volume plugin's own modules: the datapath never imports them
VOLUME_ONLY = {"devconfig", "devices", "cleanup", "alert", "volume", "cbt",
               "sr", "plugin", "main"}


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
    for node in ast.walk(ast.parse(open(path).read())):
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
    with open(os.path.join(TOP, "ARCHITECTURE.md")) as f:
        return f.read()


def section(text, title):
    start = text.index(title)
    end = text.index("\n### ", start + 1)
    return text[start:end]


def listed(text):
    return set(re.findall(r"^\| `([a-z_]+)\.py` \|", text, re.M))


def test_the_module_map_names_every_module_and_no_other():
    doc = architecture()
    core = listed(section(doc, "### Core"))
    volume_side = listed(section(doc, "### Volume plugin"))
    datapath_side = listed(section(doc, "### Datapath plugin"))
    mods = modules()
    assert core | volume_side == set(
        m.split(".")[1] for m in mods if m.startswith("zfsng."))
    assert datapath_side == set(
        m.split(".")[1] for m in mods if m.startswith("zfsng_datapath."))
    assert volume_side == VOLUME_ONLY
    assert not core & volume_side


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


def test_the_datapath_and_the_core_never_import_the_volume_plugin():
    for module, deps in graph().items():
        if module.startswith("zfsng.") and \
                module.split(".")[1] in VOLUME_ONLY:
            continue
        bad = [d for d in deps if d.startswith("zfsng.") and
               d.split(".")[1] in VOLUME_ONLY]
        assert not bad, "%s imports %s" % (module, bad)


def test_the_model_decides_and_runs_nothing():
    assert imports(modules()["zfsng.meta"]) <= {"zfsng.errors",
                                                 "zfsng.names"}


@pytest.mark.parametrize("needle,owner", [
    ("import subprocess", "zfsng.runner"),
    ('"udevadm", "settle"', "zfsng.zvoldev"),
    ('TAP_CTL = "tap-ctl"', "zfsng_datapath.tapctl"),
])
def test_each_external_concern_has_one_home(needle, owner):
    holders = sorted(m for m, p in modules().items()
                     if needle in open(p).read())
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
