"""The bad-input matrix: for the user-facing options of add_node, place_replica, the models and replicas an
inventory declares, and bin/fleet, malformed values each refused before any change (on any host of the run, the
fleet CA and the registry included), the message naming the field, the value and the fix. Runs ansible-playbook as
a user would, against an inventory of the test's own whose Proxmox API is a closed port on loopback: a run that got
past its preflights would fail on the connection instead, and that is counted as not refused cleanly. The registry
and the fleet CA are the test's own and must not be created.

Prints ``N bad inputs, N refused cleanly, 0 changes made``.
"""

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml
from helpers import REPO, run_playbook

ROWS = []


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def inventory(root, nodes=None, models=None, replicas=None):
    """A fleet inventory with nodes on fabric ib-a, its own ssh key pair, and a Proxmox API nobody listens on."""
    nodes = nodes if nodes is not None else {"bi-node01": {"fleet_address": "10.77.0.181/24"}}
    key = os.path.join(root, "fleet_key")
    if not os.path.exists(key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True, timeout=60)
    data = {
        "all": {"vars": {
            "fleet_proxmox": {"api_host": "127.0.0.1", "api_port": closed_port(), "api_token_id": "u@pve!t",
                              "api_token_secret": "00000000-0000-0000-0000-000000000000", "validate_certs": False},
            "fleet_template": 9000, "fleet_registry": os.path.join(root, "fleet.db"),
            "fleet_ssh_private_key_file": key, "fleet_ssh_public_key_file": key + ".pub",
            "fleet_known_hosts_file": os.path.join(root, "known_hosts"), "fleet_ca_dir": os.path.join(root, "ca"),
            "fleet_models": models if models is not None else {
                "sim-coder": {"engine": "sim", "shards": 2, "gpus_per_shard": 0}},
            "fleet_replicas": replicas if replicas is not None else []}},
        "controller": {"hosts": {"localhost": {"ansible_connection": "local",
                                               "ansible_python_interpreter": sys.executable}}},
        "fleet": {"children": {"fabric_ib_a": {"vars": {"fleet_fabric": "ib-a"}, "hosts": nodes}}},
    }
    path = os.path.join(root, "hosts.yml")
    with open(path, "w") as handle:
        yaml.safe_dump(data, handle)
    return path


UPGRADE = {"fleet_engine_version": "b11435", "fleet_engine_archive": "/srv/llama-b11435-bin-linux-x64.tar.gz",
           "fleet_engine_archive_sha256": "0" * 64}

