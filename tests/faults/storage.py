"""Storage that fails under a working SR: the in-guest scenarios of the
fault campaign (campaign.py runs them; see its docstring).

Each scenario builds its own pool and SR through the plugin on device-
mapper maps over the guest's spare disks, so the fault is a table switched
at run time (``storage_rig.Dm``): the error target (a dead disk), a map
removed (a pulled disk), dm-delay (a slow disk), or a map over a small part
of a disk (a small pool to fill). Every plugin call goes through the
ledger, which counts it and its typed error; every judgment is a ledger
expectation, so one run reports everything a fault broke. Whatever
happens, the scenario ends by healing its maps and blanking the disks.

    mirror-loss  a mirror leg fails (error table), later is pulled; the SR
                 stays Healthy and serving, the admin is told, and after
                 the disk returns (or ``zpool replace``) every hash matches
    disk-loss    a single-disk pool suspends; every call xapi may send
                 comes back typed within its bound, no lock stays held,
                 and after ``zpool clear`` (an adopted pool) or a reboot
                 (a multihost pool, which OpenZFS does not resume: the
                 campaign cuts the power and ``after_reboot`` checks the
                 next boot) nothing was lost or half-made
    pool-full    thin VDIs fill a small pool; calls fail typed, keys and
                 names survive, destroys always work and give space back
    slow-disk    every I/O waits (dm-delay); calls finish in their bounds
                 or fail typed, and nothing is left half-done; no VDI of a
                 call that failed is listed, and the next call frees it
"""

import collections
import hashlib
import os
import random
import subprocess
import time

import storage_rig
from storage_rig import (MiB, RUN_DIR, STUCK, Dm, FakeXe, Image, Writer,
                         drop_caches, leaf_state, leaves, new_uuid,
                         pool_health, sh, sha, spare_disks, timed,
                         wait_health, wait_zvol, wipe_all, zvol)

# Errors no call may return: an untyped failure says nothing to the admin
# (InternalError is a bug; a bare ZfsError is a zfs failure whose text
# the plugin did not recognise); "hung" is a call past the ledger's bound.
UNTYPED = ("InternalError", "ZfsError", "hung")

LOST = ("FAULTED", "UNAVAIL", "REMOVED", "OFFLINE")   # a leaf ZFS gave up
SLACK = 60.0    # seconds a call may take beyond its bounds under TCG


class Scene(object):
    """One scenario's pool, SR and fake xe; ``with Scene(...) as scene``
    (or close()) leaves the disks blank whatever happened."""

    def __init__(self, book, rnd, pool, disks_needed):
        self.book, self.rnd, self.pool = book, rnd, pool
        self.disks = spare_disks()
        if len(self.disks) < disks_needed:
            raise AssertionError("%s needs %d spare disks, the guest has %s"
                                 % (book.scenario, disks_needed, self.disks))
        if storage_rig.WEDGED:
            raise AssertionError("not run: %s" % storage_rig.WEDGED)
        book.env["ZFSNG_RUN_DIR"] = RUN_DIR
        wipe_all(self.disks)
        log = "/tmp/xe-%s.log" % pool
        sh("rm", "-f", log)
        self.xe = FakeXe(log)
        self.uuid = self.sr = self.stored = None
        self.writers = []

    def make_sr(self, configuration):
        self.uuid = new_uuid()
        if "zpool" not in configuration:
            configuration = dict(configuration, **{"pool-name": self.pool})
        self.stored = self.book.call(
            "SR.create", uuid=self.uuid, name=self.pool,
            description="fault scenario %s" % self.book.scenario,
            configuration=configuration)
        self.sr = self.book.call("SR.attach", configuration=self.stored)
        return self.sr

    def create(self, size, name, **more):
        return self.book.call("Volume.create", sr=self.sr, name=name,
                              description="", size=size, sharable=False,
                              **more)

    def bounds(self, cmd, lock):
        """Lower the plugin's bounds (test hooks) for the next calls."""
        self.book.env["ZFSNG_CMD_TIMEOUT"] = str(cmd)
        self.book.env["ZFSNG_LOCK_WAIT"] = str(lock)

    def default_bounds(self):
        self.book.env.pop("ZFSNG_CMD_TIMEOUT", None)
        self.book.env.pop("ZFSNG_LOCK_WAIT", None)

    def listed(self):
        return dict((v["key"], v) for v in
                    self.book.call("SR.ls", sr=self.sr))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        for writer in self.writers:
            writer.stop.set()
        try:
            if not storage_rig.WEDGED:   # every zpool command would hang
                wipe_all(self.disks)
        finally:
            self.xe.remove()
            self.default_bounds()


def plain(keys):
    """A VDI's keys but its content_id, which zfs-ng sets itself (every
    VDI has one; zfsng/contentid.py): the keys xapi set."""
    return dict((k, v) for k, v in keys.items() if k != "content_id")


def judged(book, method, bound, what, **args):
    """Call method and judge it: within bound seconds, and either an
    answer or a typed error. Returns (result, error name or None)."""
    result, error, seconds = timed(book, method, bound=bound + 240, **args)
    book.note("%s %s: %s in %.1f s" % (method, what, error or "ok",
                                       seconds))
    book.expect(seconds <= bound, "%s %s took %.1f s (bound %.0f s)" % (
        method, what, seconds, bound))
    book.expect(error not in UNTYPED, "%s %s failed untyped: %s" % (
        method, what, error))
    return result, error


