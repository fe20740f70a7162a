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
"""

from __future__ import annotations

import dataclasses
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ansible_collections.llmgw.fleet.plugins.module_utils import _placement_report as report
from ansible_collections.llmgw.fleet.plugins.module_utils import _placement_search as search
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_space import Item, Space, Static

NODE_STATES = ("pending", "ready", "draining", "maintenance", "lost")
REPLICA_STATES = ("placing", "starting", "ready", "failed")
# A shard on a node in one of these states is live. Draining nodes keep the shards they hold (they only get no
# new ones); a shard on a lost, pending, maintenance (drained empty, see drain_node) or unknown node is not live.
LIVE_NODE_STATES = ("ready", "draining")


def broken_reason(shard_count: int, shards: Iterable[Tuple[int, str]], node_states: Mapping[str, str],
                  state: Optional[str] = None) -> Optional[str]:
    """The one definition of a replica that is not whole, on plain data, for every entry point (``place``,
    ``repair``, ``plan``, ``decide``, the registry and reconcile): ``None`` when it is whole, else why not.

    Broken: its state is ``failed``; or a shard is on a node that is not live (lost, pending, or not in the
    fleet: ``node_states`` maps node name to state and has no entry for a node that is gone); or it holds fewer
    live shards than ``shard_count`` (a rank missing, or nothing left at all).
    """
    shards = list(shards)
    why = []
    if state == "failed":
        why.append("it is failed")
    dead = ["rank %d on %s (%s)" % (rank, node, node_states.get(node, "gone")) for rank, node in sorted(shards)
            if node_states.get(node) not in LIVE_NODE_STATES]
    if dead:
        why.append("shard%s not live: %s" % ("s" if len(dead) > 1 else "", ", ".join(dead)))
    live = sum(1 for _rank, node in shards if node_states.get(node) in LIVE_NODE_STATES)
    if live < shard_count:
        why.append("%d of its %d shards live" % (live, shard_count))
    return "; ".join(why) or None


# The exact search takes fleets with at most this many ready nodes per fabric and in all; larger ones get the
# heuristic (each search node costs time in proportion to the fleet, so the budget below buys less there).
EXACT_MAX_FABRIC_NODES = 64
EXACT_MAX_FLEET_NODES = 256
# Search nodes the exact solver may expand before it settles for the best answer found so far.
DEFAULT_SEARCH_BUDGET = 20000


class PlacementError(Exception):
    """Base class of every error the solver raises."""


class InvalidFleet(PlacementError):
    """The fleet given to the solver is inconsistent (duplicate names, a GPU used twice, ...)."""


class InvalidRequest(PlacementError):
    """A replica request is malformed or names a replica that already exists."""


class InvariantViolation(PlacementError):
    """The solver produced an answer that breaks an invariant. A bug; never returned to the caller."""


@dataclasses.dataclass(frozen=True)
class Node:
    """A node as the solver sees it. ``reserved`` GPUs are unusable for reasons outside the fleet."""

    name: str
    fabric: str
    gpus: int = 0
    state: str = "ready"
    gpu_type: Optional[str] = None
    reserved: Tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Shard:
    rank: int
    node: str
    gpus: Tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {"rank": self.rank, "node": self.node, "gpus": list(self.gpus)}


@dataclasses.dataclass(frozen=True)
class Request:
    """A replica to place. ``fabric``, ``avoid_nodes`` and ``gpu_type`` are optional constraints."""

    name: str
    shards: int
    gpus_per_shard: int
    engine: Optional[str] = None
    model: Optional[str] = None
    fabric: Optional[str] = None
    avoid_nodes: FrozenSet[str] = frozenset()
    gpu_type: Optional[str] = None

    @property
    def total_gpus(self) -> int:
        return self.shards * self.gpus_per_shard


@dataclasses.dataclass(frozen=True)
class Replica:
    """A replica already in the fleet, with the shards it holds now (possibly fewer than it should)."""

    name: str
    shard_count: int
    gpus_per_shard: int
    shards: Tuple[Shard, ...] = ()
    state: str = "ready"
    engine: Optional[str] = None
    model: Optional[str] = None
    fabric: Optional[str] = None
    avoid_nodes: FrozenSet[str] = frozenset()
    gpu_type: Optional[str] = None

    def as_request(self) -> Request:
        return Request(
            name=self.name, shards=self.shard_count, gpus_per_shard=self.gpus_per_shard, engine=self.engine,
            model=self.model, fabric=self.fabric, avoid_nodes=self.avoid_nodes, gpu_type=self.gpu_type,
        )


@dataclasses.dataclass(frozen=True)
class Placement:
    """A replica that gets (or keeps) all its shards.

    ``action``: ``place`` (a new replica), ``keep`` (nothing to repair), ``repair`` (survivors stay, lost ranks
    get new nodes on the same fabric) or ``move`` (the whole replica goes to another fabric; survivors are
    listed in ``reaped_shards`` and must be stopped).
    """

    replica: str
    action: str
    fabric: str
    shards: Tuple[Shard, ...]
    new_shards: Tuple[Shard, ...] = ()
    kept_shards: Tuple[Shard, ...] = ()
    reaped_shards: Tuple[Shard, ...] = ()

    placed = True

    @property
    def moved_shards(self) -> int:
        return len(self.new_shards) if self.action in ("repair", "move") else 0

    def to_dict(self) -> dict:
        return {
            "placed": True,
            "replica": self.replica,
            "action": self.action,
            "fabric": self.fabric,
            "shards": [s.to_dict() for s in self.shards],
            "new_shards": [s.to_dict() for s in self.new_shards],
            "kept_shards": [s.to_dict() for s in self.kept_shards],
            "reaped_shards": [s.to_dict() for s in self.reaped_shards],
            "moved_shards": self.moved_shards,
            "leader": self.shards[0].node if self.shards else None,
        }


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A replica that gets nothing. ``reason`` is a sentence for a person; ``capacity`` the figures behind it.

    ``action``: ``refuse`` (a new replica) or ``fail`` (an existing replica that cannot be repaired; its
    surviving shards are in ``reaped_shards`` and must be stopped).
    """

    replica: str
    action: str
    reason: str
    needs: Mapping[str, int]
    capacity: Mapping[str, Mapping[str, object]]
    reaped_shards: Tuple[Shard, ...] = ()
    # What would make it fit, each {kind, text, ...}: kinds in _placement_report.FIX_KINDS (docs/placement.md).
    fixes: Tuple[Mapping[str, object], ...] = ()

    placed = False

    def to_dict(self) -> dict:
        return {
            "placed": False,
            "replica": self.replica,
            "action": self.action,
            "reason": self.reason,
            "needs": dict(self.needs),
            "capacity": {k: dict(v) for k, v in self.capacity.items()},
            "reaped_shards": [s.to_dict() for s in self.reaped_shards],
            "fixes": [dict(f) for f in self.fixes],
        }


