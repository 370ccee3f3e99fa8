"""A VM's life as xapi and xenopsd run it, played against a real Xen PV
domU whose disks are zfs-ng VDIs: start, reboot, shutdown (requested or
the guest's own), in xenopsd's order (xen-api v26.1.4, cited per step).
test_xen_vm.py plays one plug and one clean unplug of one VBD and cites
the xenstore side (Vbd3); this module strings those steps into VM
operations, with several VBDs and the datapath's open and close.

VM_start (xenops_server.ml:1673-1739): VM_create and VM_build (here ``xl
create -p``, a PV domain without disks, libxl 4.17 having no vbd3), then
per VBD VBD.activate_epoch_and_plug (:1684-1697): VBD_epoch_begin
(xenops_server_xen.ml:4022-4033 -> xapi-storage-script main.ml:1604-1617:
Datapath.open(persistent), persistent being ``VDI.on_boot = persist``,
xapi_xenops.ml:740-743), then vbd_plug = VBD_attach (Datapath.attach)
and VBD_activate (Datapath.activate, then Device.Vbd.add and the block
script: test_xen_vm.Vbd3). xapi then unpauses the domain.

VM_shutdown (xenops_server.ml:1740-1766), the part every halt shares:
Best_effort VM_pause, then per VBD vbd_unplug with force (:1664-1670):
VBD_deactivate (xenops_server_xen.ml:4422-4548: Device.hard_shutdown,
device.ml:335-366, Classic since tapback has no
feature-shutdown-request, device.ml:393-397; Device.Vbd.release,
device.ml:591-604; then Storage.deactivate: Datapath.deactivate) and
VBD_detach (:4550-4585, Storage.dp_destroy: Datapath.detach,
storage_smapiv1_wrapper.ml:535-575), then VM_destroy (``xl destroy`` and
the domain's backend dirs, domain.ml:909-926).

* ``xe vm-reboot`` is VM_reboot with a timeout (xenops_server.ml:1854-
  1877): VM_shutdown_domain(Reboot) (:2350-2370: Domain.shutdown writes
  control/shutdown, domain.ml:726-747, waits for the guest's ack,
  :753-790, then for the domain to shut down), VM_shutdown, VBD_epoch_end
  per VBD (Datapath.close, main.ml:1639-1658), VM_start, VM_unpause. A
  guest's own reboot takes the same path without the request
  (xenops_server.ml:3269-3276, on_reboot = restart).
* ``xe vm-shutdown`` is VM_poweroff with a timeout (:1823-1852):
  VM_shutdown_domain(PowerOff), VM_shutdown, then VBD_epoch_end.
* A guest that powers itself off gets VM_shutdown alone (VM_check_state,
  :3264-3268, on_shutdown = destroy -> Vm.Shutdown,
  xapi_xenops.ml:1168-1178): no VBD_epoch_end, so no Datapath.close.
* ``xe vm-shutdown --force`` is VM.hard_shutdown (xapi_vm.ml:371-389 ->
  Xapi_xenops.shutdown with no timeout, xapi_xenops.ml:3939-3951):
  VM_poweroff(id, None) (xenops_server.ml:1823-1853), whose VM_shutdown
  has no VM_shutdown_domain (:1746, map_or_empty on the timeout): the
  domain is paused and its VBDs unplugged by force while the guest's
  writes are in flight, then VM_destroy and VBD_epoch_end.
* ``xe vbd-plug`` on a running VM is VBD.plug (xapi_vbd.ml:35-97 ->
  Xapi_xenops.vbd_plug, xapi_xenops.ml:4151-4176: VBD.add, VBD.plug),
  VBD_hotplug (xenops_server.ml:1945-1946, 2748-2750): VBD_set_active,
  then vbd_plug (:1657-1662: VBD_attach, VBD_activate), with no
  VBD_epoch_begin: no Datapath.open. ``xe vbd-unplug`` is VBD.unplug
  (xapi_vbd.ml:98-115 -> xapi_xenops.ml:4178-4206, force false),
  VBD_hotunplug (xenops_server.ml:1947-1948): vbd_unplug without force
  (:1664-1670: VBD_deactivate, whose device shutdown is the clean one,
  xenops_server_xen.ml:4476-4487, then VBD_detach), then VBD_set_active
  false: no Datapath.close either.
* A read-only VBD (mode RO): xenopsd attaches it with read_write false
  (xenops_server_xen.ml:3987) and Device.Vbd.add writes the backend's
  mode "r" (device.ml:401,707); xapi's storage_mux then activates it with
  VDI.activate_readonly only if the SR declares VDI_ACTIVATE_READONLY,
  else with VDI.activate3 (storage_mux.ml:614-638), which
  xapi-storage-script turns into Datapath.activate_readonly or
  Datapath.activate (main.ml:1529-1560). tapback reads mode "r" into
  VDISK_READONLY (blktap tapback/backend.c:661-678), so blkfront makes
  the disk read-only.

* ``xe vm-suspend`` is VM_suspend (xenops_server.ml:1880-1902): VM_save
  then VM_shutdown(id, None), no VBD_epoch_end; ``xe vm-resume`` is
  VM_resume (:1903-1944): VM_create, VM_restore, then
  VM_restore_devices (:1773-1800: attach and activate per VBD, no
  VBD_epoch_begin) while the new domain is paused, then xapi's unpause.
  A live migration is VM_migrate (:2760-3225): VM_save on the source,
  VM_restore and VM_restore_devices into a new domain on the
  destination's VDIs, VM_unpause, and only then the source's
  VM_shutdown. VM_save and VM_restore are xl's save and restore here
  (Vm.save, Vm.resume).

xl keeps a shut-down domain (on_poweroff, on_reboot and on_crash
"preserve"), as xenopsd finds it, and the VM keeps its uuid across its
domains, as a VM does; each boot's domain has a name of its own (a fresh
console log).
"""

