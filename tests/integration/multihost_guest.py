"""Two hosts, one disk: the guest side of tests/guest/multihost.sh.

Two QEMU guests with distinct hostids see one shared disk
(/dev/disk/by-id/virtio-zfsng-shared), as two XCP-ng hosts see one LUN.

  multihost_guest.py hold     host A: create an SR there, write a VDI, say
                              ready, keep the pool imported until told to
                              let go, then check the data and detach
  multihost_guest.py intrude  host B, while A holds it: attaching the SR,
                              a forced import and a probe must all fail to
                              take the pool, with typed errors
  multihost_guest.py clone    host C, A's hostid but another name (a cloned
                              host): attaching the SR must fail too

Results and the hand-over go through /results (the host's directory):
config.json (A's stored SR config), ready, release, <role>.json.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))

from plugin_client import Plugin, PluginError  # noqa: E402

ROOT = os.environ.get("ZFSNG_ROOT", "/tmp/zfsng-root")
SHARED = "/dev/disk/by-id/virtio-zfsng-shared"
RESULTS = "/results"
WAIT = 1500   # seconds: the longest the holder waits to be released
MiB = 1 << 20


def sh(*argv):
    proc = subprocess.run(list(argv), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=600)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def put(name, obj):
    tmp = os.path.join(RESULTS, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
    os.rename(tmp, os.path.join(RESULTS, name))


def volume_hash(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(8 * MiB)).hexdigest()


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAILED", what), flush=True)
    return bool(cond)


def hold(plugin):
    stored = plugin("SR.create", uuid=str(uuid.uuid4()),
                    configuration={"device": SHARED}, name="shared",
                    description="one LUN, two hosts")
    sr = plugin("SR.attach", configuration=stored)
    pool = sr.split("/")[0]
    vol = plugin("Volume.create", sr=sr, name="data", description="",
                 size=8 * MiB, sharable=False)
    link = "/dev/zvol/%s/%s" % (sr, vol["key"])
    subprocess.check_call(["udevadm", "settle", "--timeout=60"])
    with open(link, "r+b") as f:
        f.write(os.urandom(8 * MiB))
    before = volume_hash(link)
    ok = check(sh("zpool", "get", "-Hp", "-o", "value", "multihost",
                  pool)[1].strip() == "on", "pool %s has multihost=on" % pool)
    put("config.json", stored)
    open(os.path.join(RESULTS, "ready"), "w").close()
    deadline = time.monotonic() + WAIT
    while not os.path.exists(os.path.join(RESULTS, "release")):
        if time.monotonic() > deadline:
            return check(False, "released within %d s" % WAIT)
        time.sleep(2)
    ok &= check(sh("zpool", "list", "-H", "-o", "health", pool)[1].strip()
                == "ONLINE", "pool still ONLINE after the intrusion")
    ok &= check(volume_hash(link) == before, "VDI data unchanged")
    rc, out, err = sh("zpool", "status", "-x", pool)
    ok &= check("errors: No known data errors" in out or "healthy" in out,
                "no data errors: %s" % out.strip())
    plugin("SR.detach", sr=sr)
    put("hold.json", {"ok": ok})
    return ok


def intrude(plugin):
    with open(os.path.join(RESULTS, "config.json")) as f:
        stored = json.load(f)
    ok = True
    start = time.monotonic()
    try:
        plugin("SR.attach", configuration=stored)
        ok &= check(False, "SR.attach refused")
    except PluginError as exc:
        ok &= check(exc.name == "PoolImportedElsewhere",
                    "SR.attach refused with PoolImportedElsewhere after "
                    "%.0f s: %s" % (time.monotonic() - start, exc.params))
    rc, out, err = sh("zpool", "import", "-f", "-N", "-o", "cachefile=none",
                      stored["pool-guid"])
    ok &= check(rc != 0 and "imported on host" in err,
                "zpool import -f refused: %s" % err.strip())
    try:
        found = plugin("SR.probe", configuration={"device": SHARED})
        ok &= check(found == [], "SR.probe does not take the pool: %r"
                    % found)
    except PluginError as exc:
        ok &= check(False, "SR.probe failed: %s" % exc)
    ok &= check(sh("zpool", "list", "-H", "-o", "name")[1].strip() == "",
                "no pool imported here")
    put("intrude.json", {"ok": ok})
    return ok


def clone(plugin):
    """A host cloned from A's image: A's hostid, another name. Multihost
    cannot tell the two apart (OpenZFS before 2.3.6 skips its check when
    the hostids are equal); zfs-ng's label check must refuse."""
    with open(os.path.join(RESULTS, "config.json")) as f:
        stored = json.load(f)
    ok = True
    try:
        plugin("SR.attach", configuration=stored)
        ok &= check(False, "SR.attach refused")
    except PluginError as exc:
        ok &= check(exc.name == "PoolImportedElsewhere" and
                    "zfsng-guest" in exc.params[1],
                    "SR.attach refused, naming host A: %s" % exc.params)
    ok &= check(sh("zpool", "list", "-H", "-o", "name")[1].strip() == "",
                "no pool imported here")
    put("clone.json", {"ok": ok})
    return ok


def main(role):
    plugin = Plugin(ROOT, env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})
    roles = {"hold": hold, "intrude": intrude, "clone": clone}
    return 0 if roles[role](plugin) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
