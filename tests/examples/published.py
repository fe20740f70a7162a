"""Load every published example the way a user would, and say where one is broken (file:line: what).

Published examples are: the EXAMPLES block of every plugin, the YAML/INI/shell blocks of README.md and docs/,
every playbook and inventory, and every role's defaults against its meta/argument_specs.yml. Module arguments are
checked with Ansible's own ArgumentSpecValidator against the options the plugin documents (ansible-test's
validate-modules keeps those documented options equal to the real argument spec).
"""

import ast
import configparser
import glob
import json
import os
import re
import subprocess
import sys

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FQCN_PREFIX = "llmgw.fleet."
PLUGIN_KINDS = ("modules", "lookup", "inventory", "callback", "connection")
SIDECAR_KINDS = ("filter", "test")  # documented in a YAML file beside the code
PLACEHOLDERS = {"int": 0, "float": 0.0, "bool": True, "list": [], "dict": {}}


class Problem:
    def __init__(self, path, line, message):
        self.path, self.line, self.message = os.path.relpath(path, REPO), line, message

    def __str__(self):
        return "{}:{}: {}".format(self.path, self.line, self.message)

    __repr__ = __str__


class LineLoader(yaml.SafeLoader):
    """Safe YAML that remembers the line of every mapping (as __line__, 1-based within the text)."""

    def construct_mapping(self, node, deep=False):
        mapping = super().construct_mapping(node, deep=deep)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


def _ansible_tagged_string(loader, node):
    return loader.construct_scalar(node)


# Ansible's own YAML tags: an inline vaulted value and a string never templated.
LineLoader.add_constructor("!vault", _ansible_tagged_string)
LineLoader.add_constructor("!unsafe", _ansible_tagged_string)


def load_yaml(text, path, first_line):
    """(data, problems): YAML parsed with line marks, or the problem with its file line."""
    try:
        return yaml.load(text, Loader=LineLoader), []
    except yaml.YAMLError as exc:
        # Where the broken construct began is more use to a reader than where the parser gave up.
        mark = getattr(exc, "context_mark", None) or getattr(exc, "problem_mark", None)
        line = first_line + (mark.line if mark else 0)
        return None, [Problem(path, line, "YAML does not parse: {}".format(exc).splitlines()[0])]


def strip_lines(data):
    if isinstance(data, dict):
        return {k: strip_lines(v) for k, v in data.items() if k != "__line__"}
    if isinstance(data, list):
        return [strip_lines(v) for v in data]
    return data


# ---- plugin documentation -------------------------------------------------------------------------------------

