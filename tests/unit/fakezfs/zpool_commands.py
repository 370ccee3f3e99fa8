"""The fake host's zpool commands.

``ZpoolCommands``, a mixin of ``FakeZfs``: ``zpool list``, ``get``,
``create``, ``import``, ``export``, ``destroy``, ``labelclear`` and
``status``, one ``_zpool_<command>`` method each, with what they share
(pool health, vdev parsing and labelling, import scans). A top-level
vdev's ashift is ``-o ashift`` or the largest its disks detect
(``Device.ashift``, 9 unless a test says); ``zdb -l`` prints it.
"""

import re

from .model import (
    CLASSES, FS_BASE, GROUP_MIN, LABELS, MiB, CommandError, Device, Leaf,
    Pool, Vdev, _Unknown, nicenum)


class ZpoolCommands(object):
    """``zpool <command>``: ``_zpool_<command>(argv)``."""

    # --- zpool ---------------------------------------------------------------

    def _health(self, pool):
        if pool.health_override:
            return pool.health_override
        state = "ONLINE"
        for vdev in pool.vdevs:
            bad = len([leaf for leaf in vdev.leaves if leaf.state != "ONLINE"])
            if not bad or vdev.klass in ("cache", "spare"):
                continue
            if vdev.kind in ("disk",) or \
                    (vdev.kind == "mirror" and bad == len(vdev.leaves)) or \
                    (vdev.kind.startswith("raidz") and
                     bad > (1 if vdev.kind == "raidz" else
                            int(vdev.kind[-1]))):
                if vdev.klass == "log":
                    state = "DEGRADED"
                    continue
                return "UNAVAIL"
            state = "DEGRADED"
        return state

    def _vdev_state(self, vdev):
        bad = [leaf for leaf in vdev.leaves if leaf.state != "ONLINE"]
        if not bad:
            return "ONLINE"
        if vdev.kind == "disk":
            return bad[0].state
        limit = len(vdev.leaves) - 1 if vdev.kind == "mirror" else \
            (1 if vdev.kind == "raidz" else int(vdev.kind[-1]))
        return "UNAVAIL" if len(bad) > limit else "DEGRADED"

    def _pool_prop(self, pool, prop):
        usable, raw = self._capacity(pool)
        alloc = self._allocated(pool)
        values = {
            "name": pool.name, "guid": pool.guid,
            "health": self._health(pool), "size": str(raw),
            "allocated": str(alloc), "alloc": str(alloc),
            "free": str(raw - alloc), "freeing": "0",
            "capacity": str(alloc * 100 // raw if raw else 0),
            "cap": str(alloc * 100 // raw if raw else 0),
            "fragmentation": "0", "frag": "0", "dedupratio": "1.00",
            "expandsize": "-", "checkpoint": "-",
            "altroot": "-", "readonly": "on" if pool.readonly else "off",
            "cachefile": pool.props.get("cachefile", "-"),
            "ashift": pool.props.get("ashift", "0"),
            "multihost": pool.props.get("multihost", "off"),
        }
        if prop not in values:
            raise CommandError("property '%s' is not a valid pool or vdev "
                               "property" % prop, rc=2)
        return values[prop]

    def _zpool_get(self, argv):
        """``zpool get -Hp -o <fields> <props> [--] <pool>``: the pool
        properties _pool_prop knows, a line each, in the order asked."""
        opts, args = self._getopt(argv, 2, "Hpo:")
        flags = dict(opts)
        if "H" not in flags or "o" not in flags or len(args) != 2:
            raise _Unknown()
        fields = flags["o"].split(",")
        if not set(fields) <= {"name", "property", "value"}:
            raise _Unknown()
        pool = self._open_pool(args[1])
        lines = []
        for prop in args[0].split(","):
            cells = {"name": pool.name, "property": prop,
                     "value": self._pool_prop(pool, prop)}
            lines.append("\t".join(cells[f] for f in fields))
        return "".join(line + "\n" for line in lines)

    def _zpool_list(self, argv):
        opts, args = self._getopt(argv, 2, "HpPvgo:")
        flags = dict(opts)
        if "H" not in flags or "o" not in flags:
            raise _Unknown()
        columns = flags["o"].split(",")
        if "v" in flags and (("P" in flags) == ("g" in flags) or
                             columns != ["name"]):
            raise _Unknown()
        if args:
            pools = [self._open_pool(name) for name in args]
        else:
            pools = sorted((p for p in self.pools if p.state == "ACTIVE"),
                           key=lambda p: p.name)
        lines = []
        for pool in pools:
            lines.append("\t".join(self._pool_prop(pool, c) for c in columns))
            if "v" in flags:
                lines += self._list_vdev_lines(pool, guids="g" in flags)
        return "".join(line + "\n" for line in lines)

    def _list_vdev_lines(self, pool, guids=False):
        """``zpool list -v -H -P``: print_list_stats(). Vdev lines are a tab,
        the name and always the fixed statistics columns; class headers are
        printed with spaces and dashes, even with -H. With -g instead of
        -P, every vdev is named by its guid."""
        dashes = ("%-9s      -      -      -        -         -      -"
                  "      -      -         -")

        def stats(size, alloc, toplevel, state):
            if not toplevel:
                return "\t-\t-\t-\t-\t-\t-\t-\t-\t%s" % state
            return "\t%s\t%s\t%s\t-\t-\t0%%\t%d%%\t1.00x\t%s" % (
                nicenum(size), nicenum(alloc), nicenum(size - alloc),
                alloc * 100 // size if size else 0, state)

        lines = []
        usable, raw = self._capacity(pool)
        alloc = self._allocated(pool)
        groups = [(None, ""), ("dedup", "dedup"), ("special", "special"),
                  ("log", "logs"), ("cache", "cache"), ("spare", "spare")]
        for klass, header in groups:
            vdevs = [v for v in pool.vdevs if v.klass == klass]
            if not vdevs:
                continue
            if header:
                lines.append(dashes % header)
            for index, vdev in enumerate(pool.vdevs):
                if vdev.klass != klass:
                    continue
                size = min(leaf.size for leaf in vdev.leaves) - LABELS
                if vdev.kind.startswith("raidz"):   # raw size, with parity
                    size *= len(vdev.leaves)
                share = alloc * size // raw if raw else 0
                top = klass not in ("cache", "spare")
                if vdev.kind == "disk":
                    leaf = vdev.leaves[0]
                    lines.append("\t%s%s" % (
                        leaf.guid if guids else leaf.path, stats(
                            size, share, top, self._leaf_state(leaf, klass))))
                    continue
                lines.append("\t%s%s" % (
                    vdev.guid if guids else "%s-%d" % (vdev.kind, index),
                    stats(size, share, top, self._vdev_state(vdev))))
                for leaf in vdev.leaves:
                    lines.append("\t%s%s" % (
                        leaf.guid if guids else leaf.path, stats(
                            0, 0, False, self._leaf_state(leaf, klass))))
        return lines

    @staticmethod
    def _leaf_state(leaf, klass):
        if klass == "spare" and leaf.state == "ONLINE":
            return "AVAIL"
        return leaf.state

    def _parse_vdevs(self, words, name, force):
        """zpool create's vdev words -> [(kind, klass, [paths])]."""
        groups, klass, current = [], None, None
        for word in words:
            if word in CLASSES:
                klass, current = word, None
            elif word in GROUP_MIN:
                current = [word if word != "raidz" else "raidz1", klass, []]
                groups.append(current)
            elif word.startswith("/"):
                if current is None:       # a plain device: its own vdev
                    groups.append(["disk", klass, [word]])
                else:                     # joins the mirror/raidz before it
                    current[2].append(word)
            else:
                raise CommandError("cannot open '%s': no such device in "
                                   "/dev\nmust be a full path or shorthand "
                                   "device name" % word)
        for kind, klass, paths in groups:
            need = GROUP_MIN.get(kind, 1)
            if len(paths) < need:
                raise CommandError("invalid vdev specification: %s requires "
                                   "at least %d devices" % (kind, need))
            if klass in ("cache", "spare") and kind != "disk":
                raise CommandError("invalid vdev specification: %s devices "
                                   "cannot be in a %s" % (klass, kind))
            if klass in ("log", "special", "dedup") and \
                    kind not in ("disk", "mirror"):
                raise CommandError("invalid vdev specification: unsupported "
                                   "'%s' device: %s" % (klass, kind))
        if not [g for g in groups if g[1] is None]:
            raise CommandError("invalid vdev specification: at least one "
                               "toplevel vdev must be specified")
        kinds = set(g[0] for g in groups if g[1] is None)
        if len(kinds) > 1 and not force:
            raise CommandError(
                "invalid vdev specification\nuse '-f' to override the "
                "following errors:\nmismatched replication level: both %s "
                "vdevs are present" % " and ".join(sorted(kinds)))
        return groups

    def _check_leaf_free(self, path, force):
        """make_leaf_vdev() and is_device_in_use(): (problem, whether -f
        overrides it) for one device and its partitions and holders."""
        for member in self._family(path):
            if member.mountpoint == "[SWAP]":
                return "%s is currently used by swap. Please see swapon(8)." \
                    % member.path, False
            if member.mountpoint:
                return "%s is currently mounted on %s" % (
                    member.path, member.mountpoint), False
            # a device mapper, md or multipath device is itself usable (a
            # leaf of its own, not partitioned); only one built on the
            # device holds it (the kernel refuses ZFS's exclusive open)
            if member.path != self.devices[path].path and \
                    member.kind not in ("disk", "part"):
                return "%s is in use by %s" % (member.path, member.kind), \
                    False
            label = member.label
            if label:
                pool = self._active_pool(label["pool"])
                if pool is not None and pool.guid == label["guid"]:
                    return "%s is part of active pool '%s'" % (
                        member.path, label["pool"]), False
                if [p for p in self.pools if p.guid == label["guid"] and
                        p.state == "EXPORTED"]:
                    return "%s is part of exported pool '%s'" % (
                        member.path, label["pool"]), True
                # a destroyed pool's label does not hold the device
            for sig in member.signatures:
                if "TYPE" in sig:
                    return "%s contains a filesystem of type '%s'" % (
                        member.path, sig["TYPE"]), True
                if sig.get("PTTYPE", "gpt") != "gpt":
                    return ("%s does not contain an EFI label but it may "
                            "contain partition\ninformation in the MBR."
                            % member.path), True
        return None, True

    def _zpool_create(self, argv):
        opts, args = self._getopt(argv, 2, "fo:O:m:")
        if not args:
            raise CommandError("missing pool name argument", rc=2)
        force = ("f", None) in opts
        name, words = args[0], args[1:]
        errprefix = "cannot create '%s'" % name
        if not re.match(r"^[A-Za-z][A-Za-z0-9_.: -]*$", name) or \
                re.match(r"^(mirror|raidz|draid|spare|log)", name) or \
                re.match(r"^c[0-9]", name):
            raise CommandError("%s: invalid name" % errprefix)
        pool_props, fs_props = {}, {}
        for flag, value in opts:
            if flag == "o":
                key, _, val = value.partition("=")
                if key == "ashift" and not (val.isdigit() and
                                            (9 <= int(val) <= 16 or
                                             val == "0")):
                    raise CommandError("property 'ashift' number %s is "
                                       "invalid." % val, rc=2)
                if key not in ("cachefile", "ashift", "autotrim",
                               "autoexpand", "comment", "compatibility",
                               "multihost"):
                    raise CommandError("property '%s' is not a valid pool or"
                                       " vdev property" % key, rc=2)
                pool_props[key] = val
            elif flag == "O":
                fs_props.update(self._parse_props([value], errprefix))
            elif flag == "m":
                fs_props["mountpoint"] = value
        for key, value in sorted(fs_props.items()):
            self._check_prop("filesystem", key, value, errprefix)
        if not words:
            raise CommandError("missing vdev specification", rc=2)
        for word in words:
            if word.startswith("/") and self._dev(word) is None:
                raise CommandError("cannot open '%s': No such file or "
                                   "directory" % word)
        groups = self._parse_vdevs(words, name, force)
        paths = [p for g in groups for p in g[2]]
        if len(set(paths)) != len(paths):
            raise CommandError("invalid vdev specification\nthe following "
                               "errors must be manually repaired:\na device"
                               " is named twice")
        must, may = [], []
        for path in paths:
            problem, fixable = self._check_leaf_free(self._dev(path).path,
                                                     force)
            if problem and not fixable:
                must.append(problem)
            elif problem and not force:
                may.append(problem)
        if must:
            raise CommandError("invalid vdev specification\nthe following "
                               "errors must be manually repaired:\n" +
                               "\n".join(must))
        if may:
            raise CommandError("invalid vdev specification\nuse '-f' to "
                               "override the following errors:\n" +
                               "\n".join(may))
        if self._active_pool(name):
            raise CommandError("%s: pool already exists" % errprefix)
        pool = Pool(name, self._new_guid(), [], pool_props)
        for kind, klass, group_paths in groups:
            # vdev_open: the largest its leaves detect, unless -o ashift
            detected = max(self._dev(p).ashift for p in group_paths)
            leaves = [self._make_leaf(pool, p, klass) for p in group_paths]
            vdev = Vdev(kind, klass, leaves,
                        None if kind == "disk" else self._new_guid())
            vdev.ashift = int(pool_props.get("ashift") or 0) or detected
            pool.vdevs.append(vdev)
        self.pools.append(pool)
        root = self._new_dataset(pool, name, "filesystem", fs_props)
        root.refer = FS_BASE
        return ""

    def _make_leaf(self, pool, path, klass=None):
        """Label the device; a whole disk gets ZFS's own partitions (and a
        new GPT uuid). Given by a udev link, the leaf is the partition's
        link (<link>-part1), as ZFS names it."""
        dev = self._dev(path)
        for child in list(dev.children):
            self._remove_device(child)
        dev.children = []
        dev.signatures, dev.label = [], None
        if dev.kind == "disk":
            ptuuid = "%s-%s" % (self._new_guid()[-8:], pool.guid[-8:])
            dev.signatures = [{"PTTYPE": "gpt", "PTUUID": ptuuid}]
            data = self._part_name(dev.path, 1)
            reserved = self._part_name(dev.path, 9)
            self.devices[data] = Device(data, dev.size - 9 * MiB, "part",
                                        dev.path)
            self.devices[reserved] = Device(reserved, 8 * MiB, "part",
                                            dev.path)
            self.devices[data].ashift = dev.ashift
            self._link_partition(dev.path, data, 1)
            self._link_partition(dev.path, reserved, 9)
            dev.children = [data, reserved]
            linked = path != dev.path
            path = path + "-part1" if linked else data
            dev = self.devices[data]
        leaf = Leaf(path, dev.size, self._new_guid())
        dev.label = {"pool": pool.name, "guid": pool.guid,
                     "leaf_guid": leaf.guid, "klass": klass}
        return leaf

    def _visible_to_scan(self, pool, dirs):
        if not dirs:
            return True
        for leaf in pool.leaves():
            path = self.links.get(leaf.path, leaf.path)
            for where in dirs:
                where = self.links.get(where, where)
                if path == where or path.startswith(where.rstrip("/") + "/"):
                    return True
        return False

    def _labelled(self, pool):
        """Whether the pool's leaves still carry its labels."""
        return any(self._dev(leaf.path) is not None and
                   self._dev(leaf.path).label is not None and
                   self._dev(leaf.path).label["guid"] == pool.guid
                   for leaf in pool.leaves())

    def _importable(self, dirs):
        return [p for p in self.pools if p.state == "EXPORTED" and
                self._labelled(p) and self._visible_to_scan(p, dirs)]

    def _zpool_import(self, argv):
        opts, args = self._getopt(argv, 2, "o:Nd:")
        dirs = [v for f, v in opts if f == "d"]
        if not args:
            if [f for f, _ in opts if f != "d"]:
                raise _Unknown()
            pools = self._importable(dirs)
            if not pools:
                return "", "no pools available to import\n"
            return "\n".join(self._import_block(p) for p in pools), ""
        if len(args) not in (1, 2):
            raise _Unknown()
        props = {}
        for flag, value in opts:
            if flag == "o":
                key, _, val = value.partition("=")
                if key not in ("cachefile", "readonly"):
                    raise _Unknown()
                props[key] = val
        target = args[0]
        found = [p for p in self._importable(dirs)
                 if p.guid == target or p.name == target]
        if not found:
            raise CommandError("cannot import '%s': no such pool available"
                               % target)
        pool = found[0]
        if pool.elsewhere and pool.elsewhere[0] != self.hostid:
            # multihost sees the other host's writes (OpenZFS before 2.3.6
            # skips the check when the hostid is ours: then it imports)
            raise CommandError(
                "cannot import '%s': pool is imported on host '%s' "
                "(hostid=%x).\nExport the pool on the other system, then run"
                " 'zpool import'." % (pool.name, pool.elsewhere[1],
                                      pool.elsewhere[0]))
        pool.elsewhere = None
        name = args[1] if len(args) == 2 else pool.name
        if self._active_pool(name) and pool.props.get("multihost") == "on":
            # seen on OpenZFS 2.1 importing a multihost pool by guid: the
            # kernel's EEXIST, as libzfs words it
            raise CommandError("cannot import '%s': pool already exists"
                               % name)
        if self._active_pool(name):
            # do_import(): the name given (the guid, or the new name)
            raise CommandError(
                "cannot import '%s': a pool with that name already exists\n"
                "use the form 'zpool import <pool | id> <newpool>' to give it"
                " a new name" % args[-1])
        pool.readonly = props.get("readonly") == "on"
        pool.label_name = None
        if name != pool.name:               # zpool import <id> <newname>
            # read-only: the labels are not written, they keep the old name
            pool.label_name = pool.name if pool.readonly else None
            self._rename_pool(pool, name, labels=not pool.readonly)
        pool.state = "ACTIVE"
        if "cachefile" in props:
            pool.props["cachefile"] = props["cachefile"]
        return ""

    def _rename_pool(self, pool, new, labels=True):
        old = pool.name
        renamed = {}
        for name, ds in pool.datasets.items():
            ds.name = new + name[len(old):]
            renamed[ds.name] = ds
            if ds.origin:
                ds.origin = new + ds.origin[len(old):]
            ds.clones = [new + c[len(old):] for c in ds.clones]
        pool.datasets, pool.name = renamed, new
        for leaf in (pool.leaves() if labels else []):
            dev = self._dev(leaf.path)
            label = dev.label if dev else None
            if label and label["guid"] == pool.guid:
                label["pool"] = new

    def _import_block(self, pool):
        lines = ["   pool: %s" % pool.name, "     id: %s" % pool.guid,
                 "  state: ONLINE",
                 " action: The pool can be imported using its name or "
                 "numeric identifier.", " config:", "",
                 "\t%-12s  ONLINE" % pool.name]
        for index, vdev in enumerate(pool.vdevs):
            if vdev.kind != "disk":
                lines.append("\t  %-10s  ONLINE" % ("%s-%d" % (vdev.kind,
                                                               index)))
            for leaf in vdev.leaves:
                lines.append("\t    %-8s  ONLINE" % leaf.path.split("/")[-1])
        return "\n".join(lines) + "\n"

    def _zpool_export(self, argv):
        opts, args = self._getopt(argv, 2, "")
        if len(args) != 1:
            raise _Unknown()
        pool = self._open_pool(args[0])
        if pool.label_name:                  # read-only, renamed
            self._rename_pool(pool, pool.label_name, labels=False)
            pool.label_name = None
        pool.state, pool.readonly = "EXPORTED", False
        return ""

    def _zpool_sync(self, argv):
        """``zpool sync [pool...]``: the fake has no dirty data to write;
        an unknown pool fails as the real one does."""
        opts, args = self._getopt(argv, 2, "")
        for name in args:
            self._open_pool(name)
        return ""

    def _zpool_destroy(self, argv):
        opts, args = self._getopt(argv, 2, "")
        if len(args) != 1:
            raise _Unknown()
        pool = self._open_pool(args[0])
        if pool.readonly:
            raise CommandError("cannot destroy '%s': pool is read-only"
                               % pool.name)
        pool.state = "DESTROYED"
        return ""

    def _zpool_labelclear(self, argv):
        opts, args = self._getopt(argv, 2, "f")
        if len(args) != 1:
            raise _Unknown()
        path = args[0]
        if self._dev(path) is None:
            raise CommandError("failed to open %s: No such file or directory"
                               % path)
        dev = self._dev(path)
        if dev.label:
            # zpool_in_use(): the label's vdev must be in the imported
            # pool's config now (a replaced disk's stale label is not)
            pool = self._member_of_active(dev)
            if pool is not None:
                raise CommandError(
                    "labelclear operation failed.\n\tVdev %s is a member "
                    "(ACTIVE), of pool \"%s\".\n\tTo remove label information"
                    " from this device, export or destroy\n\tthe pool, or "
                    "remove %s from the configuration of this pool\n\tand "
                    "retry the labelclear operation." % (path, pool.name,
                                                         path))
            exported = [p for p in self.pools if p.guid == dev.label["guid"]
                        and p.state == "EXPORTED"]
            if exported and ("f", None) not in opts:
                raise CommandError("use '-f' to override the following "
                                   "error:\n%s is a member of exported pool "
                                   "\"%s\"" % (path, exported[0].name))
        dev.label = None
        return ""

    def _zpool_status(self, argv):
        opts, args = self._getopt(argv, 2, "Px")
        if sorted(opts) not in ([("P", None)], [("P", None), ("x", None)]) \
                or len(args) != 1:
            raise _Unknown()
        pool = self._open_pool(args[0])
        text = self._status_text(pool)
        if ("x", None) in opts and "\nstatus: " not in text:
            # -x: a pool whose status is OK (zpool_get_status) is one line
            return "pool '%s' is healthy\n" % pool.name
        return text

    def _status_text(self, pool):
        health = self._health(pool)
        leaves = pool.leaves()
        # libzfs's status looks at data, log and cache leaves, not spares
        used = [leaf for vdev in pool.vdevs if vdev.klass != "spare"
                for leaf in vdev.leaves]
        out = ["  pool: %s" % pool.name, " state: %s" % health]
        # zpool status's own words (OpenZFS zpool_main.c)
        see = "   see: https://openzfs.github.io/openzfs-docs/msg/ZFS-8000-"
        replicas = ["\tSufficient replicas exist for the pool to continue "
                    "functioning in a",
                    "\tdegraded state."]
        if health in ("UNAVAIL", "FAULTED", "SUSPENDED"):
            out += ["status: One or more devices are faulted in response to "
                    "IO failures.",
                    "action: Make sure the affected devices are connected, "
                    "then run 'zpool clear'.",
                    see + "HC"]
        elif pool.resilvering:   # checked first by libzfs
            out += ["status: One or more devices is currently being "
                    "resilvered.  The pool will",
                    "\tcontinue to function, possibly in a degraded state.",
                    "action: Wait for the resilver to complete."]
        elif any(not leaf.present for leaf in used):
            out += ["status: One or more devices could not be used because "
                    "the label is missing or",
                    "\tinvalid.  Sufficient replicas exist for the pool to "
                    "continue",
                    "\tfunctioning in a degraded state.",
                    "action: Replace the device using 'zpool replace'.",
                    see + "4J"]
        elif any(leaf.state == "FAULTED" for leaf in used):
            out += ["status: One or more devices are faulted in response to "
                    "persistent errors."] + replicas + [
                    "action: Replace the faulted device, or use 'zpool clear'"
                    " to mark the device",
                    "\trepaired.",
                    see + "K4"]
        elif any(leaf.state == "OFFLINE" for leaf in used):
            out += ["status: One or more devices has been taken offline by "
                    "the administrator."] + replicas + [
                    "action: Online the device using 'zpool online' or "
                    "replace the device with",
                    "\t'zpool replace'."]
        out += ["config:", ""]
        width = max([len(pool.name), 10] +
                    [len(leaf.path) + 4 for leaf in leaves])

        def row(depth, name, state, errors=(0, 0, 0), aux="", spare=False):
            line = "\t%s%s  %-8s" % (" " * depth, name.ljust(width - depth),
                                     state)
            if not spare:
                line += " %5d %5d %5d" % errors
            return line + ("  " + aux if aux else "")

        def leaf_row(depth, leaf, spare=False):
            name = leaf.path if leaf.present else leaf.guid
            aux = ("was %s" % leaf.path) if not leaf.present else leaf.aux
            return row(depth, name, self._leaf_state(
                leaf, "spare" if spare else None), leaf.errors, aux, spare)

        out.append("\t%s  STATE     READ WRITE CKSUM" % "NAME".ljust(width))
        out.append(row(0, pool.name, health, aux="insufficient replicas"
                       if health == "UNAVAIL" else ""))
        for klass, header in [(None, "")] + [
                ("dedup", "dedup"), ("special", "special"), ("log", "logs"),
                ("cache", "cache"), ("spare", "spares")]:
            vdevs = [(i, v) for i, v in enumerate(pool.vdevs)
                     if v.klass == klass]
            if not vdevs:
                continue
            if header:
                out.append("\t%s%s" % (header, "\t" if klass in (
                    "dedup", "special", "log") else ""))
            for index, vdev in vdevs:
                if vdev.kind == "disk":
                    out.append(leaf_row(2, vdev.leaves[0], klass == "spare"))
                    continue
                out.append(row(2, "%s-%d" % (vdev.kind, index),
                               self._vdev_state(vdev)))
                for leaf in vdev.leaves:
                    out.append(leaf_row(4, leaf))
        out += ["", "errors: No known data errors"]
        return "\n".join(out) + "\n"
