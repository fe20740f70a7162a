#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: engine_checks_record
short_description: Whether a node's engine checks passed for exactly what it has now; record checks that passed
description:
  - Runs on the node. Computes a digest of everything the engine checks depend on, the sha256 of every file of the
    engine, the libraries outside it that its binaries and libraries load (as C(ldd) resolves them, with size and
    modification time, or C(not found)), the CPU model and flags from C(/proc/cpuinfo), the vCPUs the process may
    run on, the probe model's sha256, the check options and this collection's check tables.
  - Without O(report), compares the digest with the record the last passing checks left in O(engine_dir) (the file
    C(.llmgw-checks.json) there) and returns that record's report when they match (RV(current)); an engine
    directory that does not exist is not current. Onboarding then skips the checks; any change, such as libgomp
    removed, another CPU type or vCPU count, or another engine build, makes them run again.
  - With O(report), writes the record (the digest and the report of checks that just passed).
version_added: 0.2.0
author: llmgw.fleet developers (@llmgw)
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.engine
options:
  probe_model:
    description: The model the completion check loads; its sha256 is part of the digest.
    type: path
  link:
    description: A symbolic link that must point at O(engine_dir) (C(llama.cpp/current)); its target is part of the
      digest.
    type: path
  options:
    description: The options the checks ran with (floor, VM CPU type, fallbacks, which checks ran); part of the digest.
    type: dict
    default: {}
  report:
    description: The report of checks that passed (C(ready) true) to record for the current digest.
    type: dict
attributes:
  check_mode:
    support: full
    details: Compares in check mode too; with O(report) it returns whether the record would change, writing nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Were the checks passed for what this node has now?
  llmgw.fleet.engine_checks_record:
    engine_dir: /opt/llmgw/engines/llama.cpp/b11434
    probe_model: /opt/llmgw/engines/probe/llmgw-probe-q4_0.gguf
    options: {floor: sse42}
  register: checks_record

- name: Record checks that passed
  llmgw.fleet.engine_checks_record:
    engine_dir: /opt/llmgw/engines/llama.cpp/b11434
    probe_model: /opt/llmgw/engines/probe/llmgw-probe-q4_0.gguf
    options: {floor: sse42}
    report: "{{ engine_report }}"
  when: engine_report.ready
"""

RETURN = r"""
digest:
  description: The digest of what the checks depend on now.
  returned: always
  type: str
  sample: 3f1e9c0d6b0a4c2e8e1f5b7a9d3c6e2f4a1b8c7d9e0f2a3b4c5d6e7f8a9b0c1d
current:
  description: Whether the record matches the digest, so the checks need not run again.
  returned: always
  type: bool
report:
  description: The recorded report when RV(current), else empty.
  returned: always
  type: dict
recorded_at:
  description: When the record was written (UTC, ISO 8601), or empty.
  returned: always
  type: str
changed_parts:
  description: What differs from the record (C(engine_files), C(libraries), C(cpu), C(probe_model), C(options),
    C(tables)); every part when there is no record.
  returned: always
  type: list
  elements: str
  sample: [libraries]
"""

import datetime
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import fingerprint


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine_dir=dict(type="path", required=True),
            probe_model=dict(type="path"),
            link=dict(type="path"),
            options=dict(type="dict", default={}),
            report=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    engine_dir, report = module.params["engine_dir"], module.params["report"]
    if report is not None and report.get("ready") is not True:
        module.fail_json(msg="report: only checks that passed (ready: true) are recorded, got ready=%r"
                         % report.get("ready"))
    if not os.path.isdir(engine_dir):
        if report is not None:
            module.fail_json(msg="engine directory %s does not exist: the engine is not installed" % engine_dir)
        module.exit_json(changed=False, digest="", current=False, report={}, recorded_at="",
                         changed_parts=list(fingerprint.PARTS))
    with open("/proc/cpuinfo") as handle:
        cpuinfo = handle.read()
    parts = fingerprint.parts(engine_dir, module.params["probe_model"], module.params["link"],
                              module.params["options"], cpuinfo, len(os.sched_getaffinity(0)))
    digest = fingerprint.digest(parts)
    record = fingerprint.read_record(engine_dir)
    current = bool(record) and record.get("digest") == digest
    result = dict(changed=False, digest=digest, current=current, report=record.get("report", {}) if current else {},
                  recorded_at=record.get("recorded_at", "") if current else "",
                  changed_parts=[] if current else fingerprint.changed_parts(record.get("parts", {}), parts))
    if report is not None and not (current and record.get("report") == report):
        result["changed"] = True
        if not module.check_mode:
            recorded_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            fingerprint.write_record(engine_dir, {"digest": digest, "parts": parts, "report": report,
                                                  "recorded_at": recorded_at})
            result.update(current=True, report=report, recorded_at=recorded_at, changed_parts=[])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
