"""zfs-ng's raw datapath: a zvol handed to a guest through tapdisk.

xapi picks a datapath from the scheme of a volume's URI (shared/smapiv3.md):
the volume plugin answers ``zfs-ng:///<pool>/.../<vdi uuid>`` (a VDI) or
``zfs-ng:///<pool>/.../<parent uuid>@<snapshot uuid>`` (a snapshot VDI), and
xapi-storage-script runs the executables of
``<root>/datapath/zfs-ng/`` with it. The URI names the dataset, so this
package never asks the volume plugin anything.

Modules
  uri       URIs and domains: what a call is about
  tapctl    every ``tap-ctl`` command, with its syntax and source
  device    the zvol's device node: bounded wait, and proof it is the zvol
  state     one JSON file per (URI, domain) under /var/run/nonpersistent
  datapath  the Datapath.* methods
  plugin    Plugin.Query
"""
