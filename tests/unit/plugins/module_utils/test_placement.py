"""The solver on named cases: the seed's node-loss scenario, refusals, constraints, repairs, plain-data input."""

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils.placement import (
    Fleet,
    InvalidFleet,
    InvalidRequest,
    Node,
    Replica,
    Request,
    Shard,
    decide,
    fleet_from_data,
    place,
    plan,
    repair,
    request_from_dict,
)

COLLECTIONS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))),
    ".build", "collections")


def seed_fleet(lost=("node02",)):
    """The seed's cluster: ib-a (node01, node02), ib-b (node03, node04), eight GPUs each, a two-node replica
    with four GPUs per shard on each fabric."""
    nodes = [Node(name, fabric, 8, "lost" if name in lost else "ready")
             for name, fabric in (("node01", "ib-a"), ("node02", "ib-a"), ("node03", "ib-b"), ("node04", "ib-b"))]
    replicas = [
        Replica("coder-a", 2, 4, (Shard(0, "node01", (0, 1, 2, 3)), Shard(1, "node02", (0, 1, 2, 3))), engine="sim"),
        Replica("coder-b", 2, 4, (Shard(0, "node03", (0, 1, 2, 3)), Shard(1, "node04", (0, 1, 2, 3))), engine="sim"),
    ]
    return Fleet(nodes, replicas)


def test_seed_scenario_node02_lost():
    """node02 lost: the ib-a replica cannot be held by ib-a any more (one ready node left), so it is failed
    there, its shard on node01 reaped, and it is rebuilt whole on ib-b; node01 sits idle."""
    fleet = seed_fleet()
    assert [r.name for r in fleet.broken_replicas()] == ["coder-a"]
    decision = repair(fleet, "coder-a")
    assert decision.placed and decision.action == "move"
    assert decision.fabric == "ib-b"
    assert decision.reaped_shards == (Shard(0, "node01", (0, 1, 2, 3)),)
    assert decision.shards == (Shard(0, "node03", (4, 5, 6, 7)), Shard(1, "node04", (4, 5, 6, 7)))
    assert decision.moved_shards == 2
    after = fleet.apply(decision)
    assert after.free_ids["node01"] == tuple(range(8)), "node01 sits idle"
    assert after.free_ids["node03"] == after.free_ids["node04"] == ()
    assert repair(after, "coder-b").action == "keep", "the healthy ib-b replica never moved"
    assert plan(fleet).decisions == (decision,)


def test_seed_scenario_replica_fails_when_no_fabric_can_hold_it():
    fleet = seed_fleet()
    fleet = Fleet(fleet.nodes.values(), list(fleet.replicas.values()) + [
        Replica("filler", 2, 4, (Shard(0, "node03", (4, 5, 6, 7)), Shard(1, "node04", (4, 5, 6, 7))))])
    decision = repair(fleet, "coder-a")
    assert not decision.placed and decision.action == "fail"
    assert decision.reaped_shards == (Shard(0, "node01", (0, 1, 2, 3)),)
    assert "own fabric ib-a cannot hold all of it again" in decision.reason
    assert "node02 lost" in decision.reason
    assert "ib-b has 0 of the 2 nodes it needs" in decision.reason
    assert decision.capacity["ib-b"]["free_gpus"] == 0
    assert decision.capacity["ib-a"]["free_by_node"] == {"node01": 8}, "as the failure leaves it: its shard reaped"


def test_survivors_stay_when_their_fabric_has_a_spare_node():
    fleet = seed_fleet()
    fleet = Fleet(list(fleet.nodes.values()) + [Node("node05", "ib-a", 8)], fleet.replicas.values())
    decision = repair(fleet, "coder-a")
    assert decision.action == "repair" and decision.fabric == "ib-a"
    assert decision.kept_shards == (Shard(0, "node01", (0, 1, 2, 3)),)
    assert decision.new_shards == (Shard(1, "node05", (0, 1, 2, 3)),)
    assert decision.reaped_shards == () and decision.moved_shards == 1
    assert [s.rank for s in decision.shards] == [0, 1]


