"""How VMs read back: `GET config` values typed as PVE's parse_vm_config types them, status and resource lists."""

from __future__ import annotations

import re
import time
from typing import Dict

from pve_lab.api import vm_config
from pve_lab.api.app import App
from pve_lab.api.constants import MACHINE, QEMU_VERSION
from pve_lab.api.qemu_schema import value_type
from pve_lab.api.state import VM


def typed_config(conf: Dict[str, str]) -> Dict[str, object]:
    """Integers and booleans come back as JSON numbers, everything else as the string in the config file."""
    out: Dict[str, object] = {}
    for key, value in conf.items():
        kind = value_type(key)
        if kind in ("integer", "boolean") and re.match(r"^[+-]?\d+$", value):
            out[key] = int(value)
        elif kind == "number" and re.match(r"^[+-]?\d+(\.\d+)?$", value):
            out[key] = int(value) if re.match(r"^[+-]?\d+$", value) else float(value)
        else:
            out[key] = value
    if "cipassword" in out:
        out["cipassword"] = "**********"
    return out


def status(app: App, vm: VM) -> Dict[str, object]:
    """vmstatus for one VM (the fields GET status/current and the VM lists share)."""
    conf = vm.config
    running = app.is_running(vm)
    maxmem = vm_config.memory_mib(conf) * 1024 * 1024
    data: Dict[str, object] = {
        "vmid": vm.vmid,
        "name": conf.get("name") or "VM %d" % vm.vmid,
        "status": "running" if running else "stopped",
        "cpus": vm_config.vcpus(conf),
        "maxmem": maxmem,
        "mem": maxmem // 4 if running else 0,
        "maxdisk": vm_config.boot_disk_size(app.state, conf),
        "disk": 0,
        "cpu": 0,
        "uptime": int(time.time() - vm.started_at) if running and vm.started_at else 0,
        "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
    }
    if running:
        data["pid"] = 100000 + vm.vmid
    if vm.is_template:
        data["template"] = 1
    for key in ("tags", "lock"):
        if key in conf:
            data[key] = conf[key]
    return data


def current(app: App, vm: VM) -> Dict[str, object]:
    """GET status/current."""
    data = status(app, vm)
    data["qmpstatus"] = data["status"]
    data["ha"] = {"managed": 0}
    if data["status"] == "running":
        data["running-machine"] = MACHINE
        data["running-qemu"] = QEMU_VERSION
    if vm_config.agent_enabled(vm.config):
        data["agent"] = 1
    if any(re.match(r"^serial\d+$", k) for k in vm.config):
        data["serial"] = 1
    return data


def resource(app: App, vm: VM, node: str) -> Dict[str, object]:
    """An entry of GET /cluster/resources?type=vm."""
    data = status(app, vm)
    entry = {"id": "qemu/%d" % vm.vmid, "type": "qemu", "node": node, "template": 1 if vm.is_template else 0,
             "maxcpu": data.pop("cpus")}
    data.pop("pid", None)
    entry.update(data)
    return entry
