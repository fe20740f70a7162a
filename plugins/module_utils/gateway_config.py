# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The front door: from the fleet registry to one HAProxy 2.6 configuration for the whole fleet.

Pure: the registry's replicas and nodes (and the solver's view of them, :class:`placement.Fleet`) and a few
settings in; the HAProxy configuration, the API-key map and a Prometheus ``file_sd`` targets file out, as text.
``plugins/modules/gateway_config.py`` reads the registry and writes what this returns; ``roles/gateway`` installs
HAProxy, validates and reloads. Nothing here touches a file or a socket.

What is routed where:

* ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` go to the backend of the JSON body's
  ``"model"`` (``option http-buffer-request`` and the ``json_query`` converter). A model's servers are the
  leaders (rank 0) of its *servable* replicas only: recorded ``ready`` by the registry, not broken in the
  solver's own sense (:meth:`placement.Fleet.is_broken`: a shard on a lost node), with no shard on a draining
  node, with a leader address and port. Anything else (placing, starting, failed, short of shards, draining) is
  never a server; :func:`routes` says why for each replica it left out.
* ``GET /v1/models`` is answered by HAProxy itself: the models with at least one servable replica.
* Errors are OpenAI-shaped (``{"error": {"message", "type", "param", "code"}}``): no or a wrong Bearer key ->
  401; a model nobody serves -> 404 naming the models there are; a model the fleet knows but cannot serve now
  (no servable replica, or every server failing its active health check) -> 503 with ``Retry-After``.
* API keys are never in the configuration: the key map holds the SHA-256 of each key and the key's *name*, which
  is what the log shows (``client=<name>``). The Authorization header is removed before a request goes to a node.

Every name that reaches the configuration (models, replicas, key names, addresses, paths) is checked to be a
safe token first; :class:`GatewayConfigError` names the field, the value and the fix.

The parts, each private (this module is the one callers import, and re-exports their public names):
:mod:`_gateway_checks` (the checks of every input, :class:`Settings`), :mod:`_gateway_haproxy` (the HAProxy
configuration's text); the routing (:func:`servable`, :func:`routes`, :func:`read_routes`), the ``fleet status``
lines, the key map and the Prometheus targets are here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_service, placement
from ansible_collections.llmgw.fleet.plugins.module_utils._gateway_checks import (
    HOST_RE,
    KEY_NAME_RE,
    KEY_RE,
    LOG_RE,
    MIN_KEY_LENGTH,
    MODEL_RE,
    PATH_RE,
    REPLICA_RE,
    GatewayConfigError,
    Settings,
    check_api_keys,
    check_host,
    check_model,
    check_path,
    check_port,
    check_positive,
    check_replica_name,
    key_digest,
)
from ansible_collections.llmgw.fleet.plugins.module_utils._gateway_haproxy import (
    BACKEND_PREFIX,
    HEADER,
    REGISTRY_LINE,
    REPLICA_HEADER,
    ROUTED_PATHS,
    backend_name,
    models_listing,
    openai_error,
    registry_of,
    render,
)

__all__ = ["BACKEND_PREFIX", "HEADER", "HOST_RE", "KEY_NAME_RE", "KEY_RE", "LOG_RE", "MIN_KEY_LENGTH", "MODEL_RE",
           "PATH_RE", "REGISTRY_LINE", "REPLICA_HEADER", "REPLICA_RE", "ROUTED_PATHS", "GatewayConfigError",
           "Routes", "Server", "Settings", "backend_name", "check_api_keys", "check_host", "check_model",
           "check_path", "check_port", "check_positive", "check_replica_name", "file_sd", "key_digest", "keys_map",
           "model_lines", "models_listing", "openai_error", "read_routes", "registry_of", "render", "routes",
           "servable", "server_sessions"]


# -- from the registry to routes -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Server:
    """One replica's leader, as a server of its model's backend."""

    replica: str
    model: str
    node: str
    address: str
    port: int

    @property
    def target(self) -> str:
        host = "[%s]" % self.address if ":" in self.address else self.address
        return "%s:%d" % (host, self.port)


@dataclasses.dataclass(frozen=True)
class Routes:
    """What the gateway routes: servers per served model, the models known but not servable, and why each
    replica left out was left out."""

    served: Mapping[str, Tuple[Server, ...]]
    unavailable: Tuple[str, ...]
    excluded: Tuple[Mapping[str, str], ...]
    nodes: Tuple[Mapping, ...] = ()

    @property
    def models(self) -> List[str]:
        return sorted(self.served)

    def to_dict(self) -> dict:
        return {
            "models": self.models,
            "unavailable_models": list(self.unavailable),
            "backends": {model: [dataclasses.asdict(s) for s in servers] for model, servers in
                         sorted(self.served.items())},
            "excluded": [dict(e) for e in self.excluded],
        }


def servable(replica: Mapping, fleet: placement.Fleet, nodes: Mapping[str, Mapping]) -> Optional[str]:
    """None when the replica may be a server; else why not. Ready and whole are the registry's and the solver's
    own notions (the recorded state, :meth:`placement.Fleet.is_broken`), not re-derived here."""
    if replica.get("state") != "ready":
        return "state %s, not ready" % replica.get("state")
    solver_replica = fleet.replicas.get(replica["name"])
    if solver_replica is None or not replica.get("shards"):
        return "holds no shards"
    if fleet.is_broken(solver_replica):
        return "broken: %s" % fleet.broken_reason(solver_replica)
    if len(replica["shards"]) < replica["shard_count"]:
        return "holds %d of its %d shards" % (len(replica["shards"]), replica["shard_count"])
    draining = sorted(s["node"] for s in replica["shards"] if (nodes.get(s["node"]) or {}).get("state") == "draining")
    if draining:
        return "on draining node %s (drained: no new requests)" % ", ".join(draining)
    leader = next((s for s in replica["shards"] if s["rank"] == 0), None)
    if leader is None:
        return "has no rank 0"
    if not leader.get("address"):
        return "its leader node %s has no address" % leader["node"]
    if not replica.get("port"):
        return "has no port recorded"
    return None


def routes(replicas: Sequence[Mapping], nodes: Sequence[Mapping], fleet: placement.Fleet,
           declared_models: Iterable[str] = (), leave_out: Iterable[str] = ()) -> Routes:
    """Servers per model from the registry's replicas (as :meth:`FleetRegistry.list_replicas` returns them),
    its nodes and the solver's fleet (:func:`fleet_service.to_fleet` of the two). ``declared_models`` (the keys of
    ``fleet_models``) are known even with no replica at all: asked for, they answer 503, not 404. Replicas in
    ``leave_out`` (about to be removed, drained first) are never servers."""
    leave_out = {check_replica_name(name, "drain") for name in leave_out}
    by_node = {n["name"]: n for n in nodes}
    served: Dict[str, List[Server]] = {}
    known = set()
    excluded = []
    for model in declared_models:
        known.add(check_model(model, "fleet_models"))
    for replica in sorted(replicas, key=lambda r: r["name"]):
        name = check_replica_name(replica["name"], "replicas.name")
        model = check_model(replica["model"], "replicas[%s].model" % name)
        known.add(model)
        why = "being removed (drained at the gateway)" if name in leave_out else servable(replica, fleet, by_node)
        if why is not None:
            excluded.append({"replica": name, "model": model, "why": why})
            continue
        leader = next(s for s in replica["shards"] if s["rank"] == 0)
        server = Server(replica=name, model=model, node=leader["node"],
                        address=check_host(leader["address"], "nodes[%s].address" % leader["node"]),
                        port=check_port(replica["port"], "replicas[%s].port" % name))
        served.setdefault(model, []).append(server)
    for node in nodes:
        if node.get("address"):
            check_host(node["address"], "nodes[%s].address" % node["name"])
    return Routes(served={m: tuple(s) for m, s in sorted(served.items())},
                  unavailable=tuple(sorted(known - set(served))), excluded=tuple(excluded),
                  nodes=tuple(sorted((dict(n) for n in nodes), key=lambda n: n["name"])))


def read_routes(registry, declared_models: Iterable[str] = (), leave_out: Iterable[str] = ()) -> Routes:
    """:func:`routes` over one consistent read of a :class:`fleet_registry.FleetRegistry`."""
    with registry.snapshot_read():
        replicas = registry.list_replicas()
        nodes = registry.list_nodes()
    fleet = fleet_service.to_fleet(nodes, replicas)
    return routes(replicas, nodes, fleet, declared_models, leave_out)


def model_lines(fleet_routes: Routes, gateway_url: Optional[str] = None) -> List[str]:
    """The ``fleet status`` view of the models: for each, its Ready replicas' leaders (what the gateway routes
    to) and the one URL clients use, or why none is served."""
    lines = ["MODELS"]
    if not fleet_routes.served and not fleet_routes.unavailable:
        return lines + ["  (none)"]
    through = ("%s/v1" % gateway_url.rstrip("/")) if gateway_url else "(no gateway given: --gateway URL)"
    for model in sorted(set(fleet_routes.served) | set(fleet_routes.unavailable)):
        servers = fleet_routes.served.get(model, ())
        if servers:
            lines.append("  %s: %d Ready replica(s), through the gateway %s; leaders %s" % (
                model, len(servers), through,
                ", ".join("http://%s (%s)" % (s.target, s.replica) for s in servers)))
        else:
            lines.append("  %s: no Ready replica (the gateway answers 503)" % model)
    lines.extend("  not routed: %s (%s): %s" % (e["replica"], e["model"], e["why"]) for e in fleet_routes.excluded)
    return lines


def server_sessions(show_stat: str) -> Dict[Tuple[str, str], int]:
    """{(backend, server): current sessions} from the runtime API's ``show stat`` (CSV, its first line the
    ``# pxname,svname,...`` header); the frontend and backend rows are left out."""
    lines = show_stat.splitlines()
    if not lines or not lines[0].startswith("# "):
        return {}
    columns = lines[0][2:].split(",")
    out = {}
    for line in lines[1:]:
        row = dict(zip(columns, line.split(",")))
        if row.get("svname") in (None, "", "FRONTEND", "BACKEND"):
            continue
        out[(row["pxname"], row["svname"])] = int(row.get("scur") or 0)
    return out


# -- the key map and the Prometheus targets ----------------------------------------------------------------


def keys_map(api_keys: Mapping[str, str]) -> str:
    """``<sha256 of the key> <name>`` per line: the gateway never holds a key itself."""
    keys = check_api_keys(api_keys)
    return "".join("%s %s\n" % (key_digest(key), name) for name, key in sorted(keys.items(), key=lambda i: i[1]))


def file_sd(fleet_routes: Routes, gateway_target: Optional[str] = None, node_exporter_port: Optional[int] = 9100,
            labels: Optional[Mapping[str, str]] = None) -> str:
    """A Prometheus ``file_sd`` targets file (JSON): the gateway's exporter, each servable leader's
    ``/metrics`` (llama-server with ``--metrics``), and each node's exporter on ``node_exporter_port``."""
    extra = dict(labels or {})
    groups = []
    if gateway_target:
        host, _sep, port = gateway_target.rpartition(":")
        check_host(host.strip("[]"), "gateway_target")
        check_port(int(port) if port.isdigit() else port, "gateway_target port")
        groups.append({"targets": [gateway_target], "labels": dict(extra, job="llmgw-gateway")})
    for model in fleet_routes.models:
        for server in fleet_routes.served[model]:
            groups.append({"targets": [server.target], "labels": dict(
                extra, job="llmgw-replica", model=model, replica=server.replica, node=server.node)})
    if node_exporter_port:
        check_port(node_exporter_port, "node_exporter_port")
        for node in fleet_routes.nodes:
            if node.get("address"):
                host = "[%s]" % node["address"] if ":" in node["address"] else node["address"]
                groups.append({"targets": ["%s:%d" % (host, node_exporter_port)], "labels": dict(
                    extra, job="llmgw-node", node=node["name"], fabric=node["fabric"], state=node["state"])})
    return json.dumps(groups, indent=2, sort_keys=True) + "\n"
