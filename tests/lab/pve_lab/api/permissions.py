"""Privileges, checked for the lab's restricted API token as pve-access-control and qemu-server check them.

`root@pam` and its token `root@pam!llmgw` may do everything, as on PVE. The token `llmgw@pve!fleet` (privilege
separated) holds what the ACL grants it: by default docs/real-proxmox.md's `LLMGWFleet` role on `/`; the lab's
`/lab/acl` endpoint changes the grants. An ACL entry propagates to the paths below it, and an entry on a deeper path
replaces what the token inherits from above (PVE::AccessControl::permissions for one user or token).

What each call needs is qemu-server's (src/PVE/API2/Qemu.pm: the `permissions` of each method,
$check_vm_modify_config_perm, $check_drive_perms, $check_storage_access(_clone), check_bridge_access) and
pve-manager's (tasks, node status, storage status, the filtered lists). A refusal is PVE's 403: "Permission check
failed (PATH, PRIV)" for the first privilege missing of those all needed, "(PATH, A|B)" where any one would do.
"""

from __future__ import annotations

import re
import threading
from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Tuple

from pve_lab.api.errors import ApiError
from pve_lab.api.qemu_schema import DRIVE_FORMAT, NET_FORMAT, is_drive
from pve_lab.api.vm_config import NEW_DISK_RE, is_cdrom, is_cloudinit

RESTRICTED = "llmgw@pve!fleet"
# docs/real-proxmox.md, step 3: the role the docs tell an operator to create (tests/lab/tests/test_api_permissions.py
# reads it from there and compares).
DOCS_ROLE = frozenset([
    "VM.Audit", "VM.Allocate", "VM.Clone", "VM.PowerMgmt", "VM.Config.CPU", "VM.Config.Memory",
    "VM.Config.Cloudinit", "VM.Config.CDROM", "VM.Config.Disk", "VM.Config.Options", "VM.Config.Network",
    "Datastore.AllocateSpace", "Datastore.Audit", "SDN.Use", "Sys.Audit",
])
KNOWN = DOCS_ROLE | frozenset([
    "VM.Config.HWType", "VM.Monitor", "VM.Console", "VM.Backup", "VM.Migrate", "VM.Snapshot", "VM.Snapshot.Rollback",
    "VM.GuestAgent.Audit", "VM.GuestAgent.FileRead", "VM.GuestAgent.Unrestricted", "Datastore.Allocate",
    "Datastore.AllocateTemplate", "Sys.Modify", "Sys.Console", "Sys.PowerMgmt", "SDN.Audit",
])
CPU_KEYS = {"cores", "cpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus", "affinity"}
MEMORY_KEYS = {"memory", "balloon", "shares", "allow-ksm"}
HWTYPE_KEYS = {"acpi", "hotplug", "kvm", "machine", "scsihw", "smbios1", "tablet", "vga", "watchdog", "audio0",
               "rng0"}
GENERAL_KEYS = {"agent", "autostart", "bios", "description", "keyboard", "localtime", "migrate_downtime",
                "migrate_speed", "name", "onboot", "ostype", "protection", "reboot", "startdate", "startup", "tdf",
                "template"}
DISK_KEYS = {"boot", "bootdisk", "vmstatestorage"}
CLOUDINIT_KEYS = {"cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain",
                  "sshkeys"}
VM_READS = {"/nodes/{node}/qemu/{vmid}", "/nodes/{node}/qemu/{vmid}/config", "/nodes/{node}/qemu/{vmid}/pending",
            "/nodes/{node}/qemu/{vmid}/status", "/nodes/{node}/qemu/{vmid}/status/current",
            "/nodes/{node}/qemu/{vmid}/cloudinit"}
TASK_PATHS = {"/nodes/{node}/tasks/{upid}", "/nodes/{node}/tasks/{upid}/status", "/nodes/{node}/tasks/{upid}/log"}


def drives(params: Dict[str, str]) -> Iterator[Tuple[str, Dict[str, str]]]:
    """(key, parsed drive) for each drive of ``params`` (a value that does not parse is the handler's to refuse)."""
    for key, value in sorted(params.items()):
        if not is_drive(key):
            continue
        try:
            yield key, DRIVE_FORMAT.parse(value, key)
        except ApiError:
            continue


def denied(path: str, privs: Iterable[str]) -> ApiError:
    return ApiError(403, "Permission check failed (%s, %s)" % (path, "|".join(privs)))


