"""fleet_reconcile and fleet_replica_plan through ansible-playbook against a registry file: check mode predicts
and changes nothing, apply records, a second apply changes nothing."""

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
COLLECTIONS = os.path.join(REPO, ".build", "collections")
NOW = "2026-12-02T12:00:00Z"


def run_task(tmp_path, db, module, args, check=False):
    path = tmp_path / "play.json"
    path.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False,
                                 "tasks": [{"name": "t", module: args}]}]))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               LLMGW_FLEET_DB=db, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="0", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    env.pop("PYTHONPATH", None)
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
            str(path)] + (["--check"] if check else [])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.fixture
def fleet_db(tmp_path):
    db = str(tmp_path / "fleet.db")
    with FleetRegistry(db) as registry:
        for i, fabric in ((1, "ib-a"), (2, "ib-a"), (3, "ib-b"), (4, "ib-b")):
            registry.put_node("node0%d" % i, fabric=fabric, gpu_count=8, state="ready",
                              address="10.77.0.13%d" % i, last_seen="2026-12-02T11:59:00Z")
        for name, nodes in (("coder-a", ("node01", "node02")), ("coder-b", ("node03", "node04"))):
            registry.put_replica(name, model="sim-coder", engine="sim", shard_count=2, gpus_per_shard=4, port=8080,
                                 state="ready")
            registry.set_shards(name, [{"rank": r, "node": n, "gpus": [0, 1, 2, 3]} for r, n in enumerate(nodes)])
    return db


def probes(unreachable=(), stopped=()):
    out = []
    for i in range(1, 5):
        name = "node0%d" % i
        replica = "coder-a" if i < 3 else "coder-b"
        unit = "llmgw-shard-%s-%d.service" % (replica, (i - 1) % 2)
        active = "" if unit in stopped else "%s loaded active running x\n" % unit
        out.append({"node": name, "reachable": name not in unreachable, "active_units": active,
                    "error": "No route to host" if name in unreachable else ""})
    return out


def test_a_lost_node_moves_its_replica_and_check_mode_predicts_it(fleet_db, tmp_path):
    args = {"probes": probes(unreachable=["node02"]), "node_lost_after": 10, "now": NOW}
    with FleetRegistry(fleet_db) as registry:
        before = registry.snapshot()
    check = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", args, check=True)
    with FleetRegistry(fleet_db) as registry:
        assert registry.snapshot() == before
    apply = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", args)
    assert check["changed"] and apply["changed"]
    assert check["failed_replicas"] == apply["failed_replicas"]
    (failed,) = apply["failed_replicas"]
    assert (failed["name"], failed["kind"], failed["action"], failed["fabric"]) == ("coder-a", "lost", "move", "ib-b")
    assert failed["reaped_shards"] == [{"rank": 0, "node": "node01", "address": "10.77.0.131",
                                        "unit": "llmgw-shard-coder-a-0.service"}]
    assert apply["lost_nodes"] == ["node02"] and apply["relaunch"] == ["coder-a"]
    assert "unseen for 60 s" in apply["nodes"]["node02"]["reason"]
    with FleetRegistry(fleet_db) as registry:
        moved = registry.get_replica("coder-a")
        assert moved["state"] == "placing" and {s["node"] for s in moved["shards"]} == {"node03", "node04"}
        assert registry.get_node("node01")["free_gpus"] == 8
    again = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", args)
    assert not again["changed"] and again["failed_replicas"] == []
    assert apply["stale_units"] == [], "node01's shard is reaped, not also stale"
    # the probe still shows it running (as if the reap had not happened): now it is stale
    assert again["stale_units"] == [{"node": "node01", "address": "10.77.0.131",
                                     "units": ["llmgw-shard-coder-a-0.service"]}]

    # another machine answers at node02's address: it stays lost, and says why, once
    swapped = [dict(p, error="Host key verification failed.") if p["node"] == "node02" else p
               for p in probes(unreachable=["node02"])]
    told = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", dict(args, probes=swapped))
    assert told["changed"] and told["nodes"]["node02"]["reason"].startswith("its host key changed")
    assert not run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", dict(args, probes=swapped))["changed"]
    with FleetRegistry(fleet_db) as registry:
        reasons = registry.get_node("node02")["reasons"]
    assert reasons[0].startswith("unseen for 60 s") and reasons[1].startswith("its host key changed")

    # node02 comes back, its coder-a rank 1 still running (a partition, not a crash): ready again, shard stale
    back = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", dict(args, probes=probes()))
    assert back["changed"] and back["recovered_nodes"] == ["node02"]
    assert back["nodes"]["node02"]["verdict"] == "recovered"
    assert back["stale_units"] == [
        {"node": "node01", "address": "10.77.0.131", "units": ["llmgw-shard-coder-a-0.service"]},
        {"node": "node02", "address": "10.77.0.132", "units": ["llmgw-shard-coder-a-1.service"]}]
    with FleetRegistry(fleet_db) as registry:
        node02 = registry.get_node("node02")
    assert node02["state"] == "ready" and node02["reasons"] == [] and node02["free_gpus"] == 8

    plan = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_replica_plan", {"name": "coder-a"}, check=True)
    assert plan["changed"] and plan["plan"]["port"] == 8082, "coder-b holds 8080 on node03 and node04"
    with FleetRegistry(fleet_db) as registry:
        assert registry.get_replica("coder-a")["port"] == 8080
    plan = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_replica_plan", {"name": "coder-a"})
    assert plan["changed"] and plan["replica"]["port"] == 8082
    assert run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_replica_plan", {"name": "coder-a"})["changed"] is False