def test_a_lost_leader_keeps_its_rank_on_the_new_node():
    fleet = seed_fleet(lost=("node01",))
    fleet = Fleet(list(fleet.nodes.values()) + [Node("node05", "ib-a", 8)], fleet.replicas.values())
    decision = repair(fleet, "coder-a")
    assert decision.shards == (Shard(0, "node05", (0, 1, 2, 3)), Shard(1, "node02", (0, 1, 2, 3)))


def test_refusal_names_each_fabrics_capacity_against_the_need():
    decision = place(seed_fleet(lost=()), Request("big", 2, 8))
    assert not decision.placed and decision.action == "refuse"
    assert decision.reason.startswith("cannot place big: it needs 2 distinct ready nodes of one fabric with 8 free "
                                      "GPUs each (2 shards x 8 GPUs = 16 GPUs)")
    assert "ib-a has 0 of the 2 nodes it needs (8 free GPUs on 2 ready nodes: node01 4 free, node02 4 free)" \
        in decision.reason
    assert "ib-b has 0 of the 2 nodes it needs" in decision.reason
    assert decision.needs == {"shards": 2, "gpus_per_shard": 8, "gpus": 16}


def test_refusal_explains_constraints():
    fleet = seed_fleet(lost=())
    assert "fabric ib-z has no nodes (fabrics: ib-a, ib-b)" in place(fleet, Request("x", 1, 1, fabric="ib-z")).reason
    reason = place(fleet, Request("x", 2, 4, fabric="ib-a", avoid_nodes=frozenset({"node02"}))).reason
    assert "only fabric ib-a; avoiding node02" in reason and "node02 avoided" in reason
    assert "node01 has untyped GPUs" in place(fleet, Request("x", 1, 1, gpu_type="h100")).reason


def test_multi_node_replica_never_spans_fabrics_even_when_it_would_fit():
    fleet = Fleet([Node("a1", "ib-a", 8), Node("b1", "ib-b", 8)])
    decision = place(fleet, Request("pair", 2, 4))
    assert not decision.placed
    single = place(fleet, Request("single", 1, 8))
    assert single.placed and single.fabric == "ib-a"


def test_best_fit_keeps_the_largest_free_block():
    fleet = Fleet([Node("a1", "ib-a", 8), Node("a2", "ib-a", 8, reserved=(0, 1, 2, 3))])
    decision = place(fleet, Request("small", 1, 4))
    assert decision.shards == (Shard(0, "a2", (4, 5, 6, 7)),), "the half-used node, not a whole free one"


def test_room_is_judged_per_fabric_not_per_node():
    """ib-a has 8 and 4 free, ib-b one node with 8. Taking 4 from ib-b's node leaves ib-a able to host a 2x4
    replica; taking them from ib-a's half-used node would leave no fabric able to. Room goes first."""
    fleet = Fleet([Node("a1", "ib-a", 8), Node("a2", "ib-a", 8, reserved=(0, 1, 2, 3)), Node("b1", "ib-b", 8)])
    decision = place(fleet, Request("small", 1, 4))
    assert decision.shards == (Shard(0, "b1", (0, 1, 2, 3)),)
    assert place(fleet.apply(decision, Request("small", 1, 4)), Request("pair", 2, 4)).fabric == "ib-a"


def test_between_fabrics_the_fuller_one_takes_it():
    fleet = Fleet([Node("a1", "ib-a", 8), Node("a2", "ib-a", 8), Node("b1", "ib-b", 4), Node("b2", "ib-b", 4)])
    assert place(fleet, Request("pair", 2, 4)).fabric == "ib-b"


def test_cpu_replicas_spread_over_nodes():
    fleet = Fleet([Node("n1", "eth", 0), Node("n2", "eth", 0), Node("n3", "eth", 0)])
    names = []
    for i in range(3):
        request = Request("cpu%d" % i, 1, 0)
        decision = place(fleet, request)
        names.append(decision.shards[0].node)
        fleet = fleet.apply(decision, request)
    assert names == ["n1", "n2", "n3"]


