# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

from ansible_collections.llmgw.fleet.plugins.module_utils import vm_plan


def address_problem(address, vmid_base=vm_plan.DEFAULT_VMID_BASE):
    """'' for a node address pve_vm accepts (an IPv4 host address with its prefix length, whose last octet gives a
    VM ID Proxmox takes), else what is wrong, in pve_vm's own words."""
    try:
        vm_plan.derive_vmid(address, vmid_base)
    except vm_plan.PlanError as exc:
        return str(exc)
    return ""


class FilterModule:
    def filters(self):
        return {"address_problem": address_problem}
