"""The service between the registry and the solver: one converter from registry rows to solver types, one route to
the solver (place, repair and the lookup all go through fleet_service.solve), and the node and replica tasks the
fleet_* modules hand it."""

import ast
import dataclasses
import datetime
import os

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import (
    fleet_registry,
    fleet_service,
    placement,
    reconcile_service,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import (
    FleetRegistry,
    RegistryConflict,
    RegistryNotFound,
)

MODULE_UTILS = os.path.dirname(os.path.abspath(placement.__file__))


@pytest.fixture
def registry(tmp_path):
    with FleetRegistry(str(tmp_path / "fleet.db")) as reg:
        yield reg


def seed(reg):
    """Two fabrics of two 8-GPU nodes; coder-a on ib-a and coder-b on ib-b, 2 x 4 GPUs each."""
    for name, fabric in (("node01", "ib-a"), ("node02", "ib-a"), ("node03", "ib-b"), ("node04", "ib-b")):
        reg.put_node(name, fabric=fabric, gpu_count=8, state="ready", address="10.77.0.1" + name[-1],
                     gpu_type="l4" if fabric == "ib-b" else None)
    for name, nodes in (("coder-a", ("node01", "node02")), ("coder-b", ("node03", "node04"))):
        reg.put_replica(name, model="tiny", engine="sim", shard_count=2, gpus_per_shard=4, avoid_nodes=["node09"])
        reg.set_shards(name, [{"rank": r, "node": n, "gpus": [0, 1, 2, 3]} for r, n in enumerate(nodes)])


def _read(*parts):
    with open(os.path.join(*parts)) as handle:
        return handle.read()


def _imports(filename):
    tree = ast.parse(_read(MODULE_UTILS, filename))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.add(node.module)
            found.update("%s.%s" % (node.module, alias.name) for alias in node.names)
    return found


# -- storage knows nothing of the solver -------------------------------------------------------------------------

@pytest.mark.parametrize("filename", ["fleet_registry.py", "_registry_rows.py", "_registry_nodes.py",
                                      "_registry_replicas.py", "_registry_schema.py"])
def test_the_registry_is_storage_only(filename):
    assert not any("placement" in name or "fleet_service" in name for name in _imports(filename)), filename
    assert not hasattr(fleet_registry.FleetRegistry, "load_fleet")
    assert not hasattr(fleet_registry.FleetRegistry, "place") and not hasattr(fleet_registry.FleetRegistry, "repair")
    assert not hasattr(fleet_registry, "to_solver_replica")


def test_the_registry_stores_the_states_the_solver_knows():
    assert fleet_registry.NODE_STATES == placement.NODE_STATES
    assert fleet_registry.REPLICA_STATES == placement.REPLICA_STATES


# -- one converter -------------------------------------------------------------------------------------------------

def test_load_fleet_converts_registry_rows_to_the_solvers_types(registry):
    seed(registry)
    registry.put_node("node02", state="lost", reasons=["unseen"])
    fleet = fleet_service.load_fleet(registry)
    assert fleet.nodes["node02"] == placement.Node(name="node02", fabric="ib-a", gpus=8, state="lost", gpu_type=None)
    assert fleet.nodes["node03"] == placement.Node(name="node03", fabric="ib-b", gpus=8, state="ready", gpu_type="l4")
    assert all(node.reserved == () for node in fleet.nodes.values()), "held GPUs come from the shards, not reserved"
    assert fleet.replicas["coder-a"] == placement.Replica(
        name="coder-a", shard_count=2, gpus_per_shard=4,
        shards=(placement.Shard(0, "node01", (0, 1, 2, 3)), placement.Shard(1, "node02", (0, 1, 2, 3))),
        state="placing", engine="sim", model="tiny", fabric=None, avoid_nodes=frozenset(["node09"]), gpu_type=None)
    assert fleet.free_ids["node01"] == (4, 5, 6, 7)
    assert [r.name for r in fleet.broken_replicas()] == ["coder-a"]
    assert fleet_service.to_fleet(registry.list_nodes(), registry.list_replicas()).replicas == fleet.replicas


def test_an_empty_registry_is_an_empty_fleet(registry):
    fleet = fleet_service.load_fleet(registry)
    assert (dict(fleet.nodes), dict(fleet.replicas)) == ({}, {})


# -- one route to the solver ---------------------------------------------------------------------------------------

def test_solve_answers_as_place_and_repair_do(registry):
    seed(registry)
    registry.put_node("node02", state="lost")
    fleet = fleet_service.load_fleet(registry)
    for name in ("coder-a", "coder-b"):
        assert fleet_service.solve(fleet, repairs=[name], strategy="greedy") == [placement.repair(fleet, name)]
    request = placement.Request("new", 1, 4)
    assert fleet_service.solve(fleet, [request], strategy="greedy") == [placement.place(fleet, request)]
    both = fleet_service.solve(fleet, [request], repairs=["coder-b"], strategy="greedy")
    assert [d.replica for d in both] == ["new", "coder-b"] and both[1].action == "keep"
    with pytest.raises(placement.InvalidRequest, match="replica ghost is not in the fleet"):
        fleet_service.solve(fleet, repairs=["ghost"])


@pytest.fixture
def routed(monkeypatch):
    """Every call of fleet_service.solve, with the arguments it got."""
    calls = []
    solve = fleet_service.solve

    def spy(fleet, requests=(), repairs=(), strategy=None):
        calls.append({"requests": [r.name for r in requests], "repairs": list(repairs), "strategy": strategy})
        return solve(fleet, requests, repairs=repairs, strategy=strategy)

    monkeypatch.setattr(fleet_service, "solve", spy)
    monkeypatch.setattr(placement, "plan", _only_through(calls, placement.plan))
    return calls


def _only_through(calls, plan):
    def guarded(*args, **kwargs):
        assert calls, "the solver was reached without fleet_service.solve"
        return plan(*args, **kwargs)
    return guarded


def test_place_goes_through_the_one_route_and_records_the_answer(registry, routed):
    seed(registry)
    registry.put_replica("small", model="tiny", engine="sim", shard_count=1, gpus_per_shard=2)
    decision, before, after = fleet_service.place(registry, "small")
    assert routed == [{"requests": ["small"], "repairs": [], "strategy": "greedy"}]
    assert decision["placed"] and decision["action"] == "place" and before["shards"] == []
    assert [(s["node"], s["gpus"]) for s in after["shards"]] == [(decision["shards"][0]["node"],
                                                                 decision["shards"][0]["gpus"])]
    assert after["state"] == "placing" and after["reasons"] == ["placed on %s" % decision["fabric"]]
    with pytest.raises(RegistryConflict, match="already holds shards; repair it instead"):
        fleet_service.place(registry, "small")
    with pytest.raises(RegistryNotFound, match="no replica ghost"):
        fleet_service.place(registry, "ghost")


def test_repair_goes_through_the_one_route_and_returns_the_reaped_with_addresses(registry, routed):
    seed(registry)
    registry.put_node("node02", state="lost", reasons=["unseen for 60 s"])
    decision, _ignored, after = fleet_service.repair(registry, "coder-a")
    assert routed == [{"requests": [], "repairs": ["coder-a"], "strategy": "greedy"}]
    assert (decision["action"], decision["fabric"]) == ("move", "ib-b")
    assert decision["reaped_shards"] == [{"rank": 0, "node": "node01", "gpus": [0, 1, 2, 3], "address": "10.77.0.11"}]
    assert after["reasons"] == ["moved to ib-b after losing node02"]
    assert fleet_service.repair(registry, "coder-a")[0]["action"] == "keep"
    assert len(routed) == 2


def test_a_refused_placement_is_recorded_failed_with_the_reason(registry):
    seed(registry)
    registry.put_replica("huge", model="m", engine="sim", shard_count=3, gpus_per_shard=4)
    decision, _ignored, after = fleet_service.place(registry, "huge")
    assert not decision["placed"] and after["state"] == "failed" and after["reasons"] == [decision["reason"]]


def test_the_lookup_goes_through_the_one_route():
    source = _read(os.path.dirname(MODULE_UTILS), "lookup", "placement.py")
    # solve_on_one_engine is solve, once per engine version while the fleet runs two.
    assert "fleet_service.solve_on_one_engine(" in source and "placement.decide(" not in source
    assert _read(MODULE_UTILS, "fleet_service.py").count("placement.decide(") == 1
    for module in ("fleet_replica.py", "fleet_reconcile.py", "fleet_node.py"):
        text = _read(os.path.dirname(MODULE_UTILS), "modules", module)
        calls = ("placement.decide(", "placement.place(", "placement.repair(", "registry.place(", "registry.repair(")
        assert not any(call in text for call in calls), module


# -- what the modules hand the service -----------------------------------------------------------------------------

NODE_PARAMS = dict.fromkeys(fleet_service.NODE_OPTIONS)


def test_change_node_maps_options_to_fields_and_compares(registry):
    params = dict(NODE_PARAMS, fabric="ib-a", gpu_count=8, status="ready", address="10.77.0.11")
    before, after = fleet_service.change_node(registry, "node01", "present", params)
    assert before is None and (after["gpu_count"], after["state"], after["address"]) == (8, "ready", "10.77.0.11")
    changed, diff = fleet_service.compare(before, after, fleet_registry.NODE_FIELDS)
    assert changed and diff["before"] == {} and diff["after"]["fabric"] == "ib-a"
    again = fleet_service.change_node(registry, "node01", "present", dict(NODE_PARAMS, gpu_count=8))
    unchanged = {"before": diff["after"], "after": diff["after"]}
    assert fleet_service.compare(*again, fleet_registry.NODE_FIELDS) == (False, unchanged)
    cleared = fleet_service.change_node(registry, "node01", "present", dict(NODE_PARAMS, address=""))[1]
    assert cleared["address"] is None, "an empty string clears a text field"
    before, after = fleet_service.change_node(registry, "node01", "absent", NODE_PARAMS)
    assert before["name"] == "node01" and after is None
    assert fleet_service.change_node(registry, "node01", "absent", NODE_PARAMS) == (None, None)
    with pytest.raises(RegistryConflict,
                       match="node state 'gone' is not one of pending, ready, draining, maintenance, lost"):
        fleet_service.change_node(registry, "node01", "present", dict(NODE_PARAMS, status="gone"))


REPLICA_PARAMS = dict.fromkeys(fleet_service.REPLICA_OPTIONS)


def test_change_replica_records_places_sets_states_and_removes(registry):
    seed(registry)
    options = dict(REPLICA_PARAMS, model="tiny", engine="sim", shard_count=1, gpus_per_shard=2, port=8081)
    before, after, decision, reaped = fleet_service.change_replica(registry, "one", options=options, place_it=True,
                                                                   every_shard_status="starting")
    assert before is None and decision["placed"] and reaped == []
    assert (after["shard_count"], after["port"]) == (1, 8081) and [s["state"] for s in after["shards"]] == ["starting"]
    changed, diff = fleet_service.compare(before, after, fleet_registry.REPLICA_FIELDS)
    assert changed and diff["after"]["shards"] == [{k: s[k] for k in ("rank", "node", "gpus", "state")}
                                                   for s in after["shards"]]
    again = fleet_service.change_replica(registry, "one", options=options, place_it=True)
    assert again[2] is None, "a placed replica is not placed again"
    with pytest.raises(RegistryConflict, match=r"shard_status entries are \{rank, status, reasons\}"):
        fleet_service.change_replica(registry, "one", options=options, shard_status=[{"rank": 0}])
    node = after["shards"][0]["node"]
    before, after, decision, reaped = fleet_service.change_replica(registry, "one", "absent")
    assert after is None and decision is None and [s["node"] for s in reaped] == [node]
    assert fleet_service.with_units("one", reaped)[0]["unit"] == "llmgw-shard-one-0.service"


def test_change_replica_is_one_transaction(registry):
    seed(registry)
    options = dict(REPLICA_PARAMS, model="tiny", engine="sim", shard_count=1, gpus_per_shard=2)
    with pytest.raises(RegistryConflict, match="GPU 3 of node01 is held by coder-a rank 0"):
        fleet_service.change_replica(registry, "thief", options=options,
                                     assignment=[{"rank": 0, "node": "node01", "gpus": [3, 4]}])
    assert registry.get_replica("thief") is None, "the record was rolled back with its shards"


def test_an_assignment_returns_the_shards_it_drops(registry):
    seed(registry)
    registry.put_node("node05", fabric="ib-a", gpu_count=8, state="ready")
    assignment = [{"rank": 0, "node": "node01", "gpus": [0, 1, 2, 3]},
                  {"rank": 1, "node": "node05", "gpus": [0, 1, 2, 3]}]
    reaped = fleet_service.change_replica(registry, "coder-a", assignment=assignment)[3]
    assert reaped == [{"rank": 1, "node": "node02", "gpus": [0, 1, 2, 3], "address": "10.77.0.12"}]


# -- reconcile's service -------------------------------------------------------------------------------------------

def test_reconcile_repairs_a_replica_on_a_lost_node_through_the_one_route(registry, routed):
    seed(registry)
    now = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)
    for name in ("node01", "node02", "node03", "node04"):
        registry.put_node(name, last_seen="2026-01-01T11:00:00Z")
    up = {"reachable": True, "error": None, "active_units": [], "unit_files": []}
    probes = reconcile_service.parse_probes(
        [dict(up, node="node01"), dict(up, node="node03"), dict(up, node="node04"),
         {"node": "node02", "reachable": False, "error": "timed out"}])
    verdicts, failed, relaunch, _stale, changed = reconcile_service.apply(registry, probes, 60, now)
    assert changed and verdicts["node02"]["verdict"] == "lost" and registry.get_node("node02")["state"] == "lost"
    assert routed == [{"requests": [], "repairs": ["coder-a"], "strategy": "greedy"}]
    assert [(f["name"], f["action"], f["fabric"]) for f in failed] == [("coder-a", "move", "ib-b")]
    assert relaunch == ["coder-a"]
    assert failed[0]["reaped_shards"] == [{"rank": 0, "node": "node01", "address": "10.77.0.11",
                                           "unit": "llmgw-shard-coder-a-0.service"}]


