"""Power cuts, the in-guest part: one boot of the host that dies.

    python3 tests/faults/burst.py --root DESTDIR --out /results
        --base-seed S --iteration I --seed N [--create [--mirror]]
        [--check-only]

A boot does two phases (tests/faults/powercut.py boots the guest once per
iteration, with the same disks and root file system):

check  (when a previous burst ran) what xapi does after a host reboot: the
       PBD plug (SR.attach with the configuration SR.create gave), SR.stat
       and the scan (SR.ls); then the invariants, judged against the journal
       of what xapi knew (below): every VDI whose create, snapshot or clone
       returned and whose destroy never started is listed with its name,
       its size and the keys whose set returned; a call in flight at the
       cut took effect wholly or not at all; no VDI xapi never got a key
       for, but the one a create (snapshot, clone) in flight may have made,
       complete; after the next SR.ls, every dataset of the pool is one
       meta recognises as zfs-ng's; data fsynced before a snapshot returned
       still hashes the same in it; every VDI attached at the cut can be
       opened, attached and activated again, a reset-on-boot one comes back
       reset; afterwards nothing is left that no VDI or attach needs. It
       writes OUT/powercut-<base seed>-<iteration>.json (ledger.result(),
       the cut's moment: the call in flight) for the burst it judged.
burst  a seeded mixed burst of plugin calls (Volume.create, snapshot,
       clone, destroy, resize, set, unset, set_name; Datapath open
       (persistent or not: reset on boot), attach, activate, deactivate,
       detach, close; writes of random data with fsync into attached zvols;
       SR.stat, SR.ls), one at a time as one VM's operations come, until a
       power cut armed at a seeded random delay: a separate process writes
       'b' to /proc/sysrq-trigger, without a sync.

The journal (OUT/journal.jsonl) is what xapi knew: before each call a
"started" line, after it a "returned" line with its result; each line
flushed and fsynced on /results, the host's directory, so it outlives the
cut. A "model" line holds the whole expected state after a check; the
next check replays the returned calls after it.

The seed decides every choice of the burst (not the moment of the cut,
which is timed): the same seed from the same state replays the same calls.
"""

import argparse
import copy
import hashlib
import json
import os
import random
import subprocess
import sys
import time
import traceback
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ledger  # noqa: E402

MiB = 1 << 20
DATA = 4 * MiB            # the region of each VDI written and hashed
ZERO = hashlib.sha256(b"\0" * DATA).hexdigest()
SITELIB = "usr/lib/python3.6/site-packages"
SR_NAME = "pcsr"
DISKS = ["/dev/disk/by-id/virtio-zfsng-d1", "/dev/disk/by-id/virtio-zfsng-d2"]
GUEST_DOMAIN = "7"        # a VM: tapdisk and its blktap device
DOM0_DOMAIN = "u0_vbd_0_xvdb"
CUT_DELAY = (3.0, 75.0)   # seconds after the burst starts
MAX_VDIS = 14
MAX_ATTACHED = 3
# (content_id is zfs-ng's own, never as set: zfsng/contentid.py)
KEY_NAMES = ["vdi-type", "content-id", "tag-a", "tag-b", "clone-on-boot"]
CALL_METHODS = ("Volume.", "SR.", "Datapath.")


def plain(keys):
    """A VDI's keys but its content_id, which zfs-ng sets itself (every
    VDI has one; zfsng/contentid.py): the keys xapi set."""
    return dict((k, v) for k, v in keys.items() if k != "content_id")


def sha(data):
    return hashlib.sha256(data).hexdigest()


def sh(*argv):
    proc = subprocess.run(list(argv), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(argv),
                                               proc.stderr.decode()))
    return proc.stdout.decode()


# --- the journal ---------------------------------------------------------------