def wait_quiet(bound=180.0):
    """Wait until no zfs or zpool command runs (ones a bounded call left
    stuck in the kernel finish once the pool answers)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if subprocess.call(["pgrep", "-x", "zfs|zpool"],
                           stdout=subprocess.DEVNULL) != 0:
            return True
        time.sleep(2)
    return False


def sizes(rnd, count, low, high):
    return [rnd.randint(low, high) * MiB for _ in range(count)]


def check_hashes(book, images, what):
    drop_caches()
    book.hashes(dict((i.key, i.digest()) for i in images),
                dict((i.key, i.read_digest()) for i in images), what)


def status_clean(book, pool, what):
    """zpool status -x has nothing to say about the pool, and no data
    errors."""
    text = sh("zpool", "status", "-x", pool, check=False, timeout=60)
    book.expect("is healthy" in text, "%s: zpool status -x: %s" % (
        what, text.strip()))
    full = sh("zpool", "status", "-v", pool, check=False, timeout=60)
    book.expect("No known data errors" in full,
                "%s: zpool status: %s" % (what, full.strip()))
    return full


def scrub(book, pool, what):
    start = time.monotonic()
    sh("zpool", "scrub", "-w", pool, timeout=1200)
    full = sh("zpool", "status", pool, timeout=60)
    line = [ln.strip() for ln in full.splitlines() if "scan:" in ln]
    book.note("%s: scrub in %.0f s: %s" % (what, time.monotonic() - start,
                                          line[0] if line else full))
    book.expect(bool(line) and "with 0 errors" in line[0],
                "%s: the scrub found errors: %s" % (what, full))
    status_clean(book, pool, what + " after the scrub")


# --- mirror-loss --------------------------------------------------------------

def mirror_loss(book, rnd, quick):
    with Scene(book, rnd, "fmirror", 3) as scene:
        _mirror_loss(book, rnd, quick, scene)


def _mirror_loss(book, rnd, quick, scene):
    legs = {"a": Dm("a", scene.disks[0]).create(),
            "b": Dm("b", scene.disks[1]).create()}
    spare = scene.disks[2]
    sr = scene.make_sr({"vdev": "mirror %s %s" % (legs["a"].path,
                                                  legs["b"].path)})
    count = rnd.randint(2, 3) if quick else rnd.randint(3, 6)
    images = []
    data_rnd = random.Random(rnd.random())
    for n, size in enumerate(sizes(rnd, count, 4, 8) if quick else
                             sizes(rnd, count, 8, 32)):
        vol = scene.create(size, "m%d" % n)
        image = Image(sr, vol["key"], size)
        image.fill(data_rnd)
        images.append(image)
    check_hashes(book, images, "before any fault")
    rounds = ["error"] if quick else ["error", "pull"]
    degraded_sent = 0
    for number, kind in enumerate(rounds, 1):
        name = rnd.choice(sorted(k for k, d in legs.items()
                                 if d.table == "linear"))
        leg = legs[name]
        what = "round %d (%s of leg %s)" % (number, kind, leg.name)
        writer = Writer(images, random.Random(rnd.random()), pause=0.05)
        scene.writers.append(writer)
        writer.start()
        time.sleep(2)
        if kind == "error":
            leg.error()
            book.fault("%s: mirror leg %s's table switched to error while "
                       "a writer writes" % (what, leg.path))
        else:
            leg.pull()
            book.fault("%s: mirror leg %s removed (dmsetup remove --force)"
                       " while a writer writes" % (what, leg.path))
        start = time.monotonic()
        while True:
            health = pool_health(scene.pool)
            state = leaf_state(scene.pool, leg.path)
            if health == "DEGRADED" or state in LOST or \
                    time.monotonic() - start > 240:
                break
            time.sleep(1)
        book.note("%s: after %.0f s zpool says the pool is %s, the leg %s"
                  % (what, time.monotonic() - start, health, state))
        if not book.expect(state in LOST, "%s: ZFS still uses the leg (%s)"
                           % (what, state)):
            book.note(sh("zpool", "status", scene.pool, check=False))
        answer, error = judged(book, "SR.stat", SLACK, what, sr=sr)
        if answer:
            book.expect(answer["health"][0] == "Healthy" and
                        "DEGRADED" in answer["health"][1],
                        "%s: SR.stat health %s" % (what, answer["health"]))
        degraded_sent += 1
        sent = scene.xe.messages(degraded_sent + number - 1)
        if sent is not None:
            book.expect([m.get("name") for m in sent].count(
                "ZFSNG_POOL_DEGRADED") == degraded_sent and all(
                    m.get("sr-uuid") == scene.uuid for m in sent),
                "%s: the admin was not told: xe got %s" % (what, sent))
        _serve_while_degraded(book, scene, images, what)
        book.expect(writer.finish(), "%s: the writer did not stop" % what)
        book.expect(not writer.errors, "%s: writes failed on the degraded "
                    "mirror: %s" % (what, writer.errors[:5]))
        book.note("%s: %d blocks written meanwhile" % (what, writer.writes))

        start = time.monotonic()
        if kind == "error":
            leg.linear()
            sh("zpool", "clear", scene.pool, timeout=300)
            sh("zpool", "online", scene.pool, leg.path, check=False,
               timeout=300)
            book.note("%s: table back to linear, zpool clear and online" %
                      what)
        else:
            sh("zpool", "replace", scene.pool, leg.path, spare, timeout=300)
            book.note("%s: zpool replace %s %s" % (what, leg.path, spare))
        sh("zpool", "wait", "-t", "resilver", scene.pool, timeout=900)
        health, _ = wait_health(scene.pool, ("ONLINE",), 120)
        book.note("%s: resilvered, pool %s, in %.0f s" % (
            what, health, time.monotonic() - start))
        book.expect(health == "ONLINE", "%s: pool %s after the resilver" %
                    (what, health))
        if kind == "pull":
            book.expect(all(not p.startswith(leg.path)
                            for p in leaves(scene.pool)),
                        "%s: the pulled leg is still in the pool" % what)
        status_clean(book, scene.pool, what)
        check_hashes(book, images, what + " after the resilver")
        scrub(book, scene.pool, what)
        check_hashes(book, images, what + " after the scrub")
        answer, _ = judged(book, "SR.stat", SLACK, what + " healed", sr=sr)
        if answer:
            book.expect(answer["health"] == ["Healthy", ""],
                        "%s: SR.stat health after the resilver: %s" % (
                            what, answer["health"]))
        sent = scene.xe.messages(degraded_sent + number)
        if sent is not None:
            book.expect(sent and sent[-1].get("name") == "ZFSNG_POOL_ONLINE",
                        "%s: no ZFSNG_POOL_ONLINE after the resilver: %s"
                        % (what, sent))
    listed = scene.listed()
    for image in images:
        if image.key not in listed:
            book.lost_vdi(image.key)


def _serve_while_degraded(book, scene, images, what):
    """Every change an admin makes works on the DEGRADED mirror."""
    sr = scene.sr
    listed, error = judged(book, "SR.ls", SLACK, what, sr=sr)
    if listed is not None:
        keys = set(v["key"] for v in listed)
        for image in images:
            if image.key not in keys:
                book.lost_vdi(image.key)
    target = scene.rnd.choice(images)
    made = []
    vol, error = judged(book, "Volume.create", SLACK, what, sr=sr,
                        name="degraded", description="", size=2 * MiB,
                        sharable=False)
    book.expect(error is None, "%s: Volume.create failed: %s" % (what,
                                                                 error))
    if vol:
        made.append(vol["key"])
    snap, error = judged(book, "Volume.snapshot", SLACK, what, sr=sr,
                         key=target.key)
    book.expect(error is None, "%s: Volume.snapshot failed: %s" % (
        what, error))
    if snap:
        made.append(snap["key"])
        clone, error = judged(book, "Volume.clone", SLACK, what, sr=sr,
                              key=snap["key"])
        book.expect(error is None, "%s: Volume.clone failed: %s" % (
            what, error))
        if clone:
            made.insert(0, clone["key"])
    _, error = judged(book, "Volume.set", SLACK, what, sr=sr,
                      key=target.key, k="degraded", v=what)
    book.expect(error is None, "%s: Volume.set failed: %s" % (what, error))
    stat, _ = judged(book, "Volume.stat", SLACK, what, sr=sr,
                     key=target.key)
    if stat:
        book.expect(stat["keys"].get("degraded") == what,
                    "%s: the key written reads back as %s" % (
                        what, stat["keys"]))
    for key in made:
        _, error = judged(book, "Volume.destroy", SLACK, what, sr=sr,
                          key=key)
        book.expect(error is None, "%s: Volume.destroy failed: %s" % (
            what, error))


# --- disk-loss ------------------------------------------------------------------

CMD_BOUND = 10      # ZFSNG_CMD_TIMEOUT while the pool is suspended
LOCK_BOUND = 10     # ZFSNG_LOCK_WAIT


def disk_loss(book, rnd, quick):
    """Two pools lose their only disk: an admin's pool adopted by the SR
    (multihost off, as zpool create makes it; not in the quick run),
    where ``zpool clear`` resumes the pool, and a pool zfs-ng created,
    with multihost on, last: OpenZFS does not resume such a pool (see
    _heal_by_clear), and then no zpool command works until a reboot, which
    the campaign gives it (``AFTER_REBOOT``)."""
    kinds = ["multihost"] if quick else ["adopted", "multihost"]
    for kind in kinds:
        with Scene(book, rnd, "fadopt" if kind == "adopted" else "fdisk",
                   1) as scene:
            _disk_loss(book, rnd, quick, scene, kind)


def _disk_loss(book, rnd, quick, scene, kind):
    # the multihost pool on the last disk: if OpenZFS cannot resume it, it
    # keeps that disk only
    disk = Dm("d", scene.disks[-1 if kind == "multihost" else 0]).create()
    if kind == "adopted":
        sh("zpool", "create", "-f", "-o", "cachefile=none", "-m", "none",
           scene.pool, disk.path, timeout=300)
        sr = scene.make_sr({"zpool": scene.pool})
    else:
        sr = scene.make_sr({"device": disk.path})
    book.note("%s pool %s: multihost %s" % (kind, scene.pool, sh(
        "zpool", "get", "-H", "-o", "value", "multihost",
        scene.pool).strip()))
    data_rnd = random.Random(rnd.random())
    count = 3 if quick else rnd.randint(3, 4)
    images, model = [], {}
    for n, size in enumerate(sizes(rnd, count, 4, 8) if quick else
                             sizes(rnd, count, 8, 16)):
        vol = scene.create(size, "d%d" % n)
        image = Image(sr, vol["key"], size)
        image.fill(data_rnd)
        images.append(image)
        token = "%08x" % rnd.getrandbits(32)
        book.call("Volume.set", sr=sr, key=vol["key"], k="fault", v=token)
        model[vol["key"]] = {"name": "d%d" % n, "size": vol["virtual_size"],
                             "keys": {"fault": token}}
    snap = book.call("Volume.snapshot", sr=sr, key=images[0].key)
    model[snap["key"]] = {"name": "d0", "size": images[0].size, "keys": {}}
    chain = _cbt_chain(book, sr, images[0], data_rnd, model)
    check_hashes(book, images, "before the fault")
    _cold_cache(book, scene, images)
    book.call("SR.stat", sr=sr)     # the answer kept for a dead pool

    # the last VDI gets new data while the disk dies: dd waits in the
    # kernel (failmode=wait) and finishes once the pool is back
    victim = images[-1]
    new = data_rnd.randbytes(victim.size)
    with open("/tmp/fdisk-new", "wb") as f:
        f.write(new)
    disk.error()
    book.fault("the pool's only disk %s switched to the error target" %
               disk.path)
    writer = subprocess.Popen(
        ["dd", "if=/tmp/fdisk-new", "of=" + zvol(sr, victim.key), "bs=1M",
         "oflag=direct", "conv=fsync", "status=none"],
        stderr=subprocess.PIPE)
    health, seconds = wait_health(scene.pool, ("SUSPENDED",), 240)
    book.note("pool %s %.0f s after the disk died" % (health, seconds))
    book.expect(health == "SUSPENDED", "the pool is %s, not SUSPENDED" %
                health)

    scene.bounds(CMD_BOUND, LOCK_BOUND)
    bound = LOCK_BOUND + 3 * CMD_BOUND + SLACK
    what = "on the suspended %s pool" % kind
    target, other = images[0].key, images[1].key
    results = {}

    def call(method, **args):
        result, error = judged(book, method, bound, what, sr=sr, **args)
        results[method] = error
        return result, error

    answer, error = call("SR.stat")
    if answer:
        book.expect(answer["health"][0] == "Unavailable",
                    "SR.stat %s: health %s" % (what, answer["health"]))
    call("SR.ls")
    made = []
    for method, args in [
            ("Volume.create", {"name": "new", "description": "",
                               "size": 2 * MiB, "sharable": False}),
            ("Volume.snapshot", {"key": target}),
            ("Volume.clone", {"key": target})]:
        result, error = call(method, **args)
        if result:
            made.append(result["key"])
            model[result["key"]] = {"name": result["name"],
                                    "size": result["virtual_size"],
                                    "keys": {}}
    _, error = call("Volume.destroy", key=other)
    if error is None:
        model.pop(other)
        images = [i for i in images if i.key != other]
    _, error = call("Volume.set", key=target, k="second", v="2")
    if error is None:
        model[target]["keys"]["second"] = "2"
    _, error = call("Volume.unset", key=target, k="fault")
    if error is None:
        model[target]["keys"].pop("fault")
    _, error = call("Volume.set_name", key=target, new_name="renamed")
    if error is None:
        model[target]["name"] = "renamed"
    grown = model[target]["size"] + 4 * MiB
    _, error = call("Volume.resize", key=target, new_size=grown)
    if error is None:
        model[target]["size"] = grown
    call("Volume.stat", key=target)
    _stream_calls(book, call, target, chain, what)
    _, detach_error = call("SR.detach")
    # no lock stays held: a later call that needs the SR lock is refused
    # for the pool, not for a lock (SrBusy) forever
    for attempt in range(3):
        _, error = call("Volume.set_description", key=target,
                        new_description="x")
        if error != "SrBusy":
            break
        time.sleep(LOCK_BOUND)
    book.expect(error != "SrBusy", "the SR lock stays held: %s" % error)
    book.note("errors %s: %s" % (what, sorted(results.items())))
    scene.default_bounds()

    disk.linear()
    if not _heal_by_clear(book, scene, kind):
        if kind == "multihost":
            _reboot_later(book, scene, model, images, victim, new, writer)
        else:
            writer.kill()
        return
    try:
        _, err = writer.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        writer.kill()
        err = b"still writing after 300 s"
    if writer.returncode == 0:
        victim.data[:] = new
    else:
        images = [i for i in images if i.key != victim.key]
        book.note("the write during the fault failed (%s): %s's data not "
                  "checked" % (err.decode().strip(), victim.key))
    quiet = wait_quiet()
    book.expect(quiet, "zfs commands left by bounded calls still run")
    if detach_error is None or pool_health(scene.pool) == "":
        book.expect(detach_error is None,
                    "SR.detach failed (%s) but the pool is exported" %
                    detach_error)
        sr2, error = judged(book, "SR.attach", 300, "after the heal",
                            configuration=scene.stored)
        book.expect(sr2 == sr, "SR.attach after the heal: %s %s" % (
            sr2, error))
    _judge_back(book, sr, scene.pool, model, "after the heal",
                lambda listed: check_hashes(book, images, "after the heal"))


def _cbt_chain(book, sr, image, rnd, model):
    """(first, second): two CBT snapshots of image's VDI, all of it
    written again between them; first is the first of its chain, with no
    allocation map yet."""
    book.call("Volume.enable_cbt", sr=sr, key=image.key)
    first = book.call("Volume.snapshot", sr=sr, key=image.key)
    image.fill(rnd)
    second = book.call("Volume.snapshot", sr=sr, key=image.key)
    for snap in (first, second):
        model[snap["key"]] = {"name": model[image.key]["name"],
                              "size": image.size, "keys": {}}
    return first["key"], second["key"]


def _cold_cache(book, scene, images):
    """The SR detached and attached again: its pool exported and imported,
    so the ARC holds none of its data (only the metadata the listing
    reads back), and the zfs sends of _stream_calls read the dead disk."""
    book.call("SR.detach", sr=scene.sr)
    book.call("SR.attach", configuration=scene.stored)
    scene.listed()
    for image in images:
        wait_zvol(scene.sr, image.key)


def _stream_calls(book, call, target, chain, what):
    """The calls that read a zfs send stream as it comes (runner.stream):
    a list to the live disk and between two snapshots from the first of a
    chain, and the data_destroy of that first snapshot (it has no map:
    one is made from a full send). A send stuck in the kernel survives its
    kill and keeps its stdout open: the call must still return, typed."""
    first, second = chain
    call("Volume.list_changed_blocks", key=first, key2=target, offset=0,
         length=-1)
    call("Volume.list_changed_blocks", key=first, key2=second, offset=0,
         length=-1)
    call("Volume.data_destroy", key=first)
    running = subprocess.run(["pgrep", "-a", "-x", "zfs|zdb"],
                             stdout=subprocess.PIPE).stdout.decode()
    book.note("commands left running %s after the stream calls: %s" % (
        what, "; ".join(running.splitlines()) or "none"))


def _judge_back(book, sr, pool, model, what, check_data):
    """The SR once its pool is back (what: after the heal, after the
    reboot): Healthy, every VDI of the model as it was, none a failed
    call made, the data (check_data(listed)), a clean scrub, and calls
    that work again."""
    # reads that failed while the disk was dead stay in ZFS's error log
    # ("permanent errors") until a scrub reads the blocks again: Healthy,
    # saying so, until the scrub below
    answer, _ = judged(book, "SR.stat", SLACK, what, sr=sr)
    if answer:
        book.expect(answer["health"][0] == "Healthy",
                    "SR.stat %s: %s" % (what, answer["health"]))
        book.note("SR.stat %s: %s" % (what, answer["health"]))
    listed = dict((v["key"], v) for v in book.call("SR.ls", sr=sr))
    _check_model(book, model, listed, what)
    extra = sorted(set(listed) - set(model))
    book.expect(not extra, "VDIs made by calls that failed are listed: %s"
                % [(k, listed[k]["name"]) for k in extra])
    check_data(listed)
    scrub(book, pool, what)
    answer, _ = judged(book, "SR.stat", SLACK, "after the scrub", sr=sr)
    if answer:
        book.expect(answer["health"] == ["Healthy", ""],
                    "SR.stat after the scrub: %s" % answer["health"])
    # everything works again
    vol = book.call("Volume.create", sr=sr, name="after", description="",
                    size=MiB, sharable=False)
    snap = book.call("Volume.snapshot", sr=sr, key=vol["key"])
    book.call("Volume.destroy", sr=sr, key=snap["key"])
    book.call("Volume.destroy", sr=sr, key=vol["key"])


def _heal_by_clear(book, scene, kind):
    """zpool clear, bounded: whether the pool is ONLINE again.

    On a pool with multihost on, OpenZFS 2.1 refuses the clear outright
    (zfs_ioc_clear: EINVAL for any suspended multihost pool). Later
    versions first look for another host's writes, and may take MMP's own
    for them (openzfs/zfs issue 19033) or hang in that look (issue 19036;
    seen on 2.3, in vdev_uberblock_load under spa_mmp_remote_host_activity):
    then the pool stays SUSPENDED, holds its disk, and every later zpool
    command blocks, until the host reboots. A clear that works answers in
    seconds, so the multihost pool's is given 60 s, not 180."""
    start = time.monotonic()
    error = ""
    try:
        sh("zpool", "clear", scene.pool,
           timeout=60 if kind == "multihost" else 180)
    except AssertionError as exc:
        error = str(exc)
    health, _ = wait_health(scene.pool, ("ONLINE",), 0 if error else 300)
    book.note("%s pool: table back to linear, zpool clear %s, pool %s "
              "after %.0f s" % (kind, error or "ok", health or "(no answer)",
                                time.monotonic() - start))
    if health == "ONLINE":
        return True
    # OpenZFS 2.1 refuses to resume any suspended multihost pool
    # (zfs_ioc_clear: EINVAL); later versions check for another host first,
    # and that check may hang: what the README tells the admin, a reboot,
    # is then the way back, and the next boot is judged on it
    (book.note if kind == "multihost" else book.problem)(
        "the %s pool is not resumed: zpool clear: %s; pool %s" % (
            kind, error or "ok", health or "(no answer)"))
    storage_rig.WEDGED = "pool %s of %s could not be resumed (%s)" % (
        scene.pool, book.scenario, error or health)
    return False


