"""The datapath's own typed errors (see zfsng.errors for the scheme).

Each reaches xapi as SR_BACKEND_FAILURE with ``[ErrorName, message]``.
"""

from zfsng.errors import StorageError


class TapdiskUnavailable(StorageError):
    """tap-ctl cannot be run on this host (not installed, or no blktap):
    a guest disk needs XCP-ng's blktap; dom0 attaches do not."""


class TapdiskError(StorageError):
    """A tap-ctl command failed; the message holds the command, the errno
    name tap-ctl exited with and its stderr."""

    def __init__(self, message, rc=None):
        StorageError.__init__(self, message)
        self.rc = rc


class TapdevHeld(StorageError):
    """The block device of a tapdisk that died is still held open (by the
    VM's backend): no new tapdisk can take its minor until it is
    released."""


class NotAttached(StorageError):
    """activate/activate_readonly before attach for this domain."""


class NonpersistentResetBlocked(StorageError):
    """A non-persistent disk cannot be reset now: snapshots taken after its
    reset point are kept (reset.py moves them aside), and next to them the
    pool lacks the space for the reset disk (a thick disk's reservation).
    Nothing changed; the next open or close tries again."""


class NotAVdi(StorageError):
    """The URI names a dataset that is not a zfs-ng VDI (a zvol directly
    under a zfs-ng SR dataset whose org.xcp-ng.zfs-ng:vdi is its own uuid,
    or such a snapshot): the datapath never snapshots, rolls back or
    clones it."""


class NbdError(StorageError):
    """An NBD peer (a migration's destination) refused the export, failed
    a request, or stopped answering within the bound."""


class ComposePending(StorageError):
    """A VDI a storage migration wrote into (its mirror sink holds the
    guest's writes) that Volume.compose has not made whole yet: its own
    zvol is empty, the copied base is on the migration's parent VDI, so
    attaching or activating it would run a VM on a partial disk. Refused,
    nothing changed, for any VBD but the mirror's own."""


class MirrorFailed(StorageError):
    """A storage migration's mirror failed after xapi was told it was
    complete: the move is stopped (the VM stays on, or is halted on, this
    SR's intact disk) rather than finished onto a stale copy."""
