#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_vm
short_description: A fleet node's VM on Proxmox VE, from a name and an address
description:
  - Makes the VM called O(name) exist (cloned from a template, or created), configured for cloud-init, in the
    power state asked for, or removes it.
  - "Identity: O(address) (IPv4 with prefix) is given once. It becomes C(ipconfig0) and, unless O(vmid) is given,
    the VMID: O(vmid_base) plus the address's last octet (C(10.77.0.105/24) with the default base 1000 is VMID
    1105). Proxmox refuses VMIDs below 100. A warning is given when the cluster's next free VMID lies inside the
    fleet's block of derived VMIDs (VMs created elsewhere without an id would take them)."
  - "Refusals that lose nothing: a VMID already used under another name, a name that exists under another VMID,
    a name that matches several VMs, an address already in another VM's C(ipconfig0) (containers are never matched).
    Every refusal is decided before the first change and names everything involved."
  - "A VM half-made by an interrupted run is finished: found by name and VMID, its missing configuration is applied
    (and it is started if asked). If it is still locked by its clone after O(timeout), the run stops and names it."
  - Configuration changes on an existing VM are sent with the config's C(digest), so a concurrent change is refused
    rather than overwritten. Changes that only take effect at the next boot of a running VM are reported
    (RV(reboot_required), RV(pending), a warning), or applied by a reboot when O(reboot_if_needed=true).
  - O(cpu) defaults to V(host). Models that hide AVX2 from the guest (V(kvm64), V(kvm32), V(qemu64), V(qemu32),
    V(x86-64-v2), V(x86-64-v2-AES); a config without C(cpu) runs as V(kvm64)) are refused unless
    O(allow_slow_cpu=true), and then a warning says which llama.cpp CPU backend will load and what it costs.
version_added: 0.1.0
author: llmgw.fleet developers (@llmgw)
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.proxmox
  - llmgw.fleet.proxmox.ACTIONGROUP_PROXMOX
