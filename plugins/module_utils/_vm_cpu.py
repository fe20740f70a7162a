# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CPU model rules: a ``cpu`` value read and compared as PVE means it (a missing one is ``kvm64``), and the
models that hide AVX2/FMA from llama.cpp refused unless allowed.

Private to :mod:`vm_plan` (which re-exports the public names); pure: no I/O.
"""

from __future__ import annotations

from ansible_collections.llmgw.fleet.plugins.module_utils._vm_address import PlanError
from ansible_collections.llmgw.fleet.plugins.module_utils.ggml_cpu_variants import PVE_CPU_MODEL_VARIANT, SLOW_VARIANTS

PVE_DEFAULT_CPU = "kvm64"

# What llama.cpp's CPU backend loader picks under each slow model: it scores every libggml-cpu-*.so and a
# variant scores 0 when a feature it was built for is missing (ggml-backend-reg.cpp, cpu-feats.cpp).
# The CPU models whose guests load a slow variant: one table of models (ggml_cpu_variants), not two.
SLOW_CPU_VARIANTS = {model: variant for model, variant in PVE_CPU_MODEL_VARIANT.items() if variant in SLOW_VARIANTS}
# Measured on one VM, same weights and threads, the only change being cpu: host (the project's seed).
SLOW_GENERATION_FACTOR = "6.7x"
SLOW_PROMPT_FACTOR = "18.9x"


def cpu_model(cpu):
    """The model of a ``cpu`` config value (``cputype=host,flags=+aes`` -> ``host``); None -> ``kvm64``."""
    if cpu is None or str(cpu).strip() == "":
        return PVE_DEFAULT_CPU
    first = str(cpu).split(",", 1)[0].strip()
    if first.startswith("cputype="):
        first = first[len("cputype=") :]
    return first or PVE_DEFAULT_CPU


def normalize_cpu(cpu):
    """Comparable form of a ``cpu`` value: explicit model first, options sorted."""
    if cpu is None or str(cpu).strip() == "":
        return PVE_DEFAULT_CPU
    parts = [p.strip() for p in str(cpu).split(",") if p.strip()]
    options = sorted(p for p in parts[1:])
    return ",".join([cpu_model(cpu)] + options)


def slow_cpu_variant(cpu):
    """The llama.cpp CPU variant a slow model leaves, or None when the model is not one of the slow ones."""
    return SLOW_CPU_VARIANTS.get(cpu_model(cpu))


def slow_cpu_warning(cpu):
    """The warning for a slow CPU model (None when the model is fine)."""
    variant = slow_cpu_variant(cpu)
    if variant is None:
        return None
    return (
        "cpu %s hides AVX2/FMA from the guest: llama.cpp will load libggml-cpu-%s.so instead of the variant "
        "built for the host's instruction set. Measured on the same weights and threads against cpu host: "
        "%s slower generation, %s slower prompt processing. Use cpu: host unless the VM must live-migrate "
        "between different CPUs." % (cpu_model(cpu), variant, SLOW_GENERATION_FACTOR, SLOW_PROMPT_FACTOR)
    )


def check_cpu(cpu, allow_slow_cpu=False):
    """Refuse a slow CPU model unless explicitly allowed; return the warning to carry when allowed."""
    warning = slow_cpu_warning(cpu)
    if warning is None:
        return None
    if not allow_slow_cpu:
        raise PlanError(
            "refusing cpu %s for an inference node: %s Set allow_slow_cpu: true to accept this."
            % (cpu_model(cpu), warning)
        )
    return warning
