"""Secrets never leave (issue 18's security row): add_node, the gateway, place_replica and reconcile run on the lab with
``-vvv`` and an Ansible log file, then every log, the registry, the controller's state and the lab API's own request
log are searched for every secret the runs held: the Proxmox API token secret, the lab's root password, the fleet
CA's key, the node's key and the gateway's API key. The figure printed is ``N secrets, N files searched, 0 hits``.

Each secret is also looked for where it must be (its own file), so a search that could not find it fails the test
instead of passing by finding nothing. The files that hold a secret by design (the key files, the lab's connection
file, the gateway's key map) are listed, checked for their file modes, and not searched.
"""

import base64
import glob
import hashlib
import json
import os
import stat
import subprocess

import pytest
import yaml
from helpers import BIN, REPO, ScratchGateway, ansible_env, run_playbook
from onboard_e2e import INVENTORY, Controller, lab_engine, lab_session

NODE, OCTET = "on-secret", 121
MODELS = {"sim-one": {"engine": "sim", "shards": 1, "gpus_per_shard": 0}}


@pytest.fixture(scope="module")
def lab():
    yield from lab_session(vmids=range(1121, 1122))


def pem_lines(path):
    """The base64 lines of a PEM file (each long enough not to occur by chance), and the raw key they encode."""
    with open(path) as handle:
        body = [line.strip() for line in handle if line.strip() and not line.startswith("-----")]
    return [line for line in body if len(line) >= 24] + [base64.b64decode("".join(body)).hex()]


def verbose_run(root, name, playbook, extra):
    """ansible-playbook at -vvv with the default callback (what an operator's terminal shows) and ANSIBLE_LOG_PATH;
    stdout and stderr kept as files."""
    argv = [os.path.join(BIN, "ansible-playbook"), "-vvv", "-i", INVENTORY, playbook, "-e", json.dumps(extra)]
    env = ansible_env(ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
                      ANSIBLE_LOG_PATH=os.path.join(root, "ansible.log"), ANSIBLE_DEBUG="0")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
    for stream, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        with open(os.path.join(root, "%s.%s.log" % (name, stream)), "w") as handle:
            handle.write(text)
    assert proc.returncode == 0, "%s failed:\n%s" % (playbook, (proc.stdout + proc.stderr)[-4000:])


