"""How a VM's config changes: new disks and MACs, updates with `delete` and [PENDING], the node spec at start.

Mirrors qemu-server (create_disks, add_random_macs, update_vm_api, vmconfig_apply_pending) for what the lab
models. Callers hold the state lock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
import time
import uuid
from typing import Callable, Dict, List, Optional
from urllib.parse import unquote

from pve_lab.api import storage
from pve_lab.api.constants import MAC_PREFIX, QEMU_VERSION
from pve_lab.api.errors import fail
from pve_lab.api.qemu_schema import DRIVE_FORMAT, DRIVE_KEYS, MEMORY_FORMAT, NET_FORMAT, is_drive
from pve_lab.api.state import VM, LabState

NEW_DISK_RE = re.compile(r"^(([^/:\s]+):)?(\d+(\.\d+)?)$")
DRIVE_ORDER = (["ide%d" % i for i in range(4)] + ["sata%d" % i for i in range(6)] +
               ["scsi%d" % i for i in range(31)] + ["virtio%d" % i for i in range(16)])
CLOUDINIT_SIZE = 4 * 1024 * 1024
CLOUDINIT_OPTIONS = ("cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain",
                     "sshkeys")
CLOUDINIT_KEYS = ("ciuser", "cipassword", "citype", "ciupgrade", "cicustom", "sshkeys", "nameserver",
                  "searchdomain", "name") + tuple("ipconfig%d" % i for i in range(32))


def random_mac() -> str:
    return MAC_PREFIX + "".join(":%02X" % random.randint(0, 255) for _ignored in range(3))


def with_mac(net: str) -> str:
    """add_random_macs / print_net: a net device always carries a MAC once written."""
    values = NET_FORMAT.parse(net)
    values.setdefault("macaddr", random_mac())
    return NET_FORMAT.render(values)


def new_uuid() -> str:
    return str(uuid.uuid4())


def is_cdrom(drive: Dict[str, str]) -> bool:
    return drive.get("media") == "cdrom" or drive.get("file") in ("cdrom", "none")


def is_cloudinit(drive: Dict[str, str]) -> bool:
    return bool(re.search(r"(^|[:/])vm-\d+-cloudinit(\.\w+)?$", drive.get("file", ""))) or drive.get("file", "") in (
        "cloudinit",) or drive.get("file", "").endswith(":cloudinit")


def drive_volume(value: str) -> Optional[str]:
    """The storage volume a drive line refers to, None for a cdrom without media or a host device."""
    file = DRIVE_FORMAT.parse(value)["file"]
    if file in ("none", "cdrom") or file.startswith("/") or ":" not in file:
        return None
    return file


def _next_disk_name(state: LabState, store: storage.Storage, vmid: int) -> str:
    used = {volid.split(":", 1)[1].rsplit("/", 1)[-1].split(".")[0]
            for volid in state.volumes if volid.startswith(store.storeid + ":")}
    for index in range(1000):
        name = "vm-%d-disk-%d" % (vmid, index)
        if name not in used:
            return name
    raise fail("unable to allocate an image name for VM %d in storage '%s'" % (vmid, store.storeid))


def allocate(state: LabState, storeid: str, vmid: int, size: int, fmt: Optional[str] = None) -> str:
    store = storage.image_storage(storeid)
    volid = storage.volume_name(store, vmid, _next_disk_name(state, store, vmid), fmt)
    state.volumes[volid] = size
    return volid


def cloudinit_volume(state: LabState, storeid: str, vmid: int) -> str:
    store = storage.storage(storeid)
    volid = storage.volume_name(store, vmid, "vm-%d-cloudinit" % vmid, None)
    state.volumes[volid] = CLOUDINIT_SIZE
    return volid


def create_drive(state: LabState, vmid: int, key: str, value: str, default_storage: Optional[str]) -> str:
    """create_disks for one drive: `STORAGE:SIZE` and `STORAGE:cloudinit` allocate, anything else must exist."""
    drive = DRIVE_FORMAT.parse(value, key)
    file = drive["file"]
    new_disk = NEW_DISK_RE.match(file)
    if file in ("none", "cdrom") or file.startswith("/"):
        drive.pop("size", None)
    elif file == "cloudinit" or file.endswith(":cloudinit"):
        storeid = file.rpartition(":")[0] or default_storage
        if not storeid:
            raise fail("no storage ID specified (and no default storage)")
        drive["file"] = cloudinit_volume(state, storeid, vmid)
        drive["media"] = "cdrom"
        drive.pop("format", None)
    elif new_disk and key in DRIVE_KEYS:
        storeid = new_disk.group(2) or default_storage
        if not storeid:
            raise fail("no storage ID specified (and no default storage)")
        size = int(float(new_disk.group(3)) * 1024 ** 3)
        drive["file"] = allocate(state, storeid, vmid, size, drive.pop("format", None))
        drive["size"] = storage.format_size(size)
    else:
        storage.storage(file.split(":", 1)[0])
        if file not in state.volumes:
            raise fail("volume '%s' does not exist" % file)
        drive.setdefault("size", storage.format_size(state.volumes[file]))
    return DRIVE_FORMAT.render(drive)


def default_boot(conf: Dict[str, str]) -> Optional[str]:
    """get_default_bootdevices: the first disk, the first cdrom (not the cloud-init drive), the first NIC."""
    devices: List[str] = []
    for want_cdrom in (False, True):
        for key in DRIVE_ORDER:
            if key in conf:
                drive = DRIVE_FORMAT.parse(conf[key])
                if is_cloudinit(drive) or is_cdrom(drive) != want_cdrom:
                    continue
                devices.append(key)
                break
    nets = sorted((int(k[3:]), k) for k in conf if re.match(r"^net\d+$", k))
    if nets:
        devices.append(nets[0][1])
    return "order=" + ";".join(devices) if devices else None


def finish_new_config(conf: Dict[str, str]) -> None:
    """What create_vm adds to every new VM: boot order, SMBIOS UUID, VM generation ID, creation meta."""
    if not conf.get("boot"):
        boot = default_boot(conf)
        if boot:
            conf["boot"] = boot
    conf.setdefault("smbios1", "uuid=" + new_uuid())
    if conf.get("vmgenid", "1") == "1":
        conf["vmgenid"] = new_uuid()
    conf["meta"] = "creation-qemu=%s,ctime=%d" % (QEMU_VERSION, int(time.time()))


def register_unused(vm: VM, volid: str) -> None:
    if volid in vm.config.values():
        return
    index = 0
    while "unused%d" % index in vm.config:
        index += 1
    vm.config["unused%d" % index] = volid


def drop_drive(state: LabState, vm: VM, key: str, value: str) -> None:
    """A drive leaves the config: the cloud-init disk is freed, a data disk becomes `unusedN`."""
    try:
        drive = DRIVE_FORMAT.parse(value)
    except Exception:
        return
    volid = drive_volume(value)
    if volid is None or is_cdrom(drive) and not is_cloudinit(drive):
        return
    if is_cloudinit(drive):
        state.volumes.pop(volid, None)
    else:
        register_unused(vm, volid)


def update(state: LabState, vm: VM, params: Dict[str, str], deletes: List[str], running: bool,
           cold: frozenset, warn: Callable[[str], None]) -> None:
    """update_vm_api's worker: deletes, then sets; what a running VM cannot take waits in [PENDING]."""
    for key in deletes:
        value = vm.config.get(key, vm.pending.get(key))
        if value is None:
            warn("cannot delete '%s' - not set in current configuration!" % key)
            continue
        vm.pending.pop(key, None)
        if running and (key in cold or is_drive(key)):
            if key in vm.config and key not in vm.pending_delete:
                vm.pending_delete.append(key)
            continue
        if key.startswith("unused"):
            state.volumes.pop(vm.config.pop(key), None)
            continue
        vm.config.pop(key, None)
        if is_drive(key):
            drop_drive(state, vm, key, value)
    for key, value in params.items():
        if is_drive(key):
            value = create_drive(state, vm.vmid, key, value, None)
            old = vm.config.get(key)
            if old is not None and old != value and not (running and key in cold):
                drop_drive(state, vm, key, old)
        if running and key in cold:
            vm.pending[key] = value
        else:
            vm.config[key] = value
            vm.pending.pop(key, None)
        if key in vm.pending_delete:
            vm.pending_delete.remove(key)
    for key in [k for k, v in vm.pending.items() if vm.config.get(k) == v]:
        del vm.pending[key]
    vm.pending_delete = [k for k in vm.pending_delete if k in vm.config]