class Journal(object):
    """Append-only JSON lines, each flushed and fsynced before the call it
    announces starts."""

    def __init__(self, path):
        self.path = path
        self.f = open(path, "a")

    def write(self, **record):
        record["t"] = round(time.time(), 3)
        self.f.write(json.dumps(record, sort_keys=True) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    @staticmethod
    def read(path):
        """Every whole line; a line the cut broke (it cannot: each is
        fsynced in one write, but a 9p write may be split) is skipped."""
        records = []
        if not os.path.exists(path):
            return records
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
        return records


# --- the model: what xapi knows ------------------------------------------------

def new_model(sr, configuration):
    return {"sr": sr, "configuration": configuration, "vdis": {},
            "next": 0}


def ordered(vdis):
    """The keys of vdis in the order the VDIs were made. Keys are random
    uuids: a choice by their sorted order would pick another VDI in a
    replay, a choice by order of making picks the same one."""
    return sorted(vdis, key=lambda k: (vdis[k].get("seq", 0), k))


def _born(model, key):
    model["vdis"][key]["seq"] = model.get("next", 0)
    model["next"] = model.get("next", 0) + 1


def apply(model, op, result):
    """The model after op returned result (None for calls without one).
    The burst and the check share it, so a replay is exact."""
    kind, vdis = op["op"], model["vdis"]
    key = op.get("key")
    if kind == "create":
        vdis[result["key"]] = {
            "name": op["args"]["name"], "size": result["virtual_size"],
            "keys": {}, "snapshot": False, "hash": ZERO, "dp": None,
            "description": op["args"]["description"]}
        _born(model, result["key"])
    elif kind in ("snapshot", "clone"):
        src = vdis[key]
        vdis[result["key"]] = {
            "name": src["name"], "size": src["size"], "keys": {},
            "snapshot": kind == "snapshot", "hash": src["hash"], "dp": None,
            "description": src["description"]}
        _born(model, result["key"])
    elif kind == "destroy":
        vdis.pop(key, None)
    elif kind == "resize":
        vdis[key]["size"] = max(vdis[key]["size"], op["args"]["new_size"])
    elif kind == "set":
        vdis[key]["keys"][op["args"]["k"]] = op["args"]["v"]
    elif kind == "unset":
        vdis[key]["keys"].pop(op["args"]["k"], None)
    elif kind == "set_name":
        vdis[key]["name"] = op["args"]["new_name"]
    elif kind == "write":
        vdis[key]["hash"] = result
    elif kind == "open":
        vdi = vdis[key]
        persistent = op["args"]["persistent"]
        vdi["dp"] = {"uri": op["args"]["uri"], "persistent": persistent,
                     "stage": "opened", "domain": None,
                     "reset_hash": None if persistent else vdi["hash"]}
    elif kind == "attach":
        vdi = vdis[key]
        if vdi["dp"] is None:    # a snapshot VDI: no open
            vdi["dp"] = {"uri": op["args"]["uri"], "persistent": None,
                         "stage": "opened", "domain": None,
                         "reset_hash": None}
        vdi["dp"]["domain"] = op["args"]["domain"]
        vdi["dp"]["stage"] = "attached"
        vdi["dp"]["was_attached"] = True
        vdi["dp"]["path"] = result
    elif kind == "activate":
        vdis[key]["dp"]["stage"] = "active"
        vdis[key]["dp"]["was_active"] = True
    elif kind == "deactivate":
        vdis[key]["dp"]["stage"] = "attached"
    elif kind == "detach":
        vdi = vdis[key]
        if vdi["snapshot"]:
            vdi["dp"] = None
        else:
            vdi["dp"]["stage"] = "opened"
            vdi["dp"]["domain"] = None
            vdi["dp"]["was_active"] = False
    elif kind == "close":
        vdi = vdis[key]
        if vdi["dp"] and vdi["dp"]["persistent"] is False:
            vdi["hash"] = vdi["dp"]["reset_hash"]
        vdi["dp"] = None
    # ls, stat: nothing changes
    return model


def replay(records):
    """(config record, model as of the last returned call, the call in
    flight or None, the last call that returned or None, the last burst
    record or None) from the journal."""
    config = model = None
    started = {}
    inflight = last = burst = None
    for rec in records:
        ev = rec.get("ev")
        if ev == "config":
            config = rec
        elif ev == "model":
            model = rec["model"]
            started, inflight, last = {}, None, None
        elif ev == "burst":
            burst = rec
        elif ev == "started":
            started[rec["n"]] = rec
            inflight = rec
        elif ev == "returned":
            op = started.pop(rec["n"], None)
            if op is None:
                continue
            if inflight is op:
                inflight = None
            last = op
            if rec.get("error") is None and model is not None:
                apply(model, op, rec.get("result"))
    return config, model, inflight, last, burst


# --- the plugin, as xapi calls it, journaled -----------------------------------

class Host(object):
    """The plugin calls of this boot: each one journaled before and after
    (burst), or only counted (check)."""

    def __init__(self, book, journal, model, iteration):
        self.book, self.journal, self.model = book, journal, model
        self.iteration = iteration
        self.n = int(time.time() * 1000) * 100   # unique across boots
        self.sr = model["sr"] if model else None

    def problem(self, text):
        self.book.problem(text)
        if self.journal is not None:
            self.journal.write(ev="problem", iteration=self.iteration,
                               text=text)

    def op(self, kind, method, vdi=None, **args):
        """Run one call of the burst on the VDI vdi (a key, or None);
        apply it to the model; return its result, or None when it failed
        (a problem: nothing in the burst should fail)."""
        self.n += 1
        n = self.n
        op = {"op": kind, "method": method, "key": vdi, "args": args}
        self.journal.write(ev="started", n=n, iteration=self.iteration,
                           **op)
        before = len(self.book.problems)
        error = None
        try:
            if method == "write":
                result = write_data(args["path"], args["offset"],
                                    args["data_seed"])
            else:
                result = self.book.call(method, **args)
        except ledger.CallError as exc:
            result, error = None, exc.name
        except AssertionError as exc:   # hung or bad stdout: a problem
            result, error = None, "AssertionError: %s" % exc
        if kind == "attach" and result is not None:
            result = device_of(result, args["uri"], args["domain"])
        self.journal.write(ev="returned", n=n, iteration=self.iteration,
                           result=result, error=error)
        for text in self.book.problems[before:]:
            self.journal.write(ev="problem", iteration=self.iteration,
                               text=text)
        if error is not None:
            self.problem("%s %s failed: %s" % (method, vdi, error))
            return None
        apply(self.model, op, result)
        return result if result is not None else True


def device_of(result, uri, domain):
    """The device the campaign reads and writes: the zvol (or clone) the
    VDI's data is on. A dom0 attach answers it (BlockDevice); a guest's
    answer is tapdisk's device, so the zvol under it comes from the
    datapath's record. The campaign writes beside tapdisk, on the zvol,
    as it always has: its subject is the plugin's crash safety."""
    impls = dict((i[0], i[1]) for i in result["implementations"])
    if "BlockDevice" not in impls:
        raise AssertionError("no BlockDevice in %r" % result)
    if "XenDisk" not in impls:
        return impls["BlockDevice"]["path"]
    from zfsng import zvoldev          # the installed copies
    from zfsng_datapath import state, uri as urimod
    st = state.load(urimod.parse(uri).dataset, domain)
    return zvoldev.link(st["device"])


def data_block(seed):
    return random.Random(seed).randbytes(MiB)


def write_data(path, offset, seed):
    """Write one MiB at offset with O_DIRECT, fsync; the new hash of the
    VDI's first DATA bytes."""
    proc = subprocess.run(["dd", "of=" + path, "bs=1M", "iflag=fullblock",
                           "seek=%d" % (offset // MiB), "oflag=direct",
                           "conv=fsync,notrunc", "status=none"],
                          input=data_block(seed), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=300)
    if proc.returncode != 0:
        raise AssertionError("dd to %s: %s" % (path, proc.stderr.decode()))
    return read_hash(path)


def read_hash(path):
    proc = subprocess.run(["dd", "if=" + path, "bs=1M",
                           "count=%d" % (DATA // MiB), "iflag=direct",
                           "status=none"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=300)
    if proc.returncode != 0 or len(proc.stdout) != DATA:
        raise AssertionError("read of %s: %s" % (path,
                                                 proc.stderr.decode()))
    return sha(proc.stdout)


# --- the burst -----------------------------------------------------------------

def burst(host, rnd, deadline):
    """Seeded calls until the cut (or the deadline: then the cut never
    came, which powercut.py reports)."""
    model, sr = host.model, host.sr
    count = 0
    while time.monotonic() < deadline:
        count += 1
        vdis = model["vdis"]
        keys = ordered(vdis)
        live = [k for k in keys if not vdis[k]["snapshot"]]
        free = [k for k in keys if vdis[k]["dp"] is None]
        with_dp = [k for k in keys if vdis[k]["dp"] is not None]
        active = [k for k in with_dp if vdis[k]["dp"]["stage"] == "active"
                  and not vdis[k]["snapshot"]]
        choices = [
            ("create", 3 if len(keys) < MAX_VDIS else 0.3),
            ("snapshot", 2 if live and len(keys) < MAX_VDIS + 4 else 0),
            ("clone", 1.5 if keys and len(keys) < MAX_VDIS + 4 else 0),
            ("destroy", (3 if len(keys) > 8 else 1) if free else 0),
            ("resize", 1 if [k for k in free if k in live] else 0),
            ("set", 2 if keys else 0),
            ("unset", 1 if [k for k in keys if vdis[k]["keys"]] else 0),
            ("set_name", 1 if keys else 0),
            ("datapath", 5 if with_dp or (free and
                                          len(with_dp) < MAX_ATTACHED)
             else 0),
            ("write", 3 if active else 0),
            ("ls", 0.7), ("stat", 0.3)]
        kind = rnd.choices([c[0] for c in choices],
                           [c[1] for c in choices])[0]
        if kind == "create":
            size = rnd.randrange(8, 33) * MiB
            host.op("create", "Volume.create", sr=sr,
                    name="pc-%d" % rnd.randrange(10 ** 6),
                    description="power cut %d" % host.iteration,
                    size=size, sharable=False)
        elif kind in ("snapshot", "clone"):
            key = rnd.choice(live if kind == "snapshot" else keys)
            _keyed(host, kind, "Volume." + kind, key)
        elif kind == "destroy":
            _keyed(host, "destroy", "Volume.destroy", rnd.choice(free))
        elif kind == "resize":
            key = rnd.choice([k for k in free if k in live])
            _keyed(host, "resize", "Volume.resize", key,
                   new_size=vdis[key]["size"] + rnd.randrange(1, 9) * MiB)
        elif kind == "set":
            key = rnd.choice(keys)
            _keyed(host, "set", "Volume.set", key, k=rnd.choice(KEY_NAMES),
                   v="v%d" % rnd.randrange(10 ** 6))
        elif kind == "unset":
            key = rnd.choice([k for k in keys if vdis[k]["keys"]])
            _keyed(host, "unset", "Volume.unset", key,
                   k=rnd.choice(sorted(vdis[key]["keys"])))
        elif kind == "set_name":
            _keyed(host, "set_name", "Volume.set_name", rnd.choice(keys),
                   new_name="pc-renamed-%d" % rnd.randrange(10 ** 6))
        elif kind == "datapath":
            datapath_step(host, rnd, with_dp, free)
        elif kind == "write":
            key = rnd.choice(active)
            host.op("write", "write", key, path=vdis[key]["dp"]["path"],
                    offset=rnd.randrange(DATA // MiB) * MiB,
                    data_seed=rnd.randrange(2 ** 32))
        elif kind == "ls":
            listed = host.op("ls", "SR.ls", sr=sr)
            if listed not in (None, True):
                compare_listing(host, listed, model)
        elif kind == "stat":
            host.op("stat", "SR.stat", sr=sr)
    return count


def _keyed(host, kind, method, key, **args):
    """A Volume call on one VDI: the plugin's key argument is the VDI."""
    return host.op(kind, method, key, sr=host.sr, key=key, **args)


def datapath_step(host, rnd, with_dp, free):
    """One step of one VDI's datapath life: a new one (a VM start: open,
    persistent or not; a dom0 attach of a snapshot, as a backup does),
    or the next step of one in progress: attach, activate, (writes),
    deactivate, detach, close."""
    vdis = host.model["vdis"]
    if with_dp and (rnd.random() < 0.8 or not free or
                    len(with_dp) >= MAX_ATTACHED):
        key = rnd.choice(with_dp)
        vdi = vdis[key]
        dp = vdi["dp"]
        uri, stage = dp["uri"], dp["stage"]
        if stage == "opened" and dp.get("was_attached"):
            host.op("close", "Datapath.close", key, uri=uri)
        elif stage == "opened":
            host.op("attach", "Datapath.attach", key, uri=uri,
                    domain=rnd.choice([GUEST_DOMAIN, DOM0_DOMAIN]))
        elif stage == "attached" and (dp.get("was_active") or
                                      rnd.random() < 0.1):
            host.op("detach", "Datapath.detach", key, uri=uri,
                    domain=dp["domain"])
        elif stage == "attached":
            method = "Datapath.activate_readonly" if vdi["snapshot"] \
                else "Datapath.activate"
            if host.op("activate", method, key, uri=uri,
                       domain=dp["domain"]):
                check_data(host, key)
        elif stage == "active":
            host.op("deactivate", "Datapath.deactivate", key, uri=uri,
                    domain=dp["domain"])
        return
    key = rnd.choice(free)
    stat = _keyed(host, "stat-vdi", "Volume.stat", key)
    if not isinstance(stat, dict):
        return
    uri = stat["uri"][0]
    if vdis[key]["snapshot"]:
        host.op("attach", "Datapath.attach", key, uri=uri,
                domain=rnd.choice([GUEST_DOMAIN, DOM0_DOMAIN]))
    else:
        host.op("open", "Datapath.open", key, uri=uri,
                persistent=rnd.random() < 0.5)


def check_data(host, key):
    """The data of an attached VDI is what the model says."""
    vdi = host.model["vdis"][key]
    if vdi["hash"] is None:
        return
    try:
        got = read_hash(vdi["dp"]["path"])
    except AssertionError as exc:
        host.problem("cannot read %s: %s" % (key, exc))
        return
    host.book.hashes_checked += 1
    if got != vdi["hash"]:
        host.book.lost["bytes"] += 1
        host.problem("%s %s: data differs from what was written" % (
            "snapshot" if vdi["snapshot"] else "VDI", key))


def compare_listing(host, listed, model):
    """During the burst nothing is in flight: SR.ls is exactly the
    model."""
    seen = dict((v["key"], v) for v in listed)
    for key, vdi in sorted(model["vdis"].items()):
        vol = seen.get(key)
        if vol is None:
            host.problem("SR.ls lacks VDI %s" % key)
            continue
        for what, want, got in (("name", vdi["name"], vol["name"]),
                                ("size", vdi["size"], vol["virtual_size"]),
                                ("keys", vdi["keys"], plain(vol["keys"])),
                                ("read_write", not vdi["snapshot"],
                                 vol["read_write"])):
            if want != got:
                host.problem("SR.ls: %s of %s is %r, not %r" % (
                    what, key, got, want))
    for key in sorted(set(seen) - set(model["vdis"])):
        host.problem("SR.ls lists VDI %s nobody made" % key)


# --- the check after the reboot --------------------------------------------------

def zfs_rows(sr, meta):
    cols = ["name", "type", "origin", "usedds", "clones", "defer_destroy",
            meta.VDI_UUID, meta.DATAPATH_CLONE, meta.CBT_BOOKMARK,
            meta.SR_UUID, meta.SR_OWNER]
    out = sh("zfs", "list", "-Hp", "-t", "all", "-r", "-o", ",".join(cols),
             sr)
    rows = []
    for line in out.splitlines():
        cells = line.split("\t")
        rows.append(dict((c, None if v == "-" else v)
                         for c, v in zip(cols, cells)))
    return rows


def check(host, rnd, records, sitelib):
    """After the reboot: PBD plug, scan, invariants; returns the model as
    it now is (the truth adopted where a call in flight may have gone
    either way), and the cut's description."""
    sys.path.insert(0, sitelib)
    from zfsng import collect, meta   # the installed copies

    book = host.book
    config, m0, inflight, last, burst_rec = replay(records)
    cut = {"in_flight": _describe(inflight), "last_returned":
           _describe(last),
           "delay": burst_rec.get("delay") if burst_rec else None,
           "burst_iteration": burst_rec.get("iteration")
           if burst_rec else None}
    book.note("cut: in flight %s; last returned %s" % (
        cut["in_flight"], cut["last_returned"]))
    # the burst's own counts and problems (kept in the journal)
    it = burst_rec.get("iteration") if burst_rec else None
    started = {}
    for rec in records:
        if rec.get("iteration") != it:
            continue
        if rec.get("ev") == "started" and \
                rec["method"].startswith(CALL_METHODS):
            book.calls[rec["method"]] = book.calls.get(rec["method"], 0) + 1
            started[rec["n"]] = rec
        elif rec.get("ev") == "returned" and rec.get("error") and \
                rec["n"] in started:
            name = rec["error"]
            book.errors[name] = book.errors.get(name, 0) + 1
        elif rec.get("ev") == "problem":
            book.problems.append("during the burst: " + rec["text"])

    sr = book.call("SR.attach", configuration=config["configuration"])
    if sr != m0["sr"]:
        host.problem("SR.attach answered %r, not %r" % (sr, m0["sr"]))
    host.sr = sr
    health = book.call("SR.stat", sr=sr).get("health")
    if not health or health[0] != "Healthy":
        host.problem("SR.stat after the reboot: health %r" % (health,))
    listed = dict((v["key"], v) for v in book.call("SR.ls", sr=sr))

    # m1: the model had the call in flight returned
    m1 = None
    kind = inflight["op"] if inflight else None
    if inflight and kind not in ("create", "snapshot", "clone", "attach",
                                 "write", "ls", "stat", "stat-vdi"):
        m1 = apply(copy.deepcopy(m0), inflight, None)
    model = copy.deepcopy(m0)
    for key in sorted(set(m0["vdis"]) | set(m1["vdis"] if m1 else ())):
        want0 = m0["vdis"].get(key)
        want1 = m1["vdis"].get(key) if m1 else want0
        vol = listed.get(key)
        if vol is None:
            if want1 is None:     # a destroy in flight went through
                model["vdis"].pop(key, None)
                continue
            book.lost_vdi(key)
            model["vdis"].pop(key, None)
            continue
        if want0 is None:
            want0 = want1
        if want1 is None:         # a destroy in flight did not happen
            want1 = want0
        got = {"name": vol["name"], "size": vol["virtual_size"],
               "keys": plain(vol["keys"]), "snapshot": not vol["read_write"]}
        whole = [w for w in (want0, want1)
                 if dict((f, w[f]) for f in got) == got]
        if not whole:
            host.problem("VDI %s is neither as xapi knew it nor as the call "
                         "in flight would leave it (never half): %r" % (
                             key, got))
            for f in ("name", "size", "keys", "snapshot"):
                if got[f] != want0[f] and got[f] != want1[f]:
                    host.problem("VDI %s: %s is %r, xapi knew %r%s" % (
                        key, f, got[f], want0[f],
                        "" if want0[f] == want1[f] else
                        " or %r" % want1[f]))
            for k in sorted(set(want0["keys"]) & set(want1["keys"]) -
                            set(vol["keys"])):
                book.lost["keys"].append("%s:%s" % (key, k))
            if got["size"] < min(want0["size"], want1["size"]):
                host.problem("VDI %s is smaller than its last resize" % key)
        mine = model["vdis"].setdefault(key, copy.deepcopy(want0))
        mine.update(got)
    for key in sorted(set(listed) - set(m0["vdis"])):   # one, at most
        vol = listed[key]
        if kind in ("create", "snapshot", "clone") and \
                not _adopt(host, model, inflight, vol):
            continue
        if kind not in ("create", "snapshot", "clone"):
            host.problem("SR.ls lists VDI %s, which xapi never got (no "
                         "create in flight)" % key)
        kind = None   # one VDI at most
    # the next scan, then every dataset must be one zfs-ng knows
    listed2 = book.call("SR.ls", sr=sr)
    if sorted(v["key"] for v in listed2) != sorted(listed):
        host.problem("a second SR.ls differs from the first: %s vs %s" % (
            sorted(v["key"] for v in listed2), sorted(listed)))
    judge_datasets(host, sr, meta, collect, "after SR.attach and SR.ls",
                   at_rest=False)

    # the datapath: every VDI attached at the cut, again
    again = [k for k in ordered(model["vdis"])
             if model["vdis"][k]["dp"] is not None]
    if inflight and inflight["op"] in ("open", "attach") and \
            inflight["key"] in model["vdis"] and \
            inflight["key"] not in again:
        again.append(inflight["key"])
        vdi = model["vdis"][inflight["key"]]
        if inflight["op"] == "open":
            vdi["dp"] = {"persistent": inflight["args"]["persistent"],
                         "reset_hash": vdi["hash"], "domain": None}
        else:
            vdi["dp"] = {"persistent": None, "reset_hash": None,
                         "domain": inflight["args"]["domain"]}
    if inflight and inflight["op"] == "write" and \
            inflight["key"] in model["vdis"]:
        model["vdis"][inflight["key"]]["hash"] = None   # half may be there
    for key in again:
        restart(host, model, key, fresh=False)
    # a few others: their data (snapshots first)
    others = [k for k in ordered(model["vdis"]) if k not in again and
              model["vdis"][k]["hash"] is not None]
    rnd.shuffle(others)
    others.sort(key=lambda k: not model["vdis"][k]["snapshot"])
    for key in others[:3]:
        restart(host, model, key, fresh=True)
    judge_datasets(host, sr, meta, collect, "after the datapath calls",
                   at_rest=True)
    return model, cut


def _adopt(host, model, op, vol):
    """A VDI the create (snapshot, clone) in flight made: it must be
    complete; xapi's scan introduces it."""
    src = model["vdis"].get(op.get("key"))
    want = {"create": (op["args"].get("name"), False,
                       op["args"].get("size")),
            "snapshot": (src and src["name"], True, src and src["size"]),
            "clone": (src and src["name"], False, src and src["size"])
            }[op["op"]]
    got = (vol["name"], not vol["read_write"], vol["virtual_size"])
    if got != want or plain(vol["keys"]):
        host.problem("VDI %s, made by the %s in flight, is not whole: %r "
                     "(want %r, no keys)" % (vol["key"], op["op"], vol,
                                             want))
        return False
    host.book.note("VDI %s: made by the %s in flight, kept" % (
        vol["key"], op["op"]))
    model["vdis"][vol["key"]] = {
        "name": vol["name"], "size": vol["virtual_size"], "keys": {},
        "snapshot": not vol["read_write"], "dp": None,
        "description": vol["description"],
        "hash": ZERO if op["op"] == "create" else (src or {}).get("hash")}
    _born(model, vol["key"])
    return True


def restart(host, model, key, fresh):
    """A VM start (or a dom0 attach) after the reboot: open as before,
    attach, activate, the data checked (a reset-on-boot disk is back at
    its reset point), then the shutdown: deactivate, detach, close. No
    call may fail."""
    book = host.book
    vdi = model["vdis"][key]
    dp = vdi["dp"] or {"persistent": None if vdi["snapshot"] else True,
                       "reset_hash": None, "domain": DOM0_DOMAIN}
    want = vdi["hash"]
    if dp.get("persistent") is False:
        want = dp["reset_hash"]
    domain = dp.get("domain") or DOM0_DOMAIN
    what = "%s %s (%s)" % ("snapshot" if vdi["snapshot"] else "VDI", key,
                           "attached at the cut" if not fresh else "data")
    try:
        uri = book.call("Volume.stat", sr=host.sr, key=key)["uri"][0]
        if not vdi["snapshot"] and not fresh:
            book.call("Datapath.open", uri=uri,
                      persistent=dp.get("persistent") is not False)
        path = device_of(book.call("Datapath.attach", uri=uri,
                                   domain=domain), uri, domain)
        book.call("Datapath.activate_readonly" if vdi["snapshot"] else
                  "Datapath.activate", uri=uri, domain=domain)
        got = read_hash(path)
        if want is not None:
            book.hashes_checked += 1
            if got != want:
                book.lost["bytes"] += 1
                host.problem("%s: data differs%s" % (
                    what, " from its reset point" if
                    dp.get("persistent") is False else ""))
        vdi["hash"] = got
        book.call("Datapath.deactivate", uri=uri, domain=domain)
        book.call("Datapath.detach", uri=uri, domain=domain)
        if not vdi["snapshot"] and not fresh:
            book.call("Datapath.close", uri=uri)
    except (ledger.CallError, AssertionError) as exc:
        host.problem("%s: %s" % (what, exc))
        vdi["hash"] = None
    vdi["dp"] = None


def judge_datasets(host, sr, meta, collect, when, at_rest):
    """Every dataset of the pool is one meta calls zfs-ng's; nothing the
    collector would free is left (it ran at SR.attach); at rest (no
    attach, no reset pending) no datapath clone, reset point or stand-in
    either."""
    from zfsng.ownership import made_by_zfsng   # the installed copy
    rows = zfs_rows(sr, meta)
    present = dict((r["name"], r) for r in rows)
    for row in rows:
        if row["name"] == sr:
            if not meta.is_sr_root(sr, row):
                host.problem("%s: %s is not the SR's root" % (when, sr))
            continue
        if not made_by_zfsng(row, sr):
            host.problem("%s: %s (%s) is not a dataset zfs-ng knows" % (
                when, row["name"], row["type"]))
    vols = [r for r in rows if r["type"] in ("volume", "snapshot")]
    garbage = collect.garbage(vols)
    if garbage:
        host.problem("%s: left for the collector: %s" % (when, garbage))
    if not at_rest:
        return
    for row in rows:
        name = row["name"]
        if name.endswith(meta.CLONE_SUFFIX):
            host.problem("%s: datapath clone %s left" % (when, name))
        elif name.endswith("@" + meta.NONPERSISTENT_SNAPSHOT):
            host.problem("%s: reset point %s left" % (when, name))
        elif row["type"] == "volume" and meta.is_stand_in(row, present):
            host.problem("%s: stand-in %s left" % (when, name))


def _describe(op):
    if op is None:
        return None
    args = dict((k, v) for k, v in op["args"].items()
                if k not in ("sr", "configuration"))
    return {"op": op["op"], "method": op["method"], "key": op.get("key"),
            "args": args, "n": op["n"]}


# --- main --------------------------------------------------------------------------

def create_sr(book, journal, mirror):
    configuration = {"device": DISKS[0]} if not mirror else \
        {"vdev": "mirror %s %s" % tuple(DISKS)}
    stored = book.call("SR.create", uuid=str(uuid.uuid4()), name=SR_NAME,
                       description="power cuts", configuration=configuration)
    sr = book.call("SR.attach", configuration=stored)
    journal.write(ev="config", configuration=stored, sr=sr)
    model = new_model(sr, stored)
    journal.write(ev="model", model=model)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--base-seed", type=int, required=True)
    parser.add_argument("--iteration", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--create", action="store_true")
    parser.add_argument("--mirror", action="store_true")
    parser.add_argument("--check-only", action="store_true")
    args = parser.parse_args()
    path = os.path.join(args.out, "journal.jsonl")
    journal = Journal(path)
    sitelib = os.path.join(args.root, SITELIB)
    rnd = random.Random("powercut-%d" % args.seed)
    ok = True
    journal.write(ev="boot", iteration=args.iteration, seed=args.seed,
                  boot_id=open("/proc/sys/kernel/random/boot_id").read()
                  .strip())
    if args.create:
        book = ledger.Ledger("powercut", args.seed, args.root)
        model = create_sr(book, journal, args.mirror)
    else:
        judged = args.iteration - 1
        records = Journal.read(path)
        # the ledger of the burst judged: its seed replays it
        book = ledger.Ledger("powercut", _seed_of(records, judged) or -1,
                             args.root)
        host = Host(book, None, None, judged)
        start = time.monotonic()
        try:
            model, cut = check(host, rnd, records, sitelib)
        except Exception:
            book.problem("the check stopped: %s" % traceback.format_exc())
            model, cut = None, {}
        result = book.result()
        result.update({"iteration": judged, "base_seed": args.base_seed,
                       "check_seed": args.seed,
                       "cut": cut, "zfs": sh("zfs", "version").split()[0],
                       "check_seconds": round(time.monotonic() - start, 1)})
        out = os.path.join(args.out, "powercut-%d-%d.json" % (
            args.base_seed, judged))
        with open(out, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
        ledger.log("iteration %d judged: %d problems, in flight at the cut: "
                   "%s", judged, len(result["problems"]), cut.get("in_flight"))
        ok = not result["problems"]
        if model is None:
            return 1
        journal.write(ev="model", model=model, iteration=args.iteration)
    if args.check_only:
        return 0 if ok else 1
    book = ledger.Ledger("powercut", args.seed, args.root)
    host = Host(book, journal, model, args.iteration)
    delay = random.Random("cut-%d" % args.seed).uniform(*CUT_DELAY)
    journal.write(ev="burst", iteration=args.iteration, seed=args.seed,
                  delay=round(delay, 2))
    ledger.log("burst %d (seed %d): power cut in %.1f s", args.iteration,
               args.seed, delay)
    subprocess.Popen(["sh", "-c", "sleep %.2f; echo b >/proc/sysrq-trigger"
                      % delay], start_new_session=True)
    count = burst(host, rnd, time.monotonic() + delay + 300)
    ledger.log("burst %d: %d calls and no power cut", args.iteration, count)
    return 3


def _seed_of(records, iteration):
    for rec in records:
        if rec.get("ev") == "burst" and rec.get("iteration") == iteration:
            return rec.get("seed")
    return None


if __name__ == "__main__":
    sys.exit(main())
