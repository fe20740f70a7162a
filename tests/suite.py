"""`make test`: every stage of the suite in order, the lab torn down whatever happens, a time summary at the end.

The last line is the plain closing line CI reads ("suite: N passed, N failed, N skipped"), counted from the JUnit
reports of the stages that run tests (ansible-test units, ansible-doc, pytest) and the other stages that failed.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(REPO, ".venv", "bin")
PY = os.path.join(BIN, "python")
# Outside the repository: inside it, ansible-test would ask git for the files and find .build/ ignored.
# LLMGW_SANITY_DIR lets two checkouts on one machine run sanity or units at the same time.
SANITY_ROOT = os.path.join(os.environ.get("LLMGW_SANITY_DIR", "/tmp/llmgw-fleet-sanity"),
                           "ansible_collections", "llmgw", "fleet")
JUNIT = os.path.join(REPO, ".build", "pytest-junit.xml")
# Every stage that runs tests leaves its JUnit report here; the closing line counts them all.
JUNIT_DIR = os.path.join(REPO, ".build", "junit")
E2E_JUNIT = os.path.join(JUNIT_DIR, "e2e.xml")
GET_PIP_CACHE = os.path.expanduser("~/.ansible/test/cache/get_pip_24_2.py")


def run(argv, cwd=REPO):
    print("+ " + " ".join(argv), flush=True)
    return subprocess.call(argv, cwd=cwd)


def stage_lint():
    checks = [
        [os.path.join(BIN, "ruff"), "check", "plugins", "tests"],
        [os.path.join(BIN, "yamllint"), "--strict", "."],
        [os.path.join(BIN, "ansible-lint"), "--profile", "production", "--offline"],
        [os.path.join(BIN, "antsibull-changelog"), "lint"],
    ]
    return max(run(argv) for argv in checks)


def copy_collection():
    """ansible-test wants the collection at ansible_collections/NS/NAME: it runs on a copy of the tree."""
    shutil.rmtree(SANITY_ROOT, ignore_errors=True)
    os.makedirs(SANITY_ROOT)
    files = subprocess.check_output(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO).decode().split("\0")
    for rel in filter(None, files):
        src = os.path.join(REPO, rel)
        if os.path.isfile(src):
            dst = os.path.join(SANITY_ROOT, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)
    os.makedirs(os.path.dirname(GET_PIP_CACHE), exist_ok=True)
    shutil.copy(os.path.join(REPO, "tests", "tools", "ansible_test_get_pip.py"), GET_PIP_CACHE)


def ansible_test(command):
    """ansible-test COMMAND on a fresh copy, with the venv's Python and packages (no requirements installed)."""
    copy_collection()
    env = dict(os.environ)
    # The copy is the collection ansible-test tests; the repository's own link must not shadow it.
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)
    argv = [os.path.join(BIN, "ansible-test"), command, "--local", "--python", "3.11", "--color", "no"]
    print("+ " + " ".join(argv), flush=True)
    return subprocess.call(argv, cwd=SANITY_ROOT, env=env)


def stage_sanity():
    return ansible_test("sanity")


def stage_units():
    """The unit tests under tests/unit/plugins/ as ansible-test runs them: modules and module_utils tests apart
    from controller code, each test in a forked process, on pytest-xdist workers."""
    rc = ansible_test("units")
    for report in glob.glob(os.path.join(SANITY_ROOT, "tests", "output", "junit", "*-units.xml")):
        shutil.copy(report, os.path.join(JUNIT_DIR, "ansible-test-" + os.path.basename(report)))
    return rc


def stage_antsibull_docs():
    """antsibull-docs' own lint of the plugin and role documentation (what docs.ansible.com would render)."""
    return run([os.path.join(BIN, "antsibull-docs"), "lint-collection-docs", "--plugin-docs", "."])


def stage_ansible_doc():
    """`ansible-doc llmgw.fleet.<each plugin>` (and each role) renders completely."""
    return run([PY, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--junitxml", os.path.join(JUNIT_DIR, "docs.xml"),
                os.path.join("tests", "examples", "test_ansible_doc.py")])


# tests/unit runs in the ansible-test units stage, tests/examples/test_ansible_doc.py in the docs stage.
# The lab's conformance tests and test_proxmox_client_lab.py switch faults on for every client of the lab (task
# delays, 503s on any path, the template's config lock): they run alone.
CLIENT_LAB = os.path.join("tests", "e2e", "test_proxmox_client_lab.py")
PYTEST_ARGS = ["tests/examples", "tests/lab/tests", CLIENT_LAB,
               "--ignore", os.path.join("tests", "examples", "test_ansible_doc.py"), "-m", "not heavy"]
# The other end-to-end files run two at a time (pytest-xdist; tests/e2e/conftest.py keeps each file, and the files
# that clean up the same VMs, on one worker): a file mostly waits on guests, ssh and playbooks, so two share the
# 2 cores without slowing each other much. Each file's VMs, registry, gateway and ports are its own.
E2E_ARGS = ["tests/e2e", "--ignore", CLIENT_LAB, "-m", "not heavy", "-n", "2", "--dist", "loadgroup"]
# `make faults`: the files that hold the heavy rows the suite leaves out (fault rows, a QEMU guest's boot), run
# whole on the lab: a heavy row of test_replicas.py needs the replicas its earlier rows placed.
FAULT_ARGS = [os.path.join("tests", "lab", "tests", "test_nodes_boot.py"),
              os.path.join("tests", "e2e", "test_replicas.py"),
              os.path.join("tests", "e2e", "test_controller_killed.py"),
              os.path.join("tests", "e2e", "test_api_faults_add_node.py"),
              os.path.join("tests", "e2e", "test_concurrent_runs.py"),
              os.path.join("tests", "e2e", "test_upgrade_engine.py"),
              os.path.join("tests", "e2e", "test_drain_node.py"),
              os.path.join("tests", "e2e", "test_model_disk_full.py")]


