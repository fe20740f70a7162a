"""fleet_node, fleet_replica, fleet_info, the placement lookup, the inventory plugin and the fleet status views,
run for real through ansible-playbook / ansible-inventory against a registry file: check -> apply -> check ->
apply, where check must change nothing and predict what apply does, and the second apply must change nothing.

Each test stands alone on its own registry: the fixtures below record the fleet a test starts from (nodes; the two
replicas placed; node02 lost and coder-a moved) through the same service calls the modules make."""

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_service
from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
COLLECTIONS = os.path.join(REPO, ".build", "collections")
BIN = os.path.dirname(sys.executable)

NODES = """
- hosts: localhost
  gather_facts: false
  tasks:
{tasks}
"""


def node_task(name, fabric, **extra):
    args = dict(name=name, fabric=fabric, gpu_count=8, status="ready", address="10.77.0.1" + name[-1],
                vmid=110 + int(name[-1]), proxmox_node="pve1", cpu_variant="haswell", engine_version="b10991",
                cert_fingerprint="AB:" + name)
    args.update(extra)
    return {"name": name, "llmgw.fleet.fleet_node": args}


def playbook(tmp_path, tasks, name="play.yml"):
    path = tmp_path / name
    path.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    return str(path)


def env_for(db):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               LLMGW_FLEET_DB=db, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    # ansible-test units points PYTHONPATH at a copy of ansible holding only module_utils; the CLI needs all of it.
    env.pop("PYTHONPATH", None)
    return env


def run(path, db, check=False):
    """Run a playbook; return {task name: localhost result}."""
    argv = [os.path.join(BIN, "ansible-playbook"), path, "--diff"] + (["--check"] if check else [])
    proc = subprocess.run(argv, env=env_for(db), capture_output=True, text=True, timeout=300, check=False)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("ansible-playbook printed no JSON:\n%s\n%s" % (proc.stdout, proc.stderr))
    results = {}
    for task in report["plays"][0]["tasks"]:
        results[task["task"]["name"]] = task["hosts"]["localhost"]
    return results


def changed(results):
    return {name: result.get("changed", False) for name, result in results.items()}


def table(db):
    """Everything recorded, to prove check mode wrote nothing."""
    if not os.path.exists(db):
        return None
    conn = sqlite3.connect(db)
    try:
        return {t: conn.execute("SELECT * FROM %s ORDER BY 1, 2" % t).fetchall()
                for t in ("nodes", "replicas", "shards", "shard_gpus")}
    finally:
        conn.close()


def cycle(path, db):
    """check -> apply -> check -> apply; returns the four results, having checked what check mode may do."""
    before = table(db)
    first_check = run(path, db, check=True)
    assert table(db) == before, "check mode wrote to the registry"
    first_apply = run(path, db)
    after = table(db)
    second_check = run(path, db, check=True)
    second_apply = run(path, db)
    assert table(db) == after, "a second run changed the registry"
    for name in first_check:
        assert not first_check[name].get("failed"), first_check[name]
        assert not first_apply[name].get("failed"), first_apply[name]
    assert changed(first_check) == changed(first_apply)
    assert not any(changed(second_check).values()) and not any(changed(second_apply).values())
    return first_check, first_apply, second_check, second_apply


NODES = (("node01", "ib-a"), ("node02", "ib-a"), ("node03", "ib-b"), ("node04", "ib-b"))
REPLICAS = {"coder-a": "ib-a", "coder-b": "ib-b"}


def replica_task(name, fabric):
    return {"name": name, "llmgw.fleet.fleet_replica": {
        "name": name, "model": "tiny", "engine": "sim", "shard_count": 2,
        "gpus_per_shard": 4, "fabric": fabric, "port": 8080, "place": True}}


def _record_nodes(registry):
    """What test_1's playbook records: the four nodes, ready."""
    for name, fabric in NODES:
        options = node_task(name, fabric)["llmgw.fleet.fleet_node"]
        fleet_service.change_node(registry, name, "present", options)


def _record_replicas(registry):
    """What test_2's playbook records: coder-a placed on ib-a, coder-b on ib-b."""
    for name, fabric in REPLICAS.items():
        options = replica_task(name, fabric)["llmgw.fleet.fleet_replica"]
        fleet_service.change_replica(registry, name, options=options, place_it=True)


