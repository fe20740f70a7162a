"""One definition of broken for every entry point; the batch solver's repair choices on the cases a fixed order
loses; refusals that name a fix, one test per kind; the bound an inexact answer reports."""

import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_service, reconcile
from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry
from ansible_collections.llmgw.fleet.plugins.module_utils.placement import (
    Fleet,
    Node,
    Replica,
    Request,
    Shard,
    decide,
    place,
    plan,
    repair,
)
from ansible_collections.llmgw.fleet.tests.unit.plugins.module_utils.test_placement_oracle import (
    instance,
    milp_value,
    solver_value,
)
from ansible_collections.llmgw.fleet.tests.unit.plugins.module_utils.test_placement_support import fleets, is_whole


def gpus(*ids):
    return tuple(ids)


# -- one definition of broken ------------------------------------------------------------------------------------

def test_a_replica_reaped_down_to_nothing_is_placed_whole_or_refused_never_kept():
    """The bug: repair() answered keep/placed for a replica holding no shards, while plan() moved it."""
    fleet = Fleet([Node("a1", "ib-a", 8), Node("a2", "ib-a", 8)], [Replica("r", 2, 4, (), state="failed")])
    decision = repair(fleet, "r")
    assert decision.placed and decision.action == "place" and len(decision.shards) == 2
    assert plan(fleet, repairs=["r"]).decisions == (decision,)
    assert decide(fleet, [Request("r", 2, 4)])[0].action == "place"
    full = Fleet([Node("a1", "ib-a", 8)], [Replica("r", 2, 4, ())])
    refused = repair(full, "r")
    assert not refused.placed and refused.action == "fail"


def test_short_failed_pending_and_draining():
    nodes = [Node("a1", "ib-a", 8), Node("a2", "ib-a", 8, "pending"), Node("a3", "ib-a", 8, "draining"),
             Node("a4", "ib-a", 8)]
    short = Replica("short", 2, 2, (Shard(0, "a1", gpus(0, 1)),))
    pending = Replica("pend", 2, 2, (Shard(0, "a4", gpus(0, 1)), Shard(1, "a2", gpus(0, 1))))
    failed = Replica("failed", 1, 2, (Shard(0, "a1", gpus(2, 3)),), state="failed")
    draining = Replica("drain", 2, 2, (Shard(0, "a3", gpus(0, 1)), Shard(1, "a4", gpus(2, 3))))
    fleet = Fleet(nodes, [short, pending, failed, draining])
    assert [r.name for r in fleet.broken_replicas()] == ["failed", "pend", "short"]
    assert "1 of its 2 shards live" in fleet.broken_reason(short)
    assert "rank 1 on a2 (pending)" in fleet.broken_reason(pending)
    assert fleet.broken_reason(failed) == "it is failed"
    assert repair(fleet, "drain").action == "keep", "a draining node keeps its shards"
    relaunch = repair(fleet, "failed")
    assert relaunch.action == "repair" and relaunch.new_shards == () and relaunch.moved_shards == 0
    assert repair(fleet, "pend").action == "repair" and repair(fleet, "pend").kept_shards[0].node == "a4"


def _registry_agrees(fleet):
    """The same fleet recorded in SQLite (the registry holds a replica with all its ranks or none, so a short one
    is recorded with none), then each replica repaired through the registry: keep exactly when it is whole."""
    with tempfile.TemporaryDirectory() as tmp, FleetRegistry(os.path.join(tmp, "fleet.db")) as registry:
        for node in fleet.nodes.values():
            registry.put_node(node.name, fabric=node.fabric, gpu_count=node.gpus, state="ready",
                              gpu_type=node.gpu_type)
        for replica in fleet.replicas.values():
            registry.put_replica(replica.name, model="m", engine="sim", shard_count=replica.shard_count,
                                 gpus_per_shard=replica.gpus_per_shard)
            if len(replica.shards) == replica.shard_count:
                registry.set_shards(replica.name, [s.to_dict() for s in replica.shards])
            registry.put_replica(replica.name, state=replica.state)
        for node in fleet.nodes.values():
            registry.put_node(node.name, state=node.state)
        recorded = fleet_service.load_fleet(registry)
        whole = {name: is_whole(recorded, r) for name, r in recorded.replicas.items()}
        for name in sorted(whole):
            assert (fleet_service.repair(registry, name)[0]["action"] == "keep") == whole[name], name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(max_nodes=4), st.booleans())