import copy
import json
import os
import re
import time
import uuid

from datapath_util import uri
from xapi_flows import domain_of
from test_xen_vm import DEVID, DOMU_INITRD, Vbd3, console, cpio_newc, \
    domains, tapback_slaves, wait_for, xl

MiB = 1 << 20
BLOCK = 64 * 1024
DOMU_INIT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         "vm-domu")
SHUTDOWN_REASONS = {0: "poweroff", 1: "reboot", 2: "suspend", 3: "crash"}


_XC = []


def hypervisor():
    """Xen's control interface (xen.lowlevel.xc), opened once."""
    if not _XC:
        from xen.lowlevel import xc
        _XC.append(xc.xc())
    return _XC[0]


def domain_info(domid):
    """Xen's own record of a domain, or None."""
    found = [d for d in hypervisor().domain_getinfo(domid, 1)
             if d["domid"] == domid]
    return found[0] if found else None


class Disk(object):
    """One VBD of the VM: its VDI, whether it persists, its device, its
    mode (read-only or not), and its SR when not the VM's own."""

    def __init__(self, vol, persistent, devid, readonly=False, sr=None):
        self.vol, self.persistent, self.devid = vol, persistent, devid
        self.readonly = readonly
        self.sr = sr
        self.vbd = None         # while plugged


