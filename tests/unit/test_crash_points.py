"""Crash points: the plugin process killed between two zfs commands.

ARCHITECTURE.md, decision 8: a crash at any step leaves a state the next call
repairs. The seam is the runner: ``CrashAfter`` (crashpoint.py) forwards to
the fake and, right after the N-th command completes, raises ``Killed`` (a
BaseException, so no ``except Exception`` in the plugin can swallow it, and
no further command runs, as after a SIGKILL). The command itself did
happen: its effect is in the pool.

For every N up to the number of commands the operation runs, on a fresh
host each time: build the scenario, run the operation killed at N, then
"the next calls" xapi would make (SR.attach after a reboot, or a
Volume.destroy of an unrelated VDI, and the same operation repeated, as
xapi retries), and check:

- every VDI that existed and was not being destroyed is still listed, with
  its name, description and all its keys;
- no internal snapshot without a clone (or not marked for deferred
  destroy), no hidden zvol that nothing needs (``garbage``);
- a destroyed VDI is not listed, a repeated call succeeds;
- after destroying everything listed, only the SR dataset is left.

A VDI made by a killed snapshot or clone (its command ran, the answer never
reached xapi) is listed like any other and destroyed at the end: visible,
so no leak (xapi's next SR.scan introduces it).
"""

import collections

import pytest

from zfsng import errors

import fakezfs
from conftest import call, check_fake_host, create_sr
from crashpoint import (CrashAfter, CrashAfterCommand, Killed, commands_run,
                        installed)
from test_vdi_semantics import (
    GiB, assert_only_the_sr_is_left, clone, destroy, destroy_everything,
    garbage, listed, vdi_create, vdi_snapshot)


def commands_of(host, method, args):
    """How many commands method runs (no crash)."""
    return commands_run(host, lambda: call(method, **args))


def run_killed(host, n, method, args):
    """Run method, killed right after its n-th command; whether it was."""
    with installed(CrashAfter(host, n)):
        try:
            call(method, **args)
        except Killed:
            return True
    return False


def assert_every_crash_point(total, killed_at, caught=(AssertionError,)):
    """killed_at(n) for every n from 1 to total, each on a fresh host; it
    answers whether the kill happened. Every failing point is gathered
    rather than the first only, so one run names all of them."""
    failures = []
    for n in range(1, total + 1):
        try:
            assert killed_at(n), "not killed at %d of %d" % (n, total)
        except caught as exc:
            failures.append("killed after command %d of %d: %s: %s"
                            % (n, total, type(exc).__name__, exc))
    assert not failures, "\n".join(failures)


# --- scenarios ---------------------------------------------------------------
#
# Each builds its state through the plugin and returns a dict: the sr and
# its stored device-config, the operation (method and args), the keys the
# operation destroys, and "other", an unrelated VDI a recovery call may
# destroy. "keep" is filled in afterwards: every listed VDI the operation
# must not touch.

class _Base(collections.namedtuple("_Base", "sr config other key")):
    """What every scenario starts from (_base): an SR, its stored
    device-config, an unrelated VDI (other) and the VDI the scenario works
    on (key)."""

    def operation(self, method, key, destroys=False, **args):
        """The scenario's dict, so that each scenario says only what it
        does: method on key (destroying it, or not) in this SR."""
        return dict(sr=self.sr, config=self.config, other=self.other,
                    method=method, args=dict(args, key=key),
                    destroys=[key] if destroys else [])


def _base(host, thick=False):
    sr, config = create_sr({"device": "/dev/sdb", "provisioning":
                            "thick" if thick else "thin"})
    other = vdi_create(sr, name="unrelated")["key"]
    vdi = vdi_create(sr, name="vm disk", description="the one", size=GiB)
    call("Volume.set", sr=sr, key=vdi["key"], k="_sm_config_x", v="kept")
    host.write("%s/%s" % (sr, vdi["key"]), 64 * 1024 * 1024)
    return _Base(sr, config, other, vdi["key"])


