"""The fake zfs/zpool (tests/unit/fakezfs/) held to real OpenZFS.

Every unit test runs the plugin against ``fakezfs.FakeZfs``. That is only
worth something if the fake answers the commands the plugin really sends
the way real OpenZFS does. So here, in the guest, one fixed sequence of
plugin calls (``scenario``: SR create/attach/stat/ls/probe/detach/destroy,
Plugin.diagnostics, Volume create/set/unset/set_name/snapshot/clone/
resize/stat/revert/destroy, a dom0 datapath cycle, a second SR, thick, on another
disk, and the refusals: a missing volume, a pool name already taken, a
shrink, thick volumes bigger than the pool) is played twice, in this
process, through ``wire.call`` as the executables call it: once on the
guest's real ZFS and disks, once on a FakeZfs given disks of the same
kernel names, sizes and by-id links. Both runs record, at the one command
seam (``zfsng.runner``), every command with its exit status, stdout and
stderr; the corpus is then whatever the plugin sent, so it follows the
plugin's code without a list to keep in sync. In-process, not through the
executables: every executable call is a CPython start (about a second
under emulation), and the fake lives in memory, in one process.

What is compared, call by call and command by command (``normalize``):
- the argv, with pool guids renamed in order of appearance;
- a snapshot's clones as a set (the plugin never reads their order,
  which real ZFS takes from a ZAP: after a promote, not the order the
  clones were made in);
- the exit status (zero or not);
- stdout as the plugin parses it: ``-H`` rows and their tab-separated
  fields; names, types, property values, user properties, volsize,
  volblocksize, origin exactly; the values that differ by nature (used,
  referenced, available, createtxg, creation, guid, pool sizes) only as
  numbers; for ``zdb -l`` the label keys the plugin reads; for ``zpool
  list -v`` the vdev names; for ``udevadm info`` the by-id links;
- on failure, the error class the zfs layer derives from stderr
  (``zfs.classify``), the other stderr fragments the plugin tests, and
  the exact exit status of the tools whose status the plugin reads
  (blkid's 2 "nothing found");
- the outcome of each plugin call: its typed error, or its result with
  sizes that differ by nature reduced to their type.
Not compared: ``udevadm settle`` and the zvol checks of the datapath
(``zvol_id``): the fake has no udev; the datapath's device wait is
answered directly on the fake side. A command the plugin retried after
"busy" is compared once (the real side may see busy where the fake never
does: that is timing, and the zfs layer retries it).
ZFSNG_CONTRACT_DUMP=<file> writes both runs' raw records there (JSON), to
read what each side answered when the test fails.

Mismatches found when this test was written (OpenZFS 2.1 and 2.3 alike),
and what was done:
- ``zfs list -o volblocksize`` of a zvol's snapshot prints ``-``; the
  fake printed the zvol's block size. Fake fixed (the plugin never reads
  a snapshot's volblocksize: resize refuses snapshots first).
- ``zfs set refreservation=auto volsize=<more than fits>`` on a thick
  zvol fails with "size is greater than available space" and leaves the
  old volsize; the fake kept the new volsize (its docstring said the
  kernel keeps what succeeded). Fake fixed; the plugin's check after a
  refused resize (volume._restore_size) finds nothing to undo on both.
Argv forms the fake answered that zfs-ng never sends, removed so that a
new use fails loudly instead of meeting an unchecked answer: ``lsblk -l``
(NAME only), ``zfs create -b``, ``zfs get -d``, ``zfs list`` and ``zfs
get`` without ``-o``.
"""

import json
import os
import re
import subprocess
import sys
import time

_TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
for _dir in ("tests/unit", "volume", "datapath"):
    _path = os.path.join(_TOP, _dir)
    if _path not in sys.path:
        sys.path.insert(0, _path)

import fakezfs  # noqa: E402
from zfsng import abandoned, collect, contentid, errors, inventory, lock, \
    meta, names, runner, spaceguard, wire, zfs  # noqa: E402
from zfsng_volume import alert, cleanup  # noqa: E402
from zfsng_volume import main as volmain  # noqa: E402
from zfsng import attachstate, zvoldev  # noqa: E402
from zfsng_datapath import main as dpmain  # noqa: E402
from zfsng_datapath import mirrorin  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
SR_A = "5c0a1b2c-3d4e-4f50-8a61-7b8c9d0e1f2a"
SR_B = "6d1b2c3d-4e5f-4061-9b72-8c9d0e1f2a3b"
SR_C = "7e2c3d4e-5f60-4172-8c83-9d0e1f2a3b4c"
POOL = "zcontract"
DOM0 = "u0_3f0c5a6e_9d1b_4c2a_8e7f_5b6a4c3d2e1f"


