#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_vm_info
short_description: Read the fleet's VMs on Proxmox VE
description:
  - Lists the cluster's QEMU VMs (never containers) matching every filter given, each with what the fleet cares
    about, that is the effective CPU model (a config without C(cpu) runs as V(kvm64)), the llama.cpp CPU backend a
    slow model would leave, the static address of C(ipconfig0), the cloud-init user and its decoded keys.
version_added: 0.1.0
author: llmgw.fleet developers (@llmgw)
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.attributes.INFO_MODULE
  - llmgw.fleet.proxmox
  - llmgw.fleet.proxmox.ACTIONGROUP_PROXMOX
options:
  name:
    description: Only the VM(s) of this name.
    type: str
  vmid:
    description: Only the VM with this VMID.
    type: int
  node:
    description: Only VMs on this cluster node.
    type: str
  include_config:
    description: Add each VM's whole config (as PVE returns it, C(sshkeys) still URL-encoded) under C(config).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Read node05
  llmgw.fleet.pve_vm_info:
    api_host: pve.example.com
    api_token_id: ansible@pve!fleet
    api_token_secret: "{{ vault_pve_token_secret }}"
    ca_path: /etc/llmgw/pve-ca.pem
    name: node05
  register: node05

- name: Every VM that would run llama.cpp on a slow CPU backend
  llmgw.fleet.pve_vm_info:
  register: fleet_vms

- name: Show them
  ansible.builtin.debug:
    msg: "{{ fleet_vms.vms | selectattr('slow_cpu_variant') | map(attribute='name') | list }}"
"""

RETURN = r"""
vms:
  description: The matching VMs, ordered by VMID.
  returned: always
  type: list
  elements: dict
  contains:
    vmid:
      description: VMID.
      type: int
      sample: 1105
    name:
      description: VM name.
      type: str
      sample: node05
    node:
      description: Cluster node the VM is on.
      type: str
      sample: pve
    status:
      description: V(running) or V(stopped).
      type: str
      sample: running
    template:
      description: Whether it is a template.
      type: bool
      sample: false
    lock:
      description: The config lock (V(clone), V(backup), ...), or null.
      type: str
      sample: null
    cpu:
      description: Effective CPU model (V(kvm64) when the config has no C(cpu)).
      type: str
      sample: host
    cpu_explicit:
      description: Whether the config sets C(cpu) at all.
      type: bool
      sample: true
    slow_cpu_variant:
      description: The llama.cpp CPU backend a model hiding AVX2 leaves (V(x64), V(sse42)), or null.
      type: str
      sample: null
    cores:
      description: Cores, or null when unset.
      type: int
      sample: 8
    memory:
      description: Memory in MiB, or null when unset.
      type: int
      sample: 16384
    address:
      description: Static address of C(ipconfig0) with prefix, or null.
      type: str
      sample: 10.77.0.105/24
    gateway:
      description: Gateway of C(ipconfig0), or null.
      type: str
      sample: 10.77.0.1
    ciuser:
      description: Cloud-init user.
      type: str
      sample: debian
    sshkeys:
      description: Decoded cloud-init public keys, one per element.
      type: list
      elements: str
      sample: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE4pI0qvGKY5Ca7z0kk8r3Tqb7FEAPOWcUpCIkHNO2yl fleet"]
    nameserver:
      description: Cloud-init DNS servers.
      type: str
      sample: 10.77.0.1
    searchdomain:
      description: Cloud-init search domains.
      type: str
      sample: fleet.internal
    config:
      description: The whole config (only with O(include_config=true)).
      type: dict
      returned: when O(include_config=true)
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.llmgw.fleet.plugins.module_utils._proxmox_args import (
    PROXMOX_REQUIRED_TOGETHER,
    proxmox_argument_spec,
    warn_if_unverified,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import (
    HAS_PROXMOXER,
    PROXMOXER_IMPORT_ERROR,
    ProxmoxClient,
    settings_from_params,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import ProxmoxError
from ansible_collections.llmgw.fleet.plugins.module_utils.pve_vm_runner import vm_info


def main():
    argument_spec = proxmox_argument_spec()
    argument_spec.update(
        name=dict(type="str"),
        vmid=dict(type="int"),
        node=dict(type="str"),
        include_config=dict(type="bool", default=False),
    )
    module = AnsibleModule(
        argument_spec=argument_spec,
        required_together=PROXMOX_REQUIRED_TOGETHER,
        supports_check_mode=True,
    )
    if not HAS_PROXMOXER:
        module.fail_json(msg=missing_required_lib("proxmoxer"), exception=PROXMOXER_IMPORT_ERROR)
    params = module.params
    try:
        warn_if_unverified(module)
        client = ProxmoxClient.connect(settings_from_params(params))
        vms = vm_info(client, params["name"], params["vmid"], params["node"], params["include_config"])
    except ProxmoxError as exc:
        module.fail_json(msg=str(exc), error=type(exc).__name__)
    module.exit_json(changed=False, vms=vms)


if __name__ == "__main__":
    main()
