# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plain data (what playbooks and the registry pass around) to the solver's types: a request from a dict, a
fleet from ``{nodes, replicas}``.

Private to :mod:`placement` (which re-exports the public names); pure: no I/O.
"""

from __future__ import annotations

from typing import Dict, Mapping, Sequence, Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils._placement_fleet import Fleet
from ansible_collections.llmgw.fleet.plugins.module_utils._placement_types import (
    InvalidFleet,
    InvalidRequest,
    Node,
    Replica,
    Request,
    Shard,
    _check_request,
)

_REQUEST_KEYS = {"name", "shards", "shard_count", "gpus_per_shard", "engine", "model", "fabric", "avoid_nodes",
                 "gpu_type",
                 # replica settings that do not bear on placement, accepted so one dict can describe a replica
                 "port", "options", "status", "reasons"}


def request_from_dict(data: Mapping) -> Request:
    """A request from ``{name, shard_count, gpus_per_shard, engine, model, fabric, avoid_nodes, gpu_type}``
    (``shards`` is an alias of ``shard_count``, kept for requests written before)."""
    if not isinstance(data, Mapping):
        raise InvalidRequest("a replica request is a dict, not %r" % (data,))
    unknown = set(data) - _REQUEST_KEYS
    if unknown:
        raise InvalidRequest("unknown request keys: %s (known: %s)"
                             % (", ".join(sorted(unknown)), ", ".join(sorted(_REQUEST_KEYS))))
    shard_count = _with_alias(data, "shard_count", "shards", InvalidRequest, "replica request %r" % data.get("name"))
    for key, value in (("name", data.get("name")), ("shard_count", shard_count),
                       ("gpus_per_shard", data.get("gpus_per_shard"))):
        if value is None:
            raise InvalidRequest("a replica request needs %s" % key)
    try:
        request = Request(
            name=str(data["name"]), shard_count=int(shard_count), gpus_per_shard=int(data["gpus_per_shard"]),
            engine=data.get("engine"), model=data.get("model"), fabric=data.get("fabric") or None,
            avoid_nodes=frozenset(data.get("avoid_nodes") or ()), gpu_type=data.get("gpu_type") or None,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidRequest("replica request %r: %s" % (data.get("name"), exc))
    _check_request(request)
    return request


def _with_alias(data: Mapping, name: str, alias: str, error: type, what: str):
    """The value of ``name``, or of its alias ``alias`` when only that is given (None when neither is). Both
    given with different values is an ``error`` naming both."""
    value, aliased = data.get(name), data.get(alias)
    if value is None:
        return aliased
    if aliased is not None and _as_count(aliased) != _as_count(value):
        raise error("%s: %s %r and %s %r differ (%s is an alias of %s); give one"
                    % (what, name, value, alias, aliased, alias, name))
    return value


def _as_count(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def fleet_from_data(data) -> Fleet:
    """A fleet from ``{nodes: [...], replicas: [...]}`` (or a list of nodes), in the registry's shape: nodes with
    ``gpu_count`` (``gpus`` is an alias of it), ``state`` and optionally ``free_gpus`` (which reserves the rest of
    a node's GPUs that no listed replica holds), replicas with ``shard_count`` and a ``shards`` list."""
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
    given = "gpu_count" in data or "gpus" in data
    gpus = int(_with_alias(data, "gpu_count", "gpus", InvalidFleet, "node %s" % data.get("name")) if given else 0)
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
                reserved=reserved, engine_version=data.get("engine_version") or None)


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
