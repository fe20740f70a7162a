"""Every documented command, run on the lab as a reader types it (tests/docs_run/documented.py says which are run,
run with --check, syntax-checked or listed, and why).

The commands run with bash from the root of a scratch copy of the repository: every entry of the repository is
linked there but ``inventories`` (copied) and ``.lab``, which holds links to the running lab's connection, keys and
CA only, so the fleet state the commands make (registry, known_hosts, fleet CA, the gateway's files) starts empty
and is the scratch copy's. The environment is a newcomer's inside ``make shell``: ``.venv/bin`` first on PATH, no
ANSIBLE_COLLECTIONS_PATH (the root's ansible.cfg finds the collection). A command that fails fails its test, named
by file and line. At the end the replicas and VMs the commands made are removed and the gateway they started is
stopped.

The lab inventory's nodes (node01, node02: VMIDs 1101, 1102) and its gateway port (127.0.0.1:8000) are used, as the
docs say: a VM of that name left by someone else is used and kept, and a port already taken fails the gateway's
command, saying so.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))

from documented import REPO, documented_commands  # noqa: E402
from helpers import run_playbook, write_destroy_playbook  # noqa: E402

from pve_lab import cli  # noqa: E402
from pve_lab.api.constants import LabPaths  # noqa: E402

LAB = os.path.join(REPO, ".lab")
COMMANDS = documented_commands()
LAB_SHARED = ("connection.yml", "api", "pki", "ssh", "nodes")  # the running lab; fleet/ and gateway/ stay scratch
TIMEOUT = 900
# Copied, not linked: inventories/lab finds the lab's state at its own ../../.lab, which through a link would be
# the repository's, not the scratch copy's.
COPIED = ("inventories",)
RAN = []

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(LAB, "connection.yml")),
                                reason="the lab is not up (make lab-up)")


def lab_vms():
    proc = subprocess.run([sys.executable, "-m", "pve_lab", "status"], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests", "lab")), check=False)
    rows = [line.split() for line in proc.stdout.splitlines()]
    return {row[2] for row in rows if len(row) > 2 and row[1].startswith("qemu/")}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("docs-run"))
    for entry in os.listdir(REPO):
        if entry in COPIED:
            shutil.copytree(os.path.join(REPO, entry), os.path.join(root, entry), symlinks=True)
        elif entry not in (".lab", ".git"):
            os.symlink(os.path.join(REPO, entry), os.path.join(root, entry))
    os.makedirs(os.path.join(root, ".lab"))
    for entry in LAB_SHARED:
        if os.path.exists(os.path.join(LAB, entry)):
            os.symlink(os.path.join(LAB, entry), os.path.join(root, ".lab", entry))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    env["PATH"] = os.path.join(REPO, ".venv", "bin") + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = os.path.join(REPO, ".venv")
    before = lab_vms()
    yield {"root": root, "env": env}
    print_summary()
    clean_up(root, before)


def print_summary():
    ran = [c for c in RAN if c.how == "run"]
    print("\ndocs-run: %d documented commands: %d run as written, %d in check mode, %d syntax-checked, %d listed "
          "(not run):" % (len(COMMANDS), len(ran), len([c for c in RAN if c.how == "check"]),
                          len([c for c in RAN if c.how == "syntax"]), len([c for c in COMMANDS if c.how == "listed"])))
    for command in COMMANDS:
        if command.how == "listed":
            print("  listed %s %s: %s" % (command.where, command.text, command.why))


def clean_up(root, vms_before):
    """The replicas the commands placed, the VMs they created, the gateway they started."""
    extra = {"fleet_registry": os.path.join(root, ".lab", "fleet", "fleet.db"),
             "fleet_known_hosts_file": os.path.join(root, ".lab", "fleet", "known_hosts")}
    inventory = os.path.join(root, "inventories", "lab")
    if os.path.exists(extra["fleet_registry"]):
        sys.path.insert(0, os.path.join(REPO, ".build", "collections"))
        from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

        with FleetRegistry(extra["fleet_registry"], create=False) as registry:
            names = [r["name"] for r in registry.list_replicas()]
        for name in names:
            run_playbook(os.path.join(REPO, "playbooks", "place_replica.yml"), dict(extra, replica=name,
                         state="absent"), inventory=inventory, cwd=root)
    made = sorted(lab_vms() - vms_before)
    if made:
        path = write_destroy_playbook(os.path.join(root, "destroy-docs-run.yml"), made)
        run_playbook(path, extra, inventory=inventory, cwd=root)
    cli.stop_gateway(LabPaths(os.path.join(root, ".lab")))  # what make lab-down does for the lab's own
    shutil.rmtree(os.path.join(root, ".lab"), ignore_errors=True)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_documented_command(scratch, command):
    text = command.argv_text()
    if text is None:
        pytest.skip("listed, not run: %s" % command.why)
    started = time.monotonic()
    proc = subprocess.run(["bash", "-c", text], cwd=scratch["root"], env=scratch["env"], capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)
    RAN.append(command)
    print("  %s (%s, %.1f s): %s" % (command.where, command.how, time.monotonic() - started, text))
    assert proc.returncode == 0, "%s, as documented (%s): %s\nexits %d:\n%s" % (
        command.where, command.how, json.dumps(text), proc.returncode, (proc.stdout + proc.stderr)[-4000:])
