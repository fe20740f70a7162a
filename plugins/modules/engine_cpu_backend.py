#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: engine_cpu_backend
short_description: Predict and confirm the ggml CPU backend llama.cpp loads on a node; refuse a scalar one
description:
  - Runs on the node. From the node's CPU flags (C(/proc/cpuinfo)) and the C(libggml-cpu-*.so) variants the
    installed engine ships, predicts the variant llama.cpp will load, with llama.cpp's own scores
    (C(ggml/src/ggml-cpu/arch/x86/cpu-feats.cpp)).
  - Cross-checks with the engine itself by running it once (C(llama-server --verbose --list-devices), no model
    needed) and reading its C(load_backend) line (C(loaded CPU backend from PATH)). Reports both.
  - "Refuses a node that would load C(x64), llama.cpp's scalar baseline (a Proxmox VM with the default C(kvm64) CPU
    type does), or a variant below O(floor). The message names the VM's CPU type when known, the CPU flags that
    are missing and the fix, C(cpu: host) on the VM."
  - Reads only; changes nothing.
version_added: 0.1.0
author: llmgw.fleet developers (@llmgw)
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.attributes.INFO_MODULE
  - llmgw.fleet.engine
  - llmgw.fleet.engine.TIMEOUT
options:
  floor:
    description: The lowest acceptable variant. C(x64) is refused whatever this says.
    type: str
    default: sse42
    choices: [x64, sse42, sandybridge, ivybridge, piledriver, haswell, skylakex, cannonlake, cascadelake, icelake,
              cooperlake, zen4, alderlake, sapphirerapids]
  vm_cpu:
    description: The VM's CPU type as Proxmox has it (C(kvm64) when its config has no C(cpu) key), for the message.
    type: str
  node:
    description: The node's name, for the message.
    type: str
  cpuinfo:
    description: CPU flags to use instead of reading C(/proc/cpuinfo) (its text, or the flags space-separated).
    type: str
  run_engine:
    description: Run the engine to read the variant it loads. Without it only the prediction is made.
    type: bool
    default: true
  probe_binary:
    description: The binary to run, relative to O(engine_dir).
    type: str
    default: llama-server
  probe_args:
    description: Arguments that make the binary log its backends and exit without a model.
    type: list
    elements: str
    default: [--verbose, --list-devices]
"""

EXAMPLES = r"""
- name: The node runs llama.cpp with a vector CPU backend, at least haswell
  llmgw.fleet.engine_cpu_backend:
    engine_dir: /opt/llmgw/engines/llama.cpp/b11434
    floor: haswell
    vm_cpu: "{{ vm_config.cpu | default('kvm64') }}"
    node: node05
"""

RETURN = r"""
predicted:
  description: The variant predicted from the CPU flags among the variants shipped (null if none can run).
  returned: always
  type: str
  sample: haswell
loaded:
  description: The variant the engine said it loaded; null when it was not run or did not say.
  returned: always
  type: str
  sample: haswell
loaded_path:
  description: The library path from the engine's C(load_backend) line.
  returned: always
  type: str
load_backend_line:
  description: The engine's C(load_backend) line for the CPU backend, as printed.
  returned: always
  type: str
agree:
  description: Whether prediction and engine agree (null when the engine was not run or did not say).
  returned: always
  type: bool
refused:
  description: Whether the node is refused.
  returned: always
  type: bool
message:
  description: The verdict in words (on refusal also the failure message).
  returned: always
  type: str
missing:
  description: Per target variant (the floor, and haswell), the CPU flags this node lacks for it.
  returned: always
  type: dict
  sample: {sse42: [sse4_2], haswell: [avx, avx2, bmi2, f16c, fma, sse4_2]}
better:
  description: Every shipped variant that ranks above the predicted one, with the flags missing for it.
  returned: always
  type: list
  elements: dict
shipped:
  description: The CPU variants the engine directory holds.
  returned: always
  type: list
  elements: str
engine_error:
  description: Why the engine could not be run to read its line (the prediction stands alone then).
  returned: when the engine did not run
  type: str
"""

import glob
import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import ggml_cpu_variants as gcv
from ansible_collections.llmgw.fleet.plugins.module_utils.engines import runtime


def shipped_variants(engine_dir):
    found, unknown = [], []
    for path in sorted(glob.glob(os.path.join(engine_dir, "libggml-cpu-*.so"))):
        name = gcv.variant_of_file(os.path.basename(path))
        (found if name in gcv.VARIANTS else unknown).append(name)
    return found, unknown


def probe(binary, args, timeout):
    """(output, error): what the engine printed, or why it could not run."""
    returncode, stdout, stderr, error = runtime.run_binary([binary] + list(args), timeout)
    if error:
        return None, error
    output = stdout + stderr
    if returncode != 0 and "load_backend" not in output:
        return None, "%s exited with status %d: %s" % (binary, returncode, output.strip()[-300:])
    return output, None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine_dir=dict(type="path", required=True),
            floor=dict(type="str", default="sse42", choices=list(gcv.VARIANTS)),
            vm_cpu=dict(type="str"),
            node=dict(type="str"),
            cpuinfo=dict(type="str"),
            run_engine=dict(type="bool", default=True),
            probe_binary=dict(type="str", default="llama-server"),
            probe_args=dict(type="list", elements="str", default=["--verbose", "--list-devices"]),
            timeout=dict(type="int", default=60),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["cpuinfo"] is not None:
        flags = gcv.parse_cpuinfo_flags(params["cpuinfo"])
    else:
        with open("/proc/cpuinfo") as handle:
            flags = gcv.parse_cpuinfo_flags(handle.read())
    shipped, unknown = shipped_variants(params["engine_dir"])
    if not shipped:
        module.fail_json(msg="no libggml-cpu-*.so variant in %s: not a GGML_BACKEND_DL build of llama.cpp, or not "
                         "installed" % params["engine_dir"], shipped=[])
    for name in unknown:
        module.warn("%s ships CPU variant %s, which the table (%s) does not know"
                    % (params["engine_dir"], name, gcv.SOURCE))
    output, engine_error = None, None
    if params["run_engine"]:
        output, engine_error = probe(os.path.join(params["engine_dir"], params["probe_binary"]),
                                     params["probe_args"], params["timeout"])
    verdict = gcv.assess(flags, shipped, output, params["floor"], params["vm_cpu"], params["node"])
    line = next((m.group(0) for m in re.finditer(r"load_backend: loaded CPU backend from \S+", output or "")), None)
    result = dict(verdict, changed=False, shipped=shipped, load_backend_line=line)
    if engine_error:
        result["engine_error"] = engine_error
    if verdict["refused"]:
        module.fail_json(msg=verdict["message"], **result)
    if verdict["agree"] is False:
        module.warn(verdict["message"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
