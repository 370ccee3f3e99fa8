"""zfs-ng's main job, shown on a real pool: run in the test guest by
``make demo``. It calls the installed plugin exactly as xapi-storage-script
does and prints each call with its answer, then what ZFS itself shows."""

import base64
import json
import os
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from plugin_client import Plugin, marked_blocks  # noqa: E402

ROOT = os.environ.get("ZFSNG_ROOT", "/tmp/zfsng-root")
DISKS = ["/dev/disk/by-id/virtio-zfsng-d1", "/dev/disk/by-id/virtio-zfsng-d2"]


def step(plugin, method, **args):
    shown = dict((k, v) for k, v in args.items())
    print("\n$ %s --json <<< %s" % (method, json.dumps(shown)))
    result = plugin(method, **args)
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text if len(text) < 1500 else text[:1500] + "\n  ...")
    return result


def show(*argv):
    print("\n# " + " ".join(argv))
    sys.stdout.write(subprocess.check_output(list(argv)).decode())


def changed_blocks(plugin, sr, base, new):
    """Volume.list_changed_blocks, its bitmap shown as the blocks it marks
    (the bitmap of a 10 GiB disk is 20 KiB)."""
    print("\n$ Volume.list_changed_blocks --json <<< %s" % json.dumps(
        {"sr": sr, "key": base, "key2": new, "offset": 0, "length": -1}))
    result = plugin("Volume.list_changed_blocks", sr=sr, key=base, key2=new,
                    offset=0, length=-1)
    bits = base64.b64decode(result["bitmap"])
    marked = marked_blocks(result)
    print('{"granularity": %d, "bitmap": <%d bytes, blocks marked: %s>}'
          % (result["granularity"], len(bits), marked))


def backup_chain(plugin, sr, vdi):
    """What a Xen Orchestra delta backup asks: CBT on, a snapshot, 1 MiB
    written at 5 GiB, a snapshot, the blocks that changed between them,
    then the first snapshot's data freed (its metadata kept)."""
    step(plugin, "Volume.enable_cbt", sr=sr, key=vdi["key"])
    first = step(plugin, "Volume.snapshot", sr=sr, key=vdi["key"])
    path = "/dev/zvol/" + vdi["uri"][0][len("zfs-ng:///"):]
    print("\n# a guest writes 1 MiB at 5 GiB")
    subprocess.check_call(["udevadm", "settle"])
    subprocess.check_call(["dd", "if=/dev/urandom", "of=" + path, "bs=1M",
                           "count=1", "seek=5120", "oflag=direct",
                           "status=none"])
    second = step(plugin, "Volume.snapshot", sr=sr, key=vdi["key"])
    changed_blocks(plugin, sr, first["key"], second["key"])
    step(plugin, "Volume.data_destroy", sr=sr, key=first["key"])
    step(plugin, "Volume.stat", sr=sr, key=first["key"])
    return [first["key"], second["key"]]


def main():
    plugin = Plugin(ROOT, env={"ZFSNG_RUN_DIR": "/tmp/zfsng-run"})
    sr_uuid = str(uuid.uuid4())
    step(plugin, "Plugin.Query")
    config = step(plugin, "SR.create", uuid=sr_uuid, name="zfsng",
                  description="demo SR",
                  configuration={"vdev": "mirror %s %s" % tuple(DISKS)})
    sr = step(plugin, "SR.attach", configuration=config)
    step(plugin, "SR.stat", sr=sr)
    vdi = step(plugin, "Volume.create", sr=sr, name="demo disk",
               description="10 GiB, thin", size=10 << 30, sharable=False)
    step(plugin, "Volume.set", sr=sr, key=vdi["key"], k="vdi-type", v="user")
    tracked = backup_chain(plugin, sr, vdi)
    snap = step(plugin, "Volume.snapshot", sr=sr, key=vdi["key"])
    from_snap = step(plugin, "Volume.clone", sr=sr, key=snap["key"])
    from_live = step(plugin, "Volume.clone", sr=sr, key=vdi["key"])
    step(plugin, "Volume.resize", sr=sr, key=from_live["key"],
         new_size=12 << 30)
    show("zfs", "list", "-t", "all", "-o",
         "name,volsize,used,origin,volblocksize,compression,volmode")
    print("\n# the original VDI still has a snapshot and clones: destroying"
          " it hides it until they are gone")
    step(plugin, "Volume.destroy", sr=sr, key=vdi["key"])
    step(plugin, "SR.ls", sr=sr)
    step(plugin, "SR.detach", sr=sr)
    step(plugin, "SR.probe", configuration={"device": ",".join(DISKS)})
    sr = step(plugin, "SR.attach", configuration=config)
    step(plugin, "Volume.stat", sr=sr, key=from_snap["key"])
    for key in [snap["key"], from_snap["key"], from_live["key"]] + tracked:
        step(plugin, "Volume.destroy", sr=sr, key=key)
    show("zfs", "list", "-t", "all", "-o", "name")
    step(plugin, "SR.destroy", sr=sr)
    show("zpool", "list")
    print("\nzfs-ng demo: OK")


if __name__ == "__main__":
    main()
