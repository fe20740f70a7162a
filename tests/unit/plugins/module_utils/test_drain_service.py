"""Draining a node: only the replicas on it move, each whole on one fabric; live moves never share a node with the old
shards and leave both sets' GPUs held; no room refuses everything before a write; allow_downtime places the stuck
ones as if their old shards were gone; a drained node stays as it is on a second call."""

import dataclasses
import itertools

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import drain_service, fleet_service
from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import (
    FleetRegistry,
    RegistryConflict,
    RegistryNotFound,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.placement import Fleet, Node, Replica, Shard


def lab_fleet(extra_nodes=()):
    """node01..node04 on ib-a (2 GPUs each), node05 on ib-b; r1 (1 x 1 GPU) on node01, r2 (2 x 1) on node01+node02,
    r3 (1 x 1) on node03, untouched by a drain of node01."""
    nodes = [Node("node0%d" % i, "ib-a", 2) for i in range(1, 5)] + [Node("node05", "ib-b", 2)] + list(extra_nodes)
    replicas = [Replica("r1", 1, 1, (Shard(0, "node01", (0,)),)),
                Replica("r2", 2, 1, (Shard(0, "node01", (1,)), Shard(1, "node02", (0,)))),
                Replica("r3", 1, 1, (Shard(0, "node03", (0,)),))]
    return Fleet(nodes, replicas)


def held(fleet, moves):
    """(node, gpu) pairs held while every live move has both its old and its new shards."""
    pairs = [(s.node, g) for r in fleet.replicas.values() for s in r.shards for g in s.gpus]
    pairs += [(s["node"], g) for m in moves if m["mode"] == "live" for s in m["to"] for g in s["gpus"]]
    return pairs


def test_only_the_replicas_on_the_node_move_whole_beside_their_old_shards():
    fleet = lab_fleet()
    plan = drain_service.plan_drain(fleet, "node01")
    assert not plan.refused
    assert sorted(m["replica"] for m in plan.moves) == ["r1", "r2"]
    for move in plan.moves:
        old_nodes = {s.node for s in fleet.replicas[move["replica"]].shards}
        new_nodes = [s["node"] for s in move["to"]]
        assert move["mode"] == "live"
        assert len(new_nodes) == fleet.replicas[move["replica"]].shard_count == len(set(new_nodes))
        assert not old_nodes & set(new_nodes), "old and new units never share a node"
        assert {fleet.nodes[n].fabric for n in new_nodes} == {move["fabric"]}
        assert "node01" not in new_nodes
    pairs = held(fleet, plan.moves)
    assert len(pairs) == len(set(pairs)), "no GPU held twice while old and new both run"


def test_no_room_refuses_every_move_and_the_registry_is_untouched(tmp_path):
    # ib-a has 4 nodes of 1 GPU; r2 (2 x 1) on node01+node02, r1 on node03: r2's successor needs two free nodes
    # beside node01 and node02, and only node04 is free.
    with FleetRegistry(str(tmp_path / "fleet.db")) as registry:
        for i in range(1, 5):
            registry.put_node("node0%d" % i, fabric="ib-a", gpu_count=1, state="ready", address="10.77.0.1%d" % i)
        registry.put_replica("r2", model="m", engine="sim", shard_count=2, gpus_per_shard=1, port=8080)
        registry.set_shards("r2", [{"rank": 0, "node": "node01", "gpus": [0]},
                                   {"rank": 1, "node": "node02", "gpus": [0]}])
        registry.put_replica("r1", model="m", engine="sim", shard_count=1, gpus_per_shard=1)
        registry.set_shards("r1", [{"rank": 0, "node": "node03", "gpus": [0]}])
        before = registry.snapshot()
        out = drain_service.drain(registry, "node01")
        assert [r["replica"] for r in out["refused"]] == ["r2"] and not out["changed"]
        assert "r2" in out["refused"][0]["reason"] and "successor" not in out["refused"][0]["reason"]
        assert registry.snapshot()["nodes"] == before["nodes"]
        assert registry.snapshot()["replicas"] == before["replicas"]

        # allow_downtime: r2 is placed as if its shards were gone: node02 and node04 (node01 drains), rank 0 leads
        out = drain_service.drain(registry, "node01", allow_downtime=True, reason="kernel update")
        assert out["changed"] and out["state"] == "draining" and not out["refused"]
        (move,) = out["moves"]
        assert move["mode"] == "downtime" and sorted(s["node"] for s in move["to"]) == ["node02", "node04"]
        assert [(s["rank"], s["node"], s["unit"], s["port"]) for s in move["from"]] == [
            (0, "node01", "llmgw-shard-r2-0.service", 8080), (1, "node02", "llmgw-shard-r2-1.service", 8080)]
        node = registry.get_node("node01")
        assert node["state"] == "draining" and node["reasons"] == ["kernel update"]
        replica = registry.get_replica("r2")
        assert replica["state"] == "placing" and "node01" not in [s["node"] for s in replica["shards"]]
        untouched = {r["name"]: r for r in before["replicas"]}["r1"]
        assert registry.get_replica("r1") == untouched, "a replica not on the node does not move"


def test_a_drained_node_is_left_as_it_is_and_maintenance_stays(tmp_path):
    with FleetRegistry(str(tmp_path / "fleet.db")) as registry:
        registry.put_node("node01", fabric="ib-a", gpu_count=1, state="ready")
        registry.put_node("node02", fabric="ib-a", gpu_count=1, state="ready")
        registry.put_replica("r1", model="m", engine="sim", shard_count=1, gpus_per_shard=1)
        registry.set_shards("r1", [{"rank": 0, "node": "node01", "gpus": [0]}])
        first = drain_service.drain(registry, "node01")
        assert first["changed"] and [m["to"][0]["node"] for m in first["moves"]] == ["node02"]
        again = drain_service.drain(registry, "node01")
        assert not again["changed"] and again["moves"] == [] and again["state"] == "draining"
        registry.put_node("node01", state="maintenance", reasons=["drained"])
        kept = drain_service.drain(registry, "node01")
        assert not kept["changed"] and registry.get_node("node01")["state"] == "maintenance"
        # maintenance is not live and gets nothing: a replica placed now avoids node01
        registry.put_replica("r9", model="m", engine="sim", shard_count=1, gpus_per_shard=0)
        decision, _before, _after = fleet_service.place(registry, "r9")
        assert decision["placed"] and decision["shards"][0]["node"] == "node02"


@pytest.mark.parametrize("state", ["pending", "lost"])
def test_only_ready_draining_or_maintenance_nodes_drain(tmp_path, state):
    with FleetRegistry(str(tmp_path / "fleet.db")) as registry:
        registry.put_node("node01", fabric="ib-a", gpu_count=1, state=state)
        with pytest.raises(RegistryConflict, match="node node01 is %s" % state):
            drain_service.drain(registry, "node01")
        with pytest.raises(RegistryNotFound, match="no node node07"):
            drain_service.drain(registry, "node07")


def brute_force_room(fleet, name, node):
    """An independent oracle: does any set of distinct nodes on one fabric, none of them the replica's own, none the
    drained node, each ready with gpus_per_shard free GPUs, hold the replica's shard count?"""
    replica = fleet.replicas[name]
    own = {s.node for s in replica.shards}
    for fabric in fleet.fabrics:
        usable = [n for n in fleet.nodes.values() if n.fabric == fabric and n.state == "ready" and n.name != node
                  and n.name not in own and len(fleet.free_ids[n.name]) >= replica.gpus_per_shard]
        if any(True for _c in itertools.combinations(usable, replica.shard_count)):
            return True
    return False


@pytest.mark.parametrize("spare", [0, 1, 2, 3])
def test_a_single_live_move_is_refused_exactly_when_no_room_exists(spare):
    # One replica to move, so the batch is one decision: the solver agrees with the brute-force oracle.
    nodes = [Node("node01", "ib-a", 1), Node("node02", "ib-a", 1)] + [Node("s%d" % i, "ib-a", 1) for i in range(spare)]
    fleet = Fleet(nodes, [Replica("r2", 2, 1, (Shard(0, "node01", (0,)), Shard(1, "node02", (0,))))])
    plan = drain_service.plan_drain(fleet, "node01")
    assert bool(plan.moves) == brute_force_room(fleet, "r2", "node01") == (spare >= 2)


# -- an engine upgrade mid-roll: a replica's shards share one engine version ---------------------------------------

def mixed_fleet():
    """ib-a: node01 (drained) and node02..node05, node02+node03 on the new engine b2, the rest on b1; r2 (2 x 1)
    on node01+node04. Any two of node02,node03,node05 could hold r2's successor by GPUs alone."""
    engines = {"node01": "b1", "node02": "b2", "node03": "b2", "node04": "b1", "node05": "b1"}
    nodes = [Node(name, "ib-a", 1, engine_version=version) for name, version in sorted(engines.items())]
    return Fleet(nodes, [Replica("r2", 2, 1, (Shard(0, "node01", (0,)), Shard(1, "node04", (0,))))]), engines


@pytest.mark.parametrize("prefer", ["b2", None])
def test_a_moved_replica_gets_nodes_of_one_engine_version_the_preferred_one_first(prefer):
    fleet, engines = mixed_fleet()
    plan = drain_service.plan_drain(fleet, "node01", prefer_engine=prefer)
    (move,) = plan.moves
    versions = {engines[s["node"]] for s in move["to"]}
    assert len(versions) == 1, move
    # b2 is preferred, or else it is the version with the most ready nodes besides the drained one (2 against 2,
    # node04 included, which r2 already uses): a tie goes to the first by name.
    # Preferred, b2 is tried first. Otherwise b1 is (a tie of ready nodes, 2 and 2, goes to the first by name), but
    # r2 already uses node04, so b1 has one usable node: the move falls to b2.
    assert versions == {"b2"}


def test_no_single_version_with_room_refuses_and_says_why():
    # node03 gone: b2 has one free node (node02) and b1 one (node05): r2's successor needs two of one version.
    fleet, engines = mixed_fleet()
    fleet = Fleet([n for n in fleet.nodes.values() if n.name != "node03"], fleet.replicas.values())
    plan = drain_service.plan_drain(fleet, "node01")
    assert not plan.moves
    (refused,) = plan.refused
    assert "one engine version" in refused["reason"] and "b1" in refused["reason"] and "b2" in refused["reason"]
    # Without the rule, node02 + node05 would do.
    assert drain_service.plan_drain(unversioned(fleet), "node01").moves


def one_version_room(fleet, engines, request, held):
    """Brute force: some version has request.shard_count ready nodes of one fabric, outside avoid_nodes, each with
    request.gpus_per_shard GPUs free after ``held`` ((node, gpu) pairs)."""
    for version in set(engines.values()):
        for fabric in {n.fabric for n in fleet.nodes.values()}:
            usable = [n for n in fleet.nodes.values() if n.state == "ready" and engines[n.name] == version
                      and n.fabric == fabric and n.name not in request.avoid_nodes
                      and n.gpus - sum(1 for h in held if h[0] == n.name) >= request.gpus_per_shard]
            if len(usable) >= request.shard_count:
                return True
    return False


@pytest.mark.parametrize("seed", range(40))
def test_solve_on_one_engine_never_mixes_versions_and_refuses_only_when_no_version_has_room(seed):
    import random

    rnd = random.Random(seed)
    nodes = [Node("n%02d" % i, rnd.choice(["ib-a", "ib-b"]), rnd.choice([1, 2]),
                  engine_version=rnd.choice(["b1", "b2"])) for i in range(rnd.randint(3, 7))]
    engines = {n.name: n.engine_version for n in nodes}
    fleet = Fleet(nodes, [])
    request = fleet_service.placement.Request("r", rnd.randint(1, 3), 1)
    (decision,) = fleet_service.solve_on_one_engine(fleet, [request], prefer=rnd.choice(["b1", "b2", None]))
    if decision.placed:
        assert len({engines[s.node] for s in decision.shards}) == 1, decision
    assert decision.placed == one_version_room(fleet, engines, request, held=[])


def test_one_engine_version_is_the_plain_solver():
    fleet = lab_fleet()
    one = Fleet([dataclasses.replace(n, engine_version="b1") for n in fleet.nodes.values()], fleet.replicas.values())
    assert drain_service.plan_drain(one, "node01") == drain_service.plan_drain(fleet, "node01")


def unversioned(fleet):
    return Fleet([dataclasses.replace(n, engine_version=None) for n in fleet.nodes.values()], fleet.replicas.values())
