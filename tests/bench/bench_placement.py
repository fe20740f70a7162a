"""Placement benchmark: what the solver places against first-fit decreasing (FFD), plain first fit and best fit,
and against the optimum (a MILP, where it can be solved) or an upper bound, all in the same run.

    .venv/bin/python tests/bench/bench_placement.py [--quick] [--seed N] [--json PATH]

Fleets of eight-GPU nodes, fabrics of 32 nodes (5 at 10 nodes), 5% of nodes lost; requests of mixed shapes
(mostly single-node, some 2-, 3-, 4- and 8-node). Four parts:

(a) load <= 1.0: request streams whose GPUs add up to 0.9 and 1.0 of the fleet's. Share of requests placed and
    of GPUs used by the batch solver ``plan()``, by FFD, and the optimum: the MILP oracle of the unit tests
    (HiGHS, when installed and it proves the optimum within its time limit), else the exact search's own proof,
    else ``plan()``'s upper bound.
(b) churn: an online stream of arrivals and departures (10,000 events at 1,000 nodes; ``--quick``: 1,000 at 100
    nodes), the same events for every policy. Counted: requests refused although the fleet's free GPUs add up to
    what they ask (fragmentation), for ``place()`` (ours), first fit and best fit.
(c) overload, 1.3x the fleet's GPUs: GPUs placed, and per request shape how many were placed, for ``place()``
    online, ``plan()`` batch, FFD and first fit online. Replica counts alone reward turning large requests away.
(d) time: per placement (``place()``) and per batch (``plan()``); the exact search at its limit; one lookup
    from the SQLite registry. Target: 1,000 nodes and 200 replicas under 100 ms per placement.
"""

import argparse
import collections
import json
import os
import random
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, ".build", "collections"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from figures import figure  # noqa: E402

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_service  # noqa: E402
from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry  # noqa: E402
from ansible_collections.llmgw.fleet.plugins.module_utils.placement import (  # noqa: E402
    EXACT_MAX_FABRIC_NODES,
    EXACT_MAX_FLEET_NODES,
    Fleet,
    Node,
    Refusal,
    Request,
    decide,
    first_fit_decreasing,
    place,
    plan,
)

try:  # the unit tests' MILP oracle (highspy is a test dependency); without it the figures use the bound
    from ansible_collections.llmgw.fleet.tests.unit.plugins.module_utils.test_placement_oracle import (  # noqa: E402
        instance,
        milp_value,
    )
except Exception:  # noqa: BLE001 - pytest.importorskip raises its own Skipped when highspy is missing
    instance = milp_value = None

SHAPES = [  # (shards, GPUs per shard, weight): mostly single-node, some multi-node
    (1, 1, 6), (1, 2, 6), (1, 4, 5), (1, 8, 3), (2, 4, 4), (2, 8, 3), (4, 8, 1), (3, 2, 2), (2, 2, 3), (8, 8, 1),
]
FABRIC_SIZE = 32
TARGET_MS = 100.0
MILP_SECONDS = 20


