"""Shared by the placement tests: random fleets, an independent invariant checker and brute-force solvers.

Nothing here uses the solver's own checks or search; the point is to judge it from outside.
"""

import itertools

from hypothesis import strategies as st

from ansible_collections.llmgw.fleet.plugins.module_utils.placement import (
    Fleet,
    Node,
    Replica,
    Request,
    Shard,
    place,
)

GPU_COUNTS = [0, 1, 2, 4, 8]
GPU_TYPES = [None, "h100", "a100"]


@st.composite
def fleets(draw, max_fabrics=3, max_nodes=5, lost=True, existing=True):
    """A random fleet: fabrics of nodes with random GPUs and states, and existing replicas placed on it while
    every node was ready (so some now sit on lost or draining nodes, and some have a shard gone missing)."""
    nodes = []
    for _ignored in range(draw(st.integers(1, max_fabrics))):
        fabric = draw(st.sampled_from(["ib-a", "ib-b", "ib-c", "eth"]))
        for i in range(draw(st.integers(1, max_nodes))):
            nodes.append(dict(
                name="%s-n%d" % (fabric, i) if draw(st.booleans()) else "z%d-%s" % (i, fabric),
                fabric=fabric,
                gpus=draw(st.sampled_from(GPU_COUNTS)),
                gpu_type=draw(st.sampled_from(GPU_TYPES)),
                state=draw(st.sampled_from(["ready"] * 5 + (["pending", "draining", "lost"] if lost else []))),
            ))
    unique = {}
    for node in nodes:
        unique.setdefault(node["name"], node)
    nodes = list(unique.values())
    ready_fleet = Fleet([Node(n["name"], n["fabric"], n["gpus"], "ready", n["gpu_type"]) for n in nodes])
    if existing:
        for i in range(draw(st.integers(0, 4))):
            request = Request("old%d" % i, draw(st.integers(1, 3)), draw(st.sampled_from([0, 1, 2, 4])))
            decision = place(ready_fleet, request)
            if decision.placed:
                ready_fleet = ready_fleet.apply(decision, request)
    replicas = []
    for replica in ready_fleet.replicas.values():
        shards = replica.shards
        if len(shards) > 1 and draw(st.integers(0, 9)) == 0:
            shards = shards[1:]  # a shard the controller lost track of
        if draw(st.integers(0, 14)) == 0:
            shards = ()  # failed and reaped down to nothing
        state = draw(st.sampled_from(["ready"] * 6 + ["placing", "failed"])) if existing else "ready"
        replicas.append(Replica(replica.name, replica.shard_count, replica.gpus_per_shard, shards, state=state))
    return Fleet([Node(n["name"], n["fabric"], n["gpus"], n["state"], n["gpu_type"]) for n in nodes], replicas)


@st.composite
def requests(draw, fleet=None, max_requests=4):
    fabrics = sorted({n.fabric for n in fleet.nodes.values()}) if fleet else ["ib-a"]
    names = sorted(fleet.nodes) if fleet else []
    out = []
    for i in range(draw(st.integers(1, max_requests))):
        out.append(Request(
            name="new%d" % i,
            shard_count=draw(st.integers(1, 3)),
            gpus_per_shard=draw(st.sampled_from([0, 1, 2, 4, 8])),
            fabric=draw(st.sampled_from([None, None, None] + fabrics)),
            avoid_nodes=frozenset(draw(st.lists(st.sampled_from(names), max_size=2))) if names else frozenset(),
            gpu_type=draw(st.sampled_from([None, None, "h100"])),
        ))
    return out


LIVE = ("ready", "draining")


def survivors(fleet, replica):
    """Live shards, by docs/placement.md: on a node of the fleet that is ready or draining."""
    return [s for s in replica.shards if s.node in fleet.nodes and fleet.nodes[s.node].state in LIVE]


def is_whole(fleet, replica):
    """docs/placement.md's definition, written again from the page: not failed, every shard on a ready or
    draining node, and as many such shards as its shard count."""
    return (replica.state != "failed" and len(survivors(fleet, replica)) == len(replica.shards)
            and len(replica.shards) == replica.shard_count)


def own_fabric(fleet, replica):
    fabrics = {fleet.nodes[s.node].fabric for s in replica.shards if s.node in fleet.nodes}
    return fabrics.pop() if fabrics else None


