# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The solver's types: its errors, a node, a shard, a request, a replica, and its answers (a placement, a
refusal, a plan of them).

Private to :mod:`placement` (which re-exports the public names); pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, FrozenSet, Mapping, Optional, Tuple, Union


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
    """A node as the solver sees it. ``reserved`` GPUs are unusable for reasons outside the fleet.
    ``engine_version`` is read only by :func:`fleet_service.solve_on_one_engine` (the solver ignores it)."""

    name: str
    fabric: str
    gpus: int = 0
    state: str = "ready"
    gpu_type: Optional[str] = None
    reserved: Tuple[int, ...] = ()
    engine_version: Optional[str] = None


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
    shard_count: int
    gpus_per_shard: int
    engine: Optional[str] = None
    model: Optional[str] = None
    fabric: Optional[str] = None
    avoid_nodes: FrozenSet[str] = frozenset()
    gpu_type: Optional[str] = None

    @property
    def total_gpus(self) -> int:
        return self.shard_count * self.gpus_per_shard


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
            name=self.name, shard_count=self.shard_count, gpus_per_shard=self.gpus_per_shard, engine=self.engine,
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


def _check_request(request: Request) -> None:
    if not isinstance(request.name, str) or not request.name:
        raise InvalidRequest("a replica request needs a name")
    if not isinstance(request.shard_count, int) or request.shard_count < 1:
        raise InvalidRequest("replica %s: shard_count must be an integer >= 1" % request.name)
    if not isinstance(request.gpus_per_shard, int) or request.gpus_per_shard < 0:
        raise InvalidRequest("replica %s: gpus_per_shard must be an integer >= 0" % request.name)
