# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Desired versus current configuration of a fleet VM: pure functions, no I/O.

Identity: a node's ``address`` (IPv4 with prefix) is given once; it drives ``ipconfig0`` and the VMID
(``vmid = vmid_base + last octet``, ``vmid_base`` 1000 by default, so 10.77.0.105/24 becomes VMID 1105).
Comparison: values are compared as PVE means them, not as strings: ``sshkeys`` as sets of decoded keys,
a missing ``cpu`` as ``kvm64`` (the backend default), ``ipconfig0`` as a set of ``key=value`` pairs.

The parts, each private (this module is the one callers import, and re-exports their public names):
:mod:`_vm_address` (address, ``ipconfig0`` and VMID rules; :class:`PlanError`), :mod:`_vm_cpu` (CPU model rules),
:mod:`_vm_sshkeys` (``sshkeys`` encoding and comparison), :mod:`_vm_config` (the config plan and the diff).
"""

from __future__ import annotations

from ansible_collections.llmgw.fleet.plugins.module_utils._vm_address import (
    DEFAULT_VMID_BASE,
    MAX_VMID,
    MIN_VMID,
    PlanError,
    address_of,
    derive_vmid,
    ipconfig0_for,
    next_id_clash,
    parse_address,
    parse_ipconfig,
    same_host_ip,
    vmid_block,
)
from ansible_collections.llmgw.fleet.plugins.module_utils._vm_config import (
    CLOUDINIT_DRIVE_KEY,
    CLOUDINIT_KEYS,
    DEFAULT_CLOUDINIT_SLOT,
    DRIVE_SLOTS,
    HOT_KEYS,
    MANAGED_KEYS,
    Change,
    ConfigPlan,
    DesiredVM,
    DifferenceTracker,
    agent_enabled,
    cloudinit_drive,
    memory_mib,
    plan_config,
    reboot_warning,
)
from ansible_collections.llmgw.fleet.plugins.module_utils._vm_cpu import (
    PVE_DEFAULT_CPU,
    SLOW_CPU_VARIANTS,
    SLOW_GENERATION_FACTOR,
    SLOW_PROMPT_FACTOR,
    check_cpu,
    cpu_model,
    normalize_cpu,
    slow_cpu_variant,
    slow_cpu_warning,
)
from ansible_collections.llmgw.fleet.plugins.module_utils._vm_sshkeys import (
    decode_sshkeys,
    encode_sshkeys,
    normalize_sshkeys,
    sshkey_set,
)

__all__ = ["CLOUDINIT_DRIVE_KEY", "CLOUDINIT_KEYS", "DEFAULT_CLOUDINIT_SLOT", "DEFAULT_VMID_BASE", "DRIVE_SLOTS",
           "HOT_KEYS", "MANAGED_KEYS", "MAX_VMID", "MIN_VMID", "PVE_DEFAULT_CPU", "SLOW_CPU_VARIANTS",
           "SLOW_GENERATION_FACTOR", "SLOW_PROMPT_FACTOR", "Change", "ConfigPlan", "DesiredVM", "DifferenceTracker",
           "PlanError", "address_of", "agent_enabled", "check_cpu", "cloudinit_drive", "cpu_model", "decode_sshkeys",
           "derive_vmid", "encode_sshkeys", "ipconfig0_for", "memory_mib", "next_id_clash", "normalize_cpu",
           "normalize_sshkeys", "parse_address", "parse_ipconfig", "plan_config", "reboot_warning", "same_host_ip",
           "slow_cpu_variant", "slow_cpu_warning", "sshkey_set", "vmid_block"]
