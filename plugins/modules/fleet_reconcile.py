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
    fleet_registry,
    fleet_service,
    placement,
    reconcile,
    replica_plan,
)


def _probes(raw):
    probes = {}
    for entry in raw:
        if not entry.get("node"):
            raise fleet_registry.RegistryConflict("each probe needs a node: %r" % (entry,))
        found = {}
        for key in ("active_units", "unit_files"):
            units = entry.get(key) or []
            found[key] = reconcile.parse_active_units(units) if isinstance(units, str) else list(units)
        probes[entry["node"]] = dict(found, reachable=bool(entry.get("reachable")), error=entry.get("error"))
    return probes


def _stoppable(name, shards):
    return [{"rank": s["rank"], "node": s["node"], "address": s.get("address"),
             "unit": replica_plan.unit_name(name, s["rank"])} for s in shards]


def _health(raw):
    health = {}
    for entry in raw:
        if not entry.get("replica"):
            raise fleet_registry.RegistryConflict("each health answer needs a replica: %r" % (entry,))
        health[entry["replica"]] = {"ok": bool(entry.get("ok")), "error": entry.get("error")}
    return health


def _apply(registry, probes, lost_after, now, health=None, unhealthy_after=reconcile.DEFAULT_UNHEALTHY_AFTER):
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    changed = False
    with registry.transaction():
        nodes = {n["name"]: n for n in registry.list_nodes()}
        registered = registry.registered_at()
        verdicts = reconcile.node_verdicts([dict(n, registered_at=registered.get(name)) for name, n in nodes.items()],
                                           probes, now, lost_after)
        for name, verdict in sorted(verdicts.items()):
            if verdict["verdict"] == "seen":
                registry.put_node(name, last_seen=stamp)
            elif verdict["verdict"] == "recovered":
                registry.put_node(name, state=reconcile.state_after_recovery(nodes[name]), last_seen=stamp)
                changed = True
            elif verdict.get("reason") == reconcile.HOST_KEY_CHANGED:
                if reconcile.HOST_KEY_CHANGED not in nodes[name]["reasons"]:
                    registry.put_node(name, reasons=nodes[name]["reasons"][:1] + [reconcile.HOST_KEY_CHANGED])
                    changed = True
            elif verdict["verdict"] == "lost":
                registry.put_node(name, state="lost", reasons=reconcile.lost_reasons(nodes[name], verdict["reason"]))
                changed = True
        states = {n["name"]: n["state"] for n in registry.list_nodes()}
        counted = reconcile.health_verdicts(registry.list_replicas(), health or {}, unhealthy_after)
        for name, verdict in sorted(counted.items()):
            registry.put_replica(name, reasons=verdict["reasons"])
            changed = True
        unhealthy = [name for name, verdict in counted.items() if verdict["relaunch"]]
        failed, relaunch = [], []
        for found in reconcile.replica_verdicts(registry.list_replicas(), states, probes, unhealthy):
            name = found["name"]
            before = registry.get_replica(name)
            registry.put_replica(name, state="failed", reasons=[found["reason"]])
            changed = True
            entry = dict(found)
            if found["kind"] == "lost":
                decision = fleet_service.repair(registry, name)[0]
                after = registry.get_replica(name)
                entry.update(action=decision["action"], placed=decision["placed"],
                             fabric=decision.get("fabric"), reason_after=decision.get("reason"),
                             reaped_shards=[s for s in _stoppable(name, decision["reaped_shards"])
                                            if states.get(s["node"]) != "lost"])
            else:
                after = before
                entry.update(action="relaunch", placed=True, fabric=before["shards"][0]["fabric"],
                             reaped_shards=_stoppable(name, [s for s in before["shards"]
                                                             if s["rank"] in found["running"]]))
            entry["shards"] = [{k: s[k] for k in ("rank", "node", "gpus", "address")} for s in after["shards"]]
            if entry["placed"]:
                relaunch.append(name)
            failed.append(entry)
        stale = _stale(registry, probes, failed)
    return verdicts, failed, relaunch, stale, changed


def _stale(registry, probes, failed):
    """Shard units on reached nodes that the registry no longer places there, less those reaped already."""
    reaped = {(s["node"], s["unit"]) for entry in failed for s in entry.get("reaped_shards", [])}
    replicas = registry.list_replicas()
    stale = []
    for node in registry.list_nodes():
        probe = probes.get(node["name"])
        if not probe or not probe["reachable"]:
            continue
        units = [u for u in reconcile.stale_units(node["name"], probe["active_units"] + probe["unit_files"], replicas)
                 if (node["name"], u) not in reaped]
        if units:
            stale.append({"node": node["name"], "address": node["address"], "units": units})
    return stale


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
        registry = fleet_registry.open_for_module(params["db"], module.check_mode)
    except fleet_registry.RegistryError as exc:
        module.fail_json(msg=str(exc))
    try:
        if params["unhealthy_after"] < 1:
            raise fleet_registry.RegistryConflict(
                "unhealthy_after must be at least 1 (got %d): the runs in a row a leader may fail /health"
                % params["unhealthy_after"])
        verdicts, failed, relaunch, stale, changed = _apply(registry, _probes(params["probes"]),
                                                            params["node_lost_after"], now,
                                                            _health(params["health"]), params["unhealthy_after"])
    except (fleet_registry.RegistryError, placement.PlacementError) as exc:
        module.fail_json(msg=str(exc), db=registry.path)
    finally:
        registry.close()
    module.exit_json(changed=changed, nodes=verdicts, failed_replicas=failed, relaunch=relaunch, db=registry.path,
                     lost_nodes=sorted(n for n, v in verdicts.items() if v["verdict"] == "lost"),
                     recovered_nodes=sorted(n for n, v in verdicts.items() if v["verdict"] == "recovered"),
                     stale_units=stale)


if __name__ == "__main__":
    main()
