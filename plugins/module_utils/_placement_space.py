# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The solver's working state: free GPU counts per node, the options a replica has, and how they compare.

Private to placement.py. Everything here is counts; GPU ids are handed out once the choice is final.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class Item:
    """One replica to decide: a new request, or (``repair``) an existing replica that is broken.

    A repair may stay in place (mode ``repair``: its live shards, ``kept``, stay and the ``missing`` ranks get
    new nodes on ``own_fabric``; only when something survives) or be placed whole again (mode ``move``: its
    live shards are reaped and their GPUs freed; any allowed fabric, its own included, never on a node where a
    reaped shard was). ``held_shards``: whether it held any shard at all (a move of one that held none is a
    plain placement).
    """

    name: str
    shard_count: int
    gpus: int
    fabric: Optional[str] = None
    avoid: FrozenSet[str] = frozenset()
    gpu_type: Optional[str] = None
    repair: bool = False
    kept: Tuple = ()  # surviving Shard objects of a replica being repaired
    own_fabric: Optional[str] = None
    missing: Tuple[int, ...] = ()  # ranks a repair in place must fill
    held_shards: bool = False
    kept_nodes: FrozenSet[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "kept_nodes", frozenset(s.node for s in self.kept))


@dataclasses.dataclass(frozen=True)
class Option:
    """What happens to an item: ``place``/``repair``/``move`` onto ``nodes`` of ``fabric``, or ``skip``."""

    mode: str
    fabric: Optional[str] = None
    nodes: Tuple[str, ...] = ()


SKIP = Option("skip")


class Static:
    """Per-node facts of a fleet that no placement changes, indexed for the solver."""

    def __init__(self, nodes):
        self.fabric = {name: node.fabric for name, node in nodes.items()}
        self.total = {name: node.gpus for name, node in nodes.items()}
        self.gpu_type = {name: node.gpu_type for name, node in nodes.items()}
        self.state = {name: node.state for name, node in nodes.items()}
        self.ready = frozenset(name for name, node in nodes.items() if node.state == "ready")
        self.gmax = max(self.total.values(), default=0)
        self.fabric_nodes: Dict[str, List[str]] = {}  # ready nodes only, by name
        self.fabric_members: Dict[str, List[str]] = {}  # every node, by name
        for name in sorted(nodes):
            self.fabric_members.setdefault(self.fabric[name], []).append(name)
            if name in self.ready:
                self.fabric_nodes.setdefault(self.fabric[name], []).append(name)
        self.fabrics = sorted(self.fabric_nodes)


def _desc(values: List[int]) -> List[int]:
    return sorted(values, reverse=True)