# --- recording ---------------------------------------------------------------

class Recorder(object):
    """The runner seam: passes each command on, keeps (argv, rc, out,
    err)."""

    def __init__(self, inner):
        self.inner = inner
        self.records = []

    def __call__(self, argv, stdin_text=None):
        result = self.inner(argv, stdin_text)
        self.records.append((list(argv), result.rc, result.out, result.err))
        return result

    def stream(self, argv, consume, **bound):
        """runner.stream's seam (zfs send): kept with what consume made of
        the stream (sendstream.writes_and_frees: the range sets) as its
        stdout, in JSON."""
        result, value = self.inner.stream(argv, consume, **bound)
        self.records.append((list(argv), result.rc, json.dumps(value),
                             result.err))
        return result, value


def _handlers():
    table = volmain.handlers()
    table.update(dpmain.handlers())
    return table


def _uuids():
    """names.new_uuid made deterministic: both runs name the same VDIs."""
    count = [0]

    def new_uuid():
        count[0] += 1
        return "00000000-0000-4000-8000-%012d" % count[0]
    return new_uuid


class Run(object):
    """One play of SCENARIO: [(step, outcome, [records])]. write(dataset,
    offset, length): a guest's write to a zvol, on this side."""

    def __init__(self, recorder, disks, write=None):
        self.recorder = recorder
        self.disks = disks
        self.write = write
        self.steps = []
        self.vols = {}
        self.handlers = _handlers()

    def call(self, label, method, **args):
        args.setdefault("dbg", "contract")
        args = json.loads(json.dumps(args))
        start = len(self.recorder.records)
        try:
            result = self._as_xapi_reads(method, args)
            if method == "SR.attach":   # the daemon stats what it attached
                self._as_xapi_reads("SR.stat", {"dbg": args["dbg"],
                                                "sr": result})
            outcome = ("ok", result)
        except errors.StorageError as exc:
            result = None
            outcome = ("error", type(exc).__name__)
        self.steps.append((label, method, outcome,
                           self.recorder.records[start:]))
        return result

    def _as_xapi_reads(self, method, args):
        """The result as xapi reads it: the JSON the wire writes (a
        LongString, list_changed_blocks' bitmap, goes in pieces)."""
        return json.loads(b"".join(wire.dump(wire.call(
            method, args, self.handlers))).decode("utf-8"))

    def step(self, label, action):
        """A step below the plugin's calls (a module's function): its
        result, or the class of its typed error, is the outcome."""
        start = len(self.recorder.records)
        try:
            outcome = ("ok", action())
        except errors.StorageError as exc:
            outcome = ("error", type(exc).__name__)
        self.steps.append((label, "step", outcome,
                           self.recorder.records[start:]))

    def need(self, label, method, **args):
        """A call the next ones build on: it must succeed."""
        result = self.call(label, method, **args)
        if result is None:
            raise AssertionError("%s (%s) failed: %r; commands: %r" % (
                label, method, self.steps[-1][2], self.steps[-1][3]))
        return result