def _destroying_the_last(b, gone, last):
    """Destroy the VDIs gone, in order, leaving last beside b.other (the
    hidden chain above last stays, for last alone); the operation is
    Volume.destroy of last."""
    for key in gone:
        destroy(b.sr, key)
    assert set(listed(b.sr)) == set([b.other, last])
    return b.operation("Volume.destroy", last, destroys=True)


def snapshot_scenario(host):
    b = _base(host)
    return b.operation("Volume.snapshot", b.key)


def clone_snapshot_scenario(host):
    b = _base(host)
    snap = vdi_snapshot(b.sr, b.key)["key"]
    return b.operation("Volume.clone", snap)


def clone_live_scenario(host):
    b = _base(host)
    return b.operation("Volume.clone", b.key)


def clone_live_thick_scenario(host):
    b = _base(host, thick=True)
    return b.operation("Volume.clone", b.key)


def destroy_plain_scenario(host):
    b = _base(host)
    return b.operation("Volume.destroy", b.key, destroys=True)


def destroy_with_dependents_scenario(host):
    """The VDI has a snapshot with a clone, and a live clone."""
    b = _base(host)
    snap = vdi_snapshot(b.sr, b.key)["key"]
    clone(b.sr, snap)
    clone(b.sr, b.key)
    return b.operation("Volume.destroy", b.key, destroys=True)


def destroy_snapshot_with_clone_scenario(host):
    """A snapshot with a clone: deferred, under a hidden parent."""
    b = _base(host)
    snap = vdi_snapshot(b.sr, b.key)["key"]
    clone(b.sr, snap)
    destroy(b.sr, b.key)
    return b.operation("Volume.destroy", snap, destroys=True)


def destroy_last_dependent_scenario(host):
    """V0 hidden <- S0 deferred <- C1 hidden <- S1: destroying S1, the last
    VDI, frees C1, which frees S0, which frees V0."""
    b = _base(host)
    s0 = vdi_snapshot(b.sr, b.key)["key"]
    c1 = clone(b.sr, s0)["key"]
    s1 = vdi_snapshot(b.sr, c1)["key"]
    return _destroying_the_last(b, [b.key, s0, c1], s1)


def destroy_last_live_clone_scenario(host):
    """V0 hidden <- internal snapshot (deferred) <- C1 hidden <- S1
    deferred <- C2, and C1's own live clone C3 gone: destroying C2 frees
    S1, then C1, which frees the internal snapshot, then V0."""
    b = _base(host)
    c1 = clone(b.sr, b.key)["key"]
    s1 = vdi_snapshot(b.sr, c1)["key"]
    c2 = clone(b.sr, s1)["key"]
    return _destroying_the_last(b, [b.key, c1, s1], c2)


def resize_scenario(host):
    b = _base(host)
    vdi_snapshot(b.sr, b.key)
    return b.operation("Volume.resize", b.key, new_size=3 * GiB)


def resize_thick_scenario(host):
    b = _base(host, thick=True)
    return b.operation("Volume.resize", b.key, new_size=2 * GiB)


SCENARIOS = [snapshot_scenario, clone_snapshot_scenario, clone_live_scenario,
             clone_live_thick_scenario, destroy_plain_scenario,
             destroy_with_dependents_scenario,
             destroy_snapshot_with_clone_scenario,
             destroy_last_dependent_scenario,
             destroy_last_live_clone_scenario, resize_scenario,
             resize_thick_scenario]


# --- the next calls ----------------------------------------------------------

def attach_again(s):
    assert call("SR.attach", configuration=s["config"]) == s["sr"]


def destroy_unrelated(s):
    destroy(s["sr"], s["other"])


def repeat(s):
    """xapi retries the operation; it must succeed."""
    call(s["method"], sr=s["sr"], **s["args"])


NEXT_CALLS = {
    "attach+repeat": [attach_again, repeat],
    "destroy-unrelated+repeat": [destroy_unrelated, repeat],
    "repeat+attach": [repeat, attach_again],
}


