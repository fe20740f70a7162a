"""Many runs at once on one controller: 16 add_node runs started together (one ansible-playbook process per node, as
16 operators or a CI matrix would), while reconcile runs over and over on the same registry.

After: every run ended 0 and its node is ready; no output says "database is locked"; the registry holds exactly the
16 nodes (writes in = rows out) and passes every check of ``registry_check.violations``; one fleet CA signed all 16
node certificates; the fleet's known_hosts has each node's key once. The test prints what it saw.

The speed probe is off here (``engine_speed_probe=false``): 16 engines measured at once on 2 cores would measure the
overload, and this row is about the controller's shared state, not speed. Heavy (``make faults``): about ten
minutes. Nodes cr-01..16 at 10.77.0.200-215 (VMIDs 1200-1215), destroyed before and after.
"""

import json
import os
import subprocess
import time

import pytest
from cryptography import x509
from helpers import BIN, REPO, ansible_env
from onboard_e2e import INVENTORY, Controller, lab_engine, lab_with_own_vms
from pve_vm_e2e import lab_is_up
from registry_check import violations

from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(not lab_is_up(), reason="the lab is not up (make lab-up)")]

PREFIX, OWN_VMIDS = "cr-", range(1200, 1216)
NODES = {"cr-%02d" % i: 199 + i for i in range(1, 17)}
OPTIONS = {"fabric": "ib-a", "gpus": 2, "gpu_type": "sim", "engine_speed_probe": False}
RECONCILE_RUNS = 20  # at most; the loop ends with the add_node runs


@pytest.fixture(scope="module")
def lab():
    yield from lab_with_own_vms(PREFIX, OWN_VMIDS)


def playbook_argv(name, extra_vars):
    return [os.path.join(BIN, "ansible-playbook"),
            "-i", INVENTORY, "llmgw.fleet." + name, "-e", json.dumps(extra_vars)]


def test_sixteen_add_node_runs_at_once_and_reconcile_meanwhile(lab, tmp_path):
    controller = Controller(tmp_path, lab_engine())
    env = ansible_env(ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    started = time.monotonic()
    adds = {node: subprocess.Popen(playbook_argv("add_node", controller.extra_vars(node, octet, **OPTIONS)),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
            for node, octet in sorted(NODES.items())}
    reconciles = []
    reconcile_vars = {"fleet_registry": controller.registry, "fleet_known_hosts_file": controller.known_hosts}
    while any(proc.poll() is None for proc in adds.values()) and len(reconciles) < RECONCILE_RUNS:
        proc = subprocess.run(playbook_argv("reconcile", reconcile_vars), capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=600, check=False)
        reconciles.append(proc)
        time.sleep(1)
    outputs = {node: proc.communicate(timeout=1800)[0] for node, proc in adds.items()}
    seconds = time.monotonic() - started

    failed = {node: out[-2500:] for node, out in outputs.items() if adds[node].returncode != 0}
    assert not failed, failed
    locked = [node for node, out in outputs.items() if "database is locked" in out]
    locked += ["reconcile #%d" % i for i, proc in enumerate(reconciles)
               if "database is locked" in proc.stdout + proc.stderr]
    assert locked == []
    # A reconcile may run before the registry exists (the first add_node creates it): that one says so and fails.
    reconcile_rcs = [proc.returncode for proc in reconciles]

    with FleetRegistry(controller.registry, create=False) as registry:
        nodes = registry.list_nodes()
    assert sorted(n["name"] for n in nodes) == sorted(NODES)
    assert {n["state"] for n in nodes} == {"ready"}, [(n["name"], n["state"], n["reasons"]) for n in nodes]
    assert violations(controller.registry) == []

    with open(os.path.join(controller.ca_dir, "ca.crt"), "rb") as handle:
        ca = x509.load_pem_x509_certificate(handle.read())
    for node in NODES:
        with open(os.path.join(controller.ca_dir, "nodes", node, "node.crt"), "rb") as handle:
            cert = x509.load_pem_x509_certificate(handle.read())
        cert.verify_directly_issued_by(ca)  # raises when another CA signed it
    with open(controller.known_hosts) as handle:
        names = [line.split()[0] for line in handle if line.strip() and not line.startswith("#")]
    assert sorted(names) == sorted(NODES), names
    print("\n16 add_node runs at once: %d ready in %.0f s, 0 'database is locked'; %d reconcile runs meanwhile "
          "(exit codes %s); one CA signed all 16 certificates; known_hosts holds 16 keys, one per node"
          % (len(nodes), seconds, len(reconciles), sorted(set(reconcile_rcs))))