def test_reconcile_refuses_malformed_input():
    with pytest.raises(RegistryConflict, match="each probe needs a node"):
        reconcile_service.parse_probes([{"reachable": True}])
    with pytest.raises(RegistryConflict, match="each health answer needs a replica"):
        reconcile_service.parse_health([{"ok": True}])
    with pytest.raises(RegistryConflict, match=r"unhealthy_after must be at least 1 \(got 0\)"):
        reconcile_service.check_unhealthy_after(0)


# -- repairs while an engine upgrade rolls: the survivors' engine version only ------------------------------------

def _mid_roll():
    """r2 (2 x 1) on n1 (lost) and n2, both on b1. n3 (b2) is the best fit by GPUs (1 free), n4 (b1) has 2 free."""
    engines = {"n1": "b1", "n2": "b1", "n3": "b2", "n4": "b1"}
    nodes = [placement.Node("n1", "ib-a", 2, state="lost"), placement.Node("n2", "ib-a", 2),
             placement.Node("n3", "ib-a", 1), placement.Node("n4", "ib-a", 2)]
    nodes = [dataclasses.replace(n, engine_version=engines[n.name]) for n in nodes]
    replica = placement.Replica("r2", 2, 1, (placement.Shard(0, "n1", (0,)), placement.Shard(1, "n2", (0,))),
                                state="ready")
    return placement.Fleet(nodes, [replica]), engines


