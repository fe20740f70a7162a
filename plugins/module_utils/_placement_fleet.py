# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet as the solver sees it: the node states, when a replica is broken (:func:`broken_reason`, the one
definition), and :class:`Fleet`, nodes and the replicas on them, checked when it is built.

Private to :mod:`placement` (which re-exports the public names); pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils._placement_space import Static
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_types import (
    Decision,
    InvalidFleet,
    InvalidRequest,
    Node,
    Replica,
    Request,
    Shard,
)

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
                name=request.name, shard_count=request.shard_count, gpus_per_shard=request.gpus_per_shard,
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