def release_volumes(state: LabState, vm: VM) -> None:
    """destroy_vm: every volume the VM owns goes (disks, cloud-init drive, unused disks)."""
    for volid in list(state.volumes):
        owner = re.search(r"(?:^|[:/])(?:vm|base)-(\d+)-", volid)
        if owner and int(owner.group(1)) == vm.vmid:
            del state.volumes[volid]


def memory_mib(conf: Dict[str, str]) -> int:
    value = conf.get("memory")
    return int(MEMORY_FORMAT.parse(value)["current"]) if value else 512


def vcpus(conf: Dict[str, str]) -> int:
    if conf.get("vcpus"):
        return int(conf["vcpus"])
    return int(conf.get("sockets", "1")) * int(conf.get("cores", "1"))


def boot_disk_size(state: LabState, conf: Dict[str, str]) -> int:
    boot = conf.get("boot", "")
    order = re.findall(r"(?:ide|sata|scsi|virtio)\d+", boot)
    for key in order + DRIVE_ORDER:
        if key in conf:
            drive = DRIVE_FORMAT.parse(conf[key])
            if not is_cdrom(drive) and not is_cloudinit(drive):
                return storage.parse_size(drive["size"]) if "size" in drive else state.volumes.get(drive["file"], 0)
    return 0