def test_entry_points_never_disagree_on_whether_a_replica_is_whole(fleet, with_registry):
    broken_by_plan = {d.replica for d in plan(fleet).decisions}
    states = {n.name: n.state for n in fleet.nodes.values()}
    verdicts = {v["name"] for v in reconcile.replica_verdicts(
        [{"name": r.name, "state": r.state, "shard_count": r.shard_count,
          "shards": [{"rank": s.rank, "node": s.node} for s in r.shards]} for r in fleet.replicas.values()],
        states, {})}
    if with_registry:
        _registry_agrees(fleet)
    for name, replica in fleet.replicas.items():
        whole = is_whole(fleet, replica)  # the docs' definition, written again in the test
        assert fleet.is_broken(replica) == (not whole)
        assert (repair(fleet, name).action == "keep") == whole
        assert (name not in broken_by_plan) == whole
        asked = decide(fleet, [Request(name, replica.shard_count, replica.gpus_per_shard)])[0]
        assert (asked.action == "keep") == whole
        # reconcile fails (for a repair) a replica with a shard that is not live; with nothing probed it says
        # nothing about the rest
        dead = any(states.get(s.node) not in ("ready", "draining") for s in replica.shards)
        assert (name in verdicts) == dead
        if dead:
            assert not whole


# -- repairs are choices of the search ---------------------------------------------------------------------------

def _exact_equals_oracle(fleet, requests=()):
    result = plan(fleet, list(requests), strategy="exact")
    assert result.exact
    assert solver_value(result, fleet) == milp_value(*instance(fleet, list(requests)))
    return result


def test_a_repair_may_use_the_gpus_another_failing_repair_frees():
    """r1 (2x8) lost a3 and could stay with a2, where r2 (2x4, only a100 GPUs, which no node has) holds 4
    GPUs; r2 cannot be repaired anywhere. Largest first, r1 finds 4 free on a2 and fails, then r2 fails: none
    repaired. The search fails r2 first, which frees a2, and repairs r1 there."""
    nodes = [Node("a1", "ib-a", 8), Node("a2", "ib-a", 8)] + [Node(n, "ib-a", 8, "lost") for n in ("a3", "a4")]
    replicas = [Replica("r1", 2, 8, (Shard(0, "a1", gpus(*range(8))), Shard(1, "a3", gpus(*range(8))))),
                Replica("r2", 2, 4, (Shard(0, "a2", gpus(0, 1, 2, 3)), Shard(1, "a4", gpus(0, 1, 2, 3))),
                        gpu_type="a100")]
    fleet = Fleet(nodes, replicas)
    greedy = plan(fleet, strategy="greedy")
    assert (greedy.get("r1").action, greedy.get("r2").action) == ("fail", "fail")
    result = _exact_equals_oracle(fleet)
    assert result.get("r1").action == "repair" and result.get("r1").new_shards[0].node == "a2"
    assert result.get("r2").action == "fail"


def test_moving_one_repair_to_an_empty_fabric_saves_both():
    """r1 (2x8) and r2 (2x4, pinned to ib-a) each lost a node of ib-a; a3 is ib-a's one spare. Largest first,
    r1 stays on a3 and r2 fails; the search moves r1 to the empty ib-b and repairs r2 on ib-a."""
    nodes = [Node("a1", "ib-a", 8), Node("a2", "ib-a", 8), Node("a3", "ib-a", 8), Node("a4", "ib-a", 8, "lost"),
             Node("a5", "ib-a", 8, "lost"), Node("b1", "ib-b", 8), Node("b2", "ib-b", 8)]
    replicas = [Replica("r1", 2, 8, (Shard(0, "a1", gpus(*range(8))), Shard(1, "a4", gpus(*range(8))))),
                Replica("r2", 2, 4, (Shard(0, "a2", gpus(*range(8))[:4]), Shard(1, "a5", gpus(0, 1, 2, 3))),
                        fabric="ib-a")]
    fleet = Fleet(nodes, replicas)
    greedy = plan(fleet, strategy="greedy")
    assert greedy.get("r1").action == "repair" and greedy.get("r2").action == "fail"
    result = _exact_equals_oracle(fleet)
    assert result.get("r1").action == "move" and result.get("r1").fabric == "ib-b"
    assert result.get("r2").action == "repair" and result.get("r2").fabric == "ib-a"


def test_the_search_moves_the_fewest_shards():
    """r1 (2x8, one survivor) and r2 (3x2, two survivors) both want a3, ib-a's one spare. Largest first, r1
    stays (1 shard) and r2 moves whole to ib-b (3): 4 shards. Moving r1 and repairing r2 in place moves 2 + 1."""
    nodes = [Node(n, "ib-a", 8) for n in ("a1", "a2", "a3", "a4")] + [Node("a5", "ib-a", 8, "lost"),
                                                                      Node("a6", "ib-a", 8, "lost")]
    nodes += [Node(n, "ib-b", 8) for n in ("b1", "b2", "b3")]
    full = gpus(*range(8))
    replicas = [Replica("r1", 2, 8, (Shard(0, "a1", full), Shard(1, "a5", full))),
                Replica("r2", 3, 2, (Shard(0, "a2", gpus(0, 1)), Shard(1, "a4", gpus(0, 1)),
                                     Shard(2, "a6", gpus(0, 1)))),
                Replica("h2", 1, 6, (Shard(0, "a2", gpus(2, 3, 4, 5, 6, 7)),)),
                Replica("h4", 1, 6, (Shard(0, "a4", gpus(2, 3, 4, 5, 6, 7)),))]
    fleet = Fleet(nodes, replicas)
    greedy = plan(fleet, strategy="greedy")
    assert greedy.get("r1").action == "repair" and greedy.get("r2").action == "move"
    assert sum(d.moved_shards for d in greedy.decisions) == 4
    result = _exact_equals_oracle(fleet)
    assert sum(d.moved_shards for d in result.decisions) == 3
    assert result.get("r1").action == "move" and result.get("r2").action == "repair"


