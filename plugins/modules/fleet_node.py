#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_node
short_description: Record an inference node in the fleet registry
version_added: 0.1.0
description:
  - Creates, updates or removes a node in the fleet registry, an SQLite database on the controller
    (see C(docs/placement.md) in the collection).
  - Only the options given are changed; the others keep their recorded values.
  - The registry lives on the controller, so run this module there (set C(delegate_to) to C(localhost), or use a play on
    C(localhost)).
  - Every change is one transaction; concurrent playbooks wait for each other (busy timeout) rather than fail.
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.registry
attributes:
  check_mode:
    support: full
    details: The change runs against an in-memory copy of the registry, so it is checked exactly.
  diff_mode:
    support: full
    details: The node's recorded fields before and after.
author:
  - llmgw.fleet developers (@llmgw)
options:
  name:
    description: Node name (the VM name, hostname and certificate CN).
    type: str
    required: true
  state:
    description:
      - C(present) records the node; C(absent) removes it, which fails while it still holds shards.
    type: str
    choices: [present, absent]
    default: present
  status:
    description:
      - The node's state in the fleet. New nodes start C(pending). Only C(ready) nodes are given shards.
      - A change of status without O(reasons) clears the previous reasons.
    type: str
    choices: [pending, ready, draining, maintenance, lost]
  reasons:
    description: Why the node is in its status, for people.
    type: list
    elements: str
  address:
    description: Address the controller reaches the node at (becomes C(ansible_host) in the inventory plugin).
    type: str
  vmid:
    description: Proxmox VM id.
    type: int
  proxmox_node:
    description: The Proxmox VE node the VM runs on.
    type: str
  fabric:
    description:
      - Interconnect fabric the node is on (for example C(ib-a)). All shards of a multi-node replica share one.
      - New nodes default to C(default). Moving a node that holds shards of a multi-node replica is refused.
    type: str
  gpu_count:
    description:
      - Number of GPUs on the node (the registry's C(gpu_count)).
      - The alias C(gpus) is kept for playbooks written before the option was named O(gpu_count).
    type: int
    aliases: [gpus]
  gpu_type:
    description: GPU model, matched against a replica's C(gpu_type) constraint. C("") clears it.
    type: str
  cpu_variant:
    description: The ggml CPU backend variant the node's CPU supports (for example C(haswell)).
    type: str
  engine_version:
    description: Version of the inference engine installed on the node.
    type: str
  engine_args:
    description: Arguments every C(llama-server) launched on the node gets, as onboarding found them
      (C(llmgw.fleet.engine_completion_check)); for example C([--no-repack]) where AMX faults. C([]) clears them.
    type: list
    elements: str
  speed:
    description:
      - The node's speed as onboarding's probe measured it (C(llmgw.fleet.engine_speed_probe)) - C(variant),
        C(threads), C(vcpus), tokens per second of prompt processing C(pp) and generation C(tg) with the picked CPU
        backend, C(baseline_pp) and C(baseline_tg) with the scalar C(x64) one, and the ratios C(pp_ratio) and
        C(tg_ratio). Replaced whole; C({}) clears it.
    type: dict
  cert_fingerprint:
    description: SHA-256 fingerprint of the node's certificate.
    type: str
  last_seen:
    description: When the node was last seen, C(now) or an ISO 8601 time (stored in UTC).
    type: str
notes:
  - O(last_seen=now) changes the record on every run, so it reports C(changed).
seealso:
  - module: llmgw.fleet.fleet_replica
  - module: llmgw.fleet.fleet_info
  - plugin: llmgw.fleet.fleet
    plugin_type: inventory
"""

EXAMPLES = r"""
- name: Register node01 on fabric ib-a with eight GPUs, ready for shards
  llmgw.fleet.fleet_node:
    name: node01
    address: 10.77.0.11
    vmid: 111
    proxmox_node: pve1
    fabric: ib-a
    gpu_count: 8
    gpu_type: sim
    cpu_variant: haswell
    engine_version: b10991
    status: ready
    last_seen: now
  delegate_to: localhost

- name: Declare node02 lost
  llmgw.fleet.fleet_node:
    name: node02
    status: lost
    reasons: ["unseen for 60 s"]
  delegate_to: localhost

- name: Remove a node that holds no shards
  llmgw.fleet.fleet_node:
    name: node06
    state: absent
    db: /srv/llmgw/fleet.db
  delegate_to: localhost
"""

RETURN = r"""
node:
  description: The node as recorded after the task (empty when removed).
  returned: always
  type: dict
  sample:
    name: node01
    address: 10.77.0.11
    fabric: ib-a
    gpu_count: 8
    free_gpus: 4
    state: ready
    reasons: []
    shards: [{replica: coder-a, rank: 0}]
db:
  description: The registry database used.
  returned: always
  type: str
  sample: /root/.local/share/llmgw/fleet.db
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import _fleet_module, fleet_registry, fleet_service


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            status=dict(type="str", choices=list(fleet_registry.NODE_STATES)),
            reasons=dict(type="list", elements="str"),
            address=dict(type="str"),
            vmid=dict(type="int"),
            proxmox_node=dict(type="str"),
            fabric=dict(type="str"),
            gpu_count=dict(type="int", aliases=["gpus"]),
            gpu_type=dict(type="str"),
            cpu_variant=dict(type="str"),
            engine_version=dict(type="str"),
            engine_args=dict(type="list", elements="str"),
            speed=dict(type="dict"),
            cert_fingerprint=dict(type="str"),
            last_seen=dict(type="str"),
            db=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    path, (before, after) = _fleet_module.run(
        module, lambda registry: fleet_service.change_node(registry, params["name"], params["state"], params))
    changed, diff = fleet_service.compare(before, after, fleet_registry.NODE_FIELDS)
    module.exit_json(changed=changed, node=after or {}, db=path, diff=diff)


if __name__ == "__main__":
    main()