def _lose_node02_and_repair(registry):
    """What test_4's playbooks record: node02 lost, coder-a repaired (moved to ib-b, its fabric constraint cleared)."""
    options = node_task("node02", "ib-a", status="lost", reasons=["unseen for 60 s"])["llmgw.fleet.fleet_node"]
    fleet_service.change_node(registry, "node02", "present", options)
    fleet_service.change_replica(registry, "coder-a", options={"fabric": ""}, repair_it=True)


def registry_with(tmp_path, *steps):
    db = str(tmp_path / "state" / "fleet.db")
    with FleetRegistry(db) as registry:
        for step in steps:
            step(registry)
    return db


@pytest.fixture
def empty_db(tmp_path):
    return str(tmp_path / "state" / "fleet.db")


@pytest.fixture
def nodes_db(tmp_path):
    return registry_with(tmp_path, _record_nodes)


@pytest.fixture
def placed_db(tmp_path):
    return registry_with(tmp_path, _record_nodes, _record_replicas)


@pytest.fixture
def repaired_db(tmp_path):
    return registry_with(tmp_path, _record_nodes, _record_replicas, _lose_node02_and_repair)


def test_1_nodes_check_apply_check_apply(empty_db, tmp_path):
    tasks = [node_task("node01", "ib-a"), node_task("node02", "ib-a"), node_task("node03", "ib-b"),
             node_task("node04", "ib-b")]
    written_before = tasks[3]["llmgw.fleet.fleet_node"]
    written_before["gpus"] = written_before.pop("gpu_count")  # the option's old name, kept as an alias
    check, apply, _ignored, _ignored = cycle(playbook(tmp_path, tasks), empty_db)
    assert all(changed(apply).values())
    assert check["node01"]["diff"]["before"] == {}
    assert check["node01"]["diff"]["after"]["fabric"] == "ib-a"
    node = apply["node01"]["node"]
    assert (node["fabric"], node["gpu_count"], node["state"], node["vmid"], node["address"]) == \
        ("ib-a", 8, "ready", 111, "10.77.0.11")
    assert check["node01"]["node"] == node, "check mode predicts the record"
    assert apply["node04"]["node"]["gpu_count"] == 8 and not apply["node04"].get("warnings"), "gpus is gpu_count"


def test_2_replicas_placed_in_the_module(nodes_db, tmp_path):
    tasks = [
        {"name": "coder-a", "llmgw.fleet.fleet_replica": {
            "name": "coder-a", "model": "tiny", "engine": "sim", "shard_count": 2, "gpus_per_shard": 4,
            "fabric": "ib-a", "port": 8080, "place": True}},
        {"name": "coder-b", "llmgw.fleet.fleet_replica": {
            "name": "coder-b", "model": "tiny", "engine": "sim", "shard_count": 2, "gpus_per_shard": 4,
            "fabric": "ib-b", "port": 8080, "place": True}},
    ]
    check, apply, second_check, _ignored = cycle(playbook(tmp_path, tasks), nodes_db)
    for name, nodes in (("coder-a", ["node01", "node02"]), ("coder-b", ["node03", "node04"])):
        shards = apply[name]["replica"]["shards"]
        assert [(s["rank"], s["node"], s["gpus"]) for s in shards] == [(0, nodes[0], [0, 1, 2, 3]),
                                                                       (1, nodes[1], [0, 1, 2, 3])]
        assert check[name]["decision"]["shards"] == [{k: s[k] for k in ("rank", "node", "gpus")} for s in shards]
        assert apply[name]["replica"]["leader"] == nodes[0]
        assert "decision" not in second_check[name], "a placed replica is not placed again"


def test_3_an_assignment_that_breaks_an_invariant_fails_and_records_nothing(placed_db, tmp_path):
    before = table(placed_db)
    tasks = [{"name": "thief", "llmgw.fleet.fleet_replica": {  # shards: shard_count's alias, kept for old playbooks
        "name": "thief", "model": "tiny", "engine": "sim", "shards": 1, "gpus_per_shard": 2,
        "assignment": [{"rank": 0, "node": "node01", "gpus": [3, 4]}]}}]
    result = run(playbook(tmp_path, tasks), placed_db)["thief"]
    assert result["failed"] and "GPU 3 of node01 is held by coder-a rank 0" in result["msg"]
    assert table(placed_db) == before, "the replica record was rolled back with its shards"


