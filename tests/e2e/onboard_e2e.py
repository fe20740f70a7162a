"""What the add_node / onboard end-to-end tests share: real ansible-playbook runs of the collection's playbooks on
the lab inventory, controller state under a test's own directory, and the VMs they create (names ``on-*``, VMIDs
1110-1129) removed before and after.

The lab is used as found (pve_vm_e2e.lab_session's rule): brought up only when it is down, and down again after.
"""

import os
import subprocess

from helpers import REPO, run_playbook
from pve_vm_e2e import Lab, lab_cli, lab_is_up
from test_engine_checks import load_build

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_registry

INVENTORY = os.path.join(REPO, "inventories", "lab")
PREFIX = "on-"
OWN_VMIDS = range(1110, 1130)  # 1000 + this work's octets 110..129
FLEET_CLI = os.path.join(REPO, "bin", "fleet")


def lab_session(vmids=OWN_VMIDS):
    """The lab, the on-* VMs with a VMID in ``vmids`` (the caller's own: the files run side by side under
    tests/suite.py) removed before and after."""
    brought_up = False
    if not lab_is_up():
        proc = lab_cli("up")
        assert proc.returncode == 0, "lab up failed:\n%s\n%s" % (proc.stdout, proc.stderr)
        brought_up = True
    lab = Lab()
    remove_own_vms(lab, vmids=vmids)
    try:
        yield lab
    finally:
        remove_own_vms(lab, vmids=vmids)
        if brought_up:
            lab_cli("down")


def remove_own_vms(lab, prefix=PREFIX, vmids=OWN_VMIDS):
    for guest in lab.client.qemu_vms():
        if guest["vmid"] in vmids and (guest.get("name") or "").startswith(prefix):
            lab.destroy(guest["vmid"])


def lab_with_own_vms(prefix, vmids):
    """The running lab, a test's own VMs (its name prefix and VMID range) destroyed before and after (kept after with
    LLMGW_LAB_KEEP_VMS=1)."""
    lab = Lab()
    remove_own_vms(lab, prefix, vmids)
    try:
        yield lab
    finally:
        if os.environ.get("LLMGW_LAB_KEEP_VMS") != "1":
            remove_own_vms(lab, prefix, vmids)


def engine_vars(engine):
    return {"fleet_engine_archive": engine["archive"], "fleet_engine_archive_sha256": engine["sha256"]}


class Controller:
    """The controller-side state of one test (known_hosts, fleet CA, registry), never the lab's shared .lab/fleet."""

    def __init__(self, root, engine):
        self.root = str(root)
        self.known_hosts = os.path.join(self.root, "known_hosts")
        self.ca_dir = os.path.join(self.root, "ca")
        self.registry = os.path.join(self.root, "fleet.db")
        self.engine = engine

    def extra_vars(self, node, octet, **overrides):
        extra = {"node": node, "address": "10.77.0.%d/24" % octet, "fleet_known_hosts_file": self.known_hosts,
                 "fleet_ca_dir": self.ca_dir, "fleet_registry": self.registry}
        extra.update(engine_vars(self.engine))
        extra.update(overrides)
        return extra

    def play(self, playbook, node, octet, check=False, **overrides):
        """``ansible-playbook llmgw.fleet.<playbook>`` with the lab inventory."""
        return run_playbook("llmgw.fleet." + playbook, self.extra_vars(node, octet, **overrides), check=check,
                            inventory=INVENTORY)

    def record(self, node):
        if not os.path.exists(self.registry):
            return None
        with fleet_registry.FleetRegistry(self.registry, create=False) as registry:
            return registry.get_node(node)

    def fleet_status(self):
        proc = subprocess.run([FLEET_CLI, "status", "--db", self.registry], capture_output=True, text=True,
                              check=True)
        return proc.stdout

    def ssh(self, node, octet, command):
        return subprocess.run(
            ["ssh", "-i", Lab().data["ssh_private_key"], "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", "UserKnownHostsFile=" + self.known_hosts, "-o", "HostKeyAlias=" + node,
             "debian@10.77.0.%d" % octet, command], capture_output=True, text=True, timeout=120, check=True).stdout


def lab_engine():
    return load_build().build()


def task_results(run, name):
    """Results of the task called ``name``, also inside a role (the report names it ``ROLE : name``)."""
    found = []
    for play in run.report["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == name or task["task"]["name"].endswith(" : " + name):
                found.extend(task["hosts"].values())
    return found


def assert_refused_not_ready(controller, run, node, prefix, *parts):
    """The run failed with ``prefix`` and every part in one message; the registry keeps the node pending with the
    parts in one of its reasons, and `bin/fleet status` shows that reason."""
    assert run.failed
    messages = [m for m in run.failure_messages() if m]
    assert any(prefix in m and all(part in m for part in parts) for m in messages), messages
    record = controller.record(node)
    assert record is not None and record["state"] == "pending", record
    assert any(all(part in reason for part in parts) for reason in record["reasons"]), record["reasons"]
    status = controller.fleet_status()
    assert node in status and parts[0] in status, status
    return record
