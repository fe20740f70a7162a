#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: engine_speed_probe
short_description: Measure a node's llama.cpp speed against its own scalar baseline; refuse numbers that are just small
description:
  - Runs on the node. Writes the speed probe model (a 4 MB llama-architecture GGUF with Q4_0 weights, generated
    from a seed, so nothing is copied) and runs C(llama-bench) on it twice with the same threads and model, once
    with the CPU backend llama.cpp picks on this node and once with the scalar C(x64) backend forced (a tree of
    hard links to the engine holding only C(libggml-cpu-x64.so), removed afterwards).
  - Reports prompt processing and generation in tokens per second for both, and their ratios. A ratio below
    O(min_ratio) is measured again, at most twice, and the best pair kept, so that a burst of load on the host
    during one of the two runs does not refuse a node.
  - Fails, naming the numbers, the likely causes and the fix, when the picked backend is less than O(min_ratio)
    times the baseline at prompt processing, when the engine runs fewer threads than the node has vCPUs, or when
    its prompt speed per thread is far below the median of O(peers) of the same CPU variant; with O(allow_slow) it
    warns instead.
version_added: 0.2.0
author: llmgw.fleet developers (@llmgw)
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.engine
  - llmgw.fleet.engine.NODE
options:
  model:
    description: Where the probe model is written (kept, and rewritten only when its sha256 differs).
    type: path
    required: true
  engine_args:
    description: The arguments every C(llama-server) on this node runs with (what the completion check found);
      C(--no-repack) and a thread count are carried over to C(llama-bench).
    type: list
    elements: str
    default: []
  threads:
    description: Threads to measure with. Default, the thread count in O(engine_args), else the node's vCPUs.
    type: int
  min_ratio:
    description: The lowest prompt-processing ratio of the picked backend to the scalar baseline that passes.
    type: float
    default: 2.0
  peers:
    description:
      - Other nodes' recorded measurements (each a RV(speed) of this module, as the registry keeps it), normally
        those of the fleet's ready nodes. Once O(min_peers) of them ran the same CPU variant, a node whose prompt
        tokens per second per thread fall below O(min_share) of their median is refused too.
    type: list
    elements: dict
    default: []
  min_share:
    description: The lowest share of the peers' median prompt tokens per second per thread that passes.
    type: float
    default: 0.5
  min_peers:
    description: How many peers of the same CPU variant the comparison with the fleet needs.
    type: int
    default: 2
  allow_slow:
    description: Warn instead of failing when the numbers are too small.
    type: bool
    default: false
  timeout:
    description: Seconds each C(llama-bench) run may take.
    type: int
    default: 120
attributes:
  check_mode:
    support: full
    details: Measures in check mode too, with the probe model and the baseline tree in a temporary directory.
  diff_mode:
    support: N/A
    details: Writes only its own probe model (changed when it was missing or different), so there is nothing to diff.
"""

EXAMPLES = r"""
- name: How fast is this node, against its own scalar baseline?
  llmgw.fleet.engine_speed_probe:
    engine_dir: /opt/llmgw/engines/llama.cpp/b11434
    model: /opt/llmgw/engines/probe/llmgw-speed-probe-q4_0.gguf
    node: node01
  register: speed
"""

RETURN = r"""
speed:
  description: Both runs and their ratios. C(pp) and C(tg) are tokens per second of prompt processing and
    generation with the picked backend C(variant); C(baseline_pp) and C(baseline_tg) with C(x64) forced.
  returned: when both runs finished
  type: dict
  sample: {variant: zen4, threads: 2, vcpus: 2, pp: 2968.0, tg: 1874.0, baseline_pp: 327.0, baseline_tg: 349.0,
           pp_ratio: 9.08, tg_ratio: 5.37}
reasons:
  description: Why the numbers are too small, each with the numbers and the fix; empty when they are not.
  returned: always
  type: list
  elements: str
ran:
  description: The C(llama-bench) commands run.
  returned: always
  type: list
  elements: list
seconds:
  description: Wall time of the probe.
  returned: always
  type: float