def scenario(run):
    """The fixed sequence of plugin calls."""
    d1, d2 = run.disks[0], run.disks[1]
    c, need = run.call, run.need
    c("probe blank disk", "SR.probe", configuration={"device": d1})
    stored = need("create SR on d1", "SR.create", uuid=SR_A, name=POOL,
               description="contract", configuration={"device": d1})
    c("create another SR with the pool name taken", "SR.create", uuid=SR_B,
      name="other", description="",
      configuration={"device": d2, "pool-name": POOL})
    sr = need("attach", "SR.attach", configuration=stored)
    c("stat", "SR.stat", sr=sr)
    c("diagnostics", "Plugin.diagnostics")
    c("set SR name", "SR.set_name", sr=sr, new_name="renamed")
    vol = need("create volume", "Volume.create", sr=sr, name="v1",
            description="first", size=64 * MiB, sharable=False)
    key = vol["key"]
    c("set key", "Volume.set", sr=sr, key=key, k="vdi-type", v="user")
    c("set another key", "Volume.set", sr=sr, key=key, k="tag", v="x")
    c("unset key", "Volume.unset", sr=sr, key=key, k="tag")
    c("set volume name", "Volume.set_name", sr=sr, key=key, new_name="v1b")
    snap = need("snapshot", "Volume.snapshot", sr=sr, key=key)
    clone = need("clone of the snapshot", "Volume.clone", sr=sr,
              key=snap["key"])
    live = need("clone of the live volume", "Volume.clone", sr=sr, key=key)
    c("resize", "Volume.resize", sr=sr, key=key, new_size=96 * MiB)
    c("shrink", "Volume.resize", sr=sr, key=key, new_size=32 * MiB)
    c("stat volume", "Volume.stat", sr=sr, key=key)
    c("ls", "SR.ls", sr=sr)
    c("revert to a clone", "Volume.revert", sr=sr, snapshot=clone["key"],
      key=key)
    c("revert to the snapshot", "Volume.revert", sr=sr, snapshot=snap["key"],
      key=key)
    c("stat reverted volume", "Volume.stat", sr=sr, key=key)
    uri = live["uri"][0]
    c("dom0 attach", "Datapath.attach", uri=uri, domain=DOM0)
    c("dom0 activate", "Datapath.activate", uri=uri, domain=DOM0)
    c("dom0 deactivate", "Datapath.deactivate", uri=uri, domain=DOM0)
    c("dom0 detach", "Datapath.detach", uri=uri, domain=DOM0)
    c("destroy volume with dependents", "Volume.destroy", sr=sr, key=key)
    c("destroy clone", "Volume.destroy", sr=sr, key=clone["key"])
    c("destroy missing volume", "Volume.destroy", sr=sr,
      key="00000000-0000-4000-8000-999999999999")
    c("stat missing volume", "Volume.stat", sr=sr,
      key="00000000-0000-4000-8000-999999999999")
    # a thick SR: zfs itself refuses what cannot fit
    stored_c = need("create thick SR on d2", "SR.create", uuid=SR_C,
                    name="thick", description="",
                    configuration={"device": d2, "provisioning": "thick",
                                   "ashift": "16"})
    thick = need("attach thick SR", "SR.attach", configuration=stored_c)
    # the space guard's sector: the labels' ashift, a detected one and one
    # given at create (zpool get ashift says 0, then 16)
    run.step("the sector of a detected ashift",
             lambda: spaceguard.sector(sr))
    run.step("the sector of ashift 16", lambda: spaceguard.sector(thick))
    c("thick volume bigger than the pool", "Volume.create", sr=thick,
      name="big", description="", size=4 * GiB, sharable=False)
    small = need("thick volume", "Volume.create", sr=thick, name="small",
                 description="", size=32 * MiB, sharable=False)
    c("grow thick volume past the pool", "Volume.resize", sr=thick,
      key=small["key"], new_size=4 * GiB)
    c("destroy thick volume", "Volume.destroy", sr=thick, key=small["key"])
    c("destroy detached thick SR", "SR.destroy", sr=thick)
    c("detach", "SR.detach", sr=sr)
    c("probe exported pool", "SR.probe", configuration={"device": d1})
    sr = need("attach again (import)", "SR.attach", configuration=stored)
    c("ls after import", "SR.ls", sr=sr)
    c("destroy SR holding volumes", "SR.destroy", sr=sr)
    for vol in c("ls before destroy", "SR.ls", sr=sr) or []:
        c("destroy %s" % vol["name"], "Volume.destroy", sr=sr,
          key=vol["key"])
    c("destroy SR", "SR.destroy", sr=sr)