def test_ties_break_by_sorted_names():
    fleet = Fleet([Node("b2", "ib-b", 8), Node("a2", "ib-a", 8), Node("b1", "ib-b", 8), Node("a1", "ib-a", 8)])
    decision = place(fleet, Request("pair", 2, 4))
    assert (decision.fabric, [s.node for s in decision.shards]) == ("ib-a", ["a1", "a2"])


def test_only_ready_nodes_get_shards():
    fleet = Fleet([Node("p", "f", 8, "pending"), Node("d", "f", 8, "draining"), Node("l", "f", 8, "lost"),
                   Node("r", "f", 8)])
    assert place(fleet, Request("one", 1, 1)).shards[0].node == "r"
    assert not place(fleet, Request("two", 2, 1)).placed


def test_shards_on_draining_nodes_survive():
    fleet = Fleet([Node("a1", "ib-a", 8, "draining"), Node("a2", "ib-a", 8, "lost"), Node("a3", "ib-a", 8)],
                  [Replica("r", 2, 2, (Shard(0, "a1", (0, 1)), Shard(1, "a2", (0, 1))))])
    decision = repair(fleet, "r")
    assert decision.action == "repair"
    assert decision.kept_shards == (Shard(0, "a1", (0, 1)),) and decision.new_shards[0].node == "a3"


def test_plan_repairs_before_placing_new_replicas():
    fleet = seed_fleet()
    result = plan(fleet, [Request("newcomer", 2, 4)])
    assert result.get("coder-a").action == "move"
    assert not result.get("newcomer").placed, "ib-b went to the repair; ib-a has one ready node"
    assert [d.replica for d in result.decisions] == ["coder-a", "newcomer"]


def test_invalid_fleets_and_requests_are_refused_with_a_reason():
    with pytest.raises(InvalidFleet, match="held by both"):
        Fleet([Node("n", "f", 8)], [Replica(name, 1, 1, (Shard(0, "n", (0,)),)) for name in ("a", "b")])
    with pytest.raises(InvalidFleet, match="spans fabrics"):
        Fleet([Node("a", "x", 1), Node("b", "y", 1)], [Replica("r", 2, 1, (Shard(0, "a", (0,)), Shard(1, "b", (0,))))])
    with pytest.raises(InvalidFleet, match="listed twice"):
        Fleet([Node("n", "f", 1), Node("n", "f", 1)])
    with pytest.raises(InvalidRequest, match="already in the fleet"):
        place(seed_fleet(), Request("coder-b", 2, 4))
    with pytest.raises(InvalidRequest, match="shard_count must be"):
        place(seed_fleet(), Request("zero", 0, 4))
    with pytest.raises(InvalidRequest, match="unknown request keys: shrads"):
        request_from_dict({"name": "x", "shrads": 2, "gpus_per_shard": 1})


def test_same_answer_in_processes_with_different_hash_seeds():
    """Nothing may depend on set or dict order that varies between processes (PYTHONHASHSEED)."""
    script = (
        "import json, random\n"
        "from ansible_collections.llmgw.fleet.plugins.module_utils.placement import Fleet, Node, Request, plan\n"
        "rnd = random.Random(7)\n"
        "nodes = [Node('n%02d' % i, 'ib-%s' % 'abc'[i % 3], rnd.choice([4, 8]), rnd.choice(['ready'] * 5 + ['lost']),"
        " rnd.choice([None, 'h100'])) for i in range(30)]\n"
        "reqs = [Request('r%02d' % i, rnd.randint(1, 3), rnd.choice([1, 2, 4]), avoid_nodes=frozenset(rnd.sample("
        "[n.name for n in nodes], 3))) for i in range(25)]\n"
        "print(json.dumps(plan(Fleet(nodes), reqs).to_dict(), sort_keys=True))\n"
    )
    outputs = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=COLLECTIONS)
        outputs.add(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                   check=True).stdout)
    assert len(outputs) == 1
    assert json.loads(outputs.pop())["placed"] > 0


