# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does llama-server answer a completion on a quantized model here, and with which extra arguments? Pure: the
attempts a node made in, the verdict out (``engine_completion_check`` runs the attempts).

Why a completion and not only ``--list-devices``: a CPU backend can load and still die on the first quantized
matrix multiply. Measured on a KVM guest that advertises ``amx_tile``/``amx_int8`` (and grants the AMX
permission): the ``sapphirerapids`` variant loads, then llama-server dies with SIGILL on ``tileloadd`` as soon as a
Q4_0 or Q4_K weight goes through the AMX buffer type. F32 weights never reach that code, so an F32 test model
passes. ``--no-repack`` keeps the weights in their file layout (no extra buffer types, so no AMX tiles): the node
then serves, slower at prompt processing than a CPU whose AMX works, much faster than the x64 baseline.
"""

from __future__ import annotations

from typing import List, Mapping, Sequence

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import runtime

AMX_VARIANTS = ("sapphirerapids",)
# What each fallback the engine role tries (engine_completion_fallbacks) costs, for the warning.
FALLBACK_MEANING = {
    ("--no-repack",): "weights are used as stored, without repacking for this CPU's kernels (the AMX tile code is "
                      "never reached; prompt processing is slower than with working AMX)",
}


def crashed(attempt: Mapping) -> bool:
    """Killed by a signal: the case other arguments may cure (a timeout or an HTTP error is not)."""
    return not attempt.get("answered") and runtime.signal_name(attempt.get("rc")) is not None


def describe_attempt(attempt: Mapping) -> str:
    """One attempt's failure in words: a signal, an exit status, or what the HTTP side saw."""
    variant = attempt.get("variant")
    who = "llama-server (%s, %s)" % ("%s CPU backend" % variant if variant else "CPU backend unknown",
                                     " ".join(attempt.get("args") or []) or "no extra arguments")
    if runtime.signal_name(attempt.get("rc")) == "SIGILL" and variant in AMX_VARIANTS:
        return ("%s crashed with SIGILL: the CPU advertises every feature %s needs, yet one of its instructions "
                "faults (AMX tile instructions do under some hypervisors)" % (who, variant))
    crash = runtime.describe_crash(who, attempt.get("rc"))
    if crash:
        return crash
    if attempt.get("rc") is not None:
        return "%s exited with status %s" % (who, attempt["rc"])
    return "%s: %s" % (who, attempt.get("error") or "no answer")


def verdict(node: str, model: str, attempts: Sequence[Mapping]) -> dict:
    """``attempts``: [{args, answered, rc, error, variant, log_tail}], the plain command first.

    Returns ``{engine_args, warnings, problem}``: the arguments of the first attempt that answered (``problem``
    None), or every failure named (``engine_args`` None).
    """
    if not attempts:
        raise ValueError("verdict needs at least the plain attempt")
    failures: List[str] = []
    for attempt in attempts:
        if attempt.get("answered"):
            args = list(attempt.get("args") or [])
            warnings = []
            if failures:
                meaning = FALLBACK_MEANING.get(tuple(args), "")
                warnings.append(
                    "%s: llama-server failed a completion on the quantized probe %s: %s; it answers with %s, so the "
                    "node is registered with engine_args %s, which every llama-server launched there from now on "
                    "gets%s"
                    % (node, model, "; ".join(failures), " ".join(args), args, ": " + meaning if meaning else ""))
            return {"engine_args": args, "warnings": warnings, "problem": None}
        failures.append(describe_attempt(attempt))
    last_log = (attempts[-1].get("log_tail") or "").strip()
    return {
        "engine_args": None, "warnings": [],
        "problem": "%s: llama-server did not answer a completion on the quantized probe %s: %s%s"
                   % (node, model, "; ".join(failures), (". Last log lines: " + last_log) if last_log else ""),
    }
