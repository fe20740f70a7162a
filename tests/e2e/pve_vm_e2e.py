"""What the pve_vm end-to-end tests share: the lab session, real ansible-playbook runs, snapshots of the cluster.

The lab is used as found: brought up only when it is down, and then taken down again at the end; every VM these
tests create is named with PREFIX and removed afterwards.
"""

import json
import os
import subprocess
import sys

import requests
import yaml

from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import ProxmoxClient, settings_from_params
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import NotFound

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB_DIR = os.path.join(REPO, ".lab")
CONNECTION_FILE = os.path.join(LAB_DIR, "connection.yml")
COLLECTIONS = os.path.join(REPO, ".build", "collections")
BIN = os.path.dirname(sys.executable)
PREFIX = "e2e-pvevm-"
# Every VMID these tests create or might create by mistake: 1000 + the octets 200..239, and the explicit ones.
OWN_VMIDS = frozenset(list(range(1200, 1240)) + [2221, 3210])
TIMEOUT = 900


def lab_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "tests", "lab")
    env["ANSIBLE_COLLECTIONS_PATH"] = COLLECTIONS
    return env


def lab_cli(*args):
    return subprocess.run([sys.executable, "-m", "pve_lab"] + list(args), cwd=REPO, env=lab_env(),
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


def lab_is_up():
    if not os.path.exists(CONNECTION_FILE):
        return False
    return lab_cli("status").returncode == 0


class Lab:
    """The lab's connection data (.lab/connection.yml) and a client on it."""

    def __init__(self):
        with open(CONNECTION_FILE) as handle:
            self.data = yaml.safe_load(handle)
        self.node = self.data.get("pve_node", "pve")
        self.template_vmid = int(self.data.get("template_vmid", 9000))
        self.template_name = self.data.get("template_name", "debian12-cloudinit")
        self.gateway = self.data.get("gateway", "10.77.0.1")
        self.ssh_public_key = self._public_key()
        self.client = ProxmoxClient.connect(settings_from_params(self.module_defaults()), poll_interval=0.5)

    def _public_key(self):
        path = self.data.get("ssh_public_key") or os.path.join(LAB_DIR, "ssh", "id_ed25519.pub")
        with open(os.path.expanduser(path)) as handle:
            return handle.read().strip()

    def module_defaults(self):
        """Connection options for group/llmgw.fleet.proxmox: token auth, TLS verified against the lab's CA."""
        data = self.data
        token_id = data.get("api_token_id") or "%s!%s" % (data.get("api_user", "root@pam"), data["token_name"])
        return {
            "api_host": data.get("api_host", "127.0.0.1"),
            "api_port": int(data.get("api_port", 8006)),
            "api_token_id": token_id,
            "api_token_secret": data["api_token_secret"],
            "ca_path": data.get("ca_cert") or os.path.join(LAB_DIR, "pki", "ca.pem"),
        }

    def password_defaults(self):
        data = self.data
        return {
            "api_host": data.get("api_host", "127.0.0.1"),
            "api_port": int(data.get("api_port", 8006)),
            "api_user": data.get("api_user", "root@pam"),
            "api_password": data["api_password"],
            "ca_path": data.get("ca_cert") or os.path.join(LAB_DIR, "pki", "ca.pem"),
        }

    def inject(self, faults):
        """Switch on lab faults (POST /lab/faults, loopback only): failing tasks, task delays, VM locks."""
        base = "https://%s:%s" % (self.data.get("api_host", "127.0.0.1"), self.data.get("api_port", 8006))
        answer = requests.post(base + "/lab/faults", json=faults, verify=self.module_defaults()["ca_path"], timeout=30)
        assert answer.status_code == 200, answer.text

    # ---- the cluster as seen through the API

    def vm(self, name):
        matches = [g for g in self.client.qemu_vms() if g.get("name") == name]
        assert len(matches) <= 1, matches
        return matches[0] if matches else None

    def config(self, vmid):
        return self.client.vm_config(self.node, vmid)

    def status(self, vmid):
        return self.client.vm_status(self.node, vmid).get("status")

    def snapshot(self):
        """What a refused (or check-mode) run must leave as it was: the guest list and each VM's config, digest
        included. The lab may serve other test runs at the same time, so the snapshot covers the guests these tests
        own (named PREFIX..., or with a VMID in OWN_VMIDS) and the template, and nothing of anybody else's."""
        guests = sorted(
            (
                {k: g.get(k) for k in ("vmid", "name", "node", "type", "template", "status")}
                for g in self.client.guests()
                if self._owned(g)
            ),
            key=lambda g: g["vmid"],
        )
        configs = {}
        for guest in guests:
            if guest["type"] == "qemu":
                try:
                    configs[guest["vmid"]] = self.client.vm_config(guest["node"], guest["vmid"])
                except NotFound:
                    configs[guest["vmid"]] = None
        return {"guests": guests, "configs": configs}

    def _owned(self, guest):
        return (
            (guest.get("name") or "").startswith(PREFIX)
            or guest["vmid"] in OWN_VMIDS
            or guest["vmid"] == self.template_vmid
        )

    def clone_bare(self, vmid, name):
        """A clone of the template with no configuration applied: what an interrupted run leaves."""
        self.client.clone_vm(self.node, self.template_vmid, vmid, name, TIMEOUT, full=True)

    def remove_test_vms(self, prefix=PREFIX, vmids=None):
        """Destroy the VMs named ``prefix``... (and, with ``vmids``, only those among them with such a VMID)."""
        for guest in self.client.qemu_vms():
            if (guest.get("name") or "").startswith(prefix) and (vmids is None or guest["vmid"] in vmids):
                self.destroy(guest["vmid"])

    def destroy(self, vmid):
        try:
            if self.status(vmid) == "running":
                self.client.stop_vm(self.node, vmid, TIMEOUT)
            self.client.delete_vm(self.node, vmid, TIMEOUT)
        except NotFound:
            pass

    # ---- ansible-playbook

    def run(self, tmp_path, args, check=False, module="llmgw.fleet.pve_vm", defaults=None, env=None):
        """Run one task of ``module`` through ansible-playbook; return its registered result."""
        out = tmp_path / ("result-%d.json" % len(list(tmp_path.glob("result-*.json"))))
        play = [{
            "name": "e2e",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "module_defaults": {"group/llmgw.fleet.proxmox": defaults or self.module_defaults()},
            "tasks": [
                {"name": "the task under test", module: args, "register": "result", "ignore_errors": True},
                {"name": "keep the result", "ansible.builtin.copy": {
                    "content": "{{ result | to_json }}", "dest": str(out)}, "check_mode": False},
            ],
        }]
        playbook = tmp_path / "play.yml"
        playbook.write_text(yaml.safe_dump(play))
        argv = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "--diff", str(playbook)]
        if check:
            argv.append("--check")
        run_env = dict(lab_env(), ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1")
        run_env.update(env or {})
        proc = subprocess.run(argv, cwd=str(tmp_path), env=run_env, capture_output=True, text=True,
                              timeout=TIMEOUT, check=False)
        assert out.exists(), "ansible-playbook did not get to record a result:\n%s\n%s" % (proc.stdout, proc.stderr)
        result = json.loads(out.read_text())
        result["_stdout"] = proc.stdout
        return result


def lab_session(prefix=PREFIX, vmids=None):
    """Yield a Lab, bringing the lab up only if it was down (and then down again), the caller's test VMs (named
    ``prefix``..., with a VMID in ``vmids`` when given) removed around."""
    brought_up = False
    if not lab_is_up():
        proc = lab_cli("up")
        assert proc.returncode == 0, "lab up failed:\n%s\n%s" % (proc.stdout, proc.stderr)
        brought_up = True
    lab = Lab()
    lab.remove_test_vms(prefix, vmids)
    try:
        yield lab
    finally:
        lab.remove_test_vms(prefix, vmids)
        if brought_up:
            lab_cli("down")


def vm_args(lab, name, octet, **extra):
    """The options of a fleet node named PREFIX+name at 10.77.0.<octet>/24, cloned from the lab's template."""
    args = {
        "name": PREFIX + name,
        "address": "10.77.0.%d/24" % octet,
        "gateway": lab.gateway,
        "clone": lab.template_name,
        "ciuser": "debian",
        "sshkeys": lab.ssh_public_key,
        "nameserver": lab.gateway,
        "timeout": 600,
    }
    args.update(extra)
    return args


def assert_ok(result):
    assert not result.get("failed"), "task failed: %s\n%s" % (result.get("msg"), result.get("_stdout", "")[-3000:])


def four_steps(lab, tmp_path, args):
    """check -> apply -> check -> apply: the first two change (the check predicting exactly what the apply does,
    and writing nothing), the last two change nothing. Returns the apply's result."""
    before = lab.snapshot()
    predicted = lab.run(tmp_path, args, check=True)
    assert_ok(predicted)
    assert predicted["changed"] is True
    assert lab.snapshot() == before, "check mode changed the cluster"

    applied = lab.run(tmp_path, args)
    assert_ok(applied)
    assert applied["changed"] is True
    assert applied["diff"] == predicted["diff"]
    for key in ("vmid", "node", "name", "cpu", "address", "status"):
        assert applied[key] == predicted[key], key

    again = lab.run(tmp_path, args, check=True)
    assert_ok(again)
    assert again["changed"] is False, again["diff"]
    settled = lab.snapshot()
    final = lab.run(tmp_path, args)
    assert_ok(final)
    assert final["changed"] is False, final["diff"]
    assert lab.snapshot() == settled, "a run that reported no change changed the cluster"
    return applied
