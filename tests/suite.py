"""`make test`: every stage of the suite in order, the lab torn down whatever happens, a time summary at the end.

The last line is the plain closing line CI reads ("suite: N passed, N failed, N skipped"), counted from the
pytest stage's JUnit report and failing stages.
"""

import argparse
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
SANITY_ROOT = os.path.join("/tmp", "llmgw-fleet-sanity", "ansible_collections", "llmgw", "fleet")
JUNIT = os.path.join(REPO, ".build", "pytest-junit.xml")
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


def stage_sanity():
    """ansible-test wants the collection at ansible_collections/NS/NAME: sanity runs on a copy of the tree."""
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
    return run([os.path.join(BIN, "ansible-test"), "sanity", "--local", "--python", "3.11", "--color", "no"],
               cwd=SANITY_ROOT)


PYTEST_PATHS = ["tests/unit", "tests/examples", "tests/lab/tests", "tests/e2e"]


def stage_engine_build():
    return run([PY, os.path.join("tests", "lab", "engine", "build.py")])


def stage_lab_up():
    return run([PY, "-m", "pve_lab", "up"])


def stage_pytest(paths):
    return run([PY, "-m", "pytest", "-p", "no:cacheprovider", "--junitxml", JUNIT, "-ra"] + paths)


def stage_lab_down():
    return run([PY, "-m", "pve_lab", "down", "--verify"])


def junit_counts():
    if not os.path.exists(JUNIT):
        return 0, 0, 0
    suites = ET.parse(JUNIT).getroot().iter("testsuite")
    total = failed = skipped = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["lint", "sanity", "units"])
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.path.join(REPO, "tests", "lab")
    os.environ["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(REPO, ".build", "collections")
    if os.path.exists(JUNIT):
        os.remove(JUNIT)

    stages = {
        "lint": [("lint", stage_lint)],
        "sanity": [("sanity", stage_sanity)],
        "units": [("units", lambda: stage_pytest(["tests/unit"]))],
    }.get(args.only) or [
        ("lint", stage_lint),
        ("sanity", stage_sanity),
        ("lab up", stage_lab_up),
        ("engine build (cached per machine)", stage_engine_build),
        ("pytest (units, lab, end-to-end)", lambda: stage_pytest(PYTEST_PATHS)),
    ]

    results = []
    try:
        for name, fn in stages:
            start = time.monotonic()
            rc = fn()
            results.append((name, rc, time.monotonic() - start))
    finally:
        if not args.only:
            start = time.monotonic()
            rc = stage_lab_down()
            results.append(("lab down (verified empty)", rc, time.monotonic() - start))

    print("\nstage time summary")
    for name, rc, seconds in results:
        print("  {:<40} {:>7.1f} s  {}".format(name, seconds, "ok" if rc == 0 else f"FAILED (rc {rc})"))
    failed_stages = [name for name, rc, _ignored in results if rc != 0]
    passed, failed, skipped = junit_counts()
    non_pytest_failures = len([n for n in failed_stages if not n.startswith("pytest")])
    print(f"suite: {passed} passed, {failed + non_pytest_failures} failed, {skipped} skipped")
    return 1 if failed_stages else 0


if __name__ == "__main__":
    sys.exit(main())