def test_adoption_a_ready_replica_short_of_a_shard_is_failed_for_relaunch_never_left_ready(fleet_db, tmp_path):
    args = {"probes": probes(stopped=["llmgw-shard-coder-b-0.service"]), "node_lost_after": 10, "now": NOW}
    apply = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", args)
    (failed,) = apply["failed_replicas"]
    assert failed["reason"] == "runs 1 of its 2 shards (rank 0 on node03 not running)"
    assert failed["action"] == "relaunch" and [s["rank"] for s in failed["reaped_shards"]] == [1]
    assert apply["relaunch"] == ["coder-b"] and apply["lost_nodes"] == []
    with FleetRegistry(fleet_db) as registry:
        replica = registry.get_replica("coder-b")
    assert replica["state"] == "failed" and len(replica["shards"]) == 2


def test_a_node_just_registered_and_briefly_unreachable_at_the_first_reconcile_stays_ready(tmp_path):
    db = str(tmp_path / "fresh.db")
    with FleetRegistry(db) as registry:  # as onboarding registers it: no last_seen yet
        registry.put_node("node09", fabric="ib-a", gpu_count=8, state="ready", address="10.77.0.139")
        registered = registry.registered_at()["node09"]
    probe = [{"node": "node09", "reachable": False, "error": "Connection timed out"}]
    first = run_task(tmp_path, db, "llmgw.fleet.fleet_reconcile",
                     {"probes": probe, "node_lost_after": 60, "now": registered})
    assert not first["changed"] and first["lost_nodes"] == [], first
    assert first["nodes"]["node09"]["verdict"] == "unseen"
    with FleetRegistry(db) as registry:
        assert registry.get_node("node09")["state"] == "ready"
    # never seen at all, node_lost_after after its registration: lost, and the reason says so
    later = run_task(tmp_path, db, "llmgw.fleet.fleet_reconcile",
                     {"probes": probe, "node_lost_after": 0, "now": "2099-01-01T00:00:00Z"})
    assert later["lost_nodes"] == ["node09"]
    assert "never seen, registered %s" % registered in later["nodes"]["node09"]["reason"]


def test_a_hung_leader_is_counted_run_by_run_and_relaunched_whole_at_unhealthy_after(fleet_db, tmp_path):
    """Every unit active, the leader's /health unanswered: counted in the replica's reasons (it stays ready), an
    answer clears the count, and at unhealthy_after runs in a row it is failed and relaunched whole."""
    hung = [{"replica": "coder-a", "ok": False, "error": "Status code was -1: timed out"},
            {"replica": "coder-b", "ok": True}]
    args = {"probes": probes(), "node_lost_after": 10, "now": NOW, "health": hung, "unhealthy_after": 2}
    check = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", args, check=True)
    assert check["changed"] and check["failed_replicas"] == []
    first = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", args)
    assert first["failed_replicas"] == [] and first["relaunch"] == []
    with FleetRegistry(fleet_db) as registry:
        replica = registry.get_replica("coder-a")
    assert replica["state"] == "ready"
    assert replica["reasons"] == ["leader failed /health in 1 reconcile run in a row (relaunched at 2): "
                                  "Status code was -1: timed out"]
    second = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", args)
    (failed,) = second["failed_replicas"]
    assert failed["name"] == "coder-a" and failed["kind"] == "unhealthy" and failed["action"] == "relaunch"
    assert "in 2 reconcile runs in a row" in failed["reason"]
    assert sorted(s["rank"] for s in failed["reaped_shards"]) == [0, 1]  # every shard stopped, then relaunched
    assert second["relaunch"] == ["coder-a"]
    with FleetRegistry(fleet_db) as registry:
        assert registry.get_replica("coder-a")["state"] == "failed"
        assert registry.get_replica("coder-b")["reasons"] == []


def test_an_answer_clears_a_leaders_count(fleet_db, tmp_path):
    failing = {"probes": probes(), "now": NOW, "health": [{"replica": "coder-a", "ok": False}]}
    run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", failing)
    answered = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile",
                        dict(failing, health=[{"replica": "coder-a", "ok": True}]))
    assert answered["failed_replicas"] == []
    with FleetRegistry(fleet_db) as registry:
        assert registry.get_replica("coder-a")["reasons"] == []
    refused = run_task(tmp_path, fleet_db, "llmgw.fleet.fleet_reconcile", dict(failing, unhealthy_after=0))
    assert refused["failed"] and "unhealthy_after must be at least 1 (got 0)" in refused["msg"]
