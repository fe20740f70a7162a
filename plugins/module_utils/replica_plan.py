# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""From a replica as the registry records it to what runs on its nodes: one systemd unit per shard.

Pure: the registry's replica record and a few paths in, the units' names, environments, command lines and the
leader's endpoints out. ``roles/replica`` writes and starts what this returns; nothing here touches a node.

Ports: each replica has a port (rank 0's API) and the port after it (the rendezvous of the simulated engine,
``ggml-rpc-server`` on llama.cpp's workers, vLLM's master port, SGLang's dist-init port). ``choose_port`` keeps a
replica's recorded port unless another replica with a shard on one of its nodes holds it: a replica moved to a
fabric where another one already serves on 8080 gets the next free pair.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Mapping, Optional

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import launcher

UNIT_PREFIX = "llmgw-shard"
BASE_PORT = 8080
PORT_STEP = 2
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")
# Engines whose every rank loads the weights (llama.cpp's RPC workers receive tensors from rank 0 instead).
EVERY_RANK_LOADS = ("vllm", "sglang", "sim")


class ReplicaPlanError(ValueError):
    """A replica record that cannot be launched (no shards, an unknown engine, a node without an address)."""


def unit_name(replica: str, rank: int) -> str:
    return "%s-%s-%d.service" % (UNIT_PREFIX, replica, rank)


def ports_in_use(replica: Mapping, replicas: Iterable[Mapping]) -> set:
    """Port pairs held by other replicas that share a node with this one."""
    nodes = {s["node"] for s in replica.get("shards", [])}
    used = set()
    for other in replicas:
        if other["name"] == replica["name"] or not other.get("port"):
            continue
        if nodes & {s["node"] for s in other.get("shards", [])}:
            used.update((other["port"], other["port"] + 1))
    return used


def choose_port(replica: Mapping, replicas: Iterable[Mapping], base: int = BASE_PORT) -> int:
    used = ports_in_use(replica, replicas)
    current = replica.get("port")
    if current and current not in used and current + 1 not in used:
        return current
    port = base
    while port in used or port + 1 in used:
        port += PORT_STEP
    if port + 1 > 65535:
        raise ReplicaPlanError("no free port pair from %d for replica %s" % (base, replica["name"]))
    return port


def systemd_quote(word: str) -> str:
    """One argument of ExecStart= (or Environment=): quoted when it must be, with systemd's specifiers (%) escaped
    and control characters written as C escapes (systemd.syntax(7)), so that a value with a line break cannot start
    a new line, and so a new directive, in the unit file."""
    word = str(word).replace("%", "%%")
    if word and not re.search(r"[\s\"'\\;$\x00-\x1f\x7f]", word):
        return word
    word = word.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$")
    return '"%s"' % re.sub(r"[\x00-\x1f\x7f]", lambda m: "\\x%02x" % ord(m.group()), word)


def plan_units(replica: Mapping, model_path: Optional[str] = None, engine_dir: str = "",
               sim_engine: str = launcher.SIM_ENGINE, python: str = "/usr/bin/python3",
               port: Optional[int] = None) -> dict:
    """The units of a placed replica, and where its leader answers.

    ``model_path`` is where the model file lies on the nodes that need it (None: the model's name is passed,
    as vLLM or SGLang take a hub id and the simulated engine a label).
    """
    name = replica["name"]
    if not NAME_RE.match(name):
        raise ReplicaPlanError("replica name %r must be lower case letters, digits and hyphens (at most 42)" % name)
    engine = launcher.canonical_engine(replica["engine"])
    shards = sorted(replica.get("shards") or [], key=lambda s: s["rank"])
    if len(shards) != replica["shard_count"]:
        raise ReplicaPlanError("replica %s holds %d of its %d shards: place or repair it first"
                               % (name, len(shards), replica["shard_count"]))
    port = port or replica.get("port") or BASE_PORT
    options = dict(replica.get("options") or {})
    nodes = [{"name": s["node"], "address": s["address"], "engine_args": list(s.get("engine_args") or [])}
             for s in shards]
    spec = {
        "model": model_path or replica["model"], "alias": replica["model"] if engine != "sim" else name,
        "port": port, "rpc_port": port + 1, "rendezvous_port": port + 1, "master_port": port + 1,
        "dist_init_port": port + 1, "nodes": nodes, "bin_dir": engine_dir, "sim_engine": sim_engine,
        "python": python, "gpus_per_node": max(replica["gpus_per_shard"], 1),
    }
    for key in ("context", "parallel", "threads", "gpu_layers", "gpu_memory_utilization"):
        if options.get(key) is not None:
            spec[key] = options[key]
    if engine == "llama.cpp" and len(nodes) > 1 and "gpu_layers" not in spec:
        spec["gpu_layers"] = 99  # offload every layer to the RPC devices, or the workers would hold nothing
    if engine == "sim":
        spec["model"] = replica["model"]
    try:
        commands = launcher.commands(engine, spec)
    except launcher.LaunchSpecError as exc:
        raise ReplicaPlanError("replica %s: %s" % (name, exc))
    leader = shards[0]
    units = []
    for shard, command in zip(shards, commands):
        environment = {
            "LLMGW_REPLICA": name,
            "LLMGW_MODEL": replica["model"],
            "LLMGW_ENGINE": engine,
            "LLMGW_RANK": str(shard["rank"]),
            "LLMGW_SHARDS": str(replica["shard_count"]),
            "LLMGW_LEADER_ADDRESS": leader["address"],
            "LLMGW_PORT": str(port),
            "LLMGW_RENDEZVOUS_PORT": str(port + 1),
            "LLMGW_BIND_ADDRESS": shard["address"],
        }
        if shard.get("gpus"):
            environment["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in shard["gpus"])
        units.append({
            "rank": shard["rank"], "node": shard["node"], "address": shard["address"],
            "gpus": list(shard.get("gpus") or []), "unit": unit_name(name, shard["rank"]),
            "environment": environment, "argv": command["argv"], "command": command["command"],
            "exec_start": " ".join(systemd_quote(a) for a in command["argv"]),
            "serves_api": command["serves_api"],
            "listens": [port] if command["serves_api"] else [],
            "needs_model": bool(model_path) and (shard["rank"] == 0 or engine in EVERY_RANK_LOADS),
        })
    for unit in units:
        unit["unit_text"] = unit_text(unit)
    base = "http://%s:%d" % (leader["address"], port)
    return {
        "replica": name, "engine": engine, "model": replica["model"], "port": port, "rendezvous_port": port + 1,
        "leader": {"node": leader["node"], "address": leader["address"], "unit": units[0]["unit"],
                   "health_url": base + "/health", "completion_url": base + "/v1/completions"},
        "units": units,
        # Workers first, the leader last: it waits for them (rendezvous) or connects to them (--rpc).
        "start_order": [u["rank"] for u in units[1:]] + [0],
    }


def unit_text(unit: Mapping, description: str = "", user: str = "root") -> str:
    """The systemd unit file for one shard (what the role's template writes; here for tests and docs)."""
    lines = ["[Unit]", "Description=%s" % (description or "llmgw %s rank %s" % (
        unit["environment"]["LLMGW_REPLICA"], unit["rank"])), "After=network-online.target",
        "Wants=network-online.target", "", "[Service]", "Type=simple", "User=%s" % user]
    lines += ["Environment=%s" % systemd_quote("%s=%s" % kv) for kv in sorted(unit["environment"].items())]
    lines += ["ExecStart=%s" % unit["exec_start"], "Restart=no", "", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def shard_names(units: List[Mapping]) -> Dict[int, str]:
    return {u["rank"]: "rank %d on %s (%s)" % (u["rank"], u["node"], u["unit"]) for u in units}
