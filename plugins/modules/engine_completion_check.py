#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: engine_completion_check
short_description: Check on a node that llama-server answers a completion on a quantized model
description:
  - Runs on the node. Starts C(llama-server) on loopback with a small quantized probe model, waits for its health
    endpoint, asks for a few tokens and stops it. A CPU backend that loads but dies on the first quantized matrix
    multiply (SIGILL in AMX tile code on a VM whose CPU type advertises AMX it cannot run) is caught here, where
    C(llama-server --list-devices) and an F32 model pass.
  - When the plain command crashes (killed by a signal), tries each of O(fallbacks) in turn (by default
    C(--no-repack), which keeps the weights out of the AMX buffer type); any other failure (a timeout, an HTTP
    error) is reported as it is. The first that answers is returned as RV(engine_args), with a warning
    that says what failed and what the arguments cost; the fleet registry keeps them for the node and every
    C(llama-server) launched there gets them. When none answers, the module fails and names every failure.
  - Changes nothing on the node (the server it starts is stopped before the module returns).
version_added: 0.1.0
author: llmgw.fleet developers (@llmgw)
options:
  model:
    description: A small quantized GGUF on the node (the engine role copies C(llmgw-probe-q4_0.gguf), 75 KiB).
    type: path
    required: true
  threads:
    description: Threads llama-server uses.
    type: int
    default: 2
  timeout:
    description: Seconds each attempt may take to become healthy and answer.
    type: int
    default: 120
  fallbacks:
    description: Argument lists tried in order when the plain command crashes. An empty list tries none.
    type: list
    elements: list
    default: [[--no-repack]]
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.engine
  - llmgw.fleet.engine.NODE
attributes:
  check_mode:
    support: full
    details: Starts and stops a loopback server in check mode too; it writes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Llama-server answers a completion here, and with which extra arguments
  llmgw.fleet.engine_completion_check:
    engine_dir: /opt/llmgw/engines/llama.cpp/b11434
    model: /opt/llmgw/engines/probe/llmgw-probe-q4_0.gguf
    node: node01
  register: engine_completion
"""

RETURN = r"""
engine_args:
  description: The arguments every llama-server on this node needs (empty when the plain command answered).
  returned: success
  type: list
  elements: str
  sample: [--no-repack]
attempts:
  description: Each command tried, in order, and what it did.
  returned: always
  type: list
  elements: dict
  sample:
    - {args: [], answered: false, rc: -4, variant: sapphirerapids, error: "", log_tail: "..."}
    - {args: [--no-repack], answered: true, rc: null, variant: sapphirerapids, error: "", log_tail: ""}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import _server_once, completion_probe


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine_dir=dict(type="path", required=True),
            model=dict(type="path", required=True),
            node=dict(type="str", required=True),
            threads=dict(type="int", default=2),
            timeout=dict(type="int", default=120),
            fallbacks=dict(type="list", elements="list", default=[["--no-repack"]]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    server = os.path.join(params["engine_dir"], "llama-server")
    for path, what in ((server, "llama-server"), (params["model"], "the probe model")):
        if not os.path.isfile(path):
            module.fail_json(msg="%s: %s is not at %s" % (params["node"], what, path), attempts=[])
    attempts = []
    for args in [[]] + [[str(a) for a in f] for f in params["fallbacks"]]:
        attempts.append(_server_once.attempt(params["engine_dir"], params["model"], params["threads"],
                                             params["timeout"], args))
        # Only a crash (a signal) is worth other arguments; a timeout or an HTTP error would make a fallback
        # the node's for good on what may be a passing fault, so it is reported as it is.
        if attempts[-1]["answered"] or not completion_probe.crashed(attempts[-1]):
            break
    found = completion_probe.verdict(params["node"], os.path.basename(params["model"]), attempts)
    if found["problem"]:
        module.fail_json(msg=found["problem"], attempts=attempts)
    for warning in found["warnings"]:
        module.warn(warning)
    module.exit_json(changed=False, engine_args=found["engine_args"], attempts=attempts)


if __name__ == "__main__":
    main()
