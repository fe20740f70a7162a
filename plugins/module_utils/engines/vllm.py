# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's launch flags, as the collection uses them.

Read from documentation, not from a running engine's ``--help`` (no vLLM runs on the lab): vLLM's
``vllm/config/parallel.py`` (``master_addr``, ``master_port``, ``node_rank``, ``nnodes``: multi-node with the
``mp`` executor) and ``docs/serving/parallelism_scaling.md`` ("Running vLLM with MultiProcessing", added by
vllm-project/vllm#30509, December 2025: ``--nnodes --node-rank --master-addr`` on every node, ``--headless`` on
the others), both at vllm-project/vllm main in 2026. ``vllm serve --help`` is abridged: the full list is
``vllm serve --help=all``. ``_`` and ``-`` are interchangeable in vLLM's flag names.
"""

from __future__ import annotations

ENGINE = "vllm"
VERSION = "vllm-project/vllm main 2026 (docs; multi-node mp documented since vllm-project/vllm#30509)"
SOURCE = "vllm/config/parallel.py, docs/serving/parallelism_scaling.md (vllm-project/vllm#30509)"
NORMALIZE_UNDERSCORES = True
BINARIES = {"server": "vllm"}
# Per binary: arguments that print the full help. No measured help text yet, so no line count or end marker.
HELP_ARGV = {"vllm": ("serve", "--help=all")}
HELP_LINES = {}
HELP_LAST_MARKER = {}
VERSION_COMMAND = ("vllm", "--version")

FLAGS = {
    BINARIES["server"]: {
        "--host": "address the OpenAI-compatible API listens on",
        "--port": "API port",
        "--served-model-name": "the model name clients ask for",
        "--tensor-parallel-size": "GPUs per node the model is split across (alias -tp)",
        "--pipeline-parallel-size": "pipeline stages, one per node here (alias -pp)",
        "--nnodes": "nodes in the replica (multi-node with the mp executor)",
        "--node-rank": "this node's rank (0 serves the API)",
        "--master-addr": "rank 0's fabric address",
        "--master-port": "rank 0's rendezvous port",
        "--headless": "ranks other than 0: run workers, serve no API",
        "--max-model-len": "context length",
        "--max-num-seqs": "sequences in flight",
        "--gpu-memory-utilization": "share of GPU memory vLLM may take",
        "--distributed-executor-backend": "ray or mp (the launcher uses mp: no Ray cluster to run)",
    },
}


def parse_version(text):
    """The first non-empty line the version command printed, or None."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return None
