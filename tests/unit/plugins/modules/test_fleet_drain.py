"""fleet_drain through ansible-playbook on a real registry file: check -> apply -> check -> apply, the diff, and a
refusal (no room) that fails naming the replica and writes nothing."""

import json
import os
import subprocess
import sys

from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
COLLECTIONS = os.path.join(REPO, ".build", "collections")
BIN = os.path.dirname(sys.executable)


def drain(db, tmp_path, check=False, **args):
    tasks = [{"name": "drain", "llmgw.fleet.fleet_drain": dict(args, db=db)}]
    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    env.pop("PYTHONPATH", None)  # ansible-test units' PYTHONPATH holds only module_utils; the CLI needs all of it
    argv = [os.path.join(BIN, "ansible-playbook"), str(play), "--diff"] + (["--check"] if check else [])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def fleet(db, nodes):
    with FleetRegistry(db) as registry:
        for i in range(1, nodes + 1):
            registry.put_node("node0%d" % i, fabric="ib-a", gpu_count=1, state="ready", address="10.77.0.1%d" % i)
        registry.put_replica("pair", model="m", engine="sim", shard_count=2, gpus_per_shard=1, port=8080)
        registry.set_shards("pair", [{"rank": 0, "node": "node01", "gpus": [0]},
                                     {"rank": 1, "node": "node02", "gpus": [0]}])
        return registry.snapshot()


def snapshot(db):
    with FleetRegistry(db) as registry:
        return registry.snapshot()


def test_check_apply_check_apply(tmp_path):
    db = str(tmp_path / "fleet.db")
    before = fleet(db, 4)
    predicted = drain(db, tmp_path, check=True, node="node01", reason="kernel update")
    assert predicted["changed"] and [m["replica"] for m in predicted["moves"]] == ["pair"]
    assert predicted["diff"]["before"]["state"] == "ready" and predicted["diff"]["after"]["state"] == "draining"
    assert sorted(s["node"] for s in predicted["moves"][0]["to"]) == ["node03", "node04"]
    assert snapshot(db)["nodes"] == before["nodes"], "check mode wrote nothing"

    applied = drain(db, tmp_path, node="node01", reason="kernel update")
    assert applied["changed"] and applied["moves"] == predicted["moves"]
    assert applied["old_leaders"] == [{"replica": "pair", "rank": 0, "node": "node01", "address": "10.77.0.11",
                                       "unit": "llmgw-shard-pair-0.service", "port": 8080}]
    now = snapshot(db)
    assert {n["name"]: n["state"] for n in now["nodes"]}["node01"] == "draining"
    assert sorted(s["node"] for s in now["replicas"][0]["shards"]) == ["node03", "node04"]

    assert not drain(db, tmp_path, check=True, node="node01")["changed"]
    assert not drain(db, tmp_path, node="node01")["changed"]
    assert snapshot(db)["replicas"] == now["replicas"]


def test_no_room_fails_naming_the_replica_and_writes_nothing(tmp_path):
    db = str(tmp_path / "fleet.db")
    before = fleet(db, 3)
    refused = drain(db, tmp_path, node="node01")
    assert refused.get("failed") and [r["replica"] for r in refused["refused"]] == ["pair"]
    assert refused["msg"].startswith("cannot drain node01: pair: ") and "allow_downtime=true" in refused["msg"]
    after = snapshot(db)
    assert after["nodes"] == before["nodes"] and after["replicas"] == before["replicas"]
    moved = drain(db, tmp_path, node="node01", allow_downtime=True)
    assert moved["changed"] and moved["moves"][0]["mode"] == "downtime"
    assert moved["old_leaders"] == [], "a downtime move is drained at the gateway, not waited out on its leader"
    assert sorted(s["node"] for s in moved["moves"][0]["to"]) == ["node02", "node03"]
