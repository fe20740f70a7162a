"""Render every plugin and role of the collection with ansible-doc, as a user reads them, and say which one does
not render completely (file: what).

A plugin renders completely when ansible-doc exits 0 with no warning or error, and its page has a header naming it
and the sections a user looks for (options, examples, return values; a role's entry point and options).
"""

import glob
import os
import re
import subprocess

from published import REPO, ansible_env, tool

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# kind (as ansible-doc -t takes it): (where its files are, the sections its page must have)
KINDS = {
    "module": ("plugins/modules/*.py", ("OPTIONS", "EXAMPLES:", "RETURN VALUES:", "AUTHOR")),
    "lookup": ("plugins/lookup/*.py", ("OPTIONS", "EXAMPLES:", "RETURN VALUES:")),
    "inventory": ("plugins/inventory/*.py", ("OPTIONS", "EXAMPLES:")),
    "callback": ("plugins/callback/*.py", ("OPTIONS",)),
    "connection": ("plugins/connection/*.py", ("OPTIONS",)),
    "filter": ("plugins/filter/*.yml", ("EXAMPLES:", "RETURN VALUES:")),
    "test": ("plugins/test/*.yml", ("EXAMPLES:", "RETURN VALUES:")),
    "role": ("roles/*/meta/argument_specs.yml", ("ENTRY POINT: main", "OPTIONS")),  # 'ENTRY POINT: *main*', 'Options'

}


def documented(root=REPO):
    """[(kind, name, path)] of everything ansible-doc should render."""
    found = []
    for kind, (pattern, _sections) in KINDS.items():
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            if kind == "role":
                name = os.path.basename(os.path.dirname(os.path.dirname(path)))
            else:
                name = os.path.splitext(os.path.basename(path))[0]
            if not name.startswith("_"):
                found.append((kind, name, path))
    return found


def _run(kind, fqcns, collections_path):
    env = dict(ansible_env(), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    if collections_path:
        env["ANSIBLE_COLLECTIONS_PATH"] = collections_path
    result = subprocess.run([tool("ansible-doc"), "-t", kind] + list(fqcns), capture_output=True, text=True,
                            env=env, cwd=REPO, check=False)
    return result.returncode, ANSI.sub("", result.stdout), ANSI.sub("", result.stderr)


def _pages(stdout):
    """{fqcn: page} from ansible-doc's output for several plugins (each page starts with '> KIND fqcn')."""
    pages, current = {}, None
    for line in stdout.splitlines():
        header = re.match(r"^> [A-Z]+:? \*?([\w.]+)\*?", line)
        if header:
            current = header.group(1)
            pages[current] = []
        if current:
            pages[current].append(line)
    return {fqcn: "\n".join(lines) for fqcn, lines in pages.items()}


def problems_of(kind, fqcn, rc, page, stderr):
    noise = [line for line in stderr.splitlines() if line.startswith(("[WARNING]", "[ERROR]", "ERROR"))]
    if rc or noise:
        return ["ansible-doc -t {} {} exited {}: {}".format(kind, fqcn, rc, " ".join(noise) or stderr.strip())]
    if not page:
        return ["ansible-doc -t {} {} printed no page for it".format(kind, fqcn)]
    plain = page.replace("*", "").upper()
    missing = [s for s in KINDS[kind][1] if not re.search(r"^\s*" + re.escape(s.upper()), plain, re.M)]
    if missing:
        return ["ansible-doc -t {} {}: the page has no {}".format(kind, fqcn, ", ".join(missing))]
    return []


def render(items, namespace="llmgw.fleet", collections_path=None):
    """{path: [problem, ...]} for [(kind, name, path)]. One ansible-doc run per kind; when that run is not clean,
    one run per plugin of that kind, so each problem is named with its own file."""
    by_kind = {}
    for kind, name, path in items:
        by_kind.setdefault(kind, []).append((namespace + "." + name, path))
    result = {}
    for kind, entries in by_kind.items():
        rc, stdout, stderr = _run(kind, [fqcn for fqcn, _path in entries], collections_path)
        pages = _pages(stdout)
        batch = {path: problems_of(kind, fqcn, rc, pages.get(fqcn), stderr) for fqcn, path in entries}
        if any(batch.values()):
            for fqcn, path in entries:
                rc, stdout, stderr = _run(kind, [fqcn], collections_path)
                batch[path] = problems_of(kind, fqcn, rc, _pages(stdout).get(fqcn), stderr)
        result.update(batch)
    return result
