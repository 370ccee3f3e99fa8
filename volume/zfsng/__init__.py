"""zfs-ng: an XCP-ng SMAPIv3 storage plugin that maps VDIs onto ZFS zvols."""

VERSION = "0.1.0"
