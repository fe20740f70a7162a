"""playbooks/provision_node.yml on the lab, through ansible-playbook: a hostile first boot, the host key read through
the guest agent and pinned, a re-created VM's changed key refused, the deliberate rebuild, and what a timeout says.

The hostile first boot is the lab fault ``pve_lab.nodes.hostile_boot``: seconds after sshd first answered, the node
replaces its host keys and keeps sshd down a while, cloud-init still running. The node logs the key it first served
and the one it keeps, so the tests can tell which one the fleet learned.

Every VM here is named fb-* at 10.77.0.160-169 (VMID 1160-1169, the role's default vmid_base); the fleet's
known_hosts is under tmp_path. The lab is used as found (brought up only when it is down, and then taken down).
"""

import os
import subprocess

import pytest
from helpers import run_playbook
from pve_vm_e2e import LAB_DIR, assert_ok, lab_session

from ansible_collections.llmgw.fleet.plugins.module_utils import first_boot, host_keys
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import (
    AgentNotConfigured,
    ProxmoxError,
    VMNotRunning,
)
from pve_lab.nodes import hostile_boot

PLAYBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "playbooks",
                        "provision_node.yml")
WAIT_TASK = "Wait through the first boot and settle the host key"
OWN_VMIDS = range(1160, 1170)
# sshd goes down 4 s after the wait first reached it, for long enough to be seen at a 2 s poll on a loaded machine
HOSTILE_SEEN = dict(trigger="client", after_s=4, outage_s=6)
# the agent path makes no ssh connection before cloud-init is done, so that fault cannot wait for a client
HOSTILE_UNSEEN = dict(trigger="listening", after_s=5, outage_s=4)
BANNER_STATES = (first_boot.AUTH_FAILED, first_boot.CLOUD_INIT_RUNNING)
OUTAGE_STATES = (first_boot.REFUSED, first_boot.RESET, first_boot.TIMED_OUT, first_boot.NO_ROUTE)
SSH_STATES = BANNER_STATES + OUTAGE_STATES + (first_boot.READY, first_boot.KEY_CHANGED)


class Node:
    def __init__(self, lab, octet):
        self.lab = lab
        self.octet = octet
        self.vmid = 1000 + octet
        self.name = "fb-%d" % octet
        self.ip = "10.77.0.%d" % octet
        self.address = self.ip + "/24"

    def served_key(self):
        """The ed25519 key the node's sshd serves now, read by ssh-keyscan (not by the code under test)."""
        out = subprocess.run(["ssh-keyscan", "-T", "5", "-t", "ed25519", self.ip], capture_output=True, text=True,
                             timeout=60, check=False).stdout
        keys = [line.split(None, 1)[1] for line in out.splitlines() if line and not line.startswith("#")]
        assert keys, "ssh-keyscan got no key from %s" % self.ip
        return keys[0]

    def clone_hostile(self, fault):
        """A stopped clone of the template whose first boot is hostile (provision_node finishes its config)."""
        self.lab.clone_bare(self.vmid, self.name)
        hostile_boot.arm(self.vmid, **fault)


@pytest.fixture(scope="module")
def lab():
    for session in lab_session(prefix="fb-", vmids=OWN_VMIDS):
        if session.data.get("backend", "nodes") != "nodes":
            pytest.skip("the lab runs without the node backend: no guest boots")
        yield session


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    """Fleet-side settings: the lab's operator key, a known_hosts file of these tests' own."""
    directory = tmp_path_factory.mktemp("fleet")
    return {
        "fleet_proxmox": lab.module_defaults(),
        "fleet_gateway": lab.gateway,
        "fleet_ssh_public_key_file": lab.data.get("ssh_public_key") or os.path.join(LAB_DIR, "ssh", "id_ed25519.pub"),
        "fleet_ssh_private_key_file": lab.data.get("ssh_private_key") or os.path.join(LAB_DIR, "ssh", "id_ed25519"),
        "fleet_known_hosts_file": str(directory / "known_hosts"),
    }


def provision(fleet, node, check=False, **extra):
    return run_playbook(PLAYBOOK, dict(fleet, node=node.name, address=node.address, **extra), check=check)


def wait_result(run):
    results = [r for name in (WAIT_TASK, "llmgw.fleet.provision : " + WAIT_TASK) for r in run.results(name)]
    assert len(results) == 1, run.report
    return results[0]


def known_text(fleet):
    path = fleet["fleet_known_hosts_file"]
    if not os.path.exists(path):
        return ""
    with open(path) as handle:
        return handle.read()