def check_after(host, s, before):
    sr = s["sr"]
    now = listed(sr)
    for key, volume in before.items():
        if key in s["destroys"] or key == s.get("gone"):
            assert key not in now, "destroyed VDI %s still listed" % key
            continue
        assert key in now, "VDI %s lost" % key
        got = now[key]
        assert (got["name"], got["description"], got["keys"],
                got["read_write"]) == (volume["name"], volume["description"],
                                       volume["keys"], volume["read_write"]), \
            "VDI %s changed" % key
        if s["method"] == "Volume.resize" and key == s["args"]["key"]:
            assert got["virtual_size"] == s["args"]["new_size"]
        else:
            assert got["virtual_size"] == volume["virtual_size"]
    assert garbage(host, sr) == []


def play(scenario, n, next_calls):
    """Scenario killed at command n, then next_calls, then the checks.
    Returns whether the kill happened (n within the operation)."""
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        s = scenario(host)
        before = listed(s["sr"])
        killed = run_killed(host, n, s["method"],
                            dict(s["args"], sr=s["sr"]))
        for step in next_calls:
            if step is destroy_unrelated:
                s["gone"] = s["other"]
            step(s)
        check_after(host, s, before)
        destroy_everything(s["sr"])
        assert_only_the_sr_is_left(host, s["sr"])
    check_fake_host(host)
    return killed


@pytest.mark.parametrize("next_calls", sorted(NEXT_CALLS))
@pytest.mark.parametrize("scenario", SCENARIOS,
                         ids=[f.__name__[:-len("_scenario")]
                              for f in SCENARIOS])
def test_every_crash_point_is_repaired(scenario, next_calls):
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        s = scenario(host)
        total = commands_of(host, s["method"], dict(s["args"], sr=s["sr"]))
    assert total >= 2
    assert_every_crash_point(
        total, lambda n: play(scenario, n, NEXT_CALLS[next_calls]))


@pytest.mark.parametrize("scenario", SCENARIOS,
                         ids=[f.__name__[:-len("_scenario")]
                              for f in SCENARIOS])
def test_without_a_crash(scenario):
    """The same checks with no crash: the baseline of the ones above."""
    assert not play(scenario, 0, [attach_again, repeat])


def test_the_seam_kills_after_the_command_ran():
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, config = create_sr()
        key = vdi_create(sr)["key"]
        total = commands_of(host, "Volume.clone", {"sr": sr, "key": key})
        assert total > 3
        before = len(host.calls)
        assert run_killed(host, 3, "Volume.clone", {"sr": sr, "key": key})
        # three commands ran, the third (the internal snapshot) took effect,
        # and nothing ran after it
        assert len(host.calls) - before == 3
        assert host.calls[-1][:2] == ["zfs", "snapshot"]
        assert [g for g in garbage(host, sr)
                if g.startswith("internal snapshot without a clone")]
        # a call that does not clean up leaves it; attach repairs it
        call("SR.ls", sr=sr)
        assert garbage(host, sr)
        call("SR.attach", configuration=config)
        assert garbage(host, sr) == []
    check_fake_host(host)


def test_crash_in_collect_is_finished_by_any_later_destroy():
    """Killed in the middle of a chain's collection: hidden zvols nothing
    needs are left; the next Volume.destroy, even of a key already gone
    (xapi's retry), finishes the work."""
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        s = destroy_last_dependent_scenario(host)
        args = dict(s["args"], sr=s["sr"])
        # 1 sr_row, 2 list, 3 destroy S1, 4 list, 5 destroy -r C1
        assert run_killed(host, 5, s["method"], args)
        assert host.calls[-1][:3] == ["zfs", "destroy", "-r"]
        assert garbage(host, s["sr"])          # V0: hidden, nothing needs it
        destroy(s["sr"], s["args"]["key"])     # already gone
        assert garbage(host, s["sr"]) == []
        assert set(listed(s["sr"])) == set([s["other"]])
        destroy(s["sr"], s["other"])
        assert_only_the_sr_is_left(host, s["sr"])
    check_fake_host(host)