def stage_engine_build():
    return run([PY, os.path.join("tests", "lab", "engine", "build.py")])


def stage_real_model():
    """The real small model the lab inventory declares (docs-run's place_replica serves it)."""
    return run([PY, os.path.join("tests", "lab", "engine", "real_model.py")])


def stage_lab_up():
    return run([PY, "-m", "pve_lab", "up"])


def stage_pytest(paths, junit=JUNIT):
    # The slowest rows printed at the end: what to move to `make faults` or `make bench` when the suite grows.
    return run([PY, "-m", "pytest", "-p", "no:cacheprovider", "--junitxml", junit, "-ra", "--durations", "25"] + paths)


def stage_docs_run():
    """Every command README.md and docs/ tell a reader to type, run on the lab (tests/docs_run)."""
    return run([PY, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q", "--junitxml",
                os.path.join(JUNIT_DIR, "docs-run.xml"), os.path.join("tests", "docs_run")])


def stage_molecule():
    return run([PY, os.path.join("tests", "molecule", "run.py")])


def stage_lab_down():
    return run([PY, "-m", "pve_lab", "down", "--verify"])


def junit_counts():
    """(passed, failed, skipped) over every JUnit report the stages left."""
    total = failed = skipped = 0
    for report in [JUNIT] + sorted(glob.glob(os.path.join(JUNIT_DIR, "*.xml"))):
        if not os.path.exists(report):
            continue
        for suite in ET.parse(report).getroot().iter("testsuite"):
            total += int(suite.get("tests", 0))
            failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            skipped += int(suite.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["lint", "sanity", "units", "docs", "pytest-units", "molecule",
                                           "docs-run", "faults"])
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.path.join(REPO, "tests", "lab")
    os.environ["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(REPO, ".build", "collections")
    # Tools that call other tools by name (antsibull-docs runs ansible-galaxy and ansible-doc) find the venv's.
    os.environ["PATH"] = BIN + os.pathsep + os.environ.get("PATH", "")
    if os.path.exists(JUNIT):
        os.remove(JUNIT)
    shutil.rmtree(JUNIT_DIR, ignore_errors=True)
    os.makedirs(JUNIT_DIR)

    stages = {
        "lint": [("lint", stage_lint)],
        "sanity": [("sanity", stage_sanity)],
        "units": [("ansible-test units", stage_units)],
        "docs": [("antsibull-docs lint", stage_antsibull_docs),
                 ("ansible-doc renders every plugin", stage_ansible_doc)],
        "pytest-units": [("pytest units", lambda: stage_pytest(["tests/unit"]))],
        "molecule": [("molecule scenarios (lab VMs)", stage_molecule)],
        "docs-run": [("real model (cached per machine)", stage_real_model),
                     ("docs run (every documented command)", stage_docs_run)],
        "faults": [("lab up", stage_lab_up), ("engine build (cached per machine)", stage_engine_build),
                   # -s: each row group prints its figures (kill points converged, API faults, runs at once),
                   # which docs/reliability.md quotes from the last run.
                   ("pytest (the heavy rows)", lambda: stage_pytest(FAULT_ARGS + ["-s"]))],
    }.get(args.only) or [
        ("lint", stage_lint),
        ("sanity", stage_sanity),
        ("ansible-test units", stage_units),
        ("antsibull-docs lint", stage_antsibull_docs),
        ("ansible-doc renders every plugin", stage_ansible_doc),
        ("lab up", stage_lab_up),
        ("engine build (cached per machine)", stage_engine_build),
        ("real model (cached per machine)", stage_real_model),
        ("pytest (examples, lab conformance)", lambda: stage_pytest(PYTEST_ARGS)),
        ("pytest (end-to-end, two files at a time)", lambda: stage_pytest(E2E_ARGS, E2E_JUNIT)),
        ("docs run (every documented command)", stage_docs_run),
        ("molecule scenarios (lab VMs)", stage_molecule),
    ]

    results = []
    try:
        for name, fn in stages:
            start = time.monotonic()
            rc = fn()
            results.append((name, rc, time.monotonic() - start))
    finally:
        if not args.only or args.only == "faults":
            start = time.monotonic()
            rc = stage_lab_down()
            results.append(("lab down (verified empty)", rc, time.monotonic() - start))

    print("\nstage time summary")
    for name, rc, seconds in results:
        print("  {:<40} {:>7.1f} s  {}".format(name, seconds, "ok" if rc == 0 else f"FAILED (rc {rc})"))
    failed_stages = [name for name, rc, _ignored in results if rc != 0]
    passed, failed, skipped = junit_counts()
    # A stage whose tests failed is counted by its tests; one that failed otherwise (a linter) counts once.
    test_stages = ("pytest", "ansible-test units", "ansible-doc", "docs run")
    non_pytest_failures = len([n for n in failed_stages if not n.startswith(test_stages)])
    # A test stage that failed before writing its report (ansible-test units that could not start) still counts.
    failures = max(failed + non_pytest_failures, len(failed_stages))
    print(f"suite: {passed} passed, {failures} failed, {skipped} skipped")
    return 1 if failed_stages else 0


if __name__ == "__main__":
    sys.exit(main())
