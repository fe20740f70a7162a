# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Placement of (multi-node) replicas on a fleet of GPU nodes: the solver. Pure: no I/O.

Vocabulary: a *node* has a fabric, a GPU count and a state; a *replica* runs as ``shard_count`` *shards*,
one per node, each holding ``gpus_per_shard`` GPUs of its node; rank 0 is the leader.

Invariants, checked again on every answer before it is returned (:class:`InvariantViolation`):

* all shards of a replica are on one fabric (and on distinct nodes);
* a shard is only ever *given* to a ready node;
* no GPU is given twice;
* a replica gets exactly the shard count it asked for, or nothing.

Objective, in order (see docs/placement.md for the proofs that the single-replica choice is optimal):

1. feasible: as many replicas as possible (repairs of existing replicas before new ones);
2. existing healthy replicas never move (the solver never proposes anything for them);
3. fewest shards moved when repairing (survivors stay when their own fabric can still hold the replica);
4. room: keep the largest free block of each fabric -- the fleet's fabrics, each read as its ready nodes'
   free-GPU counts sorted from most to least free, compared from the largest down (best fit);
5. balance: the fewest GPUs in use on the busiest nodes, then the fewest shards on the busiest nodes;
6. sorted names (fabric, then node names), so the same input always gives the same answer.

Entry points: :func:`place` (one new replica), :func:`repair` (one replica after a node loss),
:func:`plan` (a batch: every broken replica plus new requests, exact for small fleets),
:func:`first_fit_decreasing` (the baseline the batch solver never places fewer replicas than).

The parts: :mod:`_placement_types` (errors, requests, replicas, answers), :mod:`_placement_fleet` (node states,
:func:`broken_reason`, :class:`Fleet`), :mod:`_placement_data` (plain dicts to those types), :mod:`_placement_space`
and :mod:`_placement_search` (the search), :mod:`_placement_decisions` (the choice made into decisions, invariants
checked), :mod:`_placement_report` (the words); this module is the one callers import, and re-exports the public names.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from ansible_collections.llmgw.fleet.plugins.module_utils import _placement_search as search
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_data import fleet_from_data, request_from_dict
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_decisions import materialize, verify
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_fleet import (
    LIVE_NODE_STATES,
    NODE_STATES,
    REPLICA_STATES,
    Fleet,
    broken_reason,
)
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_space import Item, Space
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_types import (
    Decision,
    InvalidFleet,
    InvalidRequest,
    InvariantViolation,
    Node,
    Placement,
    PlacementError,
    Plan,
    Refusal,
    Replica,
    Request,
    Shard,
    _check_request,
)

__all__ = ["DEFAULT_SEARCH_BUDGET", "EXACT_MAX_FABRIC_NODES", "EXACT_MAX_FLEET_NODES", "LIVE_NODE_STATES",
           "NODE_STATES", "REPLICA_STATES", "Decision", "Fleet", "InvalidFleet", "InvalidRequest",
           "InvariantViolation", "Node", "Placement", "PlacementError", "Plan", "Refusal", "Replica", "Request",
           "Shard", "broken_reason", "decide", "first_fit_decreasing", "fleet_from_data", "place", "plan", "repair",
           "request_from_dict"]

# The exact search takes fleets with at most this many ready nodes per fabric and in all; larger ones get the
# heuristic (each search node costs time in proportion to the fleet, so the budget below buys less there).
EXACT_MAX_FABRIC_NODES = 64
EXACT_MAX_FLEET_NODES = 256
# Search nodes the exact solver may expand before it settles for the best answer found so far.
DEFAULT_SEARCH_BUDGET = 20000


def _ffd_order(item: Item) -> tuple:
    return (not item.repair, -item.shard_count * item.gpus, -item.shard_count, -item.gpus, item.name)


def _items(fleet: Fleet, requests: Sequence[Request], repairs: Sequence[str]) -> List[Item]:
    items = []
    seen = set()
    for name in repairs:
        replica = fleet.replicas.get(name)
        if replica is None:
            raise InvalidRequest("replica %s is not in the fleet" % name)
        survivors = fleet.survivors(replica)
        present = {s.rank for s in survivors}
        items.append(Item(
            name=name, shard_count=replica.shard_count, gpus=replica.gpus_per_shard, fabric=replica.fabric,
            avoid=frozenset(replica.avoid_nodes), gpu_type=replica.gpu_type, repair=True, kept=survivors,
            own_fabric=fleet.own_fabric(replica),
            missing=tuple(r for r in range(replica.shard_count) if r not in present),
            held_shards=bool(replica.shards),
        ))
        seen.add(name)
    for request in requests:
        _check_request(request)
        if request.name in seen:
            raise InvalidRequest("replica %s is requested twice" % request.name)
        if request.name in fleet.replicas:
            raise InvalidRequest("replica %s is already in the fleet; repair it instead of placing it again"
                                 % request.name)
        seen.add(request.name)
        items.append(Item(
            name=request.name, shard_count=request.shard_count, gpus=request.gpus_per_shard, fabric=request.fabric,
            avoid=frozenset(request.avoid_nodes), gpu_type=request.gpu_type,
        ))
    items.sort(key=_ffd_order)
    return items


def _strategy_for(fleet: Fleet) -> str:
    per_fabric: Dict[str, int] = {}
    for node in fleet.nodes.values():
        if node.state == "ready":
            per_fabric[node.fabric] = per_fabric.get(node.fabric, 0) + 1
    small = (max(per_fabric.values(), default=0) <= EXACT_MAX_FABRIC_NODES
             and sum(per_fabric.values()) <= EXACT_MAX_FLEET_NODES)
    return "exact" if small else "heuristic"