def test_4_node_loss_then_repair_moves_the_replica(placed_db, tmp_path):
    lose = [node_task("node02", "ib-a", status="lost", reasons=["unseen for 60 s"])]
    check, apply, _ignored, _ignored = cycle(playbook(tmp_path, lose, "lose.yml"), placed_db)
    assert apply["node02"]["node"]["state"] == "lost"
    assert (check["node02"]["diff"]["before"]["state"], check["node02"]["diff"]["after"]["state"]) == ("ready", "lost")
    repair = [{"name": "repair coder-a", "llmgw.fleet.fleet_replica": {
        "name": "coder-a", "fabric": "", "repair": True}}]
    check, apply, second_check, _ignored = cycle(playbook(tmp_path, repair, "repair.yml"), placed_db)
    decision = apply["repair coder-a"]["decision"]
    assert check["repair coder-a"]["decision"] == decision
    assert (decision["action"], decision["fabric"]) == ("move", "ib-b")
    assert apply["repair coder-a"]["reaped_shards"] == [
        {"rank": 0, "node": "node01", "gpus": [0, 1, 2, 3], "address": "10.77.0.11",
         "unit": "llmgw-shard-coder-a-0.service"}]
    assert [(s["node"], s["gpus"]) for s in apply["repair coder-a"]["replica"]["shards"]] == [
        ("node03", [4, 5, 6, 7]), ("node04", [4, 5, 6, 7])]
    assert second_check["repair coder-a"]["decision"]["action"] == "keep"


def test_5_fleet_info_and_status_views(repaired_db, tmp_path):
    tasks = [node_task("node01", "ib-a", engine_args=["--no-repack"]),
             {"name": "info", "llmgw.fleet.fleet_info": {"fabric": "ib-a", "events": 5}, "register": "info"}]
    info = run(playbook(tmp_path, tasks), repaired_db)["info"]
    assert info["nodes"][0]["engine_args"] == ["--no-repack"]
    assert info["exists"] and [n["name"] for n in info["nodes"]] == ["node01", "node02"]
    assert info["replicas"] == [] and info["fabrics"]["ib-a"]["free_gpus"] == 8 and len(info["events"]) == 5
    status = run(os.path.join(REPO, "playbooks", "fleet_status.yml"), repaired_db)
    lines = next(r for r in status.values() if "msg" in r)["msg"]
    assert "fabric ib-a: 2 nodes, 1 ready, 8 of 8 GPUs free on ready nodes" in lines
    assert "  node01: every llama-server there runs with --no-repack (found at onboarding)" in lines
    assert any(line.split()[:3] == ["coder-a", "placing", "tiny"] and "0:node03[4-7] 1:node04[4-7]" in line
               for line in lines)
    cli = subprocess.run([sys.executable, os.path.join(REPO, "bin", "fleet"), "status", "--db", repaired_db],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert cli[1:] == lines, "bin/fleet prints the same table as the playbook"


def test_6_inventory_groups_nodes_by_fabric_and_state(repaired_db, tmp_path):
    config = tmp_path / "lab.fleet.yml"
    config.write_text("plugin: llmgw.fleet.fleet\ndb: %s\nkeyed_groups:\n  - key: fleet_cpu_variant\n    prefix: cpu\n"
                      % repaired_db)
    proc = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", str(config), "--list"],
                          env=env_for("/nonexistent"), capture_output=True, text=True, check=True)
    inventory = json.loads(proc.stdout, object_hook=_plain)
    assert inventory["fabric_ib_a"]["hosts"] == ["node01", "node02"]
    assert inventory["fabric_ib_b"]["hosts"] == ["node03", "node04"]
    assert sorted(inventory["ready"]["hosts"]) == ["node01", "node03", "node04"]
    assert inventory["lost"]["hosts"] == ["node02"]
    assert sorted(inventory["cpu_haswell"]["hosts"]) == ["node01", "node02", "node03", "node04"]
    node03 = inventory["_meta"]["hostvars"]["node03"]
    assert node03["ansible_host"] == "10.77.0.13" and node03["fleet_fabric"] == "ib-b"
    assert node03["fleet_free_gpus"] == 0 and node03["fleet_vmid"] == 113
    assert [(s["replica"], s["rank"], s["leader_address"]) for s in node03["fleet_shards"]] == [
        ("coder-a", 0, "10.77.0.13"), ("coder-b", 0, "10.77.0.13")]


def _plain(obj):
    """ansible-inventory marks strings read from a plugin as unsafe (never templated): {"__ansible_unsafe": s}."""
    return obj["__ansible_unsafe"] if set(obj) == {"__ansible_unsafe"} else obj


