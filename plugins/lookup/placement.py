# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: placement
short_description: Where the shards of a replica go (fabric, nodes, GPUs), from the fleet registry
version_added: 0.1.0
description:
  - Computes the placement of one or more replicas with the collection's solver (C(docs/placement.md)) against
    the fleet registry, or against a fleet passed in O(fleet). Changes nothing; record the answer with
    M(llmgw.fleet.fleet_replica).
  - Each term is a replica request C({name, shard_count, gpus_per_shard}) with optional C(engine), C(model),
    C(fabric) (only that fabric), C(avoid_nodes) and C(gpu_type).
  - C(shards) is an alias of C(shard_count), kept for requests written before; a request that gives both with
    different values is refused.
  - A replica the fleet already holds whole is returned where it is (action C(keep)), so a second run of a
    playbook asks for nothing new; one that lost a node is repaired, moved or failed (action C(repair),
    C(move), C(fail)); anything else is placed (action C(place)).
  - Several terms are solved as one batch (exact for small fleets), not one after the other.
  - While the ready nodes run more than one engine version (C(upgrade_engine) rolling through the fleet, or a
    node's C(engine_version) in O(fleet)), a replica's shards all go to nodes of one version. The batch is then
    solved on the nodes of one version after another (the version with the most ready nodes first), so it is
    exact within each version, not across them.
  - Invariants the answer never breaks, whatever the input -- all shards of a replica on one fabric, shards only
    on ready nodes, no GPU given twice, exactly the shard count asked for or nothing.
author:
  - llmgw.fleet developers (@llmgw)
options:
  _terms:
    description: Replica requests (dicts).
    required: true
    type: list
    elements: dict
  db:
    description: Path of the registry database, read when O(fleet) is not given.
    type: path
    env:
      - name: LLMGW_FLEET_DB
  fleet:
    description:
      - A fleet to place on instead of the registry, C({nodes, replicas}) or a list of nodes.
      - Nodes are C({name, fabric, gpu_count, state, gpu_type, free_gpus}), so the output of
        M(llmgw.fleet.fleet_info) can be passed as is; C(state) defaults to C(ready). C(gpus) is an alias of
        C(gpu_count), kept for fleets written before; a node that gives both with different values is refused.
      - Replicas are C({name, shard_count, gpus_per_shard, shards}) with C(shards) a list of
        C({rank, node, gpus}).
    type: raw
  on_refusal:
    description:
      - C(fail) raises an error with the refusal's reason (each fabric's free capacity against what the replica
        needs); C(return) returns the refusal (C(placed=false)) instead.
    type: str
    choices: [fail, return]
    default: fail
  strategy:
    description:
      - C(auto) is exact (branch and bound) when no fabric has more than 64 ready nodes, else the heuristic.
    type: str
    choices: [auto, exact, heuristic, greedy]
    default: auto
"""

EXAMPLES = r"""
- name: Where would a two-node replica with four GPUs per shard go? (reads the registry)
  ansible.builtin.debug:
    msg: "{{ lookup('llmgw.fleet.placement', {'name': 'coder-a', 'shard_count': 2, 'gpus_per_shard': 4}) }}"

- name: The same against a registry at another path, only on fabric ib-b, never on node04
  ansible.builtin.set_fact:
    coder_b: >-
      {{ lookup('llmgw.fleet.placement',
                {'name': 'coder-b', 'shard_count': 2, 'gpus_per_shard': 4, 'fabric': 'ib-b', 'avoid_nodes': ['node04']},
                db='/srv/llmgw/fleet.db') }}

- name: Against a fleet passed in (no registry needed); a refusal comes back instead of failing
  ansible.builtin.set_fact:
    answer: >-
      {{ lookup('llmgw.fleet.placement', {'name': 'r1', 'shard_count': 2, 'gpus_per_shard': 8},
                fleet={'nodes': [{'name': 'node01', 'fabric': 'ib-a', 'gpu_count': 8},
                                 {'name': 'node02', 'fabric': 'ib-a', 'gpu_count': 8, 'free_gpus': 4},
                                 {'name': 'node03', 'fabric': 'ib-b', 'gpu_count': 8, 'state': 'lost'}]},
                on_refusal='return') }}

- name: Record the placement the lookup computed
  llmgw.fleet.fleet_replica:
    name: coder-a
    model: qwen2.5-coder-7b
    engine: sim
    shards: 2
    gpus_per_shard: 4
    assignment: >-
      {{ lookup('llmgw.fleet.placement', {'name': 'coder-a', 'shard_count': 2, 'gpus_per_shard': 4}).shards }}
  delegate_to: localhost

- name: Two replicas solved as one batch
  ansible.builtin.debug:
    msg: "{{ query('llmgw.fleet.placement', {'name': 'a', 'shard_count': 2, 'gpus_per_shard': 4},
                                             {'name': 'b', 'shard_count': 1, 'gpus_per_shard': 8}) }}"
"""

RETURN = r"""
_raw:
  description: One decision per term.
  type: list
  elements: dict
  contains:
    placed:
      description: Whether the replica has (or keeps) all its shards.
      type: bool
    replica:
      description: Replica name.
      type: str
    action:
      description: C(place), C(keep), C(repair), C(move); or C(refuse), C(fail) when not placed.
      type: str
    fabric:
      description: The fabric all shards are on.
      type: str
    shards:
      description: Every shard, rank 0 (the leader) first, C({rank, node, gpus, address}).
      type: list
      elements: dict
    new_shards:
      description: Shards that must be started.
      type: list
      elements: dict
    reaped_shards:
      description: Surviving shards of a replica that moves or fails; they must be stopped.
      type: list
      elements: dict
    leader:
      description: Node of rank 0.
      type: str
    reason:
      description: Why the replica was refused, naming each fabric's free capacity against what it needs.
      type: str
    capacity:
      description: Per fabric, the figures behind the reason.
      type: dict
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_registry, fleet_service, placement


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        try:
            fleet, addresses = self._fleet()
            requests = [placement.request_from_dict(term) for term in terms]
            strategy = self.get_option("strategy")
            decisions = fleet_service.solve_on_one_engine(fleet, requests,
                                                          strategy=None if strategy == "auto" else strategy)
        except (placement.PlacementError, fleet_registry.RegistryError) as exc:
            raise AnsibleLookupError("llmgw.fleet.placement: %s" % exc)
        results = []
        for decision in decisions:
            if not decision.placed and self.get_option("on_refusal") == "fail":
                raise AnsibleLookupError("llmgw.fleet.placement: %s" % decision.reason)
            out = decision.to_dict()
            for key in ("shards", "new_shards", "kept_shards", "reaped_shards"):
                for shard in out.get(key, []):
                    shard["address"] = addresses.get(shard["node"])
            results.append(out)
        return results

    def _fleet(self):
        data = self.get_option("fleet")
        if data is not None:
            nodes = data.get("nodes", []) if isinstance(data, dict) else data
            addresses = {n.get("name"): n.get("address") for n in nodes if isinstance(n, dict)}
            return placement.fleet_from_data(data), addresses
        path = fleet_registry.resolve_path(self.get_option("db"))
        if not os.path.exists(path):
            raise AnsibleLookupError("llmgw.fleet.placement: no fleet registry at %s; register nodes with "
                                     "llmgw.fleet.fleet_node or pass fleet=" % path)
        with fleet_registry.FleetRegistry(path, create=False) as registry, registry.snapshot_read():
            addresses = {n["name"]: n["address"] for n in registry.list_nodes()}
            return fleet_service.load_fleet(registry), addresses