# (id, playbook, inventory overrides, extra vars, texts the refusal must contain: the field, the value, the fix)
PLAYBOOK_ROWS = [
    ("add_node: address without its prefix length", "add_node", {"nodes": {"bi-node01": {
        "fleet_address": "10.77.0.181"}}}, {}, ["fleet_address", '"10.77.0.181"', "10.77.0.105/24"]),
    ("add_node: empty address", "add_node", {"nodes": {"bi-node01": {"fleet_address": ""}}}, {},
     ["fleet_address", '""', "-e node=NAME -e address=A.B.C.D/NN"]),
    ("add_node: a name that is no DNS label", "add_node", {"nodes": {"BI_Node01": {
        "fleet_address": "10.77.0.181/24"}}}, {}, ["BI_Node01", "DNS label"]),
    ("add_node: one address given to two nodes", "add_node", {"nodes": {
        "bi-node01": {"fleet_address": "10.77.0.181/24"}, "bi-node02": {"fleet_address": "10.77.0.181/24"}}}, {},
     ["given to bi-node01 and bi-node02", "give each node its own"]),
    ("add_node: -e node without -e address", "add_node", {}, {"node": "bi-node09"},
     ["bi-node09", "fleet_address", "-e node=NAME -e address=A.B.C.D/NN"]),
    ("add_node: the network's own address", "add_node", {"nodes": {"bi-node01": {
        "fleet_address": "10.77.0.0/24"}}}, {}, ["fleet_address", "10.77.0.0/24", "not a host address"]),
    ("add_node: an address with an octet over 255", "add_node", {"nodes": {"bi-node01": {
        "fleet_address": "10.77.0.300/24"}}}, {}, ["fleet_address", "10.77.0.300/24"]),
    ("add_node: a GPU count that is not a number", "add_node", {"nodes": {"bi-node01": {
        "fleet_address": "10.77.0.181/24", "fleet_gpus": "eight"}}}, {}, ["fleet_gpus", '"eight"', "0 or more"]),
    ("add_node: a negative GPU count", "add_node", {"nodes": {"bi-node01": {
        "fleet_address": "10.77.0.181/24", "fleet_gpus": -2}}}, {}, ["fleet_gpus", "-2", "0 or more"]),
    ("add_node: an ssh key pair that does not exist", "add_node", {}, {
        "fleet_ssh_private_key_file": "/nonexistent/fleet_key",
        "fleet_ssh_public_key_file": "/nonexistent/fleet_key.pub"},
     ["fleet_ssh_private_key_file", '"/nonexistent/fleet_key"', "ssh-keygen -t ed25519 -f /nonexistent/fleet_key"]),
    ("provision_node: an ssh key pair that does not exist", "provision_node", {}, {
        "node": "bi-node01", "address": "10.77.0.181/24", "fleet_ssh_private_key_file": "/nonexistent/fleet_key",
        "fleet_ssh_public_key_file": "/nonexistent/fleet_key.pub"},
     ["/nonexistent/fleet_key(.pub) does not exist", "ssh-keygen -t ed25519 -f /nonexistent/fleet_key"]),
    ("add_node: a fabric with spaces", "add_node", {"nodes": {"bi-node01": {
        "fleet_address": "10.77.0.181/24", "fleet_fabric": "ib a"}}}, {}, ["fleet_fabric", '"ib a"']),
    ("place_replica: a replica name with capitals", "place_replica", {}, {"replica": "Coder_A", "model": "sim-coder"},
     ["Coder_A", "lower case letters, digits and", "hyphens"]),
    ("place_replica: a model nobody declared", "place_replica", {}, {"replica": "coder-a", "model": "gpt-9"},
     ['"gpt-9"', "declared models: sim-coder"]),
    ("place_replica: state=absent without a replica", "place_replica", {}, {"state": "absent"},
     ["-e state=absent needs -e replica=NAME"]),
    ("place_replica: an unknown state", "place_replica", {}, {"replica": "coder-a", "state": "gone"},
     ["state must be present or absent", '"gone"']),
    ("place_replica: zero shards", "place_replica", {}, {"replica": "coder-a", "model": "sim-coder", "shards": 0},
     ["shards a count of at least 1 (got 0)"]),
    ("place_replica: a negative GPU count per shard", "place_replica", {},
     {"replica": "coder-a", "model": "sim-coder", "gpus_per_shard": -1},
     ["gpus_per_shard a count of 0 or more (got -1)"]),
    ("inventory: a replica declared twice", "place_replica", {"replicas": [
        {"name": "coder-a", "model": "sim-coder"}, {"name": "coder-a", "model": "sim-coder"}]}, {},
     ["coder-a", "stated once"]),
    ("inventory: a model without an engine", "place_replica", {"models": {"bare": {"shards": 1}},
                                                               "replicas": [{"name": "bare-a", "model": "bare"}]},
     {}, ["bare", "engine"]),
    ("inventory: a model with an unknown engine", "place_replica", {"models": {"odd": {
        "engine": "tensorrt", "shards": 1}}, "replicas": [{"name": "odd-a", "model": "odd"}]}, {},
     ["odd", '(got "tensorrt")', "llama.cpp, vllm, sglang or sim"]),
    ("inventory: a model with a shard count that is not a number", "place_replica", {"models": {"odd": {
        "engine": "sim", "shards": "two"}}, "replicas": [{"name": "odd-a", "model": "odd"}]}, {},
     ['shards a count of at least 1 (got "two")']),
    ("inventory: a model name that is a path and a shell command", "place_replica", {"models": {"../x;reboot": {
        "engine": "sim", "shards": 1}}, "replicas": [{"name": "odd-a", "model": "../x;reboot"}]}, {},
     ['"../x;reboot"', "a model name is letters, digits"]),
    ("drain_node: no node given", "drain_node", {}, {}, ["-e node=NAME"]),
    ("drain_node: a node name with shell characters", "drain_node", {}, {"node": "bi-node01; reboot"},
     ['"bi-node01; reboot"', "-e node=NAME"]),
    ("drain_node: a node the registry does not hold", "drain_node", {}, {"node": "bi-node09"},
     ["no fleet registry at"]),
    ("undrain_node: no node given", "undrain_node", {}, {}, ["-e node=NAME"]),
    ("upgrade_engine: no version to roll out", "upgrade_engine", {}, {},
     ['fleet_engine_version (got "";', "set them in the inventory"]),
    ("upgrade_engine: a sha256 that is not 64 hex digits", "upgrade_engine", {}, dict(UPGRADE, **{
        "fleet_engine_archive_sha256": "abc"}), ["fleet_engine_archive_sha256 (64 hex digits; got \"abc\")"]),
    ("upgrade_engine: no node may be out at once", "upgrade_engine", {}, dict(UPGRADE, max_unavailable=0),
     ["max_unavailable is a whole number of nodes, 1 or more (got 0)"]),
    ("upgrade_engine: a canary name with shell characters", "upgrade_engine", {}, dict(UPGRADE, canary="x; reboot"),
     ['canary a node name (got "x; reboot")']),
    ("upgrade_engine: a registry that does not exist", "upgrade_engine", {}, UPGRADE, ["no fleet registry at"]),
]