# What the next boot checks (after_reboot) once the campaign has cut the
# power of a host whose multihost pool OpenZFS would not resume: set by
# disk-loss, written and acted on by campaign.py.
AFTER_REBOOT = {}


def _reboot_later(book, scene, model, images, victim, new, writer):
    """Leave the host to the reboot the admin is told to do. A clean
    reboot would wait on the suspended pool's I/O, so it is a power cut,
    once every scenario has run. The write in flight at the fault is
    judged only if its fsync returned (then its data must be there)."""
    digests = dict((i.key, i.digest()) for i in images if i is not victim)
    if writer.poll() == 0:
        digests[victim.key] = hashlib.sha256(new).hexdigest()
    else:
        book.note("the write during the fault never returned: %s's data "
                  "is not checked after the reboot" % victim.key)
    AFTER_REBOOT.update({
        "scenario": book.scenario + "-reboot", "seed": book.seed,
        "pool": scene.pool, "sr": scene.sr, "configuration": scene.stored,
        "model": model, "digests": digests,
        "sizes": dict((i.key, i.size) for i in images)})
    book.note("the host needs a reboot: its power is cut once every "
              "scenario has run, and the next boot checks the SR")


def after_reboot(book, pending):
    """The boot after disk-loss's power cut, the disk back: what xapi does
    (the PBD plug, SR.stat, the scan) finds every VDI with its name, size
    and keys, the data written before the fault, no VDI of a failed call,
    and an SR that works; a scrub finds nothing wrong."""
    pool, sr = pending["pool"], pending["sr"]
    book.fault("power cut of the host whose multihost pool %s was "
               "suspended, its disk back; booted again" % pool)
    book.env["ZFSNG_RUN_DIR"] = RUN_DIR
    xe = FakeXe("/tmp/xe-%s.log" % pool)
    try:
        book.expect(pool_health(pool) == "", "pool %s was imported at boot "
                    "(zfs-ng's pools have no cachefile)" % pool)
        got, error = judged(book, "SR.attach", 300, "after the reboot",
                            configuration=pending["configuration"])
        if not book.expect(got == sr, "SR.attach after the reboot: %s %s"
                           % (got, error)):
            return
        _judge_back(book, sr, pool, pending["model"], "after the reboot",
                    lambda listed: _check_digests(book, sr, pending, listed))
    finally:
        xe.remove()