def cbt_scenario(run):
    """Changed block tracking: writes between snapshots, the changed
    blocks listed (between snapshots, to the live disk, from a
    data-destroyed snapshot's bookmark), data_destroy and the destroys.
    What zdb read (the data blocks and those born since the base, from
    ``zdb -ddddd``; the maxblkid of ``-dddd``) and what zfs send carried
    (its writes and frees), where sent, are compared too."""
    d1 = run.disks[0]
    c, need = run.call, run.need
    stored = need("create SR", "SR.create", uuid=SR_A, name=POOL,
                  description="cbt", configuration={"device": d1})
    sr = need("attach", "SR.attach", configuration=stored)
    key = need("create volume", "Volume.create", sr=sr, name="tracked",
               description="", size=64 * MiB, sharable=False)["key"]
    dataset = "%s/%s" % (sr, key)
    c("enable cbt", "Volume.enable_cbt", sr=sr, key=key)
    run.write(dataset, 0, 64 * 1024)
    a = need("snapshot a", "Volume.snapshot", sr=sr, key=key)["key"]
    run.write(dataset, 1 * MiB, 4096)
    run.write(dataset, 5 * MiB, 64 * 1024)
    b = need("snapshot b", "Volume.snapshot", sr=sr, key=key)["key"]
    c("changed a -> b", "Volume.list_changed_blocks", sr=sr, key=a, key2=b,
      offset=0, length=-1)
    run.write(dataset, 2 * MiB, 4096)
    c("changed b -> live", "Volume.list_changed_blocks", sr=sr, key=b,
      key2=key, offset=0, length=-1)
    snap_c = need("snapshot c", "Volume.snapshot", sr=sr, key=key)["key"]
    c("changed b -> c", "Volume.list_changed_blocks", sr=sr, key=b,
      key2=snap_c, offset=0, length=-1)
    c("data_destroy a", "Volume.data_destroy", sr=sr, key=a)
    c("data_destroy a again", "Volume.data_destroy", sr=sr, key=a)
    c("set key on a", "Volume.set", sr=sr, key=a, k="vdi-type",
      v="cbt_metadata")
    c("changed a (bookmark) -> c", "Volume.list_changed_blocks", sr=sr,
      key=a, key2=snap_c, offset=0, length=-1)
    c("stat a", "Volume.stat", sr=sr, key=a)
    c("changed from the live disk", "Volume.list_changed_blocks", sr=sr,
      key=key, key2=snap_c, offset=0, length=-1)
    c("data_destroy the live disk", "Volume.data_destroy", sr=sr, key=key)
    c("ls", "SR.ls", sr=sr)
    c("destroy the live disk", "Volume.destroy", sr=sr, key=key)
    for label, k in (("a", a), ("b", b), ("c", snap_c)):
        c("destroy " + label, "Volume.destroy", sr=sr, key=k)
    c("ls at the end", "SR.ls", sr=sr)
    c("destroy SR", "SR.destroy", sr=sr)


def sink_scenario(run):
    """A migration's bounded mirror sink (zfsng_datapath/mirrorin.py):
    made (a filesystem with a quota, its zvol inside), found again, its
    bound computed; the quota as zfs lists it (filesystems, zvols), set
    on a zvol (refused), and what a write under it leaves available; the
    SR's listing with it; freed with its leaf; an unmarked one (a cut
    inside its create) listed and collected."""
    d1 = run.disks[0]
    c, need, step = run.call, run.need, run.step
    stored = need("create SR", "SR.create", uuid=SR_A, name=POOL,
                  description="sink", configuration={"device": d1})
    sr = need("attach", "SR.attach", configuration=stored)
    key = need("create leaf", "Volume.create", sr=sr, name="leaf",
               description="", size=16 * MiB, sharable=False)["key"]
    leaf, sink = "%s/%s" % (sr, key), meta.sink_name(sr, key)

    def make():
        """The sink, with a quota both sides agree on (the bound comes
        from the pool's free space, which differs by nature)."""
        computed = mirrorin.bound
        mirrorin.bound = lambda sr, sink: 8 * MiB
        try:
            return mirrorin._ensure_sink(sr, sink, zfs.get_one(
                leaf, ["name", "volsize"]))
        finally:
            mirrorin.bound = computed

    step("make the sink", make)
    step("find the sink again", make)
    step("list quotas", lambda: zfs.list_datasets(
        sr, ["name", "type", "quota", "compression", meta.MIRROR_SINK],
        types="filesystem,volume"))
    step("quota on a zvol", lambda: zfs.set_props(leaf, {"quota": "1M"}))
    run.write(sink + "/" + meta.SINK_VOLUME, 0, 2 * MiB)

    def left():
        row = zfs.get_one(sink + "/" + meta.SINK_VOLUME,
                          ["used", "available", "quota"])
        return [row["quota"], int(row["used"]) >= 2 * MiB,
                int(row["available"]) <= 8 * MiB - int(row["used"])]

    step("what the sink's zvol has left", left)
    step("another sink's bound", lambda: mirrorin.bound(
        sr, meta.sink_name(sr, SR_B)) > 0)
    step("the SR's rows", lambda: [r["name"] for r in inventory.rows(sr)])
    c("destroy the leaf", "Volume.destroy", sr=sr, key=key)
    step("an unmarked sink", lambda: zfs.create_filesystem(
        sink, {"canmount": "off"}))
    step("the SR's rows with it", lambda: [
        r["name"] for r in inventory.rows(sr)])
    step("collect", lambda: collect.collect(sr))
    c("ls at the end", "SR.ls", sr=sr)
    c("destroy SR", "SR.destroy", sr=sr)


SINK_EXPECTED_ERRORS = {"quota on a zvol": "ZfsError"}


CBT_EXPECTED_ERRORS = {
    "changed from the live disk": "InvalidArgument",
    "data_destroy the live disk": "InvalidArgument",
}


