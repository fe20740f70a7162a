"""Property tests: every invariant on random fleets (fabrics, GPUs, lost nodes, existing replicas), determinism,
and never fewer replicas than first-fit decreasing."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.llmgw.fleet.plugins.module_utils.placement import (
    Fleet,
    Node,
    Request,
    first_fit_decreasing,
    place,
    plan,
    repair,
)
from ansible_collections.llmgw.fleet.tests.unit.plugins.module_utils.test_placement_support import (
    check_invariants,
    fleets,
    own_fabric,
    requests,
    requests_by_name,
    survivors,
)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def fleet_and_requests(draw, **kwargs):
    fleet = draw(fleets(**kwargs))
    return fleet, draw(requests(fleet))


def _value(result, fleet):
    repaired = sum(1 for d in result.decisions if d.placed and d.replica in fleet.replicas)
    placed = sum(1 for d in result.decisions if d.placed and d.replica not in fleet.replicas)
    return repaired, placed


@SETTINGS
@given(fleet_and_requests())
def test_plan_keeps_every_invariant(case):
    fleet, reqs = case
    result = plan(fleet, reqs)
    repairs = [r.name for r in fleet.broken_replicas()]
    assert [d.replica for d in result.decisions] == sorted(repairs) + [r.name for r in reqs]
    check_invariants(fleet, result.decisions, requests_by_name(fleet, reqs, repairs))


@SETTINGS
@given(fleet_and_requests())
def test_every_strategy_keeps_every_invariant(case):
    fleet, reqs = case
    repairs = [r.name for r in fleet.broken_replicas()]
    for strategy in ("exact", "heuristic", "greedy", "ffd"):
        result = plan(fleet, reqs, strategy=strategy)
        check_invariants(fleet, result.decisions, requests_by_name(fleet, reqs, repairs))


@SETTINGS
@given(fleet_and_requests())
def test_single_placement_keeps_every_invariant(case):
    fleet, reqs = case
    for request in reqs:
        decision = place(fleet, request)
        check_invariants(fleet, [decision], {request.name: request})
        if decision.placed:
            assert decision.action == "place" and decision.shards[0].rank == 0
            fleet = fleet.apply(decision, request)
            rebuilt = Fleet(fleet.nodes.values(), fleet.replicas.values())
            assert rebuilt.free_ids == fleet.free_ids, "apply() derives what a fresh fleet computes"


@SETTINGS
@given(fleets(max_nodes=4))
def test_repair_follows_the_rule(fleet):
    """One replica alone: survivors stay only if their own fabric can hold the whole replica; else the whole
    replica goes to a fabric that can (never onto a survivor's node); else it fails. Checked against a count of
    what each fabric could take."""
    for replica in fleet.broken_replicas():
        decision = repair(fleet, replica.name)
        check_invariants(fleet, [decision], {replica.name: replica.as_request()})
        alive = survivors(fleet, replica)
        own = own_fabric(fleet, replica)
        missing = replica.shard_count - len(alive)
        spare = _fitting(fleet, replica, own, exclude={s.node for s in alive})
        if alive and spare >= missing and replica.fabric in (None, own):
            assert decision.action == "repair" and decision.moved_shards == missing
        else:
            others = [f for f in fleet.fabrics if replica.fabric in (None, f)
                      and _fitting(fleet, replica, f, exclude={s.node for s in alive}) >= replica.shard_count]
            whole = "move" if replica.shards else "place"
            assert decision.action == (whole if others else "fail"), (decision, others)
            if decision.placed:
                assert decision.fabric in others
                assert len(decision.new_shards) == replica.shard_count


def _fitting(fleet, replica, fabric, exclude=()):
    return sum(1 for n in fleet.nodes.values()
               if n.fabric == fabric and n.state == "ready" and n.name not in exclude
               and n.name not in replica.avoid_nodes and replica.gpu_type in (None, n.gpu_type)
               and len(fleet.free_ids[n.name]) >= replica.gpus_per_shard)


@SETTINGS
@given(fleet_and_requests())
def test_healthy_replicas_never_move(case):
    fleet, reqs = case
    result = plan(fleet, reqs)
    decided = {d.replica for d in result.decisions}
    broken = {r.name for r in fleet.broken_replicas()}
    assert decided == broken | {r.name for r in reqs}
    for name, replica in fleet.replicas.items():
        if name not in broken:
            assert repair(fleet, name).action == "keep"
            assert repair(fleet, name).shards == tuple(sorted(replica.shards, key=lambda s: s.rank))


@SETTINGS
@given(fleet_and_requests(), st.randoms(use_true_random=False))
def test_same_input_same_answer_whatever_the_order(case, rnd):
    """Determinism: shuffling the nodes, the replicas and the requests changes nothing."""
    fleet, reqs = case
    first = plan(fleet, reqs)
    nodes, replicas, shuffled = list(fleet.nodes.values()), list(fleet.replicas.values()), list(reqs)
    rnd.shuffle(nodes)
    rnd.shuffle(replicas)
    rnd.shuffle(shuffled)
    second = plan(Fleet(nodes, replicas), shuffled)
    assert {d.replica: d for d in first.decisions} == {d.replica: d for d in second.decisions}
    assert plan(fleet, reqs) == first
    for request in reqs:
        assert place(fleet, request) == place(Fleet(nodes, replicas), request)


@SETTINGS
@given(fleet_and_requests())
def test_never_fewer_replicas_than_first_fit_decreasing(case):
    fleet, reqs = case
    ffd = _value(first_fit_decreasing(fleet, reqs), fleet)
    for strategy in ("exact", "heuristic"):
        assert _value(plan(fleet, reqs, strategy=strategy), fleet) >= ffd


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_heuristic_on_fleets_too_big_for_the_exact_search(seed):
    """Above 64 ready nodes a fabric goes to the heuristic; it still never places fewer than FFD."""
    rnd = random.Random(seed)
    nodes = [Node("n%03d" % i, "ib-%d" % (i % 2), rnd.choice([4, 8]), rnd.choice(["ready"] * 9 + ["lost"]))
             for i in range(200)]
    fleet = Fleet(nodes)
    reqs = [Request("r%03d" % i, rnd.choice([1, 2, 4]), rnd.choice([1, 2, 4, 8])) for i in range(60)]
    result = plan(fleet, reqs)
    assert result.strategy == "heuristic"
    check_invariants(fleet, result.decisions, {r.name: r for r in reqs})
    assert result.placed >= first_fit_decreasing(fleet, reqs).placed