def plugin_blocks(path):
    """{'DOCUMENTATION': (text, first_line), 'EXAMPLES': ...} of a plugin file, with the line each text starts on."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    blocks = {}
    for node in tree.body:
        is_name = isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        if is_name and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            blocks[node.targets[0].id] = (node.value.value, node.value.lineno)
    return blocks


def argument_spec(options):
    """An argument spec (as modules declare it) from documented options."""
    spec = {}
    for name, doc in (options or {}).items():
        entry = {"type": doc.get("type", "str")}
        for key in ("required", "choices", "elements", "aliases", "default", "no_log"):
            if key in doc:
                entry[key] = doc[key]
        if "suboptions" in doc:
            entry["options"] = argument_spec(doc["suboptions"])
        spec[name] = entry
    return spec


def untemplated(args, spec):
    """Arguments with Jinja expressions replaced by a value of the documented type, which is all a static check
    can know of them."""
    out = {}
    for key, value in args.items():
        entry = spec.get(key, {})
        if isinstance(value, str) and "{{" in value:
            if entry.get("choices"):
                value = entry["choices"][0]
            else:
                value = PLACEHOLDERS.get(entry.get("type"), "templated")
        elif isinstance(value, dict) and entry.get("options"):
            value = untemplated(value, entry["options"])
        out[key] = value
    return out


def check_module_args(path, line, module, args, documented):
    if module not in documented:
        return [Problem(path, line, "{}{} is not a module of this collection".format(FQCN_PREFIX, module))]
    if documented[module] is None:
        return [Problem(path, line, "ansible-doc cannot load the documentation of {}{}".format(FQCN_PREFIX, module))]
    if not isinstance(args, dict):
        return [Problem(path, line, "{}{} takes its arguments as a mapping".format(FQCN_PREFIX, module))]
    spec = argument_spec(documented[module])
    result = ArgumentSpecValidator(spec).validate(untemplated(args, spec))
    return [Problem(path, line, "{}{}: {}".format(FQCN_PREFIX, module, err)) for err in result.errors]


def tasks_in(data):
    """Every task mapping in a task list or playbook, blocks included."""
    if isinstance(data, list):
        for item in data:
            yield from tasks_in(item)
    elif isinstance(data, dict):
        nested = [k for k in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always")
                  if isinstance(data.get(k), list)]
        if nested:
            for key in nested:
                yield from tasks_in(data[key])
        else:
            yield data


def check_tasks(path, first_line, data, documented):
    problems = []
    for task in tasks_in(data):
        line = first_line + task.get("__line__", 1) - 1
        for key, value in task.items():
            if isinstance(key, str) and key.startswith(FQCN_PREFIX) and key.count(".") == 2:
                args = strip_lines(value)
                problems += check_module_args(path, line, key[len(FQCN_PREFIX):], args or {}, documented)
    return problems


def documented_modules(root=REPO):
    """{module: options} as ansible-doc renders them, documentation fragments merged in; None for a module whose
    documentation ansible-doc cannot load (each example using it then says so, and the other checks still run)."""
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(root, "plugins", "modules", "*.py")))
    if not names:
        return {}
    rendered = _ansible_doc_json(names)
    if rendered is None:
        rendered = {}
        for name in names:
            rendered.update(_ansible_doc_json([name]) or {FQCN_PREFIX + name: None})
    return {fqcn[len(FQCN_PREFIX):]: None if entry is None else (entry.get("doc") or {}).get("options") or {}
            for fqcn, entry in rendered.items()}


def _ansible_doc_json(names):
    result = subprocess.run([tool("ansible-doc"), "-t", "module", "--json"] + [FQCN_PREFIX + n for n in names],
                            capture_output=True, text=True, env=ansible_env(), check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def sidecar_blocks(path):
    """The same blocks from a filter's or test's YAML documentation file."""
    with open(path) as handle:
        text = handle.read()
    data = yaml.safe_load(text) or {}
    lines = text.splitlines()
    blocks = {}
    for name, value in data.items():
        line = next((i + 1 for i, row in enumerate(lines) if row.startswith(name + ":")), 1)
        blocks[name] = (value if isinstance(value, str) else yaml.safe_dump(value), line + 1)
    return blocks


def check_plugin_file(path, documented):
    blocks = sidecar_blocks(path) if path.endswith(".yml") else plugin_blocks(path)
    problems = []
    for name in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
        if name not in blocks:
            problems.append(Problem(path, 1, "no {} block".format(name)))
            continue
        text, first = blocks[name]
        data, errors = load_yaml(text, path, first)
        problems += errors
        if name == "EXAMPLES" and data is not None and "module:" in blocks.get("DOCUMENTATION", ("", 0))[0]:
            problems += check_tasks(path, first, data, documented)
    return problems


# ---- prose: README.md and docs/ ------------------------------------------------------------------------------

FENCE = re.compile(r"^```(\w*)\s*$")


def fenced_blocks(path):
    """(language, text, first line of the text) for every fenced block of a Markdown file."""
    with open(path) as handle:
        lines = handle.read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening and opening.group(1):
            start = i + 1
            end = start
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            blocks.append((opening.group(1).lower(), "\n".join(lines[start:end]) + "\n", start + 1))
            i = end
        i += 1
    return blocks


def check_markdown_file(path, documented):
    problems = []
    for language, text, first in fenced_blocks(path):
        if language in ("yaml", "yml"):
            data, errors = load_yaml(text, path, first)
            problems += errors
            if data is not None:
                problems += check_tasks(path, first, data, documented)
        elif language == "ini":
            try:
                parser = configparser.ConfigParser(allow_no_value=True, delimiters=("=", " "))
                parser.read_string(text)
            except configparser.Error as exc:
                problems.append(Problem(path, first, "INI does not parse: {}".format(exc).splitlines()[0]))
        elif language in ("sh", "bash", "shell", "console"):
            result = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, check=False)
            if result.returncode:
                problems.append(Problem(path, first, "shell does not parse: " + result.stderr.strip()))
    return problems


LINK = re.compile(r"\]\(([^)\s]+)\)")
# A repository path named in code in prose: plugins/..., roles/..., tests/..., docs/..., ending in a file name.
CODE_PATH = re.compile(r"`((?:plugins|roles|playbooks|tests|docs|inventories|requirements)/[\w./-]*\w)`")


def check_markdown_links(path):
    """Relative links must lead to a file of the repository, and repository paths named in code must exist: a
    page that points at a file nobody wrote is a guess too."""
    problems = []
    with open(path) as handle:
        lines = handle.read().splitlines()
    in_fence = False
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), target.split("#")[0]))
            if not os.path.exists(resolved):
                problems.append(Problem(path, number, "link to {}, which does not exist".format(target)))
        for named in CODE_PATH.findall(line):
            if "*" not in named and not os.path.exists(os.path.join(REPO, named)):
                problems.append(Problem(path, number, "names {}, which does not exist".format(named)))
    return problems


# ---- playbooks, inventories, roles -----------------------------------------------------------------------------

def ansible_env():
    env = dict(os.environ)
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(REPO, ".build", "collections")
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def tool(name):
    return os.path.join(os.path.dirname(sys.executable), name)


def check_playbook(path, documented):
    with open(path) as handle:
        data, problems = load_yaml(handle.read(), path, 1)
    if data is not None:
        problems += check_tasks(path, 1, data, documented)
    result = subprocess.run([tool("ansible-playbook"), "--syntax-check", "-i", "localhost,", path],
                            capture_output=True, text=True, env=ansible_env(), cwd=REPO, check=False)
    if result.returncode:
        output = (result.stderr or result.stdout).strip()
        problems.append(Problem(path, 1, "ansible-playbook --syntax-check: " + output))
    return problems


def check_inventory(path):
    result = subprocess.run([tool("ansible-inventory"), "-i", path, "--list"], capture_output=True, text=True,
                            env=dict(ansible_env(), ANSIBLE_INVENTORY_UNPARSED_FAILED="1"), cwd=REPO, check=False)
    if result.returncode or "[WARNING]" in result.stderr:
        return [Problem(path, 1, "ansible-inventory: " + result.stderr.strip())]
    return []


def check_role(role_dir):
    spec_path = os.path.join(role_dir, "meta", "argument_specs.yml")
    if not os.path.exists(spec_path):
        return [Problem(role_dir, 1, "role has no meta/argument_specs.yml")]
    with open(spec_path) as handle:
        specs, problems = load_yaml(handle.read(), spec_path, 1)
    if specs is None:
        return problems
    entry_points = strip_lines(specs).get("argument_specs", {})
    if "main" not in entry_points:
        return [Problem(spec_path, 1, "no argument_specs.main entry point")]
    defaults_path = os.path.join(role_dir, "defaults", "main.yml")
    defaults = {}
    if os.path.exists(defaults_path):
        with open(defaults_path) as handle:
            defaults = yaml.safe_load(handle) or {}
    # defaults/main.yml serves every entry point (main, and tasks_from ones such as timer): an option is declared
    # when some entry point declares it.
    spec = {}
    for entry in entry_points.values():
        spec.update(argument_spec((entry or {}).get("options")))
    for name in sorted(set(defaults) - set(spec)):
        problems.append(Problem(defaults_path, 1, "default {} is not declared in meta/argument_specs.yml".format(name)))
    for name in sorted(spec):
        if name in defaults and spec[name].get("default", defaults[name]) != defaults[name]:
            problems.append(Problem(spec_path, 1, "{}: documented default {!r} differs from defaults/main.yml {!r}"
                                    .format(name, spec[name]["default"], defaults[name])))
    # Required options are the caller's to give; the defaults are checked for what they do give.
    optional = {name: {k: v for k, v in entry.items() if k != "required"} for name, entry in spec.items()}
    result = ArgumentSpecValidator(optional).validate(untemplated(defaults, optional))
    problems += [Problem(defaults_path, 1, str(err)) for err in result.errors]
    return problems


def published_files(root=REPO):
    """Where the examples a user may copy live."""
    return {
        "plugins": sorted(
            [p for kind in PLUGIN_KINDS for p in glob.glob(os.path.join(root, "plugins", kind, "*.py"))
             if not os.path.basename(p).startswith("__")]
            + [p for kind in SIDECAR_KINDS for p in glob.glob(os.path.join(root, "plugins", kind, "*.yml"))]),
        "markdown": sorted([os.path.join(root, "README.md")]
                           + glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True)),
        "playbooks": sorted(glob.glob(os.path.join(root, "playbooks", "*.yml"))),
        "inventories": sorted(p for p in glob.glob(os.path.join(root, "inventories", "*")) if os.path.isdir(p)),
        "roles": sorted(p for p in glob.glob(os.path.join(root, "roles", "*")) if os.path.isdir(p)),
    }