def _check_digests(book, sr, pending, listed):
    drop_caches()
    book.hashes(pending["digests"], dict(
        (key, _read_digest(sr, key, pending["sizes"][key]))
        for key in pending["digests"] if key in listed), "after the reboot")


def _read_digest(sr, key, size):
    try:
        return sha(wait_zvol(sr, key), size)
    except AssertionError:      # its device never came: counted as lost
        return None


# --- pool-full ------------------------------------------------------------------

POOL_MIB = 256      # the small pool: a map over the first MiBs of a disk


def pool_full(book, rnd, quick):
    with Scene(book, rnd, "ffull", 1) as scene:
        _pool_full(book, rnd, quick, scene)


class Filler(object):
    """Writes a VDI from its start, MiB after MiB, until a write fails;
    keeps the hash of the prefix written."""

    def __init__(self, sr, key, size, blocks, rnd):
        self.sr, self.key, self.size = sr, key, size
        self.blocks, self.rnd = blocks, rnd
        self.written = 0
        self.error = None
        self.digest = None

    def run(self, deadline):
        import hashlib
        from storage_rig import DirectFile
        digest = hashlib.sha256()
        f = DirectFile(wait_zvol(self.sr, self.key))
        try:
            while self.written < self.size and time.monotonic() < deadline:
                data = self.rnd.choice(self.blocks)
                try:
                    f.write(self.written, data)
                except OSError as exc:
                    self.error = exc
                    break
                digest.update(data)
                self.written += MiB
        finally:
            f.close()
        self.digest = digest.hexdigest()


