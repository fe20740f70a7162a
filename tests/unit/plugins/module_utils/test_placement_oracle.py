"""The batch solver against independent oracles on thousands of random fleets: a MILP of the documented objective
(HiGHS through highspy, a test dependency only) on fleets of up to 12 nodes, and a brute force over every
assignment on the smallest ones (which also checks the MILP). Every answer that says ``exact`` must reach the
oracle's value, and every answer's bound must be at least the oracle's value.

The documented objective (docs/placement.md), maximised lexicographically: (repairs that succeed, new replicas
placed, -shards moved). Each item is a new request or a broken replica. A broken replica with live shards may
stay (its live shards keep their GPUs, its missing ranks get ready nodes of its own fabric other than the live
shards' nodes); or any broken replica may be placed whole (its live shards reaped and their GPUs freed, every
rank on a ready node of one allowed fabric, none on a node where a reaped shard was); or fail. A new request is
placed whole or refused. Shards moved: the missing ranks of one that stays, every rank of one placed whole.
Constraints: distinct nodes, one fabric, ready nodes only for new shards, ``fabric``/``avoid_nodes``/``gpu_type``,
and per node no more GPUs than it has free (plus those freed by reaped shards there).

Nothing here uses the solver's search, bounds or accounting: the instance is read off the fleet's plain data.
"""

import itertools
import random

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils.placement import (
    Fleet,
    Node,
    Replica,
    Request,
    place,
    plan,
)

highspy = pytest.importorskip("highspy")
np = pytest.importorskip("numpy")

LIVE = ("ready", "draining")
MILP_CASES = 1200  # fleets of 6 to 12 nodes
BRUTE_CASES = 600  # fleets of up to 5 nodes: brute force and MILP both


# -- random fleets ---------------------------------------------------------------------------------------------

