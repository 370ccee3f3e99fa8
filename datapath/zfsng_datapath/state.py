"""Host-local datapath state: one JSON record per (URI, domain).

Where the records live, their file names and their fields are the core's
(zfsng/attachstate.py): the volume plugin reads them too. This module is
the datapath's side: it writes and removes them, and names the lock a
call holds on a VDI.
"""

from zfsng import attachstate, lock, runfiles

path = attachstate.path
all_states = attachstate.all_records


def vdi_lock(head):
    """The lock a datapath call holds on a VDI (its zvol, head) while it
    changes the VDI's tapdisk; taken before the SR lock."""
    return lock.held("datapath-" + head)


def load(dataset, domain):
    """The state dict, or None if this host holds no state for it."""
    return runfiles.read_json(path(dataset, domain))


def save(st):
    runfiles.write_json(path(st["dataset"], st["domain"]), st)


def remove(dataset, domain):
    runfiles.remove(path(dataset, domain))
