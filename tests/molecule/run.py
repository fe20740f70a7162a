"""Run the molecule scenarios under extensions/molecule/ (`molecule test -s NAME` each) on the running lab.

    .venv/bin/python tests/molecule/run.py [SCENARIO ...] [--jobs N]

Prints each scenario's time and verdict, then a summary; exits 1 when one failed, 2 when the lab is not up. The
`pve` scenario needs a real Proxmox VE (PROXMOX_HOST and the LLMGW_PVE_* variables, docs/molecule.md): without
PROXMOX_HOST it is reported SKIPPED and not run. The lab is never brought up or down here. Each scenario's full
output goes to tests/output/molecule/NAME.log.
"""

import argparse
import concurrent.futures
import importlib.util
import os
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(REPO, ".venv", "bin")
SCENARIOS_DIR = os.path.join(REPO, "extensions", "molecule")
LOG_DIR = os.path.join(REPO, "tests", "output", "molecule")
LAB_CONNECTION = os.path.join(REPO, ".lab", "connection.yml")
REAL_PVE_SCENARIOS = {"pve"}
PRINT_LOCK = threading.Lock()


def say(line):
    with PRINT_LOCK:
        print(line, flush=True)


def discover():
    """Scenario names, longest first (side by side, the run then ends soonest), then any others alphabetically."""
    found = sorted(name for name in os.listdir(SCENARIOS_DIR)
                   if os.path.isfile(os.path.join(SCENARIOS_DIR, name, "molecule.yml")))
    preferred = ["onboard", "replica", "identity", "engine", "provision", "pve"]
    return [n for n in preferred if n in found] + [n for n in found if n not in preferred]


def lab_engine():
    """The lab's engine build (cached): built once here, so that scenarios running side by side do not race."""
    spec = importlib.util.spec_from_file_location("lab_engine_build",
                                                  os.path.join(REPO, "tests", "lab", "engine", "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


def scenario_env():
    env = dict(os.environ)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(REPO, ".build", "collections")
    env["LLMGW_LAB_KEEP"] = "1"
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["NO_COLOR"] = "1"
    if not env.get("LLMGW_ENGINE_ARCHIVE"):
        engine = lab_engine()
        env.update(LLMGW_ENGINE_ARCHIVE=engine["archive"], LLMGW_ENGINE_ARCHIVE_SHA256=engine["sha256"],
                   LLMGW_ENGINE_VERSION=engine["version"])
    return env


def skip_reason(name, env):
    if name in REAL_PVE_SCENARIOS and not env.get("PROXMOX_HOST"):
        return "PROXMOX_HOST is not set; this scenario needs a real Proxmox VE (docs/molecule.md)"
    return None


def failure_excerpt(log_path, lines=40):
    """What went wrong, from the scenario's log: from the first failed task on, else the log's end."""
    with open(log_path) as log:
        text = log.readlines()
    markers = ("fatal:", "failed:", "[ERROR]", "CRITICAL")
    first = next((i for i, line in enumerate(text) if line.lstrip().startswith(markers)), None)
    excerpt = text[max(0, first - 8):first + lines] if first is not None else text[-lines:]
    return "".join("    | " + line for line in excerpt).rstrip()


def run_scenario(name, env):
    """`molecule test -s NAME`; returns (verdict, seconds, log path)."""
    log_path = os.path.join(LOG_DIR, name + ".log")
    argv = [os.path.join(BIN, "molecule"), "test", "-s", name]
    say("molecule: %s: started (%s)" % (name, " ".join(argv[1:])))
    started = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.call(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    verdict = "PASSED" if rc == 0 else "FAILED"
    say("molecule: %s: %s in %.0f s (log %s)" % (name, verdict, seconds, os.path.relpath(log_path, REPO)))
    if rc != 0:
        say(failure_excerpt(log_path))
    return verdict, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("scenarios", nargs="*", help="scenario names (default: every one under extensions/molecule)")
    parser.add_argument("--jobs", type=int, default=3, help="scenarios run side by side (default 3)")
    options = parser.parse_args()

    available = discover()
    names = options.scenarios or available
    unknown = [n for n in names if n not in available]
    if unknown:
        parser.error("no such scenario: %s (there are: %s)" % (", ".join(unknown), ", ".join(available)))

    env = dict(os.environ)
    results = {}
    to_run = []
    for name in names:
        reason = skip_reason(name, env)
        if reason:
            results[name] = ("SKIPPED", 0.0)
            say("molecule: %s: SKIPPED: %s" % (name, reason))
        else:
            to_run.append(name)
    if any(n not in REAL_PVE_SCENARIOS for n in to_run) and not os.path.exists(LAB_CONNECTION):
        say("molecule: the lab is not up (%s is missing): run `make lab-up` first" % LAB_CONNECTION)
        return 2

    os.makedirs(LOG_DIR, exist_ok=True)
    started = time.monotonic()
    if to_run:
        env = scenario_env()
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
            futures = {name: pool.submit(run_scenario, name, env) for name in to_run}
            for name, future in futures.items():
                results[name] = future.result()
    wall = time.monotonic() - started

    say("\nmolecule summary:")
    for name in names:
        verdict, seconds = results[name]
        say("  %-12s %-8s %6.0f s" % (name, verdict, seconds))
    failed = [n for n in names if results[n][0] == "FAILED"]
    say("molecule: %d passed, %d failed, %d skipped in %.0f s (wall, %d side by side)" % (
        sum(1 for n in names if results[n][0] == "PASSED"), len(failed),
        sum(1 for n in names if results[n][0] == "SKIPPED"), wall, max(1, options.jobs)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
