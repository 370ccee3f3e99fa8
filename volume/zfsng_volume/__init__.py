"""zfs-ng's volume plugin: Plugin.*, SR.* and Volume.* on pools and zvols.

It stands on the shared core (the ``zfsng`` package) and the core never
imports it: the line between them is this package's folder.
"""
