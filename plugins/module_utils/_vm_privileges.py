# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Proxmox privileges a change of ``pve_vm`` needs, on which ACL path, and why: pure, no I/O.

The rules are qemu-server's (src/PVE/API2/Qemu.pm): clone_vm's ``permissions`` and $check_storage_access_clone,
create_vm's, $check_vm_modify_config_perm for config keys, $check_drive_perms for drives (a cloud-init drive needs
VM.Config.Cloudinit *and* VM.Config.CDROM), check_bridge_access (SDN.Use on the bridge), and the power and destroy
calls' ``permissions``. :mod:`_vm_runner_checks` reads what the token holds and refuses a change before its first
write when one of these is missing, where PVE would have refused it half-way.

Private to the ``pve_vm`` runner.
"""

from __future__ import annotations

import re
from collections import namedtuple

CPU_KEYS = frozenset(["cores", "cpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus", "affinity"])
MEMORY_KEYS = frozenset(["memory", "balloon", "shares", "allow-ksm"])
HWTYPE_KEYS = frozenset(["acpi", "hotplug", "kvm", "machine", "scsihw", "smbios1", "tablet", "vga", "watchdog"])
OPTION_KEYS = frozenset(["agent", "autostart", "bios", "description", "keyboard", "localtime", "name", "onboot",
                         "ostype", "protection", "reboot", "startdate", "startup", "tdf", "template"])
DISK_KEYS = frozenset(["boot", "bootdisk", "vmstatestorage"])
CLOUDINIT_KEYS = frozenset(["cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain",
                            "sshkeys"])
_DRIVE = re.compile(r"^(ide|sata|scsi|virtio|efidisk|tpmstate)\d+$")
_NEW_DISK = re.compile(r"^(?:([^/:\s]+):)?(\d+(?:\.\d+)?)$")


class Need(namedtuple("Need", "path privileges why")):
    """One privilege check: on ``path``, one of ``privileges`` (a tuple; PVE asks for any one of them when there
    are several), for ``why`` (what the run would do with it)."""

    def met(self, held):
        return any(p in held for p in self.privileges)

    def text(self):
        return "%s on %s (%s)" % (" or ".join(self.privileges), self.path, self.why)


def _vm(vmid):
    return "/vms/%s" % vmid


def _volume(value):
    """A drive value's volume (``file``) and whether the drive is a CD-ROM (the cloud-init drive is one)."""
    fields = str(value).split(",")
    volume = fields[0].split("=", 1)[-1]
    return volume, "media=cdrom" in fields[1:] or volume in ("cdrom", "none")


def _drive_needs(vmid, value, why):
    volume, cdrom = _volume(value)
    needs = []
    if volume == "cloudinit" or volume.endswith(":cloudinit") or re.search(r"vm-\d+-cloudinit", volume):
        needs += [Need(_vm(vmid), ("VM.Config.Cloudinit",), why), Need(_vm(vmid), ("VM.Config.CDROM",), why)]
    elif cdrom:
        needs.append(Need(_vm(vmid), ("VM.Config.CDROM",), why))
    else:
        needs.append(Need(_vm(vmid), ("VM.Config.Disk",), why))
        new_disk = _NEW_DISK.match(volume)
        if new_disk and new_disk.group(1):
            needs.append(Need("/storage/%s" % new_disk.group(1), ("Datastore.AllocateSpace",), why))
    return needs


def _bridge(value):
    match = re.search(r"(?:^|,)bridge=([^,]+)", str(value))
    return match.group(1) if match else None


def config_needs(vmid, params, why="setting %s"):
    """What setting ``params`` (config key -> value) on VM ``vmid`` needs."""
    needs = []
    for key in sorted(params):
        what = why % key if "%s" in why else why
        if _DRIVE.match(key):
            needs += _drive_needs(vmid, params[key], what)
            continue
        if key in CPU_KEYS:
            privileges = ("VM.Config.CPU",)
        elif key in MEMORY_KEYS:
            privileges = ("VM.Config.Memory",)
        elif key in HWTYPE_KEYS:
            privileges = ("VM.Config.HWType",)
        elif key in OPTION_KEYS:
            privileges = ("VM.Config.Options",)
        elif key in DISK_KEYS:
            privileges = ("VM.Config.Disk",)
        elif re.match(r"^net\d+$", key):
            privileges = ("VM.Config.Network",)
            bridge = _bridge(params[key])
            if bridge:
                needs.append(Need("/sdn/zones/localnetwork/%s" % bridge, ("SDN.Use",), what))
        elif key in CLOUDINIT_KEYS or re.match(r"^ipconfig\d+$", key):
            privileges = ("VM.Config.Cloudinit", "VM.Config.Network")
        else:
            continue  # tags, unused disks, serial/usb/hostpci: not set by pve_vm
        needs.append(Need(_vm(vmid), privileges, what))
    return needs


def clone_needs(template_vmid, template_config, newid, storage=None):
    """Cloning template ``template_vmid`` (its config ``template_config``) to ``newid``, which is then read."""
    why = "cloning the template"
    needs = [Need(_vm(template_vmid), ("VM.Clone",), why), Need(_vm(newid), ("VM.Allocate",), why),
             Need(_vm(newid), ("VM.Audit",), "reading the clone")]
    for key in sorted(template_config):
        if _DRIVE.match(key):
            volume, cdrom = _volume(template_config[key])
            if not cdrom and ":" in volume:  # a CD-ROM, the cloud-init drive included, needs nothing on its storage
                needs.append(Need("/storage/%s" % (storage or volume.split(":", 1)[0]), ("Datastore.AllocateSpace",),
                                  "the clone's %s" % key))
        elif re.match(r"^net\d+$", key):
            bridge = _bridge(template_config[key])
            if bridge:
                needs.append(Need("/sdn/zones/localnetwork/%s" % bridge, ("SDN.Use",), "the clone's %s" % key))
    return needs


def create_needs(vmid, params):
    """Creating VM ``vmid`` from ``params`` (without a template)."""
    return [Need(_vm(vmid), ("VM.Allocate",), "creating the VM"),
            Need(_vm(vmid), ("VM.Audit",), "reading the VM")] + config_needs(vmid, params, "creating it with %s")


def power_needs(vmid, action):
    return [Need(_vm(vmid), ("VM.PowerMgmt",), action)]


def destroy_needs(vmid, running):
    needs = power_needs(vmid, "stopping it before removal") if running else []
    return needs + [Need(_vm(vmid), ("VM.Allocate",), "removing the VM")]


def pool_needs(vmid, pool):
    """A new VM put in ``pool``: VM.Allocate on the pool (clone_vm's and create_vm's permissions)."""
    return [Need("/pool/%s" % pool, ("VM.Allocate",), "putting VM %s in pool %s" % (vmid, pool))] if pool else []


def missing(needs, held, pool=None, vmid=None):
    """The needs not met, given ``held`` (ACL path -> set of privileges held there), each once. A new VM going to
    ``pool`` may use what is held on the pool instead of on its own path (RPCEnvironment::check_vm_perm)."""
    result = []
    for need in needs:
        met = need.met(held.get(need.path, ()))
        if not met and pool and need.path == _vm(vmid):
            met = need.met(held.get("/pool/%s" % pool, ()))
        if not met and need not in result:
            result.append(need)
    return result


def refusal(name, lacking):
    """The refusal message for the needs in ``lacking``."""
    return (
        "%s: the API token (or user) lacks %s. Nothing was changed. Grant the privileges (docs/real-proxmox.md, "
        "step 3: the LLMGWFleet role, on / or on each path named), then run again."
        % (name, "; ".join(need.text() for need in lacking))
    )
