#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: engine_flags_check
short_description: Check every flag the launcher may pass against the installed engine's own --help
description:
  - Runs on the node. Builds the widest command set the collection's launcher produces for the engine (a
    multi-node replica, every optional flag set, rank 0 and the other ranks), runs each binary's C(--help) there,
    and checks every flag on a whole-flag boundary (C(--port) is not satisfied by C(--port-range), C(-c) not by
    C(-cb)). A flag that the help only names inside a description (C(deprecated, use --load-mode)) is not offered.
  - Fails naming each missing flag, the binary and the engine version the node has, and the version the
    collection's flag table was read from.
  - Warns when the help text looks truncated (fewer lines than this engine version prints, a missing ending, a
    round line count, a cut-off last line); a truncated help can make flags look missing that are not.
  - For vLLM the full list is C(vllm serve --help=all), and C(_) and C(-) are the same in flag names.
  - Reads only; changes nothing.
version_added: 0.1.0
author: llmgw.fleet developers (@llmgw)
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.attributes.INFO_MODULE
  - llmgw.fleet.engine.TIMEOUT
options:
  engine:
    description: The engine whose flags to check.
    type: str
    choices: [llama.cpp, vllm, sglang]
    default: llama.cpp
  engine_dir:
    description: Directory holding the engine's binaries (llama.cpp release layout). Without it, binaries are
      looked up on C(PATH).
    type: path
  spec:
    description: Launcher settings that replace the widest defaults (for example C(rpc_port), C(bin_dir)).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Every flag the launcher may pass is in this node's llama.cpp
  llmgw.fleet.engine_flags_check:
    engine: llama.cpp
    engine_dir: /opt/llmgw/engines/llama.cpp/b11434
"""

RETURN = r"""
engine_version:
  description: The version the engine on the node reports (C(b11434) for llama.cpp), or null if it did not say.
  returned: always
  type: str
  sample: b11434
table_version:
  description: The engine version the collection's flag table was read from.
  returned: always
  type: str
  sample: b11434
checked:
  description: Per binary, each flag and whether its help offers it (C(offered), C(mentioned) only in text, C(missing)).
  returned: always
  type: dict
  sample: {llama-server: [{flag: --rpc, status: offered}]}
missing:
  description: Every flag not offered, as C(binary flag).
  returned: always
  type: list
  elements: str
  sample: ["llama-server --rpc"]
truncated:
  description: Per binary, the reasons its help text looks cut short (empty lists when whole).
  returned: always
  type: dict
  sample: {llama-server: ["the help text has 400 lines; this engine version prints about 736"]}
help_lines:
  description: Lines of help text read per binary.
  returned: always
  type: dict
  sample: {llama-server: 736, ggml-rpc-server: 10}
"""

import os
import shlex

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import flag_check, get_engine, launcher, runtime


def resolve(argv, engine_dir):
    if engine_dir and os.path.exists(os.path.join(engine_dir, argv[0])):
        return [os.path.join(engine_dir, argv[0])] + list(argv[1:])
    return list(argv)


def read_help(argv, timeout):
    """(text, error): what ``argv`` printed (run by ``runtime.run_binary``): stdout, or stderr when the program
    printed its help there; minus backend log lines."""
    returncode, stdout, stderr, error = runtime.run_binary(argv, timeout)
    if error:
        return None, "%s: %s" % (" ".join(argv), error)
    text = stdout if stdout.strip() else stderr
    lines = [line for line in text.splitlines(True) if "load_backend:" not in line]
    if returncode != 0 and not lines:
        return None, "%s exited with status %d: %s" % (" ".join(argv), returncode, stderr.strip()[-300:])
    return "".join(lines), None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine=dict(type="str", choices=["llama.cpp", "vllm", "sglang"], default="llama.cpp"),
            engine_dir=dict(type="path"),
            spec=dict(type="dict", default={}),
            timeout=dict(type="int", default=60),
        ),
        supports_check_mode=True,
    )
    engine, engine_dir, timeout = module.params["engine"], module.params["engine_dir"], module.params["timeout"]
    table = get_engine(engine)
    try:
        wanted = launcher.flags_by_binary(engine, **module.params["spec"])
    except (launcher.LaunchSpecError, TypeError) as exc:
        module.fail_json(msg="cannot build the launcher's commands: %s" % exc)

    version_text, _error = read_help(resolve(table.VERSION_COMMAND, engine_dir), timeout)
    version = table.parse_version(version_text) if version_text else None
    same_version = version == table.VERSION
    result = dict(changed=False, engine_version=version, table_version=table.VERSION, checked={}, missing=[],
                  truncated={}, help_lines={})
    errors = []
    for binary, flags in wanted.items():
        argv = resolve(shlex.split(binary), engine_dir) + list(table.HELP_ARGV.get(binary, ("--help",)))
        text, error = read_help(argv, timeout)
        if error:
            errors.append(error)
            continue
        result["help_lines"][binary] = len(text.splitlines())
        checked = flag_check.check_flags(flags, text, table.NORMALIZE_UNDERSCORES)
        result["checked"][binary] = checked
        result["missing"].extend("%s %s" % (binary, c["flag"]) for c in checked if c["status"] != "offered")
        reasons = flag_check.truncation_warnings(
            text,
            table.HELP_LINES.get(binary) if same_version else None,
            table.HELP_LAST_MARKER.get(binary) if same_version else None)
        result["truncated"][binary] = reasons
        for reason in reasons:
            module.warn("%s --help looks truncated: %s" % (binary, reason))

    if errors:
        module.fail_json(msg="could not read the engine's help: %s" % "; ".join(errors), **result)
    if result["missing"]:
        where = "%s %s" % (engine, version or "(version not reported)")
        parts = []
        for binary, checked in result["checked"].items():
            for c in checked:
                if c["status"] == "missing":
                    parts.append("%s does not offer %s" % (binary, c["flag"]))
                elif c["status"] == "mentioned":
                    parts.append("%s only mentions %s in a description (renamed or deprecated?)" % (binary, c["flag"]))
        msg = "%s on this node lacks flags the launcher passes: %s (flag table read from %s %s)" % (
            where, "; ".join(parts), engine, table.VERSION)
        if any(result["truncated"].values()):
            msg += "; its help text looks truncated, so some of these may be an artefact of that"
        module.fail_json(msg=msg, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
