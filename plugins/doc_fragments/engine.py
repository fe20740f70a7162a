# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment:
    # The options the engine_* modules share, stated once. engine_flags_check documents its own engine_dir (optional
    # there: without it the binaries are looked up on PATH); engine_completion_check and engine_speed_probe their
    # own timeout (per attempt, and per llama-bench run, each with a longer default).
    DOCUMENTATION = r"""
options:
  engine_dir:
    description:
      - The directory the engine was unpacked into (llama.cpp release layout, binaries and libraries flat;
        C(llama-server), C(llama-bench), C(ggml-rpc-server) and the C(libggml-cpu-*.so) CPU variants side by side).
    type: path
    required: true
"""

    # The node's name, which the messages of a check run on that node start with.
    NODE = r"""
options:
  node:
    description: The node's name, for the messages.
    type: str
    required: true
"""

    # How long one run of an engine binary (a check that loads its backends and exits) may take.
    TIMEOUT = r"""
options:
  timeout:
    description: Seconds each run of an engine binary may take; one that runs longer is stopped and reported.
    type: int
    default: 60
"""
