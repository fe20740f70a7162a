"""Replacement after a node loss, on the lab: from the node's stop to lost detected and to the replacement Ready,
against the seed's 60 s and 80 s.

    .venv/bin/python tests/bench/bench_replacement.py [--quick] [--json PATH]

The seed's scenario: four lab nodes on two fabrics (bench-a: bench-241, bench-242; bench-b: bench-243,
bench-244; eight simulated GPUs each), provisioned with provision_node (one run, one fork) and recorded ready;
a two-node simulated replica (2 shards x 4 GPUs) placed on each fabric with place_replica.yml; reconcile.yml run
once so every node is seen. Then bench-242's VM is stopped through the Proxmox API and reconcile.yml runs again
and again (as its timer would, back to back) until the node is lost and the replica that had a shard on it is
Ready again elsewhere. Times come from the registry's events (1 s resolution) against the moment the stop task
ended. ``node_lost_after`` is 60 s, the seed's and the collection's default (``--quick``: 10 s).

The gateway (playbooks/gateway.yml, HAProxy as a process on loopback, files in the temporary directory) follows
the bench's registry, and a bounded load (3 clients, one request each at a time, until the replacement has answered
or 5,000 requests) runs through it across the loss: the requests answered by a replica the registry did not call
Ready (must be 0), the ones that failed, and the time from the replacement's Ready to its first answer.

Needs playbooks/reconcile.yml and playbooks/place_replica.yml; without them it says so and measures nothing.
The VMs (octets 241-244) and the registry (a temporary directory) are removed at the end.
"""

import datetime
import os
import sys
import tempfile
import time

import yaml
from figures import REPO, log
from lab import LAB_DIR, LAB_INVENTORY, Lab, PlaybookFailed, lab_main, run_playbook

sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
from gateway_load import Load, failures  # noqa: E402 - the tests' load generator
from helpers import ScratchGateway  # noqa: E402 - the tests' own gateway

from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

PLAYBOOKS = os.path.join(REPO, "playbooks")
HERE = os.path.dirname(os.path.abspath(__file__))
SEED = {"lost": 60.0, "ready": 80.0}
NODES = [(241, "bench-a"), (242, "bench-a"), (243, "bench-b"), (244, "bench-b")]
LOST_OCTET = 242
MODEL = {"bench-sim": {"engine": "sim", "shards": 2, "gpus_per_shard": 4}}
GIVE_UP_AFTER = 600


def epoch(stamp):
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


class Fleet:
    def __init__(self, lab, root):
        self.lab, self.root = lab, root
        self.db = os.path.join(root, "fleet.db")
        self.runs = 0
        self.gateway = ScratchGateway(os.path.join(root, "gateway"), "bench")
        self.key, self.port = self.gateway.key, self.gateway.port

    def vars(self, **extra):
        out = {"lab_state_dir": LAB_DIR, "fleet_registry": self.db, "fleet_models": MODEL,
               "fleet_known_hosts_file": os.path.join(self.root, "known_hosts"),
               "fleet_ca_dir": os.path.join(self.root, "ca")}
        out.update(self.gateway.vars)
        out.update(extra)
        return out

    def stop_gateway(self):
        self.gateway.stop()

    def play(self, playbook, inventories=(LAB_INVENTORY,), forks=None, **extra):
        self.runs += 1
        path = playbook if os.path.isabs(playbook) else os.path.join(PLAYBOOKS, playbook)
        log_path = os.path.join(self.root, "%02d-%s.log" % (self.runs, os.path.basename(path)[:-4]))
        return run_playbook(path, list(inventories), self.vars(**extra), log_path, forks=forks)

    def events(self, subject):
        with FleetRegistry(self.db) as registry:
            return registry.events(subject)

    def replica(self, name):
        with FleetRegistry(self.db) as registry:
            return registry.get_replica(name)

    def set_up(self, nodes, **extra):
        """The gateway, then ``nodes`` ([(octet, fabric)]) provisioned with provision_node and recorded ready (the
        benches that use this measure what comes after onboarding, not onboarding)."""
        self.play("gateway.yml", **extra)
        inventory = os.path.join(self.root, "bench_nodes.yml")
        with open(inventory, "w") as handle:
            yaml.safe_dump({"bench_nodes": {"hosts": {self.lab.name(o): {"bench_address": self.lab.address(o) + "/24"}
                                                      for o, _fabric in nodes}}}, handle)
        # forks=1: wait_for_node's read-modify-write of the shared known_hosts is not safe under concurrency
        self.play(os.path.join(HERE, "playbooks", "provision_many.yml"), [LAB_INVENTORY, inventory], forks=1)
        self.play(os.path.join(HERE, "playbooks", "register_nodes.yml"), bench_register=[
            {"name": self.lab.name(o), "address": self.lab.address(o), "fabric": fabric} for o, fabric in nodes])


