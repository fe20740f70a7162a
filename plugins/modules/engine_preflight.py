#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: engine_preflight
short_description: Check on a node that the installed llama.cpp engine can start
description:
  - Runs on the node. Checks the engine's binaries and the ggml libraries next to them with C(ldd), then runs each
    binary in a way that loads its backends and exits at once (C(llama-server --verbose --list-devices),
    C(ggml-rpc-server --help)), and says plainly why one will not start.
  - A missing shared library is named with the Debian package that provides it (C(libgomp.so.1) is in
    C(libgomp1)). The CPU backend variants (C(libggml-cpu-*.so)) are loaded with dlopen at run time, so C(ldd) on
    the binary alone does not see their needs; each of them is checked too.
  - A binary killed by a signal is named with the signal; SIGILL means it was built for CPU features this node's
    CPU (on a VM, its CPU type) does not offer.
  - Reads only; changes nothing.
version_added: 0.1.0
author: llmgw.fleet developers (@llmgw)
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.attributes.INFO_MODULE
  - llmgw.fleet.engine
  - llmgw.fleet.engine.TIMEOUT
options:
  binaries:
    description: The binaries that must start, relative to O(engine_dir), each with the arguments it is run with
      (they should load the backends and exit at once).
    type: dict
    default: {llama-server: [--verbose, --list-devices], ggml-rpc-server: [--help]}
notes:
  - Needs C(ldd) (Debian package libc-bin, always installed); without it only the run is checked.
"""

EXAMPLES = r"""
- name: The engine starts on this node
  llmgw.fleet.engine_preflight:
    engine_dir: /opt/llmgw/engines/llama.cpp/b11434
"""

RETURN = r"""
problems:
  description: Every reason found that the engine cannot start; empty when it starts.
  returned: always
  type: list
  elements: dict
  sample:
    - kind: missing_library
      library: libgomp.so.1
      package: libgomp1
      files: [llama-server, libggml-cpu-haswell.so]
      message: "libgomp.so.1 is not installed (needed by llama-server, libggml-cpu-haswell.so): install the
        Debian package libgomp1 (apt-get install libgomp1)"
missing_packages:
  description: Debian packages that would provide the missing libraries.
  returned: always
  type: list
  elements: str
  sample: [libgomp1]
ran:
  description: The command each binary was run with and its exit status.
  returned: always
  type: dict
  sample: {llama-server: {argv: [/opt/llmgw/engines/llama.cpp/b11434/llama-server, --verbose, --list-devices], rc: 0}}
"""

import glob
import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import runtime


def ldd(path):
    _code, stdout, stderr, error = runtime.run_binary(["ldd", path], 60)
    return "" if error else stdout + stderr


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine_dir=dict(type="path", required=True),
            binaries=dict(type="dict", default={"llama-server": ["--verbose", "--list-devices"],
                                                "ggml-rpc-server": ["--help"]}),
            timeout=dict(type="int", default=60),
        ),
        supports_check_mode=True,
    )
    engine_dir = module.params["engine_dir"]
    problems, ran = [], {}
    if not os.path.isdir(engine_dir):
        module.fail_json(msg="engine directory %s does not exist: the engine is not installed" % engine_dir,
                         problems=[], missing_packages=[], ran={})
    have_ldd = shutil.which("ldd") is not None
    libraries = sorted(glob.glob(os.path.join(engine_dir, "libggml*.so")) +
                       glob.glob(os.path.join(engine_dir, "libllama*.so")))
    library_reports = {path: ldd(path) for path in libraries} if have_ldd else {}
    for name, args in sorted(module.params["binaries"].items()):
        path = os.path.join(engine_dir, name)
        if not os.path.isfile(path):
            problems.append({"kind": "absent", "file": path, "message": "%s is not in %s" % (name, engine_dir)})
            continue
        if not os.access(path, os.X_OK):
            problems.append({"kind": "not_executable", "file": path, "message": "%s is not executable" % path})
            continue
        reports = dict(library_reports)
        if have_ldd:
            reports[path] = ldd(path)
        args = [str(a) for a in (args or [])]
        code, _out, err, error = runtime.run_binary([path] + args, module.params["timeout"])
        ran[name] = {"argv": [path] + args, "rc": code}
        if error:
            problems.append({"kind": "timeout", "file": path, "message": "%s %s did not exit: %s"
                             % (path, " ".join(args), error)})
            continue
        problems.extend(runtime.start_problems(path, code, err, reports))
    problems = runtime.merge_missing(problems)
    missing_packages = sorted({p["package"] for p in problems if p.get("package")})
    result = dict(changed=False, problems=problems, missing_packages=missing_packages, ran=ran)
    if problems:
        module.fail_json(msg="the engine in %s will not start: %s" % (engine_dir, "; ".join(
            p["message"] for p in problems)), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
