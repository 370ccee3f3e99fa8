#!/usr/bin/python3
"""zfs-ng volume plugin: every Plugin.*, SR.* and Volume.* executable in this
directory is a symlink to this script; the method is the name it runs as."""

import sys

from zfsng_volume.main import volume_main

if __name__ == "__main__":
    sys.exit(volume_main(sys.argv))