def known_entries(fleet, name):
    return host_keys.parse_known_hosts(known_text(fleet)).get(name, [])


def states(result):
    return [event["state"] for event in result["timeline"]]


def assert_succeeded(run):
    assert not run.failed, "provision_node failed: %s\n%s" % (run.failure_messages(), run.stderr[-2000:])


@pytest.fixture(scope="module")
def ssh_node(lab, fleet):
    """fb-161 provisioned through a hostile first boot, the key learned over ssh."""
    node = Node(lab, 161)
    node.clone_hostile(HOSTILE_SEEN)
    node.run = provision(fleet, node, host_key_source="ssh")
    assert_succeeded(node.run)
    return node


@pytest.fixture(scope="module")
def agent_node(lab, fleet):
    """fb-162 provisioned through a hostile first boot with the defaults (the key pinned through the agent)."""
    node = Node(lab, 162)
    node.clone_hostile(HOSTILE_UNSEEN)
    node.run = provision(fleet, node)
    assert_succeeded(node.run)
    return node


def assert_final_key_learned(fleet, node, result):
    log = hostile_boot.read_log(node.vmid)
    assert log.get("old") and log.get("new") and log["old"] != log["new"], "the hostile boot did not happen: %s" % log
    served = node.served_key()
    assert host_keys.fingerprint(served) == log["new"]
    entries = known_entries(fleet, node.name)
    assert [host_keys.fingerprint(" ".join(entry)) for entry in entries] == [log["new"]]
    assert result["host_key_fingerprint"] == log["new"]
    assert result["host_key_action"] == host_keys.LEARN


def test_provision_waits_through_a_hostile_first_boot_and_learns_the_final_key(fleet, ssh_node):
    result = wait_result(ssh_node.run)
    assert result["host_key_source"] == "ssh"
    assert_final_key_learned(fleet, ssh_node, result)
    seen = states(result)
    banner = [index for index, state in enumerate(seen) if state in BANNER_STATES]
    assert banner, "the key first served was never seen: %s" % result["timeline"]
    assert any(s in OUTAGE_STATES for s in seen[banner[0]:]), "the restart of sshd was not seen: %s" % seen
    assert seen[-1] == first_boot.READY


def test_provision_again_keeps_the_key_and_changes_nothing(fleet, ssh_node):
    before = known_text(fleet)
    run = provision(fleet, ssh_node, host_key_source="ssh")
    assert_succeeded(run)
    assert wait_result(run)["host_key_action"] == host_keys.KEEP
    assert run.changed == 0, run.report
    assert known_text(fleet) == before


def test_agent_pins_the_final_key_before_the_first_ssh_connection(fleet, agent_node):
    result = wait_result(agent_node.run)
    assert result["host_key_source"] == "agent"
    assert_final_key_learned(fleet, agent_node, result)
    seen = states(result)
    assert first_boot.AGENT_READY in seen, seen
    first_ssh = min(seen.index(s) for s in SSH_STATES if s in seen)
    assert first_ssh > seen.index(first_boot.AGENT_READY), "ssh was tried before the key was pinned: %s" % seen
    assert first_boot.KEY_CHANGED not in seen


def test_recreated_vm_is_refused_and_the_deliberate_rebuild_forgets_the_old_key(lab, fleet, agent_node, tmp_path):
    node = agent_node
    old_fingerprint = hostile_boot.read_log(node.vmid)["new"]
    assert_ok(lab.run(tmp_path, {"name": node.name, "address": node.address, "state": "absent"}))
    known_before = known_text(fleet)

    refused = provision(fleet, node)
    assert refused.failed
    new_fingerprint = host_keys.fingerprint(node.served_key())
    assert new_fingerprint != old_fingerprint
    message = " ".join(refused.failure_messages())
    for part in (node.name, old_fingerprint, new_fingerprint, "ssh-keygen -R %s" % node.name, "rebuild=true"):
        assert part in message, (part, message)
    result = wait_result(refused)
    assert (result["known_fingerprint"], result["offered_fingerprint"]) == (old_fingerprint, new_fingerprint)
    assert not any(s in SSH_STATES for s in states(result)), "ssh was tried with an unknown key: %s" % states(result)
    assert known_text(fleet) == known_before

    rebuilt = provision(fleet, node, rebuild=True)
    assert_succeeded(rebuilt)
    served = host_keys.fingerprint(node.served_key())
    assert served not in (old_fingerprint, new_fingerprint)
    assert [host_keys.fingerprint(" ".join(e)) for e in known_entries(fleet, node.name)] == [served]

    removed = provision(fleet, node, state="absent")
    assert_succeeded(removed)
    assert lab.vm(node.name) is None
    assert known_entries(fleet, node.name) == []


