#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_replica
short_description: Record a replica, its placement and its repairs in the fleet registry
version_added: 0.1.0
description:
  - Creates, updates or removes a replica in the fleet registry on the controller, and records which node and
    GPUs each of its shards holds (rank 0 is the leader).
  - A placement is either given (O(assignment), for example from the C(llmgw.fleet.placement) lookup) or
    computed by the solver inside the same database transaction that records it (O(place=true)), so two
    playbooks placing at once never hand out one GPU twice.
  - O(repair=true) repairs a replica that lost a node, in one transaction, by the rule in C(docs/placement.md) --
    surviving shards stay if their own fabric can still hold the whole replica; otherwise the whole replica
    moves to a fabric that can; otherwise it is failed with the reason. Survivors that must be stopped are
    returned in RV(reaped_shards).
  - Every invariant is checked on write; a violating O(assignment) fails the task and records nothing.
  - Run it on the controller (set C(delegate_to) to C(localhost), or use a play on C(localhost)).
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.registry
attributes:
  check_mode:
    support: full
    details: The change runs against an in-memory copy of the registry, so a check-mode placement is the
      placement a real run would make, unless the fleet changes in between.
  diff_mode:
    support: full
    details: The replica's recorded fields and its shards before and after.
author:
  - llmgw.fleet developers (@llmgw)