class Vm(object):
    """A PV VM whose disks are zfs-ng VDIs, run as xenopsd runs it.
    ``INIT`` is the domU's /vm-init and ``MEMORY`` its MiB: a subclass
    may boot another init (tests/bench/bench_vm_fio.py: fio in the domU,
    whose libraries need more room in its initramfs)."""

    INIT = DOMU_INIT
    MEMORY = 256

    def __init__(self, store, plugin, dp, sr, name, tmp_path):
        self.store, self.plugin, self.dp, self.sr = store, plugin, dp, sr
        self.name, self.tmp = name, tmp_path
        self.uuid = str(uuid.uuid4())
        self.disks = []
        self.boot = 0
        self.domid = None
        self.consoles = []       # this boot's domains' names, in turn
        self.initrd = None       # this boot's
        self.calls = []          # the datapath calls, in order
        self.seconds = []        # how long each of them took
        self.unplugs = []        # what each backend did when unplugged
        self._features = None

    def add_disk(self, vol, persistent=True, readonly=False, sr=None):
        """A VBD of the VM (xe vbd-create): plugged at the next start, or
        now by hotplug(). ``sr``: the VDI's SR, if not the VM's."""
        disk = Disk(vol, persistent, DEVID + 16 * len(self.disks), readonly,
                    sr)
        self.disks.append(disk)
        return disk

    # --- the storage calls ---------------------------------------------

    def call(self, disk, method, **args):
        """A Datapath call as xapi-storage-script makes it: Volume.stat
        first (main.ml vdi_attach_common and the others)."""
        fresh = self.plugin("Volume.stat", sr=disk.sr or self.sr,
                            key=disk.vol["key"])
        self.calls.append((method, disk.devid, self.boot))
        t0 = time.monotonic()
        try:
            return self.dp(method, uri=uri(fresh), **args)
        finally:
            self.seconds.append(time.monotonic() - t0)

    def took(self, method):
        """The seconds of each call of method so far, in order."""
        return [s for (m, _, _), s in zip(self.calls, self.seconds)
                if m == method]

    def activate_method(self, disk):
        """storage_mux.ml:614-638: VDI.activate_readonly for a disk
        attached read-only on an SR that declares VDI_ACTIVATE_READONLY
        (the volume plugin's Plugin.Query, main.ml:868-871), else
        VDI.activate3; main.ml:1529-1563 calls the Datapath's own."""
        if self._features is None:
            self._features = self.plugin("Plugin.Query")["features"]
        if disk.readonly and "VDI_ACTIVATE_READONLY" in self._features:
            return "Datapath.activate_readonly"
        return "Datapath.activate"

    def domain(self, disk, domid=None):
        """The Datapath domain of disk's VBD in domain domid (the VM's
        current one by default)."""
        domid = self.domid if domid is None else domid
        return domain_of("vbd/%d/%s" % (domid, Vbd3(
            self.store, domid, self.uuid, disk.devid).dev), str(domid))

    # --- VM_start -------------------------------------------------------

    def start(self, plan, files=None):
        """VM_start, then VM_unpause: a new domain of this VM, booting the
        domU with /plan (shell assignments) and files in its initramfs;
        returns once every blkfront is connected."""
        self.boot += 1
        name = "%s-%d" % (self.name, self.boot)
        initrd = str(self.tmp / ("initrd-%d" % self.boot))
        devs = [Vbd3(self.store, 0, self.uuid, d.devid).dev
                for d in self.disks]
        plan = dict(plan, BOOT=str(self.boot), DISKS=" ".join(devs))
        text = "".join("%s=%s\n" % (k, shell_word(v))
                       for k, v in sorted(plan.items()))
        with open(DOMU_INITRD, "rb") as f:
            base = f.read()
        with open(self.INIT, "rb") as f:
            init = f.read()
        archive = dict((k, v) for k, v in (files or {}).items())
        archive.update({"vm-init": init, "plan": text.encode()})
        with open(initrd, "wb") as f:
            f.write(base + b"\0" * (-len(base) % 4) +
                    cpio_newc(archive, executable=("vm-init",)))
        self.initrd, self.consoles = initrd, []
        xl("create", "-p", self._config(name), timeout=300)  # VM_create,
        self._created(name)                                  # VM_build
        for disk in self.disks:
            self._plug(disk)
        xl("unpause", str(self.domid))
        self._connected()

    def _config(self, name):
        """xl's configuration of a domain of this VM named name."""
        cfg = str(self.tmp / ("%s.cfg" % name))
        with open(cfg, "w") as f:
            f.write("\n".join([
                'name = "%s"' % name, 'uuid = "%s"' % self.uuid,
                'type = "pv"',
                'kernel = "/boot/vmlinuz-%s"' % os.uname().release,
                'ramdisk = "%s"' % self.initrd,
                'extra = "console=hvc0 loglevel=4 rdinit=/vm-init"',
                "memory = %d" % self.MEMORY, "vcpus = 1",
                'on_poweroff = "preserve"',
                'on_reboot = "preserve"', 'on_crash = "preserve"', ""]))
        return cfg

    def _created(self, name):
        """The domain named name is this VM's now (paused, no VBD)."""
        self.domid = int(xl("domid", name).strip())
        self.console = name
        self.consoles.append(name)
        # xenopsd makes the domain's control dir the guest's own
        # (domain.ml:600-616, rwperm_for_guest, xenbus_utils.ml:78-79);
        # libxl makes it read-only for the guest. Domain.shutdown's
        # control/shutdown, removed and written again, takes its parent's
        # permissions: without this the guest could not acknowledge it.
        self.store.xs.set_permissions(
            "", "/local/domain/%d/control" % self.domid,
            [{"dom": self.domid, "read": False, "write": False}])

    def _plug(self, disk, epoch_begin=True):
        """VBD_epoch_begin (at a start, not at a hot-plug), VBD_attach,
        VBD_activate (with Device.Vbd.add and the block script, as
        test_xen_vm plays them)."""
        domain = self.domain(disk)
        if epoch_begin:
            self.call(disk, "Datapath.open", persistent=disk.persistent)
        answer = self.call(disk, "Datapath.attach", domain=domain)
        xendisk, block = answer["implementations"][:2]
        assert xendisk[1]["backend_type"] == "vbd3"
        self.call(disk, self.activate_method(disk), domain=domain)
        vbd = Vbd3(self.store, self.domid, self.uuid, disk.devid)
        vdi_id = json.dumps(["VDI", "%s/%s" % (disk.sr or self.sr,
                                               disk.vol["key"])])
        vbd.add(block[1]["path"], [("backend-kind", "vbd3")] +
                sorted(xendisk[1]["extra"].items()),
                dp_id="vbd/%d/%s" % (self.domid, vbd.dev), vdi_id=vdi_id,
                vbd_id=json.dumps(["%s.vbd%d" % (self.uuid,
                                                 self.disks.index(disk)),
                                   vbd.dev]),
                mode="r" if disk.readonly else "w")
        self.store.xs.write("", vbd.back + "/vdi", vdi_id.encode())
        vbd.block_add()
        # tapback answers hotplug-status with InitWait (frontend.c:441-
        # 444); a running guest's blkfront takes it on to Connected at once
        try:
            wait_for("%s's backend InitWait or on" % vbd.dev,
                     lambda: vbd.state("back") in ("2", "3", "4"), 60)
        except AssertionError as exc:
            raise AssertionError("%s (backend %s, frontend %s; console:\n%s)"
                                 % (exc, vbd.state("back"),
                                    vbd.state("front"),
                                    console(self.console)[-3000:]))
        disk.vbd = vbd

    # --- the guest's console -------------------------------------------

    def lines(self):
        """This boot's "ZFSNG-DOMU <boot> ..." lines, the prefix cut,
        from each of its domains' console logs in turn (a suspended and
        resumed VM, or a moved one, goes on in a new domain)."""
        tag = "ZFSNG-DOMU %d " % self.boot
        return [line.split(tag, 1)[1].rstrip("\r")
                for name in self.consoles
                for line in console(name).splitlines() if tag in line]

    def wait_said(self, what, timeout=900):
        """Until the domU printed a line starting with what (or an error);
        returns every line of the boot so far."""
        wait_for("the domU's %r" % what, lambda: any(
            line.startswith((what, "ERROR")) for line in self.lines()),
            timeout, step=0.5)
        lines = self.lines()
        errors = [line for line in lines if line.startswith("ERROR")]
        assert not errors, "\n".join([console(self.console)] + errors)
        return lines

    def said(self, key):
        """{disk: sha256} of the boot's "<key> <disk> <sha>" lines."""
        found = {}
        for line in self.lines():
            m = re.match(r"%s (\S+) ([0-9a-f]{64})$" % key, line)
            if m:
                found[m.group(1)] = m.group(2)
        return found

    # --- shutdown ---------------------------------------------------------

    def request_shutdown(self, reason, timeout=300):
        """VM_shutdown_domain: Domain.shutdown's write of control/shutdown
        (in a transaction, the old value removed first), the guest's ack
        (the value emptied or removed), then the domain shut down."""
        path = "/local/domain/%d/control/shutdown" % self.domid
        xs = self.store.xs

        def body(t):
            xs.rm(t, path)
            xs.write(t, path, reason.encode())
        self.store.transaction(body)
        try:
            wait_for("the guest's ack of %s" % reason,
                     lambda: self.store.read(path) in ("", None), 60)
        except AssertionError as exc:
            raise AssertionError("%s (%s: %r, permissions %r; console:\n%s)"
                                 % (exc, path, self.store.read(path),
                                    xs.get_permissions("", path),
                                    console(self.console)[-3000:]))
        self.wait_shut_down(reason, timeout)

    def wait_shut_down(self, reason, timeout=300):
        """Until Xen says the domain shut down, for reason."""
        def shut_down():
            info = domain_info(self.domid)
            return info if info and info["shutdown"] else None
        info = wait_for("domain %d to shut down" % self.domid, shut_down,
                        timeout, step=0.5)
        got = SHUTDOWN_REASONS.get(info["shutdown_reason"],
                                   info["shutdown_reason"])
        assert got == reason, "domain %d shut down for %s, not %s" % (
            self.domid, got, reason)

    def destroy(self):
        """VM_shutdown(id, None): every VBD unplugged by force, then
        VM_destroy. The datapath stays open (no epoch_end). A VBD not
        plugged has no device and no backend to deactivate
        (xenops_server_xen.ml:4436-4450, 4533-4543): no call for it."""
        self._shutdown(self.domid, self.disks)
        self.domid = None

    def _shutdown(self, domid, disks, deactivated=None):
        """VM_shutdown(id, None) of domain domid whose VBDs are disks:
        Best_effort VM_pause, each VBD unplugged by force (Device
        hard_shutdown and release, Datapath.deactivate, then
        deactivated(disk) if given: storage_mux's post_deactivate_hook
        runs there, storage_mux.ml:650-666; Datapath.detach), then
        VM_destroy."""
        xl("pause", str(domid), check=False)        # Best_effort VM_pause
        for disk in disks:
            if disk.vbd is None:
                continue
            domain = self.domain(disk, domid)
            t0 = time.monotonic()
            outcome = disk.vbd.hard_shutdown()
            self.unplugs.append((self.boot, disk.vbd.dev, outcome,
                                 round(time.monotonic() - t0, 1)))
            disk.vbd.release()
            self.call(disk, "Datapath.deactivate", domain=domain)
            if deactivated:
                deactivated(disk)
            self.call(disk, "Datapath.detach", domain=domain)  # dp_destroy
            disk.vbd = None
        xl("destroy", str(domid))
        # Domain.destroy's rm of the domain's backend dirs; tapback's
        # slave for the domain ends (backend.c:1234-1248)
        self.store.rm("/local/domain/0/backend/vbd3/%d" % domid)
        wait_for("domain %d gone" % domid,
                 lambda: domid not in [i for _, i in domains()], 120)
        wait_for("tapback's slave for %d to end" % domid,
                 lambda: domid not in tapback_slaves(), 60)

    def epoch_end(self):
        """VBD_epoch_end of every VBD: Datapath.close."""
        for disk in self.disks:
            self.call(disk, "Datapath.close")

    def reboot(self, plan, files=None):
        """``xe vm-reboot``: VM_reboot with a timeout."""
        self.request_shutdown("reboot")
        self.destroy()
        self.epoch_end()
        self.start(plan, files)

    def shutdown(self):
        """``xe vm-shutdown``: VM_poweroff with a timeout."""
        self.request_shutdown("poweroff")
        self.destroy()
        self.epoch_end()

    def halted_by_guest(self):
        """The guest powered itself off: VM_shutdown alone."""
        self.wait_shut_down("poweroff")
        self.destroy()

    def hard_shutdown(self):
        """``xe vm-shutdown --force``: VM_poweroff with no timeout, so no
        request to the guest: VM_shutdown(id, None) (the pause, every VBD
        unplugged by force, VM_destroy), then VBD_epoch_end. Returns the
        seconds it took."""
        t0 = time.monotonic()
        self.destroy()
        self.epoch_end()
        return time.monotonic() - t0

    # --- VBDs of a running VM -------------------------------------------

    def hotplug(self, disk):
        """``xe vbd-plug``: VBD_hotplug, VBD_attach then VBD_activate and
        its Device.Vbd.add (no Datapath.open); xapi's call returns once
        the block script ran (Hotplug.wait_for_plug, hotplug.ml:162-183);
        then until the guest's blkfront connected."""
        self._plug(disk, epoch_begin=False)
        wait_for("%s connected" % disk.vbd.dev, lambda:
                 disk.vbd.state("back") == "4" and
                 disk.vbd.state("front") == "4", 600, step=1)

    def hotunplug(self, disk):
        """``xe vbd-unplug``: VBD_hotunplug without force: the clean
        device shutdown (the guest's blkfront closes it), Vbd.release,
        Datapath.deactivate, then Datapath.detach (no Datapath.close)."""
        domain = self.domain(disk)
        disk.vbd.clean_shutdown()
        disk.vbd.release()
        self.call(disk, "Datapath.deactivate", domain=domain)
        self.call(disk, "Datapath.detach", domain=domain)
        disk.vbd = None

    # --- suspend, resume, a move to other VDIs ----------------------------

    def save(self):
        """VM_save (xenops_server.ml:2379-2389, Domain.suspend): the guest
        asked to suspend (control/shutdown "suspend"), its memory written
        to a file, the domain left paused and never run again. Here ``xl
        save -p``: libxl suspends the guest and saves it, then resumes
        the domain cancelled but paused (xl: -p "leave domain paused
        after creating the snapshot"). Returns the image's path."""
        image = str(self.tmp / ("%s.save" % self.console))
        xl("save", "-p", str(self.domid), image, timeout=900)
        return image

    def suspend(self):
        """``xe vm-suspend``: VM_suspend (xenops_server.ml:1880-1902):
        VM_save, then VM_shutdown(id, None) (:1740-1766: the pause,
        every VBD unplugged by force with Datapath.deactivate and detach,
        VM_destroy). No VBD_epoch_end: no Datapath.close. Returns (the
        memory image, the seconds of the save, of the whole suspend)."""
        t0 = time.monotonic()
        image = self.save()
        saved = time.monotonic() - t0
        self.destroy()
        return image, saved, time.monotonic() - t0

    def resume(self, image):
        """``xe vm-resume``: VM_resume (xenops_server.ml:1903-1944):
        VM_create and VM_restore, here ``xl restore -p`` (the memory
        image into a new domain, left paused; a name of its own, so a
        console log of its own); then VM_restore_devices(id, false)
        (:1773-1800): per VBD VBD_set_active and vbd_plug (Datapath
        attach and activate for the new domid, Device.Vbd.add, the block
        script) while the domain is paused; no VBD_epoch_begin, so no
        Datapath.open; then xapi's VM.unpause. The guest's blkfront,
        resumed, reads its frontend's backend node again and connects
        to the new backend (Linux xenbus_dev_resume, blkfront_resume).
        Returns the seconds until every blkfront is connected."""
        t0 = time.monotonic()
        name = "%s-%d-%d" % (self.name, self.boot, len(self.consoles))
        xl("restore", "-p", self._config(name), image, timeout=900)
        self._created(name)
        for disk in self.disks:
            self._plug(disk, epoch_begin=False)
        xl("unpause", str(self.domid))
        self._connected()
        return time.monotonic() - t0

    def _connected(self):
        wait_for("every blkfront connected", lambda: all(
            d.vbd.state("back") == "4" and d.vbd.state("front") == "4"
            for d in self.disks), 600, step=1)

    def migrate(self, moves, deactivated=None):
        """A live migration within this host whose disks move to other
        VDIs (``xe vm-migrate ... vdi:<vdi>=<sr> live=true`` once xapi's
        mirrors are complete): VM_migrate (xenops_server.ml:2760-3225).
        The source's VM_save(Live) (:2951); the destination's VM_create
        and VM_restore (:3165) into a new domain; its
        VM_restore_devices(final_id, true) (:3207): each VBD plugged
        on its destination VDI (moves: {disk: (vol, sr)}; Datapath
        attach and activate for the new domid, Device.Vbd.add) while the
        new domain is paused; VM_unpause (:3209); then the source's
        VM_shutdown(new_src_id, None) (:2999-3001): the pause, each of
        its VBDs unplugged by force (Datapath.deactivate of the source
        VDI, then deactivated(disk) with the source's disk: storage_mux's
        post_deactivate_hook, receive_finalize3 on the destination;
        Datapath.detach), VM_destroy. VM_rename(id, new_src_id) after
        the save (:2952) is the source domain's handle set to a fresh
        uuid (xenops_server_xen.ml:1992-1997, domain_sethandle; its
        xenstore tree is not moved: xl names the new domain apart).
        Played difference: the memory goes through a file, not a socket
        (VM_save ends before VM_restore begins). Returns {step:
        seconds}."""
        t0 = time.monotonic()
        image = self.save()
        hypervisor().domain_sethandle(self.domid, list(uuid.uuid4().bytes))
        saved = time.monotonic()
        source, src_domid = [], self.domid
        for disk in self.disks:
            source.append(copy.copy(disk))
            disk.vol, disk.sr = moves.get(disk, (disk.vol, disk.sr))
            disk.vbd = None
        self.resume(image)
        resumed = time.monotonic()
        self._shutdown(src_domid, source, deactivated)
        return {"save": saved - t0, "restore_and_plug": resumed - saved,
                "source_shutdown": time.monotonic() - resumed,
                "downtime": resumed - t0}


def shell_word(value):
    """A value for the domU's /plan: words of [A-Za-z0-9_./:-] only."""
    value = str(value)
    assert re.match(r"^[A-Za-z0-9_./: -]*$", value), value
    return "'%s'" % value