Decision = Union[Placement, Refusal]


@dataclasses.dataclass(frozen=True)
class Plan:
    """The answer to :func:`plan`: one decision per repair (by replica name) then per request (input order)."""

    decisions: Tuple[Decision, ...]
    strategy: str
    exact: bool
    expansions: int
    # The value the batch reached and an upper bound on what any answer could reach, each as
    # {repairs, placed, moved}: repairs that succeed, new replicas placed, shards moved (the bound's "moved" is
    # the fewest any answer with that many repairs could move). Equal when ``exact``.
    value: Mapping[str, int] = dataclasses.field(default_factory=dict)
    bound: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def placed(self) -> int:
        return sum(1 for d in self.decisions if d.placed)

    @property
    def gap(self) -> Dict[str, int]:
        """How far the answer may be from the optimum: repairs and new replicas the bound allows beyond it."""
        return {k: int(self.bound.get(k, 0)) - int(self.value.get(k, 0)) for k in ("repairs", "placed")}

    def get(self, name: str) -> Decision:
        for decision in self.decisions:
            if decision.replica == name:
                return decision
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "exact": self.exact,
            "expansions": self.expansions,
            "placed": self.placed,
            "value": dict(self.value),
            "bound": dict(self.bound),
            "gap": self.gap,
            "decisions": [d.to_dict() for d in self.decisions],
        }


