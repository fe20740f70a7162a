"""place_replica over the inventory, on the lab: 8 declared replicas placed by one run, against one declared
replica placed by the same command in the same session.

    .venv/bin/python tests/bench/bench_place_replica.py [--quick] [--json PATH]

Four lab nodes on two fabrics (bench-245, bench-246 on bench-a; bench-247, bench-248 on bench-b; eight simulated
GPUs each), provisioned with provision_node and recorded ready (the bench measures placement, not onboarding),
and the gateway following the bench's registry. Two models of the simulated engine: ``bench-solo`` (1 shard x 2
GPUs) and ``bench-pair`` (2 shards x 2 GPUs, on two nodes of one fabric). The baseline is
``ansible-playbook llmgw.fleet.place_replica`` with one replica declared (a solo); then the same command with
that one and 8 more declared (4 solo, 4 pair: 12 shards, 24 more GPUs), which keeps the first as it is and
decides, records and launches the 8 in one batch. The figure is the 8-replica run over the 1-replica run (1.0:
eight cost what one does; 8: one after another). ``--quick`` declares 2 more instead of 8 (a smoke run).
The VMs (octets 245-248) and the registry (a temporary directory) are removed at the end.
"""

import sys
import time

from bench_replacement import run_on_fleet
from figures import log
from lab import lab_main

NODES = [(245, "bench-a"), (246, "bench-a"), (247, "bench-b"), (248, "bench-b")]
MODELS = {"bench-solo": {"engine": "sim", "shards": 1, "gpus_per_shard": 2},
          "bench-pair": {"engine": "sim", "shards": 2, "gpus_per_shard": 2}}
FIRST = {"name": "bench-first", "model": "bench-solo"}


def declared(count):
    """``count`` more replicas, half of each model."""
    return [{"name": "bench-%s-%d" % (model.split("-")[1], i), "model": model}
            for i in range(1, count // 2 + 1) for model in ("bench-solo", "bench-pair")]


def main(argv=None):
    return lab_main(__doc__, "place_replica", "place_replica", "2 more replicas instead of 8", run, argv)


def run(report, quick):
    run_on_fleet(report, "place_replica", NODES, lambda lab, fleet: measure(report, lab, fleet, 2 if quick else 8))


def ready(fleet, replicas):
    states = {r["name"]: (fleet.replica(r["name"]) or {}).get("state") for r in replicas}
    if set(states.values()) != {"ready"}:
        raise RuntimeError("not every declared replica is Ready: %s" % states)


def measure(report, lab, fleet, count):
    began = time.monotonic()
    fleet.set_up(NODES, fleet_models=MODELS)
    log("set-up (4 nodes recorded ready, the gateway): %.0f s" % (time.monotonic() - began))

    started = time.monotonic()
    fleet.play("place_replica.yml", fleet_models=MODELS, fleet_replicas=[FIRST])
    one = time.monotonic() - started
    ready(fleet, [FIRST])
    log("1 declared replica placed: %.1f s" % one)

    more = declared(count)
    started = time.monotonic()
    fleet.play("place_replica.yml", fleet_models=MODELS, fleet_replicas=[FIRST] + more, forks=16)
    many = time.monotonic() - started
    ready(fleet, [FIRST] + more)
    shards = sum(MODELS[r["model"]]["shards"] for r in more)
    log("%d more declared replicas placed in one run: %.1f s" % (count, many))

    params = ("4 lab nodes on 2 fabrics (8 sim GPUs each), the simulated engine; %d replicas: %d x (1 shard x 2 "
              "GPUs), %d x (2 shards x 2 GPUs); --forks 16; the gateway following" % (
                  count, count // 2, count // 2))
    report.add("place_replica: %d declared replicas in one run vs 1" % count, "%.1f s" % many, "1 replica %.1f s" % one,
               many / one, params,
               "%d replicas (%d shards) take %.1fx one replica's run (1.0: side by side at no cost; %d: one after "
               "another); the goal is at most 3x for 8" % (count, shards, many / one, count))


if __name__ == "__main__":
    sys.exit(main())