def _pool_full(book, rnd, quick, scene):
    import threading
    disk = Dm("full", scene.disks[0], sectors=POOL_MIB * MiB // 512).create()
    sr = scene.make_sr({"device": disk.path})
    stat = book.call("SR.stat", sr=sr)
    book.note("a %d MiB pool: SR.stat total %.0f MiB, free %.0f MiB" % (
        POOL_MIB, stat["total_space"] / MiB, stat["free_space"] / MiB))
    count = 3 if quick else rnd.randint(3, 5)
    model = {}
    fillers = []
    blocks = [rnd.randbytes(MiB) for _ in range(8)]
    for n, size in enumerate(sizes(rnd, count, 128, 256)):
        vol = scene.create(size, "f%d" % n)
        token = "%08x" % rnd.getrandbits(32)
        book.call("Volume.set", sr=sr, key=vol["key"], k="fault", v=token)
        model[vol["key"]] = {"name": "f%d" % n, "keys": {"fault": token},
                             "size": vol["virtual_size"]}
        fillers.append(Filler(sr, vol["key"], size, blocks,
                              random.Random(rnd.random())))
    first = fillers[0].key
    snap = book.call("Volume.snapshot", sr=sr, key=first)
    model[snap["key"]] = {"name": "f0", "keys": {}, "size":
                          model[first]["size"]}
    book.note("%d thin VDIs, %d MiB in all, on %.0f MiB free" % (
        count, sum(f.size for f in fillers) // MiB, stat["free_space"] / MiB))

    deadline = time.monotonic() + 600
    threads = [threading.Thread(target=f.run, args=(deadline,))
               for f in fillers]
    start = time.monotonic()
    book.fault("%d writers fill thin VDIs of %d MiB over a %d MiB pool" % (
        len(fillers), sum(f.size for f in fillers) // MiB, POOL_MIB))
    for t in threads:
        t.start()
    for t in threads:
        t.join(660)
    book.note("writers stopped after %.0f s: %s" % (
        time.monotonic() - start, ", ".join(
            "%d MiB (%s)" % (f.written // MiB, f.error) for f in fillers)))
    book.expect(any(f.error for f in fillers), "no writer met a full pool")
    avail = sh("zfs", "get", "-Hp", "-o", "value", "available", sr).strip()
    book.note("after the fill: available %s bytes" % avail)

    bound = 120 + SLACK
    what = "on the full pool"
    live = fillers[1].key
    errors = {}

    def call(method, **args):
        result, error = judged(book, method, bound, what, sr=sr, **args)
        errors[method] = error
        return result, error

    made = []
    answer, _ = call("SR.stat")
    if answer:
        book.note("SR.stat on the full pool: free %d bytes" %
                  answer["free_space"])
    listed, _ = call("SR.ls")
    if listed is not None:
        _check_model(book, model, dict((v["key"], v) for v in listed),
                     "SR.ls on the full pool")
    vol, _ = call("Volume.create", name="thin", description="",
                  size=64 * MiB, sharable=False)
    if vol:
        made.append(vol["key"])
    snapshot, _ = call("Volume.snapshot", key=live)
    if snapshot:
        made.append(snapshot["key"])
    clone, _ = call("Volume.clone", key=live)
    if clone:
        made.insert(0, clone["key"])
    before = model[live]["keys"]
    _, error = call("Volume.set", key=live, k="full", v="x" * 2000)
    if error is None:
        model[live]["keys"] = dict(before, full="x" * 2000)
    got, _ = call("Volume.stat", key=live)
    if got:
        book.expect(plain(got["keys"]) == model[live]["keys"],
                    "after Volume.set (%s) the keys are %s" % (
                        error or "ok", got["keys"]))
    # ZFS lets property changes use half its reserve (slop), so the key
    # write above may work on the full pool: one that must fail (too big
    # for a user property) changes nothing either
    _, error = call("Volume.set", key=live, k="big", v="y" * 9000)
    book.expect(error is not None, "a 9000-byte key was accepted")
    got, _ = call("Volume.stat", key=live)
    if got:
        book.expect(plain(got["keys"]) == model[live]["keys"],
                    "after a refused Volume.set (%s) the keys are %s" % (
                        error, got["keys"]))
    _, error = call("Volume.set_name", key=live, new_name="renamed")
    if error is None:
        model[live]["name"] = "renamed"
    grown = model[live]["size"] + 64 * MiB
    _, error = call("Volume.resize", key=live, new_size=grown)
    if error is None:
        model[live]["size"] = grown
    # a thick VDI on the same full pool: the SR's provisioning as an
    # admin's thick SR has it (the property zfs-ng reads at each create)
    prov = "org.xcp-ng.zfs-ng:provisioning"
    sh("zfs", "set", prov + "=thick", sr, check=False, timeout=60)
    if sh("zfs", "get", "-H", "-o", "value", prov, sr, check=False,
          timeout=60).strip() == "thick":
        thick, error = call("Volume.create", name="thick", description="",
                            size=64 * MiB, sharable=False)
        book.note("thick Volume.create %s: %s" % (what, error or "ok"))
        if thick:
            made.append(thick["key"])
        sh("zfs", "set", prov + "=thin", sr, check=False, timeout=60)
    else:
        book.note("zfs set provisioning=thick refused on the full pool")
    book.note("errors %s: %s" % (what, sorted(errors.items())))
    listed = scene.listed()
    _check_model(book, model, listed, "after the calls on the full pool")

    # destroys always work, and give the space back
    free = book.call("SR.stat", sr=sr)["free_space"]
    survivor = max(fillers[1:], key=lambda f: f.written)
    doomed = made + [k for k in model if k != survivor.key]
    rnd.shuffle(doomed)
    for key in doomed:
        _, error = judged(book, "Volume.destroy", bound, what, sr=sr,
                          key=key)
        book.expect(error is None, "Volume.destroy %s on the full pool: %s"
                    % (key, error))
        if error is None:
            model.pop(key, None)
    deadline = time.monotonic() + 120
    while True:
        now = book.call("SR.stat", sr=sr)["free_space"]
        if now > free + 16 * MiB or time.monotonic() > deadline:
            break
        time.sleep(3)
    book.note("after the destroys: free %.0f MiB (was %.0f)" % (
        now / MiB, free / MiB))
    book.expect(now > free + 16 * MiB, "destroys gave no space back: "
                "free %d, was %d" % (now, free))
    # ZFS reuses freed blocks only some txgs later (deferred frees): a
    # create at once may still be refused; after the pool synced it works
    vol, error = book.attempt("Volume.create", sr=sr, name="again",
                              description="", size=8 * MiB, sharable=False)
    if vol is None:
        book.note("Volume.create right after the destroys: %s (free_space "
                  "%d); again after zpool sync" % (error, now))
        sh("zpool", "sync", scene.pool, timeout=120)
        sh("zpool", "sync", scene.pool, timeout=120)
        vol, error = book.attempt("Volume.create", sr=sr, name="again",
                                  description="", size=8 * MiB,
                                  sharable=False)
    book.expect(vol is not None, "Volume.create fails after the destroys "
                "and a zpool sync: %s" % error)
    if vol:
        snap, error = book.attempt("Volume.snapshot", sr=sr, key=vol["key"])
        book.expect(error is None, "Volume.snapshot fails after the "
                    "destroys: %s" % error)
        book.call("Volume.destroy", sr=sr, key=vol["key"])
        if snap:
            book.call("Volume.destroy", sr=sr, key=snap["key"])
    listed = scene.listed()
    _check_model(book, model, listed, "at the end")
    drop_caches()
    book.hashes({survivor.key: survivor.digest},
                {survivor.key: sha(zvol(sr, survivor.key),
                                   survivor.written)},
                "the filled VDI's written part")
    status_clean(book, scene.pool, "at the end")


def _check_model(book, model, listed, what):
    for key, want in sorted(model.items()):
        got = listed.get(key)
        if got is None:
            book.lost_vdi(key)
            continue
        for k, v in want["keys"].items():
            if got["keys"].get(k) != v:
                book.lost_key(key, k)
        book.expect(plain(got["keys"]) == want["keys"], "%s: VDI %s keys "
                    "%s, want %s" % (what, key, got["keys"], want["keys"]))
        book.expect(got["name"] == want["name"], "%s: VDI %s named %r, "
                    "want %r" % (what, key, got["name"], want["name"]))
        book.expect(got["virtual_size"] == want["size"], "%s: VDI %s is "
                    "%d bytes, want %d" % (what, key, got["virtual_size"],
                                           want["size"]))


# --- slow-disk ------------------------------------------------------------------

# The plugin's bounds while the disk is slow: low enough that some commands
# (a clone's three, a create waiting for its txg) run past them
SLOW_CMD = 6      # ZFSNG_CMD_TIMEOUT
SLOW_LOCK = 10    # ZFSNG_LOCK_WAIT


def slow_disk(book, rnd, quick):
    with Scene(book, rnd, "fslow", 1) as scene:
        _slow_disk(book, rnd, quick, scene)


def _slow_disk(book, rnd, quick, scene):
    disk = Dm("s", scene.disks[0]).create()
    sr = scene.make_sr({"device": disk.path})
    live, snaps = {}, {}       # key -> name: what xapi was told exists
    for n in range(2):
        vol = scene.create(4 * MiB, "s%d" % n)
        live[vol["key"]] = vol["name"]
    ms = rnd.randint(200, 500)
    disk.delay(ms)
    book.fault("every I/O of the pool's disk waits %d ms (dm-delay)" % ms)
    scene.bounds(SLOW_CMD, SLOW_LOCK)
    bound = SLOW_LOCK + 4 * SLOW_CMD + SLACK
    what = "on the slow disk"
    ops = ["create", "snapshot", "clone", "set", "resize", "destroy",
           "stat", "ls"]
    # calls that failed but whose command may still finish in the kernel:
    # the names a VDI they made would carry, the VDIs they may destroy
    failed_names, maybe_gone = [], set()
    # of failed calls: the plugin's records, what they made on the pool;
    # every VDI a call returned
    seen = {"records": set(), "made": set(), "returned": set(live)}
    outcomes = []
    for step in range(8 if quick else 20):
        op = rnd.choice(ops)
        if op in ("snapshot", "set", "resize", "stat") and not live:
            op = "create"
        if op == "create":
            result, error = judged(book, "Volume.create", bound, what,
                                   sr=sr, name="c%d" % step, description="",
                                   size=4 * MiB, sharable=False)
            if result:
                live[result["key"]] = result["name"]
                seen["returned"].add(result["key"])
            else:
                failed_names.append("c%d" % step)
        elif op == "snapshot":
            source = rnd.choice(sorted(live))
            result, error = judged(book, "Volume.snapshot", bound, what,
                                   sr=sr, key=source)
            if result:
                snaps[result["key"]] = result["name"]
                seen["returned"].add(result["key"])
            else:
                failed_names.append(live[source])
        elif op == "clone":
            source = rnd.choice(sorted(live) + sorted(snaps))
            result, error = judged(book, "Volume.clone", bound, what,
                                   sr=sr, key=source)
            if result:
                live[result["key"]] = result["name"]
                seen["returned"].add(result["key"])
            else:
                failed_names.append(live.get(source) or snaps[source])
        elif op == "set":
            _, error = judged(book, "Volume.set", bound, what, sr=sr,
                              key=rnd.choice(sorted(live)), k="slow",
                              v=str(step))
        elif op == "resize":
            key = rnd.choice(sorted(live))
            _, error = judged(book, "Volume.resize", bound, what, sr=sr,
                              key=key, new_size=(8 + step) * MiB)
        elif op == "destroy":
            pool = sorted(live) + sorted(snaps)
            if not pool:
                continue
            key = rnd.choice(pool)
            _, error = judged(book, "Volume.destroy", bound, what, sr=sr,
                              key=key)
            if error is None:
                live.pop(key, None)
                snaps.pop(key, None)
            else:
                maybe_gone.add(key)
        elif op == "stat":
            _, error = judged(book, "Volume.stat", bound, what, sr=sr,
                              key=rnd.choice(sorted(live)))
        else:
            got, error = judged(book, "SR.ls", bound, what, sr=sr)
            extra = sorted(set(v["key"] for v in got or ()) -
                           set(live) - set(snaps))
            book.expect(not extra, "SR.ls %s lists %s, which no call that "
                        "returned made" % (what, extra))
        if error and op in ("create", "snapshot", "clone"):
            _after_failed_call(book, sr, bound, live, snaps, seen)
        outcomes.append("%s:%s" % (op, error or "ok"))
    # Calls of one command, the one that makes their VDI: a snapshot, and
    # a clone of a snapshot VDI. Any timeout of theirs may leave a VDI
    # behind (the random calls above mostly time out before that).
    for source in [k for k in sorted(live) if k not in maybe_gone][:2]:
        result, error = judged(book, "Volume.snapshot", bound, what, sr=sr,
                               key=source)
        outcomes.append("snapshot:%s" % (error or "ok"))
        if error:
            failed_names.append(live[source])
            _after_failed_call(book, sr, bound, live, snaps, seen)
            continue
        snaps[result["key"]] = result["name"]
        seen["returned"].add(result["key"])
        result, error = judged(book, "Volume.clone", bound, what, sr=sr,
                               key=result["key"])
        outcomes.append("clone:%s" % (error or "ok"))
        if error:
            failed_names.append(live[source])
            _after_failed_call(book, sr, bound, live, snaps, seen)
        else:
            live[result["key"]] = result["name"]
            seen["returned"].add(result["key"])
    book.note("calls %s: %s" % (what, " ".join(outcomes)))
    book.note("failed calls the plugin recorded (their VDI's command had "
              "run): %d; what they made, seen on the pool: %s" % (
                  len(seen["records"]), sorted(seen["made"])))
    scene.default_bounds()
    disk.linear()
    book.expect(wait_quiet(), "zfs commands left by bounded calls still "
                "run")
    _judge_leftovers(book, scene, live, snaps, failed_names, maybe_gone,
                     seen["returned"])


def _after_failed_call(book, sr, bound, live, snaps, seen):
    """Right after a create, snapshot or clone failed: what it made (its
    command may have finished in the kernel, or still run) is not listed;
    the plugin's records and the pool say whether it made anything."""
    seen["records"].update(_records(sr))
    seen["made"].update(_of_failed_calls(sr, seen["returned"]))
    got, error = judged(book, "SR.ls", bound, "after a failed call", sr=sr)
    extra = sorted(set(v["key"] for v in got or ()) - set(live) -
                   set(snaps))
    book.expect(not extra, "SR.ls right after a call failed lists %s, "
                "which no call that returned made" % extra)


def _leftovers(sr):
    """zfs-ng's half-done objects in the SR: internal clone snapshots not
    marked for deferred destroy, and hidden zvols nothing depends on."""
    rows = [line.split("\t") for line in sh(
        "zfs", "list", "-H", "-r", "-t", "all", "-o",
        "name,defer_destroy,org.xcp-ng.zfs-ng:vdi,origin,clones",
        sr).splitlines()]
    found = []
    for name, defer, vdi, origin, clones in rows:
        if "@zfsng-clone-" in name and defer != "on":
            found.append(name)
        if vdi == "destroyed" and "@" not in name:
            deps = [r for r in rows if r[0].startswith(name + "@")]
            if not deps:
                found.append(name)
    return found


# where the plugin records the VDIs of calls that failed (abandoned.DIR)
ABANDONED_DIR = "/var/lib/zfs-ng/abandoned"


def _of_failed_calls(sr, returned):
    """The datasets of sr that calls which failed made (their commands
    finished in the kernel after the plugin gave up on them): a VDI's
    zvol or snapshot (its own uuid in its vdi property) that no call
    returned, and a create's .new zvol."""
    found = []
    for line in sh("zfs", "list", "-H", "-r", "-t", "volume,snapshot",
                   "-o", "name,org.xcp-ng.zfs-ng:vdi", sr).splitlines():
        name, vdi = line.split("\t")
        own = name.rsplit("@", 1)[-1].rsplit("/", 1)[-1]
        if name.endswith(".new") or (vdi == own and vdi not in returned):
            found.append(name)
    return found


def _records(sr):
    """The plugin's records of calls that failed on sr (file names)."""
    try:
        return sorted(n for n in os.listdir(os.path.join(ABANDONED_DIR, sr))
                      if n.endswith(".json"))
    except OSError:
        return []


def _judge_leftovers(book, scene, live, snaps, failed_names, maybe_gone,
                     returned):
    """What the slow disk left, judged by zfs-ng's contract (README): a
    call that reported failure leaves nothing xapi will find, even when
    its command finished in the kernel after the plugin gave up on it: no
    VDI of a failed call is ever listed, and the next call that changes
    the SR frees what it made (the plugin recorded it before answering:
    volume/zfsng/abandoned.py); every VDI whose create returned is listed,
    none whose destroy returned."""
    sr = scene.sr
    listed = scene.listed()
    want = set(live) | set(snaps)
    missing = sorted(want - set(listed) - maybe_gone)
    for key in missing:
        book.lost_vdi(key)
    extra = sorted(set(listed) - want)
    book.expect(not extra, "after the slow disk, VDIs no call that returned "
                "made are listed: %s" % [(k, listed[k]["name"])
                                         for k in extra])
    made = _of_failed_calls(sr, returned)
    book.note("after the slow disk: %d VDIs listed, %d expected; %d calls "
              "that would have made one failed; on the pool, made by them "
              "anyway and not listed: %s; records: %s" % (
                  len(listed), len(want), len(failed_names), made,
                  _records(sr)))
    left = _leftovers(sr)
    book.note("half-done objects before the next call: %s" % left)
    # the next call that changes the SR frees and collects them
    vol = scene.create(MiB, "next")
    book.call("Volume.destroy", sr=sr, key=vol["key"])
    left = _leftovers(sr)
    book.expect(not left, "the collector left %s" % left)
    made = _of_failed_calls(sr, returned | {vol["key"]})
    book.expect(not made, "after the next call, the pool still holds what "
                "calls that failed made: %s" % made)
    book.expect(not _records(sr), "after the next call, records of failed "
                "calls remain: %s" % _records(sr))
    listed = scene.listed()
    book.expect(set(listed) <= want, "after the next call, VDIs no call "
                "that returned made are listed: %s" % sorted(
                    set(listed) - want))
    # everything still works: every listed VDI can be destroyed
    listed = scene.listed()
    for key in sorted(listed, key=lambda k: (listed[k]["read_write"], k)):
        _, error = book.attempt("Volume.destroy", sr=sr, key=key)
        book.expect(error is None, "Volume.destroy %s after the slow disk: "
                    "%s" % (key, error))
    book.expect(scene.listed() == {}, "VDIs remain after destroying all")
    status_clean(book, scene.pool, "after the slow disk")


# In the order they run by default: disk-loss last, since a multihost pool
# OpenZFS cannot resume blocks every later zpool command until a reboot.
SCENARIOS = collections.OrderedDict([
    ("mirror-loss", mirror_loss),
    ("pool-full", pool_full),
    ("slow-disk", slow_disk),
    ("disk-loss", disk_loss),
])
