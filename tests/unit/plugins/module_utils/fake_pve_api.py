"""An in-memory stand-in for ProxmoxClient, for the runner's unit tests (no lab, no network).

It has the client's methods that ``pve_vm_runner`` calls, with the same names, arguments and return shapes, and
keeps a small cluster in memory: guests with a config (current values and the pending section a running VM keeps
for its next boot), a power status, a template flag, a lock and a node. Every call is recorded in order
(``calls``; ``writes`` holds the writes only), and ``fail`` makes a given call raise a given typed error of
``proxmox_errors`` instead of doing anything.

What PVE does is simulated as far as the runner can tell: a clone copies the template's config under the new VMID
and name (``template`` dropped, the cloud-init drive re-made for the new VMID); a config change of a running VM
keeps the keys that need a boot in its pending section (and the cloud-init keys waiting for the drive to be
re-made), which a start or a reboot applies; the ``digest`` changes with every change and a stale one is refused;
a locked VM refuses changes; starting a running VM, rebooting a stopped one and destroying a running one fail as
their PVE tasks do. The guest agent answers as PVE's ``agent/*`` endpoints do for a VM given a guest
(``add_guest``): not configured, VM not running and agent not running are the client's typed errors.
"""

from __future__ import annotations

import hashlib
from collections import namedtuple

