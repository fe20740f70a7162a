#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_replica_plan
short_description: The systemd units a placed replica runs, one per shard, from the fleet registry
version_added: 0.1.0
description:
  - Reads a placed replica from the fleet registry and returns what each of its shards runs -- the unit name, its
    environment (replica, rank, shard count, leader address, port), the engine's command line from the launcher
    and the unit file's text -- with the leader's health and completion URLs and the start order (workers
    first, the leader last).
  - Chooses the replica's port -- the recorded one unless another replica on one of its nodes holds it -- and
    records it; that is the only change it makes.
  - Run it on the controller (set C(delegate_to) to C(localhost), or use a play on C(localhost)).
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.registry
attributes:
  check_mode:
    support: full
    details: The port is chosen against an in-memory copy of the registry.
  diff_mode:
    support: none
    details: Returns no diff; the port it records is in RV(replica).
author:
  - llmgw.fleet developers (@llmgw)
options:
  name:
    description: Replica name.
    type: str
    required: true
  model_path:
    description:
      - Where the model file lies on the nodes that need it. Omitted, the model's name is passed to the engine
        (a hub id for vLLM or SGLang, a label for the simulated engine).
    type: str
  engine_dir:
    description: Directory of the llama.cpp binaries on the nodes.
    type: str
    default: /opt/llmgw/engines/llama.cpp/current
  sim_engine:
    description: Path of the simulated engine on the nodes.
    type: str
    default: /usr/local/bin/llmgw-sim-engine.py
  python:
    description: The python the simulated engine runs with on the nodes.
    type: str
    default: /usr/bin/python3
  base_port:
    description: The first port a replica without a free recorded port is given (ports go in pairs).
    type: int
    default: 8080
seealso:
  - module: llmgw.fleet.fleet_replica
"""

EXAMPLES = r"""
- name: The units of coder-a
  llmgw.fleet.fleet_replica_plan:
    name: coder-a
  delegate_to: localhost
  register: coder_a_plan

- name: A llama.cpp replica whose model was copied to /var/lib/llmgw/models/tiny/tiny.gguf
  llmgw.fleet.fleet_replica_plan:
    name: tiny-a
    model_path: /var/lib/llmgw/models/tiny/tiny.gguf
    db: /srv/llmgw/fleet.db
  delegate_to: localhost
"""

RETURN = r"""
plan:
  description: What runs where.
  returned: success
  type: dict
  contains:
    replica:
      description: Replica name.
      type: str
    engine:
      description: The engine (C(llama.cpp), C(vllm), C(sglang), C(sim)).
      type: str
    port:
      description: The leader's API port; the port after it is the workers' rendezvous or RPC port.
      type: int
    leader:
      description: C({node, address, unit, health_url, completion_url}).
      type: dict
    units:
      description:
        - One per shard, by rank, C({rank, node, address, gpus, unit, environment, argv, command, exec_start,
          serves_api, listens, needs_model, unit_text}).
      type: list
      elements: dict
    start_order:
      description: Ranks in the order they start (workers first, rank 0 last).
      type: list
      elements: int
  sample:
    replica: coder-a
    engine: sim
    port: 8080
    leader: {node: node01, address: 10.77.0.131, unit: llmgw-shard-coder-a-0.service,
             health_url: "http://10.77.0.131:8080/health", completion_url: "http://10.77.0.131:8080/v1/completions"}
    start_order: [1, 0]
replica:
  description: The replica as recorded (after the port was recorded).
  returned: success
  type: dict
db:
  description: The registry database used.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import _fleet_module, fleet_registry, replica_plan


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            model_path=dict(type="str"),
            engine_dir=dict(type="str", default="/opt/llmgw/engines/llama.cpp/current"),
            sim_engine=dict(type="str", default="/usr/local/bin/llmgw-sim-engine.py"),
            python=dict(type="str", default="/usr/bin/python3"),
            base_port=dict(type="int", default=8080),
            db=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params

    def work(registry):
        with registry.transaction():
            replica = registry.get_replica(params["name"])
            if replica is None:
                raise fleet_registry.RegistryNotFound("no replica %s in %s" % (params["name"], registry.path))
            port = replica_plan.choose_port(replica, registry.list_replicas(), params["base_port"])
            changed = port != replica["port"]
            if changed:
                replica = registry.put_replica(params["name"], port=port)[1]
            plan = replica_plan.plan_units(replica, model_path=params["model_path"], engine_dir=params["engine_dir"],
                                           sim_engine=params["sim_engine"], python=params["python"], port=port)
        return changed, plan, replica

    path, (changed, plan, replica) = _fleet_module.run(
        module, work, errors=(fleet_registry.RegistryError, replica_plan.ReplicaPlanError))
    module.exit_json(changed=changed, plan=plan, replica=replica, db=path)


if __name__ == "__main__":
    main()
