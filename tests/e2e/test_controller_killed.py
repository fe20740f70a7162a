"""The controller killed halfway (SIGKILL of ansible-playbook and every process it started), at each stage of
add_node and during place_replica's launch; then the next run converges.

Kill points, each on its own node (ck-node01..04, 10.77.0.160-163): during the clone, while waiting through the first
boot, during the engine's upload and unpack, and after the certificate went to the node but before the registry
write; then, on a ready node, during the launch of a replica's shard. After each, one ordinary run of the same
playbook must make the node ready (the replica Ready), with one VM of that name on the lab, the fleet CA never
regenerated, a node certificate that existed when the run was killed never re-issued, and the registry passing every
check of ``registry_check.violations``. The test prints ``N kill points, N converged``.

Heavy (``make faults``): about ten minutes. VMs named ck-* (VMIDs 1160-1169) are destroyed before and after.
"""

import json
import os
import signal
import subprocess
import time

import pytest
from helpers import BIN, REPO, ansible_env, run_playbook
from onboard_e2e import INVENTORY, Controller, lab_engine, lab_with_own_vms
from pve_vm_e2e import lab_is_up
from registry_check import violations

from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(not lab_is_up(), reason="the lab is not up (make lab-up)")]

PREFIX, OWN_VMIDS = "ck-", range(1160, 1170)
# (node, octet, the task whose start is the moment, seconds after it starts)
ADD_NODE_KILLS = [
    ("ck-node01", 160, "Clone, configure and start the VM", 0.5),
    ("ck-node02", 161, "Wait through the first boot and settle the host key", 1.5),
    ("ck-node03", 162, "Unpack the archive into the versioned directory", 0.5),
    ("ck-node04", 163, "Record the node in the fleet registry, ready only if every check passed", 0.0),
]
REPLICA_KILL = ("Restart the leader", 0.2)
MODELS = {"sim-one": {"engine": "sim", "shards": 1, "gpus_per_shard": 1}}
# The speed probe is off: these rows prove convergence after a kill, and a node measured while the lab is busy
# would be refused for its speed against peers measured at a quieter moment (make faults found it so).
OPTIONS = {"fabric": "ib-a", "gpus": 2, "gpu_type": "sim", "engine_speed_probe": False}
RESULTS = []


@pytest.fixture(scope="module")
def lab():
    try:
        yield from lab_with_own_vms(PREFIX, OWN_VMIDS)
    finally:
        print("\ncontroller killed: %d kill points, %d converged (%s)" % (
            len(RESULTS), sum(1 for r in RESULTS if r["converged"]),
            "; ".join("%s at %r +%.1f s: killed after %.0f s, left %s" % (
                r["where"], r["task"], r["delay"], r["killed_after"], r["left"]) for r in RESULTS)))


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    return Controller(tmp_path_factory.mktemp("killed"), lab_engine())