def test_no_secret_in_any_log_the_registry_or_the_lab_request_log(lab, tmp_path):
    root = str(tmp_path)
    controller = Controller(tmp_path, lab_engine())
    gateway = ScratchGateway(os.path.join(root, "gateway"))
    with open(os.path.join(REPO, ".lab", "connection.yml")) as handle:
        connection = yaml.safe_load(handle)
    server_log = os.path.join(REPO, ".lab", "api", "server.log")
    log_start = os.path.getsize(server_log) if os.path.exists(server_log) else 0
    fleet = dict(controller.extra_vars(NODE, OCTET, fabric="ib-a"), fleet_models=MODELS, **gateway.vars)
    try:
        verbose_run(root, "add_node", "llmgw.fleet.add_node", fleet)
        verbose_run(root, "gateway", "llmgw.fleet.gateway", fleet)
        verbose_run(root, "place_replica", "llmgw.fleet.place_replica",
                    dict(fleet, replica="secret-a", model="sim-one"))
        verbose_run(root, "reconcile", "llmgw.fleet.reconcile", fleet)
    finally:
        gateway.stop()

    ca_key = os.path.join(controller.ca_dir, "ca.key")
    node_key = os.path.join(controller.ca_dir, "nodes", NODE, "node.key")
    secrets = {
        "Proxmox API token secret": [connection["api_token_secret"]],
        "lab root password": [connection["api_password"]],
        "fleet CA key": pem_lines(ca_key),
        "node key": pem_lines(node_key),
        "gateway API key": [gateway.key],
    }
    # Where each must be: proof that the search finds it when it is there.
    holders = {"Proxmox API token secret": os.path.join(REPO, ".lab", "connection.yml"), "fleet CA key": ca_key,
               "node key": node_key}
    for what, path in holders.items():
        with open(path, "rb") as handle:
            data = handle.read()
        if what.endswith("key"):
            data += base64.b64decode(b"".join(line.strip() for line in data.splitlines()
                                              if line.strip() and not line.startswith(b"-----"))).hex().encode()
        assert any(needle.encode() in data for needle in secrets[what]), "the search cannot find %s in %s" % (
            what, path)
    # The gateway keeps only each key's sha256: the key was in use, and its plaintext is searched for everywhere.
    with open(gateway.vars["gateway_keys_path"]) as handle:
        assert handle.read().split()[0] == hashlib.sha256(gateway.key.encode()).hexdigest()

    # File modes of what holds a secret: CA key 0600 in a 0700 directory, node key 0600, the registry and
    # known_hosts not readable by others.
    modes = {path: stat.S_IMODE(os.stat(path).st_mode) for path in
             (ca_key, controller.ca_dir, node_key, os.path.dirname(node_key))}
    assert modes == {ca_key: 0o600, controller.ca_dir: 0o700, node_key: 0o600, os.path.dirname(node_key): 0o700}
    for path in (controller.registry, controller.known_hosts):
        assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0, "%s is mode %o" % (
            path, stat.S_IMODE(os.stat(path).st_mode))

    searched = [path for path in glob.glob(os.path.join(root, "**", "*"), recursive=True)
                if os.path.isfile(path) and path not in (ca_key, node_key)
                and not path.endswith((".csr", ".crt"))]
    assert any(p.endswith("fleet.db") for p in searched) and any(p.endswith("ansible.log") for p in searched)
    hits = []
    for path in searched:
        with open(path, "rb") as handle:
            data = handle.read()
        hits += ["%s in %s" % (what, path) for what, needles in secrets.items()
                 if any(needle.encode() in data for needle in needles)]
    with open(server_log, "rb") as handle:
        handle.seek(log_start)
        lab_requests = handle.read()
    assert lab_requests, "the lab API logged no request during the runs"
    hits += ["%s in the lab API's request log" % what for what, needles in secrets.items()
             if any(needle.encode() in lab_requests for needle in needles)]
    print("%d secrets, %d files and the lab API's request log (%d bytes) searched after add_node, gateway, "
          "place_replica and reconcile at -vvv: %d hits" % (len(secrets), len(searched), len(lab_requests), len(hits)))
    assert hits == []


def test_tls_to_proxmox_is_verified_by_default_and_turning_it_off_warns(lab, tmp_path):
    """The lab's API certificate is signed by the lab's own CA: without ca_path the default check refuses it,
    with ca_path it passes quietly, and validate_certs=false passes with a warning that names the fix."""
    with open(os.path.join(REPO, ".lab", "connection.yml")) as handle:
        connection = yaml.safe_load(handle)
    playbook = tmp_path / "read.yml"
    task = {"name": "read", "ignore_errors": True, "llmgw.fleet.pve_vm_info": {
        "api_host": "{{ c.api_host }}", "api_port": "{{ c.api_port }}", "api_token_id": "{{ c.api_token_id }}",
        "api_token_secret": "{{ c.api_token_secret }}", "vmid": "{{ c.template_vmid }}",
        "ca_path": "{{ ca | default(omit) }}", "validate_certs": "{{ verify | default(omit) }}"}}
    playbook.write_text(yaml.safe_dump([{"name": "Read the template", "hosts": "localhost", "connection": "local",
                                         "gather_facts": False, "tasks": [task]}]))
    outcomes = {}
    for case, extra in (("default", {}), ("ca_path", {"ca": connection["ca_cert"]}),
                        ("validate_certs=false", {"verify": False})):
        run = run_playbook(str(playbook), dict(c=connection, **extra))
        (result,) = run.results("read")
        outcomes[case] = (bool(result.get("failed")), result.get("msg", ""), result.get("warnings", []))
    failed, msg, warnings = outcomes["default"]
    assert failed and "certificate" in msg and "ca_path" in msg, outcomes["default"]
    assert outcomes["ca_path"][0] is False and outcomes["ca_path"][2] == [], outcomes["ca_path"]
    failed, msg, warnings = outcomes["validate_certs=false"]
    assert not failed and any("validate_certs is false" in w and "ca_path" in w for w in warnings), warnings
