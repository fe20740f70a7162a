"""The running lab as the lab benchmarks use it: connection data, a client, ansible-playbook runs, and the
benchmarks' own VMs (named ``bench-<octet>``, octets 190-199 and 241-250, VMID 1000 + octet), removed after use.

The lab is used as found here; run.py brings it up when it is down and takes down only a lab it started.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.parse

import yaml
from figures import COLLECTIONS, REPO, Report

from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import ProxmoxClient, settings_from_params
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import NotFound

LAB_DIR = os.path.join(REPO, ".lab")
CONNECTION_FILE = os.path.join(LAB_DIR, "connection.yml")
LAB_INVENTORY = os.path.join(REPO, "inventories", "lab", "hosts.yml")
BIN = os.path.dirname(sys.executable)
PREFIX = "bench-"
OCTETS = list(range(190, 200)) + list(range(241, 251))
TIMEOUT = 600


def why_not_up():
    """None when the lab answers, else a plain reason."""
    if not os.path.exists(CONNECTION_FILE):
        return "the lab is not up (no .lab/connection.yml; `make lab-up` starts it)"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests", "lab"))
    proc = subprocess.run([sys.executable, "-m", "pve_lab", "status"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    if proc.returncode != 0:
        return "the lab does not answer (`make lab-status`): " + (proc.stdout + proc.stderr).strip()[-300:]
    return None


class Lab:
    def __init__(self):
        with open(CONNECTION_FILE) as handle:
            self.data = yaml.safe_load(handle)
        self.node = self.data.get("pve_node", "pve")
        self.template_vmid = int(self.data.get("template_vmid", 9000))
        self.gateway = self.data.get("gateway", "10.77.0.1")
        self.private_key = self.data["ssh_private_key"]
        with open(self.data["ssh_public_key"]) as handle:
            self.public_key = handle.read().strip()
        params = {"api_host": self.data["api_host"], "api_port": self.data["api_port"],
                  "api_token_id": self.data["api_token_id"], "api_token_secret": self.data["api_token_secret"],
                  "ca_path": self.data["ca_cert"]}
        self.client = ProxmoxClient.connect(settings_from_params(params), poll_interval=0.2)

    @staticmethod
    def name(octet):
        return "%s%d" % (PREFIX, octet)

    @staticmethod
    def address(octet):
        return "10.77.0.%d" % octet

    def bench_vms(self):
        return [g for g in self.client.qemu_vms() if (g.get("name") or "").startswith(PREFIX)]

    def vm(self, name):
        return next((g for g in self.bench_vms() if g.get("name") == name), None)

    def remove(self, names=None):
        """Stop and destroy the benchmarks' VMs (all of them, or those named)."""
        for guest in self.bench_vms():
            if names is not None and guest["name"] not in names:
                continue
            try:
                if guest.get("status") == "running":
                    self.client.stop_vm(guest["node"], guest["vmid"], TIMEOUT)
                self.client.delete_vm(guest["node"], guest["vmid"], TIMEOUT)
            except NotFound:
                pass

    def stop(self, name):
        guest = self.vm(name)
        self.client.stop_vm(guest["node"], guest["vmid"], TIMEOUT)

    # ---- the floor: what the lab itself takes from clone to a node that answers ssh

    def clone_start_to_ssh(self, octet, cores=4, memory=4096):
        """Clone the template, configure and start the VM as provisioning does, and wait until ssh answers with
        cloud-init done (the same readiness provisioning waits for); returns seconds. Plain API calls and ssh,
        no Ansible, no checks: the floor any tool pays on this lab."""
        name, address, vmid = self.name(octet), self.address(octet), 1000 + octet
        started = time.monotonic()
        self.client.clone_vm(self.node, self.template_vmid, vmid, name, TIMEOUT, full=True)
        self.client.update_config(self.node, vmid, {
            "cpu": "host", "cores": cores, "memory": memory, "agent": 1, "ciuser": "debian",
            "sshkeys": urllib.parse.quote(self.public_key, safe=""),
            "ipconfig0": "ip=%s/24,gw=%s" % (address, self.gateway)}, TIMEOUT)
        self.client.start_vm(self.node, vmid, TIMEOUT)
        deadline = started + TIMEOUT
        argv = ["ssh", "-i", self.private_key, "-o", "BatchMode=yes", "-o", "ConnectTimeout=2",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "debian@" + address, "cloud-init status --wait >/dev/null; hostname"]
        while True:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)
            if proc.returncode == 0 and proc.stdout.strip() == name:
                return time.monotonic() - started
            if time.monotonic() > deadline:
                raise SystemExit("%s (%s) did not answer ssh: %s" % (name, address, proc.stderr.strip()))
            time.sleep(0.2)


def ansible_env(**extra):
    env = dict(os.environ)
    env.update(ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_NOCOLOR="1",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_HOST_KEY_CHECKING="False")
    env.update(extra)
    return env


def run_playbook(playbook, inventories, extra_vars, log_path, forks=None, env=None):
    """ansible-playbook, timed; returns seconds, raises with the log's tail when it fails."""
    argv = [os.path.join(BIN, "ansible-playbook"), playbook]
    for inventory in inventories:
        argv += ["-i", inventory]
    if extra_vars:
        argv += ["-e", json.dumps(extra_vars)]
    if forks:
        argv += ["--forks", str(forks)]
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=ansible_env(**(env or {})),
                              timeout=TIMEOUT * 2, check=False)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        with open(log_path) as log:
            text = log.read()
        error = next((line.strip() for line in text.splitlines() if line.startswith("[ERROR]")), "")
        raise PlaybookFailed("%s failed (rc %d) after %.0f s: %s\nlog %s:\n%s" % (
            os.path.basename(playbook), proc.returncode, seconds, error, log_path, text[-3000:]))
    return seconds


class PlaybookFailed(Exception):
    pass


def busy_seconds():
    """CPU-seconds this machine has been busy since boot, over all its cores (/proc/stat: everything but idle and
    iowait, and steal: user, nice, system, irq, softirq). On the lab every part of a run (ansible-playbook and its
    workers, the lab's API, the nodes) shares these cores, so the difference across a run is what the whole run
    cost."""
    with open("/proc/stat") as handle:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in handle.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def lab_main(doc, bench, figure, quick_help, measure, argv=None, missing=None):
    """The command line every lab benchmark shares (``--quick``, ``--json`` for run.py): ``figure`` is reported
    not measured, with the reason, when the lab does not answer or ``missing`` says what the bench lacks;
    otherwise ``measure(report, quick)`` adds the figures."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", help="write the figures to this file (for run.py)")
    args = parser.parse_args(argv)
    report = Report(bench)
    reason = missing or why_not_up()
    if reason:
        report.skip(figure, reason)
    else:
        measure(report, args.quick)
    report.write(args.json)
    return 0