def failure_texts(run):
    """Every failure message of the run, a loop's items' included."""
    out = []
    for play in run.report["plays"]:
        for task in play["tasks"]:
            for result in task["hosts"].values():
                if result.get("failed"):
                    out.append(str(result.get("msg", "")))
                    out += [str(item.get("msg", "")) for item in result.get("results") or [] if item.get("failed")]
    return [m for m in out if m]


@pytest.mark.parametrize("row", PLAYBOOK_ROWS, ids=[r[0] for r in PLAYBOOK_ROWS])
def test_a_bad_input_is_refused_before_any_change(tmp_path, row):
    name, playbook, overrides, extra, expected = row
    hosts = inventory(str(tmp_path), **overrides)
    run = run_playbook("llmgw.fleet." + playbook, extra, inventory=hosts)
    text = "\n".join(failure_texts(run))
    connection = "Connection refused" in text or "connect to" in text.lower()
    clean = run.failed and not connection and all(e in text for e in expected)
    made = [name for name in ("fleet.db", "ca") if os.path.exists(os.path.join(str(tmp_path), name))]
    changed = bool(made) or any(stats["changed"] for stats in run.report["stats"].values())
    ROWS.append((name, clean, changed))
    assert run.failed, "%s: accepted" % name
    assert not connection, "%s: got past its preflights to the Proxmox API: %s" % (name, text[-600:])
    missing = [e for e in expected if e not in text]
    assert not missing, "%s: the refusal does not say %s: %s" % (name, missing, text[-800:])
    assert not changed, "%s: changed something before refusing" % name


BIN_ROWS = [
    ("bin/fleet: a registry that does not exist", ["status", "--db", "/nonexistent/fleet.db"], 1,
     ["/nonexistent/fleet.db"]),
    ("bin/fleet: an unknown command", ["bogus"], 2, ["invalid choice: 'bogus'"]),
    ("bin/fleet: a registry that is not SQLite", ["status", "--db", "NOT-SQLITE"], 1, ["NOT-SQLITE"]),
]


@pytest.mark.parametrize("row", BIN_ROWS, ids=[r[0] for r in BIN_ROWS])
def test_bin_fleet_refuses_bad_input(tmp_path, row):
    name, args, rc, expected = row
    args = [str(tmp_path / "garbage.db") if a == "NOT-SQLITE" else a for a in args]
    (tmp_path / "garbage.db").write_text("this is not a registry\n")
    before = (tmp_path / "garbage.db").read_text()
    proc = subprocess.run([sys.executable, os.path.join(REPO, "bin", "fleet")] + args, capture_output=True,
                          text=True, timeout=60, check=False)
    text = proc.stdout + proc.stderr
    expected = [str(tmp_path / "garbage.db") if e == "NOT-SQLITE" else e for e in expected]
    clean = proc.returncode == rc and all(e in text for e in expected) and "Traceback" not in text
    changed = (tmp_path / "garbage.db").read_text() != before or os.path.exists("/nonexistent/fleet.db")
    ROWS.append((name, clean, changed))
    assert clean, "%s: rc %d: %s" % (name, proc.returncode, text[-800:])
    assert not changed


def test_zz_report_the_matrix():
    """The matrix's counts (this test runs last in the module)."""
    clean = sum(1 for row in ROWS if row[1])
    changes = sum(1 for row in ROWS if row[2])
    print("\nbad-input matrix: %d bad inputs, %d refused cleanly, %d changes made" % (len(ROWS), clean, changes))
    assert len(ROWS) == len(PLAYBOOK_ROWS) + len(BIN_ROWS)
    assert clean == len(ROWS) and changes == 0, json.dumps([r for r in ROWS if not r[1] or r[2]])
