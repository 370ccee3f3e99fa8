"""fakezfs: an in-memory host with OpenZFS 2.1 for zfs-ng's unit tests.

zfs-ng runs every external program through ``zfsng.runner``; the unit tests
install a ``FakeZfs`` there (``runner.set_runner``) and fake nothing else.
The fake keeps a small model of a host -- block devices, pools, datasets --
and answers the argv forms zfs-ng uses the way the real tools answer them:
the same output layout (tabs, ``-`` for "no value", ``zpool list -v`` vdev
lines that carry their statistics columns whatever ``-o`` says, ``zpool
status`` and ``zpool import`` text blocks), the same error texts on stderr
and the same exit codes (texts taken from OpenZFS 2.1 cmd/zpool, cmd/zfs and
libzfs, and from util-linux for lsblk, blkid and wipefs).

Rules
- Every argv is recorded in ``calls``, refused or not, so a test can check
  what ran, and that a refused call ran nothing that changes state
  (``mutations()``).
- An argv form the fake does not know raises AssertionError naming it (and
  is remembered in ``unknown``, which the test fixture checks): a gap in the
  fake fails a test, it never passes silently.
- One method per command: ``_zpool_create``, ``_zfs_list``, ``_lsblk``...
- Test set-up and the admin's own actions go through the helpers
  (``add_disk``, ``offline``, ``write``...) or ``admin("zfs snapshot
  tank/x@y")``, which runs the same command code without recording it.

Sizes are modelled plainly but consistently: a whole disk given to ``zpool
create`` is partitioned (data partition 1, 8 MiB partition 9) as ZFS on
Linux does, each leaf loses its label area, raidz loses parity, the pool
keeps 1/32 as slop space; datasets account used = usedbydataset +
usedbysnapshots + usedbyrefreservation + usedbychildren, ``available`` is
the pool's free space (plus the unconsumed refreservation of a volume), and
a thick volume's refreservation is its size plus block-pointer overhead.

Changed block tracking: tests declare what a guest wrote or discarded
(``guest_write``, ``guest_free``); each zvol keeps the birth txg of every
block ever written (snapshots and clones copy them), so ``zfs send -i``
(read through the runner's ``stream``) emits a real record stream of the
blocks born since the base, holes and tail FREE as OpenZFS sends them
(``_zfs_send``), ``zdb -e -dddd <snapshot> 1`` prints the data object's
maxblkid, and bookmarks (``zfs bookmark``) are datasets of kind bookmark
that go with their zvol and never hold it.

The rooms of the package, each one job (``FakeZfs`` is made of the mixins;
every name tests use is importable from ``fakezfs`` itself):
- ``model``: constants, ``CommandError``, ``_Unknown``, ``nicenum``,
  ``parse_size``, the model classes (``Device``, ``Leaf``, ``Vdev``,
  ``Pool``, ``Dataset``), the naming helpers and GNU getopt;
- this module: ``FakeZfs`` itself, the runner interface (dispatch, the
  ``calls`` record, injected failures, ``admin``), what tests look at
  (``mutations``, ``ran``, ``get``...), the model's lookups;
- ``accounting``: space and property values and checks;
- ``disks``: block devices (``add_disk``, ``offline``... ``lsblk``,
  ``blkid``, ``wipefs``, ``udevadm``);
- ``zpool_commands`` and ``zfs_commands``: the ``zpool`` and ``zfs``
  commands (but ``zfs send``);
- ``streams``: a guest's writes and discards, ``zfs send`` streams, ``zdb``.
"""

import os
import shlex

from zfsng import runner

from .accounting import Accounting
from .disks import Disks
from .model import (
    CLASSES, COMPONENT_RE, COMPRESSION_RE, DEFAULT_VOLBLOCKSIZE, FS_BASE,
    GROUP_MIN, LABELS, MAX_PROP_VALUE, MUTATING, NATIVE_CHOICES,
    NATIVE_DEFAULTS, PROGRAMS, PYTHON, USER_PROP_RE, VOL_BASE,
    ZAP_MAXVALUELEN, ZFS_MAXPROPLEN, ZFS_VERSION, CommandError, Dataset,
    Device, GiB, KiB, Leaf, MiB, Pool, TiB, Vdev, _getopt, _head, _parent_name, _sort_key,
    _Unknown, nicenum, parse_size)
from .streams import (
    SEND_BEGIN, SEND_END, SEND_END_OF_OBJECT, SEND_FREE, SEND_FREEOBJECTS,
    SEND_HEADER, SEND_MAGIC, SEND_OBJECT, SEND_WRITE, Streams, _free,
    _Reader, _record)
from .zfs_commands import ZfsCommands
from .zpool_commands import ZpoolCommands

