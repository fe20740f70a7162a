# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a node's engine checks depend on, as one digest, and the record of the last checks that passed.

Does I/O: reads the engine's files, the libraries ``ldd`` resolves for them, ``/proc/cpuinfo`` and the record
file. A re-run of onboarding repeats the engine checks only when the digest changed: a new or changed engine file,
a library that moved, changed or went missing (libgomp removed), other CPU flags or model (a VM moved from
``host`` to ``kvm64``), another vCPU count, another probe model, other check options, or other check tables in
this collection.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Optional

from ansible_collections.llmgw.fleet.plugins.module_utils import ggml_cpu_variants
from ansible_collections.llmgw.fleet.plugins.module_utils.engines import completion_probe, llama_cpp, runtime

RECORD = ".llmgw-checks.json"
PARTS = ("engine_files", "libraries", "cpu", "probe_model", "link", "options", "tables")
_LDD_LINE_RE = re.compile(r"^\s*(\S+)\s+=>\s+(not found|\S+)", re.M)
_CHUNK = 1 << 20


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def engine_files(engine_dir: str) -> dict:
    """{name: sha256} of every regular file in the engine directory (links are covered by their targets)."""
    files = {}
    for name in sorted(os.listdir(engine_dir)):
        path = os.path.join(engine_dir, name)
        if name != RECORD and os.path.isfile(path) and not os.path.islink(path):
            files[name] = file_sha256(path)
    return files


def resolved(ldd_output: str) -> dict:
    """{library: path or 'not found'} from ldd's output."""
    return dict(_LDD_LINE_RE.findall(ldd_output))


def libraries(engine_dir: str, files: dict) -> dict:
    """{library: 'PATH SIZE MTIME' or 'not found'} for the libraries outside the engine that its binaries and
    libraries load, as ldd resolves them."""
    found = {}
    for name in files:
        if not (name.startswith("lib") and ".so" in name or name in llama_cpp.BINARIES.values()):
            continue
        returncode, stdout, unused_stderr, error = runtime.run_binary(["ldd", os.path.join(engine_dir, name)], 60)
        if error or returncode != 0:
            continue
        for library, where in resolved(stdout).items():
            if where == "not found":
                found[library] = where
            elif not where.startswith(engine_dir.rstrip("/") + "/"):
                real = os.path.realpath(where)
                stat = os.stat(real)
                found[library] = "%s %d %d" % (real, stat.st_size, stat.st_mtime_ns)
    return dict(sorted(found.items()))


def cpu(cpuinfo_text: str, vcpus: int) -> dict:
    """The CPU as the checks see it: model name, flags (sorted) and the vCPUs this process may run on."""
    model, flags = "", ""
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = " ".join(sorted(value.split()))
    return {"model": model, "flags": flags, "vcpus": vcpus}


def tables() -> str:
    """A digest of the tables the checks judge by, so that a collection with new tables checks again."""
    text = repr((llama_cpp.FLAGS, llama_cpp.HELP_LINES, llama_cpp.HELP_LAST_MARKER, ggml_cpu_variants.FEATURES,
                 ggml_cpu_variants.VARIANTS, ggml_cpu_variants.PVE_CPU_MODEL_VARIANT, ggml_cpu_variants.SLOW_VARIANTS,
                 completion_probe.FALLBACK_MEANING))
    return hashlib.sha256(text.encode()).hexdigest()


def parts(engine_dir: str, probe_model: Optional[str], link: Optional[str], options: dict, cpuinfo_text: str,
          vcpus: int) -> dict:
    files = engine_files(engine_dir)
    return {
        "engine_files": files,
        "libraries": libraries(engine_dir, files),
        "cpu": cpu(cpuinfo_text, vcpus),
        "probe_model": file_sha256(probe_model) if probe_model and os.path.isfile(probe_model) else None,
        "link": os.readlink(link) if link and os.path.islink(link) else None,
        "options": options,
        "tables": tables(),
    }


def digest(fingerprint_parts: dict) -> str:
    return hashlib.sha256(json.dumps(fingerprint_parts, sort_keys=True).encode()).hexdigest()


def changed_parts(old: dict, new: dict) -> list:
    """The names of the parts that differ, for the message that says why the checks run again."""
    return sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key))


def read_record(engine_dir: str) -> dict:
    """The record of the last checks that passed here, or {} when there is none or it cannot be read."""
    try:
        with open(os.path.join(engine_dir, RECORD)) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def write_record(engine_dir: str, record: dict) -> None:
    path = os.path.join(engine_dir, RECORD)
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(record, handle, sort_keys=True, indent=1)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