"""

import os
import shutil
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import ggml_cpu_variants
from ansible_collections.llmgw.fleet.plugins.module_utils.engines import runtime, speed, speed_model


def baseline_tree(engine_dir, parent):
    """A directory beside the engine with hard links to its files (copies across file systems), holding only the
    baseline CPU variant: llama.cpp loads the CPU backends it finds next to the binary (RUNPATH $ORIGIN)."""
    tree = tempfile.mkdtemp(prefix=".llmgw-x64-", dir=parent)
    for name in os.listdir(engine_dir):
        source = os.path.join(engine_dir, name)
        variant = ggml_cpu_variants.variant_of_file(name)
        if variant and variant != speed.BASELINE:
            continue
        target = os.path.join(tree, name)
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
        elif os.path.isfile(source):
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
    return tree


def bench(module, engine_dir, model, threads, engine_args, ran):
    argv = speed.bench_argv(os.path.join(engine_dir, "llama-bench"), model, threads, engine_args)
    ran.append(argv)
    returncode, stdout, stderr, error = runtime.run_binary(argv, module.params["timeout"])
    node = module.params["node"]
    if error or returncode != 0:
        crash = runtime.describe_crash(argv[0], returncode) if returncode is not None else None
        tail = " | ".join((stderr or "").strip().splitlines()[-3:])
        module.fail_json(msg="%s: the speed probe could not run (%s): %s" % (
            node, crash or error or "exit status %s" % returncode, tail), ran=ran, reasons=[])
    try:
        rates = speed.parse_bench(stdout)
    except ValueError as exc:
        module.fail_json(msg="%s: the speed probe's llama-bench output could not be read: %s" % (node, exc),
                         ran=ran, reasons=[])
    return ggml_cpu_variants.loaded_variant(stderr)[0], rates


RETRIES = 2


def measure(module, engine_dir, model, threads, vcpus, ran):
    """One pair of runs: the backend llama.cpp picks, then the scalar baseline forced; their measurement."""
    params = module.params
    variant, picked = bench(module, engine_dir, model, threads, params["engine_args"], ran)
    if variant == speed.BASELINE:
        baseline = picked
    else:
        tree = baseline_tree(engine_dir, module.tmpdir if module.check_mode else os.path.dirname(engine_dir))
        try:
            forced, baseline = bench(module, tree, model, threads, params["engine_args"], ran)
        finally:
            shutil.rmtree(tree, ignore_errors=True)
        if forced != speed.BASELINE:
            module.fail_json(msg="%s: the speed probe's baseline loaded %s, not %s" % (
                params["node"], forced, speed.BASELINE), ran=ran, reasons=[])
    return speed.measurement(variant or "unknown", threads, vcpus, picked, baseline)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine_dir=dict(type="path", required=True),
            model=dict(type="path", required=True),
            node=dict(type="str", required=True),
            engine_args=dict(type="list", elements="str", default=[]),
            threads=dict(type="int"),
            min_ratio=dict(type="float", default=speed.MIN_PROMPT_RATIO),
            peers=dict(type="list", elements="dict", default=[]),
            min_share=dict(type="float", default=speed.MIN_SHARE_OF_MEDIAN),
            min_peers=dict(type="int", default=speed.MIN_PEERS),
            allow_slow=dict(type="bool", default=False),
            timeout=dict(type="int", default=120),
        ),
        supports_check_mode=True,
    )
    params, started, ran = module.params, time.monotonic(), []
    engine_dir = params["engine_dir"]
    if not os.path.isfile(os.path.join(engine_dir, "llama-bench")):
        module.fail_json(msg="%s: llama-bench is not in %s, so the node's speed cannot be measured" % (
            params["node"], engine_dir), ran=ran, reasons=[])
    vcpus = len(os.sched_getaffinity(0))
    threads = params["threads"] or speed.threads_in(params["engine_args"]) or vcpus
    model = params["model"]
    changed = not speed_model.is_current(model)
    if module.check_mode:
        model = os.path.join(module.tmpdir, os.path.basename(model))
    else:
        os.makedirs(os.path.dirname(model), mode=0o755, exist_ok=True)
    if changed or module.check_mode:
        speed_model.write(model)
    measured = measure(module, engine_dir, model, threads, vcpus, ran)
    # The two runs are not simultaneous: a burst of load on the host during one of them skews the ratio. A ratio
    # below the threshold is measured again (at most twice) and the best pair kept; a backend that really is slow
    # stays slow every time. A node whose picked backend is x64 is its own baseline (ratio 1.0): not measured again.
    for _attempt in range(RETRIES):
        if measured["pp_ratio"] >= params["min_ratio"] or measured["variant"] == speed.BASELINE:
            break
        time.sleep(1)
        again = measure(module, engine_dir, model, threads, vcpus, ran)
        if again["pp_ratio"] > measured["pp_ratio"]:
            measured = again
    reasons = speed.verdict(params["node"], measured, params["min_ratio"]) + speed.fleet_verdict(
        params["node"], measured, params["peers"], params["min_share"], params["min_peers"])
    result = dict(changed=changed, speed=measured, reasons=reasons, ran=ran,
                  seconds=round(time.monotonic() - started, 2))
    if reasons and not params["allow_slow"]:
        module.fail_json(msg=" | ".join(reasons), **result)
    for reason in reasons:
        module.warn("registered anyway (allow_slow_node): " + reason)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