def test_past_its_budget_the_search_says_so_and_reports_the_gap_to_its_bound():
    fleet = Fleet([Node("n%02d" % i, "ib-a", 8) for i in range(12)])
    reqs = [Request("r%02d" % i, 1 + i % 3, [3, 5, 7][i % 3]) for i in range(14)]
    bounded = plan(fleet, reqs, strategy="exact", budget=3)
    assert not bounded.exact
    assert bounded.value["placed"] == bounded.placed
    assert bounded.bound["placed"] >= plan(fleet, reqs, strategy="exact").placed >= bounded.placed
    assert bounded.gap["placed"] == bounded.bound["placed"] - bounded.placed
    full = plan(fleet, reqs)
    assert full.exact and full.gap == {"repairs": 0, "placed": 0}
    heuristic = plan(fleet, reqs, strategy="heuristic")
    assert not heuristic.exact and heuristic.bound["placed"] >= full.placed


# -- refusals that name a fix ------------------------------------------------------------------------------------

def test_refusal_fix_free_gpus_names_the_replicas_that_hold_them():
    fleet = Fleet([Node("a1", "ib-a", 8), Node("a2", "ib-a", 8)],
                  [Replica("x", 1, 4, (Shard(0, "a1", gpus(0, 1, 2, 3)),)),
                   Replica("y", 1, 6, (Shard(0, "a2", gpus(*range(6))),))])
    decision = place(fleet, Request("big", 2, 6))
    fix = [f for f in decision.fixes if f["kind"] == "free_gpus"]
    assert fix and fix[0]["gpus"] == 6 and fix[0]["replicas"] == ["x", "y"]
    assert "free 6 GPUs on ib-a (a1 needs 2 more, a2 needs 4 more): replicas x, y hold them" in decision.reason


def test_refusal_fix_add_a_ready_node():
    fleet = Fleet([Node("a1", "ib-a", 8), Node("a2", "ib-a", 8, "lost"), Node("b1", "ib-b", 4)])
    decision = place(fleet, Request("pair", 2, 8))
    assert "add a ready node with >= 8 GPUs free to ib-a" in decision.reason
    assert {"kind": "add_node", "fabric": "ib-a", "nodes": 1, "gpus": 8}.items() <= \
        [f for f in decision.fixes if f["kind"] == "add_node"][0].items()


def test_refusal_fix_drop_a_constraint():
    fleet = Fleet([Node("a1", "ib-a", 8, gpu_type="h100"), Node("b1", "ib-b", 8, gpu_type="h100")])
    typed = place(fleet, Request("t", 1, 4, gpu_type="a100"))
    assert "drop gpu_type=a100 (no ready node has it)" in typed.reason
    pinned = place(Fleet(list(fleet.nodes.values()), [Replica("f", 1, 8, (Shard(0, "a1", gpus(*range(8))),))]),
                   Request("p", 1, 4, fabric="ib-a"))
    assert "drop fabric=ib-a (its 1 ready node have 0 free GPUs)" in pinned.reason
    avoided = place(fleet, Request("v", 1, 4, avoid_nodes=frozenset({"a1", "b1"})))
    assert "drop avoid_nodes=a1,b1" in avoided.reason
    assert {f["constraint"] for f in typed.fixes + pinned.fixes + avoided.fixes if f["kind"] == "drop_constraint"} \
        == {"gpu_type", "fabric", "avoid_nodes"}


def test_refusal_fix_crowded_out_names_the_replicas_of_the_batch():
    fleet = Fleet([Node("a1", "ib-a", 6), Node("a2", "ib-a", 4)])
    reqs = [Request("pair", 2, 3), Request("four", 1, 4), Request("three-a", 1, 3), Request("three-b", 1, 3)]
    result = plan(fleet, reqs, strategy="exact")
    pair = result.get("pair")
    assert not pair.placed and pair.fixes[0]["kind"] == "crowded_out"
    assert pair.fixes[0]["replicas"] == ["four", "three-a", "three-b"]
    assert "crowded out by four, three-a, three-b in this batch" in pair.reason


def test_a_failed_repair_names_a_fix_too():
    fleet = Fleet([Node("a1", "ib-a", 8), Node("a2", "ib-a", 8, "lost")],
                  [Replica("r", 2, 8, (Shard(0, "a1", gpus(*range(8))), Shard(1, "a2", gpus(*range(8)))))])
    decision = repair(fleet, "r")
    assert decision.action == "fail"
    assert "add a ready node with >= 8 GPUs free to ib-a" in decision.reason