from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import match_vms
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import (
    AgentNotConfigured,
    AgentNotRunning,
    AlreadyExists,
    ConfigChanged,
    Locked,
    NotFound,
    TaskFailed,
    VMNotRunning,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.vm_plan import agent_enabled

TEMPLATE_VMID = 9000
TEMPLATE_NAME = "debian12-cloudinit"
NODE = "pve"
# The lab's template (tests/lab/pve_lab/api/template.py): no cpu key (PVE runs kvm64), a cloud-init drive in ide2.
TEMPLATE_CONFIG = {
    "name": TEMPLATE_NAME,
    "agent": "1",
    "cores": 2,
    "memory": "2048",
    "ostype": "l26",
    "scsihw": "virtio-scsi-pci",
    "scsi0": "local-lvm:base-9000-disk-0,size=3G",
    "ide2": "local-lvm:vm-9000-cloudinit,media=cdrom",
    "net0": "virtio=BC:24:11:00:90:00,bridge=vmbr0",
    "boot": "order=scsi0;net0",
    "template": 1,
}

# Keys PVE applies to a running VM at once; every other key waits in the pending section for the next boot.
HOT_KEYS = frozenset(["onboot", "name", "ciuser", "sshkeys", "ipconfig0", "nameserver", "searchdomain"])
# Keys that reach the guest only through the cloud-init drive, re-made at the next start.
CLOUDINIT_KEYS = frozenset(["ciuser", "sshkeys", "ipconfig0", "nameserver", "searchdomain", "name"])
# Parameters of POST /nodes/{node}/qemu that are not config keys.
CREATE_ONLY = frozenset(["pool", "start", "storage"])

WRITE_METHODS = (
    "clone_vm",
    "create_vm",
    "update_config",
    "start_vm",
    "stop_vm",
    "shutdown_vm",
    "reboot_vm",
    "delete_vm",
)
# Which argument names the VM a fault is aimed at.
TARGET_ARG = {"clone_vm": "newid"}
# docs/real-proxmox.md's LLMGWFleet role, and what only root's own token holds besides
DOCS_ROLE = frozenset([
    "VM.Audit", "VM.Allocate", "VM.Clone", "VM.PowerMgmt", "VM.Config.CPU", "VM.Config.Memory",
    "VM.Config.Cloudinit", "VM.Config.CDROM", "VM.Config.Disk", "VM.Config.Options", "VM.Config.Network",
    "Datastore.AllocateSpace", "Datastore.Audit", "SDN.Use", "Sys.Audit",
])
ALL_PRIVILEGES = DOCS_ROLE | frozenset(["VM.Config.HWType", "VM.Monitor", "Sys.Modify"])

Call = namedtuple("Call", ["method", "args"])


def task_failed(kind, vmid, text, node=NODE):
    """The TaskFailed the real client raises for a task of ``kind`` (qmstart, qmclone...) that ended in ``text``."""
    upid = "UPID:%s:0001B2C3:0123ABCD:6650F00D:%s:%s:root@pam:" % (node, kind, vmid)
    tail = ["starting task %s" % kind, "TASK ERROR: %s" % text]
    return TaskFailed(
        "task %s %s on node %s failed: %s\n--- task log (last %d lines) ---\n%s"
        % (kind, vmid, node, text, len(tail), "\n".join(tail)),
        upid=upid,
        exitstatus=text,
        log_tail=tail,
    )


class FakeVM:
    def __init__(self, vmid, node, config, status, template, lock, guest_type, unlock_after):
        self.vmid = vmid
        self.node = node
        self.config = dict(config)
        self.pending = {}
        self.cloudinit_pending = set()
        self.status = status
        self.template = template
        self.lock = lock
        self.type = guest_type
        self.unlock_after = unlock_after
        self.guest = None

    def effective(self):
        """The config as GET config answers it: pending values applied, lock and digest added."""
        config = dict(self.config)
        config.update(self.pending)
        if self.template:
            config["template"] = 1
        if self.lock:
            config["lock"] = self.lock
        config["digest"] = self.digest()
        return config

    def digest(self):
        material = repr((sorted(self.config.items()), sorted(self.pending.items()), self.lock))
        return hashlib.sha1(material.encode()).hexdigest()

    def boot(self):
        self.config.update(self.pending)
        self.pending = {}
        self.cloudinit_pending = set()


class FakeProxmoxClient:
    """The parts of ProxmoxClient the runner uses, on an in-memory cluster."""

    def __init__(self, nodes=(NODE,), next_id=None):
        self.node_names = list(nodes)
        self.next_id = next_id
        self.vms = {}
        self.calls = []
        self.faults = []
        self.grants = None  # ACL path -> privileges the token holds there; None: everything (root's token)

    # ------------------------------------------------------------------------------------------- set-up

    def add_vm(self, vmid, name, config=None, node=NODE, status="stopped", template=False, lock=None,
               guest_type="qemu", unlock_after=None):
        """A guest; ``unlock_after`` polls of wait_unlocked clear its ``lock`` (None: the lock stays)."""
        if vmid in self.vms:
            raise ValueError("VMID %s is in the fake twice" % vmid)
        config = dict(config or {})
        config.pop("template", None)
        if name is not None:
            config["name"] = name
        self.vms[vmid] = FakeVM(vmid, node, config, status, template, lock, guest_type, unlock_after)
        return self.vms[vmid]

    def add_template(self, vmid=TEMPLATE_VMID, name=TEMPLATE_NAME, node=NODE, config=None):
        return self.add_vm(vmid, name, config=config or TEMPLATE_CONFIG, node=node, template=True)

    def add_container(self, vmid, name, node=NODE, status="running"):
        return self.add_vm(vmid, name, config={"hostname": name}, node=node, status=status, guest_type="lxc")

    def add_guest(self, vmid, guest):
        """What runs inside VM ``vmid``, as its agent shows it: ``guest.exec(argv)`` answers
        ``{"exitcode", "out", "err"}``, ``guest.read_file(path)`` the file's text, and ``guest.agent_running`` (when
        it has one) says whether qemu-guest-agent answers yet. A VM without a guest has no agent answering."""
        self.vms[vmid].guest = guest

    def grant(self, grants):
        """The token holds only ``grants`` (ACL path -> privileges), propagated to the paths below each, a deeper
        path's grant replacing what is inherited (as PVE computes it)."""
        self.grants = {path: set(privileges) for path, privileges in grants.items()}

    def fail(self, method, error, vmid=None):
        """The next call of ``method`` (for ``vmid``, where given) raises ``error`` and does nothing."""
        self.faults.append((method, vmid, error))

    # ------------------------------------------------------------------------------------------ records

    @property
    def writes(self):
        return [call for call in self.calls if call.method in WRITE_METHODS]

    def write_names(self):
        return [call.method for call in self.writes]

    def snapshot(self):
        """Everything a write could change, to compare before and after a run."""
        return {
            vmid: (vm.node, vm.status, vm.template, vm.lock, sorted(vm.config.items()), sorted(vm.pending.items()))
            for vmid, vm in self.vms.items()
        }

    def _record(self, method, **args):
        self.calls.append(Call(method, args))
        target = args.get(TARGET_ARG.get(method, "vmid"))
        for fault in self.faults:
            name, vmid, error = fault
            if name == method and (vmid is None or vmid == target):
                self.faults.remove(fault)
                raise error

    def _vm(self, node, vmid):
        vm = self.vms.get(int(vmid))
        if vm is None or vm.type != "qemu" or vm.node != node:
            raise NotFound("HTTP 500: Configuration file 'nodes/%s/qemu-server/%s.conf' does not exist" % (node, vmid),
                           status=500)
        return vm

    # --------------------------------------------------------------------------------------------- reads

    def privileges(self, path):
        self._record("privileges", path=path)
        if self.grants is None:
            return set(ALL_PRIVILEGES)
        parts = [part for part in path.split("/") if part]
        held = set()
        for depth in range(len(parts) + 1):
            held = self.grants.get("/" + "/".join(parts[:depth]), held)
        return set(held)

    def nodes(self):
        self._record("nodes")
        return list(self.node_names)

    def guests(self):
        self._record("guests")
        result = []
        for vmid in sorted(self.vms):
            vm = self.vms[vmid]
            entry = {
                "id": "%s/%d" % (vm.type, vmid),
                "vmid": vmid,
                "name": vm.config.get("name") if vm.type == "qemu" else vm.config.get("hostname"),
                "node": vm.node,
                "type": vm.type,
                "status": vm.status,
                "template": vm.template,
            }
            if vm.lock:
                entry["lock"] = vm.lock
            result.append(entry)
        return result

    def qemu_vms(self):
        return [g for g in self.guests() if g.get("type") == "qemu"]

    def find_vms(self, name=None, vmid=None):
        return match_vms(self.guests(), name=name, vmid=vmid)

    def next_free_id(self):
        self._record("next_free_id")
        if self.next_id is not None:
            return self.next_id
        vmid = 100
        while vmid in self.vms:
            vmid += 1
        return vmid

    def vm_config(self, node, vmid, current=False):
        self._record("vm_config", node=node, vmid=vmid, current=current)
        vm = self._vm(node, vmid)
        if current:
            config = dict(vm.config)
            config["digest"] = vm.digest()
            return config
        return vm.effective()

    def vm_status(self, node, vmid):
        self._record("vm_status", node=node, vmid=vmid)
        vm = self._vm(node, vmid)
        return {"vmid": vm.vmid, "name": vm.config.get("name"), "status": vm.status}

    def pending_keys(self, node, vmid):
        self._record("pending_keys", node=node, vmid=vmid)
        vm = self._vm(node, vmid)
        return sorted(set(vm.pending) | vm.cloudinit_pending)

    def wait_unlocked(self, node, vmid, timeout):
        self._record("wait_unlocked", node=node, vmid=vmid, timeout=timeout)
        vm = self._vm(node, vmid)
        if vm.lock and vm.unlock_after is not None:
            vm.unlock_after -= 1
            if vm.unlock_after <= 0:
                vm.lock = None
        if vm.lock:
            raise Locked(
                "VM %s (%s) on node %s stayed locked (%s) for %ss" % (vm.config.get("name") or "", vmid, node,
                                                                      vm.lock, timeout),
                reason=vm.lock,
            )
        return vm.effective()

    # -------------------------------------------------------------------------------------------- writes

    def clone_vm(self, node, template_vmid, newid, name, timeout, full=None, target=None, storage=None, pool=None):
        self._record("clone_vm", node=node, template_vmid=template_vmid, newid=newid, name=name, timeout=timeout,
                     full=full, target=target, storage=storage, pool=pool)
        source = self._vm(node, template_vmid)
        if source.lock:
            raise Locked("HTTP 500: VM is locked (%s)" % source.lock, status=500)
        if int(newid) in self.vms:
            raise AlreadyExists("HTTP 500: unable to create VM %d: config file already exists" % int(newid),
                                status=500)
        config = {}
        for key, value in source.config.items():
            if "cloudinit" in str(value).split(",", 1)[0]:
                store = storage or str(value).split(":", 1)[0]
                value = "%s:vm-%d-cloudinit,media=cdrom" % (store, int(newid))
            config[key] = value
        self.add_vm(int(newid), name, config=config, node=target or node)
        return "OK"

    def create_vm(self, node, vmid, params, timeout):
        self._record("create_vm", node=node, vmid=vmid, params=dict(params), timeout=timeout)
        if node not in self.node_names:
            raise NotFound("HTTP 500: no such cluster node '%s'" % node, status=500)
        if int(vmid) in self.vms:
            raise AlreadyExists("HTTP 500: unable to create VM %d: config file already exists" % int(vmid),
                                status=500)
        config = dict((k, v) for k, v in params.items() if k not in CREATE_ONLY)
        self.add_vm(int(vmid), config.pop("name", None), config=config, node=node)
        return "OK"

    def update_config(self, node, vmid, params, timeout, digest=None, delete=None):
        self._record("update_config", node=node, vmid=vmid, params=dict(params), timeout=timeout, digest=digest,
                     delete=delete)
        vm = self._vm(node, vmid)
        if digest and digest != vm.digest():
            raise ConfigChanged("HTTP 500: checksum mismatch (file change by other user?)", status=500)
        if vm.lock:
            raise Locked("HTTP 500: VM is locked (%s)" % vm.lock, status=500)
        for key, value in params.items():
            if vm.status == "running" and key not in HOT_KEYS:
                vm.pending[key] = value
                continue
            vm.config[key] = value
            if vm.status == "running" and key in CLOUDINIT_KEYS:
                vm.cloudinit_pending.add(key)
        for key in delete or []:
            vm.config.pop(key, None)
        return "OK"

    def start_vm(self, node, vmid, timeout):
        self._record("start_vm", node=node, vmid=vmid, timeout=timeout)
        vm = self._vm(node, vmid)
        if vm.status == "running":
            raise task_failed("qmstart", vmid, "VM %s already running" % vmid, node)
        vm.boot()
        vm.status = "running"
        return "OK"

    def stop_vm(self, node, vmid, timeout):
        self._record("stop_vm", node=node, vmid=vmid, timeout=timeout)
        self._vm(node, vmid).status = "stopped"
        return "OK"

    def shutdown_vm(self, node, vmid, timeout, grace):
        self._record("shutdown_vm", node=node, vmid=vmid, timeout=timeout, grace=grace)
        self._vm(node, vmid).status = "stopped"
        return "OK"

    def reboot_vm(self, node, vmid, timeout):
        self._record("reboot_vm", node=node, vmid=vmid, timeout=timeout)
        vm = self._vm(node, vmid)
        if vm.status != "running":
            raise task_failed("qmreboot", vmid, "VM %s not running" % vmid, node)
        vm.boot()
        return "OK"

    def delete_vm(self, node, vmid, timeout):
        self._record("delete_vm", node=node, vmid=vmid, timeout=timeout)
        vm = self._vm(node, vmid)
        if vm.status == "running":
            raise task_failed("qmdestroy", vmid, "VM %s is running - destroy failed" % vmid, node)
        if vm.lock:
            raise Locked("HTTP 500: VM is locked (%s)" % vm.lock, status=500)
        del self.vms[vm.vmid]
        return "OK"

    # --------------------------------------------------------------------------------------- guest agent

    def _agent(self, node, vmid):
        vm = self._vm(node, vmid)
        if not agent_enabled(vm.effective().get("agent")):
            raise AgentNotConfigured("HTTP 500: No QEMU guest agent configured", status=500)
        if vm.status != "running":
            raise VMNotRunning("HTTP 500: VM %s is not running" % vmid, status=500)
        if vm.guest is None or not getattr(vm.guest, "agent_running", True):
            raise AgentNotRunning("HTTP 500: QEMU guest agent is not running", status=500)
        return vm.guest

    def agent_ping(self, node, vmid):
        self._record("agent_ping", node=node, vmid=vmid)
        self._agent(node, vmid)

    def agent_exec(self, node, vmid, argv, timeout, input_data=None):
        self._record("agent_exec", node=node, vmid=vmid, argv=[str(a) for a in argv], timeout=timeout)
        return self._agent(node, vmid).exec([str(a) for a in argv])

    def agent_read_file(self, node, vmid, path, timeout=30):
        self._record("agent_read_file", node=node, vmid=vmid, path=path)
        return self._agent(node, vmid).read_file(path)