options:
  name:
    description: Replica name.
    type: str
    required: true
  state:
    description:
      - C(present) records the replica; C(absent) removes it and frees its GPUs (its shards are returned in
        RV(reaped_shards) so the caller can stop them).
    type: str
    choices: [present, absent]
    default: present
  model:
    description: Model the replica serves. Required for a new replica.
    type: str
  engine:
    description: Inference engine (C(llama_cpp), C(vllm), C(sglang), C(sim)). Required for a new replica.
    type: str
  shard_count:
    description:
      - Number of shards (nodes) the replica must have. Required for a new replica.
      - The alias O(shards) is kept for playbooks written before.
    type: int
    aliases: [shards]
  gpus_per_shard:
    description: GPUs each shard holds on its node (0 for CPU inference). Required for a new replica.
    type: int
  fabric:
    description: Only place the replica on this fabric. C("") removes the constraint.
    type: str
  gpu_type:
    description: Only place shards on nodes with this GPU type. C("") removes the constraint.
    type: str
  avoid_nodes:
    description: Never place shards of this replica on these nodes.
    type: list
    elements: str
  port:
    description: Port the leader serves on (and the workers' rendezvous port base).
    type: int
  options:
    description: Engine options recorded with the replica, for the launcher.
    type: dict
  status:
    description: The replica's state. A change without O(reasons) clears the previous reasons.
    type: str
    choices: [placing, starting, ready, failed]
  reasons:
    description: Why the replica is in its status, for people.
    type: list
    elements: str
  assignment:
    description:
      - Record exactly these shards, each C({rank, node, gpus}); an empty list removes all shards.
      - The C(shards) returned by the C(llmgw.fleet.placement) lookup can be passed as is.
      - Mutually exclusive with O(place) and O(repair).
    type: list
    elements: dict
  place:
    description:
      - When the replica holds no shards, compute its placement with the solver and record it, in one
        transaction. A refusal records the replica as C(failed) with the reason and fails the task.
    type: bool
    default: false
  repair:
    description:
      - When the replica lost shards (a node lost), repair or move it, or fail it with the reason.
      - Survivors that must be stopped are removed from the registry and returned in RV(reaped_shards).
    type: bool
    default: false
  shard_status:
    description: Set the state of individual shards, each C({rank, status, reasons}).
    type: list
    elements: dict
  every_shard_status:
    description: Set the state of every shard of the replica (before O(shard_status), which may then differ).
    type: str
    choices: [pending, starting, active, failed]
seealso:
  - module: llmgw.fleet.fleet_node
  - module: llmgw.fleet.fleet_info
  - plugin: llmgw.fleet.placement
    plugin_type: lookup
"""

EXAMPLES = r"""
- name: Record a two-node replica and place it, in one transaction
  llmgw.fleet.fleet_replica:
    name: coder-a
    model: qwen2.5-coder-7b
    engine: sim
    shard_count: 2
    gpus_per_shard: 4
    port: 8080
    place: true
  delegate_to: localhost
  register: coder_a

- name: Record a placement computed by the lookup
  llmgw.fleet.fleet_replica:
    name: coder-b
    model: qwen2.5-coder-7b
    engine: sim
    shard_count: 2
    gpus_per_shard: 4
    assignment: >-
      {{ lookup('llmgw.fleet.placement', {'name': 'coder-b', 'shard_count': 2, 'gpus_per_shard': 4}).shards }}
  delegate_to: localhost

- name: Mark it ready once every shard answers
  llmgw.fleet.fleet_replica:
    name: coder-a
    status: ready
    shard_status:
      - {rank: 0, status: active}
      - {rank: 1, status: active}
  delegate_to: localhost

- name: After a node loss, repair (or move, or fail) the replica
  llmgw.fleet.fleet_replica:
    name: coder-a
    repair: true
  delegate_to: localhost
  register: repaired

- name: Remove a replica; its shards come back in reaped_shards to be stopped
  llmgw.fleet.fleet_replica:
    name: coder-b
    state: absent
  delegate_to: localhost
"""

RETURN = r"""
replica:
  description: The replica as recorded after the task, with its shards (empty when removed).
  returned: always
  type: dict
  sample:
    name: coder-a
    model: qwen2.5-coder-7b
    engine: sim
    shard_count: 2
    gpus_per_shard: 4
    state: placing
    reasons: ["placed on ib-a"]
    leader: node01
    shards:
      - {rank: 0, node: node01, gpus: [0, 1, 2, 3], state: pending, reasons: [], address: 10.77.0.11, fabric: ib-a}
      - {rank: 1, node: node02, gpus: [0, 1, 2, 3], state: pending, reasons: [], address: 10.77.0.12, fabric: ib-a}
decision:
  description: What the solver decided when O(place) or O(repair) ran (see the placement lookup's return).
  returned: when place or repair ran
  type: dict
  sample: {placed: true, action: move, fabric: ib-b, moved_shards: 2}
reaped_shards:
  description: Shards that no longer belong to the replica and must be stopped, with their node's address and unit.
  returned: always
  type: list
  elements: dict
  sample: [{rank: 0, node: node01, gpus: [0, 1, 2, 3], address: 10.77.0.11, unit: llmgw-shard-coder-a-0.service}]
db:
  description: The registry database used.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import _fleet_module, fleet_registry, fleet_service


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            model=dict(type="str"),
            engine=dict(type="str"),
            shard_count=dict(type="int", aliases=["shards"]),
            gpus_per_shard=dict(type="int"),
            fabric=dict(type="str"),
            gpu_type=dict(type="str"),
            avoid_nodes=dict(type="list", elements="str"),
            port=dict(type="int"),
            options=dict(type="dict"),
            status=dict(type="str", choices=list(fleet_registry.REPLICA_STATES)),
            reasons=dict(type="list", elements="str"),
            assignment=dict(type="list", elements="dict"),
            place=dict(type="bool", default=False),
            repair=dict(type="bool", default=False),
            shard_status=dict(type="list", elements="dict"),
            every_shard_status=dict(type="str", choices=list(fleet_registry.SHARD_STATES)),
            db=dict(type="path"),
        ),
        mutually_exclusive=[["assignment", "place"], ["assignment", "repair"], ["place", "repair"]],
        supports_check_mode=True,
    )
    params = module.params

    def work(registry):
        return fleet_service.change_replica(
            registry, params["name"], params["state"], options=params, assignment=params["assignment"],
            place_it=params["place"], repair_it=params["repair"], every_shard_status=params["every_shard_status"],
            shard_status=params["shard_status"])

    path, (before, after, decision, reaped) = _fleet_module.run(module, work)
    changed, diff = fleet_service.compare(before, after, fleet_registry.REPLICA_FIELDS)
    result = dict(changed=changed, replica=after or {}, reaped_shards=fleet_service.with_units(params["name"], reaped),
                  db=path, diff=diff)
    if decision is not None:
        result["decision"] = decision
        if not decision["placed"] and params["place"]:
            module.fail_json(msg=decision["reason"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