def guest_write(dataset, offset, length):
    """A guest's write on the real side: random (incompressible) bytes
    through the zvol's device, flushed."""
    path = "/dev/zvol/" + dataset
    for _ in range(300):
        if os.path.exists(path):
            break
        subprocess.call(["udevadm", "settle", "--timeout=5"])
        time.sleep(0.1)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, os.urandom(length), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


# --- playing it on each side -------------------------------------------------

def _isolate(monkeypatch, tmp):
    """This process as a plugin call sees it, with its own run dirs."""
    os.makedirs(tmp)
    monkeypatch.setattr(lock, "RUN_DIR", os.path.join(tmp, "run"))
    monkeypatch.setattr(cleanup, "PLAN_DIR", os.path.join(tmp, "destroy"))
    monkeypatch.setattr(abandoned, "DIR", os.path.join(tmp, "abandoned"))
    monkeypatch.setattr(alert, "XE", os.path.join(tmp, "no-xe"))
    monkeypatch.setattr(attachstate, "RUN_DIR", os.path.join(tmp, "dp"))
    monkeypatch.setattr(names, "new_uuid", _uuids())


def play(inner, disks, monkeypatch, tmp, plays=None, write=None):
    """plays (SCENARIO unless told) through wire.call with inner as the
    runner."""
    with monkeypatch.context() as m:
        _isolate(m, tmp)
        recorder = Recorder(inner)
        old = runner.set_runner(recorder)
        try:
            run = Run(recorder, disks, write)
            (plays or scenario)(run)
        finally:
            runner.set_runner(old)
    return run


def disk_size(path):
    with open(path, "rb") as f:
        return f.seek(0, 2)


def detected_ashift(path):
    """The ashift ZFS gives a vdev on the disk (vdev_open,
    vdev_ashift_optimize): its logical sector's, raised to its physical
    sector's if that is at most zfs_vdev_max_auto_ashift (14); at least
    9."""
    queue = "/sys/class/block/%s/queue/" % os.path.basename(
        os.path.realpath(path))

    def shift(name):
        with open(queue + name) as f:
            return int(f.read()).bit_length() - 1
    logical, physical = shift("logical_block_size"), \
        shift("physical_block_size")
    return max(9, logical, physical if physical <= 14 else logical)


def fake_host(disks, hostid):
    """A FakeZfs with the guest's disks: kernel names, sizes, by-id links,
    the ashift ZFS detects on them, and the guest's hostid in the labels
    it writes."""
    host = fakezfs.FakeZfs()
    for path in disks:
        host.add_disk(os.path.realpath(path), size=disk_size(path),
                      by_id=os.path.basename(path),
                      ashift=detected_ashift(path))
    host.hostid = hostid
    # the release the plugin reads (the SR's default volblocksize)
    host.version_text = subprocess.run(
        ["zfs", "version"], stdout=subprocess.PIPE, check=True,
        timeout=60).stdout.decode()
    return host


def fake_device_wait(dataset, timeout=None):
    """The datapath's device wait on the fake side: the fake has no udev,
    so /dev/zvol links are not modelled; the real side waits for real."""
    return "/dev/zd0"


# --- comparing ---------------------------------------------------------------

# -Hp columns whose values differ by nature between two runs: compared as
# numbers only
NUMERIC = {"used", "referenced", "refer", "available", "avail",
           "usedbydataset", "usedds", "usedbysnapshots", "usedsnap",
           "usedbychildren", "usedchild", "usedbyrefreservation",
           "usedrefreserv", "written", "logicalused", "createtxg",
           "logicalreferenced",
           "creation", "size", "allocated", "alloc", "free",
           "refreservation"}
# zdb -l keys the plugin reads (pools._LABEL_KEYS), and the top-level
# vdev's ashift (pools.max_ashift)
LABEL_KEYS = ("name", "state", "pool_guid", "hostid", "hostname", "guid",
              "ashift")
# stderr fragments the plugin looks for outside zfs._ERROR_PATTERNS
FRAGMENTS = ("no pools available",)
# programs whose exact exit status the plugin reads (blkid: 2 is "nothing
# found", 8 "ambivalent"); of zfs and zpool only zero or not matters, and
# of zdb only its stdout (zfs._label reads the label's lines whatever zdb
# exits with: a disk with no label or a half-wiped one gives 2 or 1)
EXACT_RC = ("blkid", "lsblk", "wipefs", "udevadm")
# blkid keys compared with their values (the others are random uuids)
BLKID_VALUES = ("TYPE", "PTTYPE", "LABEL", "USAGE", "DEVNAME")
GUID_RE = re.compile(r"(?<![-0-9A-Za-z])[0-9]{12,20}(?![-0-9A-Za-z])")


