# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's service layer: what the fleet_* modules and the placement lookup decide, between the registry
(storage, :mod:`fleet_registry`) and the solver (:mod:`placement`).

* one converter from registry rows to solver types: :func:`to_fleet` (:func:`placement.fleet_from_data`, which
  reads the registry's shape); :func:`load_fleet` reads the registry's nodes and replicas in one snapshot for it;
* one route to the solver: :func:`solve` (``placement.decide`` with ``repairs``). The modules place and repair one
  replica at a time with :data:`MODULE_STRATEGY` (greedy best fit); the lookup passes its ``strategy`` option;
* :func:`solve_on_one_engine` and :func:`repair_on_one_engine`: new shards while the fleet runs two engine versions
  (an engine upgrade rolling through it), each replica's shards all on nodes of one version;
* :func:`place` and :func:`repair` read, solve and record the answer inside one registry write transaction;
* what the modules ask of the registry: :func:`change_node`, :func:`change_replica` (their options mapped onto
  registry fields) and :func:`comparable` (what ``changed`` and the diff compare).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_registry, placement, replica_plan

# Single placements and repairs (fleet_replica, fleet_reconcile): best-fit decreasing, one replica at a time.
MODULE_STRATEGY = "greedy"

# module option -> registry field
NODE_OPTIONS = {"status": "state", "reasons": "reasons", "address": "address", "vmid": "vmid",
                "proxmox_node": "proxmox_node", "fabric": "fabric", "gpu_count": "gpu_count", "gpu_type": "gpu_type",
                "cpu_variant": "cpu_variant", "engine_version": "engine_version", "engine_args": "engine_args",
                "speed": "speed", "cert_fingerprint": "cert_fingerprint", "last_seen": "last_seen"}
REPLICA_OPTIONS = {"model": "model", "engine": "engine", "shard_count": "shard_count",
                   "gpus_per_shard": "gpus_per_shard", "fabric": "fabric", "gpu_type": "gpu_type",
                   "avoid_nodes": "avoid_nodes", "port": "port", "options": "options", "status": "state",
                   "reasons": "reasons"}


# -- registry rows -> solver types, and the one route to the solver ------------------------------------------

def to_fleet(nodes: Sequence[Mapping], replicas: Sequence[Mapping]) -> placement.Fleet:
    """The one converter from registry rows (as ``list_nodes`` and ``list_replicas`` return them) to the solver's
    fleet: :func:`placement.fleet_from_data`, which reads the registry's shape."""
    return placement.fleet_from_data({"nodes": list(nodes), "replicas": list(replicas)})


def load_fleet(registry: fleet_registry.FleetRegistry) -> placement.Fleet:
    """The solver's fleet from one consistent read of the registry."""
    with registry.snapshot_read():
        return to_fleet(registry.list_nodes(), registry.list_replicas())


def solve(fleet: placement.Fleet, requests: Sequence[placement.Request] = (), repairs: Sequence[str] = (),
          strategy: Optional[str] = None) -> List[placement.Decision]:
    """Every decision the collection makes goes through here: one per request, then one per repair, in order
    (``strategy`` None is the solver's own choice: exact for small fleets)."""
    return placement.decide(fleet, requests, strategy=strategy, repairs=repairs)


def solve_on_one_engine(fleet: placement.Fleet, requests: Sequence[placement.Request], prefer: Optional[str] = None,
                        strategy: Optional[str] = None) -> List[placement.Decision]:
    """One decision per request, as :func:`solve`, but never a replica with shards on two engine versions.

    With one version among the ready nodes (the usual case) this is :func:`solve`. With more (each node's
    ``engine_version``, mid-way through an engine upgrade), the requests are solved on the ready nodes of one
    version at a time, ``prefer`` first, then the version with the most ready nodes: the nodes of the other
    versions are closed to new shards for that pass, and what a pass placed holds its GPUs in the next. A request
    for a replica the fleet holds is solved on its surviving shards' version only. A request no allowed version can
    hold gets the first pass's refusal, which says so.
    """
    versions = _ready_versions(fleet, prefer)
    if len(versions) <= 1:
        return solve(fleet, requests, strategy=strategy)
    allowed = [_survivors_version(fleet, r.name) or set(versions) for r in requests]
    decisions: List[Optional[placement.Decision]] = [None] * len(requests)
    held = dict(fleet.replicas)
    for version in versions:
        pending = [i for i in range(len(requests)) if not (decisions[i] and decisions[i].placed)
                   and version in allowed[i]]
        if not pending:
            continue
        answers = solve(placement.Fleet(_open_only(fleet, version), held.values()),
                        [requests[i] for i in pending], strategy=strategy)
        for i, decision in zip(pending, answers):
            if decision.placed:
                decisions[i] = decision
                held[requests[i].name] = placement.Replica(
                    name=requests[i].name, shard_count=requests[i].shard_count,
                    gpus_per_shard=requests[i].gpus_per_shard, shards=decision.shards)
            elif decisions[i] is None:
                decisions[i] = dataclasses.replace(decision, reason=_one_engine_words(decision.reason, allowed[i]))
    return decisions  # type: ignore[return-value]


def repair_on_one_engine(fleet: placement.Fleet, name: str, strategy: Optional[str] = None) -> placement.Decision:
    """The repair of ``name``, as :func:`solve`, but never onto nodes of two engine versions.

    With one version among the ready nodes this is :func:`solve`. With more, a replica with surviving shards is
    repaired on the nodes of its survivors' version only (in place, or moved whole within that version); one with
    none is placed on one version after another, the version with the most ready nodes first.
    """
    versions = _ready_versions(fleet)
    if len(versions) <= 1:
        return solve(fleet, repairs=[name], strategy=strategy)[0]
    allowed = _survivors_version(fleet, name) or set(versions)
    first = None
    for version in [v for v in versions if v in allowed] or sorted(allowed, key=lambda v: v or ""):
        decision = solve(placement.Fleet(_open_only(fleet, version), fleet.replicas.values()),
                         repairs=[name], strategy=strategy)[0]
        if decision.placed:
            return decision
        first = first or decision
    return dataclasses.replace(first, reason=_one_engine_words(first.reason, allowed))


def _ready_versions(fleet: placement.Fleet, prefer: Optional[str] = None) -> list:
    """The engine versions of the ready nodes: ``prefer`` first, then by how many ready nodes run each."""
    counts = collections.Counter(n.engine_version for n in fleet.nodes.values() if n.state == "ready")
    return sorted(counts, key=lambda v: (v != prefer, -counts[v], v or ""))


def _open_only(fleet: placement.Fleet, version: Optional[str]) -> List[placement.Node]:
    """The fleet's nodes with the ready ones of other engine versions closed to new shards (their shards stay)."""
    return [dataclasses.replace(n, state="draining") if n.state == "ready" and n.engine_version != version
            else n for n in fleet.nodes.values()]


def _survivors_version(fleet: placement.Fleet, name: str) -> Optional[set]:
    """{the engine version of the replica's live shards}, or None for a new replica or one with none alive."""
    replica = fleet.replicas.get(name)
    return {fleet.nodes[s.node].engine_version for s in (replica.shards if replica else ())
            if s.node in fleet.nodes and fleet.nodes[s.node].state in placement.LIVE_NODE_STATES} or None


def _one_engine_words(reason: str, allowed: set) -> str:
    where = ("its surviving shards' engine version (%s)" % (next(iter(allowed)) or "unknown") if len(allowed) == 1
             else "any one engine version (%s)" % ", ".join(sorted(v or "unknown" for v in allowed)))
    return "%s, on the nodes of %s: a replica's shards share one engine version" % (reason, where)


# -- place and repair, read -> solve -> record in one write transaction --------------------------------------

def place(registry: fleet_registry.FleetRegistry, name: str) -> Tuple[dict, dict, dict]:
    """Place a recorded replica that holds no shards. Returns (decision, before, after); a refusal records the
    replica as failed with the reason."""
    with registry.transaction():
        before = registry.get_replica(name)
        if before is None:
            raise fleet_registry.RegistryNotFound("no replica %s" % name)
        if before["shards"]:
            raise fleet_registry.RegistryConflict("replica %s already holds shards; repair it instead" % name)
        fleet = load_fleet(registry)
        request = fleet.replicas[name].as_request()
        others = placement.Fleet(fleet.nodes.values(), [r for r in fleet.replicas.values() if r.name != name])
        decision = solve_on_one_engine(others, [request], strategy=MODULE_STRATEGY)[0]
        _record(registry, before, decision)
        return decision.to_dict(), before, registry.get_replica(name)


def repair(registry: fleet_registry.FleetRegistry, name: str) -> Tuple[dict, dict, dict]:
    """Repair a replica after a node loss; reaped survivors are removed here and returned (with their node
    addresses) in ``decision['reaped_shards']``: the caller must stop them."""
    with registry.transaction():
        before = registry.get_replica(name)
        if before is None:
            raise fleet_registry.RegistryNotFound("no replica %s" % name)
        decision = repair_on_one_engine(load_fleet(registry), name, strategy=MODULE_STRATEGY)
        _record(registry, before, decision)
        out = decision.to_dict()
        addresses = {s["node"]: s["address"] for s in before["shards"]}
        for shard in out["reaped_shards"]:
            shard["address"] = addresses.get(shard["node"])
        return out, before, registry.get_replica(name)


def _record(registry: fleet_registry.FleetRegistry, before: Mapping, decision: placement.Decision) -> None:
    name = before["name"]
    if decision.placed and decision.action == "keep":
        return
    if not decision.placed:
        registry.set_shards(name, [])
        registry.put_replica(name, state="failed", reasons=[decision.reason])
        return
    states = {s["node"]: (registry.get_node(s["node"]) or {}).get("state") for s in before["shards"]}
    registry.set_shards(name, [s.to_dict() for s in decision.shards])
    lost = ", ".join(sorted(n for n, state in states.items() if state not in placement.LIVE_NODE_STATES))
    # placement.broken_reason is the one definition of what made it need this (failed, a shard not live, ...)
    cause = "after losing %s" % lost if lost else "(%s)" % placement.broken_reason(
        before["shard_count"], [(s["rank"], s["node"]) for s in before["shards"]], states, before["state"])
    why = {"place": "placed on %s" % decision.fabric,
           "repair": "repaired on %s %s" % (decision.fabric, cause),
           "move": "moved to %s %s" % (decision.fabric, cause)}[decision.action]
    registry.put_replica(name, state="placing", reasons=[why])


# -- what the modules ask of the registry ---------------------------------------------------------------------

def comparable(record: Optional[Mapping], fields: Sequence[str]) -> Optional[dict]:
    """The part of a node or replica that a module's ``changed`` and diff are about."""
    if record is None:
        return None
    out = {k: record[k] for k in ("name",) + tuple(fields)}
    if "shards" in record and "model" in fields:
        out["shards"] = [{"rank": s["rank"], "node": s["node"], "gpus": s["gpus"], "state": s["state"]}
                         for s in record["shards"]]
    return out


def compare(before: Optional[Mapping], after: Optional[Mapping], fields: Sequence[str]) -> Tuple[bool, dict]:
    """(changed, diff) of a module's task, from the record before and after it."""
    old, new = comparable(before, fields), comparable(after, fields)
    return old != new, {"before": old or {}, "after": new or {}}


def change_node(registry: fleet_registry.FleetRegistry, name: str, state: str,
                options: Mapping) -> Tuple[Optional[dict], Optional[dict]]:
    """fleet_node's task: register or update the node with the options given (None leaves a field as it is),
    or remove it (``state`` absent). Returns (before, after)."""
    if state == "absent":
        return registry.delete_node(name), None
    return registry.put_node(name, **{field: options.get(option) for option, field in NODE_OPTIONS.items()})


def change_replica(registry: fleet_registry.FleetRegistry, name: str, state: str = "present",
                   options: Optional[Mapping] = None, assignment: Optional[Sequence[Mapping]] = None,
                   place_it: bool = False, repair_it: bool = False, every_shard_status: Optional[str] = None,
                   shard_status: Optional[Sequence[Mapping]] = None) -> Tuple[Optional[dict], Optional[dict],
                                                                              Optional[dict], List[dict]]:
    """fleet_replica's task, every change in one transaction: remove it, or record it (its options mapped onto
    registry fields), then take an assignment as given, place it (when it holds no shards) or repair it, then
    set shard states. Returns (before, after, decision, reaped): the shards that lost their place, to stop."""
    options = options or {}
    decision, reaped = None, []
    with registry.transaction():
        before = registry.get_replica(name)
        if state == "absent":
            registry.delete_replica(name)
            reaped = [_reaped(s) for s in before["shards"]] if before else []
            return before, None, None, reaped
        registry.put_replica(name, **{field: options.get(option) for option, field in REPLICA_OPTIONS.items()})
        if assignment is not None:
            kept = {(s["rank"], s["node"]) for s in assignment}
            reaped = [_reaped(s) for s in (before or {}).get("shards", []) if (s["rank"], s["node"]) not in kept]
            registry.set_shards(name, assignment)
        if place_it and not registry.get_replica(name)["shards"]:
            decision = place(registry, name)[0]
        if repair_it:
            decision = repair(registry, name)[0]
            reaped = decision["reaped_shards"]
        if every_shard_status:
            for shard in registry.get_replica(name)["shards"]:
                registry.set_shard_state(name, shard["rank"], every_shard_status)
        for entry in shard_status or []:
            if "rank" not in entry or "status" not in entry:
                raise fleet_registry.RegistryConflict("shard_status entries are {rank, status, reasons}")
            registry.set_shard_state(name, int(entry["rank"]), entry["status"], entry.get("reasons") or [])
        return before, registry.get_replica(name), decision, reaped


def _reaped(shard: Mapping) -> dict:
    return {k: shard[k] for k in ("rank", "node", "gpus", "address")}


def with_units(name: str, shards: Sequence[Mapping]) -> List[dict]:
    """Each shard with the systemd unit that runs it (roles/replica names them so)."""
    return [dict(s, unit=replica_plan.unit_name(name, s["rank"])) for s in shards]
