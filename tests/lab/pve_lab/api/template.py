"""The cloud-init template the lab holds from its first `up`: VM 9000 `debian12-cloudinit`, `template: 1`.

Its config is what a PVE admin gets after importing a Debian 12 cloud image, adding a cloud-init drive and
converting the VM to a template (the disk becomes `base-9000-disk-0`). Clones of it, and clones of those, boot
the lab's Debian 12 root.
"""

from __future__ import annotations

from pve_lab.api import vm_config
from pve_lab.api.constants import BRIDGE, TEMPLATE_NAME, TEMPLATE_VMID
from pve_lab.api.state import VM, LabState

DISK_SIZE = 3 * 1024 ** 3


def seed(state: LabState) -> None:
    with state.change():
        disk = "local-lvm:base-%d-disk-0" % TEMPLATE_VMID
        cloudinit = vm_config.cloudinit_volume(state, "local-lvm", TEMPLATE_VMID)
        state.volumes[disk] = DISK_SIZE
        conf = {
            "name": TEMPLATE_NAME,
            "agent": "1",
            "cores": "2",
            "memory": "2048",
            "ostype": "l26",
            "scsihw": "virtio-scsi-pci",
            "scsi0": "%s,size=3G" % disk,
            "ide2": "%s,media=cdrom" % cloudinit,
            "net0": "virtio=%s,bridge=%s" % (vm_config.random_mac(), BRIDGE),
            "serial0": "socket",
            "vga": "serial0",
            "boot": "order=scsi0;net0",
            "template": "1",
        }
        vm_config.finish_new_config(conf)
        state.vms[TEMPLATE_VMID] = VM(TEMPLATE_VMID, conf, has_os=True)