class Fleet:
    """Nodes and the replicas on them. Immutable; :meth:`apply` returns a new fleet."""

    def __init__(self, nodes: Iterable[Node], replicas: Iterable[Replica] = ()):
        self.nodes: Dict[str, Node] = {}
        for node in sorted(nodes, key=lambda n: n.name):
            _check_node(node)
            if node.name in self.nodes:
                raise InvalidFleet("node %s is listed twice" % node.name)
            self.nodes[node.name] = node
        self.replicas: Dict[str, Replica] = {}
        for replica in sorted(replicas, key=lambda r: r.name):
            _check_replica(replica)
            if replica.name in self.replicas:
                raise InvalidFleet("replica %s is listed twice" % replica.name)
            self.replicas[replica.name] = replica
        self.free_ids: Dict[str, Tuple[int, ...]] = self._free_ids()
        for replica in self.replicas.values():
            self._check_fabric(replica)
        self._static: Optional[Static] = None

    def _free_ids(self) -> Dict[str, Tuple[int, ...]]:
        holders: Dict[str, Dict[int, str]] = {}
        for node in self.nodes.values():
            if node.reserved:
                holders[node.name] = {gpu: "(reserved)" for gpu in node.reserved}
        for replica in self.replicas.values():
            for shard in replica.shards:
                node = self.nodes.get(shard.node)
                held = holders.setdefault(shard.node, {})
                for gpu in shard.gpus:
                    if node is not None and not 0 <= gpu < node.gpus:
                        raise InvalidFleet("replica %s rank %d holds GPU %d of %s, which has %d GPUs"
                                           % (replica.name, shard.rank, gpu, shard.node, node.gpus))
                    if gpu in held:
                        raise InvalidFleet("GPU %d of %s is held by both %s and %s"
                                           % (gpu, shard.node, held[gpu], replica.name))
                    held[gpu] = replica.name
        free = {}
        for name, node in self.nodes.items():
            held = holders.get(name)
            free[name] = tuple(g for g in range(node.gpus) if g not in held) if held else tuple(range(node.gpus))
        return free

    def _check_fabric(self, replica: Replica) -> None:
        fabrics = {self.nodes[s.node].fabric for s in replica.shards if s.node in self.nodes}
        if len(fabrics) > 1:
            raise InvalidFleet("replica %s spans fabrics %s" % (replica.name, ", ".join(sorted(fabrics))))

    def static(self) -> Static:
        if self._static is None:
            self._static = Static(self.nodes)
        return self._static

    @property
    def fabrics(self) -> List[str]:
        return sorted({n.fabric for n in self.nodes.values()})

    def alive(self, node_name: str) -> bool:
        """A node whose shards are live: it exists and is ready or draining (see :func:`broken_reason`)."""
        node = self.nodes.get(node_name)
        return node is not None and node.state in LIVE_NODE_STATES

    def survivors(self, replica: Replica) -> Tuple[Shard, ...]:
        return tuple(s for s in replica.shards if self.alive(s.node))

    def broken_reason(self, replica: Replica) -> Optional[str]:
        """Why ``replica`` is not whole, or None: the one definition (:func:`broken_reason`)."""
        return broken_reason(replica.shard_count, [(s.rank, s.node) for s in replica.shards],
                             {name: node.state for name, node in self.nodes.items()}, replica.state)

    def is_broken(self, replica: Replica) -> bool:
        return self.broken_reason(replica) is not None

    def broken_replicas(self) -> List[Replica]:
        return [r for r in self.replicas.values() if self.is_broken(r)]

    def own_fabric(self, replica: Replica) -> Optional[str]:
        for shard in replica.shards:
            node = self.nodes.get(shard.node)
            if node is not None:
                return node.fabric
        return None

    def apply(self, decision: Decision, request: Optional[Request] = None) -> Fleet:
        """The fleet after a decision: a placed replica holds its shards, a failed one holds none."""
        replicas = dict(self.replicas)
        current = replicas.get(decision.replica)
        if current is None:
            if request is None:
                raise InvalidRequest("replica %s is not in the fleet; pass its request" % decision.replica)
            current = Replica(
                name=request.name, shard_count=request.shards, gpus_per_shard=request.gpus_per_shard,
                state="placing", engine=request.engine, model=request.model, fabric=request.fabric,
                avoid_nodes=request.avoid_nodes, gpu_type=request.gpu_type,
            )
        if decision.placed:
            state = current.state if decision.action == "keep" else "placing"
            replica = dataclasses.replace(current, shards=decision.shards, state=state)
        else:
            replica = dataclasses.replace(current, shards=(), state="failed")
        _check_replica(replica)
        # The same nodes: only the GPUs of this one replica change hands, so derive rather than rebuild.
        free_ids = dict(self.free_ids)
        old = self.replicas.get(decision.replica)
        for shard in old.shards if old is not None else ():
            if shard.node in free_ids:
                free_ids[shard.node] = tuple(sorted(free_ids[shard.node] + shard.gpus))
        for shard in replica.shards:
            if shard.node not in free_ids or not set(shard.gpus) <= set(free_ids[shard.node]):
                raise InvalidFleet("replica %s rank %d: GPUs %s of %s are not free"
                                   % (replica.name, shard.rank, list(shard.gpus), shard.node))
            taken = set(shard.gpus)
            free_ids[shard.node] = tuple(g for g in free_ids[shard.node] if g not in taken)
        replicas[decision.replica] = replica
        derived = Fleet.__new__(Fleet)
        derived.nodes, derived.replicas, derived.free_ids = self.nodes, dict(sorted(replicas.items())), free_ids
        derived._static = self._static
        derived._check_fabric(replica)
        return derived