class Guids(object):
    """Pool and vdev guids renamed G1, G2... in order of appearance."""

    def __init__(self):
        self.names = {}

    def __call__(self, text):
        return GUID_RE.sub(lambda m: self.names.setdefault(
            m.group(0), "G%d" % (len(self.names) + 1)), text)


def _option(argv, flag):
    """The value of -<flag> in argv (-o name,guid), or None."""
    for i, word in enumerate(argv[:-1]):
        if word == "-" + flag:
            return argv[i + 1]
    return None


def _number(text):
    return "<num>" if re.match(r"^[0-9]+$", text) else "<not a number: %r>" \
        % text


def _table(out, columns, guids):
    rows = []
    for line in out.splitlines():
        cells = line.split("\t")
        if len(cells) != len(columns):
            rows.append(("<%d fields>" % len(cells), line))
            continue
        row = []
        for column, cell in zip(columns, cells):
            if column in NUMERIC:
                cell = _number(cell)
            elif column == "guid":
                cell = guids(cell)
            elif column == "clones":    # a set: its order is the ZAP's
                cell = ",".join(sorted(cell.split(",")))
            row.append(cell)
        rows.append(tuple(row))
    return rows


def _stdout(argv, out, guids):
    """stdout reduced to what the plugin reads of it."""
    prog, verb = argv[0], argv[1] if len(argv) > 1 else ""
    if prog == "zdb" and "-dddd" in argv:
        return [line.strip() for line in out.splitlines()
                if line.strip().startswith("dnode maxblkid:")]
    if prog == "zfs" and verb == "send" or "-ddddd" in argv:
        return json.loads(out)     # (writes, frees); zdb: (born, data)
    if prog == "zdb":
        label = {}
        for line in out.splitlines():
            key, sep, value = line.strip().partition(": ")
            if sep and key in LABEL_KEYS and key not in label:
                label[key] = value.strip().strip("'")
        for key in ("pool_guid", "guid"):
            if key in label:
                label[key] = guids(label[key])
        label.pop("hostname", None)   # compared as present only
        return sorted(label.items())
    if prog == "zpool" and verb == "list" and "-v" in argv:
        return [guids(line.strip().split("\t")[0])
                for line in out.splitlines()]
    if (prog, verb) == ("zpool", "get"):      # -o property,value
        return [guids(line) for line in out.splitlines()]
    if (prog, verb) == ("zfs", "get") and "createtxg" in argv:
        return [_number(line) for line in out.splitlines()]   # cbt's
    if (prog, verb) in (("zfs", "list"), ("zfs", "get"),
                        ("zpool", "list")):
        columns = _option(argv, "o")
        if columns:
            return _table(out, columns.split(","), guids)
    if prog == "zpool" and verb == "import":
        return [guids(line.strip()) for line in out.splitlines()
                if line.strip().split(":")[0] in ("pool", "id", "state")]
    if prog == "zpool" and verb == "status":
        return [line.strip() for line in out.splitlines()
                if line.strip().startswith(("state:", "status:"))]
    if prog == "zfs" and verb == "version":
        return [line.split("-")[0] for line in out.splitlines()]
    if prog == "udevadm" and verb == "info":
        return sorted(l for l in out.split() if l.startswith("disk/by-id/"))
    if prog == "blkid":
        pairs = [line.partition("=") for line in out.splitlines()]
        return sorted((key, value if key in BLKID_VALUES else "<value>")
                      for key, _, value in pairs)
    if prog == "wipefs":
        return None   # what it erased and where: the plugin reads nothing
    return out.splitlines()


def _failure(argv, rc, err):
    if rc == 0:
        return None
    cls = type(zfs.classify(runner.Result(argv, rc, "", err))).__name__
    return (cls, tuple(f for f in FRAGMENTS if f in err),
            rc if argv[0] in EXACT_RC else "non-zero")


def _busy_retried(records, i):
    argv, rc, _, err = records[i]
    return rc != 0 and re.search(r"is busy|resource busy", err) and \
        i + 1 < len(records) and records[i + 1][0] == argv


COMPARED = ("zfs", "zpool", "zdb", "lsblk", "blkid", "wipefs")