def test_a_repair_mid_roll_stays_on_its_survivors_engine_version():
    fleet, engines = _mid_roll()
    plain = fleet_service.solve(fleet, repairs=["r2"], strategy="greedy")[0]
    assert plain.placed and {s.node for s in plain.new_shards} == {"n3"}, "the plain solver would mix b1 and b2"
    decision = fleet_service.repair_on_one_engine(fleet, "r2", strategy="greedy")
    assert decision.placed and decision.action == "repair"
    assert {engines[s.node] for s in decision.shards} == {"b1"}, decision


def test_a_request_for_a_replica_the_fleet_holds_is_repaired_on_its_survivors_version_too():
    # The placement lookup's route: a term naming a replica with a lost shard.
    fleet, engines = _mid_roll()
    (decision,) = fleet_service.solve_on_one_engine(fleet, [fleet.replicas["r2"].as_request()], prefer="b2",
                                                    strategy="greedy")
    assert decision.placed and {engines[s.node] for s in decision.shards} == {"b1"}, decision


def test_a_repair_with_no_room_on_its_survivors_version_fails_rather_than_mix():
    fleet, _engines = _mid_roll()
    fleet = placement.Fleet([n for n in fleet.nodes.values() if n.name != "n4"], fleet.replicas.values())
    decision = fleet_service.repair_on_one_engine(fleet, "r2", strategy="greedy")
    assert not decision.placed
    assert "surviving shards' engine version (b1)" in decision.reason, decision.reason


def test_a_repair_with_one_engine_version_is_the_plain_solver():
    fleet, _engines = _mid_roll()
    same = placement.Fleet([dataclasses.replace(n, engine_version="b1") for n in fleet.nodes.values()],
                           fleet.replicas.values())
    assert fleet_service.repair_on_one_engine(same, "r2", "greedy") == fleet_service.solve(
        same, repairs=["r2"], strategy="greedy")[0]


def test_fleet_status_says_when_the_ready_nodes_run_two_engine_versions():
    from ansible_collections.llmgw.fleet.plugins.module_utils import _placement_report

    def node(name, version, state="ready"):
        return {"name": name, "fabric": "ib-a", "state": state, "gpu_count": 1, "free_gpus": 1,
                "engine_version": version}

    mixed = _placement_report.status_lines([node("n1", "b1"), node("n2", "b2"), node("n3", "b2"),
                                            node("n4", "b3", "maintenance")], [])
    assert "engine versions on ready nodes: b1 on 1, b2 on 2 (each replica's shards stay on one version)" in mixed
    one = _placement_report.status_lines([node("n1", "b1"), node("n2", "b1"), node("n4", "b3", "maintenance")], [])
    assert not [line for line in one if line.startswith("engine versions")]