def _check_node(node: Node) -> None:
    if not isinstance(node.name, str) or not node.name:
        raise InvalidFleet("a node needs a name")
    if not isinstance(node.fabric, str) or not node.fabric:
        raise InvalidFleet("node %s needs a fabric" % node.name)
    if not isinstance(node.gpus, int) or node.gpus < 0:
        raise InvalidFleet("node %s: gpus must be a non-negative integer" % node.name)
    if node.state not in NODE_STATES:
        raise InvalidFleet("node %s: state %r is not one of %s" % (node.name, node.state, ", ".join(NODE_STATES)))
    for gpu in node.reserved:
        if not 0 <= gpu < node.gpus:
            raise InvalidFleet("node %s: reserved GPU %d does not exist" % (node.name, gpu))


def _check_replica(replica: Replica) -> None:
    if not isinstance(replica.name, str) or not replica.name:
        raise InvalidFleet("a replica needs a name")
    if replica.shard_count < 1 or replica.gpus_per_shard < 0:
        raise InvalidFleet("replica %s: shard_count must be >= 1 and gpus_per_shard >= 0" % replica.name)
    ranks = [s.rank for s in replica.shards]
    if len(set(ranks)) != len(ranks) or any(not 0 <= r < replica.shard_count for r in ranks):
        raise InvalidFleet("replica %s: shard ranks %s are not distinct ranks below %d"
                           % (replica.name, sorted(ranks), replica.shard_count))
    nodes = [s.node for s in replica.shards]
    if len(set(nodes)) != len(nodes):
        raise InvalidFleet("replica %s has two shards on one node" % replica.name)
    for shard in replica.shards:
        if len(shard.gpus) != replica.gpus_per_shard or len(set(shard.gpus)) != len(shard.gpus):
            raise InvalidFleet("replica %s rank %d holds GPUs %s, not %d distinct GPUs"
                               % (replica.name, shard.rank, list(shard.gpus), replica.gpus_per_shard))


def _check_request(request: Request) -> None:
    if not isinstance(request.name, str) or not request.name:
        raise InvalidRequest("a replica request needs a name")
    if not isinstance(request.shards, int) or request.shards < 1:
        raise InvalidRequest("replica %s: shards must be an integer >= 1" % request.name)
    if not isinstance(request.gpus_per_shard, int) or request.gpus_per_shard < 0:
        raise InvalidRequest("replica %s: gpus_per_shard must be an integer >= 0" % request.name)


