# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's speed against its own scalar baseline: the llama-bench command, its output read, and the verdict.

Pure: commands and text in, numbers and words out. The seed's costliest lesson was a node whose every number was
just small (kvm64: 6.7x slower generation, 18.9x slower prompt processing) while nothing looked broken; the probe
runs llama-bench twice on the same node, same threads, same model, once with the CPU backend llama.cpp picks and
once with the scalar ``x64`` one forced, and a backend that is not clearly faster than that baseline, or an engine
held to fewer threads than the node has vCPUs, is named with its numbers, the likely causes and the fix.
"""

from __future__ import annotations

import json
import statistics
from typing import List, Mapping, Optional, Sequence

BASELINE = "x64"
# Below this, the picked backend is not doing what SIMD is for: on this project's machines prompt processing with
# AVX2/AVX-512 runs 9x to 25x the scalar baseline (docs/bench.md), the seed's Xeon 18.9x.
MIN_PROMPT_RATIO = 2.0
# A node is compared with the ready nodes of the same CPU variant once there are this many of them, and is slow when
# its prompt tokens/s per thread fall below this share of their median: a node on the same silicon doing half the
# work per core is sharing or losing its cores, whatever its ratio to its own baseline says.
MIN_PEERS = 2
MIN_SHARE_OF_MEDIAN = 0.5
PROMPT_TOKENS = 128
GEN_TOKENS = 32
REPETITIONS = 2
_THREADS_FLAGS = ("-t", "--threads")


def threads_in(engine_args: Sequence[str]) -> Optional[int]:
    """The thread count llama-server's arguments set (``-t N`` / ``--threads N`` / ``--threads=N``), or None."""
    args = [str(a) for a in engine_args]
    for index, arg in enumerate(args):
        if arg in _THREADS_FLAGS and index + 1 < len(args):
            return int(args[index + 1])
        if arg.startswith("--threads="):
            return int(arg.split("=", 1)[1])
    return None


def bench_argv(binary: str, model: str, threads: int, engine_args: Sequence[str] = (),
               prompt_tokens: int = PROMPT_TOKENS, gen_tokens: int = GEN_TOKENS,
               repetitions: int = REPETITIONS) -> List[str]:
    """llama-bench with what llama-server would run with: its threads, and ``--no-repack`` as ``--repack 0``."""
    argv = [binary, "-m", model, "-p", str(prompt_tokens), "-n", str(gen_tokens), "-t", str(threads),
            "-r", str(repetitions), "-o", "json"]
    if "--no-repack" in [str(a) for a in engine_args]:
        argv += ["--repack", "0"]
    return argv


def parse_bench(stdout: str) -> dict:
    """{'pp': tokens/s, 'tg': tokens/s} from llama-bench's JSON output (one test of prompt, one of generation)."""
    rates = {}
    for test in json.loads(stdout[stdout.index("["):]):
        kind = "pp" if test.get("n_prompt") and not test.get("n_gen") else "tg"
        rates[kind] = float(test["avg_ts"])
    if set(rates) != {"pp", "tg"}:
        raise ValueError("llama-bench reported %s, not a prompt and a generation test" % sorted(rates))
    return rates


def measurement(variant: str, threads: int, vcpus: int, picked: Mapping, baseline: Mapping) -> dict:
    """What the registry keeps: both runs and their ratios (1.0 when the picked backend is the baseline itself)."""
    return {
        "variant": variant, "threads": threads, "vcpus": vcpus,
        "pp": round(picked["pp"], 1), "tg": round(picked["tg"], 1),
        "baseline_pp": round(baseline["pp"], 1), "baseline_tg": round(baseline["tg"], 1),
        "pp_ratio": round(picked["pp"] / baseline["pp"], 2) if baseline["pp"] else 0.0,
        "tg_ratio": round(picked["tg"] / baseline["tg"], 2) if baseline["tg"] else 0.0,
    }


def verdict(node: str, speed: Mapping, min_ratio: float = MIN_PROMPT_RATIO) -> List[str]:
    """The reasons the node's numbers are too small (empty when they are not), each with the numbers and the fix."""
    reasons = []
    if speed["pp_ratio"] < min_ratio:
        what = ("is the scalar baseline itself" if speed["variant"] == BASELINE
                else "is only %.1fx its own scalar baseline (%s)" % (speed["pp_ratio"], BASELINE))
        reasons.append(
            "%s runs prompts slowly: its CPU backend %s %s (%.0f vs %.0f tokens/s of prompt processing, generation "
            "%.0f vs %.0f, %d threads on %d vCPUs; a node is expected at %.1fx or more). Likely causes: the VM's "
            "CPU type hides the SIMD features llama.cpp uses (kvm64 or a migration-safe type such as x86-64-v2: "
            "set cpu: host), its cores are throttled or shared with busier VMs, or an engine argument such as "
            "--no-repack costs the fast kernels. Fix the cause and onboard again, or register it anyway with "
            "allow_slow_node=true" % (node, speed["variant"], what, speed["pp"], speed["baseline_pp"], speed["tg"],
                                      speed["baseline_tg"], speed["threads"], speed["vcpus"], min_ratio))
    if speed["threads"] < speed["vcpus"]:
        reasons.append(
            "%s: the engine runs %d thread%s where the node has %d vCPUs, so it uses %d%% of the node (%.0f tokens/s "
            "of prompt processing). Fix: run it with --threads %d (or drop the thread setting from the engine "
            "arguments), or give the VM the vCPUs the engine uses; allow_slow_node=true registers it anyway"
            % (node, speed["threads"], "" if speed["threads"] == 1 else "s", speed["vcpus"],
               100 * speed["threads"] // speed["vcpus"], speed["pp"], speed["vcpus"]))
    return reasons


def per_thread(speed: Mapping) -> float:
    """Prompt tokens/s per thread: the figure that compares nodes with different vCPU counts."""
    return speed["pp"] / speed["threads"] if speed.get("threads") else 0.0


def fleet_verdict(node: str, speed: Mapping, peers: Sequence[Mapping],
                  min_share: float = MIN_SHARE_OF_MEDIAN, min_peers: int = MIN_PEERS) -> List[str]:
    """Why the node is far slower per thread than the fleet's ready nodes of its CPU variant (empty when it is not,
    or when fewer than ``min_peers`` of them were measured). ``peers`` are other nodes' recorded measurements."""
    same = [per_thread(p) for p in peers if p and p.get("variant") == speed["variant"] and per_thread(p) > 0]
    if len(same) < min_peers:
        return []
    median = statistics.median(same)
    mine = per_thread(speed)
    if mine >= min_share * median:
        return []
    return [
        "%s runs prompts at %.1f tokens/s per thread, %d%% of the median %.1f of the fleet's %d ready %s nodes (a "
        "node is expected at %d%% or more). Likely causes: its cores are shared with busier VMs or throttled (CPU "
        "steal, a power-saving host), or its host is an older CPU of the same family. Fix: give the VM dedicated "
        "cores or move it to a quieter host and onboard again, or register it anyway with allow_slow_node=true"
        % (node, mine, int(100 * mine / median), median, len(same), speed["variant"], int(100 * min_share))]