# What ``import fakezfs`` gives, as when the fake was one module.
__all__ = [
    "KiB", "MiB", "GiB", "TiB", "ZFS_VERSION", "PROGRAMS", "PYTHON",
    "MUTATING",
    "FS_BASE", "VOL_BASE", "LABELS", "DEFAULT_VOLBLOCKSIZE", "GROUP_MIN",
    "CLASSES", "NATIVE_DEFAULTS", "COMPRESSION_RE", "NATIVE_CHOICES",
    "USER_PROP_RE", "COMPONENT_RE", "MAX_PROP_VALUE", "ZAP_MAXVALUELEN",
    "ZFS_MAXPROPLEN", "CommandError", "nicenum", "parse_size", "Device",
    "Leaf", "Vdev", "Pool", "Dataset", "_parent_name", "_head", "_sort_key",
    "_getopt", "_Unknown", "FakeZfs", "SEND_HEADER", "SEND_MAGIC",
    "SEND_END_OF_OBJECT", "SEND_BEGIN", "SEND_OBJECT", "SEND_FREEOBJECTS",
    "SEND_WRITE", "SEND_FREE", "SEND_END", "_record", "_free", "_Reader",
    "Accounting", "Disks", "Streams", "ZfsCommands", "ZpoolCommands",
]