def _derived_ids(argv, out, guids, derived):
    """Learn, from a listing with names and guids, the content_id each
    dataset would derive (zfsng/contentid.py: from its guid, which
    differs by nature): derived[id] = the dataset and its renamed guid,
    so that an outcome reporting a derived id is compared by whose it is,
    not by its value."""
    columns = (_option(argv, "o") or "").split(",")
    if argv[:1] != ["zfs"] or "name" not in columns or \
            "guid" not in columns:
        return
    for line in out.splitlines():
        cells = line.split("\t")
        row = dict(zip(columns, cells))
        if len(cells) == len(columns) and "/" in row["name"]:   # a VDI's
            derived.setdefault(contentid.derived(row), "<derived %s %s>" % (
                row["name"], guids(row["guid"])))


def normalize(run):
    """[(step label, method, outcome, [commands])], every part reduced to
    what must be the same on real ZFS and on the fake."""
    guids = Guids()
    derived = {}
    out = []
    for label, method, outcome, records in run.steps:
        commands = []
        for i, (argv, rc, stdout, err) in enumerate(records):
            if argv[0] not in COMPARED and argv[:2] != ["udevadm", "info"]:
                continue
            if _busy_retried(records, i):
                continue
            if rc == 0:
                _derived_ids(argv, stdout, guids, derived)
            argv_n = [guids(a) for a in argv]
            commands.append({
                "argv": argv_n, "ok": rc == 0,
                "stdout": _stdout(argv, stdout, guids) if rc == 0 else None,
                "failure": _failure(argv, rc, err),
            })
        out.append((label, method, _outcome(outcome, guids, derived),
                    commands))
    return out


SIZES = ("physical_utilisation", "free_space", "total_space")


def _outcome(outcome, guids, derived):
    kind, value = outcome
    if kind == "error":
        return outcome
    if isinstance(value, str) and "\n" in value:
        return (kind, "<report>")   # Plugin.diagnostics: the commands' text

    def reduce(obj, key=None):
        if isinstance(obj, dict):
            return dict((k, reduce(v, k)) for k, v in obj.items())
        if isinstance(obj, list):
            return [reduce(v) for v in obj]
        if key in SIZES:
            return type(obj).__name__
        if isinstance(obj, str):
            return derived.get(obj) or guids(obj)
        return obj
    return (kind, reduce(value))


# --- the test ----------------------------------------------------------------

def _command_diff(r, f):
    """What differs between two normalized commands, field by field."""
    if r is None or f is None or r["argv"] != f["argv"]:
        return "  real %r\n  fake %r" % (r and r["argv"], f and f["argv"])
    out = ["  %s" % " ".join(r["argv"])[:300]]
    for part in ("ok", "failure"):
        if r[part] != f[part]:
            out.append("  %s: real %r, fake %r" % (part, r[part], f[part]))
    rs, fs = r["stdout"] or [], f["stdout"] or []
    if rs != fs:
        columns = (_option(r["argv"], "o") or "").split(",")
        if len(rs) != len(fs):
            out.append("  stdout: real %d lines, fake %d" % (len(rs),
                                                           len(fs)))
        for i, (rl, fl) in enumerate(zip(rs, fs)):
            if rl == fl:
                continue
            if isinstance(rl, tuple) and isinstance(fl, tuple) and \
                    len(rl) == len(fl) == len(columns):
                for col, rv, fv in zip(columns, rl, fl):
                    if rv != fv:
                        out.append("  line %d %s: real %r, fake %r"
                                   % (i + 1, col, rv, fv))
            else:
                out.append("  line %d: real %r, fake %r" % (i + 1, rl, fl))
        if len(rs) != len(fs):
            out.append("  real %r\n  fake %r" % (rs, fs))
    return "\n".join(out)


def differences(real, fake):
    """Readable lines for every place where the two normalized runs part,
    step by step (one divergence must not bury the others). Within a
    step, every differing command while the argv sequences agree; after
    they part, nothing more of that step."""
    lines = []
    for (label, method, r_out, r_cmds), (_, _, f_out, f_cmds) in \
            zip(real, fake):
        if r_out != f_out:
            lines.append("%s (%s): outcome real %r, fake %r"
                         % (label, method, r_out, f_out))
        for i in range(max(len(r_cmds), len(f_cmds))):
            r = r_cmds[i] if i < len(r_cmds) else None
            f = f_cmds[i] if i < len(f_cmds) else None
            if r != f:
                lines.append("%s (%s), command %d:\n%s"
                             % (label, method, i + 1, _command_diff(r, f)))
            if r is None or f is None or r["argv"] != f["argv"]:
                break   # the rest of the step is out of step
    if len(real) != len(fake):
        lines.append("steps: real %d, fake %d" % (len(real), len(fake)))
    return lines