def run_on_fleet(report, figure, nodes, measure):
    """``measure(lab, fleet)`` on a fleet of the lab's ``nodes`` in a temporary directory; a step that fails is
    reported as not measured, and the VMs and the gateway are removed whatever happened."""
    lab = Lab()
    names = [lab.name(o) for o, _fabric in nodes]
    lab.remove(names)
    with tempfile.TemporaryDirectory(prefix="bench-%s-" % figure.split()[0].replace("_", "-")) as tmp:
        fleet = Fleet(lab, tmp)
        try:
            measure(lab, fleet)
        except (PlaybookFailed, RuntimeError) as exc:
            print(str(exc), flush=True)
            report.skip(figure, "a step failed: " + str(exc).splitlines()[0])
        finally:
            fleet.stop_gateway()
            lab.remove(names)


def main(argv=None):
    missing = [p for p in ("reconcile.yml", "place_replica.yml") if not os.path.exists(os.path.join(PLAYBOOKS, p))]
    return lab_main(__doc__, "replacement", "replacement after node loss", "node_lost_after 10 s", run, argv,
                    missing=("playbooks/%s missing" % ", playbooks/".join(missing)) if missing else None)


def run(report, quick):
    lost_after = 10 if quick else 60
    run_on_fleet(report, "replacement after node loss", NODES,
                 lambda lab, fleet: measure(report, lab, fleet, lost_after))


