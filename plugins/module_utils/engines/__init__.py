# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Engine flag tables, one module per engine, each naming the engine version it was read from."""

from __future__ import annotations

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import llama_cpp, sglang, vllm

ENGINES = {"llama.cpp": llama_cpp, "vllm": vllm, "sglang": sglang}


class UnknownEngineError(ValueError):
    """An engine name the collection has no flag table for."""


def get_engine(name):
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownEngineError("unknown engine %r (known: %s)" % (name, ", ".join(sorted(ENGINES))))
