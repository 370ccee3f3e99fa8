"""An SR's figures from its pool: what ``zpool iostat`` and ``zpool list``
know and a VM's disk view cannot (srmetrics publishes them).

Per sample, three bounded commands with parsable output:
  zpool iostat -Hpy -l <pool> <interval> 1   operations, bytes and latency
                                             over the interval (-y: not the
                                             averages since import)
  zpool list -Hp -o ...                      pool size, space, fragmentation,
                                             health
  zfs get -Hp -o property,value ...          the SR dataset's space and
                                             compression ratio, and whose
                                             SR it is
A command that fails or runs past the sample's deadline leaves its figures
unknown (NaN), never the sample: a suspended pool still reports its
health.
"""

from zfsng import errors, meta, zfs

NAN = float("nan")

# zpool iostat -Hp -l columns (2.1 and 2.3 agree on these; later ones,
# such as 2.2's rebuild wait, are not read)
_IOSTAT = (("read_iops", 3, 1), ("write_iops", 4, 1),
           ("read_throughput", 5, 1), ("write_throughput", 6, 1),
           ("read_latency", 7, 1e-6), ("write_latency", 8, 1e-6))
_LIST = ("size", "allocated", "free", "fragmentation", "health")
_GET = ("used", "available", "compressratio", meta.SR_UUID)

# health as a number: an alarm can watch for anything above 0
HEALTH = {"ONLINE": 0, "DEGRADED": 1}
NOT_SERVING = 2


def _number(text, scale=1):
    """A -p figure as a float; "-" (no value) and junk as NaN."""
    try:
        return float(text.rstrip("x%")) * scale
    except (AttributeError, ValueError):
        return NAN


def parse_iostat(text):
    """Rates and latencies from the one report of ``zpool iostat -Hpy -l``
    (latencies in nanoseconds, given in milliseconds)."""
    lines = [line for line in text.split("\n") if line]
    cells = lines[-1].split("\t") if lines else []
    return dict((name, _number(cells[i], scale) if i < len(cells) else NAN)
                for name, i, scale in _IOSTAT)


def parse_list(text):
    cells = (text.strip("\n").split("\t") + [""] * len(_LIST))[:len(_LIST)]
    row = dict(zip(_LIST, cells))
    figures = dict(("pool_" + k, _number(row[k]))
                   for k in ("size", "allocated", "free"))
    figures["fragmentation"] = _number(row["fragmentation"])
    figures["health"] = float(HEALTH.get(row["health"], NOT_SERVING))
    return figures


def parse_get(text):
    row = dict(line.split("\t", 1) for line in text.split("\n")
               if line.count("\t") == 1)
    return {"sr_used": _number(row.get("used")),
            "sr_available": _number(row.get("available")),
            "compressratio": _number(row.get("compressratio"))}


def sr_uuid_of(text):
    """The SR uuid in a ``zfs get`` answer of sample's: whose dataset
    it is (a pool of the same name may have replaced it)."""
    for line in text.split("\n"):
        prop, _, value = line.partition("\t")
        if prop == meta.SR_UUID:
            return value
    return None


def _out(command, *args):
    """command's output, "" when it failed (the caller's call deadline
    bounds it: srmetrics gives each sample its own)."""
    try:
        return command(*args, retry_busy=False)
    except errors.StorageError:
        return ""


def sample(pool, sr, interval):
    """(every figure of pool and sr, the rates over interval seconds; the
    uuid of the SR whose dataset sr is, None if none is)."""
    figures = parse_iostat(_out(zfs.zpool, "iostat", "-Hpy", "-l", pool,
                                str(interval), "1"))
    figures.update(parse_list(_out(        # none: health NOT_SERVING
        zfs.zpool, "list", "-Hp", "-o", ",".join(_LIST), pool)))
    got = _out(zfs.zfs, "get", "-Hp", "-o", "property,value",
               ",".join(_GET), sr)
    figures.update(parse_get(got))
    return figures, sr_uuid_of(got)
