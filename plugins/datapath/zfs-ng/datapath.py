#!/usr/bin/python3
"""zfs-ng datapath plugin (URI scheme zfs-ng): Plugin.Query and every
Datapath.* executable in this directory are symlinks to this script; the
method is the name it runs as."""

import sys

from zfsng_datapath.main import datapath_main

if __name__ == "__main__":
    sys.exit(datapath_main(sys.argv))