options:
  name:
    description: The node's name, used as the VM name (and by cloud-init as the hostname). Unique in the cluster.
    type: str
    required: true
  state:
    description:
      - V(present) makes sure the VM exists and is configured, leaving its power state alone (a new VM stays
        stopped).
      - V(started) and V(stopped) also set the power state (stopping is an ACPI shutdown, forced after
        O(shutdown_timeout)).
      - V(absent) stops and destroys the VM called O(name) (with its disks). Nothing else is ever removed.
    type: str
    choices: [present, started, stopped, absent]
    default: present
  address:
    description:
      - The node's IPv4 address with prefix length, for example V(10.77.0.105/24). Drives C(ipconfig0) and the VMID.
      - Required to create the VM (unless O(vmid) is given); optional for an existing one.
    type: str
  gateway:
    description: Default gateway written into C(ipconfig0); must lie inside the address's network.
    type: str
  vmid:
    description: Explicit VMID. Wins over the derivation from O(address).
    type: int
  vmid_base:
    description: Added to the address's last octet to derive the VMID.
    type: int
    default: 1000
  node:
    description:
      - Cluster node the VM lives on. For a clone, defaults to the template's node; for a VM created from nothing,
        to the cluster's only node.
      - Read from E(PROXMOX_NODE) when not given.
    type: str
  clone:
    description:
      - Template to clone from, by name or VMID (the normal path). Without it, an empty VM is created (no OS disk).
    type: str
  full_clone:
    description: Make a full clone (independent of the template) rather than a linked one.
    type: bool
    default: true
  storage:
    description: Target storage of a full clone's disks (default, the template's).
    type: str
  pool:
    description: Resource pool to put a new VM in.
    type: str
  cpu:
    description: CPU model (PVE's C(cpu) option). V(host) lets the guest use every instruction the host has.
    type: str
    default: host
  allow_slow_cpu:
    description: Accept a CPU model that hides AVX2 (see the description); a warning still says what it costs.
    type: bool
    default: false
  cores:
    description: Number of cores. Left as it is (the template's) when not given.
    type: int
  memory:
    description: Memory in MiB. Left as it is (the template's) when not given.
    type: int
  agent:
    description: Enable the QEMU guest agent device. Left as it is when not given.
    type: bool
  onboot:
    description: Start the VM when its host boots. Left as it is when not given.
    type: bool
  ciuser:
    description: User cloud-init creates (C(ciuser)).
    type: str
  sshkeys:
    description:
      - Public keys cloud-init installs for O(ciuser); a multi-line string or a list, one key per line.
      - Compared as a set of keys (type and key material), so order, comments and blank lines do not make a change.
      - Sent URL-encoded, as PVE requires.
    type: raw
  nameserver:
    description: DNS servers for cloud-init, a space-separated string or a list.
    type: raw
  searchdomain:
    description: DNS search domains for cloud-init, a space-separated string or a list.
    type: raw
  cloudinit_storage:
    description:
      - Storage for the cloud-init drive, added as C(ide2) when the VM has none (a clone usually has one from its
        template).
    type: str
    default: local-lvm
  bridge:
    description: Bridge of the first network device (C(net0)) of a VM created from nothing. Unused for clones.
    type: str
    default: vmbr0
  reboot_if_needed:
    description:
      - Reboot a running VM whose configuration has changes that take effect only at boot. When V(false), they
        are reported (RV(reboot_required), a warning) instead.
    type: bool
    default: false
  timeout:
    description: Seconds to wait for each task (clone, start, stop, delete) and for a VM's lock to clear.
    type: int
    default: 600
  shutdown_timeout:
    description: Seconds a V(stopped) VM gets to shut down by ACPI before it is stopped hard.
    type: int
    default: 120
notes:
  - The VM name is compared exactly; only QEMU VMs (never containers) are matched by name or address, but the VMID
    space containers share is respected.
  - See docs/provisioning.md in the collection for the VMID rule, the half-made-VM rule and the refusals.
seealso:
  - module: llmgw.fleet.pve_vm_info
  - module: llmgw.fleet.wait_for_node
attributes:
  check_mode:
    support: full
    details: Reads everything a real run reads and predicts the same changes and diff without writing.
  diff_mode:
    support: full
    details: The diff lists every config key, the power state and the VM's existence that differ.
"""

EXAMPLES = r"""
- name: Clone node05 from the cloud-init template and start it
  llmgw.fleet.pve_vm:
    api_host: pve.example.com
    api_token_id: ansible@pve!fleet
    api_token_secret: "{{ vault_pve_token_secret }}"
    ca_path: /etc/llmgw/pve-ca.pem
    name: node05
    address: 10.77.0.105/24
    gateway: 10.77.0.1
    clone: debian12-cloudinit
    cores: 8
    memory: 16384
    ciuser: debian
    sshkeys: "{{ lookup('ansible.builtin.file', '~/.ssh/llmgw_fleet.pub') }}"
    nameserver: 10.77.0.1
    state: started

- name: Stop node05 (ACPI shutdown, forced after two minutes)
  llmgw.fleet.pve_vm:
    name: node05
    state: stopped

- name: A node that must live-migrate between different CPUs, knowing the cost
  llmgw.fleet.pve_vm:
    name: node09
    address: 10.77.0.109/24
    clone: debian12-cloudinit
    cpu: x86-64-v2-AES
    allow_slow_cpu: true

- name: Remove node05 (only the VM of that name, with its disks)
  llmgw.fleet.pve_vm:
    name: node05
    address: 10.77.0.105/24
    state: absent

- name: Connection options once for every Proxmox module
  module_defaults:
    group/llmgw.fleet.proxmox:
      api_host: pve.example.com
      api_token_id: ansible@pve!fleet
      api_token_secret: "{{ vault_pve_token_secret }}"
      ca_path: /etc/llmgw/pve-ca.pem
  block:
    - name: Make sure node06 exists
      llmgw.fleet.pve_vm:
        name: node06
        address: 10.77.0.106/24
        clone: debian12-cloudinit
"""

RETURN = r"""
vmid:
  description: The VM's VMID (predicted in check mode). Null for V(absent) when no such VM existed.
  returned: always
  type: int
  sample: 1105
node:
  description: The cluster node the VM is (or would be) on. Null for V(absent) when no such VM existed.
  returned: always
  type: str
  sample: pve
name:
  description: The VM's name.
  returned: always
  type: str
  sample: node05
cpu:
  description: The VM's effective CPU model (V(kvm64) when its config has no C(cpu)).
  returned: always
  type: str
  sample: host
address:
  description: The static address of its C(ipconfig0) (V(null) when none).
  returned: always
  type: str
  sample: 10.77.0.105/24
status:
  description: The VM's power state after the run (V(running), V(stopped)), or V(absent).
  returned: always
  type: str
  sample: running
reboot_required:
  description: Whether the running VM has configuration changes that take effect only at its next boot.
  returned: when O(state) is not V(absent)
  type: bool
  sample: false
pending:
  description: The configuration keys waiting for that boot.
  returned: when O(state) is not V(absent)
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib

from ansible_collections.llmgw.fleet.plugins.module_utils import vm_fields
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
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import ProxmoxError, TaskFailed, Timeout
from ansible_collections.llmgw.fleet.plugins.module_utils.pve_vm_runner import VMRefused, VMRequest, run_vm
from ansible_collections.llmgw.fleet.plugins.module_utils.vm_plan import PlanError

# The VM options, their types and defaults come from the one table of VM fields (module_utils/vm_fields.py);
# tests/unit/plugins/module_utils/test_vm_fields.py checks DOCUMENTATION above against it.
CONNECTION_KEYS = set(proxmox_argument_spec())


def argument_spec():
    """The connection options (shared by every Proxmox module) and the VM options."""
    spec = proxmox_argument_spec()
    spec.update(vm_fields.argument_spec(env_fallback))
    return spec


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        required_together=PROXMOX_REQUIRED_TOGETHER,
        supports_check_mode=True,
    )
    if not HAS_PROXMOXER:
        module.fail_json(msg=missing_required_lib("proxmoxer"), exception=PROXMOXER_IMPORT_ERROR)
    params = module.params
    try:
        request = VMRequest(**dict((k, v) for k, v in params.items() if k not in CONNECTION_KEYS))
        warn_if_unverified(module)
        client = ProxmoxClient.connect(settings_from_params(params))
        outcome = run_vm(client, request, check_mode=module.check_mode)
    except (VMRefused, PlanError) as exc:
        module.fail_json(msg=str(exc), name=params["name"])
    except (TaskFailed, Timeout) as exc:
        module.fail_json(msg=str(exc), name=params["name"], upid=exc.upid, task_log=exc.log_tail)
    except ProxmoxError as exc:
        module.fail_json(msg="%s: %s" % (params["name"], exc), name=params["name"], error=type(exc).__name__)
    for warning in outcome.warnings:
        module.warn(warning)
    result = dict(outcome.result, changed=outcome.changed)
    if module._diff:
        result["diff"] = outcome.diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