class Acl:
    """The restricted token's grants: ACL path -> privileges."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._grants: Dict[str, FrozenSet[str]] = {}
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._grants = {"/": DOCS_ROLE}

    def replace(self, grants: object) -> None:
        if not isinstance(grants, dict) or not grants:
            raise ValueError("grants is {\"/path\": [\"Priv\", ...]}, at least one path")
        parsed: Dict[str, FrozenSet[str]] = {}
        for path, privs in grants.items():
            if not isinstance(path, str) or not path.startswith("/") or not isinstance(privs, list):
                raise ValueError("grants is {\"/path\": [\"Priv\", ...]}: %r" % (path,))
            unknown = sorted(set(privs) - KNOWN)
            if unknown:
                raise ValueError("privilege '%s' does not exist" % unknown[0])
            parsed["/" + path.strip("/") if path != "/" else "/"] = frozenset(privs)
        with self._lock:
            self._grants = parsed

    def snapshot(self) -> Dict[str, List[str]]:
        with self._lock:
            return {path: sorted(privs) for path, privs in self._grants.items()}

    def privileges(self, path: str) -> FrozenSet[str]:
        parts = [p for p in path.split("/") if p]
        found: FrozenSet[str] = frozenset()
        with self._lock:
            for depth in range(len(parts) + 1):
                entry = self._grants.get("/" + "/".join(parts[:depth]))
                if entry is not None:
                    found = entry
        return found


class Checker:
    """What one authenticated caller may do."""

    def __init__(self, acl: Acl, user: Optional[str]):
        self.acl = acl
        self.restricted = user == RESTRICTED

    def has(self, path: str, privs: Iterable[str], any_of: bool = False) -> bool:
        if not self.restricted:
            return True
        held = self.acl.privileges(path)
        wanted = list(privs)
        return any(p in held for p in wanted) if any_of else all(p in held for p in wanted)

    def all(self, path: str, *privs: str) -> None:
        if not self.restricted:
            return
        held = self.acl.privileges(path)
        for priv in privs:
            if priv not in held:
                raise denied(path, [priv])

    def any(self, path: str, *privs: str) -> None:
        if not self.has(path, privs, any_of=True):
            raise denied(path, privs)

    def config_keys(self, vmid: int, keys: Iterable[str]) -> None:
        """$check_vm_modify_config_perm (drives are checked by their value, in drive())."""
        path = "/vms/%d" % vmid
        for key in sorted(keys):
            if is_drive(key) or re.match(r"^(unused|serial|usb|hostpci|virtiofs)\d+$", key) or key == "tags":
                continue
            if key in CPU_KEYS or re.match(r"^numa\d+$", key):
                self.all(path, "VM.Config.CPU")
            elif key in MEMORY_KEYS:
                self.all(path, "VM.Config.Memory")
            elif key in HWTYPE_KEYS:
                self.all(path, "VM.Config.HWType")
            elif key in GENERAL_KEYS:
                self.all(path, "VM.Config.Options")
            elif key in DISK_KEYS:
                self.all(path, "VM.Config.Disk")
            elif re.match(r"^net\d+$", key):
                self.all(path, "VM.Config.Network")
            elif key in CLOUDINIT_KEYS or re.match(r"^ipconfig\d+$", key):
                self.any(path, "VM.Config.Cloudinit", "VM.Config.Network")

    def drive(self, vmid: int, key: str, value: str) -> None:
        """$check_drive_perms: a cloud-init drive needs Cloudinit and CDROM, a CD-ROM CDROM, any other disk Disk."""
        try:
            drive = DRIVE_FORMAT.parse(value, key)
        except ApiError:
            return
        path = "/vms/%d" % vmid
        if is_cloudinit(drive):
            self.all(path, "VM.Config.Cloudinit", "VM.Config.CDROM")
        elif is_cdrom(drive):
            self.all(path, "VM.Config.CDROM")
        else:
            self.all(path, "VM.Config.Disk")

    def new_disks(self, params: Dict[str, str], default_storage: Optional[str]) -> None:
        """$check_storage_access: `STORAGE:SIZE` allocates and needs Datastore.AllocateSpace there (a cloud-init
        drive does not)."""
        for _key, drive in drives(params):
            new_disk = NEW_DISK_RE.match(drive.get("file", ""))
            if new_disk and not is_cdrom(drive):
                storeid = new_disk.group(2) or default_storage
                if storeid:
                    self.all("/storage/%s" % storeid, "Datastore.AllocateSpace")

    def bridges(self, params: Dict[str, str]) -> None:
        """check_bridge_access: SDN.Use on each bridge a NIC is plugged into."""
        for key, value in sorted(params.items()):
            if not re.match(r"^net\d+$", key):
                continue
            try:
                bridge = NET_FORMAT.parse(value, key).get("bridge")
            except ApiError:
                continue
            if bridge:
                self.all("/sdn/zones/localnetwork/%s" % bridge, "SDN.Use")


def enforce(app, method: str, template: str, params: Dict[str, object], user: Optional[str]) -> None:
    """Raise PVE's 403 when the caller lacks a privilege the call needs; before anything is changed."""
    check = Checker(app.acl, user)
    if not check.restricted:
        return
    vm_path = "/vms/%s" % params.get("vmid")
    node_path = "/nodes/%s" % app.node
    if template.startswith("/nodes/{node}/qemu/{vmid}/agent"):
        check.all(vm_path, "VM.Monitor")
    elif method == "GET" and template in VM_READS:
        check.all(vm_path, "VM.Audit")
    elif method == "POST" and template.startswith("/nodes/{node}/qemu/{vmid}/status/"):
        check.all(vm_path, "VM.PowerMgmt")
    elif (method, template) in (("DELETE", "/nodes/{node}/qemu/{vmid}"),
                                ("POST", "/nodes/{node}/qemu/{vmid}/template")):
        check.all(vm_path, "VM.Allocate")
    elif (method, template) == ("POST", "/nodes/{node}/qemu/{vmid}/clone"):
        _clone(app, check, params)
    elif (method, template) == ("POST", "/nodes/{node}/qemu"):
        check.all(vm_path, "VM.Allocate")
        _config_change(app, check, params, create=True)
    elif method in ("PUT", "POST") and template == "/nodes/{node}/qemu/{vmid}/config":
        _config_change(app, check, params, create=False)
    elif (method, template) == ("PUT", "/nodes/{node}/qemu/{vmid}/resize"):
        check.all(vm_path, "VM.Config.Disk")
    elif (method, template) == ("PUT", "/nodes/{node}/qemu/{vmid}/cloudinit"):
        check.any(vm_path, "VM.Config.CDROM", "VM.Config.Cloudinit")
    elif template in TASK_PATHS:
        fields = str(params.get("upid")).split(":")  # UPID:node:pid:pstart:starttime:type:id:user:
        if len(fields) < 8 or fields[7] != user:
            check.all(node_path, "Sys.Modify" if method == "DELETE" else "Sys.Audit")
    elif (method, template) == ("GET", "/nodes/{node}/status"):
        check.all(node_path, "Sys.Audit")
    elif (method, template) == ("GET", "/nodes/{node}/storage/{storage}/status"):
        check.any("/storage/%s" % params.get("storage"), "Datastore.Audit", "Datastore.AllocateSpace")


