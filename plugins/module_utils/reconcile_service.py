# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""fleet_reconcile's service: one pass over the registry with what the probes found, in one write transaction.

The verdicts are :mod:`reconcile`'s (pure); this applies them to the registry: nodes seen, recovered or lost,
replicas counted unhealthy, broken replicas failed and repaired through :func:`fleet_service.repair` (the one
route to the solver), and the shard units left on reached nodes that the registry no longer places there.
"""

from __future__ import annotations

import datetime
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils import (
    fleet_registry,
    fleet_service,
    reconcile,
    replica_plan,
)


def parse_probes(raw: Sequence[Mapping]) -> Dict[str, dict]:
    """The probes a play gathered, by node: ``{reachable, error, active_units, unit_files}``."""
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


def parse_health(raw: Sequence[Mapping]) -> Dict[str, dict]:
    """The leaders' /health answers, by replica: ``{ok, error}``."""
    health = {}
    for entry in raw:
        if not entry.get("replica"):
            raise fleet_registry.RegistryConflict("each health answer needs a replica: %r" % (entry,))
        health[entry["replica"]] = {"ok": bool(entry.get("ok")), "error": entry.get("error")}
    return health


def check_unhealthy_after(unhealthy_after: int) -> None:
    if unhealthy_after < 1:
        raise fleet_registry.RegistryConflict(
            "unhealthy_after must be at least 1 (got %d): the runs in a row a leader may fail /health"
            % unhealthy_after)


def _stoppable(name: str, shards: Sequence[Mapping]) -> List[dict]:
    return [{"rank": s["rank"], "node": s["node"], "address": s.get("address"),
             "unit": replica_plan.unit_name(name, s["rank"])} for s in shards]


def apply(registry: fleet_registry.FleetRegistry, probes: Mapping[str, dict], lost_after: int,
          now: datetime.datetime, health: Optional[Mapping[str, dict]] = None,
          unhealthy_after: int = reconcile.DEFAULT_UNHEALTHY_AFTER) -> Tuple[dict, List[dict], List[str],
                                                                             List[dict], bool]:
    """Returns (node verdicts, failed replicas with what was done, replicas to relaunch, stale units, changed)."""
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


def _stale(registry: fleet_registry.FleetRegistry, probes: Mapping[str, dict], failed: Sequence[Mapping]) -> List[dict]:
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