def plan(fleet: Fleet, requests: Sequence[Request] = (), repairs: Optional[Sequence[str]] = None,
         strategy: Optional[str] = None, budget: int = DEFAULT_SEARCH_BUDGET) -> Plan:
    """Repair broken replicas (all of them unless ``repairs`` names some) and place ``requests``.

    ``strategy``: ``exact`` (branch and bound seeded with first-fit decreasing), ``heuristic`` (the better of
    best-fit decreasing and first-fit decreasing) or ``greedy`` (best-fit decreasing alone, what each single
    placement does); by default ``exact`` when no fabric has more than ``EXACT_MAX_FABRIC_NODES`` ready nodes and
    the fleet no more than ``EXACT_MAX_FLEET_NODES``.
    """
    if repairs is None:
        repairs = [r.name for r in fleet.broken_replicas()]
    items = _items(fleet, requests, sorted(repairs))
    strategy = strategy or _strategy_for(fleet)
    space = Space(fleet, items, symmetry=strategy == "exact")
    bound = None
    if strategy == "exact":
        choice, exact, expansions, bound = search.exact(space, items, budget)
    elif strategy == "heuristic":
        choice, exact, expansions = search.heuristic(space, items), False, 0
    elif strategy == "greedy":
        choice, exact, expansions = search.sequential(space, items, space.best_option), False, 0
    elif strategy == "ffd":
        choice, exact, expansions = search.sequential(space, items, space.first_fit_option), False, 0
    else:
        raise InvalidRequest("unknown strategy %r" % strategy)
    reached = search.value(items, choice)
    if bound is None:
        bound = search.upper_bound(space, items) if items else reached
    if exact and bound != reached:
        raise InvariantViolation("an answer marked exact below its own bound")
    by_name = materialize(fleet, items, choice, space)
    order = list(sorted(repairs)) + [r.name for r in requests]
    decisions = tuple(by_name[name] for name in order)
    verify(fleet, decisions, {item.name: item for item in items})
    return Plan(decisions=decisions, strategy=strategy, exact=exact, expansions=expansions,
                value=_value_dict(reached), bound=_value_dict(bound))


def _value_dict(value: Sequence[int]) -> Dict[str, int]:
    return {"repairs": value[0], "placed": value[1], "moved": -value[2]}


def place(fleet: Fleet, request: Request) -> Decision:
    """Place one new replica: the best placement by the objective, or a refusal that says why."""
    return plan(fleet, [request], repairs=(), strategy="greedy").decisions[0]


def repair(fleet: Fleet, replica_name: str) -> Decision:
    """Repair one replica: ``keep`` if whole (:func:`broken_reason`), else ``repair`` in place when its own
    fabric can hold it again, else ``move`` it whole (``place`` for one that holds no shards at all), or
    ``fail`` it with the reason. One replica alone: fewest shards moved, then the room rule."""
    replica = fleet.replicas.get(replica_name)
    if replica is None:
        raise InvalidRequest("replica %s is not in the fleet" % replica_name)
    if not fleet.is_broken(replica):
        fabric = fleet.own_fabric(replica) or ""
        shards = tuple(sorted(replica.shards, key=lambda s: s.rank))
        return Placement(replica=replica_name, action="keep", fabric=fabric, shards=shards, kept_shards=shards)
    return plan(fleet, (), repairs=[replica_name], strategy="greedy").decisions[0]


def first_fit_decreasing(fleet: Fleet, requests: Sequence[Request] = (),
                         repairs: Optional[Sequence[str]] = None) -> Plan:
    """The baseline: items by decreasing size, each on the first fabric (by name) whose first nodes fit."""
    return plan(fleet, requests, repairs=repairs, strategy="ffd")


def decide(fleet: Fleet, requests: Sequence[Request] = (), strategy: Optional[str] = None,
           repairs: Sequence[str] = ()) -> List[Decision]:
    """One decision per request, then one per name in ``repairs``, in order, as a playbook wants it: a replica the
    fleet already holds whole is kept where it is, one that lost shards is repaired, anything else is placed (all
    in one batch). ``repairs`` names replicas of the fleet to repair as :func:`repair` does (``keep`` when whole)."""
    keep: Dict[str, Decision] = {}
    broken, new = [], []
    for request in requests:
        replica = fleet.replicas.get(request.name)
        if replica is None or not replica.shards:
            new.append(request)
            continue
        if (replica.shard_count, replica.gpus_per_shard) != (request.shard_count, request.gpus_per_shard):
            raise InvalidRequest("replica %s holds %d x %d GPUs; remove it before asking for %d x %d" % (
                request.name, replica.shard_count, replica.gpus_per_shard, request.shard_count,
                request.gpus_per_shard))
        if fleet.is_broken(replica):
            broken.append(request.name)
        else:
            keep[request.name] = repair(fleet, request.name)
    asked = [r.name for r in requests]
    for name in repairs:
        replica = fleet.replicas.get(name)
        if replica is None:
            raise InvalidRequest("replica %s is not in the fleet" % name)
        if name in asked:
            raise InvalidRequest("replica %s is both requested and to be repaired" % name)
        if fleet.is_broken(replica):
            broken.append(name)
        else:
            keep[name] = repair(fleet, name)
    by_name = dict(keep)
    if new or broken or not repairs:
        unplaced = {r.name for r in new}
        fleet = Fleet(fleet.nodes.values(), [r for r in fleet.replicas.values() if r.name not in unplaced])
        result = plan(fleet, new, repairs=broken, strategy=strategy)
        by_name.update((d.replica, d) for d in result.decisions)
    return [by_name[r.name] for r in requests] + [by_name[name] for name in repairs]
