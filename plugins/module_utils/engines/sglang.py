# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang's launch flags, as the collection uses them.

Read from documentation and source, not from a running engine's ``--help`` (no SGLang runs on the lab):
``python/sglang/srt/server_args.py`` (``ServerArgs.add_cli_args``) at sgl-project/sglang main in 2026:
``--tensor-parallel-size``/``--tp-size``, ``--nnodes``, ``--node-rank``, ``--dist-init-addr`` (older alias
``--nccl-init-addr``, "will be removed"). SGLang's documentation writes ``--tp 2``: that works only because
argparse accepts an unambiguous prefix, and a prefix is exactly what a whole-flag check refuses, so the launcher
passes ``--tp-size``.
"""

from __future__ import annotations

ENGINE = "sglang"
VERSION = "sgl-project/sglang main 2026 (source, commit 469c63e5)"
SOURCE = "python/sglang/srt/server_args.py"
NORMALIZE_UNDERSCORES = False
BINARIES = {"server": "python3 -m sglang.launch_server"}
HELP_ARGV = {"python3 -m sglang.launch_server": ("--help",)}
HELP_LINES = {}
HELP_LAST_MARKER = {}
VERSION_COMMAND = ("python3", "-c", "import sglang; print(sglang.__version__)")

FLAGS = {
    BINARIES["server"]: {
        "--model-path": "model directory or hub id",
        "--host": "API address",
        "--port": "API port",
        "--served-model-name": "the model name clients ask for",
        "--tp-size": "tensor-parallel size across the whole replica (alias --tensor-parallel-size)",
        "--nnodes": "nodes in the replica",
        "--node-rank": "this node's rank (0 serves the API)",
        "--dist-init-addr": "rank 0's fabric address:port for the distributed init",
        "--context-length": "context length",
        "--max-running-requests": "requests in flight",
        "--mem-fraction-static": "share of GPU memory for weights and KV cache",
    },
}


def parse_version(text):
    """The first non-empty line the version command printed, or None."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return None