def random_case(rnd, max_nodes, max_items):
    """A fleet with existing replicas placed while every node was ready, then nodes lost, drained or set back to
    pending, replicas failed, shards gone missing, replicas reaped down to nothing; and new requests."""
    fabric_count = rnd.randint(1, 3)
    size = rnd.randint(max(1, max_nodes // 2), max_nodes)
    gpu_type = rnd.choice([None, None, "h100"])
    nodes = [Node("n%02d" % i, "f%d" % rnd.randrange(fabric_count), rnd.choice([0, 1, 2, 4, 4, 8, 8]),
                  gpu_type=rnd.choice([gpu_type, gpu_type, "a100"]) if gpu_type else None)
             for i in range(size)]
    fleet = Fleet(nodes)
    for i in range(rnd.randint(0, 5)):
        request = Request("old%d" % i, rnd.choice([1, 1, 2, 2, 3]), rnd.choice([0, 1, 2, 4]))
        decision = place(fleet, request)
        if decision.placed:
            fleet = fleet.apply(decision, request)
    states = {n.name: rnd.choice(["ready"] * 6 + ["lost", "lost", "draining", "pending"]) for n in nodes}
    replicas = []
    for replica in fleet.replicas.values():
        shards = replica.shards
        roll = rnd.random()
        if roll < 0.08:
            shards = ()
        elif roll < 0.16 and len(shards) > 1:
            shards = shards[1:]
        state = rnd.choice(["ready"] * 6 + ["failed", "placing"])
        replicas.append(Replica(replica.name, replica.shard_count, replica.gpus_per_shard, shards, state=state,
                                fabric=rnd.choice([None] * 5 + ["f0"])))
    fleet = Fleet([Node(n.name, n.fabric, n.gpus, states[n.name], n.gpu_type) for n in nodes], replicas)
    names = [n.name for n in nodes]
    requests = [Request("new%d" % i, rnd.choice([1, 1, 1, 2, 2, 3]), rnd.choice([0, 1, 2, 2, 4, 4, 8]),
                        fabric=rnd.choice([None] * 6 + ["f0", "f1"]),
                        avoid_nodes=frozenset(rnd.sample(names, rnd.choice([0, 0, 0, 1]))),
                        gpu_type=rnd.choice([None] * 6 + ["h100"]))
                for i in range(rnd.randint(1, max_items))]
    return fleet, requests


# -- the instance, read off plain data ---------------------------------------------------------------------------

def instance(fleet, requests):
    """Free GPUs per ready node and one entry per item (broken replicas and requests) with its choices."""
    held = {}
    for replica in fleet.replicas.values():
        for shard in replica.shards:
            held[shard.node] = held.get(shard.node, 0) + len(shard.gpus)
    free = {n.name: n.gpus - len(set(n.reserved)) - held.get(n.name, 0)
            for n in fleet.nodes.values() if n.state == "ready"}
    fabrics = sorted({n.fabric for n in fleet.nodes.values()})
    items = []

    def eligible(want_fabric, avoid, gpu_type, exclude):
        return {f: [n for n in sorted(free) if fleet.nodes[n].fabric == f and n not in avoid and n not in exclude
                    and (gpu_type is None or fleet.nodes[n].gpu_type == gpu_type)]
                for f in fabrics if want_fabric in (None, f)}

    for replica in sorted(fleet.replicas.values(), key=lambda r: r.name):
        live = [s for s in replica.shards if s.node in fleet.nodes and fleet.nodes[s.node].state in LIVE]
        whole = (replica.state != "failed" and len(live) == len(replica.shards) == replica.shard_count)
        if whole:
            continue
        live_nodes = {s.node for s in live}
        own = {fleet.nodes[s.node].fabric for s in live}
        stay = None
        if live and replica.fabric in (None,) + tuple(own):
            fabric = own.pop()
            stay = {"missing": replica.shard_count - len(live),
                    "nodes": eligible(fabric, replica.avoid_nodes, replica.gpu_type, live_nodes)[fabric]}
        items.append({"name": replica.name, "repair": True, "shard_count": replica.shard_count,
                      "gpus": replica.gpus_per_shard, "stay": stay,
                      "released": {s.node: replica.gpus_per_shard for s in live if s.node in free},
                      "whole": eligible(replica.fabric, replica.avoid_nodes, replica.gpu_type, live_nodes)})
    for request in requests:
        items.append({"name": request.name, "repair": False, "shard_count": request.shard_count,
                      "gpus": request.gpus_per_shard, "stay": None, "released": {},
                      "whole": eligible(request.fabric, request.avoid_nodes, request.gpu_type, ())})
    return free, items


# -- MILP ------------------------------------------------------------------------------------------------------

def milp_value(free, items, time_limit=None):
    """The optimum (repairs, placed, -moved) by HiGHS, one weighted objective that orders like the triple
    (``None`` when ``time_limit`` seconds were not enough to prove it: only the benchmark sets one)."""
    max_moved = sum(it["shard_count"] for it in items if it["repair"]) + 1
    news = sum(1 for it in items if not it["repair"])
    w_placed = max_moved
    w_repair = max_moved * (news + 1)
    cost, cols = [], []  # cols: (item index, kind, fabric, node)

    def var(c, what):
        cost.append(c)
        cols.append(what)
        return len(cols) - 1

    rows = []  # (coefficients {col: a}, lower, upper)
    use = {n: {} for n in free}  # GPUs each node gives: {col: gpus}
    rhs = dict(free)
    for i, it in enumerate(items):
        choose = []
        worth = w_repair if it["repair"] else w_placed
        if it["stay"] is not None:
            k = var(worth - it["stay"]["missing"], (i, "stay", None, None))
            choose.append(k)
            xs = {var(0, (i, "x", None, n)): n for n in it["stay"]["nodes"]}
            rows.append(({**{x: 1 for x in xs}, k: -it["stay"]["missing"]}, 0, 0))
            for x, n in xs.items():
                use[n][x] = use[n].get(x, 0) + it["gpus"]
            for n, g in it["released"].items():
                use[n][k] = use[n].get(k, 0) + g
                rhs[n] += g
        else:
            for n, g in it["released"].items():
                rhs[n] += g
        for fabric, members in it["whole"].items():
            if len(members) < it["shard_count"]:
                continue
            y = var(worth - (it["shard_count"] if it["repair"] else 0), (i, "y", fabric, None))
            choose.append(y)
            zs = {var(0, (i, "z", fabric, n)): n for n in members}
            rows.append(({**{z: 1 for z in zs}, y: -it["shard_count"]}, 0, 0))
            for z, n in zs.items():
                use[n][z] = use[n].get(z, 0) + it["gpus"]
        if choose:
            rows.append(({c: 1 for c in choose}, 0, 1))
    for n, coefs in use.items():
        if coefs:
            rows.append((coefs, -highspy.kHighsInf, rhs[n]))
    if not cols:
        return (0, 0, 0)
    lp = highspy.HighsLp()
    lp.num_col_ = len(cols)
    lp.num_row_ = len(rows)
    lp.col_cost_ = np.array(cost, dtype=float)
    lp.col_lower_ = np.zeros(len(cols))
    lp.col_upper_ = np.ones(len(cols))
    lp.row_lower_ = np.array([r[1] for r in rows], dtype=float)
    lp.row_upper_ = np.array([r[2] for r in rows], dtype=float)
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.integrality_ = [highspy.HighsVarType.kInteger] * len(cols)
    starts, index, values = [0], [], []
    by_col = [[] for _c in cols]
    for r, (coefs, _lo, _hi) in enumerate(rows):
        for c, a in coefs.items():
            by_col[c].append((r, a))
    for entries in by_col:
        for r, a in entries:
            index.append(r)
            values.append(a)
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(values, dtype=float)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.5)
    h.setOptionValue("threads", 1)
    if time_limit is not None:
        h.setOptionValue("time_limit", float(time_limit))
    h.passModel(lp)
    h.run()
    if time_limit is not None and h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal, h.modelStatusToString(h.getModelStatus())
    x = h.getSolution().col_value
    repairs = placed = moved = 0
    for c, (i, kind, _f, _n) in enumerate(cols):
        if kind in ("stay", "y") and x[c] > 0.5:
            it = items[i]
            if it["repair"]:
                repairs += 1
                moved += it["stay"]["missing"] if kind == "stay" else it["shard_count"]
            else:
                placed += 1
    return (repairs, placed, -moved)


# -- brute force -----------------------------------------------------------------------------------------------

def brute_value(free, items):
    """The optimum by trying every decision of every item (stay on which nodes, whole on which fabric and nodes,
    or nothing), checking each node's GPUs at the end."""
    choices = []
    for it in items:
        options = [((0, 0, 0), False, ())]  # nothing; False: its live shards are reaped (GPUs freed)
        if it["stay"] is not None:
            for combo in itertools.combinations(it["stay"]["nodes"], it["stay"]["missing"]):
                options.append(((1, 0, -it["stay"]["missing"]), True, combo))
        for members in it["whole"].values():
            for combo in itertools.combinations(members, it["shard_count"]):
                gain = (1, 0, -it["shard_count"]) if it["repair"] else (0, 1, 0)
                options.append((gain, False, combo))
        choices.append(options)
    best = None
    for pick in itertools.product(*choices):
        left = dict(free)
        for it, (_gain, stays, combo) in zip(items, pick):
            if not stays:
                for n, g in it["released"].items():
                    left[n] += g
            for n in combo:
                left[n] -= it["gpus"]
        if any(v < 0 for v in left.values()):
            continue
        total = tuple(sum(p[0][k] for p in pick) for k in range(3))
        best = total if best is None or total > best else best
    return best


def solver_value(result, fleet):
    repairs = placed = moved = 0
    for d in result.decisions:
        if not d.placed:
            continue
        if d.replica in fleet.replicas:
            repairs += 1
            moved += len(d.new_shards)
        else:
            placed += 1
    return (repairs, placed, -moved)


def _bound(result):
    return (result.bound["repairs"], result.bound["placed"], -result.bound["moved"])


def _check(fleet, requests, oracle):
    result = plan(fleet, requests, strategy="exact")
    got = solver_value(result, fleet)
    assert got <= oracle, "the solver claims more than the optimum: %s > %s" % (got, oracle)
    assert _bound(result) >= oracle, "the bound %s is below the optimum %s" % (_bound(result), oracle)
    if result.exact:
        assert got == oracle, "marked exact but %s, the optimum is %s" % (got, oracle)
        assert _bound(result) == got
    return result.exact


def test_exact_answers_equal_the_milp_optimum_up_to_12_nodes():
    exact = 0
    for seed in range(MILP_CASES):
        fleet, requests = random_case(random.Random(seed), 12, 7)
        oracle = milp_value(*instance(fleet, requests))
        exact += _check(fleet, requests, oracle)
    assert exact >= 0.95 * MILP_CASES, "only %d of %d answers proven exact" % (exact, MILP_CASES)


def test_exact_answers_equal_the_brute_force_optimum_and_the_milp_agrees():
    exact = 0
    for seed in range(BRUTE_CASES):
        fleet, requests = random_case(random.Random(10 ** 6 + seed), 5, 3)
        free, items = instance(fleet, requests)
        oracle = brute_value(free, items)
        assert milp_value(free, items) == oracle, "the two oracles disagree (seed %d)" % seed
        exact += _check(fleet, requests, oracle)
    assert exact == BRUTE_CASES