def measure(report, lab, fleet, lost_after):
    began = time.monotonic()
    fleet.set_up(NODES)
    for name, fabric in (("bench-rep-a", "bench-a"), ("bench-rep-b", "bench-b")):
        fleet.play("place_replica.yml", replica=name, model="bench-sim", fabric=fabric)
        state = (fleet.replica(name) or {}).get("state")
        if state != "ready":
            raise RuntimeError("%s is %s after place_replica, not ready" % (name, state))
    fleet.play("reconcile.yml", node_lost_after=lost_after)  # every node seen just now
    log("set-up (4 nodes, 2 replicas, one reconcile): %.0f s" % (time.monotonic() - began))

    lost_name = lab.name(LOST_OCTET)
    on_lost = [r for r in ("bench-rep-a", "bench-rep-b")
               if lost_name in {s["node"] for s in fleet.replica(r)["shards"]}]
    if len(on_lost) != 1:
        raise RuntimeError("expected one replica with a shard on %s, found %s" % (lost_name, on_lost))
    victim = on_lost[0]
    load = Load(fleet.port, fleet.key, "bench-sim", clients=3, total=5000, max_seconds=GIVE_UP_AFTER).start()
    time.sleep(2)
    lab.stop(lost_name)
    stopped = time.time()
    reconciles = []
    lost_at = ready_at = None
    while time.time() - stopped < GIVE_UP_AFTER:
        start = time.monotonic()
        fleet.play("reconcile.yml", node_lost_after=lost_after)
        reconciles.append(time.monotonic() - start)
        lost = [e["at"] for e in fleet.events(lost_name) if "-> lost" in (e.get("detail") or "")]
        ready = [e["at"] for e in fleet.events(victim) if "-> ready" in (e.get("detail") or "")
                 and epoch(e["at"]) >= int(stopped)]
        if lost and ready:
            lost_at, ready_at = epoch(lost[-1]) - stopped, epoch(ready[-1]) - stopped
            break
    if lost_at is None:
        load.end_now()
        raise RuntimeError("no replacement Ready within %d s of the stop" % GIVE_UP_AFTER)
    failed_at = [epoch(e["at"]) for e in fleet.events(victim) if (e.get("detail") or "").startswith("ready -> failed")
                 and epoch(e["at"]) >= int(stopped)][-1]
    deadline = time.time() + 60
    while time.time() < deadline and not any(r["replica"] == victim and r["sent"] > stopped + ready_at
                                             for r in list(load.records)):
        time.sleep(0.5)
    load.end_now()
    records = load.stop(timeout=90)
    shards = fleet.replica(victim)["shards"]
    log("%s stopped; lost at t+%.0f s, %s Ready again on %s at t+%.0f s; %d reconcile runs of %.0f s mean" % (
        lost_name, lost_at, victim, ", ".join(s["node"] for s in shards), ready_at, len(reconciles),
        sum(reconciles) / len(reconciles)))
    params = ("node_lost_after %d s, 4 nodes / 2 fabrics, 2 sim replicas of 2 x 4 GPUs, reconcile back to back "
              "(%d runs, %.0f s each)" % (lost_after, len(reconciles), sum(reconciles) / len(reconciles)))
    report.add("replacement: node stop -> lost detected", "%.0f s" % lost_at, "seed %.0f s" % SEED["lost"],
               lost_at / SEED["lost"], params,
               "lost is declared %.0f s after node_lost_after (%d s) ran out: one reconcile run's probe"
               % (lost_at - lost_after, lost_after))
    report.add("replacement: node stop -> replacement Ready", "%.0f s" % ready_at, "seed %.0f s" % SEED["ready"],
               ready_at / SEED["ready"], params,
               "Ready %.0f s after the stop, of which node_lost_after is %d s" % (ready_at, lost_after))
    report.add("replacement: lost detected -> replacement Ready", "%.0f s" % (ready_at - lost_at),
               "seed %.0f s" % (SEED["ready"] - SEED["lost"]), (ready_at - lost_at) / (SEED["ready"] - SEED["lost"]),
               params, "what the collection itself takes to fail, reap, re-place and launch the replica and see it "
               "serve")
    # Registry times are whole seconds: sent a full second after the failure was recorded, answered before the
    # second the replacement was recorded Ready.
    wrong = [r for r in records if r["replica"] == victim and r["sent"] >= failed_at + 1
             and r["done"] < stopped + ready_at]
    bad = failures(records)
    answered = [r["done"] for r in records if r["replica"] == victim and r["sent"] > stopped + ready_at]
    load_params = "%d requests from 3 clients through the gateway across the loss, model bench-sim (2 replicas)" % (
        len(records))
    report.add("gateway across node loss: requests answered by a replica not Ready", "%d" % len(wrong), "0", None,
               load_params, "%d failed%s" % (len(bad), (": " + "; ".join(sorted({"%s %s" % (
                   r["status"], (r["error"] or "")[:80]) for r in bad}))) if bad else " (the other replica took "
                   "them while the lost one's health check failed, then the gateway stopped routing to it)"))
    if answered:
        first = min(answered) - (stopped + ready_at)
        report.add("gateway: replacement Ready -> its first answer through the gateway", "%.1f s" % first,
                   "Ready at t+%.0f s" % ready_at, None, load_params,
                   "the reconcile run ends by reloading the gateway with the replacement in it (1 s registry "
                   "resolution; slowstart ramps its share up over 30 s)")
    else:
        report.skip("gateway: replacement Ready -> its first answer", "no request reached it within 60 s")


if __name__ == "__main__":
    sys.exit(main())
