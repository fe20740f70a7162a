#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_reconcile
short_description: Record what a probe of the fleet found -- nodes seen or lost, replicas failed and replaced
version_added: 0.1.0
description:
  - Takes one probe per node (reached over ssh or not, and which shard units run there) and, in one registry
    transaction, records what follows from it.
  - A node reached is seen now. A node not reached whose last sighting is older than O(node_lost_after) seconds
    is C(lost). A node this module declared C(lost) that is reached again has recovered and is C(ready) again
    (C(draining) if it was draining; one set C(lost) by hand stays so); a lost node whose ssh host key changed
    stays lost, with that reason.
  - A shard unit on a reached node that no recorded shard places there (running or only a unit file; left by a
    replica that moved away while the node was lost or partitioned) is stale and comes back in RV(stale_units), to
    be stopped and removed before anything is launched.
  - A replica with a shard on a lost node is recorded C(failed), then repaired by the solver -- on its own fabric
    if that can still hold all of it, else moved whole to one fabric that can, never across two, else left
    failed with the reason. Its surviving shards that no longer belong to it come back in RV(failed_replicas) to be
    stopped.
  - A replica recorded C(ready) whose nodes were all reached but which runs fewer shards than its shard count
    is recorded C(failed) and returned to be relaunched whole on its placement, after every shard it still runs
    is stopped. It is never left C(ready) with a shard missing.
  - A replica recorded C(ready), every shard running, whose leader failed C(/health) (O(health)) in
    O(unhealthy_after) runs in a row -- a hung leader, its unit active and no answer -- is recorded C(failed) and
    relaunched whole the same way. The count is kept in the replica's reasons; an answer clears it.
  - Replicas being launched (C(placing), C(starting)) or already C(failed) are left alone unless a node of
    theirs is lost.
  - Run it on the controller; C(playbooks/reconcile.yml) probes the nodes, runs this, stops the reaped shards
    and launches the replacements.
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.registry
attributes:
  check_mode:
    support: full
    details: The verdicts are computed against an in-memory copy of the registry.
  diff_mode:
    support: none
    details: Returns no diff; what it records is in RV(nodes) and RV(failed_replicas).
author:
  - llmgw.fleet developers (@llmgw)
options:
  probes:
    description:
      - One per node probed, C({node, reachable, active_units, unit_files, error}); C(active_units) is a list of
        unit names or the text of C(systemctl list-units --plain --no-legend), C(unit_files) (optional) the same
        for C(systemctl list-unit-files --no-legend). Nodes without a probe are not judged.
    type: list
    elements: dict
    required: true
  node_lost_after:
    description: Seconds a node may go unseen before it is lost.
    type: int
    default: 60
  health:
    description:
      - What each ready replica's leader answered on C(/health) this run, C({replica, ok, error}). Replicas not
        listed are not judged on their health.
    type: list
    elements: dict
    default: []
  unhealthy_after:
    description: Runs in a row a leader may fail C(/health) before its replica is relaunched.
    type: int
    default: 3
  now:
    description: The time of the probe (ISO 8601); defaults to the current time.
    type: str
notes:
  - C(changed) reports node state changes and failed replicas, not the C(last_seen) times it refreshes.
seealso:
  - module: llmgw.fleet.fleet_replica
  - module: llmgw.fleet.fleet_node
"""

EXAMPLES = r"""
- name: Record what the probes found
  llmgw.fleet.fleet_reconcile:
    probes:
      - {node: node01, reachable: true, active_units: [llmgw-shard-coder-a-0.service]}
      - {node: node02, reachable: false, error: "No route to host"}
    node_lost_after: 60
  delegate_to: localhost
  register: reconciled
"""

RETURN = r"""
nodes:
  description: Per probed node, C({verdict, reason, unseen_for}); the verdict is C(seen), C(recovered), C(unseen)
    or C(lost).
  returned: always
  type: dict
  sample: {node01: {verdict: seen}, node02: {verdict: lost, reason: "unseen for 12 s (more than 10 s; ...)"}}
lost_nodes:
  description: Nodes this pass declared lost.
  returned: always
  type: list
  elements: str
failed_replicas:
  description:
    - Replicas this pass failed, C({name, kind, reason, action, placed, fabric, shards, reaped_shards}); C(kind)
      is C(lost) (a node lost), C(short) (fewer shards running than it has) or C(unhealthy) (its leader failed
      C(/health) O(unhealthy_after) runs in a row); C(action) is the solver's
      (C(repair), C(move), C(fail)) or C(relaunch); C(reaped_shards) (C({rank, node, address, unit})) must be
      stopped.
  returned: always
  type: list
  elements: dict
recovered_nodes:
  description: Lost nodes this pass reached again and recorded C(ready).
  returned: always
  type: list
  elements: str
stale_units:
  description: Per reached node with stale shard units, C({node, address, units}); stop them and remove their
    unit files before launching anything.
  returned: always
  type: list
  elements: dict
  sample: [{node: node02, address: 10.77.0.102, units: [llmgw-shard-coder-a-1.service]}]
relaunch:
  description: Replicas to launch now (placed again, or relaunched whole).
  returned: always
  type: list
  elements: str
"""

import datetime

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import (
    _fleet_module,
    fleet_registry,
    reconcile,
    reconcile_service,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            probes=dict(type="list", elements="dict", required=True),
            node_lost_after=dict(type="int", default=reconcile.DEFAULT_LOST_AFTER),
            health=dict(type="list", elements="dict", default=[]),
            unhealthy_after=dict(type="int", default=reconcile.DEFAULT_UNHEALTHY_AFTER),
            now=dict(type="str"),
            db=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        now = (reconcile.parse_time(fleet_registry.normalize_timestamp(params["now"])) if params["now"]
               else datetime.datetime.now(datetime.timezone.utc))
    except fleet_registry.RegistryError as exc:
        module.fail_json(msg=str(exc))

    def work(registry):
        reconcile_service.check_unhealthy_after(params["unhealthy_after"])
        return reconcile_service.apply(registry, reconcile_service.parse_probes(params["probes"]),
                                       params["node_lost_after"], now,
                                       reconcile_service.parse_health(params["health"]), params["unhealthy_after"])

    path, (verdicts, failed, relaunch, stale, changed) = _fleet_module.run(module, work)
    module.exit_json(changed=changed, nodes=verdicts, failed_replicas=failed, relaunch=relaunch, db=path,
                     lost_nodes=sorted(n for n, v in verdicts.items() if v["verdict"] == "lost"),
                     recovered_nodes=sorted(n for n, v in verdicts.items() if v["verdict"] == "recovered"),
                     stale_units=stale)


if __name__ == "__main__":
    main()