class Space:
    """Mutable counts the search walks through with :meth:`apply` and :meth:`undo`."""

    def __init__(self, fleet, items: Sequence[Item], symmetry: bool = False):
        """``symmetry``: also track which nodes no remaining item can tell apart (what the exact search needs
        for :meth:`canonical` and :meth:`options`)."""
        nodes = fleet.nodes
        static = fleet.static()  # what does not change while solving, shared by every Space of this fleet
        self.fabric, self.total, self.gpu_type, self.state = static.fabric, static.total, static.gpu_type, static.state
        self.ready, self.gmax = static.ready, static.gmax
        self.fabric_nodes, self.fabric_members = static.fabric_nodes, static.fabric_members
        self.fabrics = static.fabrics
        self.free = {name: len(ids) for name, ids in fleet.free_ids.items()}
        self.shard_count = collections.Counter()
        for replica in fleet.replicas.values():
            for shard in replica.shards:
                self.shard_count[shard.node] += 1
        self.hist = {f: [0] * (self.gmax + 1) for f in self.fabrics}
        self.free_ready = 0
        self.sig: Dict[str, int] = {}
        self.classes: Optional[collections.Counter] = None
        if symmetry:
            excluded_by: Dict[str, set] = collections.defaultdict(set)
            for index, item in enumerate(items):
                for name in item.avoid | item.kept_nodes:
                    excluded_by[name].add(index)
            signatures: Dict[tuple, int] = {}
            for name in sorted(nodes):
                key = (self.fabric[name], self.gpu_type[name], tuple(sorted(excluded_by.get(name, ()))))
                self.sig[name] = signatures.setdefault(key, len(signatures))
            self.classes = collections.Counter()
        for name in self.ready:
            self._count(name, +1)

    # -- state changes ------------------------------------------------------------------------------------

    def _count(self, name: str, sign: int) -> None:
        free = self.free[name]
        self.hist[self.fabric[name]][self.gmax - free] += sign
        self.free_ready += sign * free
        if self.classes is not None:
            key = (self.sig[name], free)
            self.classes[key] += sign
            if not self.classes[key]:
                del self.classes[key]

    def _change(self, name: str, dfree: int, dshards: int) -> None:
        if name in self.ready:
            self._count(name, -1)
        self.free[name] += dfree
        self.shard_count[name] += dshards
        if name in self.ready:
            self._count(name, +1)

    def apply(self, item: Item, option: Option) -> list:
        """Decide ``item``: a repair that does not stay in place gives back its live shards' GPUs first."""
        changes = self.release(item) if item.repair and option.mode in ("move", "skip") else []
        return changes + self.take(item, option)

    def release(self, item: Item) -> list:
        """Free the GPUs of a repair's live shards (it is moved or failed)."""
        return self._do([(s.node, item.gpus, -1) for s in item.kept if s.node in self.free])

    def take(self, item: Item, option: Option) -> list:
        return self._do([(name, -item.gpus, +1) for name in option.nodes])

    def _do(self, changes: list) -> list:
        for name, dfree, dshards in changes:
            self._change(name, dfree, dshards)
        return changes

    def undo(self, changes: list) -> None:
        for name, dfree, dshards in reversed(changes):
            self._change(name, -dfree, -dshards)

    def canonical(self) -> FrozenSet:
        """The state up to swapping nodes that no remaining replica can tell apart."""
        return frozenset(self.classes.items())

    def fabric_of(self, name: str) -> str:
        return self.fabric[name]

    # -- what an item may use -----------------------------------------------------------------------------

    def eligible(self, item: Item, name: str) -> bool:
        return (
            self.free[name] >= item.gpus
            and name not in item.avoid
            and (item.gpu_type is None or self.gpu_type[name] == item.gpu_type)
            and name not in item.kept_nodes
        )

    def fabrics_for(self, item: Item, mode: str) -> List[str]:
        fabrics = self.fabrics if item.fabric is None else [f for f in self.fabrics if f == item.fabric]
        if mode == "repair":  # its own fabric, even one with no ready node left (nothing may be missing)
            return [item.own_fabric] if item.kept and item.fabric in (None, item.own_fabric) else []
        return fabrics

    def can_stay(self, item: Item) -> bool:
        """Whether a repair could stay in place at all (something survives, on a fabric it may use)."""
        return item.repair and bool(item.kept) and bool(self.fabrics_for(item, "repair"))

    def need(self, item: Item, mode: str) -> int:
        return len(item.missing) if mode == "repair" else item.shard_count

    def mode(self, item: Item) -> str:
        """New replicas are placed; a repair stays on its own fabric when that fabric can hold all of it."""
        if not item.repair:
            return "place"
        if self.can_stay(item) and self._fabric_best(item, item.own_fabric, len(item.missing)) is not None:
            return "repair"
        return "move"

    def _candidates(self, item: Item, fabric: str, need: int = 0) -> List[str]:
        # The histogram says at once when a fabric has too few ready nodes with enough free GPUs at all.
        if need and sum(self.hist.get(fabric, ())[: max(0, self.gmax - item.gpus + 1)]) < need:
            return []
        return [n for n in self.fabric_nodes.get(fabric, ()) if self.eligible(item, n)]

    def _fabric_best(self, item: Item, fabric: str, need: int) -> Optional[Tuple[str, ...]]:
        """Best fit on one fabric: the ``need`` eligible nodes with the fewest free GPUs (then least used,
        fewest shards, name). Optimal for room, then balance, then names (docs/placement.md)."""
        candidates = self._candidates(item, fabric, need)
        if len(candidates) < need:
            return None
        free, total, shards = self.free, self.total, self.shard_count
        if item.gpus > 0:
            chosen = heapq.nsmallest(need, candidates, key=lambda n: (free[n], total[n] - free[n], shards[n], n))
        else:  # nothing free changes: only the shard count per node can tell options apart
            chosen = heapq.nsmallest(need, candidates, key=lambda n: (shards[n], n))
        return tuple(sorted(chosen))

    def has_option(self, item: Item) -> bool:
        return self.best_option(item) is not SKIP

    def best_option(self, item: Item) -> Option:
        """The single best option by the objective (room, balance, names), or SKIP when nothing fits."""
        return self.best_in(item, self.mode(item))

    def best_in(self, item: Item, mode: str) -> Option:
        """The best option of ``item`` in ``mode`` (``place``, ``repair`` in place, ``move``), or SKIP."""
        need = self.need(item, mode)
        best = None
        for fabric in self.fabrics_for(item, mode):
            nodes = self._fabric_best(item, fabric, need)
            if nodes is None:
                continue
            option = Option(mode, fabric, nodes)
            if best is None or self.better(item, option, best):
                best = option
        return best or SKIP

    def first_fit_option(self, item: Item) -> Option:
        """First-fit: the first fabric (by name) with enough eligible nodes, its first nodes by name."""
        mode = self.mode(item)
        need = self.need(item, mode)
        for fabric in self.fabrics_for(item, mode):
            nodes = self._candidates(item, fabric, need)[:need]
            if len(nodes) == need:
                return Option(mode, fabric, tuple(nodes))
        return SKIP

    def options(self, item: Item, mode: str) -> Iterator[Option]:
        """Every option of ``item`` in ``mode`` up to symmetry, the best first, then SKIP (except in mode
        ``repair``: a repair that stays in place and finds no nodes is the same as one moved and failed, which
        the search tries anyway): what the exact search branches on."""
        first = self.best_in(item, mode)
        if first is SKIP:
            if mode != "repair":
                yield SKIP
            return
        yield first
        seen = {(first.fabric, self._class_key(first.nodes))}
        need = self.need(item, mode)
        for fabric in self.fabrics_for(item, mode):
            groups: Dict[tuple, List[str]] = collections.defaultdict(list)
            for name in self._candidates(item, fabric):
                groups[(self.free[name], self.sig[name])].append(name)
            keys = sorted(groups)
            ordered = [sorted(groups[k], key=lambda n: (self.total[n] - self.free[n], self.shard_count[n], n))
                       for k in keys]
            for counts in _compositions(need, [len(g) for g in ordered]):
                nodes = tuple(sorted(n for group, k in zip(ordered, counts) for n in group[:k]))
                key = (fabric, self._class_key(nodes))
                if key not in seen:
                    seen.add(key)
                    yield Option(mode, fabric, nodes)
        if mode != "repair":
            yield SKIP

    def _class_key(self, nodes: Sequence[str]) -> tuple:
        return tuple(sorted(collections.Counter((self.sig[n], self.free[n]) for n in nodes).items()))

    # -- comparing two options on different fabrics -------------------------------------------------------

    def _hist_after(self, fabric: str, nodes: Sequence[str], gpus: int) -> tuple:
        hist = list(self.hist[fabric])
        for name in nodes:
            hist[self.gmax - self.free[name]] -= 1
            hist[self.gmax - self.free[name] + gpus] += 1
        return tuple(hist)

    def better(self, item: Item, a: Option, b: Option) -> bool:
        """Is ``a`` strictly better than ``b``? Each compares the whole fleet after it, reduced to the parts
        that differ: sorted(R + X) vs sorted(R + Y) orders as sorted(X) vs sorted(Y) for any common R."""
        g = item.gpus
        if a.fabric == b.fabric:
            room_a, room_b = [self._hist_after(a.fabric, a.nodes, g)], [self._hist_after(b.fabric, b.nodes, g)]
        else:
            ha, hb = tuple(self.hist[a.fabric]), tuple(self.hist[b.fabric])
            room_a = _desc([self._hist_after(a.fabric, a.nodes, g), hb])
            room_b = _desc([ha, self._hist_after(b.fabric, b.nodes, g)])
        if room_a != room_b:
            return room_a > room_b
        for metric, step in ((lambda n: self.total[n] - self.free[n], g), (lambda n: self.shard_count[n], 1)):
            load_a = _desc([metric(n) + step for n in a.nodes] + [metric(n) for n in b.nodes if n not in a.nodes])
            load_b = _desc([metric(n) for n in a.nodes if n not in b.nodes] + [metric(n) + step for n in b.nodes])
            if load_a != load_b:
                return load_a < load_b
        return (a.fabric, sorted(a.nodes)) < (b.fabric, sorted(b.nodes))


def _compositions(total: int, caps: Sequence[int]) -> Iterator[Tuple[int, ...]]:
    """Count vectors k with sum ``total`` and k[i] <= caps[i], taking as much as possible from the front
    first (the front holds the fewest free GPUs, so best fit comes first)."""
    if not caps:
        if total == 0:
            yield ()
        return
    rest = sum(caps[1:])
    for k in range(min(total, caps[0]), max(0, total - rest) - 1, -1):
        for tail in _compositions(total - k, caps[1:]):
            yield (k,) + tail
