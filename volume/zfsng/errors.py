"""Typed errors, and how each one reaches xapi.

Every failure a user can see is one of these classes. Each carries the XenAPI
error code xapi-storage-script forwards to xapi, and its parameters. Most are
SR_BACKEND_FAILURE with ``[ErrorName, message]`` so that ``xe`` shows both a
stable name to search for and a sentence saying what to do. The interface's
own errors (Volume_does_not_exist, ...) use the code xapi matches on.
"""


class StorageError(Exception):
    """Base class: an error with a XenAPI code and string parameters."""

    code = "SR_BACKEND_FAILURE"

    def __init__(self, message):
        Exception.__init__(self, message)
        self.message = message

    def params(self):
        return [type(self).__name__, self.message]


# --- the SMAPIv3 interface's own errors -----------------------------------

class InterfaceError(StorageError):
    """An error the v5 interface names. Sent as the generated Python
    bindings send it (xapi/__init__.py handle_exception): code
    SR_BACKEND_FAILURE, params [ErrorName, argument]; the daemon passes code
    and params to xapi unchanged."""

    def __init__(self, arg, message=None):
        StorageError.__init__(self, message or arg)
        self.arg = arg

    def params(self):
        return [type(self).__name__, self.arg]


class Unimplemented(InterfaceError):
    """The method exists in the interface but zfs-ng does not do it."""


class Sr_not_attached(InterfaceError):  # noqa: N801 (name fixed by xapi)
    """The sr string names no attached zfs-ng SR."""


class SR_does_not_exist(InterfaceError):  # noqa: N801
    """No zfs-ng SR with that identity can be found."""


class Volume_does_not_exist(InterfaceError):  # noqa: N801
    """No visible volume has that key."""


# --- XenAPI errors with their own codes ------------------------------------

class SrNotEmpty(StorageError):
    """SR.destroy while VDIs remain: refuse rather than lose disks."""

    code = "SR_NOT_EMPTY"

    def params(self):
        return []


class SrHoldsOtherData(StorageError):
    """SR.destroy of an SR whose dataset holds datasets, snapshots or
    bookmarks zfs-ng did not make (an admin's ``zfs recv`` copy, a
    tank/backups filesystem, a snapshot of the pool): refused, nothing
    changed; the message names them."""


class VdiShrinkNotAllowed(StorageError):
    """Volume.resize to a smaller size (XenAPI 'VDI shrinking not allowed')."""

    code = "SR_BACKEND_FAILURE_79"


# --- zfs-ng's own failures (SR_BACKEND_FAILURE [name, message]) -------------

class InvalidArgument(StorageError):
    """A call's argument has the wrong type or an unacceptable value."""


class DataDestroyed(StorageError):
    """The VDI is a snapshot whose data Volume.data_destroy freed: only its
    metadata and its place for changed block tracking are left."""


class CbtNotEnabled(StorageError):
    """Changed block tracking is not enabled on the VDI the call needs it
    on (xe vdi-enable-cbt)."""


class InvalidConfiguration(StorageError):
    """A device-config key or value is unknown, malformed or inconsistent."""


class DeviceNotFound(StorageError):
    """A device named in device-config does not exist or is not a block device."""


class DeviceInUse(StorageError):
    """A device is mounted, in a pool, or held by another driver."""


class DeviceHasData(StorageError):
    """A device carries a filesystem, partition table or pool label."""


class PoolNameTaken(StorageError):
    """The pool name to create is already used."""


class ZfsError(StorageError):
    """A zfs or zpool command failed; the message holds its stderr."""


class PoolNotFound(ZfsError):
    """A pool named in device-config is not imported or importable.

    A ZfsError: zpool says "no such pool" for it, and code that handles
    any failed zfs command (``except ZfsError``) must handle this one too.
    """


class SrNotFound(StorageError):
    """SR.attach found neither the SR's pool (not imported, not
    importable) nor its dataset, and nothing on this host records a
    destroy of it: the message says how to bring it back, or how to
    forget an SR whose storage is proved gone (xe sr-forget)."""


class PoolImportedElsewhere(ZfsError):
    """The pool is imported by another host (multihost protection saw its
    writes, or its labels say so): importing it here would corrupt it."""


class HostIdMissing(StorageError):
    """This host has no ZFS hostid, which multihost protection needs."""


class PoolNameCollision(ZfsError):
    """zpool import: an imported pool already has the name this pool's
    labels give it (two pools named after SRs with the same name-label).
    The pool can be imported under another name."""


class DatasetNotFound(ZfsError):
    """zfs said the dataset does not exist."""


class DatasetExists(ZfsError):
    """zfs said the dataset already exists."""


class DatasetBusy(ZfsError):
    """zfs said the dataset or pool is busy (transient)."""


class OutOfSpace(ZfsError):
    """zfs said there is not enough space."""


class RollbackBlocked(ZfsError):
    """zfs refused a rollback: snapshots newer than its target exist (and
    zfs-ng never passes -r, which would destroy them)."""


class PoolSuspended(ZfsError):
    """The pool stopped its I/O (its disks stopped answering, or multihost
    could not write for too long): nothing can change until the disks are
    back and ``zpool clear`` resumes it."""


class DeviceNotReady(StorageError):
    """A zvol's /dev/zvol node did not appear, or did not prove to be the
    zvol, within the wait bound."""


class CommandTimeout(StorageError):
    """A command did not finish within its bound (see ``runner``): the pool
    may be suspended or a device stuck. It was killed (or, stuck in the
    kernel, abandoned); the call changed nothing more, and the next call
    repairs whatever the command may have done. pid: the process left
    behind in the kernel, if any (``abandoned`` waits for it)."""

    def __init__(self, message, pid=None):
        StorageError.__init__(self, message)
        self.pid = pid


class SnapshotChanged(StorageError):
    """A snapshot a call read outside the SR lock (Volume.data_destroy's
    map) was changed meanwhile (a revert moved it, or it was made again):
    nothing was changed; the call can be made again."""


class VdiInUse(StorageError):
    """The VDI's zvol is open (a running VM's tapdisk, a dom0 user): a
    change that needs it closed, such as a revert, is refused. xapi shuts
    the VM down before it reverts its disks."""


class SrBusy(StorageError):
    """Another call held the SR (or the pools) for longer than a caller
    waits (``lock.WAIT``): usually a call stuck on a suspended pool."""


class VolumeTooLarge(StorageError):
    """A VDI size beyond the largest that ZFS, Linux and xapi can all hold
    (8 EiB less one block): refused before anything is created or grown,
    since a bigger zvol would break every later SR.ls of its SR in xapi."""


class MetadataUnreadable(StorageError):
    """A zfs-ng property of a VDI was set by hand to a value zfs-ng cannot
    read (keys that are not a JSON object); the message names the dataset
    and property to fix."""


class MetadataTooLarge(StorageError):
    """A name, description or key set does not fit in a ZFS user property."""


class InternalError(StorageError):
    """A bug in zfs-ng: the message says what broke; SMlog has the trace."""