def test_fleet_from_plain_data_in_both_shapes():
    short = fleet_from_data({"nodes": [{"name": "n1", "fabric": "ib-a", "gpu_count": 8, "free_gpus": 3},
                                       {"name": "n2", "fabric": "ib-a", "gpu_count": 8, "state": "lost"}]})
    assert short.free_ids["n1"] == (0, 1, 2) and short.nodes["n2"].state == "lost"
    registry_shape = fleet_from_data({
        "nodes": [{"name": "n1", "fabric": "ib-a", "gpu_count": 8, "state": "ready", "free_gpus": 6}],
        "replicas": [{"name": "r", "shard_count": 1, "gpus_per_shard": 2, "state": "ready",
                      "shards": [{"rank": 0, "node": "n1", "gpus": [0, 1]}]}],
    })
    assert registry_shape.free_ids["n1"] == (2, 3, 4, 5, 6, 7)
    with pytest.raises(InvalidFleet, match="free_gpus 9"):
        fleet_from_data([{"name": "n1", "fabric": "f", "gpu_count": 8, "free_gpus": 9}])


@pytest.mark.parametrize("count", [{"shard_count": 2}, {"shards": 2}, {"shard_count": 2, "shards": 2},
                                   {"shard_count": "2", "shards": 2}],
                         ids=["shard_count", "shards", "both", "both-as-text"])
def test_request_shard_count_and_its_alias_shards_read_the_same(count):
    data = dict(count, name="r", gpus_per_shard=4, fabric="ib-a")
    assert request_from_dict(data) == Request("r", shard_count=2, gpus_per_shard=4, fabric="ib-a")


def test_request_giving_shard_count_and_shards_that_differ_is_refused_naming_both():
    with pytest.raises(InvalidRequest, match=r"replica request 'r': shard_count 2 and shards 3 differ "
                                             r"\(shards is an alias of shard_count\)"):
        request_from_dict({"name": "r", "shard_count": 2, "shards": 3, "gpus_per_shard": 4})
    with pytest.raises(InvalidRequest, match="a replica request needs shard_count"):
        request_from_dict({"name": "r", "gpus_per_shard": 4})
    for data in ({"name": "r", "shard_count": 0, "gpus_per_shard": 4}, {"name": "r", "shards": 0, "gpus_per_shard": 4}):
        with pytest.raises(InvalidRequest, match="replica r: shard_count must be an integer >= 1"):
            request_from_dict(data)


def test_node_gpu_count_and_its_alias_gpus_read_the_same():
    def node(**count):
        return fleet_from_data([dict(count, name="n1", fabric="f", free_gpus=3)])
    expected = node(gpu_count=8)
    assert expected.nodes["n1"].gpus == 8 and expected.free_ids["n1"] == (0, 1, 2)
    for fleet in (node(gpus=8), node(gpu_count=8, gpus=8)):
        assert fleet.nodes == expected.nodes and fleet.free_ids == expected.free_ids
    assert fleet_from_data([{"name": "n0", "fabric": "f"}]).nodes["n0"].gpus == 0, "no count is no GPUs"
    with pytest.raises(InvalidFleet, match=r"node n1: gpu_count 8 and gpus 4 differ \(gpus is an alias of gpu_count\)"):
        node(gpu_count=8, gpus=4)


def test_decide_keeps_repairs_and_places_like_a_second_playbook_run_expects():
    fleet = seed_fleet()
    kept, moved, new = decide(fleet, [Request("coder-b", 2, 4), Request("coder-a", 2, 4), Request("c", 1, 4)])
    assert kept.action == "keep" and kept.shards == fleet.replicas["coder-b"].shards
    assert moved.action == "move" and moved.fabric == "ib-b"
    assert new.action == "place" and new.shards[0].node == "node01"
    with pytest.raises(InvalidRequest, match="remove it before asking for 3 x 4"):
        decide(fleet, [Request("coder-b", 3, 4)])
