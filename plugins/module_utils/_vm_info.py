# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``llmgw.fleet.pve_vm_info`` returns: the VMs matching its filters, each described from its config.

Private to the collection: a part of the VM runner, ``pve_vm_runner``, which re-exports ``vm_info`` and
``describe_vm``. It reads through the one client and writes nothing.
"""

from __future__ import annotations

from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import NotFound
from ansible_collections.llmgw.fleet.plugins.module_utils.vm_plan import (
    address_of,
    cpu_model,
    decode_sshkeys,
    memory_mib,
    normalize_sshkeys,
    parse_ipconfig,
    slow_cpu_variant,
)

__all__ = ["describe_vm", "vm_info"]


def vm_info(client, name=None, vmid=None, node=None, include_config=False):
    """The VMs (never containers) matching every filter given, each read from its config."""
    vms = []
    for guest in sorted(client.find_vms(name=name, vmid=vmid), key=lambda g: g["vmid"]):
        if node is not None and guest.get("node") != node:
            continue
        try:
            config = client.vm_config(guest["node"], guest["vmid"])
        except NotFound:
            continue  # removed while we looked
        vms.append(describe_vm(guest, config, include_config))
    return vms


def describe_vm(guest, config, include_config=False):
    ipconfig = parse_ipconfig(config.get("ipconfig0"))
    keys = normalize_sshkeys(decode_sshkeys(config["sshkeys"])) if config.get("sshkeys") else ""
    entry = {
        "vmid": guest["vmid"],
        "name": guest.get("name") or config.get("name"),
        "node": guest.get("node"),
        "status": guest.get("status"),
        "template": bool(guest.get("template")),
        "lock": config.get("lock"),
        "cpu": cpu_model(config.get("cpu")),
        "cpu_explicit": bool(config.get("cpu")),
        "slow_cpu_variant": slow_cpu_variant(config.get("cpu")),
        "cores": int(config["cores"]) if config.get("cores") is not None else None,
        "memory": memory_mib(config.get("memory")),
        "address": address_of(config),
        "gateway": ipconfig.get("gw"),
        "ciuser": config.get("ciuser"),
        "sshkeys": keys.splitlines(),
        "nameserver": config.get("nameserver"),
        "searchdomain": config.get("searchdomain"),
    }
    if include_config:
        entry["config"] = config
    return entry
