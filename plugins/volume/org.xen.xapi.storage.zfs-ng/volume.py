#!/usr/bin/python3 -S
"""zfs-ng volume plugin: every Plugin.*, SR.* and Volume.* executable in this
directory is a symlink to this script; the method is the name it runs as.

It runs with -S, without the site module: every xapi call starts a new
interpreter, and site's start-up is a good part of Python 3.6's. The one
directory the plugin needs from it, the one its package is installed in,
is added here (`make install` writes it)."""

import sys

SITELIB = "/usr/lib/python3.6/site-packages"
sys.path.append(SITELIB)

from zfsng_volume.main import volume_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(volume_main(sys.argv))
