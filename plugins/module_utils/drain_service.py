# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Draining a node: what ``fleet_drain`` (and so ``playbooks/drain_node.yml``) decides, between the registry and the
solver, as :mod:`fleet_service` does for placement.

* :func:`plan_drain` (pure): which replicas move and where. Only the replicas with a shard on the node move, each as
  a whole group on one fabric. ``live`` moves are make-before-break: the new shards are placed while the old ones
  still hold their GPUs, on nodes the replica does not use now (so the old and new units never share a node), and
  the old ones stop only once the new replica is Ready and routed. A replica that has no such room is ``refused``;
  with ``allow_downtime`` it is placed again as if its old shards were gone (a ``downtime`` move: stopped first,
  then placed and launched). Nothing is written when anything is refused. While the fleet runs two engine versions
  (``upgrade_engine`` mid-roll), a replica's new shards all go to nodes of one version
  (:func:`fleet_service.solve_on_one_engine`), ``prefer_engine`` first.
* :func:`drain` (I/O): the plan read and recorded in one registry write transaction: the node ``draining`` (no new
  shards), each moved replica's new shards recorded (state ``placing``); the old shards are returned to be stopped.
  A node that holds nothing is left as it is (``maintenance`` stays ``maintenance``).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_registry, fleet_service, placement, replica_plan

DRAINABLE_STATES = ("ready", "draining", "maintenance")
# The solver's name for a replica's successor while both exist; never recorded.
_SUCCESSOR = "%s (successor)"


@dataclasses.dataclass(frozen=True)
class DrainPlan:
    node: str
    moves: tuple  # each {replica, mode, fabric, to}
    refused: tuple  # each {replica, reason, fixes}

    def to_dict(self) -> dict:
        return {"node": self.node, "moves": [dict(m) for m in self.moves], "refused": [dict(r) for r in self.refused]}


def touching(fleet: placement.Fleet, node: str) -> List[placement.Replica]:
    """The replicas with a shard on ``node``: the only ones a drain moves."""
    return [r for r in fleet.replicas.values() if any(s.node == node for s in r.shards)]


def plan_drain(fleet: placement.Fleet, node: str, allow_downtime: bool = False,
               prefer_engine: Optional[str] = None) -> DrainPlan:
    """Where each replica on ``node`` goes (see the module docstring). ``fleet`` is the registry's, as is."""
    if node not in fleet.nodes:
        raise placement.InvalidRequest("node %s is not in the fleet" % node)
    nodes = [dataclasses.replace(n, state="draining") if n.name == node and n.state == "ready" else n
             for n in fleet.nodes.values()]
    draining = placement.Fleet(nodes, fleet.replicas.values())
    movers = touching(draining, node)
    successors = [dataclasses.replace(r.as_request(), name=_SUCCESSOR % r.name,
                                      avoid_nodes=r.avoid_nodes | {s.node for s in r.shards}) for r in movers]
    live = fleet_service.solve_on_one_engine(draining, successors, prefer_engine) if successors else []
    moves, stuck = [], []
    for replica, decision in zip(movers, live):
        if decision.placed:
            moves.append(_move(replica.name, "live", decision))
        else:
            stuck.append((replica, decision))
    refused = []
    if stuck and allow_downtime:
        # The live moves hold both their old and their new shards; the stuck replicas hold nothing.
        held = [r for r in draining.replicas.values() if r.name not in {s.name for s, _d in stuck}]
        held += [placement.Replica(name=_SUCCESSOR % m["replica"], shard_count=len(m["to"]),
                                   gpus_per_shard=draining.replicas[m["replica"]].gpus_per_shard,
                                   shards=tuple(placement.Shard(s["rank"], s["node"], tuple(s["gpus"]))
                                                for s in m["to"]))
                 for m in moves]
        again = fleet_service.solve_on_one_engine(placement.Fleet(nodes, held), [r.as_request() for r, _d in stuck],
                                                  prefer_engine)
        for (replica, _first), decision in zip(stuck, again):
            if decision.placed:
                moves.append(_move(replica.name, "downtime", decision))
            else:
                refused.append(_refused(replica.name, decision))
    else:
        refused = [_refused(replica.name, decision) for replica, decision in stuck]
    return DrainPlan(node, tuple(moves), tuple(refused))


def _move(name: str, mode: str, decision: placement.Placement) -> dict:
    return {"replica": name, "mode": mode, "fabric": decision.fabric, "to": [s.to_dict() for s in decision.shards]}


def _refused(name: str, decision: placement.Refusal) -> dict:
    reason = decision.reason.replace(_SUCCESSOR % name, name)
    return {"replica": name, "reason": reason, "fixes": [dict(f) for f in decision.fixes]}


def drain(registry: fleet_registry.FleetRegistry, node: str, allow_downtime: bool = False,
          reason: Optional[str] = None, prefer_engine: Optional[str] = None) -> dict:
    """Plan the drain of ``node`` and, unless anything is refused, record it in one write transaction.

    Returns ``{node, state_before, state, moves, refused, changed}``; each move carries ``from``: the old shards
    (rank, node, address, unit, port) the caller stops, downtime moves before their launch, live ones after.
    """
    with registry.transaction():
        record = registry.get_node(node)
        if record is None:
            raise fleet_registry.RegistryNotFound("no node %s in the registry" % node)
        if record["state"] not in DRAINABLE_STATES:
            raise fleet_registry.RegistryConflict(
                "node %s is %s: only a ready node is drained (a lost node's replicas are repaired by reconcile, "
                "a pending one holds nothing)" % (node, record["state"]))
        rows = {r["name"]: r for r in registry.list_replicas()}
        plan = plan_drain(fleet_service.to_fleet(registry.list_nodes(), rows.values()), node, allow_downtime,
                          prefer_engine)
        out = dict(plan.to_dict(), state_before=record["state"], state=record["state"], changed=False)
        for move in out["moves"]:
            before = rows[move["replica"]]
            move["from"] = [dict(_old(before, s), port=before["port"]) for s in before["shards"]]
        if plan.refused:
            return out
        if record["state"] == "ready" or (record["state"] == "maintenance" and plan.moves):
            registry.put_node(node, state="draining", reasons=[reason or "draining: its replicas move elsewhere"])
            out.update(state="draining", changed=True)
        for move in out["moves"]:
            # Emptied first: a downtime move's shard placed as before would otherwise keep its "active" state.
            registry.set_shards(move["replica"], [])
            registry.set_shards(move["replica"], move["to"])
            registry.put_replica(move["replica"], state="placing", reasons=[
                "moving off %s (%s) to %s" % (node, "make-before-break" if move["mode"] == "live" else "downtime",
                                              move["fabric"])])
            out["changed"] = True
        return out


def _old(replica: Mapping, shard: Mapping) -> Dict[str, object]:
    return {"rank": shard["rank"], "node": shard["node"], "address": shard.get("address"),
            "unit": replica_plan.unit_name(replica["name"], shard["rank"])}


def leaders(moves: Sequence[Mapping]) -> List[dict]:
    """The old leader of each live move: where the requests in flight are waited out before its shards stop (a
    downtime move is drained at the gateway instead, before it stops)."""
    return [dict(s, replica=m["replica"]) for m in moves if m["mode"] == "live" for s in m["from"] if s["rank"] == 0]
