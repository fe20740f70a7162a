"""inventories/example is a complete fleet a user can copy, and every fleet_* variable it sets is one the
collection's playbooks or roles read (a variable nobody reads is a setting that silently does nothing)."""

import glob
import json
import os
import re
import subprocess

import published
import pytest

EXAMPLE = os.path.join(published.REPO, "inventories", "example")
# Set for the operator, read by the loops docs/real-proxmox.md shows (place_replica takes one replica at a time).
READ_BY_DOCS = {"fleet_replicas", "fleet_address", "fleet_fabric", "fleet_gpus", "fleet_gpu_type"}


@pytest.fixture(scope="module")
def inventory():
    result = subprocess.run([published.tool("ansible-inventory"), "-i", EXAMPLE, "--list"], capture_output=True,
                            text=True, env=published.ansible_env(), cwd=published.REPO, check=True)
    return json.loads(result.stdout)


def read_by_the_collection():
    """Every fleet_* name used in the collection's playbooks and roles."""
    names = set()
    for path in glob.glob(os.path.join(published.REPO, "playbooks", "*.yml")) + glob.glob(
            os.path.join(published.REPO, "roles", "*", "**", "*.yml"), recursive=True):
        with open(path) as handle:
            names.update(re.findall(r"\bfleet_[a-z0-9_]+", handle.read()))
    return names


def test_nodes_on_two_fabrics_with_gpus(inventory):
    hostvars = inventory["_meta"]["hostvars"]
    fabrics = {}
    for name in inventory["fleet"]["children"]:
        for host in inventory[name]["hosts"]:
            fabrics.setdefault(hostvars[host]["fleet_fabric"], []).append(host)
            assert hostvars[host]["fleet_gpus"] > 0 and "/" in hostvars[host]["fleet_address"], host
    assert len(fabrics) >= 2, fabrics


def test_proxmox_connection_with_its_secret_in_the_vault(inventory):
    proxmox = inventory["_meta"]["hostvars"]["localhost"]["fleet_proxmox"]
    assert {"api_host", "api_token_id", "api_token_secret", "ca_path"} <= set(proxmox)
    assert re.fullmatch(r"\{\{ vault_\w+ \}\}", proxmox["api_token_secret"]), "a secret is a vault_* reference"
    assert proxmox.get("validate_certs", True) is True


def test_models_and_replicas(inventory):
    variables = inventory["_meta"]["hostvars"]["localhost"]
    models, replicas = variables["fleet_models"], variables["fleet_replicas"]
    for name, model in models.items():
        assert model["engine"] and (model.get("file") or model.get("url")) and "vault_" in model["sha256"], name
    assert replicas and all(replica["model"] in models for replica in replicas)


def test_what_it_says_the_docs_read_they_do_read():
    with open(os.path.join(published.REPO, "docs", "real-proxmox.md")) as handle:
        text = handle.read()
    unread = sorted(name for name in READ_BY_DOCS if not re.search(r"\b{}\b".format(name), text))
    assert not unread, "exempted as read by docs/real-proxmox.md, which does not name them: {}".format(unread)


def test_every_fleet_variable_it_sets_is_read(inventory):
    variables = set()
    for hostvars in inventory["_meta"]["hostvars"].values():
        variables.update(v for v in hostvars if v.startswith("fleet_"))
    unread = variables - read_by_the_collection() - READ_BY_DOCS
    assert not unread, "set in inventories/example but read by no playbook or role: {}".format(sorted(unread))
