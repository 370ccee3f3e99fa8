"""zfs-ng's raw datapath: a zvol handed to a guest through tapdisk.

xapi picks a datapath from the scheme of a volume's URI (xapi-storage-script):
the volume plugin answers ``zfs-ng:///<pool>/.../<vdi uuid>`` (a VDI) or
``zfs-ng:///<pool>/.../<parent uuid>@<snapshot uuid>`` (a snapshot VDI), and
xapi-storage-script runs the executables of
``<root>/datapath/zfs-ng/`` with it. The URI names the dataset, so this
package never asks the volume plugin anything.

Modules (on the core library, ``zfsng``: see ARCHITECTURE.md)
  uri       URIs and domains: what a call is about
  scope     the proof that a URI names a zfs-ng VDI
  tapctl    every ``tap-ctl`` command, with its syntax and source
  state     one JSON file per (URI, domain) under /var/run/nonpersistent
  reset     reset-on-boot of a non-persistent disk
  iostat    the /dev/sm/phy links xcp-rrdd's iostat plugin counts by
  datapath  the Datapath.* methods
  plugin    Plugin.Query
  errors    the datapath's own typed errors
  main      the entry point of the executables
"""