def kill_at(argv, env, task, delay, timeout=600):
    """Run ``argv`` in its own process group; when the default callback prints the banner of ``task`` (the start
    of its name, in a role or not), wait ``delay`` seconds and SIGKILL the whole group. Returns (seconds until the
    kill, output); fails when the task never started."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("TASK [" + task) or (line.startswith("TASK [") and (" : " + task) in line):
                time.sleep(delay)
                kill_tree(proc.pid)
                proc.wait(timeout=30)
                return time.monotonic() - started, "".join(seen)
            assert time.monotonic() - started < timeout, "".join(seen[-40:])
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait(timeout=30)
    raise AssertionError("the run ended (rc %s) before %r started:\n%s" % (proc.returncode, task, "".join(seen[-60:])))


def descendants(pid):
    """``pid`` and every process below it, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def kill_tree(pid):
    """SIGKILL ``pid`` and every process it started. Its process group is not enough: ansible-core's workers start
    sessions of their own (setsid), so a worker forked just before the kill would run its task on, as an orphan
    (a wait_for_node that writes known_hosts after the controller "died"). Everything is stopped first, so that
    nothing forks between the listing and the kill."""
    stopped = set()
    for _attempt in range(3):  # what was forked while the first listing was read is stopped by the next
        for each in descendants(pid):
            if each not in stopped:
                try:
                    os.kill(each, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
                stopped.add(each)
    for each in stopped:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def killed_run(playbook, extra_vars, task, delay):
    argv = [os.path.join(BIN, "ansible-playbook"),
            "-i", INVENTORY, "llmgw.fleet." + playbook, "-e", json.dumps(extra_vars)]
    return kill_at(argv, ansible_env(ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default"), task, delay)


def read_bytes(path):
    if not os.path.exists(path):
        return None
    with open(path, "rb") as handle:
        return handle.read()


def left_behind(lab, controller, node):
    """What the killed run left: the VMs of that name, the node's state in the registry, its certificate."""
    record = controller.record(node)
    return "%d VM, registry %s, certificate %s" % (
        len([g for g in lab.client.qemu_vms() if g.get("name") == node]), record["state"] if record else "none",
        "issued" if os.path.exists(os.path.join(controller.ca_dir, "nodes", node, "node.crt")) else "none")


def assert_converged(lab, controller, node):
    record = controller.record(node)
    assert record is not None and record["state"] == "ready", record
    same_name = [g for g in lab.client.qemu_vms() if g.get("name") == node]
    assert len(same_name) == 1, same_name
    assert violations(controller.registry) == []


@pytest.mark.parametrize("node,octet,task,delay", ADD_NODE_KILLS, ids=[k[0] for k in ADD_NODE_KILLS])
def test_add_node_killed_then_the_next_run_converges(lab, controller, node, octet, task, delay):
    ca_before = read_bytes(os.path.join(controller.ca_dir, "ca.key"))
    extra = controller.extra_vars(node, octet, **OPTIONS)
    killed_after, output = killed_run("add_node", extra, task, delay)
    ca_at_kill = read_bytes(os.path.join(controller.ca_dir, "ca.key"))
    assert ca_before is None or ca_at_kill == ca_before, "the CA changed during the killed run"
    cert_path = os.path.join(controller.ca_dir, "nodes", node, "node.crt")
    cert_at_kill = read_bytes(cert_path)
    RESULTS.append({"where": node, "task": task, "delay": delay, "killed_after": killed_after, "converged": False,
                    "left": left_behind(lab, controller, node)})

    again = run_playbook("llmgw.fleet.add_node", extra, inventory=INVENTORY)
    assert not again.failed, (again.failure_messages(), output[-3000:])
    assert_converged(lab, controller, node)
    assert read_bytes(os.path.join(controller.ca_dir, "ca.key")) == ca_at_kill, "the fleet CA was regenerated"
    if cert_at_kill is not None:
        assert read_bytes(cert_path) == cert_at_kill, "the node certificate was issued again"
    RESULTS[-1]["converged"] = True


def test_place_replica_killed_during_the_launch_then_the_next_run_converges(lab, controller):
    node = ADD_NODE_KILLS[0][0]
    assert controller.record(node)["state"] == "ready"
    extra = {"fleet_known_hosts_file": controller.known_hosts, "fleet_registry": controller.registry,
             "fleet_models": MODELS, "replica": "ck-one", "model": "sim-one"}
    task, delay = REPLICA_KILL
    killed_after, output = killed_run("place_replica", extra, task, delay)
    with FleetRegistry(controller.registry, create=False) as registry:
        at_kill = registry.get_replica("ck-one")
    RESULTS.append({"where": "place_replica", "task": task, "delay": delay, "killed_after": killed_after,
                    "converged": False, "left": "replica %s" % (at_kill["state"] if at_kill else "none")})

    again = run_playbook("llmgw.fleet.place_replica", extra, inventory=INVENTORY)
    assert not again.failed, (again.failure_messages(), output[-3000:])
    with FleetRegistry(controller.registry, create=False) as registry:
        replica = registry.get_replica("ck-one")
    assert replica["state"] == "ready" and len(replica["shards"]) == 1, replica
    assert violations(controller.registry) == []
    node = replica["shards"][0]["node"]
    octets = {name: octet for name, octet, _task, _delay in ADD_NODE_KILLS}
    units = controller.ssh(node, octets[node], "systemctl list-units --all --plain --no-legend "
                           "'llmgw-shard-ck-one-*' | awk '{print $1, $3, $4}'")
    assert units.split() == ["llmgw-shard-ck-one-0.service", "active", "running"], units
    RESULTS[-1]["converged"] = True