def test_7_lookup_reads_the_registry_or_a_fleet_passed_in(repaired_db, tmp_path):
    tasks = [
        {"name": "from registry", "ansible.builtin.set_fact": {"answer": (
            "{{ lookup('llmgw.fleet.placement', {'name': 'small', 'shard_count': 1, 'gpus_per_shard': 4}) }}")}},
        {"name": "kept", "ansible.builtin.set_fact": {"answer": (  # shards: shard_count's old name, an alias
            "{{ lookup('llmgw.fleet.placement', {'name': 'coder-b', 'shards': 2, 'gpus_per_shard': 4}) }}")}},
        {"name": "passed in", "ansible.builtin.set_fact": {"answer": (
            "{{ lookup('llmgw.fleet.placement', {'name': 'r', 'shard_count': 2, 'gpus_per_shard': 8}, fleet={'nodes': ["
            "{'name': 'x1', 'fabric': 'f', 'gpu_count': 8}, "
            "{'name': 'x2', 'fabric': 'f', 'gpus': 8, 'free_gpus': 8}]}) }}")}},
        {"name": "two engine versions", "ansible.builtin.set_fact": {"answer": (
            "{{ lookup('llmgw.fleet.placement', {'name': 'r', 'shard_count': 2, 'gpus_per_shard': 8}, fleet={'nodes': ["
            "{'name': 'x1', 'fabric': 'f', 'gpu_count': 8, 'engine_version': 'b1'}, "
            "{'name': 'x2', 'fabric': 'f', 'gpu_count': 8, 'engine_version': 'b2'}, "
            "{'name': 'x3', 'fabric': 'f', 'gpu_count': 8, 'engine_version': 'b2'}]}) }}")}},
        {"name": "refused", "ansible.builtin.set_fact": {"answer": (
            "{{ lookup('llmgw.fleet.placement', {'name': 'big', 'shard_count': 2, 'gpus_per_shard': 8}, "
            "on_refusal='return') }}")}},
        {"name": "refusal fails", "ignore_errors": True, "ansible.builtin.set_fact": {"answer": (
            "{{ lookup('llmgw.fleet.placement', {'name': 'big', 'shard_count': 2, 'gpus_per_shard': 8}) }}")}},
        {"name": "two counts", "ignore_errors": True, "ansible.builtin.set_fact": {"answer": (
            "{{ lookup('llmgw.fleet.placement', {'name': 'odd', 'shard_count': 2, 'shards': 1, "
            "'gpus_per_shard': 1}) }}")}},
    ]
    results = run(playbook(tmp_path, tasks), repaired_db)
    small = results["from registry"]["ansible_facts"]["answer"]
    assert (small["action"], small["shards"]) == ("place", [{"rank": 0, "node": "node01", "gpus": [0, 1, 2, 3],
                                                             "address": "10.77.0.11"}])
    kept = results["kept"]["ansible_facts"]["answer"]
    assert kept["action"] == "keep" and [s["node"] for s in kept["shards"]] == ["node03", "node04"]
    passed = results["passed in"]["ansible_facts"]["answer"]
    assert passed["fabric"] == "f" and [s["node"] for s in passed["shards"]] == ["x1", "x2"]
    # Without engine versions, x1 and x2 (the first by name) would do; a replica's shards share one version.
    two = results["two engine versions"]["ansible_facts"]["answer"]
    assert [s["node"] for s in two["shards"]] == ["x2", "x3"], two
    refused = results["refused"]["ansible_facts"]["answer"]
    assert not refused["placed"] and "ib-b has 0 of the 2 nodes it needs" in refused["reason"]
    assert results["refusal fails"]["failed"]
    assert "cannot place big" in results["refusal fails"]["msg"]
    assert results["two counts"]["failed"]
    assert "replica request 'odd': shard_count 2 and shards 1 differ" in results["two counts"]["msg"]


def test_8_removing_a_replica_returns_its_shards_to_stop(repaired_db, tmp_path):
    tasks = [{"name": "remove", "llmgw.fleet.fleet_replica": {"name": "coder-b", "state": "absent"}}]
    check, apply, _ignored, _ignored = cycle(playbook(tmp_path, tasks), repaired_db)
    assert [s["node"] for s in apply["remove"]["reaped_shards"]] == ["node03", "node04"]
    assert check["remove"]["reaped_shards"] == apply["remove"]["reaped_shards"]