class FakeZfs(ZpoolCommands, ZfsCommands, Disks, Streams, Accounting):
    """The runner: ``FakeZfs()(argv, stdin_text) -> runner.Result``."""

    def __init__(self):
        self.calls = []
        self.unknown = []
        self.devices = {}
        self.links = {}             # udev symlink -> kernel device path
        self.pools = []             # every pool ever made, any state
        self.injected = []          # [prefix, rc, err, times]
        # This host, as the labels of the pools it imports record it (the
        # hostid is the one tests/unit/conftest.py gives the plugin).
        self.hostid, self.hostname = 0x5eed1d05, os.uname()[1]
        self._guid = 9 * 10 ** 18 + 170000000000000
        self.default_volblocksize = DEFAULT_VOLBLOCKSIZE
        # what ``zfs version`` prints: a test may play another release
        self.version_text = ZFS_VERSION
        # Not OpenZFS: a cap of 4096 bytes on user property values that
        # this fake always had (tests/unit/test_fakezfs.py relies on it).
        # None leaves only what OpenZFS 2.1/2.3 enforce (ZAP_MAXVALUELEN).
        self.user_value_cap = None
        self._sending = None        # zfs send's stream while it runs
        self.stdin = None           # the last command's stdin
        # A power cut inside the next zfs create or zfs clone (cut_next).
        self.cut_props = None

    @classmethod
    def with_disks(cls):
        """A host with four blank 10 GiB disks /dev/sdb../dev/sde: the one
        every unit test starts from, so that device names in the tests
        mean the same disks everywhere."""
        host = cls()
        for name in "bcde":
            host.add_disk("/dev/sd" + name)
        return host

    # --- the runner interface ------------------------------------------------

    def __call__(self, argv, stdin_text=None, bound=None):
        self.calls.append(list(argv))
        self.stdin = stdin_text     # what the command reads (rangecopy)
        return self._run(list(argv))

    def admin(self, command):
        """Run a command line as the admin would (not recorded); raise
        CommandError when it fails. Returns stdout."""
        result = self._run(shlex.split(command))
        if result.rc != 0:
            raise CommandError(result.err, result.rc)
        return result.out

    def _run(self, argv):
        assert argv and all(isinstance(a, str) for a in argv), argv
        for rule in self.injected:
            prefix, rc, err, times = rule
            if argv[:len(prefix)] == prefix and times != 0:
                rule[3] -= 1
                return runner.Result(argv, rc, "", err)
        handler = self._handler(argv)
        try:
            if handler is None:
                raise _Unknown()
            out = handler(argv)
        except _Unknown:
            self.unknown.append(argv)
            raise AssertionError("fakezfs: unsupported command %r" % (argv,))
        except CommandError as exc:
            return runner.Result(argv, exc.rc, "", exc.err)
        if isinstance(out, tuple):      # (stdout, stderr)
            return runner.Result(argv, 0, out[0], out[1])
        return runner.Result(argv, 0, out or "", "")

    def _handler(self, argv):
        prog = argv[0]
        if prog == "zdb":
            return self._zdb
        if prog in ("zpool", "zfs", "udevadm") and len(argv) > 1:
            return getattr(self, "_%s_%s" % (prog, argv[1]), None)
        if prog in ("lsblk", "blkid", "wipefs"):
            return getattr(self, "_" + prog)
        if argv[1:3] == ["-m", "zfsng.rangecopy"]:
            return self._rangecopy
        return None

    def _getopt(self, argv, start, spec):
        parsed = _getopt(argv[start:], spec)
        if parsed is None:
            raise _Unknown()
        return parsed

    # --- what tests look at --------------------------------------------------

    def mutations(self, since=0):
        """The recorded argvs that change state (from calls[since:])."""
        return [a for a in self.calls[since:] if self._mutating(a)]

    @staticmethod
    def _mutating(argv):
        if argv[:2] == ["zpool", "import"]:      # a listing reads only
            parsed = _getopt(argv[2:], "o:Nd:")
            return parsed is None or bool(parsed[1])
        return tuple(argv[:2]) in MUTATING or tuple(argv[:1]) in MUTATING

    def ran(self, *prefix, **kwargs):
        """Recorded argvs that start with prefix (from calls[since:])."""
        prefix = list(prefix)
        return [a for a in self.calls[kwargs.get("since", 0):]
                if a[:len(prefix)] == prefix]

    def imported(self):
        return sorted(p.name for p in self.pools if p.state == "ACTIVE")

    def pool(self, name, state="ACTIVE"):
        for pool in self.pools:
            if pool.name == name and pool.state == state:
                return pool
        raise KeyError("no %s pool %s" % (state, name))

    def dataset(self, name):
        pool, ds = self._lookup(name)
        return ds

    def exists(self, name):
        try:
            self._lookup(name)
            return True
        except CommandError:
            return False

    def get(self, name, prop):
        """A property as ``zfs list -Hp`` prints it (None for ``-``)."""
        pool, ds = self._lookup(name)
        return self._value(pool, ds, prop)

    def local_props(self, name):
        return dict(self.dataset(name).props)

    # --- test set-up ---------------------------------------------------------

    def cut_next(self, keep=()):
        """The next ``zfs create`` or ``zfs clone`` stops where a power cut
        can stop it: ZFS makes the dataset in one transaction group and
        sets the properties given with -o afterwards (zfs_ioc_create,
        zfs_ioc_clone, then zfs_set_prop_nvlist): the special ones
        (refreservation) one sync task each, then every other one
        (readonly, user properties) in one. The dataset is left with its
        creation's own (a zvol's volsize and volblocksize, a clone's
        origin) and the -o properties named in keep (the special ones
        set before the cut), nothing else."""
        self.cut_props = tuple(keep)

    def _cut(self, props):
        """props as a cut_next leaves them (all of them without one)."""
        if self.cut_props is None:
            return props
        kept = dict((k, v) for k, v in props.items() if k in self.cut_props)
        self.cut_props = None
        return kept

    def inject(self, command, err, rc=1, times=1):
        """The next ``times`` runs of argvs starting with the words of
        command fail with err (times=-1: always)."""
        self.injected.append([command.split(), rc, err, times])

    # --- model helpers -------------------------------------------------------

    def _new_guid(self):
        self._guid += 7919131
        return str(self._guid)

    @staticmethod
    def _part_name(disk, number):
        return "%s%s%d" % (disk, "p" if disk[-1].isdigit() else "", number)

    def _active_pool(self, name):
        for pool in self.pools:
            if pool.name == name and pool.state == "ACTIVE":
                return pool
        return None

    def _open_pool(self, name):
        """The imported pool called name, or the error every zpool command
        that opens a pool by name gives (libzfs zpool_open)."""
        pool = self._active_pool(name)
        if pool is None:
            raise CommandError("cannot open '%s': no such pool" % name)
        return pool

    def _lookup(self, name, errprefix=None):
        """(pool, dataset) of an imported dataset, or CommandError."""
        pool = self._active_pool(_head(name.split("/")[0]))
        ds = pool.datasets.get(name) if pool else None
        if ds is None:
            raise CommandError("%s: dataset does not exist"
                               % (errprefix or "cannot open '%s'" % name))
        return pool, ds

    def _children(self, pool, name):
        return sorted((d for d in pool.datasets.values()
                       if d.kind not in ("snapshot", "bookmark") and
                       _parent_name(d.name) == name), key=_sort_key)

    def _snapshots(self, pool, name):
        return sorted((d for d in pool.datasets.values()
                       if d.kind == "snapshot" and _head(d.name) == name),
                      key=lambda d: d.createtxg)

    def _descendants(self, pool, name, bookmarks=False):
        """Everything below name: children, snapshots (and bookmarks),
        recursively."""
        return [d for d in pool.datasets.values()
                if d.name.startswith(name + "/") or
                d.name.startswith(name + "@") or
                (bookmarks and d.name.startswith(name + "#"))]

    def _bookmarks(self, pool, name):
        return sorted((d for d in pool.datasets.values()
                       if d.kind == "bookmark" and _head(d.name) == name),
                      key=lambda d: d.createtxg)