def test_client_talks_to_the_guest_agent_and_types_its_failures(lab, ssh_node):
    client, pve = lab.client, lab.node
    client.agent_ping(pve, ssh_node.vmid)
    assert client.agent_exec(pve, ssh_node.vmid, ["hostname"], timeout=30) == {
        "exitcode": 0, "out": ssh_node.name + "\n", "err": ""}
    failed = client.agent_exec(pve, ssh_node.vmid, ["sh", "-c", "echo oops >&2; exit 3"], timeout=30)
    assert (failed["exitcode"], failed["err"]) == (3, "oops\n")
    host_key = client.agent_read_file(pve, ssh_node.vmid, "/etc/ssh/ssh_host_ed25519_key.pub")
    assert host_keys.public_key(host_key) == ssh_node.served_key()
    with pytest.raises(ProxmoxError, match="/nonexistent"):
        client.agent_read_file(pve, ssh_node.vmid, "/nonexistent")

    bare = Node(lab, 163)
    lab.clone_bare(bare.vmid, bare.name)
    client.update_config(pve, bare.vmid, {"agent": 0}, 60)
    with pytest.raises(AgentNotConfigured):
        client.agent_ping(pve, bare.vmid)
    client.update_config(pve, bare.vmid, {"agent": 1}, 60)
    with pytest.raises(VMNotRunning):
        client.agent_exec(pve, bare.vmid, ["true"], timeout=30)
    lab.destroy(bare.vmid)


def test_check_mode_predicts_the_clone_and_the_learned_key_and_changes_nothing(lab, fleet):
    node = Node(lab, 168)
    before = known_text(fleet)
    run = provision(fleet, node, check=True)
    assert_succeeded(run)
    result = wait_result(run)
    assert (result["changed"], result["host_key_action"]) == (True, host_keys.LEARN)
    assert run.changed >= 2, run.report  # the clone and the key
    assert lab.vm(node.name) is None
    assert known_text(fleet) == before


def wait_args(fleet, node, **extra):
    args = {"name": node.name, "address": node.address, "private_key_file": fleet["fleet_ssh_private_key_file"],
            "known_hosts_file": fleet["fleet_known_hosts_file"], "timeout": 5}
    args.update(extra)
    return args


def test_timeouts_say_what_they_saw_last(lab, fleet, ssh_node, tmp_path):
    """Wrong ssh key: banner but authentication failed; a stopped VM: no route (or timed out) over ssh, not running
    through the agent. Each with a 5 s timeout, each naming the node and leaving the fleet's known_hosts alone."""
    wrong_key = str(tmp_path / "wrong_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", wrong_key], check=True)
    before = known_text(fleet)

    auth = lab.run(tmp_path, wait_args(fleet, ssh_node, private_key_file=wrong_key, host_key_source="ssh"),
                   module="llmgw.fleet.wait_for_node")
    assert auth.get("failed") and first_boot.AUTH_FAILED in auth["msg"], auth.get("msg")
    assert "was not ready after 5 s" in auth["msg"] and ssh_node.name in auth["msg"]

    # auto without the Proxmox connection options is ssh, and the key learned before is kept
    no_api = lab.run(tmp_path, wait_args(fleet, ssh_node, timeout=60), module="llmgw.fleet.wait_for_node",
                     defaults={"validate_certs": True})
    assert_ok(no_api)
    assert (no_api["host_key_source"], no_api["host_key_action"], no_api["changed"]) == ("ssh", host_keys.KEEP, False)
    assert no_api["host_key_source_reason"] == "no Proxmox connection options"

    stopped_node = Node(lab, 165)
    lab.clone_bare(stopped_node.vmid, stopped_node.name)  # never started: nothing answers at its address
    unreachable = lab.run(tmp_path, wait_args(fleet, stopped_node, host_key_source="ssh"),
                          module="llmgw.fleet.wait_for_node")
    assert unreachable.get("failed"), unreachable
    assert any(s in unreachable["msg"] for s in OUTAGE_STATES), unreachable["msg"]
    stopped = lab.run(tmp_path, wait_args(fleet, stopped_node, host_key_source="agent"),
                      module="llmgw.fleet.wait_for_node")
    assert stopped.get("failed") and first_boot.VM_NOT_RUNNING in stopped["msg"], stopped.get("msg")
    assert known_text(fleet) == before
    lab.destroy(stopped_node.vmid)