# --- SR operations -----------------------------------------------------------
#
# SR.destroy: killed after any command, xapi's next calls are SR.detach
# (its clean-up after the failed call) and, when the admin tries again,
# SR.attach with the stored device-config, then SR.destroy of what attach
# answered. SR.create: killed after any command, xapi forgets the SR and the
# admin's retry comes with a new SR uuid.

from zfsng_volume import cleanup  # noqa: E402
from conftest import SR_UUID, SR_UUID2  # noqa: E402

DESTROY_LAYOUT = {"vdev": "mirror /dev/sdb /dev/sdc log /dev/sdd "
                          "cache /dev/sde"}
DISKS = ["/dev/sdb", "/dev/sdc", "/dev/sdd", "/dev/sde"]


def _blank(host, disk):
    dev = host.devices[disk]
    return (dev.signatures, dev.children, dev.label) == ([], [], None)


def _destroy_killed_at(n, retry):
    """A fresh SR destroyed, killed after command n; then retry. Returns
    whether the kill happened."""
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, config = create_sr(DESTROY_LAYOUT)
        killed = run_killed(host, n, "SR.destroy", {"sr": sr})
        if killed:
            retry(host, sr, config)
        assert host.imported() == []
        assert not [p for p in host.pools if p.state == "EXPORTED"]
        for disk in DISKS:
            assert _blank(host, disk), "%s not blank" % disk
        assert cleanup.load(config["pool-guid"]) is None
    check_fake_host(host)
    return killed


def _as_xapi(host, sr, config):
    call("SR.detach", sr=sr)
    again = call("SR.attach", configuration=config)
    call("SR.destroy", sr=again)


def _killed_again(host, sr, config):
    """The retry killed too, right after its own first wipe or label
    clear (when it gets that far), then retried: no step is lost."""
    call("SR.detach", sr=sr)
    again = call("SR.attach", configuration=config)
    for prefix in (["wipefs"], ["zpool", "labelclear"]):
        with installed(CrashAfterCommand(host, prefix)):
            try:
                call("SR.destroy", sr=again)
            except Killed:
                break
    again = call("SR.attach", configuration=config) \
        if host.imported() or cleanup.load(config["pool-guid"]) else again
    call("SR.destroy", sr=again)


def _destroy_again(host, sr, config):
    call("SR.destroy", sr=sr)


@pytest.mark.parametrize("retry", [_as_xapi, _killed_again, _destroy_again],
                         ids=["attach+destroy", "killed-again", "destroy"])
def test_sr_destroy_killed_anywhere_is_finished_by_the_retry(retry):
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, _ = create_sr(DESTROY_LAYOUT)
        total = commands_of(host, "SR.destroy", {"sr": sr})
    assert total > 5
    assert_every_crash_point(total, lambda n: _destroy_killed_at(n, retry))


def _killed_after_zpool_destroy(host):
    sr, config = create_sr(DESTROY_LAYOUT)
    with installed(CrashAfterCommand(host, ["zpool", "destroy"])):
        with pytest.raises(Killed):
            call("SR.destroy", sr=sr)
    assert not _blank(host, "/dev/sdb")
    return config


def test_sr_destroy_retry_after_the_pool_is_gone_answers_attach():
    """Killed right after zpool destroy: xapi's retry (a PBD plug:
    SR.attach, then the SR.stat the daemon makes of its answer; then
    SR.destroy) finishes it. The string attach answers is stat'ed as an
    empty Unavailable SR that says what to do; no call takes it for a
    live SR."""
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        config = _killed_after_zpool_destroy(host)
        left = call("SR.attach", configuration=config)
        assert left == "tank#destroying-" + config["pool-guid"]
        record = call("SR.stat", sr=left)
        assert record["health"][0] == "Unavailable"
        assert "sr-destroy" in record["health"][1]
        assert "/dev/sdb" in record["health"][1]
        assert (record["free_space"], record["total_space"]) == (0, 0)
        for method, args in [("SR.ls", {}), ("SR.set_name", {
                "new_name": "x"}), ("Volume.create", {
                    "name": "x", "description": "", "size": GiB,
                    "sharable": False})]:
            with pytest.raises(errors.Sr_not_attached):
                call(method, sr=left, **args)
        call("SR.destroy", sr=left)
        assert all(_blank(host, d) for d in DISKS)
        # and again, the answer lost: done already
        done = call("SR.attach", configuration=config)
        assert done == "tank#destroyed-" + SR_UUID
        assert call("SR.destroy", sr=done) is None


