#!/usr/bin/python3 -S
"""zfs-ng datapath plugin (URI scheme zfs-ng): Plugin.Query and every
Datapath.* executable in this directory are symlinks to this script; the
method is the name it runs as.

It runs with -S, without the site module, and adds the one directory it
needs itself (see the volume plugin's volume.py)."""

import sys

SITELIB = "/usr/lib/python3.6/site-packages"
sys.path.append(SITELIB)

from zfsng_datapath.main import datapath_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(datapath_main(sys.argv))