def _ffd_order(item: Item) -> tuple:
    return (not item.repair, -item.shards * item.gpus, -item.shards, -item.gpus, item.name)


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
            name=name, shards=replica.shard_count, gpus=replica.gpus_per_shard, fabric=replica.fabric,
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
            name=request.name, shards=request.shards, gpus=request.gpus_per_shard, fabric=request.fabric,
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
    by_name = _materialize(fleet, items, choice, space)
    order = list(sorted(repairs)) + [r.name for r in requests]
    decisions = tuple(by_name[name] for name in order)
    _verify(fleet, decisions, {item.name: item for item in items})
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


def _materialize(fleet: Fleet, items: Sequence[Item], choice: Sequence, space: Space) -> Dict[str, Decision]:
    """Turn the chosen options into shards with GPU ids (on ``space`` as the search left it, which is the state
    before any item). Every repair that does not stay gives its GPUs back first: any item of the batch may use
    them, whatever its place in the solve order."""
    free_ids = _CopyOnTouch(fleet.free_ids)
    placed_count = sum(1 for option in choice if option.mode != "skip")
    released = set()
    for item, option in zip(items, choice):
        if item.repair and option.mode in ("move", "skip"):
            for shard in item.kept:
                free_ids[shard.node] = sorted(free_ids[shard.node] + list(shard.gpus))
            space.release(item)
            released.add(item.name)
    holders: Dict[str, List[str]] = {}
    for replica in fleet.replicas.values():
        if replica.name in released or replica.gpus_per_shard == 0:
            continue
        for shard in replica.shards:
            holders.setdefault(shard.node, []).append(replica.name)
    # Refused items are judged on the fleet before the batch takes anything: one that fits there was crowded out
    # by the batch (named below); one that does not gets what would make it fit.
    decisions: Dict[str, Decision] = {}
    crowded = []
    for item, option in zip(items, choice):
        if option.mode == "skip":
            if space.has_option(item):
                crowded.append(item)
            else:
                decisions[item.name] = _refusal(space, item, report.fixes(space, item, holders))
    for item, option in zip(items, choice):
        if option.mode != "skip":
            decisions[item.name] = _placement(item, option, free_ids, space)
            space.take(item, option)
    for item in crowded:
        by = sorted(d.replica for d in decisions.values() if d.placed and d.replica != item.name
                    and any(_could_use(space, item, s.node) for s in d.new_shards))
        fix = {"kind": "crowded_out", "replicas": by,
               "text": "crowded out by %s in this batch" % (", ".join(by) or "the rest")}
        reason = report.crowded_out_reason(item, placed_count, len(items), by)
        decisions[item.name] = _refusal(space, item, (fix,), reason)
    return decisions


def _could_use(space: Space, item: Item, node: str) -> bool:
    """Whether ``item`` could have had a shard on ``node`` (its constraints, not its free GPUs)."""
    return (node in space.ready and node not in item.avoid and node not in item.kept_nodes
            and (item.gpu_type is None or space.gpu_type[node] == item.gpu_type)
            and (item.fabric is None or space.fabric[node] == item.fabric)
            and space.total[node] >= item.gpus)


class _CopyOnTouch(dict):
    """GPU ids per node as lists, copied from the fleet only for the nodes a decision touches."""

    def __init__(self, source: Mapping[str, Tuple[int, ...]]):
        super().__init__()
        self.source = source

    def __missing__(self, node: str) -> List[int]:
        self[node] = list(self.source[node])
        return self[node]


def _take(free_ids: Dict[str, List[int]], node: str, count: int) -> Tuple[int, ...]:
    taken, free_ids[node] = free_ids[node][:count], free_ids[node][count:]
    return tuple(taken)


def _placement(item: Item, option, free_ids: Dict[str, List[int]], space: Space) -> Placement:
    nodes = sorted(option.nodes)
    if option.mode == "repair":
        new = tuple(Shard(rank, node, _take(free_ids, node, item.gpus)) for rank, node in zip(item.missing, nodes))
        kept = tuple(sorted(item.kept, key=lambda s: s.rank))
        shards = tuple(sorted(kept + new, key=lambda s: s.rank))
        return Placement(item.name, "repair", option.fabric, shards, new_shards=new, kept_shards=kept)
    new = tuple(Shard(rank, node, _take(free_ids, node, item.gpus)) for rank, node in enumerate(nodes))
    action = "move" if item.repair and item.held_shards else "place"
    reaped = tuple(sorted(item.kept, key=lambda s: s.rank)) if item.repair else ()
    fabric = space.fabric_of(nodes[0])
    return Placement(item.name, action, fabric, new, new_shards=new, reaped_shards=reaped)


