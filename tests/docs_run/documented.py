"""The commands README.md and docs/ tell a reader to type, and how the docs-run stage runs each.

Every line of a shell block (```sh, ```bash, ```shell, ```console, or a block with no language) that starts with
``ansible-playbook``, ``ansible-inventory``, ``bin/fleet``, ``make`` or ``.venv/bin/python`` is a documented
command (backslash continuations joined, a leading ``$ `` dropped). Each gets one way to run, decided here and
nowhere else:

* ``run``: as written, from the root of a scratch copy of the repository on the lab;
* ``check``: as written with ``--check`` added (it would add a VM nobody needs, or take minutes);
* ``syntax``: a command for a real Proxmox VE, run with ``--syntax-check`` against ``inventories/example``
  (``-i inventories/mine --ask-vault-pass`` mapped to it), or ``ansible-inventory --graph`` on it;
* ``listed``: not run, with the reason (it is the suite itself, or minutes of work another stage does).

A command no rule names runs as written.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import sys
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "examples"))

from published import FENCE  # noqa: E402 - the examples test's own reading of fences

SHELL_LANGUAGES = ("sh", "bash", "shell", "console", "")
COMMAND = re.compile(r"^(ansible-playbook|ansible-inventory|bin/fleet|make|\.venv/bin/python)(\s|$)")

# The reading order: the quick start first (it brings up the fleet the other pages' commands use).
PAGES = ["docs/quickstart.md", "README.md", "docs/gateway.md", "docs/replicas.md", "docs/placement.md",
         "docs/onboarding.md", "docs/engine.md", "docs/real-proxmox.md", "docs/molecule.md", "tests/lab/README.md"]

# (pattern on the command, how, why): the first that matches decides.
RULES = [
    (r"^make test\b", "listed", "it is the suite this stage runs in"),
    (r"^make demo\b", "listed", "it runs the commands docs/quickstart.md lists, which run here one by one (and "
                                "removes what it made)"),
    (r"^make shell\b", "run", "with 'exit' on its standard input"),
    (r"tests/molecule/run\.py", "listed", "the molecule stage of `make test` runs every scenario"),
    (r"engine/build\.py --variants all", "listed", "builds every CPU variant llama.cpp has: about 15 minutes"),
    (r"-i inventories/mine", "syntax", "needs a real Proxmox VE: inventories/example stands for inventories/mine"),
    (r"-i inventories/example", "syntax", "needs a real Proxmox VE"),
    (r"add_node -e node=node05", "check", "would add a third lab VM for one example; add_node runs for real from "
                                          "docs/quickstart.md"),
]


@dataclasses.dataclass
class Documented:
    page: str
    line: int
    text: str
    how: str = "run"
    why: str = ""
    also: List[str] = dataclasses.field(default_factory=list)

    @property
    def where(self) -> str:
        return "%s:%d" % (self.page, self.line)

    def argv_text(self) -> Optional[str]:
        """The shell text the stage runs, or None for a listed command."""
        text = self.text
        if self.how == "listed":
            return None
        if self.how == "check":
            return text + " --check"
        if self.how == "syntax":
            text = text.replace("-i inventories/mine", "-i inventories/example").replace(" --ask-vault-pass", "")
            if text.startswith("ansible-inventory"):
                return text
            return text + " --syntax-check"
        if self.text.startswith("make shell"):
            return "echo exit | " + text
        return text


def shell_blocks(path):
    """(text, first line) of every shell or language-less fenced block of a Markdown file."""
    with open(path) as handle:
        lines = handle.read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening:
            start = end = i + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            if opening.group(1).lower() in SHELL_LANGUAGES:
                blocks.append((lines[start:end], start + 1))
            i = end
        i += 1
    return blocks


def commands_of(page):
    out = []
    for lines, first in shell_blocks(os.path.join(REPO, page)):
        i = 0
        while i < len(lines):
            number, text = first + i, lines[i].strip()
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1].rstrip() + " " + lines[i].strip()
            i += 1
            if text.startswith("$ "):
                text = text[2:]
            text = re.sub(r"\s+#.*$", "", text).strip()  # a trailing comment
            if COMMAND.match(text):
                out.append(Documented(page, number, text))
    return out


def documented_commands():
    """Every documented command once, in reading order; a repeat is noted on the first (``also``)."""
    pages = PAGES + sorted(set(glob.glob("docs/*.md", root_dir=REPO)) - set(PAGES))
    seen = {}
    for page in pages:
        for command in commands_of(page):
            if command.text in seen:
                seen[command.text].also.append(command.where)
                continue
            for pattern, how, why in RULES:
                if re.search(pattern, command.text):
                    command.how, command.why = how, why
                    break
            seen[command.text] = command
    return list(seen.values())