def test_a_plan_for_a_pool_that_was_not_destroyed_touches_nothing():
    """Killed before zpool destroy, then the pool exported (xapi's
    SR.detach): an SR.destroy of the name finds the plan but the pool is
    still importable: nothing is wiped; the next attach forgets the plan
    (and the record of the destroy: the SR is there)."""
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        sr, config = create_sr(DESTROY_LAYOUT)
        with installed(CrashAfterCommand(host, ["zpool", "list", "-v", "-H",
                                                "-g"])):
            with pytest.raises(Killed):
                call("SR.destroy", sr=sr)
        call("SR.detach", sr=sr)
        assert call("SR.destroy", sr=sr) is None   # not attached: no-op
        mark = len(host.calls)
        assert host.mutations(since=mark) == []
        assert call("SR.attach", configuration=config) == sr
        assert cleanup.load(config["pool-guid"]) is None
        assert cleanup.destroy_record(SR_UUID) is None
        assert call("SR.stat", sr=sr)["uuid"] == SR_UUID


CREATE_CONFIG = {"vdev": "mirror /dev/sdb /dev/sdc"}


def _create(uuid):
    return call("SR.create", uuid=uuid, configuration=dict(CREATE_CONFIG),
                name="tank", description="d")


def _create_killed_at(n):
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        killed = False
        with installed(CrashAfter(host, n)):
            try:
                _create(SR_UUID)
            except Killed:
                killed = True
        stored = _create(SR_UUID2)            # xapi's retry: a new uuid
        assert stored["sr_uuid"] == SR_UUID2
        assert _create(SR_UUID2) == stored    # and a repeated one
        sr = call("SR.attach", configuration=stored)
        assert call("SR.stat", sr=sr)["uuid"] == SR_UUID2
        assert host.imported() == [sr]
        vdi = call("Volume.create", sr=sr, name="v", description="",
                   size=GiB, sharable=False)
        assert [v["key"] for v in call("SR.ls", sr=sr)] == [vdi["key"]]
    check_fake_host(host)
    return killed


def test_sr_create_killed_anywhere_is_usable_by_a_retry_with_a_new_uuid():
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        total = commands_run(host, lambda: _create(SR_UUID))
    assert_every_crash_point(total, _create_killed_at,
                             caught=(AssertionError, errors.StorageError))


def test_sr_forget_of_a_half_destroyed_sr():
    """xe sr-forget of an SR whose destroy was killed after zpool destroy:
    the plug (attach and stat) and the unplug (SR.detach) work and change
    no disk; the plan stays, and a later sr-destroy through a plug still
    finishes it."""
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        config = _killed_after_zpool_destroy(host)
        left = call("SR.attach", configuration=config)
        mark = len(host.calls)
        assert call("SR.detach", sr=left) is None
        assert host.mutations(since=mark) == []
        assert cleanup.load(config["pool-guid"]) is not None
        call("SR.destroy", sr=call("SR.attach", configuration=config))
        assert all(_blank(host, d) for d in DISKS)
        assert cleanup.load(config["pool-guid"]) is None


def test_stat_of_a_destroying_string_without_a_plan_is_refused():
    """A '#destroying-' string whose plan is gone (finished, or never
    made) or names another pool is no SR."""
    host = fakezfs.FakeZfs.with_disks()
    with installed(host):
        config = _killed_after_zpool_destroy(host)
        guid = config["pool-guid"]
        for sr in ["other#destroying-" + guid, "tank#destroying-1234"]:
            with pytest.raises(errors.Sr_not_attached):
                call("SR.stat", sr=sr)
        call("SR.destroy", sr="tank#destroying-" + guid)
        with pytest.raises(errors.Sr_not_attached):
            call("SR.stat", sr="tank#destroying-" + guid)
