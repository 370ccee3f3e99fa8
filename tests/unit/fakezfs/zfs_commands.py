"""The fake host's zfs commands (but zfs send: see streams).

``ZfsCommands``, a mixin of ``FakeZfs``: ``zfs version``, ``list``,
``get``, ``set``, ``inherit``, ``create``, ``snapshot``, ``clone``,
``rename``, ``destroy`` and ``bookmark``, one ``_zfs_<command>`` method
each, with what they share (dataset iteration, setting properties,
removing datasets).
"""

from .model import (
    COMPONENT_RE, FS_BASE, NATIVE_DEFAULTS, VOL_BASE,
    CommandError, Dataset, _Unknown, _head, _parent_name, _sort_key, nicenum,
    parse_size)


class ZfsCommands(object):
    """``zfs <command>``: ``_zfs_<command>(argv)``."""

    # --- zfs -----------------------------------------------------------------

    def _zfs_version(self, argv):
        if len(argv) != 2:
            raise _Unknown()
        return self.version_text

    @staticmethod
    def _types(text):
        names = {"filesystem": "filesystem", "fs": "filesystem",
                 "volume": "volume", "vol": "volume",
                 "snapshot": "snapshot", "snap": "snapshot",
                 "bookmark": "bookmark"}
        types = set()
        for word in text.split(","):
            if word == "all":
                types |= {"filesystem", "volume", "snapshot", "bookmark"}
            elif word in names:
                types.add(names[word])
            else:
                raise CommandError("invalid type '%s'" % word, rc=2)
        return types

    def _iterate(self, roots, types, recurse, depth):
        """zfs_for_each(): the datasets zfs list/get visit, in order."""
        argtypes = set(types)
        if recurse:
            argtypes.add("filesystem")
            if types & {"snapshot", "bookmark"}:
                argtypes.add("volume")
        found = []
        if roots is None:
            pools = sorted((p for p in self.pools if p.state == "ACTIVE"),
                           key=lambda p: p.name)
            starts = [(p, p.datasets[p.name]) for p in pools]
        else:
            starts = []
            for name in roots:
                pool, ds = self._lookup(name)
                if ds.kind not in argtypes:
                    raise CommandError(
                        "cannot open '%s': operation not applicable to "
                        "datasets of this type" % name)
                starts.append((pool, ds))
        for pool, ds in starts:
            base = ds.name.count("/") + ds.name.count("@")
            members = [ds]
            if recurse:
                members += [d for d in self._descendants(pool, ds.name,
                                                         bookmarks=True)
                            if depth is None or
                            d.name.count("/") + d.name.count("@") +
                            d.name.count("#") - base <= depth]
            for member in sorted(members, key=_sort_key):
                if member.kind in types:
                    found.append((pool, member))
        return found

    def _zfs_list(self, argv):
        opts, args = self._getopt(argv, 2, "Hpo:t:rd:")
        flags = dict(opts)
        if "H" not in flags or "p" not in flags or "o" not in flags or \
                not args:
            raise _Unknown()
        columns = flags["o"].split(",")
        types = self._types(flags.get("t", "filesystem,volume"))
        recurse = "r" in flags or "d" in flags
        depth = int(flags["d"]) if "d" in flags else None
        if types and types <= {"snapshot", "bookmark"} and not recurse:
            recurse, depth = True, 1   # zfs list -t snapshot <dataset>
        rows = []
        for pool, ds in self._iterate(args, types, recurse, depth):
            cells = [self._value(pool, ds, c) for c in columns]
            rows.append("\t".join("-" if c is None else c for c in cells))
        return "".join(r + "\n" for r in rows)

    def _zfs_get(self, argv):
        opts, args = self._getopt(argv, 2, "Hpo:t:rs:")
        flags = dict(opts)
        if "H" not in flags or "p" not in flags or "o" not in flags or \
                not args:
            raise _Unknown()
        props = args[0].split(",")
        roots = args[1:] or None
        columns = flags["o"].split(",")
        types = self._types(flags.get("t", "filesystem,volume"))
        recurse, depth = "r" in flags, None
        sources = flags.get("s", "local,default,inherited,temporary,"
                                 "received,none").split(",")
        rows = []
        for pool, ds in self._iterate(roots, types, recurse, depth):
            for prop in props:
                value = self._value(pool, ds, prop)
                source = self._source(pool, ds, prop)
                kind = source.split()[0] if source != "-" else "none"
                if kind not in sources:
                    continue
                cell = {"name": ds.name, "property": prop,
                        "value": "-" if value is None else value,
                        "source": source}
                rows.append("\t".join(cell[c] for c in columns))
        return "".join(r + "\n" for r in rows)

    def _zfs_set(self, argv):
        """OpenZFS 2.1: no getopt; prop=value words, then datasets; any
        first argument starting with '-' is refused."""
        if len(argv) > 2 and argv[2].startswith("-"):
            raise CommandError("invalid option '%s'\nusage:\n\tset <property="
                               "value> ... <filesystem|volume|snapshot> ..."
                               % argv[2][1:2], rc=2)
        words = argv[2:]
        pairs = [w for w in words if "=" in w]
        names = words[len(pairs):]
        if not pairs or not names or any("=" in n for n in names):
            raise CommandError("invalid argument order\nusage:\n\tset "
                               "<property=value> ... <filesystem|volume|"
                               "snapshot> ...", rc=2)
        props = self._parse_props(pairs, "cannot set property")
        for name in names:
            errprefix = "cannot set property for '%s'" % name
            pool, ds = self._lookup(name)
            for key, value in sorted(props.items()):
                self._check_prop(ds.kind, key, value, errprefix,
                                 creating=False)
            if pool.readonly:
                raise CommandError("%s: pool is read-only" % errprefix)
            self._apply_props(pool, ds, props, errprefix)
        return ""

    def _apply_props(self, pool, ds, props, errprefix):
        """libzfs zfs_prop_set_list(), then the kernel's
        zfs_set_prop_nvlist(), which is not one transaction.

        libzfs refuses bad values first (then nothing is set), adds the
        refreservation a thick volume's volsize change implies
        (zfs_add_synthetic_resv) and resolves refreservation=auto for the
        new size (zfs_fix_auto_resv). The kernel then sets each special
        property (volsize, refreservation) on its own, retrying a failed
        one once after the others, and the plain ones (user properties) in
        one batch, or one by one when the batch fails. A thick volume
        grown past the free space keeps its old volsize and refreservation
        and the command fails: so OpenZFS 2.1 and 2.3 answer ``zfs set
        refreservation=auto volsize=<too big>`` (tests/integration/
        test_fakezfs_contract.py; this fake used to keep the new volsize).
        """
        props = dict(props)
        if "volsize" in props:
            size = parse_size(props["volsize"])
            if size is not None and size % ds.volblocksize:
                raise CommandError("%s: 'volsize' must be a multiple of "
                                   "volume block size (%s)"
                                   % (errprefix, nicenum(ds.volblocksize)))
            if size is None or size == 0:
                raise CommandError("%s: 'volsize' cannot be zero"
                                   % errprefix)
            props["volsize"] = str(size)
            old_auto = self._auto_reservation(ds.volsize, ds.volblocksize)
            if self._refreservation(ds) == old_auto and \
                    "refreservation" not in props:
                props["refreservation"] = "auto"
        if props.get("refreservation") == "auto":
            props["refreservation"] = str(self._auto_reservation(
                int(props.get("volsize", ds.volsize)), ds.volblocksize))
        elif props.get("refreservation") not in (None, "none"):
            props["refreservation"] = str(parse_size(props["refreservation"]))
        if "quota" in props:
            props["quota"] = str(parse_size(props["quota"]) or 0) \
                if props["quota"] != "none" else "0"
        failed = []
        special = [k for k in props
                   if k in ("volsize", "refreservation", "quota")]
        old_volsize = ds.volsize
        retry = [k for k in special if not self._set_special(
            pool, ds, k, props[k])]
        failed += [k for k in retry if not self._set_special(
            pool, ds, k, props[k])]
        if failed:
            ds.volsize = old_volsize   # as real ZFS leaves it (see above)
        plain = dict((k, v) for k, v in props.items() if k not in special)
        for key, value in plain.items():
            if self._too_big({key: value}):
                failed.append(key)
            else:
                ds.props[key] = value
        if failed:
            raise CommandError("\n".join(
                "%s: %s" % (errprefix, "property value too long"
                            if ":" in key else
                            "size is greater than available space")
                for key in failed))

    def _set_special(self, pool, ds, key, value):
        """zfs_prop_set_special() for volsize and refreservation: whether
        it took (a refreservation needs the free space it adds)."""
        if key == "quota":
            ds.props[key] = value
            return True
        if key == "volsize":
            if int(value) != ds.volsize:
                pool.txg += 1
                ds.dnode_txg = pool.txg    # object 2 (the size) rewritten
            ds.volsize = int(value)
            return True
        if value != "none":
            grow = int(value) - max(self._refreservation(ds),
                                    self._usedds(ds))
            if grow > self._pool_avail(pool):
                return False
        ds.props[key] = value
        return True

    def _zfs_inherit(self, argv):
        """``zfs inherit <prop> <dataset>...``: the local value goes (no
        error when there was none)."""
        opts, args = self._getopt(argv, 2, "rS")
        if opts or len(args) < 2:
            raise _Unknown()
        prop, names = args[0], args[1:]
        for name in names:
            pool, ds = self._lookup(name)
            if ":" not in prop and prop not in NATIVE_DEFAULTS:
                raise CommandError("invalid property '%s'" % prop, rc=2)
            if pool.readonly:
                raise CommandError("cannot inherit %s for '%s': pool is "
                                   "read-only" % (prop, name))
            ds.props.pop(prop, None)
        return ""

    def _zfs_create(self, argv):
        opts, args = self._getopt(argv, 2, "V:so:")
        if len(args) != 1:
            raise _Unknown()
        name = args[0]
        errprefix = "cannot create '%s'" % name
        self._check_name(name, errprefix)
        kind = "volume" if any(f == "V" for f, _ in opts) else "filesystem"
        props = self._parse_props([v for f, v in opts if f == "o"],
                                  errprefix)
        sparse = ("s", None) in opts
        if sparse and kind != "volume":
            raise CommandError("'-s' can only be used when creating a volume",
                               rc=2)
        for key, value in sorted(props.items()):
            self._check_prop(kind, key, value, errprefix)
        pool = self._active_pool(name.split("/")[0])
        if pool is None:
            raise CommandError("%s: no such pool '%s'"
                               % (errprefix, name.split("/")[0]))
        parent = pool.datasets.get(_parent_name(name) or "")
        if "/" not in name:
            raise CommandError("%s: missing dataset name" % errprefix)
        if name in pool.datasets:
            raise CommandError("%s: dataset already exists" % errprefix)
        if parent is None:
            raise CommandError("%s: parent does not exist" % errprefix)
        if parent.kind != "filesystem":
            raise CommandError("%s: parent is not a filesystem" % errprefix)
        if pool.readonly:
            raise CommandError("%s: pool is read-only" % errprefix)
        if kind == "filesystem":
            if self._too_big(props):
                raise self._internal_error(errprefix,
                                           "Argument list too long")
            if "quota" in props:
                props["quota"] = str(parse_size(props["quota"]) or 0) \
                    if props["quota"] != "none" else "0"
            ds = self._new_dataset(pool, name, kind, self._cut(props))
            ds.refer = FS_BASE
            return ""
        volsize = parse_size(dict(opts)["V"])
        block = parse_size(props.pop("volblocksize",
                                     str(self.default_volblocksize)))
        if not volsize:
            raise CommandError("%s: volume size cannot be zero" % errprefix)
        if volsize % block:
            raise CommandError("%s: volume size must be a multiple of volume "
                               "block size" % errprefix)
        if not sparse and "refreservation" not in props:
            props["refreservation"] = "auto"
        if props.get("refreservation") == "auto":
            props["refreservation"] = str(self._auto_reservation(volsize,
                                                                 block))
        reserve = self._refreservation(Dataset(name, kind, props, 0, "0"))
        if reserve > self._pool_avail(pool):
            raise CommandError("%s: out of space" % errprefix)
        if self._too_big(props):   # created, props refused, destroyed
            raise self._internal_error(errprefix, "Argument list too long")
        ds = self._new_dataset(pool, name, kind, self._cut(props))
        ds.volsize, ds.volblocksize, ds.refer = volsize, block, VOL_BASE
        return ""

    def _zfs_snapshot(self, argv):
        opts, args = self._getopt(argv, 2, "o:")
        if not args:
            raise _Unknown()
        props = self._parse_props([v for _, v in opts],
                                  "cannot create snapshot")
        checked = False
        for name in args:
            errprefix = "cannot create snapshot '%s'" % name
            self._check_name(name, errprefix, snapshot=True)
            for key, value in sorted(props.items()):
                self._check_prop("snapshot", key, value, errprefix)
            if not checked and self._too_big(props):
                # zfs_ioc_snapshot: zfs_check_userprops() fails the whole
                # call with E2BIG before any snapshot is taken
                raise self._internal_error("cannot create snapshots ",
                                           "Argument list too long")
            checked = True
            pool, head = self._lookup(_head(name), errprefix)
            if name in pool.datasets:
                raise CommandError("%s: dataset already exists" % errprefix)
            if pool.readonly:
                raise CommandError("%s: pool is read-only" % errprefix)
        for name in args:
            pool, head = self._lookup(_head(name))
            snap = self._new_dataset(pool, name, "snapshot", props)
            snap.refer = head.refer
            snap.volsize, snap.volblocksize = head.volsize, head.volblocksize
            self._copy_data(head, snap)
        return ""

    def _zfs_clone(self, argv):
        opts, args = self._getopt(argv, 2, "o:")
        if len(args) != 2:
            raise _Unknown()
        origin, name = args
        errprefix = "cannot create '%s'" % name
        pool, snap = self._lookup(origin)
        if snap.kind != "snapshot":
            raise CommandError("cannot open '%s': operation not applicable to"
                               " datasets of this type" % origin)
        self._check_name(name, errprefix)
        head = pool.datasets[_head(origin)]
        props = self._parse_props([v for _, v in opts], errprefix)
        for key, value in sorted(props.items()):
            self._check_prop(head.kind, key, value, errprefix,
                             creating=False)
        if _head(name).split("/")[0] != pool.name:
            raise CommandError("%s: source and target pools differ"
                               % errprefix)
        if name in pool.datasets:
            raise CommandError("%s: dataset already exists" % errprefix)
        parent = pool.datasets.get(_parent_name(name) or "")
        if parent is None:
            raise CommandError("%s: parent does not exist" % errprefix)
        if pool.readonly:
            raise CommandError("%s: pool is read-only" % errprefix)
        if props.get("refreservation") == "auto":
            props["refreservation"] = str(self._auto_reservation(
                snap.volsize, snap.volblocksize))
        if self._refreservation(Dataset(name, head.kind, props, 0, "0")) > \
                self._pool_avail(pool):
            raise CommandError("%s: out of space" % errprefix)
        if self._too_big(props):   # zfs_ioc_clone destroys it again
            raise self._internal_error(errprefix, "Argument list too long")
        ds = self._new_dataset(pool, name, head.kind, self._cut(props))
        ds.origin, ds.refer, ds.from_origin = origin, snap.refer, snap.refer
        ds.volsize, ds.volblocksize = snap.volsize, snap.volblocksize
        self._copy_data(snap, ds)
        snap.clones.append(name)
        return ""

    def _zfs_rollback(self, argv):
        opts, args = self._getopt(argv, 2, "rRf")
        if len(args) != 1 or "@" not in args[0] or opts:
            raise _Unknown()
        name = args[0]
        pool, snap = self._lookup(name)
        head = pool.datasets[name.split("@", 1)[0]]
        newer = [d for d in self._snapshots(pool, head.name)
                 if d.createtxg > snap.createtxg]
        if newer:
            raise CommandError(
                "cannot rollback to '%s': more recent snapshots or bookmarks"
                " exist\nuse '-r' to force deletion of the following "
                "snapshots and bookmarks:\n%s"
                % (name, "\n".join(d.name for d in newer)))
        head.refer, head.from_origin = snap.refer, snap.refer
        return ""

    def _zfs_promote(self, argv):
        """``zfs promote <clone>`` (no option, not even "--"): the clone
        takes its origin's snapshots up to the origin snapshot; the origin
        becomes a clone of it (dsl_dataset_promote)."""
        if len(argv) != 3 or argv[2].startswith("-"):
            raise _Unknown()
        name = argv[2]
        errprefix = "cannot promote '%s'" % name
        pool, ds = self._lookup(name)
        if ds.kind == "snapshot" or not ds.origin:
            raise CommandError("%s: not a cloned filesystem"
                                       % errprefix)
        point = pool.datasets[ds.origin]
        head = pool.datasets[_head(ds.origin)]
        moving = [d for d in self._snapshots(pool, head.name)
                  if d.createtxg <= point.createtxg]
        mine = set(d.name for d in self._snapshots(pool, name))
        for d in moving:
            snapname = d.name.split("@", 1)[1]
            if name + "@" + snapname in mine:
                raise CommandError(
                    "%s: conflicting snapshot '%s' from parent '%s'"
                    % (errprefix, snapname, ds.origin))
        self._rename_all(pool, [(d.name, name + "@" + d.name.split("@")[1])
                                for d in moving])
        point.clones = [head.name if c == name else c for c in point.clones]
        if head.origin:
            above = pool.datasets[head.origin]
            above.clones = [name if c == head.name else c
                            for c in above.clones]
        ds.origin, head.origin = head.origin, point.name
        ds.from_origin, head.from_origin = head.from_origin, \
            min(head.refer, point.refer)
        return ""

    def _zfs_rename(self, argv):
        """``zfs rename [--] <zvol> <new>`` (its snapshots follow, and the
        clones' origin names with them) or ``<zvol>@<a> <zvol>@<b>``
        (OpenZFS 2.1 libzfs zfs_rename: its error texts)."""
        opts, args = self._getopt(argv, 2, "")
        if opts or len(args) != 2:
            raise _Unknown()
        old, new = args
        pool, ds = self._lookup(old)
        errprefix = "cannot rename to '%s'" % new
        if "@" in old:
            if _head(new) != _head(old):
                raise CommandError("%s: snapshots must be part of same "
                                   "dataset" % errprefix)
        elif ds.kind != "volume" or "@" in new:
            raise _Unknown()     # zfs-ng renames zvols only
        elif _parent_name(new) not in pool.datasets:
            raise CommandError("%s: parent does not exist" % errprefix)
        if new in pool.datasets:
            raise CommandError("%s: dataset already exists" % errprefix)
        moves = [(old, new)]
        if "@" not in old:     # its bookmarks live in it too
            moves += [(d.name, new + d.name[len(old):])
                      for d in self._snapshots(pool, old) +
                      self._bookmarks(pool, old)]
        self._rename_all(pool, moves)
        return ""

    @staticmethod
    def _rename_all(pool, moves):
        renamed = dict(moves)
        for old, new in moves:
            ds = pool.datasets.pop(old)
            ds.name = new
            pool.datasets[new] = ds
        for ds in pool.datasets.values():
            ds.origin = renamed.get(ds.origin, ds.origin)
            ds.clones = [renamed.get(c, c) for c in ds.clones]

    def _zfs_destroy(self, argv):
        opts, args = self._getopt(argv, 2, "rd")
        if len(args) != 1:
            raise _Unknown()
        recurse, defer = ("r", None) in opts, ("d", None) in opts
        name = args[0]
        if "@" in name:
            return self._destroy_snapshots(name, recurse, defer)
        if "#" in name:
            return self._destroy_bookmark(name, recurse, defer)
        pool, ds = self._lookup(name)
        if defer:   # -d opens the target as a snapshot
            raise CommandError("cannot open '%s': operation not applicable to"
                               " datasets of this type" % name)
        errprefix = "cannot destroy '%s'" % name
        if "/" not in name and not recurse:
            raise CommandError(
                "%s: operation does not apply to pools\nuse 'zfs destroy -r "
                "%s' to destroy all datasets in the pool\nuse 'zpool destroy "
                "%s' to destroy the pool itself" % (errprefix, name, name))
        below = sorted(self._descendants(pool, name), key=_sort_key)
        if below and not recurse:
            raise CommandError("%s: %s has children\nuse '-r' to destroy the "
                               "following datasets:\n%s" % (
                                   errprefix, ds.kind,
                                   "\n".join(d.name for d in below)))
        inside = set(d.name for d in below) | {name}
        clones = [c for d in below for c in d.clones if c not in inside]
        if clones:
            raise CommandError("%s: %s has dependent clones\nuse '-R' to "
                               "destroy the following datasets:\n%s" % (
                                   errprefix, ds.kind, "\n".join(clones)))
        if pool.readonly:
            raise CommandError("%s: pool is read-only" % errprefix)
        doomed = below + ([ds] if "/" in name else [])
        for victim in sorted(doomed, key=lambda d: -d.name.count("/")):
            if victim.name in pool.datasets:   # not freed with a clone
                self._forget(pool, victim)
        return ""

    def _destroy_snapshots(self, name, recurse, defer):
        head, snapname = name.split("@", 1)
        pool, ds = self._lookup(head)
        heads = [ds] + (sorted((d for d in self._descendants(pool, head)
                                if d.kind != "snapshot"), key=_sort_key)
                        if recurse else [])
        snaps = [pool.datasets[h.name + "@" + snapname] for h in heads
                 if h.name + "@" + snapname in pool.datasets]
        if not snaps:
            raise CommandError("could not find any snapshots to destroy; "
                               "check snapshot names.")
        for snap in snaps:
            if snap.clones and not defer:
                raise CommandError(
                    "cannot destroy '%s': snapshot has dependent clones\nuse "
                    "'-R' to destroy the following datasets:\n%s"
                    % (snap.name, "\n".join(snap.clones)))
        if pool.readonly:
            raise CommandError("cannot destroy snapshots: pool is read-only")
        for snap in snaps:
            if snap.clones:
                snap.defer_destroy = True
            else:
                self._forget(pool, snap)
        return ""

    def _forget(self, pool, ds):
        """Remove a dataset (its bookmarks go with it: they live in the
        dataset); free a deferred origin with its last clone."""
        del pool.datasets[ds.name]
        if ds.kind in ("volume", "filesystem"):
            for mark in self._bookmarks(pool, ds.name):
                del pool.datasets[mark.name]
        if ds.origin and ds.origin in pool.datasets:
            origin = pool.datasets[ds.origin]
            origin.clones.remove(ds.name)
            if origin.defer_destroy and not origin.clones:
                self._forget(pool, origin)

    # --- bookmarks (changed block tracking) ---------------------------------

    def _zfs_bookmark(self, argv):
        """``zfs bookmark <snapshot|bookmark> <bookmark>`` (zfs_do_bookmark,
        OpenZFS 2.1 and 2.3): the new bookmark marks the source's txg."""
        opts, args = self._getopt(argv, 2, "")
        usage = "usage:\n\tbookmark <snapshot|bookmark> <newbookmark>\n"
        if len(args) != 2:
            raise _Unknown()
        source, name = args
        if "@" not in source and "#" not in source:
            raise CommandError("invalid source name '%s': must contain a '@'"
                               " or '#'\n%s" % (source, usage), rc=2)
        if "#" not in name:
            raise CommandError("invalid bookmark name '%s': must contain a "
                               "'#'\n%s" % (name, usage), rc=2)
        if source[0] in "@#" or name[0] == "#":
            raise _Unknown()   # short names: zfs-ng sends full ones
        try:
            pool, src = self._lookup(source)
        except CommandError as exc:   # zfs_open() failed: usage, exit 2
            raise CommandError(exc.err + usage, rc=2)
        errprefix = "cannot create bookmark '%s'" % name
        head, _, short = name.partition("#")
        if not short or not COMPONENT_RE.match(short) or len(name) >= 256:
            raise CommandError("%s: invalid argument" % errprefix)
        if head.split("/")[0] != pool.name:
            raise CommandError("%s: bookmark is in a different pool"
                               % errprefix)
        if head not in pool.datasets:
            raise CommandError("%s: dataset does not exist" % errprefix)
        if head != _head(source):
            raise CommandError("%s: source is not an ancestor of the new "
                               "bookmark's dataset" % errprefix)
        if name in pool.datasets:
            raise CommandError("%s: bookmark exists" % errprefix)
        if pool.readonly:
            raise CommandError("%s: pool is read-only" % errprefix)
        pool.datasets[name] = Dataset(name, "bookmark", {}, src.createtxg,
                                      src.guid)
        return ""

    def _destroy_bookmark(self, name, recurse, defer):
        """``zfs destroy <vol>#<name>`` (zfs_do_destroy)."""
        if defer or recurse:
            raise CommandError("%s is not supported with bookmark" % (
                "defer destroy" if defer else "recursive"), rc=255)
        pool = self._active_pool(_head(name.split("/")[0]))
        mark = pool.datasets.get(name) if pool else None
        if mark is None or mark.kind != "bookmark":
            raise CommandError("bookmark '%s' does not exist." % name)
        if pool.readonly:
            raise CommandError("cannot destroy bookmark: pool is read-only")
        del pool.datasets[name]
        return ""
