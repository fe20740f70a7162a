#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_info
short_description: Read the fleet registry, including the fleet status table
version_added: 0.1.0
description:
  - Returns the nodes, replicas (with their shards) and per-fabric totals recorded in the fleet registry, and
    RV(status_lines), the C(fleet status) view for people (nodes by fabric with free GPUs, replicas with
    shards and state).
  - Reads one consistent snapshot and changes nothing recorded (a registry that does not exist yet reads as an
    empty fleet and is not created; one written by an older version of the collection is migrated on open, as
    by any other use).
  - Run it on the controller (set C(delegate_to) to C(localhost), or use a play on C(localhost)).
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.attributes.INFO_MODULE
  - llmgw.fleet.registry
author:
  - llmgw.fleet developers (@llmgw)
options:
  nodes:
    description: Only these nodes (all when omitted).
    type: list
    elements: str
  replicas:
    description: Only these replicas (all when omitted).
    type: list
    elements: str
  fabric:
    description: Only nodes on this fabric, and replicas with a shard on it.
    type: str
  events:
    description: Also return this many of the most recent registry events (state changes, placements).
    type: int
    default: 0
seealso:
  - module: llmgw.fleet.fleet_node
  - module: llmgw.fleet.fleet_replica
  - plugin: llmgw.fleet.fleet
    plugin_type: inventory
"""

EXAMPLES = r"""
- name: Read the fleet
  llmgw.fleet.fleet_info:
  delegate_to: localhost
  register: fleet

- name: Show the fleet status table
  ansible.builtin.debug:
    msg: "{{ fleet.status_lines }}"

- name: Read only fabric ib-a, with the last 20 events
  llmgw.fleet.fleet_info:
    fabric: ib-a
    events: 20
  delegate_to: localhost
  register: ib_a

- name: Names of the replicas on ib-a that are not ready
  ansible.builtin.debug:
    msg: "{{ ib_a.replicas | rejectattr('state', 'eq', 'ready') | map(attribute='name') }}"
"""

RETURN = r"""
exists:
  description: Whether the registry database exists.
  returned: always
  type: bool
db:
  description: The registry database read.
  returned: always
  type: str
schema_version:
  description: Schema version of the registry (0 when it does not exist).
  returned: always
  type: int
nodes:
  description: Nodes, by fabric then name, each with C(free_gpus) and the shards it holds.
  returned: always
  type: list
  elements: dict
replicas:
  description: Replicas by name, each with C(shards) (rank, node, gpus, state, address, fabric) and C(leader).
  returned: always
  type: list
  elements: dict
fabrics:
  description: Per fabric, C(nodes), C(ready_nodes), C(gpus) and C(free_gpus) on ready nodes, C(largest_free).
  returned: always
  type: dict
status_lines:
  description: The C(fleet status) table, one string per line.
  returned: always
  type: list
  elements: str
  sample:
    - "NODES"
    - "fabric ib-a: 2 nodes, 2 ready, 8 of 16 GPUs free on ready nodes"
events:
  description: The most recent registry events, oldest first, when O(events) is above 0.
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import _placement_report as report
from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_registry


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nodes=dict(type="list", elements="str"),
            replicas=dict(type="list", elements="str"),
            fabric=dict(type="str"),
            events=dict(type="int", default=0),
            db=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    path = fleet_registry.resolve_path(params["db"])
    if not os.path.exists(path):
        module.exit_json(changed=False, exists=False, db=path, schema_version=0, nodes=[], replicas=[], fabrics={},
                         status_lines=report.status_lines([], []), events=[])
    try:
        with fleet_registry.FleetRegistry(path, create=False) as registry:
            snapshot = registry.snapshot()
            events = registry.events(limit=params["events"]) if params["events"] > 0 else []
    except fleet_registry.RegistryError as exc:
        module.fail_json(msg=str(exc), db=path)
    nodes, replicas = snapshot["nodes"], snapshot["replicas"]
    if params["nodes"] is not None:
        nodes = [n for n in nodes if n["name"] in params["nodes"]]
    if params["fabric"] is not None:
        nodes = [n for n in nodes if n["fabric"] == params["fabric"]]
        replicas = [r for r in replicas if any(s["fabric"] == params["fabric"] for s in r["shards"])]
    if params["replicas"] is not None:
        replicas = [r for r in replicas if r["name"] in params["replicas"]]
    fabrics = {f: v for f, v in snapshot["fabrics"].items() if params["fabric"] in (None, f)}
    module.exit_json(changed=False, exists=True, db=path, schema_version=snapshot["schema_version"], nodes=nodes,
                     replicas=replicas, fabrics=fabrics, status_lines=report.status_lines(nodes, replicas),
                     events=events)


if __name__ == "__main__":
    main()
