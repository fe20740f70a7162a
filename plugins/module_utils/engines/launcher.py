# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The command line each rank of a replica runs, for each engine. Pure: a spec in, argv lists out.

Rank 0 serves the API; the other ranks only join. ``widest_commands(engine)`` is the command set with every
optional flag the collection may pass, on a multi-node replica: what the engine flags check runs against the
engine's ``--help`` (a flag that only a multi-node launch passes is the one nobody notices has gone).
"""

from __future__ import annotations

import shlex

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import get_engine


class LaunchSpecError(ValueError):
    """A replica spec the launcher cannot turn into commands."""


DEFAULTS = {
    "host": "0.0.0.0",
    "port": 8080,
    "rpc_port": 50052,
    "master_port": 29501,
    "dist_init_port": 25000,
}


def _opt(argv, flag, value):
    if value is not None:
        argv.extend([flag, str(value)])


def _nodes(spec):
    nodes = spec.get("nodes") or []
    if not nodes:
        raise LaunchSpecError("a replica needs at least one node (nodes: [{name, address}, ...])")
    for i, node in enumerate(nodes):
        if not node.get("address"):
            raise LaunchSpecError("node %d (%s) has no fabric address" % (i, node.get("name", "?")))
    return nodes


def _rank(rank, node, binary, argv, serves):
    return {"rank": rank, "node": node.get("name"), "binary": binary, "argv": argv, "serves_api": serves,
            "command": " ".join(shlex.quote(a) for a in argv)}


def llama_cpp_commands(spec):
    """Rank 0: llama-server (with --rpc to the others); ranks 1..N-1: ggml-rpc-server bound to the fabric address."""
    table = get_engine("llama.cpp")
    nodes = _nodes(spec)
    bin_dir = spec.get("bin_dir") or ""
    server = table.BINARIES["server"]
    worker = table.BINARIES["rpc_worker"]
    rpc_port = spec.get("rpc_port", DEFAULTS["rpc_port"])
    ranks = []
    argv = [_join(bin_dir, server),
            "--host", str(spec.get("host", DEFAULTS["host"])),
            "--port", str(spec.get("port", DEFAULTS["port"])),
            "--model", spec["model"],
            "--metrics"]  # /metrics for Prometheus, listed in the gateway's file_sd targets
    _opt(argv, "--alias", spec.get("alias"))
    _opt(argv, "--ctx-size", spec.get("context"))
    _opt(argv, "--parallel", spec.get("parallel"))
    _opt(argv, "--threads", spec.get("threads"))
    _opt(argv, "--n-gpu-layers", spec.get("gpu_layers"))
    if len(nodes) > 1:
        argv.extend(["--rpc", ",".join("%s:%s" % (n["address"], rpc_port) for n in nodes[1:])])
    # What onboarding found this node's llama-server needs (the registry's engine_args), e.g. --no-repack.
    argv.extend(str(a) for a in nodes[0].get("engine_args") or [])
    ranks.append(_rank(0, nodes[0], server, argv, True))
    for rank, node in enumerate(nodes[1:], start=1):
        # Upstream calls the RPC backend insecure: it listens on the fabric address only, never 0.0.0.0.
        wargv = [_join(bin_dir, worker), "--host", node["address"], "--port", str(rpc_port)]
        _opt(wargv, "--threads", spec.get("threads"))
        ranks.append(_rank(rank, node, worker, wargv, False))
    return ranks


def vllm_commands(spec):
    """Every rank runs ``vllm serve`` with the same parallel layout; ranks other than 0 add --headless."""
    table = get_engine("vllm")
    nodes = _nodes(spec)
    ranks = []
    for rank, node in enumerate(nodes):
        argv = [table.BINARIES["server"], "serve", spec["model"],
                "--host", str(spec.get("host", DEFAULTS["host"])),
                "--port", str(spec.get("port", DEFAULTS["port"]))]
        _opt(argv, "--served-model-name", spec.get("alias"))
        _opt(argv, "--tensor-parallel-size", spec.get("gpus_per_node", 1))
        _opt(argv, "--pipeline-parallel-size", len(nodes))
        _opt(argv, "--max-model-len", spec.get("context"))
        _opt(argv, "--max-num-seqs", spec.get("parallel"))
        _opt(argv, "--gpu-memory-utilization", spec.get("gpu_memory_utilization"))
        if len(nodes) > 1:
            argv.extend(["--distributed-executor-backend", "mp",
                         "--nnodes", str(len(nodes)), "--node-rank", str(rank),
                         "--master-addr", nodes[0]["address"],
                         "--master-port", str(spec.get("master_port", DEFAULTS["master_port"]))])
            if rank:
                argv.append("--headless")
        ranks.append(_rank(rank, node, table.BINARIES["server"], argv, rank == 0))
    return ranks


def sglang_commands(spec):
    """Every rank runs the same server with its --node-rank; --tp-size spans the whole replica."""
    table = get_engine("sglang")
    nodes = _nodes(spec)
    ranks = []
    for rank, node in enumerate(nodes):
        argv = shlex.split(table.BINARIES["server"]) + [
            "--model-path", spec["model"],
            "--host", str(spec.get("host", DEFAULTS["host"])),
            "--port", str(spec.get("port", DEFAULTS["port"]))]
        _opt(argv, "--served-model-name", spec.get("alias"))
        _opt(argv, "--tp-size", spec.get("gpus_per_node", 1) * len(nodes))
        _opt(argv, "--context-length", spec.get("context"))
        _opt(argv, "--max-running-requests", spec.get("parallel"))
        _opt(argv, "--mem-fraction-static", spec.get("gpu_memory_utilization"))
        if len(nodes) > 1:
            argv.extend(["--nnodes", str(len(nodes)), "--node-rank", str(rank),
                         "--dist-init-addr", "%s:%s" % (nodes[0]["address"],
                                                        spec.get("dist_init_port", DEFAULTS["dist_init_port"]))])
        ranks.append(_rank(rank, node, table.BINARIES["server"], argv, rank == 0))
    return ranks


def sim_commands(spec):
    """The simulated engine (``roles/replica/files/llmgw-sim-engine.py``): rank 0 binds the rendezvous port on its
    fabric address and serves HTTP only once every other rank has joined; the other ranks connect and serve
    nothing."""
    nodes = _nodes(spec)
    binary = spec.get("sim_engine") or SIM_ENGINE
    port = spec.get("port", DEFAULTS["port"])
    rendezvous = spec.get("rendezvous_port", DEFAULTS["rpc_port"])
    ranks = []
    for rank, node in enumerate(nodes):
        argv = [spec.get("python") or "python3", binary,
                "--replica", str(spec.get("alias") or spec["model"]),
                "--model", spec["model"],
                "--rank", str(rank), "--shards", str(len(nodes)),
                "--leader", "%s:%s" % (nodes[0]["address"], rendezvous),
                "--bind", node["address"]]
        if rank == 0:
            argv.extend(["--host", str(spec.get("host", DEFAULTS["host"])), "--port", str(port)])
        ranks.append(_rank(rank, node, binary, argv, rank == 0))
    return ranks


# Engines with a flag table (checked against the engine's --help); the simulated engine has none: its flags are
# its own, tested with it.
BUILDERS = {"llama.cpp": llama_cpp_commands, "vllm": vllm_commands, "sglang": sglang_commands}
SIM_ENGINE = "/usr/local/bin/llmgw-sim-engine.py"
ALIASES = {"llama_cpp": "llama.cpp", "llamacpp": "llama.cpp"}


def canonical_engine(engine):
    """``llama_cpp`` (the registry's spelling in some playbooks) and ``llama.cpp`` are one engine."""
    return ALIASES.get(engine, engine)


def commands(engine, spec):
    engine = canonical_engine(engine)
    if engine != "sim" and engine not in BUILDERS:
        raise LaunchSpecError("unknown engine %r (known: %s)" % (engine, ", ".join(sorted(BUILDERS) + ["sim"])))
    if not spec.get("model"):
        raise LaunchSpecError("a replica needs a model")
    return sim_commands(spec) if engine == "sim" else BUILDERS[engine](spec)


# Every optional value set, three nodes: the widest command set the launcher produces.
WIDEST_SPEC = {
    "model": "/srv/models/model.gguf",
    "alias": "model",
    "host": "10.77.0.101",
    "port": 8080,
    "context": 8192,
    "parallel": 4,
    "threads": 8,
    "gpu_layers": 99,
    "gpus_per_node": 8,
    "gpu_memory_utilization": 0.9,
    "nodes": [{"name": "node01", "address": "10.77.0.101", "engine_args": ["--no-repack"]},
              {"name": "node02", "address": "10.77.0.102"},
              {"name": "node03", "address": "10.77.0.103"}],
}


def widest_commands(engine, **overrides):
    spec = dict(WIDEST_SPEC, **overrides)
    return commands(engine, spec)


def flags_by_binary(engine, **overrides):
    """{binary: [flags...]}: every flag the widest command set passes to each binary, in order of appearance."""
    from ansible_collections.llmgw.fleet.plugins.module_utils.engines.flag_check import flags_of_argv

    result = {}
    for rank in widest_commands(engine, **overrides):
        skip = len(shlex.split(rank["binary"])) - 1  # "python3 -m sglang.launch_server": flags start after it
        flags = result.setdefault(rank["binary"], [])
        for flag in flags_of_argv(rank["argv"][skip:]):
            if flag not in flags:
                flags.append(flag)
    return result


def _join(bin_dir, name):
    return (bin_dir.rstrip("/") + "/" + name) if bin_dir else name