def _clone(app, check: Checker, params: Dict[str, object]) -> None:
    check.all("/vms/%s" % params["vmid"], "VM.Clone")
    check.all("/vms/%s" % params["newid"], "VM.Allocate")
    source = app.find(int(params["vmid"]))  # type: ignore[arg-type]
    if source is None:
        return
    conf = dict(source.config)
    for _key, drive in drives(conf):
        volid = drive.get("file", "")
        if not volid or volid == "none" or is_cdrom(drive):
            continue  # drive_is_cdrom: the cloud-init drive too
        storeid = params.get("storage") or volid.split(":", 1)[0]
        check.all("/storage/%s" % storeid, "Datastore.AllocateSpace")
    check.bridges(conf)


def _config_change(app, check: Checker, params: Dict[str, object], create: bool) -> None:
    from pve_lab.api.config_checks import config_params

    vmid = int(params["vmid"])  # type: ignore[arg-type]
    values = config_params(params)
    deletes = [k for k in re.split(r"[,;\s]+", str(params.get("delete") or "")) if k]
    check.config_keys(vmid, list(values) + deletes)
    vm = None if create else app.find(vmid)
    for key in deletes:
        current = (vm.config.get(key) or vm.pending.get(key)) if vm is not None else None
        if is_drive(key) and current:
            check.drive(vmid, key, current)
    for key, value in sorted(values.items()):
        if is_drive(key):
            check.drive(vmid, key, value)
    check.new_disks(values, params.get("storage") if create else None)  # type: ignore[arg-type]
    check.bridges(values)


def visible(app, method: str, template: str, user: Optional[str], result: object) -> object:
    """The lists PVE filters by privilege: VMs without VM.Audit, storages without Datastore.Audit or
    AllocateSpace and, in cluster/resources, the node without Sys.Audit are left out."""
    check = Checker(app.acl, user)
    if not check.restricted or method != "GET" or not isinstance(result, list):
        return result

    def shown(entry: object) -> bool:
        if not isinstance(entry, dict):
            return True
        kind = entry.get("type")
        if "vmid" in entry and kind in (None, "qemu", "lxc"):
            return check.has("/vms/%s" % entry["vmid"], ["VM.Audit"])
        if kind == "storage" or template == "/nodes/{node}/storage":
            return check.has("/storage/%s" % entry.get("storage"), ["Datastore.Audit", "Datastore.AllocateSpace"],
                             any_of=True)
        if kind == "node":
            return check.has("/nodes/%s" % entry.get("node"), ["Sys.Audit"])
        return True

    if template in ("/nodes/{node}/qemu", "/cluster/resources", "/nodes/{node}/storage"):
        return [entry for entry in result if shown(entry)]
    return result