def agent_enabled(conf: Dict[str, str]) -> bool:
    if "agent" not in conf:
        return False
    from pve_lab.api.qemu_schema import AGENT_FORMAT

    return AGENT_FORMAT.parse(conf["agent"]).get("enabled", "0") == "1"


def has_cloudinit_drive(conf: Dict[str, str]) -> bool:
    return any(is_drive(k) and is_cloudinit(DRIVE_FORMAT.parse(v)) for k, v in conf.items())


def cloudinit_values(conf: Dict[str, str]) -> Dict[str, str]:
    """The options the cloud-init drive is generated from (qemu-server's $cloudinitoptions, ipconfigN)."""
    return {k: v for k, v in conf.items() if k in CLOUDINIT_OPTIONS or re.match(r"^ipconfig\d+$", k)}


def instance_id(vm: VM) -> str:
    """Changes with every (re)creation and with every cloud-init change, as the NoCloud instance-id does."""
    conf = vm.config
    material = vm.nonce + "".join("%s=%s\n" % (k, conf[k]) for k in CLOUDINIT_KEYS if k in conf)
    material += "net0=%s\n" % conf.get("net0", "")
    return hashlib.sha1(material.encode()).hexdigest()


def node_spec(vm: VM, spec_class):
    """The VMSpec the node backend boots, from the VM's current config (pending changes already applied)."""
    conf = vm.config
    cloudinit = has_cloudinit_drive(conf)
    macaddr = None
    if "net0" in conf:
        macaddr = NET_FORMAT.parse(conf["net0"]).get("macaddr")
    values = {
        "vmid": vm.vmid, "name": conf.get("name") or "VM%d" % vm.vmid, "cpu": conf.get("cpu"),
        "cores": vcpus(conf), "memory": memory_mib(conf), "has_os": vm.has_os, "agent": agent_enabled(conf),
        "ciuser": conf.get("ciuser") if cloudinit else None,
        "sshkeys": unquote(conf["sshkeys"]) if cloudinit and conf.get("sshkeys") else None,
        "ipconfig0": conf.get("ipconfig0") if cloudinit else None,
        "nameserver": conf.get("nameserver") if cloudinit else None,
        "searchdomain": conf.get("searchdomain") if cloudinit else None,
        "instance_id": instance_id(vm), "macaddr": macaddr,
        "ciupgrade": conf.get("ciupgrade", "1") == "1" if cloudinit else None,
    }
    known = {f.name for f in dataclasses.fields(spec_class)}
    return spec_class(**{k: v for k, v in values.items() if k in known})
