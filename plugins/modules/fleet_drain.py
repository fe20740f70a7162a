#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_drain
short_description: Decide and record where the replicas of a node being drained go
version_added: 0.2.0
description:
  - Marks a node C(draining) in the fleet registry (it gets no new shards) and decides, with the placement solver,
    where each replica with a shard on it goes. Only those replicas move, each as a whole group on one fabric.
  - A C(live) move is make-before-break. The new shards are placed while the old ones still hold their GPUs, on
    nodes the replica does not use now. The caller launches the new replica, routes to it, and then stops the
    old shards listed in C(from).
  - A replica the fleet has no such room for is refused, and then nothing is written. With O(allow_downtime), it is
    placed again as if its old shards were gone instead (a C(downtime) move). The caller stops it first, then
    launches it.
  - Each moved replica's new shards are recorded (state C(placing)) in the same transaction as the node's state.
  - A node that holds no shard is left as it is (C(maintenance) stays C(maintenance)), so a second run changes
    nothing. C(playbooks/drain_node.yml) drives the whole procedure and ends with the node in C(maintenance).
  - Runs on the controller, where the registry is.
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.registry
attributes:
  check_mode:
    support: full
    details: The decision runs against an in-memory copy of the registry, so check mode predicts every move.
  diff_mode:
    support: full
    details: The node's state and each moved replica's shards, before and after.
author:
  - llmgw.fleet developers (@llmgw)
options:
  node:
    description: The node to drain, as recorded in the registry. It must be C(ready), C(draining) or C(maintenance).
    type: str
    required: true
  allow_downtime:
    description:
      - Move the replicas that have no room for a make-before-break move by stopping them first and placing them
        again. Their requests fail in between.
      - Without it, such a replica refuses the whole drain, before anything is written.
    type: bool
    default: false
  reason:
    description: Recorded as the node's reason while it drains (for example C(kernel update)).
    type: str
  prefer_engine_version:
    description:
      - While the fleet's nodes run more than one engine version (an engine upgrade rolling through it), a moved
        replica's shards always go to nodes of one version. This version is tried first (C(upgrade_engine) passes
        the one it installs, so that a replica moves once). Otherwise the version with the most ready nodes is.
    type: str
seealso:
  - module: llmgw.fleet.fleet_node
  - module: llmgw.fleet.fleet_replica
"""

EXAMPLES = r"""
- name: Drain node03, moving its replicas make-before-break
  llmgw.fleet.fleet_drain:
    node: node03
    reason: kernel update
  delegate_to: localhost
  register: drain

- name: Drain node03 even where a replica must stop before it moves
  llmgw.fleet.fleet_drain:
    node: node03
    allow_downtime: true
    db: /srv/llmgw/fleet.db
  delegate_to: localhost
"""

RETURN = r"""
moves:
  description:
    - One per replica that moves. C(mode) is C(live) (make-before-break) or C(downtime). C(to) holds the new shards,
      C({rank, node, gpus}). C(from) holds the old ones to stop, C({rank, node, address, unit, port}).
  returned: always
  type: list
  elements: dict
  sample:
    - replica: coder-a
      mode: live
      fabric: ib-a
      to: [{rank: 0, node: node05, gpus: [0]}]
      from: [{rank: 0, node: node03, address: 10.77.0.13, unit: llmgw-shard-coder-a-0.service, port: 8080}]
old_leaders:
  description: The old leader of each C(live) move, C({replica, rank, node, address, unit, port}), where requests in
    flight are waited out before the old shards stop.
  returned: always
  type: list
  elements: dict
refused:
  description: The replicas that could not move, each C({replica, reason, fixes}) in the solver's words.
  returned: always
  type: list
  elements: dict
state:
  description: The node's state after the task.
  returned: always
  type: str
  sample: draining
state_before:
  description: The node's state before the task.
  returned: always
  type: str
  sample: ready
db:
  description: The registry database used.
  returned: always
  type: str
  sample: /root/.local/share/llmgw/fleet.db
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import _fleet_module, drain_service


def main():
    module = AnsibleModule(
        argument_spec=dict(
            node=dict(type="str", required=True),
            allow_downtime=dict(type="bool", default=False),
            reason=dict(type="str"),
            prefer_engine_version=dict(type="str"),
            db=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    path, out = _fleet_module.run(module, lambda registry: drain_service.drain(
        registry, params["node"], params["allow_downtime"], params["reason"], params["prefer_engine_version"]),
        create=False)
    diff = {"before": {"state": out["state_before"], "moves": {m["replica"]: m["from"] for m in out["moves"]}},
            "after": {"state": out["state"], "moves": {m["replica"]: m["to"] for m in out["moves"]}}}
    if out["refused"]:
        module.fail_json(
            msg="cannot drain %s: %s; nothing was changed. Make room (add a node, or remove a replica), or run with "
                "allow_downtime=true to stop these replicas before they move"
                % (params["node"], "; ".join("%s: %s" % (r["replica"], r["reason"]) for r in out["refused"])),
            refused=out["refused"], moves=out["moves"], db=path)
    module.exit_json(changed=out["changed"], moves=out["moves"], refused=[], state=out["state"],
                     state_before=out["state_before"], old_leaders=drain_service.leaders(out["moves"]),
                     db=path, diff=diff)


if __name__ == "__main__":
    main()
