# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The solver's answer made concrete: the search's choice turned into decisions (GPU ids handed out, refusals
with their reasons and fixes), and every invariant checked on them before :func:`placement.plan` returns them.

Private to :mod:`placement`; pure: no I/O.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils import _placement_report as report
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_fleet import Fleet
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_space import Item, Space
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_types import (
    Decision,
    InvariantViolation,
    Placement,
    Refusal,
    Shard,
)


def materialize(fleet: Fleet, items: Sequence[Item], choice: Sequence, space: Space) -> Dict[str, Decision]:
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
    needs = {"shards": item.shard_count, "gpus_per_shard": item.gpus, "gpus": item.shard_count * item.gpus}
    return Refusal(replica=item.name, action="fail" if item.repair else "refuse", reason=reason, needs=needs,
                   capacity=capacity, reaped_shards=reaped, fixes=tuple(fixes))


def verify(fleet: Fleet, decisions: Sequence[Decision], items: Mapping[str, Item]) -> None:
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
        wanted = item.shard_count
        ranks = [s.rank for s in decision.shards]
        if ranks != list(range(wanted)):
            raise InvariantViolation("%s has ranks %s, not 0..%d" % (decision.replica, ranks, wanted - 1))
        nodes = {s.node for s in decision.shards}
        fabrics = {fleet.nodes[n].fabric for n in nodes}
        if len(nodes) != len(decision.shards) or len(fabrics) != 1:
            raise InvariantViolation("%s is not on %d distinct nodes of one fabric" % (decision.replica, wanted))
