"""udev, asked through ``udevadm``: the one home of both questions zfs-ng
puts to it. ``settle`` waits (bounded) for queued events; ``links`` reads a
device's symlinks as udev recorded them. SR.create asks for a disk's
/dev/disk/by-id names (``devices``), the zvol checks for a zvol's
/dev/zvol link (``zvoldev``): one argv, one parser, one place to read.
"""

from zfsng import runner


def settle(timeout):
    """``udevadm settle``: returns once udev has handled every queued
    event, or after timeout seconds (whole, at least 1): the bound."""
    runner.run(["udevadm", "settle", "--timeout=%d" % max(1, int(timeout))])


def links(device):
    """(the device's symlinks relative to /dev, as udev recorded them, or
    None; the reason when udevadm could not say)."""
    result = runner.run(["udevadm", "info", "--query=symlink",
                         "--name=" + device])
    if result.rc != 0:
        return None, "udevadm info %s failed: %s" % (device,
                                                     result.err.strip())
    return result.out.split(), None