def make_fleet(size, rnd):
    nodes = []
    for i in range(size):
        fabric = "ib-%03d" % (i // FABRIC_SIZE) if size > 10 else "ib-%d" % (i // 5)
        nodes.append(Node("node%05d" % i, fabric, 8, "lost" if rnd.random() < 0.05 else "ready"))
    return Fleet(nodes)


def ready_gpus(fleet):
    return sum(n.gpus for n in fleet.nodes.values() if n.state == "ready")


def random_request(rnd, name):
    shards, gpus, _ignored = rnd.choices(SHAPES, [w for _s, _g, w in SHAPES])[0]
    return Request(name, shards, gpus)


def make_stream(fleet, rnd, load=1.3):
    """Requests until their GPUs reach ``load`` times the GPUs of the fleet's ready nodes (the last one that
    would pass it is dropped, so a load <= 1.0 stream fits in the GPUs)."""
    capacity = ready_gpus(fleet)
    stream, demand = [], 0
    while True:
        request = random_request(rnd, "r%05d" % len(stream))
        if demand + request.total_gpus > load * capacity:
            return stream
        stream.append(request)
        demand += request.total_gpus


def first_fit(fleet, request):
    return plan(fleet, [request], repairs=(), strategy="ffd").decisions[0]


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, (time.perf_counter() - start) * 1000


def pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def shape(request):
    return "%dx%d" % (request.shard_count, request.gpus_per_shard)


def placed_by_shape(decisions, stream):
    by_name = {r.name: r for r in stream}
    out = collections.Counter()
    for d in decisions:
        if d.placed:
            out[shape(by_name[d.replica])] += 1
    return out


def gpus_of(decisions, stream):
    sizes = {r.name: r.total_gpus for r in stream}
    return sum(sizes[d.replica] for d in decisions if d.placed)


def online(fleet, stream, solver=place):
    """Each request placed as it arrives. Returns (decisions, ms per placement)."""
    decisions, times = [], []
    for request in stream:
        start = time.perf_counter()
        decision = solver(fleet, request)
        times.append((time.perf_counter() - start) * 1000)
        decisions.append(decision)
        if decision.placed:
            fleet = fleet.apply(decision, request)
    return decisions, times


# -- (a) load <= 1.0 -------------------------------------------------------------------------------------------

def bench_fit(size, load, rnd):
    fleet = make_fleet(size, rnd)
    stream = make_stream(fleet, rnd, load)
    asked = sum(r.total_gpus for r in stream)
    ffd, ffd_ms = timed(first_fit_decreasing, fleet, stream)
    batch, batch_ms = timed(plan, fleet, stream)
    best, how = batch.bound["placed"], "bound"
    if batch.exact:
        best, how = batch.placed, "exact search (proven)"
    elif milp_value is not None and size <= 100:
        found = milp_value(*instance(fleet, stream), time_limit=MILP_SECONDS)
        if found is not None:
            best, how = found[1], "MILP"
    return {"nodes": size, "load": load, "requests": len(stream), "asked_gpus": asked,
            "ours_placed": batch.placed, "ffd_placed": ffd.placed, "best_placed": best, "best_how": how,
            "ours_gpus": gpus_of(batch.decisions, stream), "ffd_gpus": gpus_of(ffd.decisions, stream),
            "strategy": batch.strategy, "exact": batch.exact, "batch_ms": batch_ms, "ffd_ms": ffd_ms}


# -- (b) churn -------------------------------------------------------------------------------------------------

def churn_events(rnd, fleet, count, load=1.0):
    """``count`` events: one arrival per step, each leaving after a random number of steps whose mean makes the
    GPUs asked at once about ``load`` times the fleet's (Little's law). ``("arrive", request)``/``("leave", name)``."""
    mean_gpus = sum(s * g * w for s, g, w in SHAPES) / sum(w for _s, _g, w in SHAPES)
    mean_life = load * ready_gpus(fleet) / mean_gpus
    leaving = collections.defaultdict(list)
    events, step = [], 0
    while len(events) < count:
        for name in leaving.pop(step, ()):
            events.append(("leave", name))
        request = random_request(rnd, "c%06d" % step)
        events.append(("arrive", request))
        leaving[step + max(1, int(rnd.expovariate(1.0 / mean_life)))].append(request.name)
        step += 1
    return events[:count]


class Counts:
    """A plain free-GPU count per ready node: what the first-fit and best-fit baselines place on."""

    def __init__(self, fleet):
        self.free = {n.name: len(fleet.free_ids[n.name]) for n in fleet.nodes.values() if n.state == "ready"}
        self.fabric = {n.name: n.fabric for n in fleet.nodes.values()}
        self.by_fabric = collections.defaultdict(list)
        for name in sorted(self.free):
            self.by_fabric[self.fabric[name]].append(name)
        self.held = {}

    def place(self, request, best):
        choice = None
        for fabric in sorted(self.by_fabric):
            fits = [n for n in self.by_fabric[fabric] if self.free[n] >= request.gpus_per_shard]
            if len(fits) < request.shard_count:
                continue
            if not best:
                choice = fits[:request.shard_count]
                break
            nodes = sorted(fits, key=lambda n: (self.free[n], n))[:request.shard_count]
            left = sum(self.free[n] for n in nodes) - request.total_gpus
            if choice is None or left < choice[0]:
                choice = (left, nodes)
        if choice is None:
            return False
        nodes = choice if not best else choice[1]
        for n in nodes:
            self.free[n] -= request.gpus_per_shard
        self.held[request.name] = (nodes, request.gpus_per_shard)
        return True

    def leave(self, name):
        nodes, gpus = self.held.pop(name, ((), 0))
        for n in nodes:
            self.free[n] += gpus

    def free_total(self):
        return sum(self.free.values())


def bench_churn(size, count, rnd):
    fleet = make_fleet(size, rnd)
    events = churn_events(rnd, fleet, count)
    out = {"nodes": size, "events": len(events), "arrivals": sum(1 for e in events if e[0] == "arrive")}
    for policy in ("first fit", "best fit"):
        counts, refused, fragmented = Counts(fleet), 0, 0
        for kind, what in events:
            if kind == "leave":
                counts.leave(what)
            elif not counts.place(what, best=policy == "best fit"):
                refused += 1
                fragmented += counts.free_total() >= what.total_gpus
        out[policy] = {"refused": refused, "fragmented": fragmented}
    requests, current, refused, fragmented, times = {}, fleet, 0, 0, []
    for kind, what in events:
        if kind == "leave":
            if what in current.replicas and current.replicas[what].shards:
                gone = Refusal(what, "fail", "left", {}, {})
                current = current.apply(gone)
            continue
        start = time.perf_counter()
        decision = place(current, what)
        times.append((time.perf_counter() - start) * 1000)
        requests[what.name] = what
        if decision.placed:
            current = current.apply(decision, what)
        else:
            refused += 1
            free = sum(len(current.free_ids[n]) for n, node in current.nodes.items() if node.state == "ready")
            fragmented += free >= what.total_gpus
    out["ours"] = {"refused": refused, "fragmented": fragmented, "ms_mean": statistics.mean(times),
                   "ms_p95": pct(times, 0.95), "ms_max": max(times)}
    return out


# -- (c) overload ----------------------------------------------------------------------------------------------

def bench_overload(size, rnd, load=1.3):
    fleet = make_fleet(size, rnd)
    stream = make_stream(fleet, rnd, load)
    ffd, ffd_ms = timed(first_fit_decreasing, fleet, stream)
    batch, batch_ms = timed(plan, fleet, stream)
    ours, times = online(fleet, stream)
    ff, _ignored = online(fleet, stream, solver=first_fit)
    asked = collections.Counter(shape(r) for r in stream)
    runs = {"place() online": ours, "plan() batch": batch.decisions, "FFD": ffd.decisions, "first fit online": ff}
    return {"nodes": size, "requests": len(stream), "asked_gpus": sum(r.total_gpus for r in stream),
            "capacity": ready_gpus(fleet), "asked_by_shape": dict(asked),
            "gpus": {k: gpus_of(v, stream) for k, v in runs.items()},
            "replicas": {k: sum(1 for d in v if d.placed) for k, v in runs.items()},
            "by_shape": {k: dict(placed_by_shape(v, stream)) for k, v in runs.items()},
            "batch_strategy": batch.strategy, "batch_exact": batch.exact, "batch_gap": batch.gap,
            "batch_ms": batch_ms, "ffd_ms": ffd_ms, "online_ms_mean": statistics.mean(times),
            "online_ms_p95": pct(times, 0.95), "online_ms_max": max(times)}


def bench_registry(rnd, size=1000, replicas=200):
    """One lookup end to end: open the SQLite registry, read the fleet, solve (1,000 nodes, 200 replicas)."""
    fleet = make_fleet(size, rnd)
    for request in make_stream(fleet, rnd)[:replicas]:
        decision = place(fleet, request)
        if decision.placed:
            fleet = fleet.apply(decision, request)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fleet.db")
        with FleetRegistry(path) as registry, registry.transaction():
            for node in fleet.nodes.values():
                registry.put_node(node.name, fabric=node.fabric, gpu_count=node.gpus, state=node.state)
            for replica in fleet.replicas.values():
                registry.put_replica(replica.name, model="m", engine="sim", shard_count=replica.shard_count,
                                     gpus_per_shard=replica.gpus_per_shard)
                registry.set_shards(replica.name, [s.to_dict() for s in replica.shards])
        times = []
        for i, request in enumerate(make_stream(fleet, rnd)[:20]):
            probe = Request("probe%02d" % i, request.shard_count, request.gpus_per_shard)
            start = time.perf_counter()
            with FleetRegistry(path, create=False) as registry:
                decide(fleet_service.load_fleet(registry), [probe])
            times.append((time.perf_counter() - start) * 1000)
    return {"nodes": size, "replicas": len(fleet.replicas), "ms_mean": statistics.mean(times), "ms_max": max(times)}


def bench_exact(rnd, fabrics):
    """The exact search on the largest fleets it takes: fabrics of 64 ready nodes (4 or 8 GPUs each), up to
    256 nodes in all, and a batch of requests for 1.3 times their GPUs."""
    nodes = [Node("node%03d" % i, "ib-%d" % (i // EXACT_MAX_FABRIC_NODES), rnd.choice([4, 8]))
             for i in range(fabrics * EXACT_MAX_FABRIC_NODES)]
    fleet = Fleet(nodes)
    stream = make_stream(fleet, rnd, load=1.3)
    ffd = first_fit_decreasing(fleet, stream)
    result, ms = timed(plan, fleet, stream, strategy="exact")
    return {"nodes": len(nodes), "fabrics": fabrics, "requests": len(stream), "ms": ms,
            "proven_optimal": result.exact, "expansions": result.expansions, "placed": result.placed,
            "ffd_placed": ffd.placed, "vs_ffd": result.placed / ffd.placed}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (CI): checks that it runs")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    sizes = [10, 100] if args.quick else [10, 100, 1000]
    fits = [bench_fit(size, load, random.Random(args.seed * 7919 + size + int(load * 10)))
            for size in sizes for load in (0.9, 1.0)]
    churn = bench_churn(100, 1000, random.Random(args.seed)) if args.quick else \
        bench_churn(1000, 10000, random.Random(args.seed))
    over = bench_overload(sizes[-1], random.Random(args.seed + 1))
    exact = [bench_exact(random.Random(args.seed), fabrics) for fabrics in (1, EXACT_MAX_FLEET_NODES // 64)]
    lookup = bench_registry(random.Random(args.seed))
    report(fits, churn, over, exact, lookup)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"bench": "placement", "figures": figures(fits, churn, over, exact, lookup), "skipped": [],
                       "fits": fits, "churn": churn, "overload": over, "exact": exact, "registry_lookup": lookup},
                      handle, indent=2)
    return 0


def _share(part, whole):
    return part / whole if whole else 1.0


def report(fits, churn, over, exact, lookup):
    print("(a) load <= 1.0: share of the requests placed (and of the GPUs asked), batch plan() vs FFD vs the optimum")
    print("%6s %5s %8s | %-15s %-15s %-24s | %9s %9s" % ("nodes", "load", "requests", "plan() (ours)", "FFD",
                                                         "optimum or bound", "plan() ms", "FFD ms"))
    for r in fits:
        print("%6d %5.1f %8d | %-15s %-15s %-24s | %9.0f %9.0f" % (
            r["nodes"], r["load"], r["requests"],
            "%.3f (%.3f)" % (_share(r["ours_placed"], r["requests"]), _share(r["ours_gpus"], r["asked_gpus"])),
            "%.3f (%.3f)" % (_share(r["ffd_placed"], r["requests"]), _share(r["ffd_gpus"], r["asked_gpus"])),
            "%.3f %s" % (_share(r["best_placed"], r["requests"]), r["best_how"]), r["batch_ms"], r["ffd_ms"]))
    print("(b) churn, %d events (%d arrivals) on %d nodes, offered load 1.0: refused / refused although the free "
          "GPUs added up to the request" % (churn["events"], churn["arrivals"], churn["nodes"]))
    for policy in ("ours", "first fit", "best fit"):
        print("  %-10s refused %5d   fragmentation refusals %5d" % (
            policy, churn[policy]["refused"], churn[policy]["fragmented"]))
    print("  place() per arrival: %.2f ms mean, %.2f ms p95, %.2f ms max" % (
        churn["ours"]["ms_mean"], churn["ours"]["ms_p95"], churn["ours"]["ms_max"]))
    print("(c) overload at %d nodes: %d requests for %d GPUs = %.2fx the %d GPUs of the ready nodes" % (
        over["nodes"], over["requests"], over["asked_gpus"], over["asked_gpus"] / over["capacity"],
        over["capacity"]))
    shapes = sorted(over["asked_by_shape"], key=lambda k: tuple(int(x) for x in k.split("x")))
    print("  %-18s %6s %8s  %s" % ("policy", "GPUs", "replicas", "  ".join("%6s" % k for k in shapes)))
    print("  %-18s %6s %8s  %s" % ("asked", over["asked_gpus"], over["requests"],
                                   "  ".join("%6d" % over["asked_by_shape"][k] for k in shapes)))
    for policy, gpus in over["gpus"].items():
        print("  %-18s %6d %8d  %s" % (policy, gpus, over["replicas"][policy],
                                       "  ".join("%6d" % over["by_shape"][policy].get(k, 0) for k in shapes)))
    proven = " (proven)" if over["batch_exact"] else ""
    print("  plan(): %s%s, gap to its bound %s" % (over["batch_strategy"], proven, over["batch_gap"]))
    print("(d) time at %d nodes: place() %.2f ms mean, %.2f p95, %.2f max per placement; plan() %.0f ms per batch of "
          "%d; FFD %.0f ms" % (over["nodes"], over["online_ms_mean"], over["online_ms_p95"], over["online_ms_max"],
                               over["batch_ms"], over["requests"], over["ffd_ms"]))
    for e in exact:
        print("  exact search, %d nodes on %d fabric%s of 64 (its limit), %d requests: %.0f ms, %s, %d expansions, "
              "%d placed (FFD %d)" % (e["nodes"], e["fabrics"], "" if e["fabrics"] == 1 else "s", e["requests"],
                                      e["ms"], "proven optimal" if e["proven_optimal"] else "budget reached",
                                      e["expansions"], e["placed"], e["ffd_placed"]))
    print("  one lookup from the SQLite registry (%d nodes, %d replicas), open + read + solve: %.1f ms mean, "
          "%.1f ms max" % (lookup["nodes"], lookup["replicas"], lookup["ms_mean"], lookup["ms_max"]))


def figures(fits, churn, over, exact, lookup):
    """The rows of run.py's summary table."""
    out = []
    for r in fits:
        if r["nodes"] < 100:
            continue
        ours, ffd = _share(r["ours_placed"], r["requests"]), _share(r["ffd_placed"], r["requests"])
        best = _share(r["best_placed"], r["requests"])
        verdict = ("no better than FFD" if r["ours_placed"] <= r["ffd_placed"] else
                   "%d more than FFD" % (r["ours_placed"] - r["ffd_placed"]))
        out.append(figure(
            "placement: load %.1f, %d nodes, share of requests placed vs FFD" % (r["load"], r["nodes"]),
            "%.3f of %d requests (%.3f of GPUs)" % (ours, r["requests"], _share(r["ours_gpus"], r["asked_gpus"])),
            "FFD %.3f (%.3f of GPUs)" % (ffd, _share(r["ffd_gpus"], r["asked_gpus"])), _share(ours, ffd),
            "%d nodes x 8 GPUs, fabrics of %d, 5%% lost, requests for %.1fx the ready GPUs, batch plan() (%s)"
            % (r["nodes"], FABRIC_SIZE, r["load"], r["strategy"]),
            "%s; optimum at most %.3f (%s)" % (verdict, best, r["best_how"])))
    ff, bf, ours = churn["first fit"]["fragmented"], churn["best fit"]["fragmented"], churn["ours"]["fragmented"]
    out.append(figure(
        "placement: churn, fragmentation refusals vs first fit",
        "%d of %d refusals" % (ours, churn["ours"]["refused"]),
        "first fit %d of %d" % (ff, churn["first fit"]["refused"]), ours / ff if ff else None,
        "%d events (%d arrivals) at %d nodes, offered load 1.0, same events for each policy"
        % (churn["events"], churn["arrivals"], churn["nodes"]),
        "refused although the free GPUs added up to the request; best fit %d of %d; %s" % (
            bf, churn["best fit"]["refused"], "ours fewer than both" if ours < min(ff, bf) else
            "ours NOT fewer than both baselines")))
    gpus = over["gpus"]
    out.append(figure(
        "placement: overload %.1fx, %d nodes, GPUs placed vs FFD" % (
            over["asked_gpus"] / over["capacity"], over["nodes"]),
        "place() %d GPUs, plan() %d" % (gpus["place() online"], gpus["plan() batch"]),
        "FFD %d GPUs" % gpus["FFD"], _share(gpus["place() online"], gpus["FFD"]),
        "%d requests, online place() vs FFD on the whole stream; first fit online %d GPUs" % (
            over["requests"], gpus["first fit online"]),
        "per shape (placed/asked) ours vs FFD: %s" % ", ".join(
            "%s %d/%d vs %d" % (k, over["by_shape"]["place() online"].get(k, 0), n, over["by_shape"]["FFD"].get(k, 0))
            for k, n in sorted(over["asked_by_shape"].items()))))
    out.append(figure(
        "placement: one placement at %d nodes vs the 100 ms target" % over["nodes"],
        "%.2f ms mean (max %.1f)" % (over["online_ms_mean"], over["online_ms_max"]), "target 100 ms",
        over["online_ms_max"] / TARGET_MS, "place() per request of the overload stream",
        "a batch of %d with plan() takes %.0f ms (%s); FFD %.0f ms" % (
            over["requests"], over["batch_ms"], over["batch_strategy"], over["ffd_ms"])))
    largest = max(exact, key=lambda e: e["nodes"])
    out.append(figure(
        "placement: exact search on the largest fleet it takes (%d nodes)" % largest["nodes"],
        "%d replicas in %.0f ms" % (largest["placed"], largest["ms"]), "FFD %d replicas" % largest["ffd_placed"],
        largest["vs_ffd"], "%d fabrics of 64 nodes (its limit), %d requests" % (
            largest["fabrics"], largest["requests"]),
        "%s after %d expansions" % (
            "proven optimal" if largest["proven_optimal"] else "budget reached, best kept", largest["expansions"])))
    out.append(figure(
        "placement: one lookup from the SQLite registry",
        "%.1f ms mean (max %.1f)" % (lookup["ms_mean"], lookup["ms_max"]),
        "target 100 ms", lookup["ms_max"] / TARGET_MS, "%d nodes, %d replicas, open + read + solve"
        % (lookup["nodes"], lookup["replicas"]),
        "one lookup end to end uses %.0f%% of the 100 ms budget at its worst" % lookup["ms_max"]))
    return out


if __name__ == "__main__":
    sys.exit(main())
