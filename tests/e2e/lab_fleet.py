"""A test's own small fleet on the lab: lab VMs provisioned side by side with provision_node.yml and registered ready
with fleet_node (no onboarding: the tests that use it are about replicas), its own registry, known_hosts, model
catalogue and gateway (HAProxy on loopback) under a temporary directory, and ways to run playbooks against it and to
reach its nodes. tests/e2e/test_replicas.py and test_drain_node.py use it, each with its own addresses."""

import contextlib
import json
import os
import subprocess
import sys
import time

import yaml
from helpers import REPO, ScratchGateway, ansible_env, run_playbook, write_destroy_playbook

from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

LAB_INVENTORY = os.path.join(REPO, "inventories", "lab", "hosts.yml")


class LabFleet:
    """``nodes`` maps each node name to (address, fabric); ``models`` is the fleet_models catalogue."""

    def __init__(self, root, nodes, models, gpus=8):
        self.root = str(root)
        self.nodes, self.models, self.gpus = dict(nodes), models, gpus
        self.db = os.path.join(self.root, "fleet.db")
        self.known_hosts = os.path.join(self.root, "known_hosts")
        with open(os.path.join(REPO, ".lab", "connection.yml")) as handle:
            self.lab = yaml.safe_load(handle)
        # The test's own gateway, on loopback: every playbook of the test makes it follow the test's registry.
        self.gateway = ScratchGateway(os.path.join(self.root, "gateway"))
        self.gateway_key, self.gateway_port = self.gateway.key, self.gateway.port

    def vars(self, **extra):
        out = {"fleet_registry": self.db, "fleet_known_hosts_file": self.known_hosts, "fleet_models": self.models}
        out.update(self.gateway.vars)
        out.update(extra)
        return out

    def play(self, playbook, check=False, **extra):
        path = playbook if os.path.isabs(playbook) else os.path.join(REPO, "playbooks", playbook)
        started = time.monotonic()
        run = run_playbook(path, self.vars(**extra), check=check, inventory=LAB_INVENTORY)
        shown = " ".join("%s=%s" % kv for kv in sorted(extra.items()) if isinstance(kv[1], (str, int)))
        print("  %s %s: %.1f s" % (os.path.basename(path), shown, time.monotonic() - started))
        return run

    def ssh(self, node, command, check=True):
        address = self.nodes[node][0]
        proc = subprocess.run(
            ["ssh", "-i", self.lab["ssh_private_key"], "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
             "-o", "HostKeyAlias=" + node, "-o", "UserKnownHostsFile=" + self.known_hosts,
             "-o", "StrictHostKeyChecking=yes", "debian@" + address, command],
            capture_output=True, text=True, timeout=60, check=False)
        if check:
            assert proc.returncode == 0, (node, command, proc.stderr)
        return proc

    def vmid(self, node):
        return 1000 + int(self.nodes[node][0].rsplit(".", 1)[1])

    def replica(self, name):
        with FleetRegistry(self.db) as registry:
            return registry.get_replica(name)

    def node(self, name):
        with FleetRegistry(self.db) as registry:
            return registry.get_node(name)

    def snapshot(self):
        with FleetRegistry(self.db) as registry:
            return registry.snapshot()


def ok(run):
    assert not run.failed, ("rc %d, stats %s\n" % (run.rc, run.report["stats"]) + "\n".join(
        str(m) for m in run.failure_messages()) + run.stderr[-3000:])
    return run


def listening_ports(fleet, node):
    """TCP ports something listens on, on the node (ss), but for ssh."""
    out = fleet.ssh(node, "ss -Htln").stdout
    ports = {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()}
    return ports - {22}


def shard_units(fleet, node):
    """The llmgw-shard units on the node, running or only a unit file."""
    out = fleet.ssh(node, "ls /etc/systemd/system/ | grep '^llmgw-shard-' || true").stdout
    return sorted(out.split())


def destroy_vms(fleet):
    run_playbook(os.path.join(fleet.root, "destroy.yml"), fleet.vars(), inventory=LAB_INVENTORY)


def provision_in_parallel(fleet):
    """provision_node.yml for every node at once, each with its own known_hosts (merged afterwards)."""
    procs = {}
    for name, (address, _fabric) in sorted(fleet.nodes.items()):
        argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", LAB_INVENTORY,
                os.path.join(REPO, "playbooks", "provision_node.yml"), "-e", json.dumps(fleet.vars(
                    node=name, address=address + "/24", fleet_known_hosts_file=fleet.known_hosts + "." + name))]
        procs[name] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env=ansible_env(), cwd=REPO)
    for name, proc in procs.items():
        out = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, (name, out[-3000:])
    with open(fleet.known_hosts, "w") as merged:
        for name in sorted(fleet.nodes):
            with open(fleet.known_hosts + "." + name) as part:
                merged.write(part.read())


@contextlib.contextmanager
def running(fleet):
    """The fleet's VMs provisioned and registered ready, its gateway set up; destroyed at the end (unless
    LLMGW_LAB_KEEP_VMS=1)."""
    write_destroy_playbook(os.path.join(fleet.root, "destroy.yml"), sorted(fleet.nodes))
    destroy_vms(fleet)
    try:
        provision_in_parallel(fleet)
        register = os.path.join(fleet.root, "register.yml")
        with open(register, "w") as handle:
            handle.write(
                "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                "    - name: Register the nodes ready\n      llmgw.fleet.fleet_node:\n"
                "        name: '{{ item.name }}'\n        address: '{{ item.address }}'\n"
                "        fabric: '{{ item.fabric }}'\n        gpu_count: %d\n        gpu_type: sim\n"
                "        status: ready\n        last_seen: now\n        db: '{{ fleet_registry }}'\n"
                "      loop: %s\n" % (fleet.gpus, json.dumps([{"name": n, "address": a, "fabric": f}
                                                             for n, (a, f) in sorted(fleet.nodes.items())])))
        ok(fleet.play(register))
        ok(fleet.play("gateway.yml"))
        yield fleet
    finally:
        fleet.gateway.stop()
        if os.environ.get("LLMGW_LAB_KEEP_VMS") != "1":
            destroy_vms(fleet)