def _refusal(space: Space, item: Item, fixes: Sequence[Mapping[str, object]], reason: Optional[str] = None) -> Refusal:
    reaped = tuple(sorted(item.kept, key=lambda s: s.rank)) if item.repair else ()
    capacity = report.capacity(space, item)
    if reason is None:
        reason = report.refusal_reason(space, item, capacity) + report.fixes_words(fixes)
    needs = {"shards": item.shards, "gpus_per_shard": item.gpus, "gpus": item.shards * item.gpus}
    return Refusal(replica=item.name, action="fail" if item.repair else "refuse", reason=reason, needs=needs,
                   capacity=capacity, reaped_shards=reaped, fixes=tuple(fixes))


def _verify(fleet: Fleet, decisions: Sequence[Decision], items: Mapping[str, Item]) -> None:
    """Check every invariant on the fleet the decisions leave behind. Only the nodes the decisions touch are
    looked at: a decision may use a GPU that is free, or one its own or another decided replica gave up, once."""
    pools: Dict[str, set] = {}

    def pool(node: str) -> set:
        if node not in pools:
            pools[node] = set(fleet.free_ids.get(node, ()))
        return pools[node]

    for decision in decisions:
        replica = fleet.replicas.get(decision.replica)
        for shard in replica.shards if replica is not None else ():
            if shard.node in fleet.nodes:
                pool(shard.node).update(shard.gpus)

    def hold(replica: str, shard: Shard) -> None:
        available = pool(shard.node)
        for gpu in shard.gpus:
            if gpu not in available:
                raise InvariantViolation("GPU %d of %s given to %s is not free (held, reserved, given twice or "
                                         "missing)" % (gpu, shard.node, replica))
            available.remove(gpu)

    for decision in decisions:
        if not decision.placed:
            continue
        item = items[decision.replica]
        for shard in decision.shards:
            hold(decision.replica, shard)
            if len(shard.gpus) != item.gpus:
                raise InvariantViolation("%s rank %d holds %d GPUs, not %d" % (decision.replica, shard.rank,
                                                                               len(shard.gpus), item.gpus))
        for shard in decision.new_shards:
            node = fleet.nodes.get(shard.node)
            if node is None or node.state != "ready":
                raise InvariantViolation("%s rank %d given to %s, which is not ready"
                                         % (decision.replica, shard.rank, shard.node))
        wanted = item.shards
        ranks = [s.rank for s in decision.shards]
        if ranks != list(range(wanted)):
            raise InvariantViolation("%s has ranks %s, not 0..%d" % (decision.replica, ranks, wanted - 1))
        nodes = {s.node for s in decision.shards}
        fabrics = {fleet.nodes[n].fabric for n in nodes}
        if len(nodes) != len(decision.shards) or len(fabrics) != 1:
            raise InvariantViolation("%s is not on %d distinct nodes of one fabric" % (decision.replica, wanted))


# -- plain data (what playbooks and the registry pass around) -> solver types --------------------------------

_REQUEST_KEYS = {"name", "shards", "shard_count", "gpus_per_shard", "engine", "model", "fabric", "avoid_nodes",
                 "gpu_type",
                 # replica settings that do not bear on placement, accepted so one dict can describe a replica
                 "port", "options", "status", "reasons"}


