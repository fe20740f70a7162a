# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pve_vm's options one by one, before the module connects to Proxmox VE: a value Proxmox would refuse half-way
through a run (after the clone) is refused here, naming the option, the value and the fix.

The rules are Proxmox VE's own schema where it has one: qemu-server ``src/PVE/QemuServer.pm`` (``name`` is a
``dns-name``, ``cores`` at least 1, ``nameserver`` an ``address-list``), ``src/PVE/QemuServer/Memory.pm``
(``memory`` at least 16 MiB) and pve-common ``src/PVE/JSONSchema.pm`` (``pve_verify_dns_name``,
``pve_verify_node_name``, ``parse_storage_id``, ``parse_bridge_id``, ``pve_verify_address``). Pool names follow
pve-access-control's ``verify_poolname``; a ``/`` (a nested pool) is let through for Proxmox VE to judge. The
address, the gateway, the VMID and the CPU model have their rules in the plan (``_vm_address``, ``_vm_cpu``).

Private to the collection: a part of the VM fields table (``vm_fields``), which names each option's check. Pure.
"""

from __future__ import annotations

import ipaddress
import re

from ansible_collections.llmgw.fleet.plugins.module_utils._vm_sshkeys import key_fields, key_lines

_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DNS_NAME = re.compile(r"(%s\.)*%s" % (_LABEL, _LABEL))
_NODE_NAME = re.compile(_LABEL)
_STORAGE_ID = re.compile(r"[a-z][a-z0-9._-]*[a-z0-9]", re.IGNORECASE)
_BRIDGE_ID = re.compile(r"[-_.\w]+")
_POOL_ID = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_USER = re.compile(r"[a-z_][a-z0-9_.-]*", re.IGNORECASE)
_KEY_TYPE = re.compile(r"(ssh-[a-z0-9@.-]+|ecdsa-sha2-[a-z0-9@.-]+|sk-[a-z0-9@.-]+)")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,3}")


def dns_name(value):
    if not _DNS_NAME.fullmatch(str(value)) or len(str(value)) > 253:
        return ("is not a DNS name, which Proxmox VE requires of a VM name",
                "use letters, digits and hyphens (e.g. node05)")
    return None


def node_name(value):
    if not _NODE_NAME.fullmatch(str(value)):
        return "is not a Proxmox VE node name", "give the node's name as 'pvesh get /nodes' lists it (e.g. pve)"
    return None


def storage_id(value):
    if len(str(value)) < 2 or not _STORAGE_ID.fullmatch(str(value)):
        return ("is not a Proxmox VE storage ID (2 characters or more: a letter first, then letters, digits, "
                "'-', '_' or '.'; no '-', '_' or '.' last)",
                "give a storage as 'pvesm status' lists it (e.g. local-lvm)")
    return None


def bridge_id(value):
    if not _BRIDGE_ID.fullmatch(str(value)):
        return "is not a bridge name", "give a bridge of the node (e.g. vmbr0)"
    return None


def pool_id(value):
    if not _POOL_ID.fullmatch(str(value)):
        return "is not a Proxmox VE pool name", "use letters, digits, '.', '_' and '-' (e.g. llmgw)"
    return None


def at_least(minimum, what, example):
    def check(value):
        if isinstance(value, int) and value < minimum:
            return "is below %d, the least %s" % (minimum, what), "give %d or more (e.g. %s)" % (minimum, example)
        return None
    return check


def user_name(value):
    if not _USER.fullmatch(str(value)):
        return "is not a user name", "name the user cloud-init creates (e.g. debian), or leave ciuser out"
    return None


def _entries(value):
    if isinstance(value, (list, tuple)):
        return [str(entry).strip() for entry in value]
    return str(value).replace(",", " ").split()


def addresses(value):
    for entry in _entries(value):
        try:
            ipaddress.ip_address(entry)
        except ValueError:
            if not _DNS_NAME.fullmatch(entry):
                return ("holds %r, which is neither an IP address nor a DNS name" % entry,
                        "list name servers by address (e.g. 10.77.0.1)")
    return None


def domains(value):
    for entry in _entries(value):
        if not _DNS_NAME.fullmatch(entry):
            return "holds %r, which is not a domain name" % entry, "list domains (e.g. lab.example)"
    return None


def public_keys(value):
    for line in key_lines(value):
        found = key_fields(line)
        if found is None or not _KEY_TYPE.fullmatch(found[0]) or not _BASE64.fullmatch(found[1]):
            return ("holds %r, which is not an OpenSSH public key" % line[:60],
                    "give public keys as ssh-keygen writes them (e.g. the content of ~/.ssh/llmgw_fleet.pub)")
    return None


def not_empty(value):
    if not str(value).strip():
        return "is empty", "leave the option out, or give a value"
    return None


def problems(request, fields):
    """Each option of ``request`` (set, with a check in ``fields``) that its check refuses, as one sentence."""
    found = []
    for field in fields:
        value = getattr(request, field.name, None)
        if field.check is None or value is None:
            continue
        refused = field.check(value)
        if refused:
            problem, fix = refused
            found.append("%s=%s %s: %s" % (field.name, _shown(value), problem, fix))
    return found


def _shown(value):
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."