def corpus(run):
    """The distinct argv forms a run sent: program, verb and options, with
    names and values left out."""
    forms = set()
    for _, _, _, records in run.steps:
        for argv, _, _, _ in records:
            if argv[0] not in COMPARED + ("udevadm",):
                forms.add(os.path.basename(argv[0]))   # zvol_id <dev>
                continue
            words = [argv[0]] + [a for a in argv[1:2]] + [
                a.split("=")[0] for a in argv[2:] if a.startswith("-")]
            forms.add(" ".join(words))
    return forms


# The refusals the scenario is built to reach, as real ZFS gives them: if
# the plugin stopped reaching them, the contract would cover less.
EXPECTED_ERRORS = {
    "create another SR with the pool name taken": "PoolNameTaken",
    "shrink": "VdiShrinkNotAllowed",
    "revert to a clone": "InvalidArgument",
    "stat missing volume": "Volume_does_not_exist",
    "destroy SR holding volumes": "SrNotEmpty",
    "thick volume bigger than the pool": "OutOfSpace",
    "grow thick volume past the pool": "OutOfSpace",
}


def test_the_fake_answers_the_plugins_commands_as_real_zfs(
        disks, monkeypatch, tmp_path):
    from zfsng import hostid
    two = disks[:2]
    real = play(runner.SubprocessRunner(), two, monkeypatch,
                str(tmp_path / "real"))
    fake = fake_host(two, hostid.current())
    with monkeypatch.context() as m:
        m.setattr(zvoldev, "wait", fake_device_wait)
        fake_run = play(fake, two, monkeypatch, str(tmp_path / "fake"))
    assert not fake.unknown, fake.unknown
    commands = sum(len(s[3]) for s in real.steps)
    forms = corpus(real)
    print("contract: %d plugin calls, %d commands, %d argv forms"
          % (len(real.steps), commands, len(forms)))
    for form in sorted(forms):
        print("  " + form)
    assert_same(real, fake_run, EXPECTED_ERRORS, "")


def test_the_fake_answers_the_cbt_commands_as_real_zfs(
        disks, monkeypatch, tmp_path):
    """cbt_scenario on both sides: bookmarks, zfs send -i (from a
    snapshot, from a bookmark), zdb -dddd, zfs inherit on snapshots, the
    volmode=none zvol of a data-destroyed snapshot."""
    from zfsng import hostid
    one = disks[:1]
    real = play(runner.SubprocessRunner(), one, monkeypatch,
                str(tmp_path / "real"), cbt_scenario, guest_write)
    fake = fake_host(one, hostid.current())
    fake_run = play(fake, one, monkeypatch, str(tmp_path / "fake"),
                    cbt_scenario, fake.guest_write)
    assert not fake.unknown, fake.unknown
    assert_same(real, fake_run, CBT_EXPECTED_ERRORS, ".cbt")


def test_the_fake_answers_the_sinks_commands_as_real_zfs(
        disks, monkeypatch, tmp_path):
    """sink_scenario on both sides: quota (a filesystem's, listed with
    zvols, refused on a zvol, what it leaves available), a filesystem
    below the SR and a zvol inside it."""
    from zfsng import hostid
    one = disks[:1]
    real = play(runner.SubprocessRunner(), one, monkeypatch,
                str(tmp_path / "real"), sink_scenario, guest_write)
    fake = fake_host(one, hostid.current())
    with monkeypatch.context() as m:
        m.setattr(zvoldev, "wait", fake_device_wait)
        fake_run = play(fake, one, monkeypatch, str(tmp_path / "fake"),
                        sink_scenario, fake.guest_write)
    assert not fake.unknown, fake.unknown
    assert_same(real, fake_run, SINK_EXPECTED_ERRORS, ".sink")


def assert_same(real, fake_run, expected_errors, dump_suffix):
    """The real run failed where expected, and the fake's run is the real
    one, command for command; both dumped to ZFSNG_CONTRACT_DUMP (plus
    dump_suffix) when it is set."""
    dump = os.environ.get("ZFSNG_CONTRACT_DUMP")
    if dump:
        with open(dump + dump_suffix, "w") as f:
            json.dump({"real": real.steps, "fake": fake_run.steps}, f,
                      indent=1)
    errors_seen = dict((label, outcome[1]) for label, _, outcome, _ in
                       real.steps if outcome[0] == "error")
    assert errors_seen == expected_errors
    diff = differences(normalize(real), normalize(fake_run))
    assert not diff, "\n".join(diff)