def request_from_dict(data: Mapping) -> Request:
    """A request from ``{name, shards, gpus_per_shard, engine, model, fabric, avoid_nodes, gpu_type}``."""
    if not isinstance(data, Mapping):
        raise InvalidRequest("a replica request is a dict, not %r" % (data,))
    unknown = set(data) - _REQUEST_KEYS
    if unknown:
        raise InvalidRequest("unknown request keys: %s (known: %s)"
                             % (", ".join(sorted(unknown)), ", ".join(sorted(_REQUEST_KEYS))))
    shards = data.get("shards", data.get("shard_count"))
    for key, value in (("name", data.get("name")), ("shards", shards), ("gpus_per_shard", data.get("gpus_per_shard"))):
        if value is None:
            raise InvalidRequest("a replica request needs %s" % key)
    try:
        request = Request(
            name=str(data["name"]), shards=int(shards), gpus_per_shard=int(data["gpus_per_shard"]),
            engine=data.get("engine"), model=data.get("model"), fabric=data.get("fabric") or None,
            avoid_nodes=frozenset(data.get("avoid_nodes") or ()), gpu_type=data.get("gpu_type") or None,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidRequest("replica request %r: %s" % (data.get("name"), exc))
    _check_request(request)
    return request


def fleet_from_data(data) -> Fleet:
    """A fleet from ``{nodes: [...], replicas: [...]}`` (or a list of nodes), in the registry's shape
    (``gpu_count``, ``state``, replicas with ``shard_count`` and a ``shards`` list) or the short one (``gpus``;
    a node's ``free_gpus`` reserves the rest of its GPUs that no listed replica holds)."""
    if isinstance(data, Mapping):
        node_data, replica_data = data.get("nodes") or [], data.get("replicas") or []
    elif isinstance(data, Sequence) and not isinstance(data, str):
        node_data, replica_data = data, []
    else:
        raise InvalidFleet("a fleet is {nodes: [...], replicas: [...]} or a list of nodes")
    try:
        replicas = [_replica_from_dict(r) for r in replica_data]
        held: Dict[str, set] = {}
        for replica in replicas:
            for shard in replica.shards:
                held.setdefault(shard.node, set()).update(shard.gpus)
        nodes = [_node_from_dict(n, held.get(n.get("name"), set())) for n in node_data]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidFleet("malformed fleet: %s: %s" % (type(exc).__name__, exc))
    return Fleet(nodes, replicas)


def _node_from_dict(data: Mapping, held: set) -> Node:
    gpus = int(data.get("gpus", data.get("gpu_count", 0)))
    reserved: Tuple[int, ...] = tuple(int(g) for g in data.get("reserved", ()))
    if data.get("free_gpus") is not None:
        available = [g for g in range(gpus) if g not in held and g not in reserved]
        free = int(data["free_gpus"])
        if not 0 <= free <= len(available):
            raise InvalidFleet("node %s: free_gpus %d, but only %d GPUs are not held"
                               % (data["name"], free, len(available)))
        reserved = tuple(sorted(set(reserved) | set(available[free:])))
    return Node(name=str(data["name"]), fabric=str(data.get("fabric") or "default"), gpus=gpus,
                state=data.get("state", data.get("status", "ready")), gpu_type=data.get("gpu_type") or None,
                reserved=reserved)


def _replica_from_dict(data: Mapping) -> Replica:
    shard_list = data.get("shards") if isinstance(data.get("shards"), list) else []
    shards = tuple(Shard(int(s["rank"]), str(s["node"]), tuple(int(g) for g in s.get("gpus", ()))) for s in shard_list)
    count = data.get("shard_count", data.get("shards") if isinstance(data.get("shards"), int) else None)
    per_shard = data.get("gpus_per_shard")
    if count is None:
        count = len(shards)
    if per_shard is None:
        per_shard = len(shards[0].gpus) if shards else 0
    return Replica(
        name=str(data["name"]), shard_count=int(count), gpus_per_shard=int(per_shard), shards=shards,
        state=data.get("state", data.get("status", "ready")), engine=data.get("engine"), model=data.get("model"),
        fabric=data.get("fabric") or None, avoid_nodes=frozenset(data.get("avoid_nodes") or ()),
        gpu_type=data.get("gpu_type") or None,
    )


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
        if (replica.shard_count, replica.gpus_per_shard) != (request.shards, request.gpus_per_shard):
            raise InvalidRequest("replica %s holds %d x %d GPUs; remove it before asking for %d x %d" % (
                request.name, replica.shard_count, replica.gpus_per_shard, request.shards, request.gpus_per_shard))
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