def check_invariants(fleet, decisions, requests_by_name):
    """Every invariant, read off the fleet the decisions leave behind. Raises AssertionError."""
    decided = {d.replica for d in decisions}
    holders = {}

    def hold(owner, shard):
        node = fleet.nodes.get(shard.node)
        for gpu in shard.gpus:
            assert (shard.node, gpu) not in holders, "GPU %s/%d given to %s and %s" % (
                shard.node, gpu, holders[(shard.node, gpu)], owner)
            assert node is None or 0 <= gpu < node.gpus, "GPU %d does not exist on %s" % (gpu, shard.node)
            holders[(shard.node, gpu)] = owner

    for replica in fleet.replicas.values():
        if replica.name not in decided:  # untouched: existing replicas never move
            for shard in replica.shards:
                hold(replica.name, shard)
    for decision in decisions:
        replica = fleet.replicas.get(decision.replica)
        wanted = requests_by_name[decision.replica]
        if replica is not None:
            alive = survivors(fleet, replica)
            reaped = sorted((s.rank, s.node, s.gpus) for s in decision.reaped_shards)
            if decision.placed and decision.action == "repair":
                assert sorted((s.rank, s.node, s.gpus) for s in decision.kept_shards) == \
                    sorted((s.rank, s.node, s.gpus) for s in alive), "a repair in place keeps every survivor"
                assert decision.fabric == own_fabric(fleet, replica)
                assert reaped == []
            elif decision.placed and decision.action in ("move", "place"):
                assert decision.action == ("move" if replica.shards else "place")
                assert reaped == sorted((s.rank, s.node, s.gpus) for s in alive)
                assert not {s.node for s in decision.shards} & {s.node for s in alive}, \
                    "a move never lands where a reaped shard was"
            elif not decision.placed:
                assert decision.action == "fail"
                assert reaped == sorted((s.rank, s.node, s.gpus) for s in alive)
        if not decision.placed:
            assert decision.reason
            continue
        ranks = [s.rank for s in decision.shards]
        assert ranks == list(range(wanted.shard_count)), "exactly the shard count, rank 0 first: %s" % ranks
        nodes = [s.node for s in decision.shards]
        assert len(set(nodes)) == len(nodes), "one shard per node"
        assert len({fleet.nodes[n].fabric for n in nodes}) == 1, "one fabric"
        for shard in decision.shards:
            assert len(shard.gpus) == wanted.gpus_per_shard
            hold(decision.replica, shard)
        kept = {(s.rank, s.node) for s in decision.kept_shards}
        for shard in decision.shards:
            if (shard.rank, shard.node) in kept:
                continue
            node = fleet.nodes[shard.node]
            assert node.state == "ready", "new shard on %s which is %s" % (node.name, node.state)
            assert shard.node not in wanted.avoid_nodes
            assert wanted.gpu_type is None or node.gpu_type == wanted.gpu_type
            assert wanted.fabric is None or node.fabric == wanted.fabric


def requests_by_name(fleet, requests, repairs):
    out = {r.name: r for r in requests}
    for name in repairs:
        out[name] = fleet.replicas[name].as_request()
    return out


# -- brute force --------------------------------------------------------------------------------------------

def _fits(fleet, free, request, names, exclude=()):
    for name in names:
        node = fleet.nodes[name]
        if node.state != "ready" or free[name] < request.gpus_per_shard or name in request.avoid_nodes \
                or name in exclude or (request.gpu_type is not None and node.gpu_type != request.gpu_type):
            return False
    return True


def all_node_sets(fleet, free, request):
    """Every set of ``request.shard_count`` distinct nodes on one fabric that could take a new replica."""
    for fabric in sorted({n.fabric for n in fleet.nodes.values()}):
        if request.fabric is not None and fabric != request.fabric:
            continue
        members = sorted(n for n in fleet.nodes if fleet.nodes[n].fabric == fabric)
        for combo in itertools.combinations(members, request.shard_count):
            if _fits(fleet, free, request, combo):
                yield fabric, combo


def objective_key(fleet, free, shard_counts, fabric, combo, gpus):
    """The documented objective for one new replica, computed from scratch over the whole fleet after it:
    (room, balance of GPUs in use, balance of shards, names), smaller is better."""
    after_free = dict(free)
    after_shards = dict(shard_counts)
    for name in combo:
        after_free[name] -= gpus
        after_shards[name] = after_shards.get(name, 0) + 1
    ready = [n for n in sorted(fleet.nodes) if fleet.nodes[n].state == "ready"]
    fabric_vectors = {}
    for name in ready:
        fabric_vectors.setdefault(fleet.nodes[name].fabric, []).append(after_free[name])
    room = sorted((sorted(v, reverse=True) for v in fabric_vectors.values()), reverse=True)
    used = sorted((fleet.nodes[n].gpus - after_free[n] for n in ready), reverse=True)
    shards = sorted((after_shards.get(n, 0) for n in ready), reverse=True)
    return (_negate(room), used, shards, fabric, sorted(combo))


def _negate(room):
    return [[-x for x in vector] + [1] for vector in room]  # "+[1]": a longer vector with equal prefix is larger


def brute_force_place(fleet, request):
    free = {n: len(ids) for n, ids in fleet.free_ids.items()}
    shard_counts = {}
    for replica in fleet.replicas.values():
        for shard in replica.shards:
            shard_counts[shard.node] = shard_counts.get(shard.node, 0) + 1
    best = None
    for fabric, combo in all_node_sets(fleet, free, request):
        key = objective_key(fleet, free, shard_counts, fabric, combo, request.gpus_per_shard)
        if best is None or key < best[0]:
            best = (key, fabric, combo)
    return best


def brute_force_max_placed(fleet, requests):
    """The most of ``requests`` (new replicas) that fit together, by trying every assignment."""
    free = {n: len(ids) for n, ids in fleet.free_ids.items()}

    def go(i):
        if i == len(requests):
            return 0
        best = go(i + 1)  # leave requests[i] out
        request = requests[i]
        for _ignored, combo in list(all_node_sets(fleet, free, request)):
            for name in combo:
                free[name] -= request.gpus_per_shard
            best = max(best, 1 + go(i + 1))
            for name in combo:
                free[name] += request.gpus_per_shard
            if best == len(requests) - i:
                break
        return best

    return go(0)


def shard(rank, node, gpus):
    return Shard(rank, node, tuple(gpus))
